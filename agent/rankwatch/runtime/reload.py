"""Config hot reload: the live agent re-reads its ``--config`` file when it changes.

A bad edit must never take monitoring down, so an invalid file keeps the last good
config running and is reported once per edit (one log line with file:line: key, and
``rankwatch_config_reloads_total{result="error"}``). A good edit applies what can change
safely under running detectors: thresholds are copied *into* the config objects the
detectors and the alert dispatcher already hold, so their learned state (baselines,
windows, open episodes) survives. Everything else (sinks, paths, the server, identity,
intervals of running loops) is named in one log line as needing a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwatch.config.loader import ConfigError
from rankwatch.config.schema import Config

log = logging.getLogger("rankwatch.config")

# Sections whose values are read on every use by their consumers, so an in-place update
# takes effect from the next record / sample / alert on. ``detectors.warmup_steps`` is
# copied into each detector at start, so it is the one detectors key that needs a restart.
LIVE = (
    "detectors",
    "stall",
    "alerts.min_severity",
    "alerts.group_wait",
    "alerts.repeat_interval",
    "alerts.send_resolved",
    "alerts.max_retries",
    "alerts.backoff_max",
)
RESTART_ONLY = ("detectors.warmup_steps",)


@dataclass(frozen=True)
class ConfigSource:
    """Where the live config came from and how to build it again (file plus CLI overrides)."""

    path: Path
    load: Callable[[], Config]


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if dataclasses.is_dataclass(old) and dataclasses.is_dataclass(new):
        out: list[str] = []
        for f in dataclasses.fields(old):
            key = f"{prefix}.{f.name}" if prefix else f.name
            out += _diff(getattr(old, f.name), getattr(new, f.name), key)
        return out
    return [] if old == new else [prefix]


def _is_live(key: str) -> bool:
    if any(key == r or key.startswith(r + ".") for r in RESTART_ONLY):
        return False
    return any(key == p or key.startswith(p + ".") for p in LIVE)


def _assign(target: Any, new: Any, key: str) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        target, new = getattr(target, part), getattr(new, part)
    setattr(target, leaf, getattr(new, leaf))


def apply_live(current: Config, new: Config) -> tuple[list[str], list[str]]:
    """Copy the live-safe changed keys of ``new`` into ``current`` in place.

    Returns (applied keys, changed keys that need a restart).
    """
    applied: list[str] = []
    restart: list[str] = []
    for key in _diff(current, new):
        if _is_live(key):
            _assign(current, new, key)
            applied.append(key)
        else:
            restart.append(key)
    return applied, restart


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
        on_applied: Callable[[list[str]], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.current = current
        self.on_applied = on_applied
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
        applied, restart = apply_live(self.current, polled)
        self.reloads["ok"] += 1
        self.last_success, self.last_success_time, self.last_error = True, self.wall(), None
        if applied and self.on_applied is not None:
            self.on_applied(applied)
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
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                return
            try:
                self.apply(await asyncio.to_thread(self.poll))
            except Exception as e:
                self._error(f"config reload failed ({type(e).__name__}: {e}); keeping the last good config")


def config_path_from(arg: str | None) -> Path | None:
    path = arg or os.environ.get("RANKWATCH_CONFIG") or None
    return Path(path) if path else None
