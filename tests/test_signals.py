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


@pytest.mark.parametrize("error", [OSError(22, "Invalid argument"), ValueError("signal number out of range")])
def test_a_signal_the_loop_refuses_otherwise_is_counted_not_raised(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """add_signal_handler re-raises an OSError that is not EINVAL, and ValueError for a signal
    it cannot take: the agent starts without that handler, as it does off the main thread."""
    monkeypatch.setattr(signals, "_told", False)
    errors: dict[str, int] = {}

    class Refusing:
        def add_signal_handler(self, *_: object) -> None:
            raise error

    with caplog.at_level(logging.WARNING, "rankwatch.signals"):
        got = signals.on_signal(Refusing(), signal.SIGTERM, lambda: None, errors=errors)  # type: ignore[arg-type]
    assert got is False and errors == {"signals": 1}
    assert caplog.text.count("no signal handlers in this event loop") == 1


def test_the_signal_that_ended_a_command_is_the_one_its_status_names() -> None:
    from rankwatch.runtime.signals import ended_by

    sent = [signal.SIGINT, signal.SIGTERM]
    assert ended_by(-signal.SIGTERM, sent) == signal.SIGTERM  # killed by the second one
    assert ended_by(128 + signal.SIGINT, sent) == signal.SIGINT  # exited 130 from its handler
    assert ended_by(-signal.SIGKILL, sent) is None and ended_by(1, sent) is None


@pytest.mark.parametrize(
    ("last", "stop"),
    [
        ("KeyboardInterrupt", True),
        ("SystemExit: 130", True),
        ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 2", True),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", False),
        ("ValueError: KeyboardInterrupt in the message is no interrupt", False),
    ],
)
def test_an_interrupt_is_a_traceback_that_ends_in_a_stop_signals_exception(last: str, stop: bool) -> None:
    from rankwatch.runtime.signals import is_interrupt

    assert (
        is_interrupt(["Traceback (most recent call last):", '  File "t.py", line 1, in <module>', last, ""])
        is stop
    )
