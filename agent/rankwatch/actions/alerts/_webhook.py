"""Generic JSON webhook sink: one POST per alert, one sink per URL.
Its settings and builder are in ``webhook``, which imports this module when one is configured.

The payload is JSON; text from a log (message, evidence) arrives as the log held it but with
control characters, escape sequences and bidi overrides shown, not obeyed
(``rankwatch.sanitize``), so a receiver that prints it to a terminal or a chat is not
turned against its reader. One that puts it into HTML, Slack markup or a shell must still
escape it for that target. Error messages name the endpoint without its
credentials (userinfo, query, secret path).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rankwatch.actions.alerts.message import AlertMessage, DeliveryError, iso
from rankwatch.config.redact import redact_text, redact_url
from rankwatch.sanitize import deep

if TYPE_CHECKING:
    import aiohttp


def payload(alert: AlertMessage) -> dict[str, Any]:
    lead = next((m for m in alert.members if m.rank == alert.rank), alert.members[0])
    doc: dict[str, Any] = deep(_raw(alert, lead))
    return doc


def _raw(alert: AlertMessage, lead: Any) -> dict[str, Any]:
    diagnosis = alert.diagnosis
    return {
        "version": "1",
        "status": alert.status,
        "id": alert.id,
        "run": alert.run,
        "user": lead.user,
        "rank": alert.rank,
        "ranks": alert.ranks,
        "world_size": alert.world_size,
        "suspect": alert.suspect,
        "diagnosis": diagnosis.to_json() if diagnosis is not None else None,
        "node": alert.node,
        "kind": alert.kind,
        "severity": alert.severity.label,
        "step": alert.step,
        "summary": alert.title,
        "message": alert.message,
        "evidence": lead.evidence,
        "dump_path": alert.dump_path,
        "grafana_url": alert.grafana_url,
        "report_url": alert.report_url,
        "repeat": alert.repeat,
        "starts_at": iso(alert.starts_at),
        "ends_at": iso(alert.ends_at or time.time()) if alert.status == "resolved" else None,
        "members": [
            {
                "rank": m.rank,
                "user": m.user,
                "node": m.node or alert.node,
                "subject": m.subject,
                "step": m.step,
                "message": m.message,
                "evidence": m.evidence,
            }
            for m in alert.members
        ],
    }


class WebhookSink:
    def __init__(
        self, url: str, *, headers: dict[str, str] | None = None, timeout: float = 10.0, name: str = "webhook"
    ) -> None:
        self.name = name
        self.url = url
        u = urlsplit(url)
        self.where = redact_url(f"{u.scheme}://{u.netloc}")  # userinfo, path or query may hold a secret
        self.headers = dict(headers or {})
        self._secrets = [url, *(v for v in self.headers.values() if v)]
        self.timeout = float(timeout)
        self._session: aiohttp.ClientSession | None = None

    async def deliver(self, alert: AlertMessage) -> None:
        import asyncio  # on first use: the config schema imports this module for its settings

        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.post(self.url, json=payload(alert), headers=self.headers) as r:
                if r.status < 300:
                    return
                body = redact_text((await r.text())[:300], self._secrets)
                ra = r.headers.get("Retry-After")
                retry_after = float(ra) if ra and ra.isdigit() else None
                transient = r.status in (408, 425, 429) or r.status >= 500
                raise DeliveryError(
                    f"webhook {self.where}: HTTP {r.status} {body}",
                    retry_after=retry_after,
                    permanent=not transient,
                )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise DeliveryError(
                redact_text(f"webhook {self.where}: {type(e).__name__}: {e}", self._secrets)
            ) from e
        except ValueError as e:
            # aiohttp refuses the request itself (user:pass@ in the URL and an Authorization
            # header, a malformed URL): the same every time, so not retried.
            raise DeliveryError(
                redact_text(f"webhook {self.where}: {e}", self._secrets), permanent=True
            ) from e

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
