from __future__ import annotations

import signal

import pytest

from rankwatch.config.schema import StallConfig
from rankwatch.detectors.crash import crash_finding
from rankwatch.detectors.liveness import StallDetector
from rankwatch.events import CheckpointStatus
from rankwatch.records import ErrorRecord, Finding, Severity, StepRecord
from rankwatch.sources.process import ProcessSample
from rankwatch.sources.signatures import SignatureMatcher
from rankwatch.state import RankState

pytestmark = pytest.mark.unit

CFG = StallConfig()  # grace 900, floor 60, factor 10, allowance 600, silent 300, busy 50, idle 5


class Rank:
    """A fake rank: one state, one detector and a process whose CPU time we script."""

    def __init__(self, cfg: StallConfig = CFG, started: float = 1000.0) -> None:
        self.state = RankState(rank=3, path="rank-3.log")
        self.det = StallDetector(cfg, started=started)
        self.cpu_time = 5.0
        self.line = 0

    def step(self, now: float, step: int) -> list[Finding]:
        self.line += 1
        self.state.add(StepRecord(step=step, loss=2.0, line=self.line))
        return self.det.on_step(now, step)

    def sample(
        self, now: float, cpu_percent: float = 0.2, state: str = "sleeping", alive: bool = True
    ) -> list[Finding]:
        self.cpu_time += cpu_percent / 100.0  # one-second sample interval
        s = ProcessSample(
            time=now,
            pid=4242,
            alive=alive,
            cpu_time_s=self.cpu_time,
            cpu_percent=cpu_percent,
            state=state if alive else "dead",
        )
        return self.det.on_sample(self.state, s, now)

    def samples(self, start: float, end: float, every: float = 1.0, **kw: object) -> list[Finding]:
        out: list[Finding] = []
        t = start
        while t <= end:
            out += self.sample(t, **kw)  # type: ignore[arg-type]
            t += every
        return out

    def steps(self, start: float, n: int, every: float, first_step: int = 1) -> float:
        """``n`` steps ``every`` seconds apart with a sample in between; returns the last time."""
        t = start
        for i in range(n):
            assert self.step(t, first_step + i) == []
            assert self.sample(t + every / 2, cpu_percent=90.0) == []
            t += every
        return t - every


# -- stepping ranks ------------------------------------------------------------------------


def test_stall_after_floor_when_steps_every_2s() -> None:
    r = Rank()
    last = r.steps(1100.0, 120, 2.0)
    assert r.det.timeout() == pytest.approx(60.0)
    assert r.samples(last + 1, last + 60) == []
    (f,) = r.sample(last + 62)
    assert f.kind == "stall" and f.severity is Severity.CRITICAL and not f.resolved
    assert f.rank == 3 and f.path == "rank-3.log" and f.step == 120
    assert f.message == (
        "no progress for 62s (timeout 60s = max(60s floor, 10 x p99 step interval 2.0s)); last step 120; "
        "process alive, idle on CPU (0.2%): blocked in a collective or I/O. Judged from: step lines. "
        "Usual fix: `rankwatch dumps diff` names the rank whose stack differs; the others wait for it in "
        "the collective, and its log holds the real error."
    )  # no word on stacks: the agent says what became of them once it knows
    ev = f.evidence
    assert ev["seconds_since_progress"] == pytest.approx(62.0)
    assert ev["timeout"] == pytest.approx(60.0)
    assert ev["last_step"] == 120
    assert ev["signals"] == ["step lines"]
    assert ev["classification"] == "idle"
    assert ev["state"] == "sleeping"
    assert r.det.active


def test_timeout_adapts_to_slow_logging() -> None:
    r = Rank()
    last = r.steps(1100.0, 30, 20.0)
    assert r.det.timeout() == pytest.approx(200.0)
    assert r.samples(last + 1, last + 199, every=3.0) == []
    (f,) = r.sample(last + 201)
    assert "timeout 200s = max(60s floor, 10 x p99 step interval 20s)" in f.message


def test_block_buffered_log_bursts_set_the_interval() -> None:
    """A file-buffered stdout delivers 100 step lines at once every minute: the interval is 60s."""
    r = Rank(StallConfig(ceiling=0))  # type: ignore[arg-type]
    step = 0
    for burst in range(6):
        now = 1100.0 + 60.0 * burst
        for _ in range(100):
            step += 1
            assert r.det.on_step(now, step) == []
    assert r.det.timeout() == pytest.approx(600.0)
    assert r.samples(1400.0 + 1, 1400.0 + 590, every=10.0) == []


