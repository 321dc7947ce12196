"""Reading a big log in a second process (analyze on a spare core) must change nothing."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from faultlib import cut_reader
from rankwatch import analyze as analyze_mod
from rankwatch.analyze import analyze
from rankwatch.config.schema import Config
from rankwatch.sources import prefetch
from rankwatch.sources.lines import NOISE, read_lines
from rankwatch.sources.prefetch import prefetched_lines
from rankwatch.sources.signatures import may_hold_signature

MIXED = (
    b"node:1:2 [0] NCCL INFO Init COMPLETE\n"
    b" iteration        1/      10 | lm loss: 2.0 | grad norm: 0.5 |\n"
    b"\n"
    b"bar 10%\rbar 20%\r\n"
    b"caf\xc3\xa9 \xff\xfe not utf-8  \t tabs  and  spaces \n"
    b"node:1:2 [0] NCCL INFO Connected all trees iteration 3/ 10 | lm loss: nan | grad norm: nan |\n"
    b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    b"\x1b[31mE\x1b[0mrror split by colour\n"
    + b"x" * 5000
    + b"\n"
    + b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    + b" iteration        2/      10 | lm loss: 1.9 | grad norm: 0.4 |"
)


def _prefetched(path: Path, max_line_bytes: int, head_bytes: int = 0) -> list:
    return list(prefetched_lines(str(path), max_line_bytes=max_line_bytes, head_bytes=head_bytes))


@pytest.mark.process
@pytest.mark.parametrize("head_bytes", [0, 7777])
@pytest.mark.parametrize("max_line_bytes", [1 << 20, 1000])
def test_the_reading_process_yields_what_read_lines_yields(
    tmp_path: Path, max_line_bytes: int, head_bytes: int
) -> None:
    """Split anywhere (the head, read here, ends with its line), the lines and their numbers
    are read_lines's."""
    p = tmp_path / "rank-0.log"
    p.write_bytes(MIXED * 50)
    here = list(read_lines(p, max_line_bytes=max_line_bytes, drop=NOISE))
    there = _prefetched(p, max_line_bytes, head_bytes)
    assert [(x.text, x.lineno, x.cut) for x in there] == [(x.text, x.lineno, x.cut) for x in here]
    assert any(x.cut for x in there) == (max_line_bytes < 5000)
    for x in there:
        # "clean" promises the matcher's gate would say no; a colour code may split a word.
        if x.clean:
            assert not may_hold_signature(x.text) and "\x1b" not in x.text
    assert sum(x.clean for x in there) > len(there) // 3


@pytest.mark.process
def test_a_head_ending_inside_a_cut_line_is_read_whole_by_the_child(tmp_path: Path) -> None:
    p = tmp_path / "rank-0.log"
    p.write_bytes(b"first\n" + b"x" * (200 << 10) + b"\nlast\n")
    there = _prefetched(p, 1000, head_bytes=10)  # no newline near byte 10: no head
    assert [(x.lineno, x.cut, len(x.text)) for x in there] == [(1, False, 5), (2, True, 1000), (3, False, 4)]


@pytest.mark.process
def test_a_reading_process_that_dies_midway_is_replaced_by_reading_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its stream cut mid-batch (as if it were killed): the rest is read here, from the line
    after the last one it sent whole; nothing lost, nothing twice, \\r segments included."""
    p = tmp_path / "rank-0.log"
    p.write_bytes(MIXED * 300)

    monkeypatch.setattr(prefetch, "_start", cut_reader(150000))
    want = [(x.text, x.lineno, x.cut) for x in read_lines(p, max_line_bytes=1000, drop=NOISE)]
    for head in (0, 7777):
        caplog.clear()
        with caplog.at_level(logging.WARNING, "rankwatch.prefetch"):
            got = _prefetched(p, 1000, head)
        assert [(x.text, x.lineno, x.cut) for x in got] == want
        cut_after = re.search(r"after line (\d+); reading the rest here", caplog.text)
        assert cut_after is not None and 0 < int(cut_after[1]) < want[-1][1], caplog.text


@pytest.mark.unit
def test_a_reading_process_that_cannot_start_leaves_the_reading_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "rank-0.log"
    p.write_bytes(MIXED * 20)
    monkeypatch.setattr(prefetch, "_start", lambda *a: None)
    want = [(x.text, x.lineno, x.cut) for x in read_lines(p, drop=NOISE)]
    assert [(x.text, x.lineno, x.cut) for x in _prefetched(p, 1 << 20, 7777)] == want


@pytest.mark.process
def test_analyze_reads_the_same_with_or_without_the_second_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "rank-0.log"
    p.write_bytes(MIXED * 20)
    cfg = Config()
    alone = analyze([str(p)], cfg, jobs=1)
    monkeypatch.setattr(analyze_mod, "PREFETCH_MIN_BYTES", 0)
    monkeypatch.setattr(analyze_mod, "_cores", lambda: 2)
    used: list[bool] = []
    real = analyze_mod.analyze_file

    def spy(path: str, cfg: Config, fallback_rank: int | None, prefetch: bool = False, older: Any = ()):
        used.append(prefetch)
        return real(path, cfg, fallback_rank, prefetch, older)

    monkeypatch.setattr(analyze_mod, "analyze_file", spy)
    both = analyze([str(p)], cfg)
    assert used == [True]
    assert json.dumps(both.to_json(), default=str) == json.dumps(alone.to_json(), default=str)
    kinds = {f.kind for f in both.findings}
    assert {"nan_loss", "cuda_error", "oom"} <= kinds, kinds
    assert (both.ranks[0].lines, both.ranks[0].cut_lines) == (alone.ranks[0].lines, alone.ranks[0].cut_lines)
