"""Signal handlers where the loop can have them; elsewhere the agent runs without, says so once."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

import pytest

from rankwatch.runtime import signals

pytestmark = pytest.mark.unit


def test_a_loop_outside_the_main_thread_runs_without_handlers(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(signals, "_told", False)
    got: list[bool] = []
    errors: dict[str, int] = {}

    async def install() -> None:
        loop = asyncio.get_running_loop()
        got.extend(
            signals.on_signal(loop, s, lambda: None, errors=errors) for s in (signal.SIGTERM, signal.SIGINT)
        )

    with caplog.at_level(logging.INFO, "rankwatch.signals"):
        t = threading.Thread(target=asyncio.run, args=(install(),))
        t.start()
        t.join(10)
    assert got == [False, False]
    assert caplog.text.count("no signal handlers in this event loop") == 1
    assert errors == {"signals": 2}  # each handler the agent runs without is counted


def test_the_main_thread_gets_its_handler() -> None:
    hit: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert signals.on_signal(loop, signal.SIGUSR2, hit.append, 7)
        signal.raise_signal(signal.SIGUSR2)
        for _ in range(100):
            if hit:
                break
            await asyncio.sleep(0.01)
        loop.remove_signal_handler(signal.SIGUSR2)

    asyncio.run(main())
    assert hit == [7]