def test_ceiling_keeps_slow_logging_under_the_nccl_watchdog() -> None:
    """Steps every 60 s would give 600 s: the NCCL watchdog's default, too late for the stacks."""
    r = Rank()
    last = r.steps(1100.0, 30, 60.0)
    assert r.det.timeout() == pytest.approx(420.0)
    assert r.samples(last + 1, last + 419, every=6.0) == []
    (f,) = r.sample(last + 421)
    assert "420s: the 420s ceiling, under PyTorch's NCCL watchdog" in f.message
    assert f.evidence["timeout"] == pytest.approx(420.0)


def test_ceiling_never_undercuts_the_floor() -> None:
    r = Rank(StallConfig(floor=600.0, ceiling=420.0))  # type: ignore[arg-type]
    last = r.steps(1100.0, 30, 100.0)
    assert r.det.timeout() == pytest.approx(600.0)
    assert r.samples(last + 1, last + 599, every=10.0) == []


def test_first_step_then_silence_uses_startup_grace() -> None:
    """One step line gives no interval yet: a slow second step (compilation) is no stall."""
    r = Rank()
    r.step(1100.0, 1)
    assert r.det.timeout() == pytest.approx(900.0)
    assert r.samples(1110.0, 1990.0, every=20.0) == []
    (f,) = r.sample(2005.0)
    assert "startup grace, no step interval measured yet" in f.message


def test_fires_once_and_resolves_on_new_step() -> None:
    r = Rank()
    last = r.steps(1100.0, 120, 2.0)
    assert len(r.sample(last + 62)) == 1
    assert r.samples(last + 63, last + 74) == []  # once per episode
    assert r.step(last + 75, 120) == []  # the same step again is no progress
    assert r.det.active
    (res,) = r.step(last + 75, 130)
    assert res.resolved and res.kind == "stall" and res.rank == 3 and res.step == 130
    assert res.message == "progress resumed at step 130 after 75s"
    assert not r.det.active
    # a second episode fires again
    assert r.samples(last + 80, last + 130, every=5.0) == []
    assert len(r.sample(last + 140)) == 1


def test_a_stall_ends_when_its_rank_restarts() -> None:
    """gloo's timeout ends a hang and torchrun restarts the ranks (s39 k18): the new process of
    the same rank (a new pid) resolves the stall of the old one, or its alert fires for good;
    the new process then gets the startup grace."""
    from rankwatch.events import ProcessStart

    r = Rank()
    assert r.det.observe(r.state, ProcessStart(1000.0, 4242)) == []
    last = r.steps(1100.0, 120, 2.0)
    assert len(r.sample(last + 62)) == 1 and r.det.active
    assert r.det.observe(r.state, ProcessStart(last + 70, 4242)) == []  # the same process: nothing
    (res,) = r.det.observe(r.state, ProcessStart(last + 80, 5151))
    assert res.resolved and res.kind == "stall" and res.rank == 3, res
    assert res.message.startswith("the rank restarted (new process, pid 5151) after"), res.message
    assert not r.det.active
    assert r.samples(last + 81, last + 81 + 800, every=10.0) == []  # the startup grace (900 s)


def test_restart_from_checkpoint_is_progress() -> None:
    r = Rank()
    last = r.steps(1100.0, 50, 2.0, first_step=1000)
    assert r.step(last + 40, 900) == []  # resumed from an older checkpoint
    assert r.samples(last + 41, last + 99) == []


def test_no_stall_while_checkpoint_is_written() -> None:
    r = Rank()
    last = r.steps(1100.0, 120, 2.0)
    for t in range(10, 400, 30):  # the watcher sees the checkpoint files grow
        r.det.on_activity(last + t, "checkpoint_writing")
        assert r.sample(last + t + 1, state="disk-wait") == []
    assert r.det.timeout() == pytest.approx(660.0)
    r.det.on_activity(last + 400, "checkpoint")  # written, then the job hangs
    assert r.samples(last + 401, last + 460, every=1.0) == []
    # The allowance ends with the save: caught a timeout after it, well before the NCCL
    # watchdog (10 min), not 600 s later.
    (f,) = r.sample(last + 462)
    assert f.message.startswith(
        "no progress for 62s since its checkpoint save finished (timeout 60s = max(60s floor, 10 x p99 "
        "step interval 2.0s))"
    )
    assert f.evidence["timeout"] == pytest.approx(60.0)
    assert "idle on CPU" in f.message  # the disk-wait samples of the save are history by now


