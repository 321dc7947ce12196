from __future__ import annotations

import logging
import re
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.records import ErrorRecord, Record, StepRecord
from rankwatch.sources import parsers as parsers_pkg
from rankwatch.sources.logparser import LogParser
from rankwatch.sources.parsers.base import LogLine

pytestmark = pytest.mark.unit

_STEP = re.compile(r"step=(\d+) loss=(\S+)")


class StubParser:
    """Understands ``step=N loss=X``; remembers what it was built as."""

    name: ClassVar[str] = "stub"

    def __init__(self, fmt: str, regex: str | None = None) -> None:
        self.fmt = fmt
        self.regex = regex
        self.seen: list[LogLine] = []

    def sniff(self, text: str) -> bool:
        return text.startswith("step=")

    def parse(self, line: LogLine) -> list[Record]:
        self.seen.append(line)
        if line.text == "boom":
            raise RuntimeError("parser bug")
        m = _STEP.match(line.text)
        if not m:
            return []
        return [StepRecord(step=int(m[1]), loss=float(m[2]))]

    def progress(self) -> tuple[int, int]:
        return (len(self.seen), 100)


def stub_sniff(text: str) -> str | None:
    if text.startswith("step="):
        return "stub"
    if text.startswith("iter "):
        return "nanogpt"
    if text.startswith("{"):
        return "json"
    return None


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> list[StubParser]:
    built: list[StubParser] = []

    def make(name: str, *, regex: str | None = None, repeat_window: int = 4) -> StubParser:
        if name not in ("stub", "json", "nanogpt", "regex"):
            raise ValueError(f"unknown log format {name!r}")
        p = StubParser(name, regex)
        built.append(p)
        return p

    monkeypatch.setattr(parsers_pkg, "make_parser", make, raising=False)
    monkeypatch.setattr(parsers_pkg, "sniff_format", stub_sniff, raising=False)
    return built


def feed_all(p: LogParser, lines: list[str], now: float | None = None) -> list[Record]:
    out: list[Record] = []
    for i, line in enumerate(lines, 1):
        out.extend(p.feed(line, i, now=now))
    return out


def test_auto_detection_decides_on_the_first_sniffed_line(stub: list[StubParser]) -> None:
    p = LogParser(default_rank=5)
    recs = feed_all(p, ["loading model", "hello", "step=1 loss=2.5", "noise", "step=2 loss=2.4"], now=50.0)
    assert p.format == "stub"
    assert [(r.step, r.rank, r.line, r.time) for r in recs] == [(1, 5, 3, 50.0), (2, 5, 5, 50.0)]
    assert (p.stats.lines, p.stats.parsed, p.stats.unparsed) == (5, 2, 3)
    assert len(stub) == 1 and [ln.lineno for ln in stub[0].seen] == [3, 4, 5]


def test_undetected_stream_only_counts(stub: list[StubParser]) -> None:
    p = LogParser()
    assert feed_all(p, ["a", "b", "c"]) == []
    assert p.format is None and p.stats.unparsed == 3 and stub == []


def test_generic_format_gives_way_to_a_specific_one_within_the_window(stub: list[StubParser]) -> None:
    p = LogParser(sniff_lines=5)
    feed_all(p, ["{'a': 1}", "x", "iter 10: loss 1.0"])
    assert p.format == "nanogpt"
    assert [s.fmt for s in stub] == ["json", "nanogpt"]


def test_generic_format_is_final_after_the_window(stub: list[StubParser]) -> None:
    p = LogParser(sniff_lines=2)
    feed_all(p, ["{'a': 1}", "x", "y", "z", "iter 10: loss 1.0"])
    assert p.format == "json"


def test_specific_format_is_final(stub: list[StubParser]) -> None:
    p = LogParser()
    feed_all(p, ["step=1 loss=1", "iter 10: loss 1.0", "{'a': 1}"])
    assert p.format == "stub"


