"""Prometheus Alertmanager sink: POST <url>/api/v2/alerts, one sink per URL (HA pairs).
Its settings and builder are in ``alertmanager``, which imports this module when one is configured.

Alertmanager forgets a firing alert that is not posted again within its
``resolve_timeout`` (5 min by default) and then reports it resolved. So while an alert
is active the dispatcher re-posts it every ``refresh_interval`` (60 s; one small POST,
the same labels and ``startsAt``, which Alertmanager merges into the existing alert).
Grouping, routing, silences and inhibition are Alertmanager's job: each rank of a grouped
message is posted as its own alert.

Annotations carry log text, and Alertmanager's Slack receiver puts them into a message
unescaped: a log line holding ``<!channel>`` would page a whole channel. Slack's mention
and link sequences are therefore made inert in annotations (their ``<`` becomes ``‹``),
and control characters, escape sequences and bidi overrides shown, not obeyed
(``rankwatch.sanitize``), in annotations and label values alike (a printable label value is
left exact: routing matches on it).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from rankwatch.actions.alerts.message import AlertMessage, DeliveryError, iso
from rankwatch.config.redact import redact_text, redact_url
from rankwatch.sanitize import defuse_mentions, visible

if TYPE_CHECKING:
    import aiohttp


def annotation(text: str) -> str:
    """Log-derived text made safe for whatever renders the annotation (Slack, a terminal)."""
    return defuse_mentions(text)


REFRESH_INTERVAL_S = 60.0


def alertname(kind: str) -> str:
    """`nan_loss` -> `RankwatchNanLoss`."""
    return "Rankwatch" + "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", kind) if p)


def payload(alert: AlertMessage, now: float) -> list[dict[str, Any]]:
    out = []
    for m in alert.members:
        labels = {
            "alertname": alertname(alert.kind),
            "run": alert.run,
            "rank": "" if m.rank is None else str(m.rank),
            "severity": alert.severity.label,
            "kind": alert.kind,
            "node": m.node or alert.node,
        }
        if m.subject is not None:  # two GPUs of one rank are two alerts there too
            labels["subject"] = m.subject
        labels = {k: visible(v) for k, v in labels.items()}
        summary = f"{alert.kind} on rank {m.rank}" if m.rank is not None else alert.kind
        annotations = {"description": annotation(m.message)}
        if m.dump_path:
            annotations["dump_path"] = annotation(m.dump_path)
        if m.user is not None:  # an annotation: a label would regroup and re-route existing alerts
            annotations["user"] = annotation(m.user)
        if alert.suspect is not None:
            annotations["suspect"] = str(alert.suspect)
            summary += f", suspect rank {alert.suspect}"
        ff = alert.diagnosis.first_failure if alert.diagnosis is not None else None
        if ff is not None and ff.rank is not None:
            annotations["first_failure"] = annotation(f"rank {ff.rank}: {ff.how or ff.kind}")
        if m.step is not None:
            annotations["step"] = str(m.step)
        if alert.report_url:
            annotations["report_url"] = alert.report_url
        annotations["summary"] = annotation(f"{summary} (run {alert.run})")
        doc: dict[str, Any] = {"labels": labels, "annotations": annotations, "startsAt": iso(m.starts_at)}
        if alert.status == "resolved":
            doc["endsAt"] = iso(alert.ends_at or now)
        if alert.grafana_url:
            doc["generatorURL"] = alert.grafana_url
        out.append(doc)
    return out


class AlertmanagerSink:
    refresh_interval = REFRESH_INTERVAL_S

    def __init__(self, url: str, *, timeout: float = 10.0, name: str = "alertmanager") -> None:
        self.name = name
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.where = redact_url(self.url)
        self._secrets = [url]
        self.timeout = float(timeout)
        self._session: aiohttp.ClientSession | None = None

    async def deliver(self, alert: AlertMessage) -> None:
        import asyncio  # on first use: the config schema imports this module for its settings

        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.post(self.url, json=payload(alert, time.time())) as r:
                body = redact_text((await r.text())[:300], self._secrets)
                if r.status < 300:
                    return
                if r.status == 429 or r.status >= 500:
                    ra = r.headers.get("Retry-After")
                    retry_after = float(ra) if ra and ra.isdigit() else None
                    raise DeliveryError(f"alertmanager: HTTP {r.status} {body}", retry_after=retry_after)
                raise DeliveryError(f"alertmanager: HTTP {r.status} {body}", permanent=True)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise DeliveryError(
                redact_text(f"alertmanager {self.where}: {type(e).__name__}: {e}", self._secrets)
            ) from e
        except ValueError as e:
            raise DeliveryError(
                redact_text(f"alertmanager {self.where}: {e}", self._secrets), permanent=True
            ) from e

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