def test_checkpoint_allowance_is_bounded() -> None:
    """Writes that go on extend the timeout for ``checkpoint_allowance``, not forever."""
    r = Rank()
    last = r.steps(1100.0, 120, 2.0)
    for t in range(5, 700, 20):
        r.det.on_activity(last + t, "checkpoint_writing")
        if t < 655:
            assert r.sample(last + t + 1) == [], t
    found = r.samples(last + 656, last + 665, every=1.0)
    assert len(found) == 1 and found[0].evidence["timeout"] == pytest.approx(660.0)


def test_a_save_whose_writer_hangs_is_no_progress() -> None:
    """Rank 0 hung inside torch.save: its file is open and unjudged, but nothing is written any
    more. The last write, not the open save, is the sign of life: the stall comes one base
    timeout after it, not after the 600 s allowance (or the 2 min until it is judged)."""
    r = Rank()
    last = r.steps(1100.0, 120, 2.0)
    for t in range(1, 70):  # the watcher polls: a save in progress, last written at last + 1
        r.det.observe(r.state, CheckpointStatus(now=last + t, scans=t, writing=True, write_age=t - 1.0))
        found = r.sample(last + t)
        if t <= 61:
            assert found == [], t
        elif found:
            break
    assert found and found[0].kind == "stall" and t <= 63
    assert "checkpoint allowance" not in found[0].message


def test_log_growth_does_not_hide_a_stepping_rank_stall() -> None:
    r = Rank()
    last = r.steps(1100.0, 120, 2.0)
    for t in range(1, 60):
        r.det.on_activity(last + t, "log")  # e.g. NCCL WARN lines repeating
    assert len(r.sample(last + 61)) == 1


@pytest.mark.parametrize(
    ("cpu", "state", "cls", "text"),
    [
        (100.0, "running", "busy", "busy on CPU (100.0%): a spin or a data-loader deadlock"),
        (0.3, "sleeping", "idle", "idle on CPU (0.3%): blocked in a collective or I/O"),
        (1.0, "disk-wait", "disk-wait", "filesystem (NFS/Lustre) or driver"),
        (25.0, "sleeping", "partly busy", "partly busy on CPU (25.0%)"),
    ],
)
def test_classification(cpu: float, state: str, cls: str, text: str) -> None:
    r = Rank()
    last = r.steps(1100.0, 20, 2.0)
    fs = r.samples(last + 1, last + 61, cpu_percent=cpu, state=state)
    (f,) = fs
    assert f.evidence["classification"] == cls
    assert text in f.message
    assert f.evidence["cpu_percent"] == pytest.approx(cpu)


def test_stopped_process_is_named() -> None:
    r = Rank()
    last = r.steps(1100.0, 20, 2.0)
    (f,) = r.samples(last + 1, last + 61, cpu_percent=0.0, state="stopped")
    assert f.evidence["classification"] == "stopped"
    assert "process stopped, STOPPED by a signal" in f.message
    assert "kill -CONT 4242" in f.message


def test_dead_process_is_not_a_stall() -> None:
    r = Rank()
    last = r.steps(1100.0, 20, 2.0)
    assert r.samples(last + 1, last + 500, every=10.0, alive=False) == []
    r2 = Rank()
    last = r2.steps(1100.0, 20, 2.0)
    assert len(r2.sample(last + 61)) == 1
    (res,) = r2.sample(last + 90, alive=False)
    assert res.resolved and res.rank == 3 and "process exited after 90s" in res.message


def test_disabled() -> None:
    r = Rank(StallConfig(enabled=False))
    last = r.steps(1100.0, 20, 2.0)
    assert r.samples(last + 1, last + 5000, every=100.0) == []


# -- ranks that print no step lines ----------------------------------------------------


def test_no_stall_before_startup_grace() -> None:
    r = Rank(started=1000.0)
    assert r.samples(1000.0, 1899.0, every=3.0) == []  # model load: idle, silent, still in grace
    (f,) = r.sample(1901.0)
    assert f.evidence["signals"] == ["log growth", "CPU time"]
    assert "Judged from: log growth, CPU time." in f.message
    assert "no step line seen yet" in f.message
    assert f.step is None


def test_silent_rank_alive_while_cpu_advances() -> None:
    r = Rank(started=1000.0)
    assert r.samples(1000.0, 3000.0, every=1.0, cpu_percent=95.0) == []  # HF rank 1 training quietly
    # blocked in a collective: a watchdog thread wakes now and then, far below 1% of a core
    fired = []
    for t in range(3001, 3400):
        for f in r.sample(float(t), cpu_percent=3.0 if t % 10 == 0 else 0.0):
            fired.append((t, f))
    ((t, f),) = fired
    assert 3305 <= t <= 3315  # 300s after the CPU went quiet (the window is ~10 samples)
    assert f.evidence["classification"] == "idle"


