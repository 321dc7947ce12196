from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from followlib import follow
from rankwatch.sources.follower import FollowedLine, LogFollower, read_lines

pytestmark = pytest.mark.unit

Item = tuple[str, int, bool]


def items(lines: list[FollowedLine]) -> list[Item]:
    return [(x.text, x.lineno, x.cut) for x in lines]


def append(path: Path, data: bytes | str) -> None:
    with open(path, "ab") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def read_all(f: LogFollower, max_bytes: int | None = None) -> list[FollowedLine]:
    out: list[FollowedLine] = []
    while True:
        out += f.read_available(max_bytes)
        if not f.behind:
            return out


def reference(data: bytes, max_line_bytes: int) -> list[Item]:
    """The splitting rules written the slow, obvious way."""
    out: list[Item] = []
    for lineno, line in enumerate(data.split(b"\n"), 1):
        for seg in line.split(b"\r"):
            if len(seg) > max_line_bytes:
                text, _ = codecs.utf_8_decode(seg[:max_line_bytes], "replace", False)
                out.append((text, lineno, True))
            elif seg:
                out.append((seg.decode("utf-8", "replace"), lineno, False))
    return out


def test_file_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "rank-0.log"
    f = LogFollower(path, from_end=True)
    assert f.read_available() == []
    path.parent.mkdir()
    assert f.read_available() == []
    append(path, "iteration 1 | lm loss: 7.1\niteration 2 | lm loss: 6.9\n")
    assert items(f.read_available()) == [
        ("iteration 1 | lm loss: 7.1", 1, False),
        ("iteration 2 | lm loss: 6.9", 2, False),
    ]
    append(path, "iteration 3 | lm loss: 6.8\n")
    assert items(f.read_available()) == [("iteration 3 | lm loss: 6.8", 3, False)]
    f.close()


def test_from_end_skips_history_but_completes_the_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    append(path, "old 1\nold 2\nstep 3 lo")
    f = LogFollower(path, from_end=True)
    assert f.read_available() == []
    append(path, "ss nan\nstep 4 loss 1.0\n")
    assert items(f.read_available()) == [("step 3 loss nan", 1, False), ("step 4 loss 1.0", 2, False)]
    f.close()


def test_a_lazy_open_from_a_known_start_loses_nothing_written_before_it(tmp_path: Path) -> None:
    """Run mode knows where its child's output begins (the log's size before the child starts);
    the first open runs later, on the rank's log thread: what the child wrote meanwhile (a
    mistyped script's one line, and its exit) is read, the earlier run's lines are not."""
    p = tmp_path / "rank-0.log"
    p.write_text("an earlier run's line\n")
    start = p.stat().st_size
    late = LogFollower(p, from_end=True, lazy=True, start_at=start)
    plain = LogFollower(p, from_end=True, lazy=True)
    append(p, "python: can't open file '/x/trian.py': [Errno 2] No such file or directory\n")
    assert [t for t, _, _ in items(read_all(late))] == [
        "python: can't open file '/x/trian.py': [Errno 2] No such file or directory"
    ]
    assert items(read_all(plain)) == []  # from the end at its open: the line is lost
    # A file shorter than the start (truncated, replaced meanwhile): from its end, as before.
    q = tmp_path / "other.log"
    q.write_text("x\n")
    assert items(read_all(LogFollower(q, from_end=True, lazy=True, start_at=100))) == []


