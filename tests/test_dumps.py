"""Stack dumps: real py-spy capture, incident layout, diff and CLI."""

from __future__ import annotations

import argparse
import json
import os
import select
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest

from rankwatch import safeio
from rankwatch.dumps.capture import DumpResult, capture, find_py_spy
from rankwatch.dumps.cli import add_subcommands
from rankwatch.dumps.diff import diff_incident, format_diff, format_ranks, main_stack
from rankwatch.dumps.show import format_rank
from rankwatch.dumps.store import DumpStore, incident_name

pytestmark = pytest.mark.timeout(30)

BLOCKER = textwrap.dedent(
    """
    import sys, threading

    def helper():
        threading.Event().wait()

    def wait_for_peer():
        threading.Event().wait()

    threading.Thread(target=helper, name="pin-memory", daemon=True).start()
    print("ready", flush=True)
    wait_for_peer()
    """
)

LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys
    subprocess.Popen([sys.executable, sys.argv[1]]).wait()
    """
)

HAVE_PY_SPY = find_py_spy() is not None
needs_py_spy = pytest.mark.skipif(not HAVE_PY_SPY, reason="py-spy not installed")


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    proc.kill()
    proc.wait(timeout=5)
    psutil.wait_procs(children, timeout=5)


def _spawn(tmp_path: Path, *, launcher: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    script = tmp_path / "train_blocker.py"
    script.write_text(BLOCKER)
    cmd = [sys.executable, str(script)]
    if launcher:
        (tmp_path / "launch.py").write_text(LAUNCHER)
        cmd = [sys.executable, str(tmp_path / "launch.py"), str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready and proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        _kill_tree(proc)


@pytest.fixture
def blocked(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    yield from _spawn(tmp_path)


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    yield from _spawn(tmp_path, launcher=True)


def _fake_py_spy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-py-spy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _names(threads: list[dict[str, Any]], pid: int | None = None) -> list[str]:
    return [f["name"] for t in threads if pid is None or t["pid"] == pid for f in t["frames"]]


# ---------------------------------------------------------------- capture


@pytest.mark.tool
@needs_py_spy
def test_capture_real_process(blocked: subprocess.Popen[bytes]) -> None:
    result = capture(blocked.pid, timeout=10)
    assert result.ok, result.text
    assert result.error is None
    assert result.command[1:5] == ["dump", "--pid", str(blocked.pid), "--json"]
    assert "--subprocesses" in result.command
    main = next(t for t in result.threads if t["thread_name"] == "MainThread")
    assert [f["name"] for f in main["frames"]][-2:] == ["wait_for_peer", "<module>"]
    assert main["frames"][-2]["filename"].endswith("train_blocker.py")
    assert main["pid"] == blocked.pid and main["active"] is False
    assert {"thread_id", "os_thread_id", "owns_gil", "frames"} <= main.keys()
    assert result.text.startswith(f"Process {blocked.pid}: {sys.executable}")
    assert f'Thread {main["os_thread_id"]} (idle): "MainThread"' in result.text
    assert "    wait_for_peer (train_blocker.py:8)" in result.text
    assert '"pin-memory"' in result.text
    assert 0 <= result.duration_s < 10


@pytest.mark.tool
@needs_py_spy
def test_capture_launcher_dumps_python_child(launched: subprocess.Popen[bytes]) -> None:
    result = capture(launched.pid, timeout=10)
    assert result.ok, result.text
    child = psutil.Process(launched.pid).children()[0].pid
    assert "wait_for_peer" in _names(result.threads, child)
    assert "wait_for_peer" not in _names(result.threads, launched.pid)
    assert [p["pid"] for p in result.processes] == [launched.pid, child]
    assert f"Parent Process {launched.pid}:" in result.text
    dump = {"pid": launched.pid, "ok": True, "threads": result.threads}
    assert [f["name"] for f in main_stack(dump)][-2:] == ["wait_for_peer", "<module>"]


@pytest.mark.tool
@needs_py_spy
def test_capture_leaves_out_a_child_that_is_a_rank_of_its_own(launched: subprocess.Popen[bytes]) -> None:
    """A script that started its other ranks itself (Lightning's DDP): each child rank is dumped
    by its own pipeline, so the script's dump holds its own stacks only; with both in one dump
    `dumps diff` read the hung rank and its waiting peer as one rank."""
    child = psutil.Process(launched.pid).children()[0].pid
    result = capture(launched.pid, timeout=10, others=frozenset({child}))
    assert result.ok, result.text
    assert not _names(result.threads, child), result.text
    assert _names(result.threads, launched.pid), result.text
    assert [p["pid"] for p in result.processes] == [launched.pid]
    assert "Parent Process" not in result.text and f"Process {child}" not in result.text
    # A pid that is not its descendant (the launcher's own pipeline) takes nothing away.
    alone = capture(child, timeout=10, others=frozenset({launched.pid}))
    assert "wait_for_peer" in _names(alone.threads, child), alone.text


@pytest.mark.tool
@needs_py_spy
def test_capture_with_locals(blocked: subprocess.Popen[bytes]) -> None:
    result = capture(blocked.pid, locals_=True, subprocesses=False, timeout=10)
    assert result.ok and "--locals" in result.command and "--subprocesses" not in result.command
    assert "        Arguments:" in result.text


@pytest.mark.unit
def test_missing_py_spy() -> None:
    result = capture(os.getpid(), py_spy="/nonexistent/py-spy")
    assert not result.ok and result.error == "py-spy not found"
    assert "pip install py-spy" in result.text
    assert result.threads == []


@pytest.mark.unit
def test_find_py_spy_next_to_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    beside = Path(sys.executable).parent / "py-spy"
    if not beside.is_file():
        pytest.skip("py-spy not installed next to the interpreter")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_py_spy("py-spy") == str(beside)
    assert find_py_spy("/nonexistent/py-spy") is None


@pytest.mark.process
@needs_py_spy
def test_dead_pid() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    result = capture(proc.pid)
    assert not result.ok and result.error == "process gone"
    assert str(proc.pid) in result.text


@pytest.mark.tool
@needs_py_spy
def test_not_a_python_process() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        result = capture(proc.pid, timeout=10)
    finally:
        proc.kill()
        proc.wait(timeout=5)
    assert not result.ok and result.error == "not a python process"
    assert "sleep 30" in result.text and "Failed to find python version" in result.text


@pytest.mark.tool
@needs_py_spy
def test_a_shell_wrapper_is_dumped_through_its_python_child(tmp_path: Path) -> None:
    """`rankwatch run -- bash train.sh`: the watched pid is bash; the stack is its child's."""
    ready = tmp_path / "ready"
    code = (
        "import pathlib, time\n"
        "def wait_for_batch():\n"
        f"    pathlib.Path({str(ready)!r}).touch()\n"
        "    time.sleep(60)\n"
        "wait_for_batch()"
    )
    proc = subprocess.Popen(["bash", "-c", f'{sys.executable} -c "$0"; true', code])
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        result = capture(proc.pid, timeout=15)
    finally:
        for c in psutil.Process(proc.pid).children(recursive=True):
            c.kill()
        proc.kill()
        proc.wait(timeout=5)
    assert result.ok, result.text
    assert "wait_for_batch" in result.text
    assert any("is not a Python process: its Python descendants were dumped" in n for n in result.notes)


@pytest.mark.process
def test_timeout_kills_py_spy_and_its_children(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    fake = _fake_py_spy(tmp_path, f"sleep 30 &\necho $! > {child_file}\nwait")
    started = time.monotonic()
    result = capture(os.getpid(), py_spy=fake, timeout=0.5)
    assert time.monotonic() - started < 5
    assert not result.ok and result.error == "timeout"
    assert "0.5s" in result.text and "--nonblocking" in result.text
    assert 0.4 < result.duration_s < 5
    sleeper = int(child_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(sleeper) and psutil.Process(sleeper).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "py-spy's child survived the timeout"
        time.sleep(0.02)


@pytest.mark.process
def test_ptrace_denied(tmp_path: Path) -> None:
    fake = _fake_py_spy(tmp_path, 'echo "Error: Permission denied (os error 13)" >&2\nexit 1')
    result = capture(os.getpid(), py_spy=fake)
    assert not result.ok and result.error == "ptrace denied"
    for needle in (
        "CAP_SYS_PTRACE",
        "sysctl kernel.yama.ptrace_scope=0",
        "shareProcessNamespace: true",
        "SYS_PTRACE",
        "--cap-add SYS_PTRACE",
        "Permission denied (os error 13)",
    ):
        assert needle in result.text


@pytest.mark.process
@pytest.mark.parametrize(
    "message",
    [
        "Error: Operation not permitted (os error 1)",
        "Error: Failed to get process executable name. Check that the process is running.\n"
        "Caused by:\n    0: Permission denied (os error 13)",
    ],
)
def test_other_ptrace_messages(tmp_path: Path, message: str) -> None:
    fake = _fake_py_spy(tmp_path, f"printf '{message}\\n' >&2\nexit 1")
    assert capture(os.getpid(), py_spy=fake).error == "ptrace denied"


@pytest.mark.process
def test_garbage_output(tmp_path: Path) -> None:
    fake = _fake_py_spy(tmp_path, "echo not json")
    result = capture(os.getpid(), py_spy=fake, subprocesses=False)
    assert not result.ok and result.error == "bad py-spy output" and "not json" in result.text


@pytest.mark.unit
def test_fake_clock_measures_duration(tmp_path: Path) -> None:
    ticks = iter([100.0, 102.5])
    result = capture(os.getpid(), py_spy="/nonexistent/py-spy", clock=lambda: next(ticks))
    assert result.duration_s == 2.5


# ---------------------------------------------------------------- store


def _result(pid: int = 42, ok: bool = True, threads: list[dict[str, Any]] | None = None) -> DumpResult:
    return DumpResult(
        pid=pid,
        ok=ok,
        threads=threads or [],
        text="Process 42: python train.py\n",
        error=None if ok else "ptrace denied",
        duration_s=0.05,
        command=["py-spy", "dump", "--pid", str(pid), "--json"],
        captured_at=datetime(2026, 11, 22, 10, 15, 1, tzinfo=timezone.utc),
    )


@pytest.mark.unit
def test_incident_name() -> None:
    when = datetime(2026, 11, 22, 10, 15, 0, tzinfo=timezone.utc)
    assert incident_name("stall", when) == "20261122T101500Z_stall"
    assert incident_name("NCCL Timeout!", when) == "20261122T101500Z_nccl_timeout"
    assert incident_name("../..", when) == "20261122T101500Z_manual"
    cet = datetime(2026, 11, 22, 11, 15, 0, tzinfo=timezone(timedelta(hours=1)))
    assert incident_name("stall", cet) == "20261122T101500Z_stall"


@pytest.mark.tool
@needs_py_spy
def test_store_layout_with_real_dump(tmp_path: Path, blocked: subprocess.Popen[bytes]) -> None:
    store = DumpStore(tmp_path / "dumps")
    result = capture(blocked.pid, timeout=10)
    path = store.write_rank("llama-70b", "20261122T101500Z_stall", 3, result, {"host": "node7", "step": 1200})
    folder = tmp_path / "dumps" / "llama-70b" / "20261122T101500Z_stall"
    assert path == folder / "rank-3.txt"
    assert sorted(p.name for p in folder.iterdir()) == ["rank-3.json", "rank-3.txt"]
    assert "wait_for_peer (train_blocker.py:8)" in path.read_text()
    doc = json.loads((folder / "rank-3.json").read_text())
    assert doc["rank"] == 3 and doc["pid"] == blocked.pid and doc["ok"] is True and doc["error"] is None
    assert doc["meta"] == {"host": "node7", "step": 1200}
    assert doc["captured_at"].endswith("Z") and doc["duration_s"] >= 0
    assert "wait_for_peer" in _names(doc["threads"])
    [info] = store.list_incidents()
    assert (info.run, info.name, info.reason, info.ranks) == (
        "llama-70b",
        "20261122T101500Z_stall",
        "stall",
        [3],
    )
    assert info.time == datetime(2026, 11, 22, 10, 15, tzinfo=timezone.utc)
    assert store.load_rank(info, 3)["threads"] == doc["threads"]


@pytest.mark.unit
def test_run_and_extra_names_cannot_escape(tmp_path: Path) -> None:
    store = DumpStore(tmp_path / "dumps")
    folder = store.incident_dir("../../etc", "20261122T101500Z_stall")
    assert folder.resolve().is_relative_to((tmp_path / "dumps").resolve())
    extra = store.write_extra("../../etc", "20261122T101500Z_stall", "../../flight recorder.bin", b"\x00\x01")
    assert extra.parent == folder and extra.name == "flight_recorder.bin"
    assert extra.read_bytes() == b"\x00\x01"
    assert store.write_extra("r", "20261122T101500Z_stall", "nccl.json", "{}").read_text() == "{}"


@pytest.mark.unit
def test_writes_leave_no_temp_files(tmp_path: Path) -> None:
    store = DumpStore(tmp_path)
    store.write_rank("r", "20261122T101500Z_stall", 0, _result(), {})
    store.write_rank("r", "20261122T101500Z_stall", 0, _result(ok=False), {})
    folder = tmp_path / "r" / "20261122T101500Z_stall"
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.json", "rank-0.txt"]
    assert json.loads((folder / "rank-0.json").read_text())["error"] == "ptrace denied"
    assert "FAILED: ptrace denied" in (folder / "rank-0.txt").read_text()
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((folder / "rank-0.json").stat().st_mode) == 0o644 & ~umask


def _populate(root: Path) -> DumpStore:
    store = DumpStore(root)
    for run, name, ranks in [
        ("run-a", "20261122T101500Z_stall", [0, 1]),
        ("run-b", "20261122T111500Z_nccl_timeout", [0]),
        ("run-a", "20261121T235959Z_stall", [2]),
        ("run-a", "20261122T101500Z_manual", [0]),
    ]:
        for rank in ranks:
            store.write_rank(run, name, rank, _result(), {})
    (root / "README.txt").write_text("stray")
    (root / "run-a" / "notes.md").write_text("stray")
    (root / "run-a" / "not-an-incident").mkdir()
    (root / "run-a" / "2026_bad_stall").mkdir()
    (root / "run-a" / "20261399T999999Z_stall").mkdir()  # matches the pattern, not a date
    (root / "run-a" / "20261122T101500Z_stall" / "rank-x.json").write_text("{}")
    (root / "run-a" / "20261122T101500Z_stall" / "rank-1.json").write_text('{"rank": 1, "ok": tr')
    (root / ".hidden").mkdir()
    return store


@pytest.mark.unit
def test_list_newest_first_and_junk_tolerant(tmp_path: Path) -> None:
    store = _populate(tmp_path)
    listed = [(i.run, i.name, i.ranks) for i in store.list_incidents()]
    assert listed == [
        ("run-b", "20261122T111500Z_nccl_timeout", [0]),
        ("run-a", "20261122T101500Z_stall", [0, 1]),
        ("run-a", "20261122T101500Z_manual", [0]),
        ("run-a", "20261121T235959Z_stall", [2]),
    ]
    info = store.find("20261122T101500Z_st")
    half = store.load_rank(info, 1)
    assert half["ok"] is False and "unreadable JSON" in half["error"]
    assert any("rank-1.json" in n for n in store.notes)
    result = diff_incident({r: store.load_rank(info, r) for r in info.ranks})
    assert 1 in result.failed


@pytest.mark.unit
def test_find(tmp_path: Path) -> None:
    store = _populate(tmp_path)
    assert store.find("20261122T111500Z_nccl_timeout").run == "run-b"
    assert store.find("20261121").name == "20261121T235959Z_stall"
    assert store.find("run-a/20261122T101500Z_manual").reason == "manual"
    folder = tmp_path / "run-a" / "20261122T101500Z_stall"
    assert store.find(str(folder)).ranks == [0, 1]
    assert store.find("20261122T101500Z_m", run="run-a").reason == "manual"
    with pytest.raises(KeyError):
        store.find("20261122T111500Z", run="run-a")
    with pytest.raises(KeyError, match="ambiguous"):
        store.find("20261122T1015")
    with pytest.raises(KeyError, match="no incident matches"):
        store.find("nope")
    assert DumpStore(tmp_path / "missing").list_incidents() == []


# ---------------------------------------------------------------- diff

SITE = "/opt/conda/lib/python3.11/site-packages"
STDLIB = "/opt/conda/lib/python3.11"


def _frame(name: str, filename: str, line: int) -> dict[str, Any]:
    return {
        "name": name,
        "filename": filename,
        "module": None,
        "short_filename": os.path.basename(filename),
        "line": line,
        "locals": None,
    }


def _thread(name: str, frames: list[dict[str, Any]], pid: int = 100, active: bool = False) -> dict[str, Any]:
    return {
        "pid": pid,
        "thread_id": 0x7F0000001000 + len(name),
        "thread_name": name,
        "os_thread_id": pid if name == "MainThread" else pid + len(name),
        "active": active,
        "owns_gil": False,
        "frames": frames,
    }


IDLE_FRAMES = [
    _frame("Condition.wait", f"{STDLIB}/threading.py", 327),
    _frame("Event.wait", f"{STDLIB}/threading.py", 629),
    _frame("TMonitor.run", f"{SITE}/tqdm/_monitor.py", 60),
    _frame("Thread._bootstrap", f"{STDLIB}/threading.py", 1002),
]


def _all_reduce_dump(rank: int, module_line: int = 130) -> dict[str, Any]:
    frames = [
        _frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2501),
        _frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
        _frame("train_step", "/workspace/train.py", 88),
        _frame("main", "/workspace/train.py", 120),
        _frame("<module>", "/workspace/train.py", module_line),
    ]
    threads = [_thread("tqdm-monitor", IDLE_FRAMES), _thread("MainThread", frames)]
    return {"rank": rank, "pid": 100, "ok": True, "error": None, "threads": threads}


def _dataloader_dump(rank: int) -> dict[str, Any]:
    frames = [
        _frame("__next__", "/workspace/data.py", 42),
        _frame("train_step", "/workspace/train.py", 80),
        _frame("main", "/workspace/train.py", 120),
        _frame("<module>", "/workspace/train.py", 130),
    ]
    return {"rank": rank, "pid": 100, "ok": True, "error": None, "threads": [_thread("MainThread", frames)]}


@pytest.mark.unit
def test_diff_names_the_rank_outside_the_collective() -> None:
    dumps = {
        0: _all_reduce_dump(0),
        1: _all_reduce_dump(1, 131),
        2: _dataloader_dump(2),
        3: _all_reduce_dump(3),
    }
    result = diff_incident(dumps)
    assert [g.ranks for g in result.groups] == [[0, 1, 3], [2]]
    assert result.suspects == [2]
    assert format_diff(result) == (
        "ranks 0,1,3: waiting in all_reduce at all_reduce (distributed_c10d.py:2501)"
        " <- train_step (train.py:88)\n"
        "rank 2: in data loading (in the training code's own data iterator) at __next__ (data.py:42)\n"
        "suspect: rank 2 (the only rank not waiting in a collective: in data loading; ranks 0,1,3 wait for "
        "it (all_reduce))\n"
    )
    as_json = json.loads(json.dumps(result.to_dict()))
    assert as_json["suspects"] == [2] and as_json["groups"][0]["in_collective"] is True


@pytest.mark.unit
@pytest.mark.parametrize("odd", [0, 1])
def test_diff_two_ranks_collective_vs_not(odd: int) -> None:
    barrier = [
        _frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4100),
        _frame("save_checkpoint", "/workspace/ckpt.py", 12),
    ]
    saving = [
        _frame("write", f"{SITE}/torch/serialization.py", 640),
        _frame("save_checkpoint", "/workspace/ckpt.py", 10),
    ]
    dumps = {
        r: {"ok": True, "pid": 1, "threads": [_thread("MainThread", saving if r == odd else barrier, pid=1)]}
        for r in (0, 1)
    }
    result = diff_incident(dumps)
    assert result.suspects == [odd]
    assert f"suspect: rank {odd} (the only rank not waiting in a collective: in I/O" in format_diff(result)


@pytest.mark.unit
def test_diff_majority_without_collective_and_failures() -> None:
    dumps = {r: _dataloader_dump(r) for r in range(4)}
    dumps[2]["threads"][0]["frames"][0] = _frame("load_shard", "/workspace/data.py", 77)
    dumps[4] = {"rank": 4, "ok": False, "error": "ptrace denied", "threads": []}
    result = diff_incident(dumps)
    assert result.suspects == [2] and result.failed == {4: "ptrace denied"}
    text = format_diff(result)
    own = "in the training code's own data iterator"
    assert f"ranks 0,1,3: in data loading ({own}) at __next__ (data.py:42)\n" in text
    assert "rank 4: no dump (ptrace denied)\n" in text
    assert "suspect: rank 2 (the only rank whose stack differs from the majority)" in text


@pytest.mark.unit
def test_diff_all_same_has_no_suspect() -> None:
    result = diff_incident({r: _all_reduce_dump(r) for r in range(8)})
    assert result.suspects == [] and len(result.groups) == 1
    assert format_diff(result).startswith("ranks 0-7: waiting in all_reduce")
    assert "no suspect: all ranks wait in the same collective (all_reduce)" in format_diff(result)


@pytest.mark.unit
def test_diff_ignores_native_addresses() -> None:
    a, b = _all_reduce_dump(0), _all_reduce_dump(1)
    a["threads"][1]["frames"].insert(0, _frame("0x7f12ab34cd", "libnccl.so.2", 0))
    b["threads"][1]["frames"].insert(0, _frame("0x7f99ee0011", "libnccl.so.2", 0))
    result = diff_incident({0: a, 1: b})
    assert len(result.groups) == 1
    assert result.groups[0].where == "all_reduce (distributed_c10d.py:2501)"


@pytest.mark.unit
def test_diff_picks_rank_process_under_launcher() -> None:
    launcher = [
        _frame(
            "_monitor_workers", f"{SITE}/torch/distributed/elastic/agent/server/local_elastic_agent.py", 350
        ),
        _frame("_invoke_run", f"{SITE}/torch/distributed/elastic/agent/server/api.py", 870),
        _frame("main", f"{SITE}/torch/distributed/run.py", 900),
    ]
    rank = _dataloader_dump(0)["threads"][0]["frames"]
    dump = {
        "pid": 10,
        "ok": True,
        "threads": [_thread("MainThread", launcher, pid=10), _thread("MainThread", rank, pid=11)],
    }
    assert main_stack(dump) == rank


@pytest.mark.unit
def test_format_ranks() -> None:
    assert format_ranks([0, 1, 3]) == "0,1,3"
    assert format_ranks([0, 1, 2, 3, 5, 7, 8, 9]) == "0-3,5,7-9"


# ---------------------------------------------------------------- show


@pytest.mark.unit
def test_format_rank_highlights_and_folds() -> None:
    dump = _all_reduce_dump(0) | {"captured_at": "2026-11-22T10:15:01Z", "duration_s": 0.05}
    dump["threads"].append(_thread("pin_memory", IDLE_FRAMES[:2] + IDLE_FRAMES[3:]))
    text = format_rank(dump, color=False)
    assert "== rank 0 (pid 100)" in text
    assert "  > train_step (train.py:88)\n" in text
    assert "    all_reduce (distributed_c10d.py:2501)\n" in text
    assert "+ 2 idle threads (tqdm-monitor, pin_memory)" in text
    assert "TMonitor.run" not in text
    unfolded = format_rank(dump, color=False, fold_idle=False)
    assert "TMonitor.run (_monitor.py:60)" in unfolded and "idle threads" not in unfolded
    assert "\x1b[1mtrain_step (train.py:88)\x1b[0m" in format_rank(dump, color=True)
    custom = format_rank(dump, color=False, highlight_prefixes=[f"{SITE}/torch/"])
    assert "  > all_reduce (distributed_c10d.py:2501)" in custom and "  > train_step" not in custom


@pytest.mark.unit
def test_format_rank_failed_dump() -> None:
    text = format_rank(
        {"rank": 5, "pid": 9, "ok": False, "error": "timeout", "text": "py-spy did not finish"}
    )
    assert "no stacks: timeout" in text and "py-spy did not finish" in text


# ---------------------------------------------------------------- cli


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rankwatch")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.mark.tool
@needs_py_spy
def test_cli_capture_list_show_diff(
    tmp_path: Path, blocked: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path / "dumps")
    argv = ["dumps", "capture", "--pid", str(blocked.pid), "--rank", "3", "--run", "r1"]
    assert _cli([*argv, "--reason", "Manual Test", "--dir", d]) == 0
    [folder] = (tmp_path / "dumps" / "r1").iterdir()
    assert folder.name.endswith("Z_manual_test")
    assert sorted(p.name for p in folder.iterdir()) == ["rank-3.json", "rank-3.txt"]
    capsys.readouterr()

    assert _cli(["dumps", "list", "--dir", d]) == 0
    assert folder.name in capsys.readouterr().out

    assert _cli(["dumps", "show", folder.name[:10], "--dir", d]) == 0
    shown = capsys.readouterr().out
    assert "  > wait_for_peer (train_blocker.py:8)" in shown
    assert "+ 1 idle thread" not in shown  # helper() is training code, so it stays visible

    assert _cli(["dumps", "diff", folder.name, "--json", "--dir", d]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["groups"][0]["ranks"] == [3] and "wait_for_peer" in doc["groups"][0]["where"]

    assert _cli(["dumps", "list", "--json", "--dir", d]) == 0
    (inc,) = json.loads(capsys.readouterr().out)["incidents"]
    assert (inc["run"], inc["incident"], inc["ranks"]) == ("r1", folder.name, [3])
    assert inc["reason"] == "manual_test"
    assert _cli(["dumps", "show", folder.name, "--json", "--dir", d]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["incident"] == folder.name and doc["dumps"]["3"]["ok"] is True
    assert any("wait_for_peer" in json.dumps(t) for t in doc["dumps"]["3"]["threads"])


@pytest.mark.unit
def test_cli_errors_and_default_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANKWATCH_DUMPS_DIR", str(tmp_path))
    assert _cli(["dumps", "list"]) == 1  # a dumps dir with nothing in it yet
    assert _cli(["dumps", "list", "--dir", str(tmp_path / "typo")]) == 2
    assert "typo: no such directory" in capsys.readouterr().err
    _populate(tmp_path)
    assert _cli(["dumps", "list", "--run", "run-b"]) == 0
    assert "20261122T111500Z_nccl_timeout" in capsys.readouterr().out
    assert _cli(["dumps", "show", "nope"]) == 1
    assert _cli(["dumps", "show", "20261122T111500Z", "--rank", "7"]) == 1
    assert _cli(["dumps", "diff", "20261122T1015"]) == 1  # ambiguous
    assert "ambiguous" in capsys.readouterr().err
    assert _cli(["dumps", "diff", "run-a/20261122T101500Z_stall"]) == 0
    assert "rank 1: no dump (unreadable JSON" in capsys.readouterr().out
    assert _cli(["dumps", "capture", "--pid", "1", "--pid", "2", "--rank", "0"]) == 2
    with pytest.raises(SystemExit):
        _cli(["dumps", "capture"])


@pytest.mark.unit
def test_cli_capture_failure_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(pid: int, **_: Any) -> DumpResult:
        return _result(pid=pid, ok=False)

    monkeypatch.setattr("rankwatch.dumps.cli.capture", failing)
    assert _cli(["dumps", "capture", "--pid", "5", "--dir", str(tmp_path)]) == 1
    [folder] = (tmp_path / "default").iterdir()
    assert json.loads((folder / "rank-0.json").read_text())["error"] == "ptrace denied"
    assert "FAILED: ptrace denied" in (folder / "rank-0.txt").read_text()


@pytest.mark.unit
def test_cli_reads_dumps_dir_and_run_from_the_agents_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rankwatch dumps ... --config rankwatch.yaml` (or $RANKWATCH_CONFIG) finds the folder and
    run name the agents used, without retyping them."""
    monkeypatch.delenv("RANKWATCH_DUMPS_DIR", raising=False)
    monkeypatch.setattr("rankwatch.dumps.cli.capture", lambda pid, **_: _result(pid=pid, ok=False))
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(f"run: {{name: job-77}}\ndumps: {{dir: {tmp_path / 'agent-dumps'}}}\n")
    assert _cli(["dumps", "capture", "--pid", "5", "--config", str(cfg)]) == 1
    [folder] = (tmp_path / "agent-dumps" / "job-77").iterdir()
    capsys.readouterr()
    monkeypatch.setenv("RANKWATCH_CONFIG", str(cfg))
    assert _cli(["dumps", "list"]) == 0
    assert folder.name in capsys.readouterr().out


@pytest.mark.unit
def test_list_incidents_since_skips_older_folders_by_name(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    store = DumpStore(tmp_path)
    for name in ("20261122T101500Z_stall", "20261122T111500Z_stall", "20261122T111600Z_manual"):
        store.incident_dir("r", name)
    store.incident_dir("other", "20261122T111700Z_stall")
    since = datetime(2026, 11, 22, 11, 0, tzinfo=timezone.utc)
    got = [i.name for i in store.list_incidents("r", since=since)]
    assert got == ["20261122T111600Z_manual", "20261122T111500Z_stall"]
    assert len(store.list_incidents()) == 4


# ---------------------------------------------------------------- a shared, hostile folder
@pytest.mark.unit
def test_store_never_writes_through_a_symlink_planted_in_the_dumps_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = DumpStore(tmp_path / "dumps")
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "r").symlink_to(outside)  # a run folder
    with pytest.raises(safeio.Refused, match="symlink"):
        store.write_rank("r", "20261122T101500Z_stall", 0, _result(), {})
    with pytest.raises(safeio.Refused, match="symlink"):
        store.incident_dir("r", "20261122T101500Z_stall")
    (tmp_path / "dumps" / "s").mkdir()
    (tmp_path / "dumps" / "s" / "20261122T101500Z_stall").symlink_to(outside)  # an incident folder
    with pytest.raises(safeio.Refused, match="symlink"):
        store.write_extra("s", "20261122T101500Z_stall", "trace.json", "{}")
    assert list(outside.iterdir()) == []
    # A symlink planted under a file's name is replaced, never written through.
    target = outside / "precious"
    target.write_text("keep")
    folder = store.incident_dir("t", "20261122T101500Z_stall")
    (folder / "rank-0.txt").symlink_to(target)
    store.write_rank("t", "20261122T101500Z_stall", 0, _result(), {})
    assert target.read_text() == "keep" and not (folder / "rank-0.txt").is_symlink()


@pytest.mark.unit
def test_store_reads_no_symlink_and_names_why_it_did_not(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text('{"rank": 1, "ok": true, "text": "SECRET"}')
    store = DumpStore(tmp_path / "dumps")
    store.write_rank("r", "20261122T101500Z_stall", 0, _result(), {})
    folder = tmp_path / "dumps" / "r" / "20261122T101500Z_stall"
    (folder / "rank-0.json").unlink()
    (folder / "rank-0.json").symlink_to(secret)
    (folder / "rank-1.json").symlink_to(secret)  # not a rank of the incident: not a regular file
    (tmp_path / "dumps" / "r" / "20261122T101600Z_stall").symlink_to(folder)
    [info] = store.list_incidents()
    assert (info.name, info.ranks) == ("20261122T101500Z_stall", [0])  # rank 0 still has its .txt
    doc = store.load_rank(info, 0)
    assert doc["ok"] is False and "symlink" in doc["error"] and "SECRET" not in json.dumps(doc)
    assert doc["text"].startswith("# rankwatch dump: rank 0")  # the regular text beside it is read
    with pytest.raises(safeio.Refused):
        store.load_rank(info, 0, strict=True)
    with pytest.raises(KeyError):
        store.find("20261122T101600Z_stall")
    with pytest.raises(KeyError):  # nor by its path: it is below the root
        store.find(str(tmp_path / "dumps" / "r" / "20261122T101600Z_stall"))
    # The API's lookup takes names only: a folder path (even the right one) is not looked up.
    assert store.find(str(folder)).name == info.name
    with pytest.raises(KeyError):
        store.find(str(folder), allow_path=False)