def test_silent_rank_judged_from_log_growth_and_resolves() -> None:
    r = Rank(started=1000.0)
    for t in range(1000, 2500, 100):
        r.det.on_activity(float(t), "log")
        assert r.sample(float(t) + 1, cpu_percent=0.0) == []
    assert r.samples(2402.0, 2700.0, every=5.0, cpu_percent=0.0) == []
    (f,) = r.sample(2705.0, cpu_percent=0.0)
    assert "no sign of life for 305s (timeout 300s for a rank that prints no step lines" in f.message
    assert r.sample(2710.0, cpu_percent=0.0) == []
    r.det.on_activity(2720.0, "log")
    (res,) = r.sample(2721.0, cpu_percent=0.0)
    assert res.resolved and res.rank == 3
    assert res.message == "signs of life again (log growth) after 321s"


def test_silent_rank_checkpoint_writes_count() -> None:
    r = Rank(started=1000.0)
    for t in range(1000, 3000, 200):
        r.det.on_activity(float(t), "checkpoint")
        assert r.samples(float(t), float(t) + 199, every=10.0, cpu_percent=0.0) == []
    (f,) = r.samples(3000.0, 3310.0, every=10.0, cpu_percent=0.0)
    assert f.evidence["signals"] == ["log growth", "CPU time", "checkpoint writes"]


def test_silent_rank_gpu_compute_is_life_but_collective_spin_is_not() -> None:
    r = Rank(started=1000.0)
    for t in range(1000, 3000, 5):  # CPU idle (GPU-bound), no log lines, GPUs really computing
        r.det.on_gpu(float(t), "busy")
        assert r.sample(float(t) + 1, cpu_percent=0.0) == []
    fired: list[Finding] = []
    for t in range(3000, 3400, 5):  # hung: NCCL kernels spin at 100% utilisation, low power
        r.det.on_gpu(float(t), "spinning in a collective")
        fired += r.sample(float(t) + 1, cpu_percent=0.0)
    (f,) = fired
    assert f.evidence["gpu_activity"] == "spinning in a collective"
    assert "GPU activity" in f.evidence["signals"]
    assert "; GPU spinning in a collective." in f.message


def test_silent_rank_grace_ends_once_its_gpu_computed() -> None:
    """Hung at minute 5 of a job: judged 5 minutes later, not after the 15-minute grace."""
    r = Rank(started=1000.0)
    for t in range(1000, 1300, 5):
        r.det.on_gpu(float(t), "busy")
        assert r.sample(float(t) + 1, cpu_percent=0.0) == []
    fired: list[Finding] = []
    for t in range(1300, 1620, 5):
        r.det.on_gpu(float(t), "idle")
        fired += r.sample(float(t) + 1, cpu_percent=0.0)
    (f,) = fired
    assert 1300 + 300 < 1620 < 1000 + 900
    assert "after its GPU had computed" in f.message


# -- crashes -------------------------------------------------------------------------------

OOM_TB = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 212, in <module>
    main()
  File "/workspace/train.py", line 180, in main
    loss = model(**batch).loss
  File "/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", line 1518, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use.
