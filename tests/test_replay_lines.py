"""A replayed log tail is split by the one splitter, and ``logs.encoding`` is how every reader
(live tail, replay, analyze) decodes a log.

``str.splitlines`` breaks lines at form feeds, U+2028 and lone ``\\r``: a replay that used it
saw other lines, with other numbers, than the live tail of the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankwatch.cli import main
from rankwatch.config.loader import ConfigError, config_from_yaml, load_config
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.engine import RankEngine
from rankwatch.identity import Identity
from rankwatch.records import ErrorRecord, EvalRecord, Finding, Record, StepRecord
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.sources.follower import LogFollower

pytestmark = pytest.mark.unit

IDENT = Identity(run="r", rank=0, local_rank=0, world_size=1, node="n")

LOG = (
    b"step=1 loss=2.0 lr=1e-4\n"
    b"step=2 loss=1.9 note=a\x0cb lr=2e-4\n"  # a form feed inside a line
    + "step=3 loss=1.8 note=a\u2028b lr=3e-4\n".encode()  # LINE SEPARATOR inside a line
    + b"step=4 loss=1.7 lr=4e-4\rstep=5 loss=1.6 lr=5e-4\rstep=6 loss=1.5 lr=6e-4\n"  # \r redraws
    b"step=7 loss=1.4 lr=7e-4\n"
)


def _cfg(**changes: Any) -> Config:
    return replaced(config_from_yaml("logs: {format: kv}\n"), changes)


def _fed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []
    feed = RankEngine.feed

    def spy(self: RankEngine, rec: Record) -> list[Finding]:
        if isinstance(rec, (StepRecord, EvalRecord, ErrorRecord)):  # log records, not other events
            seen.append(
                (
                    type(rec).__name__,
                    *(getattr(rec, k, None) for k in ("step", "loss", "learning_rate", "line")),
                )
            )
        return feed(self, rec)

    monkeypatch.setattr(RankEngine, "feed", spy)
    return seen


def _live(cfg: Config, log: Path) -> RankWatcher:
    w = RankWatcher(cfg, IDENT, [log], emit=lambda f: None)
    w.drain()
    w.close()
    return w


def _replayed(cfg: Config, log: Path) -> RankWatcher:
    w = RankWatcher(cfg, IDENT, [log], emit=lambda f: None, from_end=True, replay=True)
    w.catch_up()  # the history is read back off the loop, with the first open: parsed here
    w.close()
    return w


def test_a_replayed_tail_gives_the_records_live_tailing_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(LOG)
    seen = _fed(monkeypatch)
    _live(_cfg(), log)
    live = list(seen)
    seen.clear()
    _replayed(_cfg(), log)
    assert seen == live
    assert [r[1] for r in live] == [1, 2, 3, 4, 6, 7]  # the last redraw of line 4 is what it shows
    assert [r[4] for r in live] == [1, 2, 3, 4, 4, 5]
    assert live[1][3] == pytest.approx(2e-4) and live[2][3] == pytest.approx(3e-4)


def test_a_replay_that_starts_mid_file_skips_the_cut_line_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(LOG)
    seen = _fed(monkeypatch)
    first = len(b"step=1 loss=2.0 lr=1e-4\n")
    _replayed(_cfg(**{"logs.replay": len(LOG) - first}), log)  # starts just where line 2 begins
    assert [r[1] for r in seen] == [2, 3, 4, 6, 7]
    seen.clear()
    _replayed(_cfg(**{"logs.replay": len(LOG) - first - 3}), log)  # inside line 2: it is cut
    assert [r[1] for r in seen] == [3, 4, 6, 7]


LATIN1 = (
    b"step=1 loss=2.0 lr=1e-4\n"
    b"Traceback (most recent call last):\n"
    b'  File "train.py", line 3, in <module>\n'
    b"RuntimeError: r\xe9seau injoignable: NCCL error\n"
)


def test_logs_encoding_is_how_the_tail_the_replay_and_analyze_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(LATIN1)
    with LogFollower(log, encoding="latin-1") as f:
        assert "RuntimeError: réseau injoignable: NCCL error" in [x.text for x in f]
    with LogFollower(log) as f:
        assert "RuntimeError: r\ufffdseau injoignable: NCCL error" in [x.text for x in f]

    cfg = _cfg(**{"logs.encoding": "latin-1"})
    w = _replayed(cfg, log)
    w.release_quiet(force=True)  # the traceback waited for a continuation line
    assert "réseau" in w.engine.state.errors[-1].summary
    w = _live(cfg, log)
    assert "réseau" in w.engine.state.errors[-1].summary

    path = tmp_path / "c.yaml"
    path.write_text("logs: {encoding: latin-1}\n")
    assert main(["analyze", "--json", "--config", str(path), str(log)]) == 1
    (crash,) = json.loads(capsys.readouterr().out)["findings"]
    assert "RuntimeError: réseau injoignable" in crash["message"]
    assert main(["analyze", "--json", str(log)]) == 1
    (crash,) = json.loads(capsys.readouterr().out)["findings"]
    assert "r\ufffdseau" in crash["message"]


@pytest.mark.parametrize(
    ("name", "why"), [("utf-16", "does not keep ASCII"), ("klingon", "unknown encoding")]
)
def test_an_encoding_lines_cannot_be_split_in_is_a_config_error(tmp_path: Path, name: str, why: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"logs:\n  format: kv\n  encoding: {name}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert (e.value.line, e.value.key) == (3, "logs.encoding") and why in e.value.message


def test_a_history_replayed_after_the_alerts_started_still_reaches_them(tmp_path: Path) -> None:
    """The history is read back off the loop, so it may land after the alert dispatcher took
    the watchers' ``replayed`` at its start: the agent hands it on then."""
    from rankwatch.runtime.agent import Agent

    log = tmp_path / "rank-0.log"
    log.write_bytes(b"step=1 loss=2.5\nstep=2 loss=nan\n")
    cfg = replaced(_cfg(), {"dumps.dir": str(tmp_path / "dumps")})
    told: list[Finding] = []

    class Alerts:
        def replayed(self, findings: list[Finding]) -> None:
            told.extend(findings)

    agent = Agent(cfg, IDENT)
    agent.alerts = Alerts()  # type: ignore[assignment]
    w = agent.add_watcher([log], from_end=True, replay=True)
    w.catch_up()
    w.close()
    assert [f.kind for f in told if not f.resolved] == ["nan_loss"]
    assert told == w.replayed
