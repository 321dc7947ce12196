"""Config hot reload: the live agent re-reads its ``--config`` file when it changes.

A bad edit must never take monitoring down, so an invalid file keeps the last good
config running and is reported once per edit (one log line with file:line: key, and
``rankwatch_config_reloads_total{result="error"}``).

A config is an immutable snapshot. A good edit produces a new one, and ``hand_over`` gives
it to the running components that can take it: every rank's engine takes the sections its
detectors are built from (``RankEngine.reconfigure``: a detector that reads its settings on
every use takes them, one shaped by them, such as a window that is a deque's length, is
built anew with its open episodes), the alert dispatcher takes its policy. What is in
effect afterwards is whatever the components took, so what the log line calls applied, and
what it names as needing a restart (sinks, paths, the server, identity, intervals of
running loops), is derived from that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwatch import offloop
from rankwatch.config.loader import ConfigError
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.detectors.registry import load_all
from rankwatch.runtime.watcher import RankWatcher

log = logging.getLogger("rankwatch.config")

POLL_TIMEOUT_S = 30.0  # one stat + read + validate of the config file, on a hung mount: given up

# What the alert dispatcher builds once, at start, from ``alerts``: its sinks, its spool and
# state files, the shared board and the per-sink rate buckets. The rest of ``alerts`` is policy
# it reads on every alert, so it takes a new snapshot of those as they are.
ALERTS_BUILT_AT_START = (
    "slack",
    "alertmanager",
    "webhook",
    "spool_dir",
    "spool_max_bytes",
    "board_dir",
    "board_takeover",
    "rate_limit_per_minute",
)


@dataclass(frozen=True)
class ConfigSource:
    """Where the live config came from and how to build it again (file plus CLI overrides)."""

    path: Path
    load: Callable[[], Config]


def changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two snapshots, in schema order."""
    if dataclasses.is_dataclass(old) and dataclasses.is_dataclass(new):
        out: list[str] = []
        for f in dataclasses.fields(old):
            key = f"{prefix}.{f.name}" if prefix else f.name
            out += changed_keys(getattr(old, f.name), getattr(new, f.name), key)
        return out
    return [] if old == new else [prefix]


# Sections some detectors read that also configure components built once at start (the
# identity, the process and GPU samplers' loops, the checkpoint watcher): their changes
# wait for a restart.
SHARED_WITH_LOOPS = ("run", "process", "gpu", "checkpoints")


def _sections_of_detectors() -> list[str]:
    """The config sections the per-rank detectors alone are built from (``detectors.nan``,
    ``stall``, ...), from the detector registry: every engine takes a new snapshot of those."""
    out = [cls.section for cls in load_all() if cls.section is not None]
    return [s for s in dict.fromkeys(out) if s.split(".", 1)[0] not in SHARED_WITH_LOOPS]


def _at(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def hand_over(old: Config, new: Config, *, watchers: Sequence[RankWatcher], dispatcher: Any = None) -> Config:
    """Give the new snapshot to the running components that can take it; returns the config
    now in effect (``old`` with what they took from ``new``)."""
    taken: dict[str, Any] = {}
    detectors = ["detectors.warmup_steps", *_sections_of_detectors()]
    for key in detectors:
        if _at(new, key) != _at(old, key):
            taken[key] = _at(new, key)
    if new.alerts != old.alerts and dispatcher is not None:
        taken["alerts"] = replaced(new.alerts, {k: getattr(old.alerts, k) for k in ALERTS_BUILT_AT_START})
    effective = replaced(old, taken)
    if any(k != "alerts" for k in taken):
        for w in watchers:
            for engine in w.engines.values():
                engine.reconfigure(effective)
            # engines of ranks seen later are built from the watcher's snapshot
            w.cfg = replaced(w.cfg, {k: v for k, v in taken.items() if k != "alerts"})
    if "alerts" in taken:
        dispatcher.refresh_policy(effective.alerts)
    return effective


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ConfigReloader:
    """Polls one file's (inode, size, mtime, ctime) signature; ``check`` is the synchronous form."""

    def __init__(
        self,
        source: ConfigSource,
        current: Config,
        *,
        hand_over: Callable[[Config, Config], Config] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``hand_over(in effect, new)`` gives a new snapshot to the running components and
        returns the config in effect afterwards; without one nothing changes live."""
        self.source = source
        self.current = current
        self.hand_over = hand_over
        self.wall = wall
        self.reloads = {"ok": 0, "error": 0}
        self.last_success = True
        self.last_success_time = wall()
        self.last_error: str | None = None
        self._seen = _signature(source.path)

    def poll(self) -> Config | str | None:
        """Blocking part (stat, read, validate; no side effects on the running config):
        the new config, an error text, or None when the file did not change."""
        sig = _signature(self.source.path)
        if sig == self._seen:
            return None
        self._seen = sig
        try:
            return self.source.load()
        except ConfigError as e:
            return f"config error: {e}; keeping the last good config"
        except Exception as e:  # a loader bug must not stop the agent either
            return f"config reload failed ({type(e).__name__}: {e}); keeping the last good config"

    def apply(self, polled: Config | str | None) -> str | None:
        """Event-loop part: "ok", "error", or None for no change."""
        if polled is None:
            return None
        if isinstance(polled, str):
            return self._error(polled)
        old = self.current
        effective = self.hand_over(old, polled) if self.hand_over is not None else old
        self.current = effective
        applied = changed_keys(old, effective)
        restart = changed_keys(effective, polled)
        self.reloads["ok"] += 1
        self.last_success, self.last_success_time, self.last_error = True, self.wall(), None
        parts = [f"applied {', '.join(applied)}" if applied else "no live-applicable change"]
        if restart:
            parts.append(f"needs a restart to take effect: {', '.join(restart)}")
        log.warning("config %s reloaded: %s", self.source.path, "; ".join(parts))
        return "ok"

    def check(self) -> str | None:
        return self.apply(self.poll())

    def _error(self, text: str) -> str:
        self.reloads["error"] += 1
        self.last_success, self.last_error = False, text
        log.error("%s", text)
        return "error"

    def snapshot(self) -> dict[str, Any]:
        return {
            "reloads": dict(self.reloads),
            "last_success": self.last_success,
            "last_success_time": self.last_success_time,
        }

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        inflight: asyncio.Future[Config | str | None] | None = None  # a poll stuck on a hung mount
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                return
            if inflight is None:
                inflight = offloop.in_daemon(self.poll, name="rankwatch-config")
            try:
                polled = await asyncio.wait_for(asyncio.shield(inflight), POLL_TIMEOUT_S)
            except asyncio.TimeoutError:
                offloop.gave_up("rankwatch-config", POLL_TIMEOUT_S)
                continue  # the same poll is waited for again next turn: one thread at most
            except Exception as e:
                inflight = None
                self._error(f"config reload failed ({type(e).__name__}: {e}); keeping the last good config")
                continue
            inflight = None
            try:
                self.apply(polled)
            except Exception as e:
                self._error(f"config reload failed ({type(e).__name__}: {e}); keeping the last good config")


def config_path_from(arg: str | None) -> Path | None:
    path = arg or os.environ.get("RANKWATCH_CONFIG") or None
    return Path(path) if path else None