"""

NCCL_TIMEOUT = """\
[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, \
NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600034 milliseconds before timing out.
[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, \
subsequent GPU operations might run on corrupted/incomplete data.
[Rank 1] To avoid data inconsistency, we are taking the entire process down.
terminate called after throwing an instance of 'c10::DistBackendError'
"""


def feed(state: RankState, text: str, first_step: int = 1, steps: int = 0) -> list[str]:
    """Step lines then ``text``, through the real error signatures; returns all lines."""
    m = SignatureMatcher()
    lines = [f"iteration {first_step + i} | lm loss: 2.5" for i in range(steps)] + text.splitlines()
    for n, line in enumerate(lines, 1):
        if line.startswith("iteration "):
            state.add(StepRecord(step=int(line.split()[1]), loss=2.5, line=n))
        for rec in m.feed(line, n, rank=state.rank):
            state.add(rec)
    for rec in m.flush():
        state.add(rec)
    return lines


def test_crash_exit_1_with_oom() -> None:
    st = RankState(rank=2, path="rank-2.log")
    lines = feed(st, OOM_TB, first_step=100, steps=21)
    f = crash_finding(st, exit_code=1, signal=None, tail=lines, rank=2, path="rank-2.log")
    assert f is not None
    assert f.kind == "crash" and f.severity is Severity.CRITICAL and f.step == 120 and f.rank == 2
    assert f.message.startswith("process exited with code 1 after step 120. Cause (oom): ")
    assert "Tried to allocate 2.00 GiB" in f.message
    assert "expandable_segments" in f.message  # the usual fix comes along
    ev = f.evidence
    assert ev["exit_code"] == 1 and ev["signal"] is None and ev["cause_kind"] == "oom"
    assert ev["traceback"][0] == "Traceback (most recent call last):"
    assert any("loss = model(**batch).loss" in x for x in ev["traceback"])  # the real frames
    assert len(ev["tail"]) == 20 and ev["tail"][-1] == lines[-1]


def test_oom_survived_earlier_is_not_the_cause() -> None:
    st = RankState(rank=0)
    steps = "".join(f"iteration {i} | lm loss: 2.5\n" for i in range(1, 6))
    tb = 'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\nValueError: bad\n'
    feed(st, OOM_TB + steps + tb)  # a batch-size finder caught the OOM, training went on
    assert [e.kind for e in st.errors] == ["oom", "crash"]
    f = crash_finding(st, exit_code=1, signal=None, tail=[], rank=0, path=None)
    assert f is not None and f.evidence["cause_kind"] == "crash"
    assert "ValueError: bad" in f.message
    assert f.evidence["traceback"][-1] == "ValueError: bad"


def test_sigkill_without_traceback_hints_at_oom_killer() -> None:
    st = RankState(rank=0)
    feed(st, "", steps=10)
    f = crash_finding(st, exit_code=-9, signal=None, tail=["iteration 10 | lm loss: 2.5"], rank=0, path=None)
    assert f is not None
    assert f.message.startswith("killed by signal 9 (SIGKILL) after step 10.")
    assert "OOM killer" in f.message and "dmesg" in f.message and "oom_kill" in f.message
    assert f.evidence["signal"] == 9 and f.evidence["cause_kind"] is None
    g = crash_finding(st, exit_code=None, signal=signal.SIGKILL, tail=[], rank=0, path=None)
    assert g is not None and "SIGKILL" in g.message


def test_clean_exit_is_none() -> None:
    st = RankState(rank=0)
    feed(st, "", steps=10)
    assert crash_finding(st, exit_code=0, signal=None, tail=["done"], rank=0, path=None) is None
    st.total_steps = 10
    assert crash_finding(st, exit_code=None, signal=None, tail=["done"], rank=0, path=None) is None


def test_unknown_status_without_errors_is_a_warning() -> None:
    st = RankState(rank=0)
    feed(st, "", steps=10)
    f = crash_finding(st, exit_code=None, signal=None, tail=["x"], rank=0, path=None)
    assert f is not None and f.severity is Severity.WARNING and "exit status unknown" in f.message


def test_exit_134_after_nccl_timeout() -> None:
    st = RankState(rank=1)
    lines = feed(st, NCCL_TIMEOUT, steps=50)
    f = crash_finding(st, exit_code=134, signal=None, tail=lines, rank=1, path=None)
    assert f is not None
    assert f.message.startswith("process exited with code 134 (128+6: SIGABRT) after step 50.")
    assert f.evidence["cause_kind"] == "nccl_timeout"
    assert "NCCL watchdog" in f.message
    assert "Watchdog caught collective operation timeout" in f.evidence["traceback"][0]


def test_priority_prefers_oom_over_nccl_and_warnings_lose_to_critical() -> None:
    st = RankState(rank=0)
    st.add(ErrorRecord(kind="nccl_error", summary="NCCL WARN x", severity=Severity.WARNING, line=1))
    st.add(ErrorRecord(kind="crash", summary="RuntimeError: y", evidence=["Traceback", "  a", "E"], line=2))
    f = crash_finding(st, exit_code=1, signal=None, tail=[], rank=0, path=None)
    assert f is not None and f.evidence["cause_kind"] == "crash"
    st.add(ErrorRecord(kind="nccl_timeout", summary="watchdog", line=3))
    st.add(ErrorRecord(kind="oom", summary="CUDA out of memory", line=4))
    f = crash_finding(st, exit_code=1, signal=None, tail=[], rank=0, path=None)
    assert f is not None and f.evidence["cause_kind"] == "oom"
    assert f.evidence["traceback"] == ["Traceback", "  a", "E"]  # the traceback that went with it


def test_a_gpu_warm_up_blip_does_not_end_a_silent_rank_grace() -> None:
    """A compile warm-up, then a long barrier while rank 0 tokenises: still inside the grace."""
    r = Rank(started=1000.0)
    r.det.on_gpu(1010.0, "busy")
    r.det.on_gpu(1015.0, "busy")
    fired: list[Finding] = []
    for t in range(1020, 1890, 5):
        r.det.on_gpu(float(t), "idle")
        fired += r.sample(float(t) + 1, cpu_percent=0.0)
    assert fired == []