def test_forced_format_never_sniffs(stub: list[StubParser], monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sniff(text: str) -> str | None:
        raise AssertionError("sniffed")

    monkeypatch.setattr(parsers_pkg, "sniff_format", no_sniff)
    p = LogParser(fmt="json")
    assert p.format == "json"
    recs = feed_all(p, ["iter 1", "step=3 loss=1.5"])
    assert [r.step for r in recs] == [3]
    assert p.format == "json"


def test_forced_regex_format_gets_the_pattern(stub: list[StubParser]) -> None:
    LogParser(fmt="regex", regex=r"it (?P<step>\d+)")
    assert stub[0].fmt == "regex" and stub[0].regex == r"it (?P<step>\d+)"


def test_unknown_forced_format_fails_at_construction(stub: list[StubParser]) -> None:
    with pytest.raises(ValueError):
        LogParser(fmt="nope")


def test_rank_and_time_from_prefixes(stub: list[StubParser]) -> None:
    p = LogParser(default_rank=0)
    recs = feed_all(
        p,
        [
            "[rank3]: step=1 loss=2.0",
            "2024-05-01T10:00:00Z [rank1]: step=1 loss=3.0",
            "step=2 loss=1.0",
        ],
        now=7.0,
    )
    assert [(r.rank, r.time) for r in recs] == [(3, 7.0), (1, 1714557600.0), (0, 7.0)]
    assert p.ranks_seen == {1, 3}
    assert len(stub) == 3, "one parser per rank"
    assert stub[0].seen[0].text == "step=1 loss=2.0" and stub[0].seen[0].rank == 3


def test_parser_exceptions_are_isolated_counted_and_logged_once(
    stub: list[StubParser], caplog: pytest.LogCaptureFixture
) -> None:
    p = LogParser(fmt="stub")
    with caplog.at_level(logging.WARNING, logger="rankwatch.parse"):
        recs = feed_all(
            p, ["boom", "step=1 loss=1", "boom", "RuntimeError: CUDA error: unspecified launch failure"]
        )
    assert [type(r).__name__ for r in recs] == ["StepRecord", "ErrorRecord"]
    assert p.stats.errors == 2
    assert len([r for r in caplog.records if r.name == "rankwatch.parse"]) == 1


def test_sniffer_exceptions_are_isolated(stub: list[StubParser], monkeypatch: pytest.MonkeyPatch) -> None:
    def bad_sniff(text: str) -> str | None:
        raise ValueError("sniffer bug")

    monkeypatch.setattr(parsers_pkg, "sniff_format", bad_sniff)
    p = LogParser()
    assert feed_all(p, ["a", "b"]) == []
    assert p.stats.errors == 2 and p.format is None


def test_cut_lines_reach_signatures_but_not_the_format_parser(stub: list[StubParser]) -> None:
    p = LogParser(fmt="stub")
    recs = p.feed("step=1 loss=1" + "9" * 50, 1, cut=True)
    assert recs == [] and p.stats.cut == 1 and stub[0].seen == []
    recs = p.feed("RuntimeError: CUDA error: device-side assert triggered" + "x" * 50, 2, cut=True)
    assert [r.kind for r in recs if isinstance(r, ErrorRecord)] == ["cuda_error"]


def test_progress_pass_through(stub: list[StubParser]) -> None:
    p = LogParser(fmt="stub", default_rank=2)
    p.feed("x", 1)
    assert p.progress() == (1, 100)
    assert p.progress(9) is None


INTERLEAVED = [
    "[rank0]: Traceback (most recent call last):",
    "[rank1]: Traceback (most recent call last):",
    '[rank0]:   File "/workspace/train.py", line 50, in <module>',
    '[rank1]:   File "/workspace/train.py", line 50, in <module>',
    "[rank0]:     main()",
    "[rank1]:     main()",
    '[rank0]:   File "/workspace/train.py", line 41, in main',
    '[rank1]:   File "/workspace/data.py", line 12, in collate',
    "[rank0]:     loss.backward()",
    "[rank1]:     raise ValueError('bad batch')",
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU "
    "0 has a total capacity "
    "of 79.11 GiB of which 1.00 GiB is free. Of the allocated memory 75.00 GiB is allocated by PyTorch",
    "[rank1]: ValueError: bad batch",
    "W0501 10:00:01.000000 123 torch/distributed/elastic/multiprocessing/api.py:897] "
    "Sending process 1235 closing "
    "signal SIGTERM",
]


def test_interleaved_tracebacks_of_two_ranks_stay_apart(stub: list[StubParser]) -> None:
    p = LogParser()
    recs = feed_all(p, INTERLEAVED) + p.finish()
    errs = sorted((r for r in recs if isinstance(r, ErrorRecord)), key=lambda r: r.rank)
    assert [(r.rank, r.kind) for r in errs] == [(0, "oom"), (1, "crash")]
    oom, crash = errs
    assert oom.details["frame"] == "/workspace/train.py:41 main" and len(oom.evidence) == 6
    assert all("ValueError" not in line for line in oom.evidence)
    assert (
        crash.summary == "ValueError: bad batch" and crash.details["frame"] == "/workspace/data.py:12 collate"
    )
    assert oom.line == 11 and crash.line == 12
    assert p.ranks_seen == {0, 1}


def test_held_back_tracebacks_of_other_ranks_expire(stub: list[StubParser]) -> None:
    p = LogParser()
    recs = feed_all(p, INTERLEAVED)
    assert not [r for r in recs if isinstance(r, ErrorRecord)]
    later = [r for i in range(300) for r in p.feed(f"[rank2]: waiting {i}", 100 + i)]
    assert sorted(r.rank for r in later if isinstance(r, ErrorRecord)) == [0, 1]
    assert p.finish() == []


def test_release_pending_for_quiet_streams(stub: list[StubParser]) -> None:
    p = LogParser()
    feed_all(p, INTERLEAVED[:-1])
    assert sorted(r.rank for r in p.release_pending()) == [0, 1]
    assert p.finish() == []


def test_signature_matcher_failure_is_isolated(
    stub: list[StubParser], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankwatch.sources import signatures

    def broken(self: object, *a: object, **k: object) -> list[ErrorRecord]:
        raise RuntimeError("matcher bug")

    monkeypatch.setattr(signatures.SignatureMatcher, "feed", broken)
    p = LogParser(fmt="stub")
    # A step's own line is spared the signatures (issue 27): the matcher fails on the next one.
    assert [r.step for r in feed_all(p, ["step=4 loss=1", "RuntimeError: boom"])] == [4]
    assert p.stats.errors == 1


# -- with the real format parsers -------------------------------------------------------------

real = pytest.mark.skipif(not hasattr(parsers_pkg, "sniff_format"), reason="format parsers not available")


@real
def test_real_hf_stream_with_torchrun_prefixes_and_an_oom() -> None:
    p = LogParser()
    lines = [
        "[rank1]: Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.50s/it]",
        "[rank1]: {'loss': 2.3456, 'grad_norm': 1.234, 'learning_rate': 4.5e-05, 'epoch': 0.12}",
        "[rank1]: {'loss': 2.1, 'grad_norm': 1.1, 'learning_rate': 4.4e-05, 'epoch': 0.13}",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/w/train.py", line 9, in <module>',
        "[rank1]:     trainer.train()",
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 1 has a total "
        "capacity of 79.11 GiB of which 10.00 MiB is free.",
    ]
    recs = feed_all(p, lines) + p.finish()
    assert p.format == "hf"
    steps = [r for r in recs if isinstance(r, StepRecord)]
    assert [(r.loss, r.rank) for r in steps] == [(2.3456, 1), (2.1, 1)]
    errs = [r for r in recs if isinstance(r, ErrorRecord)]
    assert [(r.kind, r.rank, r.details["gpu"]) for r in errs] == [("oom", 1, 1)]


@real
def test_real_megatron_lines_detected() -> None:
    p = LogParser(default_rank=0)
    line = (
        " [2024-05-01 10:00:00] iteration      100/    1000 | consumed samples:        "
        "12800 | elapsed time per "
        "iteration (ms): 1234.5 | learning rate: 1.000E-04 | global batch size:   128 | lm "
        "loss: 2.345678E+00 | "
        "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number "
        "of nan iterations:   0 |"
    )
    recs = feed_all(p, ["building GPT model ...", line])
    assert p.format == "megatron"
    assert [(r.step, r.rank) for r in recs if isinstance(r, StepRecord)] == [(100, 0)]


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=120),
            st.sampled_from(INTERLEAVED),
            st.sampled_from(["{'loss': 1.0, 'epoch': 0.1}", "step=1 loss=nan", "[rank2]: {'loss': 'x'}"]),
        ),
        max_size=30,
    ),
    st.sampled_from(["auto", "json", "kv", "hf", "megatron"]),
)
def test_feed_never_raises(lines: list[str], fmt: str) -> None:
    p = LogParser(fmt=fmt)
    for i, line in enumerate(lines, 1):
        p.feed(line, i, cut=i % 7 == 0)
    p.finish()
    assert p.stats.lines == len(lines)


def test_tqdm_segments_inherit_the_prefix_rank_of_their_line() -> None:
    lp = LogParser(fmt="hf")
    lp.feed("[default0]:", 5)
    lp.feed(" 41%|████      | 1240/3000 [20:40<29:20,  1.00it/s]", 5)
    recs = lp.feed(
        "[default0]:{'loss': '1.5', 'grad_norm': '0.4', 'learning_rate': '1e-05', 'epoch': '0.4'}", 6
    )
    assert [(r.rank, r.step) for r in recs] == [(0, 1240)]
