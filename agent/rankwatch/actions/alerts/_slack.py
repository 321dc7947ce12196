"""The Slack sink (slack-sdk, async): Block Kit message, resolve threaded under the original.
Its settings and builder are in ``slack``, which imports this module when Slack is configured.

slack-sdk's own retry handlers are switched off: the dispatcher owns retries, backoff and
the spool, and must see every failure to count it.

Messages, evidence, run and node names come from logs and the environment: attacker text.
Slack reads ``<!channel>``, ``<@U123>`` and ``<https://evil|harmless text>`` as commands
in mrkdwn, and the notification ``text`` is mrkdwn too, so every such value is escaped
(``&``, ``<``, ``>`` as ``&amp;``, ``&lt;``, ``&gt;``, Slack's own rule) wherever it is
put: ``text``, section and field blocks, code blocks. Header blocks are plain_text (never
parsed). Control characters, escape sequences and bidi overrides are shown, not obeyed
(``rankwatch.sanitize``), before any of that. The one link we make (Grafana) gets a URL
whose ``|``, ``<``, ``>`` are
percent-encoded, and only http(s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rankwatch.actions.alerts.message import (
    AlertMessage,
    DeliveryError,
    iso,
    rank_list,
    verdict_lines,
)
from rankwatch.actions.alerts.threads import ThreadStore, Who
from rankwatch.config.redact import redact_text
from rankwatch.records import Severity
from rankwatch.sanitize import slack_escape as _esc
from rankwatch.sanitize import slack_link as _link
from rankwatch.sanitize import visible

if TYPE_CHECKING:
    # slack-sdk is imported by the sink that uses it: an agent without Slack never loads it
    # (~3 MB of the agent's memory).
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient
    from slack_sdk.webhook.async_client import AsyncWebhookClient


log = logging.getLogger("rankwatch.alerts.slack")


class SlackSettings(Protocol):
    """What the sink reads of ``alerts.slack`` (``slack.SlackConfig``, whose module imports
    this one when Slack is configured: named here, not imported back)."""

    @property
    def token(self) -> str | None: ...
    @property
    def channel(self) -> str | None: ...
    @property
    def webhook_url(self) -> str | None: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def timeout(self) -> float: ...


EMOJI = {
    Severity.CRITICAL: ":rotating_light:",
    Severity.WARNING: ":warning:",
    Severity.INFO: ":information_source:",
}
RESOLVED_EMOJI = ":white_check_mark:"
# Slack answers these with ok=false and a 200: a retry may succeed. Any other error is ours
# (token, channel, payload) and retrying only repeats it.
TRANSIENT = {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
MAX_THREADS = 10_000
THREAD_IO_S = 2.0  # reading or writing a shared thread id; past it the message goes unthreaded
BLOCK_TEXT_MAX = 3000  # Slack rejects a section whose text is longer (invalid_blocks)
# Evidence lists in the order a human wants them: the error, then what the log said last.
EVIDENCE_LISTS = {"traceback": "Traceback (last lines)", "lines": "Error lines", "tail": "Log tail"}


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _code_line(x: Any) -> str:
    # A fence inside would end the block.
    return _esc(str(x).rstrip(), multiline=False).replace("```", "`\u200b``")


def _tail(lines: list[str], room: int) -> list[str]:
    """The last lines that fit in ``room`` characters (newlines included)."""
    kept: list[str] = []
    for line in reversed(lines):
        room -= len(line) + 1
        if room < 0:
            break
        kept.append(line)
    return kept[::-1]


def evidence_text(evidence: dict[str, Any], limit: int = BLOCK_TEXT_MAX) -> str | None:
    """The evidence as one mrkdwn code block of at most ``limit`` characters.

    A crash's traceback and log tail live only in the evidence, so without this block the
    message says "crashed" and nobody sees why. The scalars (exit code, classification, ...)
    share one short first line; then the lists, traceback first, each keeping its last
    lines (a traceback's point is at its bottom) and leaving room for the ones after it;
    lines the traceback already showed are not repeated.
    """
    scalars = "  ".join(
        f"{k}: {_esc(', '.join(map(str, v)) if isinstance(v, list) else str(v))}"
        for k, v in evidence.items()
        if k not in EVIDENCE_LISTS and v is not None and not isinstance(v, dict) and _flat(v)
    )
    parts = [_cut(scalars, 300)] if scalars else []
    sections: list[tuple[str, list[str]]] = []
    shown: set[str] = set()
    for key, label in EVIDENCE_LISTS.items():
        raw = evidence.get(key)
        lines = raw.splitlines() if isinstance(raw, str) else raw
        if isinstance(lines, list):
            fresh = [_code_line(x) for x in lines if str(x).strip() and str(x).strip() not in shown]
            shown.update(str(x).strip() for x in lines)
            if fresh:
                sections.append((f"-- {label} --", fresh))
    for i, (head, lines) in enumerate(sections):
        left = limit - 6 - sum(len(p) + 1 for p in parts) - len(head) - 1  # 6: the fences
        later = len(sections) - i - 1
        kept = _tail(lines, left - min(400 * later, left * 2 // 3))
        if kept:
            parts.append("\n".join([head, *kept]))
    return "```" + "\n".join(parts) + "```" if parts else None


def _flat(v: Any) -> bool:
    return not isinstance(v, list) or (len(v) <= 20 and all(isinstance(x, (str, int, float)) for x in v))


def _nodes(nodes: list[str]) -> str:
    return ", ".join(nodes[:3]) + (f" +{len(nodes) - 3} more" if len(nodes) > 3 else "")


def build_blocks(a: AlertMessage) -> list[dict[str, Any]]:
    emoji = RESOLVED_EMOJI if a.status == "resolved" else EMOJI[a.severity]
    sev = "RESOLVED" if a.status == "resolved" else a.severity.label.upper()
    header = _cut(visible(f"{emoji} {sev}: {a.title} — run {a.run}"), 150)
    ranks = rank_list(a.ranks) or "?"
    if a.suspect is not None and len(a.members) > 1:
        ranks += f" (suspect {a.suspect})"
    fields = [
        f"*Run*\n`{_esc(a.run)}`",
        f"*{'Ranks' if len(a.members) > 1 else 'Rank'}*\n{ranks}",
        f"*{'Nodes' if len(a.nodes) > 1 else 'Node'}*\n{_esc(_nodes(a.nodes))}",
        f"*Step*\n{a.step if a.step is not None else '—'}",
        f"*Severity*\n{a.severity.label}",
        f"*Since*\n{iso(a.starts_at)}",
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header, "emoji": True}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(_esc(a.message), 2900)}},
    ]
    lead = next((m for m in a.members if m.rank == a.rank), a.members[0])
    verdict = verdict_lines(a.diagnosis) if a.status == "firing" else []
    if verdict:
        text = "*Verdict:* " + "\n".join(_esc(line) for line in verdict)
        blocks.insert(1, {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text, 2900)}})
    evidence = evidence_text(lead.evidence) if a.status == "firing" else None
    if evidence:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": evidence}})
    if a.dump_path:
        text = f"*Stack dumps:* `{_esc(a.dump_path)}`  (`rankwatch dumps show`)"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    links = [
        x
        for x in (
            _link(a.report_url, "Open the incident report") if a.report_url else None,
            _link(a.grafana_url, "Open in Grafana") if a.grafana_url else None,
        )
        if x
    ]
    if links:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "  ·  ".join(links)}})
    return blocks


def fallback_text(a: AlertMessage) -> str:
    """The notification text (push, sidebar, screen readers): mrkdwn, so escaped like blocks."""
    sev = "RESOLVED" if a.status == "resolved" else a.severity.label.upper()
    return _cut(_esc(f"[{sev}] {a.title} (run {a.run}, node {a.node}): {a.message}"), 3000)


class SlackSink:
    name = "slack"

    def __init__(self, cfg: SlackSettings) -> None:
        self.timeout = float(cfg.timeout)
        self.channel = cfg.channel
        self._secrets = [x for x in (cfg.token, cfg.webhook_url) if x]
        from slack_sdk.web.async_client import AsyncWebClient
        from slack_sdk.webhook.async_client import AsyncWebhookClient

        self._web: AsyncWebClient | None = None
        self._hook: AsyncWebhookClient | None = None
        if cfg.token and cfg.channel:
            base = cfg.base_url or AsyncWebClient.BASE_URL
            if not base.endswith("/"):
                base += "/"
            self._web = AsyncWebClient(
                token=cfg.token,
                base_url=base,
                timeout=self.timeout,  # type: ignore[arg-type]
                retry_handlers=[],
            )
        elif cfg.webhook_url:
            self._hook = AsyncWebhookClient(
                cfg.webhook_url,
                timeout=self.timeout,  # type: ignore[arg-type]
                retry_handlers=[],
            )
        else:
            raise ValueError("slack needs token + channel or webhook_url")
        self._threads: dict[tuple[str, int | None, str, str | None], str] = {}  # (run, rank, kind, subject)
        self._store: ThreadStore | None = None
        self._logged: set[str] = set()

    def share_threads(self, store: ThreadStore) -> None:
        """Keep thread ids where the run's other agents find them (beside the alert board)."""
        self._store = store

    async def _shared(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            from rankwatch.offloop import call

            return await call(fn, *args, timeout=THREAD_IO_S, name="rankwatch-slack-threads")
        except Exception as e:  # threading is a nicety: the alert goes out regardless
            if "threads" not in self._logged:
                self._logged.add("threads")
                log.warning("Slack thread ids not shared (%s): resolves may start new threads", e)
            return None

    async def deliver(self, alert: AlertMessage) -> None:
        import asyncio  # on first use: the config schema imports this module for its settings

        import aiohttp

        blocks = build_blocks(alert)
        text = fallback_text(alert)
        try:
            if self._web is not None:
                await self._post(alert, text, blocks)
            else:
                await self._webhook(text, blocks)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise DeliveryError(redact_text(f"slack: {type(e).__name__}: {e}", self._secrets)) from e
        except ValueError as e:  # a URL aiohttp cannot use: retrying repeats it
            raise DeliveryError(
                redact_text(f"slack: {type(e).__name__}: {e}", self._secrets), permanent=True
            ) from e

    async def _post(self, alert: AlertMessage, text: str, blocks: list[dict[str, Any]]) -> None:
        from slack_sdk.errors import SlackApiError

        assert self._web is not None and self.channel is not None
        keys = [(alert.run, m.rank, alert.kind, m.subject) for m in alert.members]
        who: list[Who] = [(m.rank, m.subject) if m.subject is not None else m.rank for m in alert.members]
        thread = None
        if alert.status == "resolved" or alert.repeat:
            thread = next((self._threads[k] for k in keys if k in self._threads), None)
            if thread is None and self._store is not None:
                thread = await self._shared(self._store.get, alert.kind, who, self.channel, time.time())
        try:
            resp = await self._web.chat_postMessage(
                channel=self.channel,
                text=text,
                blocks=blocks,
                thread_ts=thread,
                reply_broadcast=True if thread else None,
            )
        except SlackApiError as e:
            raise self._api_error(e) from e
        if alert.status == "resolved":
            for k in keys:
                self._threads.pop(k, None)
            if self._store is not None:
                await self._shared(self._store.drop, alert.kind, who)
        elif not alert.repeat and isinstance(resp.get("ts"), str):
            for k in keys:
                self._threads[k] = resp["ts"]
            while len(self._threads) > MAX_THREADS:
                del self._threads[next(iter(self._threads))]
            if self._store is not None:
                await self._shared(self._store.put, alert.kind, who, self.channel, resp["ts"], time.time())

    def _api_error(self, e: SlackApiError) -> DeliveryError:
        r = e.response
        status = getattr(r, "status_code", 0) or 0
        data = getattr(r, "data", None)
        code = data.get("error", "") if isinstance(data, dict) else ""
        if status == 429 or code == "ratelimited":
            return DeliveryError("slack: rate limited (429)", retry_after=_retry_after(r.headers))
        if status >= 500 or code in TRANSIENT:
            return DeliveryError(f"slack: HTTP {status} {code}".rstrip())
        self._log_once(code or f"HTTP {status}")
        return DeliveryError(f"slack: {code or f'HTTP {status}'}", permanent=True)

    async def _webhook(self, text: str, blocks: list[dict[str, Any]]) -> None:
        assert self._hook is not None
        resp = await self._hook.send(text=text, blocks=blocks)
        if resp.status_code == 200:
            return
        if resp.status_code == 429:
            raise DeliveryError("slack webhook: rate limited (429)", retry_after=_retry_after(resp.headers))
        if resp.status_code >= 500:
            raise DeliveryError(f"slack webhook: HTTP {resp.status_code}")
        self._log_once(f"HTTP {resp.status_code} {resp.body}")
        raise DeliveryError(f"slack webhook: HTTP {resp.status_code} {resp.body}", permanent=True)

    def _log_once(self, what: str) -> None:
        if what in self._logged:
            return
        self._logged.add(what)
        hint = ""
        if "invalid_auth" in what or "not_authed" in what or "token" in what:
            hint = " (check alerts.slack.token / SLACK_BOT_TOKEN)"
        elif "channel_not_found" in what or "not_in_channel" in what:
            hint = f" (check alerts.slack.channel {self.channel!r} and invite the bot)"
        log.error("Slack rejected alerts: %s%s; such alerts are dropped, not retried", what, hint)


def _retry_after(headers: Any) -> float:
    try:
        return max(0.0, float((headers or {}).get("Retry-After", 1)))
    except (TypeError, ValueError):
        return 1.0