def test_partial_line_written_in_pieces_is_emitted_once(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.touch()
    f = LogFollower(path)
    for piece in ["{'loss': 2.3", "1, 'learning_rate'", ": 5e-05, 'epoch': 0.1}"]:
        append(path, piece)
        assert f.read_available() == []
    append(path, "\n{'loss': 2.2")
    assert items(f.read_available()) == [("{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.1}", 1, False)]
    assert f.read_available() == []
    assert items(f.flush()) == [("{'loss': 2.2", 2, False)]
    assert f.flush() == []
    assert f.read_available() == []
    assert f.stats.lines == 2
    f.close()


def test_carriage_return_progress_bars(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    bar = "Epoch 0:  10%|#         | 1/10\rEpoch 0:  20%|##        | 2/10\r"
    append(path, "start\n" + bar)
    f = LogFollower(path, chunk_size=7)
    assert items(f.read_available()) == [
        ("start", 1, False),
        ("Epoch 0:  10%|#         | 1/10", 2, False),
        ("Epoch 0:  20%|##        | 2/10", 2, False),
    ]
    # The \r\n is split across two writes and two reads: no empty extra item.
    append(path, "Epoch 0: 100%|##########| 10/10\r")
    assert items(f.read_available()) == [("Epoch 0: 100%|##########| 10/10", 2, False)]
    append(path, "\nloss 1.5\r\nloss 1.4\n\n\nend\n")
    assert items(f.read_available()) == [("loss 1.5", 3, False), ("loss 1.4", 4, False), ("end", 7, False)]
    f.close()


def test_crlf_split_at_chunk_boundary_within_one_read(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    append(path, "abc\r\ndef\r\n")
    for chunk in range(1, 8):
        got = items(list(read_lines(path, chunk_size=chunk)))
        assert got == [("abc", 1, False), ("def", 2, False)], chunk


def test_invalid_utf8_is_replaced_and_split_characters_survive(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.touch()
    f = LogFollower(path, chunk_size=3)
    text = "Schritt 7 — Verlust €2.5 🔥\n"
    data = b"bad \xff\xfe bytes \xe2\x82\n" + text.encode()
    cut = len(data) - 4  # inside the 4-byte emoji
    append(path, data[:cut])
    first = items(f.read_available())
    append(path, data[cut:])
    second = items(f.read_available())
    assert first == [("bad \ufffd\ufffd bytes \ufffd", 1, False)]
    assert second == [(text.rstrip("\n"), 2, False)]
    f.close()


def test_rename_rotation_loses_and_repeats_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rankwatch.follower")
    path = tmp_path / "rank-0.log"
    writer = open(path, "a")  # noqa: SIM115 - a logger holding its file open
    writer.write("old 1\nold 2\n")
    writer.flush()
    f = LogFollower(path, chunk_size=4)
    got = f.read_available()
    writer.write("old 3\nold 4\nold 5 partial")
    writer.flush()
    os.rename(path, tmp_path / "rank-0.log.1")
    writer.write(" tail\nold 6\n")  # the logger has not reopened yet
    writer.flush()
    writer.close()
    append(path, "new 1\nnew 2\n")
    got += f.read_available()
    assert items(got) == [
        ("old 1", 1, False),
        ("old 2", 2, False),
        ("old 3", 3, False),
        ("old 4", 4, False),
        ("old 5 partial tail", 5, False),
        ("old 6", 6, False),
        ("new 1", 1, False),
        ("new 2", 2, False),
    ]
    assert f.stats.rotations == 1
    assert any("rotated" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    append(path, "new 3\n")
    assert items(f.read_available()) == [("new 3", 3, False)]
    f.close()


def test_rotation_flushes_unterminated_last_line_of_old_file(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    append(path, "a\nb")
    f = LogFollower(path)
    assert items(f.read_available()) == [("a", 1, False)]
    os.rename(path, tmp_path / "old.log")
    append(path, "c\n")
    assert items(f.read_available()) == [("b", 2, False), ("c", 1, False)]
    f.close()


def test_bytes_written_between_last_read_and_noticing_the_rename_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank-0.log"
    writer = open(path, "a")  # noqa: SIM115 - a logger holding its file open
    writer.write("old 1\n")
    writer.flush()
    f = LogFollower(path)
    assert items(f.read_available()) == [("old 1", 1, False)]
    os.rename(path, tmp_path / "rank-0.log.1")
    append(path, "new 1\n")
    real_lstat = os.lstat
    where = {str(path), os.path.join(os.path.realpath(tmp_path), path.name)}

    def racing_lstat(p: object, *args: object, **kwargs: object) -> os.stat_result:
        # The old file grows after the follower hit its end but before it looked at the path.
        if os.fspath(p) in where and not writer.closed:  # type: ignore[arg-type]
            writer.write("old 2\n")
            writer.close()
        return real_lstat(p, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", racing_lstat)
    got = f.read_available()
    monkeypatch.undo()
    assert items(got) == [("old 2", 2, False), ("new 1", 1, False)]
    f.close()


@pytest.mark.parametrize("max_line_bytes", [4, 5, 7])
def test_cuts_do_not_depend_on_chunk_or_write_boundaries(tmp_path: Path, max_line_bytes: int) -> None:
    data = b"x\nabcde\nabcdefghijk\rxy\r\n\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\nlast"
    expected = reference(data, max_line_bytes)
    assert sum(cut for *_, cut in expected) >= 2
    path = tmp_path / "rank-0.log"
    path.write_bytes(data)
    for chunk in range(1, len(data) + 1):
        assert items(list(read_lines(path, max_line_bytes=max_line_bytes, chunk_size=chunk))) == expected
    live = tmp_path / "live.log"
    live.touch()
    f = LogFollower(live, max_line_bytes=max_line_bytes, chunk_size=3)
    got: list[FollowedLine] = []
    for i in range(len(data)):
        append(live, data[i : i + 1])
        got += f.read_available()
    assert items(got + f.flush()) == expected
    f.close()


def test_copytruncate_restarts_at_offset_zero(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "rank-0.log"
    append(path, "".join(f"step {i} loss 2.0\n" for i in range(1, 6)))
    f = LogFollower(path)
    assert len(f.read_available()) == 5
    inode = path.stat().st_ino
    shutil.copyfile(path, tmp_path / "rank-0.log.1")
    with open(path, "r+b") as fh:
        fh.truncate(0)
    append(path, "step 6 loss nan\n")
    assert path.stat().st_ino == inode
    assert items(f.read_available()) == [("step 6 loss nan", 1, False)]
    assert f.stats.truncations == 1
    assert f.stats.rotations == 0
    assert any(r.levelno == logging.WARNING and str(path) in r.getMessage() for r in caplog.records)
    f.close()


def test_copytruncate_gives_back_from_the_copy_what_was_written_since_the_last_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """logrotate's copytruncate between two polls: the lines written after our last read (a
    NaN among them) are in the copy only. They are read from it, in order, before the new
    file's; a sibling that is not the copy (other bytes before our offset, compressed) is not."""
    path = tmp_path / "rank-0.log"
    with open(path, "ab") as w:  # O_APPEND, as a redirected stdout is
        w.write(b"".join(b"step %d loss 2.0\n" % i for i in range(1, 6)))
        w.flush()
        f = LogFollower(path)
        assert len(f.read_available()) == 5
        w.write(b"step 6 loss 1.9\nstep 7 loss nan\nstep 8 lo")  # after our read, before the copy
        w.flush()
        (tmp_path / "rank-0.log.2").write_bytes(b"x" * 200)  # an older rotation: other bytes
        (tmp_path / "rank-0.log.3.gz").write_bytes(path.read_bytes())  # compressed: never read
        (tmp_path / "rank-0.logger.txt").write_bytes(path.read_bytes())  # another log's name
        shutil.copyfile(path, tmp_path / "rank-0.log.1")
        os.truncate(path, 0)
        w.write(b"step 9 loss nan\n")
        w.flush()
        got = items(f.read_available())
    assert got == [
        ("step 6 loss 1.9", 6, False),
        ("step 7 loss nan", 7, False),
        ("step 8 lo", 8, False),  # the copy's cut last line, flushed as it is
        ("step 9 loss nan", 1, False),
    ]
    assert f.stats.truncations == 1 and "rank-0.log.1" in caplog.text
    f.close()


def test_copytruncate_copy_that_is_a_symlink_or_another_users_is_never_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The copy is opened like the log: no symlink (to a file of the same bytes elsewhere),
    and only a file of the log's owner."""
    path = tmp_path / "rank-0.log"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with open(path, "ab") as w:
        w.write(b"step 1 loss 2.0\n")
        w.flush()
        f = LogFollower(path)
        assert len(f.read_available()) == 1
        w.write(b"step 2 loss nan\n")
        w.flush()
        shutil.copyfile(path, outside / "copy")
        (tmp_path / "rank-0.log.1").symlink_to(outside / "copy")
        if os.geteuid() == 0:
            shutil.copyfile(path, tmp_path / "rank-0.log.2")
            os.chown(tmp_path / "rank-0.log.2", 65534, 65534)
        os.truncate(path, 0)
        w.write(b"step 3 loss 2.0\n")
        w.flush()
        got = items(f.read_available())
    assert got == [("step 3 loss 2.0", 1, False)]
    assert f.stats.truncations == 1 and "its copy" not in caplog.text
    f.close()


def test_huge_line_is_cut_with_bounded_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "rank-0.log"
    block = b"0.1234, " * (1 << 17)  # 1 MiB
    with open(path, "wb") as fh:
        fh.write(b"tensor([")
        for _ in range(50):
            fh.write(block)
        fh.write(b"])\nstep 1 loss 2.0\nstep 2 loss 1.9\n")
    huge = 8 + 50 * len(block) + 2
    f = LogFollower(path)
    tracemalloc.start()
    try:
        got = read_all(f)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    assert len(got) == 3
    assert got[0].cut and got[0].lineno == 1
    assert len(got[0].text) == 1 << 20
    assert got[0].text.startswith("tensor([0.1234, ")
    assert items(got[1:]) == [("step 1 loss 2.0", 2, False), ("step 2 loss 1.9", 3, False)]
    assert f.stats.cut_lines == 1
    assert f.stats.discarded_bytes == huge - (1 << 20)
    assert f.stats.bytes_read == path.stat().st_size
    assert any("longer than" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    f.close()


def test_cut_never_splits_a_utf8_character(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    append(path, "aaaaaaaaa€€€€\nok\n")  # € is 3 bytes: the cut at 10 falls inside one
    got = items(list(read_lines(path, max_line_bytes=10, chunk_size=4)))
    assert got == [("aaaaaaaaa", 1, True), ("ok", 2, False)]


def test_read_lines_includes_final_unterminated_line(tmp_path: Path) -> None:
    path = tmp_path / "rank-3.log"
    append(path, "a\n\nb\nlast one")
    expected = [("a", 1, False), ("b", 3, False), ("last one", 4, False)]
    assert items(list(read_lines(path))) == expected
    with LogFollower(path, chunk_size=2) as f:
        assert items(list(f)) == expected
    empty = tmp_path / "empty.log"
    empty.touch()
    assert list(read_lines(empty)) == []


def test_max_bytes_bounds_each_call_without_losing_lines(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    append(path, "".join(f"line {i}\n" for i in range(1, 101)))
    f = LogFollower(path, chunk_size=16)
    first = f.read_available(max_bytes=40)
    assert 0 < len(first) <= 6 and f.behind
    rest = read_all(f, max_bytes=40)
    assert [x.text for x in first + rest] == [f"line {i}" for i in range(1, 101)]
    assert [x.lineno for x in first + rest] == list(range(1, 101))
    f.close()


def test_a_directory_where_the_log_should_be_is_refused_and_counted_once_not_raised(tmp_path: Path) -> None:
    f = LogFollower(tmp_path)
    assert f.read_available() == []
    assert f.read_available() == []
    assert f.stats.refused_opens == 1


def _watchdog_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t is not threading.current_thread() and t.daemon}


async def _first_batch(path: Path, poll_interval: float) -> tuple[list[FollowedLine], float]:
    f = LogFollower(path)
    stop = asyncio.Event()
    gen = follow(f, poll_interval=poll_interval, stop=stop)
    async with contextlib.aclosing(gen):
        first = await asyncio.wait_for(gen.__anext__(), 2)
        # The watch is up: follow starts it (watchdog adds the inotify watch before its
        # start returns) before it reads, so before the first batch.
        assert items(first) == [("iteration 1 | lm loss: 7.1", 1, False)]
        start = time.monotonic()
        append(path, "iteration 2 | lm loss: nan\n")
        batch = await asyncio.wait_for(gen.__anext__(), 2)
        latency = time.monotonic() - start
        stop.set()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(gen.__anext__(), 2)
    f.close()
    return batch, latency


@pytest.mark.parametrize("poll_interval", [0.05, 30.0])
def test_follow_picks_up_appended_nan_line(tmp_path: Path, poll_interval: float) -> None:
    """With a 30 s poll interval only the watchdog wake-up can deliver the line in time: the
    writer here opens, appends and closes, which a file-level event (close-after-write) sees."""
    path = tmp_path / "rank-0.log"
    append(path, "iteration 1 | lm loss: 7.1\n")
    before = _watchdog_threads()
    batch, latency = asyncio.run(_first_batch(path, poll_interval))
    assert items(batch) == [("iteration 2 | lm loss: nan", 2, False)]
    assert latency < 2
    assert not (_watchdog_threads() - before), "observer thread left running"


data_bytes = st.lists(
    st.sampled_from(
        [b"a", b"loss 1.5", b"\n", b"\r", b"\r\n", b"\xe2\x82\xac", b"\xf0\x9f\x94\xa5", b"\xff", b"\xe2"]
    ),
    max_size=60,
).map(b"".join)


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(
    data=data_bytes,
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    chunk_size=st.integers(min_value=1, max_value=9),
    max_line_bytes=st.sampled_from([4, 5, 9, 1 << 20]),
    max_bytes=st.sampled_from([None, 1, 5]),
)
def test_pieces_and_chunks_do_not_change_the_result(
    data: bytes, cuts: list[int], chunk_size: int, max_line_bytes: int, max_bytes: int | None
) -> None:
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.log"
        path.touch()
        f = LogFollower(path, chunk_size=chunk_size, max_line_bytes=max_line_bytes)
        got: list[FollowedLine] = []
        for lo, hi in itertools.pairwise(bounds):
            append(path, data[lo:hi])
            got += read_all(f, max_bytes)
        got += f.flush()
        f.close()
        whole = items(list(read_lines(path, max_line_bytes=max_line_bytes)))
    expected = reference(data, max_line_bytes)
    assert whole == expected
    assert items(got) == expected
    assert all(x.text for x in got)


@pytest.mark.parametrize("chunk_size", [7, 64, 1 << 20])
def test_noise_lines_are_dropped_and_line_numbers_stay_true(tmp_path: Path, chunk_size: int) -> None:
    from rankwatch.sources.follower import NOISE, FollowerStats

    p = tmp_path / "rank-0.log"
    p.write_bytes(
        b"node:1:2 [0] NCCL INFO Channel 00/32 : 0 1\n"
        b"iteration 1/ 10 | lm loss: 2.0 |\n"
        b"\n"
        b"node:1:2 [0] NCCL INFO Connected all trees\n"
        b"bar 10%\rbar 20%\n"
        b"node:1:2 [0] NCCL INFO Init COMPLETE\r\n"
        b"iteration 2/ 10 | lm loss: 1.9 |"
    )
    stats = FollowerStats()
    got = [(x.lineno, x.text) for x in read_lines(p, chunk_size=chunk_size, drop=NOISE, stats=stats)]
    assert got == [
        (2, "iteration 1/ 10 | lm loss: 2.0 |"),
        (5, "bar 10%"),
        (5, "bar 20%"),
        (7, "iteration 2/ 10 | lm loss: 1.9 |"),
    ]
    assert stats.dropped_lines == 3


@pytest.mark.parametrize("chunk_size", [7, 64, 1 << 20])
def test_a_step_glued_to_a_noise_line_is_kept(tmp_path: Path, chunk_size: int) -> None:
    """Block-buffered stdout and NCCL's writes share the file: a dict can land on an INFO line."""
    from rankwatch.sources.follower import NOISE

    p = tmp_path / "rank-0.log"
    glued = "node:1:2 [0] NCCL INFO Connected all trees{'loss': 'nan', 'grad_norm': 'nan', 'epoch': 0.31}"
    eval_ = "{'eval_loss': 'nan', 'eval_runtime': 1.2}node:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 2"
    p.write_text(f"node:1:2 [0] NCCL INFO Init COMPLETE\n{glued}\n{eval_}\rnext\n")
    got = [(x.lineno, x.text) for x in read_lines(p, chunk_size=chunk_size, drop=NOISE)]
    assert got == [(2, glued), (3, eval_), (3, "next")]


def test_copytruncate_refilled_past_the_offset_before_the_next_poll(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """logrotate's copytruncate, then the writer refills the file beyond where we were before
    we look again: the size never shrinks in our eyes, yet nothing may be skipped."""
    p = tmp_path / "rank-0.log"
    with open(p, "ab") as w:  # O_APPEND, as a redirected stdout is
        w.write(b"".join(b"old %04d\n" % i for i in range(100)))
        w.flush()
        f = LogFollower(p)
        assert len(f.read_available()) == 100
        os.truncate(p, 0)
        w.write(b"".join(b"new line %04d\n" % i for i in range(300)))
        w.flush()
        got = [x.text for x in f.read_available()]
    assert got == [f"new line {i:04d}" for i in range(300)]
    assert f.stats.truncations == 1 and "rewritten" in caplog.text
    with open(p, "ab") as w:
        w.write(b"tail\n")
    assert [x.text for x in f.read_available()] == ["tail"] and f.stats.truncations == 1
    f.close()


def test_noise_among_carriage_return_segments_is_dropped_alike_wherever_reads_split(tmp_path: Path) -> None:
    """tqdm redraws (\\r) with an NCCL INFO line glued among them: what is dropped is decided per
    segment, so it cannot depend on where a read (or the analyze reader's first byte) falls."""
    from rankwatch.sources.lines import NOISE

    bars = [f"train {i}%|{'#' * (i // 10)}| {i}/100" for i in range(0, 101, 5)]
    glued = "node:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
    line = "\r".join([*bars[:7], glued, *bars[7:], glued + "{'loss': 'nan'}"]) + "\n"
    p = tmp_path / "rank-0.log"
    p.write_text(("plain line\n" + line) * 40)
    results = {
        chunk: [(x.lineno, x.text) for x in read_lines(p, chunk_size=chunk, drop=NOISE)]
        for chunk in (7, 61, 100, 4096, 1 << 20)
    }
    first = results[1 << 20]
    assert all(r == first for r in results.values())
    assert sum(1 for _, t in first if NOISE in t) == 40  # only the one holding "loss" stays
    assert sum(1 for _, t in first if t.startswith("train ")) == 40 * len(bars)
