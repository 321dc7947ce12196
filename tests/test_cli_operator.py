"""The command line as an operator meets it (issue 30): stdin, one-line path errors with exit
2, a trainer that starts whatever happens to the agent's log folder, and no noise.

Permission problems are made real by running the CLI as root stripped of every capability
(``setpriv``), for which a mode-000 folder is as closed as for any user.
"""

from __future__ import annotations

import asyncio
import bz2
import gzip
import io
import logging
import lzma
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rankwatch.actions.console import ConsoleSink
from rankwatch.config.loader import load_config
from rankwatch.events import Event
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.modes import default_log_dir, open_child_log
from rankwatch.runtime.services import Services
from rankwatch.sources.follower import quiet_watchdog_stop_race

ROOT = Path(__file__).resolve().parent.parent
HF_OOM = ROOT / "examples" / "hf-oom" / "train.log"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "SLURM_"))}
    env.pop("RANK", None)
    env["PYTHONPATH"] = str(ROOT / "agent")
    env.update(extra)
    return env


def _capless() -> list[str]:
    """Root without capabilities: file modes apply to it as to anyone."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv (util-linux) to drop the capabilities that bypass modes")
    return [setpriv, "--inh-caps", "-all", "--ambient-caps", "-all", "--bounding-set", "-all", "--"]


def _rankwatch(*args: str, prefix: list[str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "rankwatch", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=kw.pop("env", None) or _env(),
        **kw,
    )


def _one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr


@pytest.mark.process
def test_analyze_dash_reads_standard_input() -> None:
    with HF_OOM.open("rb") as log:  # as `kubectl logs pod | rankwatch analyze -` (bytes: tqdm's \r kept)
        proc = _rankwatch("analyze", "-", stdin=log)
    assert proc.returncode == 1, proc.stderr  # findings
    assert "CRITICAL oom" in proc.stdout and "rank 1  -:417" in proc.stdout, proc.stdout
    _one_line(_rankwatch("analyze", "-", "-", input=""), "standard input can be read once")


@pytest.mark.process
@pytest.mark.parametrize("pack", [gzip.compress, bz2.compress, lzma.compress])
def test_analyze_dash_reads_a_compressed_standard_input(
    tmp_path: Path, pack: Callable[[bytes], bytes]
) -> None:
    """`gzip -c slurm-1234.out | rankwatch analyze -` (s38 g35's form): read as the text it holds,
    as a compressed file is; a format it cannot read is one line and exit 2."""
    packed = tmp_path / "log.packed"
    packed.write_bytes(pack(HF_OOM.read_bytes()))
    with packed.open("rb") as log:
        proc = _rankwatch("analyze", "-", stdin=log)
    assert proc.returncode == 1, proc.stderr
    assert "CRITICAL oom" in proc.stdout and "rank 1  -:417" in proc.stdout, proc.stdout
    zstd = tmp_path / "log.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 64)
    with zstd.open("rb") as log:
        _one_line(_rankwatch("analyze", "-", stdin=log), "<stdin>: zstd-compressed", "zstd -dc")


@pytest.mark.process
def test_analyze_on_an_unreadable_or_missing_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    prefix = _capless()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o000)
    closed.chmod(0o000)
    tmp_path.chmod(0o755)
    _one_line(_rankwatch("analyze", str(closed), prefix=prefix), f"{closed}: Permission denied")
    _one_line(_rankwatch("analyze", str(tmp_path / "nope"), prefix=prefix), "nope: no such file")


@pytest.mark.process
def test_dumps_capture_into_an_unwritable_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    prefix = _capless()
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    ro.chmod(0o555)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        proc = _rankwatch(
            "dumps", "capture", "--pid", str(sleeper.pid), "--dir", str(ro / "dumps"), prefix=prefix
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    _one_line(proc, f"{ro / 'dumps'}", "Permission denied", "cannot make the incident folder")


@pytest.mark.process
def test_run_starts_the_trainer_when_its_log_folder_is_unwritable(tmp_path: Path) -> None:
    prefix = _capless()
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    ro.chmod(0o555)
    marker = tmp_path / "trained"
    child = f"import pathlib; print('training step 1', flush=True); pathlib.Path({str(marker)!r}).touch()"
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"runner: {{log_dir: {ro / 'logs'}}}\ngpu: {{enabled: false}}\nserver: {{enabled: false}}\n"
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _rankwatch("run", "--config", str(cfg), "--", sys.executable, "-c", child, prefix=prefix, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert marker.exists(), proc.stderr  # the trainer ran
    assert "Traceback" not in proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "cannot write the child's log" in ln]
    assert len(said) == 1 and str(ro / "logs") in said[0] and "its output goes to" in said[0], proc.stderr
    fallback = Path(said[0].rsplit("its output goes to ", 1)[1])
    assert fallback.name == "rank-0.log" and (fallback.parent.stat().st_mode & 0o077) == 0
    assert "training step 1" in fallback.read_text()
    assert "training step 1" in proc.stdout  # still echoed
    shutil.rmtree(fallback.parent)


@pytest.mark.process
def test_run_without_log_dir_writes_to_the_state_folder_not_the_current_one(tmp_path: Path) -> None:
    cwd, state = tmp_path / "cwd", tmp_path / "state"
    cwd.mkdir()
    cfg = tmp_path / "rw.yaml"
    cfg.write_text("run: {name: job-7}\ngpu: {enabled: false}\nserver: {enabled: false}\n")
    env = _env(XDG_STATE_HOME=str(state))
    proc = _rankwatch(
        "run", "--config", str(cfg), "--", sys.executable, "-c", "print('hi')", env=env, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == []  # no ./rankwatch-logs
    assert (state / "rankwatch" / "logs" / "job-7" / "rank-0.log").read_text() == "hi\n"
    # a CPU-only node: no WARNING about NVML at start (GPU sampling on, the library absent)
    noisy = _rankwatch("run", "--", sys.executable, "-c", "pass", env=env, cwd=cwd)
    assert noisy.returncode == 0 and "WARNING" not in noisy.stderr and "ERROR" not in noisy.stderr, (
        noisy.stderr
    )


@pytest.mark.unit
def test_default_log_dir_follows_xdg_and_keeps_the_run_name_one_component() -> None:
    assert default_log_dir("4242", {"XDG_STATE_HOME": "/s"}) == Path("/s/rankwatch/logs/4242")
    assert default_log_dir("../../etc", {"XDG_STATE_HOME": "/s"}) == Path("/s/rankwatch/logs/_.._etc")
    assert default_log_dir("x", {}) == Path.home() / ".local/state/rankwatch/logs/x"
    assert default_log_dir("x", {"XDG_STATE_HOME": "rel"}) == Path.home() / ".local/state/rankwatch/logs/x"


@pytest.mark.unit
def test_a_run_log_another_job_holds_is_never_shared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """s36 e11/e18: two jobs at once both appended to ``rank-0.log`` and read each other's lines.
    The log is held while its job runs: a second job gets the name with its agent's pid; once
    the first lets go, the usual name is free again."""
    path = tmp_path / "logs" / "rank-0.log"
    first, got = open_child_log(path)
    assert first is not None and got == path
    second, other = open_child_log(path)
    assert second is not None and other == path.with_name(f"rank-0.{os.getpid()}.log")
    assert "written by another running job" in capsys.readouterr().err
    second.write(b"job B\n")
    second.close()
    first.write(b"job A\n")
    first.close()
    assert (path.read_bytes(), other.read_bytes()) == (b"job A\n", b"job B\n")
    again, same = open_child_log(path)
    assert again is not None and same == path
    again.close()


@pytest.mark.unit
def test_a_run_log_name_that_is_a_symlink_or_fifo_is_not_written_through(tmp_path: Path) -> None:
    """A link or FIFO put at the log's name (a shared runner.log_dir) is never opened for the
    job's output: the job writes to a file of its own beside it."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"keep\n")
    for make in (lambda p: p.symlink_to(secret), os.mkfifo):
        folder = tmp_path / f"logs-{make is os.mkfifo}"
        folder.mkdir()
        path = folder / "rank-0.log"
        make(path)
        fh, got = open_child_log(path)
        assert fh is not None and got == path.with_name(f"rank-0.{os.getpid()}.log")
        fh.write(b"out\n")
        fh.close()
        assert got.read_bytes() == b"out\n" and secret.read_bytes() == b"keep\n"


@pytest.mark.unit
def test_console_names_only_what_is_known() -> None:
    f = Finding("nan_loss", Severity.CRITICAL, None, "loss is NaN", step=3)
    for ident, head in (
        (
            Identity(run="default", rank=None, local_rank=None, world_size=None, node="n1"),
            "rankwatch: CRITICAL nan_loss step 3: loss is NaN\n",
        ),
        (
            Identity(run="default", rank=2, local_rank=None, world_size=None, node="n1"),
            "rankwatch: [rank=2] CRITICAL nan_loss step 3: loss is NaN\n",
        ),
        (
            Identity(run="j1", rank=None, local_rank=None, world_size=None, node="n1"),
            "rankwatch: [run=j1] CRITICAL nan_loss step 3: loss is NaN\n",
        ),
        (
            Identity(run="j1", rank=0, local_rank=None, world_size=None, node="n1"),
            "rankwatch: [run=j1 rank=0] CRITICAL nan_loss step 3: loss is NaN\n",
        ),
    ):
        out = io.StringIO()
        ConsoleSink(ident, out).send(f)
        assert out.getvalue() == head


class _Failing:
    name: ClassVar[str] = "test-failing"
    interval = 0.01
    timeout = 5.0
    fail = True

    def inputs(self) -> Any:
        return None

    def sample(self, inputs: Any) -> list[Event]:
        if self.fail:
            raise PermissionError(13, "Permission denied", "/scratch/dumps")
        return []


@pytest.mark.unit
def test_a_sample_failing_the_same_way_each_interval_is_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = load_config(None)
    agent = Agent(cfg, Identity(run="t", rank=0, local_rank=None, world_size=None, node="n1"))
    svc = Services(agent, cfg, server=False)
    src = _Failing()
    svc.add_source(src)

    async def main() -> None:
        for _ in range(5):
            assert await svc.poll(src.name) is None
        src.fail = False
        assert await svc.poll(src.name) == []
        src.fail = True
        assert await svc.poll(src.name) is None

    with caplog.at_level(logging.INFO, logger="rankwatch"):
        asyncio.run(main())
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "test-failing" in r.getMessage()]
    assert [lv for lv, _ in said] == [logging.ERROR, logging.INFO, logging.ERROR], said
    assert "/scratch/dumps" in said[0][1] and "works again" in said[1][1]
    assert agent.internal_errors_by_component[src.name] == 6


@pytest.mark.unit
def test_watchdogs_stop_race_line_is_dropped_and_nothing_else() -> None:
    quiet_watchdog_stop_race()
    quiet_watchdog_stop_race()
    logger = logging.getLogger("watchdog.observers.inotify")
    assert len(logger.filters) == 1
    race = logger.makeRecord(
        logger.name,
        logging.ERROR,
        __file__,
        1,
        "InotifyEmitter.queue_events() called when the thread is inactive",
        (),
        None,
    )
    other = logger.makeRecord(
        logger.name, logging.ERROR, __file__, 1, "inotify watch limit reached", (), None
    )
    assert not logger.filter(race) and logger.filter(other)
