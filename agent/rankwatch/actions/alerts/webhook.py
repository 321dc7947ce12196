"""Generic JSON webhook sink: one POST per alert, one sink per URL."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from rankwatch.actions.alerts.message import AlertMessage, DeliveryError, iso


def payload(alert: AlertMessage) -> dict[str, Any]:
    lead = next((m for m in alert.members if m.rank == alert.rank), alert.members[0])
    return {
        "version": "1",
        "status": alert.status,
        "id": alert.id,
        "run": alert.run,
        "rank": alert.rank,
        "ranks": alert.ranks,
        "world_size": alert.world_size,
        "suspect": alert.suspect,
        "node": alert.node,
        "kind": alert.kind,
        "severity": alert.severity.label,
        "step": alert.step,
        "summary": alert.title,
        "message": alert.message,
        "evidence": lead.evidence,
        "dump_path": alert.dump_path,
        "grafana_url": alert.grafana_url,
        "repeat": alert.repeat,
        "starts_at": iso(alert.starts_at),
        "ends_at": iso(alert.ends_at or time.time()) if alert.status == "resolved" else None,
        "members": [
            {
                "rank": m.rank,
                "node": m.node or alert.node,
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
        self.where = f"{u.scheme}://{u.netloc}"  # the path or query may hold a secret
        self.headers = dict(headers or {})
        self.timeout = float(timeout)
        self._session: aiohttp.ClientSession | None = None

    async def deliver(self, alert: AlertMessage) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.post(self.url, json=payload(alert), headers=self.headers) as r:
                if r.status < 300:
                    return
                body = (await r.text())[:300]
                ra = r.headers.get("Retry-After")
                retry_after = float(ra) if ra and ra.isdigit() else None
                transient = r.status in (408, 425, 429) or r.status >= 500
                raise DeliveryError(
                    f"webhook {self.where}: HTTP {r.status} {body}",
                    retry_after=retry_after,
                    permanent=not transient,
                )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise DeliveryError(f"webhook {self.where}: {type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
