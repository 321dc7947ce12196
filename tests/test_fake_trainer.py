"""The fake trainer must print what the real frameworks print and fail the way real ranks fail.

Its output is the input of the parser, detector and live-agent tests, so these tests pin
the line formats (taken from the frameworks' own format strings) and the fault stories.
"""

from __future__ import annotations

import ast
import itertools
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_for
from rankwatch.demo.trainer import Fault, main

FAST = ["--step-time", "0.0001"]

MEGATRON_STEP = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +(?P<step>\d+)/ +(?P<total>\d+) \|"
    r" consumed samples: +\d+ \| elapsed time per iteration \(ms\): \d+\.\d \|"
    r" throughput per GPU \(TFLOP/s/GPU\): \d+\.\d \| learning rate: (?P<lr>\d\.\d{6}E[-+]\d\d) \|"
    r" global batch size: +\d+ \| lm loss: (?P<loss>\d\.\d{6}E[-+]\d\d|NAN) \| loss scale: 1\.0 \|"
    r" grad norm: (?P<grad>\d+\.\d{3}|nan) \| number of skipped iterations: +0 \|"
    r" number of nan iterations: +(?P<nans>\d+) \|$"
)
MEGATRON_EVAL = re.compile(
    r"^ validation loss at iteration (?P<step>\d+) \| lm loss value: (?P<loss>\d\.\d{6}E[-+]\d\d) \|"
    r" lm loss PPL: \d\.\d{6}E[-+]\d\d \| $"
)
NANOGPT_STEP = re.compile(
    r"^iter (?P<step>\d+): loss (?P<loss>\d+\.\d{4}|nan), time \d+\.\d\dms, mfu -?\d+\.\d\d%$"
)
NANOGPT_EVAL = re.compile(r"^step (?P<step>\d+): train loss \d+\.\d{4}, val loss (?P<loss>\d+\.\d{4})$")
TITAN_PREFIX = r"^\[titan\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - root - INFO - "
TITAN_STEP = re.compile(
    TITAN_PREFIX + r"step: +(?P<step>\d+)  loss: +(?P<loss>\d+\.\d{5}|nan)  grad_norm: +(?P<grad>\S+)"
    r"  memory: \d+\.\d\dGiB\(\d+\.\d\d%\)  tps: \d{1,3}(,\d{3})*  tflops: [\d,]+\.\d\d  mfu: \d+\.\d\d%$"
)
TITAN_EVAL = re.compile(
    TITAN_PREFIX + r"validate step: +(?P<step>\d+)  loss: +(?P<loss>\d+\.\d{4})  memory: \S+  tps: [\d,]+$"
)
KV_STEP = re.compile(
    r"^step=(?P<step>\d+) loss=(?P<loss>\S+) lr=(?P<lr>\S+) grad_norm=(?P<grad>\S+)"
    r" step_time=(?P<time>\d+\.\d{4}) tokens_per_s=\d+$"
)
KV_EVAL = re.compile(r"^step=(?P<step>\d+) eval_loss=(?P<loss>\d+\.\d{4})$")
TQDM_BAR = re.compile(
    r" +\d+%\|[█▏▎▍▌▋▊▉ ]{10}\| \d+/\d+ \[\d\d:\d\d<(\d\d:\d\d|\?), +(\d+\.\d\d(it/s|s/it)|\?it/s)\]"
)


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def matches(pattern: re.Pattern[str], text: str) -> list[re.Match[str]]:
    return [m for line in text.splitlines() if (m := pattern.match(line))]


def hf_dicts(out: str) -> list[dict[str, float]]:
    return [
        ast.literal_eval(line.replace("nan", "None")) for line in out.splitlines() if line.startswith("{")
    ]


def as_float(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fmt", "step_re", "eval_re"),
    [
        ("megatron", MEGATRON_STEP, MEGATRON_EVAL),
        ("nanogpt", NANOGPT_STEP, NANOGPT_EVAL),
        ("torchtitan", TITAN_STEP, TITAN_EVAL),
        ("kv", KV_STEP, KV_EVAL),
    ],
)
def test_line_formats_match_the_frameworks(
    capsys: pytest.CaptureFixture[str], fmt: str, step_re: re.Pattern[str], eval_re: re.Pattern[str]
) -> None:
    rc, out, _ = run_main(
        capsys, "--format", fmt, "--steps", "12", "--eval-every", "6", "--color", "never", *FAST
    )
    assert rc == 0
    steps = matches(step_re, out)
    assert [int(m["step"]) for m in steps] == list(range(1, 13))
    losses = [float(m["loss"]) for m in steps]
    assert losses[-1] < 0.6 * losses[0]  # a decaying curve, not noise around a constant
    assert [int(m["step"]) for m in matches(eval_re, out)] == [6, 12]
    assert "NCCL INFO Channel 00/02 :    0" in out


@pytest.mark.unit
def test_megatron_validation_block_is_framed_by_dashes(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "--steps", "4", "--eval-every", "4", *FAST)
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if MEGATRON_EVAL.match(line))
    assert lines[i - 1] == lines[i + 1] == "-" * (len(lines[i]) + 1)
    assert any(MEGATRON_STEP.match(line) and "iteration        4/       4" in line for line in lines)


@pytest.mark.unit
def test_megatron_curves_warm_up_then_decay(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "--steps", "60", "--total-steps", "100", *FAST)
    steps = matches(MEGATRON_STEP, out)
    assert {int(m["total"]) for m in steps} == {100}
    lrs = [float(m["lr"]) for m in steps]
    peak = lrs.index(max(lrs))
    assert 0 < peak < 10
    assert all(a < b for a, b in itertools.pairwise(lrs[: peak + 1]))
    assert all(a >= b for a, b in itertools.pairwise(lrs[peak:]))
    grads = [float(m["grad"]) for m in steps]
    assert grads[0] > 5 * statistics.median(grads[-20:])  # high grad norm early, as in real warmup


@pytest.mark.unit
def test_hf_dicts_on_stdout_and_tqdm_bar_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(capsys, "--format", "hf", "--steps", "9", "--eval-every", "3", *FAST)
    assert rc == 0
    dicts = hf_dicts(out)
    train = [d for d in dicts if "loss" in d]
    assert len(train) == 9
    assert all(list(d) == ["loss", "grad_norm", "learning_rate", "epoch"] for d in train)
    assert all(d["loss"] == round(d["loss"], 4) for d in train)
    evals = [d for d in dicts if "eval_loss" in d]
    assert len(evals) == 3
    assert list(evals[0]) == [
        "eval_loss",
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
        "epoch",
    ]
    assert "train_runtime" in dicts[-1] and dicts[-1]["epoch"] == 3.0
    assert "\r" in err and TQDM_BAR.search(err)
    assert "***** Running training *****" in err
    assert "9/9" in err.split("\r")[-1]


@pytest.mark.unit
def test_torchtitan_is_coloured_like_the_real_one_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "--format", "torchtitan", "--steps", "2", *FAST)
    line = next(line for line in out.splitlines() if "step:  2" in line)
    assert "\033[31mstep:  2  \033[32mloss:" in line and line.endswith("\033[39m")
    assert TITAN_STEP.match(re.sub(r"\033\[[\d;]*m", "", line))


@pytest.mark.unit
def test_framework_rank_selection_without_all_ranks_log(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    _, out, _ = run_main(capsys, "--format", "hf", "--steps", "3", "--no-all-ranks-log", *FAST)
    assert hf_dicts(out) == []  # the Trainer logs on world process zero only
    assert "NCCL INFO comm" in out and " rank 1 nranks 2 " in out
    _, out, _ = run_main(capsys, "--steps", "3", "--no-all-ranks-log", *FAST)
    assert len(matches(MEGATRON_STEP, out)) == 3  # Megatron's print_rank_last
    _, out, _ = run_main(capsys, "--steps", "3", "--no-all-ranks-log", "--rank", "0", *FAST)
    assert matches(MEGATRON_STEP, out) == []


@pytest.mark.unit
def test_fault_spec_parsing() -> None:
    assert Fault.parse("hang@5:rank=1") == Fault("hang", 5, 1)
    assert Fault.parse("nan@12") == Fault("nan", 12, None)
    for bad in ("boom@3", "nan", "nan@x", "nan@3:rank=", "nan@3:node=1"):
        with pytest.raises(ValueError):
            Fault.parse(bad)
    with pytest.raises(SystemExit):
        main(["--fault", "boom@3"])


@pytest.mark.unit
@pytest.mark.faults
def test_nan_comes_after_a_grad_norm_blow_up(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "--steps", "20", "--fault", "nan@12", *FAST)
    steps = {int(m["step"]): m for m in matches(MEGATRON_STEP, out)}
    assert len(steps) == 20
    assert [s for s, m in steps.items() if m["loss"] == "NAN"] == list(range(12, 21))
    assert steps[12]["grad"] == "nan" and steps[12]["nans"] == "1"
    assert steps[11]["nans"] == "0"
    before = [float(steps[s]["grad"]) for s in range(7, 12)]
    assert all(a < b for a, b in itertools.pairwise(before))
    assert before[-1] > 10 * before[0]


@pytest.mark.unit
@pytest.mark.faults
def test_nan_flat_keeps_grad_norm_calm_before(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "--format", "kv", "--steps", "20", "--fault", "nan_flat@15", *FAST)
    steps = {int(m["step"]): m for m in matches(KV_STEP, out)}
    assert steps[15]["loss"] == "nan" and steps[14]["loss"] != "nan"
    grads = [float(steps[s]["grad"]) for s in range(10, 15)]
    assert max(grads) < 1.5 * min(grads)


@pytest.mark.unit
@pytest.mark.faults
def test_spike_and_divergence(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "--format", "kv", "--steps", "40", "--fault", "spike@20", *FAST)
    loss = {int(m["step"]): float(m["loss"]) for m in matches(KV_STEP, out)}
    assert loss[20] > 2.5 * loss[19] and loss[21] < 1.2 * loss[19]
    _, out, _ = run_main(capsys, "--format", "kv", "--steps", "40", "--fault", "diverge@20", *FAST)
    loss = {int(m["step"]): float(m["loss"]) for m in matches(KV_STEP, out)}
    assert all(loss[s + 1] > loss[s] for s in range(20, 40))


@pytest.mark.unit
@pytest.mark.faults
def test_faults_for_another_rank_do_not_apply(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "--format", "kv", "--steps", "6", "--fault", "crash@3:rank=1", *FAST)
    assert rc == 0 and len(matches(KV_STEP, out)) == 6


@pytest.mark.unit
@pytest.mark.faults
def test_slow_fault_quadruples_step_time(capsys: pytest.CaptureFixture[str]) -> None:
    # Real sleeps: 12 ms steps keep the ratio near 4 (above 3.3 with the CPUs oversubscribed).
    _, out, _ = run_main(
        capsys, "--format", "kv", "--steps", "10", "--step-time", "0.012", "--fault", "slow@6"
    )
    times = {int(m["step"]): float(m["time"]) for m in matches(KV_STEP, out)}
    before = statistics.median(times[s] for s in range(2, 6))
    after = statistics.median(times[s] for s in range(6, 11))
    assert after > 2.5 * before


def trainer(*argv: str) -> list[str]:
    return [sys.executable, "-m", "rankwatch.demo.trainer", *argv]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_proc(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(trainer(*argv, *FAST), capture_output=True, text=True, timeout=30, env=clean_env())


@pytest.mark.process
@pytest.mark.faults
def test_crash_exits_1_with_a_cuda_traceback() -> None:
    proc = run_proc("--steps", "10", "--fault", "crash@4")
    assert proc.returncode == 1
    assert [int(m["step"]) for m in matches(MEGATRON_STEP, proc.stdout)] == [1, 2, 3]
    err = proc.stderr
    assert err.startswith("Traceback (most recent call last):\n")
    assert "RuntimeError: CUDA error: an illegal memory access was encountered\n" in err
    assert "For debugging consider passing CUDA_LAUNCH_BLOCKING=1" in err
    assert re.search(r'File ".*trainer\.py", line \d+, in forward_backward_step', err)


@pytest.mark.process
@pytest.mark.faults
def test_oom_exits_1_with_torch_oom_text() -> None:
    proc = run_proc("--format", "nanogpt", "--steps", "10", "--fault", "oom@2")
    assert proc.returncode == 1
    assert "Traceback (most recent call last):" in proc.stderr
    assert re.search(
        r"^torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate 2\.00 GiB\. GPU 0 has a total "
        r"capacity of 79\.15 GiB of which 1\.19 GiB is free\.",
        proc.stderr,
        re.M,
    )


@pytest.mark.process
@pytest.mark.faults
def test_kill_dies_by_sigkill_and_exit_exits_quietly() -> None:
    proc = run_proc("--steps", "10", "--fault", "kill@3")
    assert proc.returncode == -signal.SIGKILL
    assert len(matches(MEGATRON_STEP, proc.stdout)) == 2
    proc = run_proc("--format", "kv", "--steps", "10", "--fault", "exit@3")
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr and len(matches(KV_STEP, proc.stdout)) == 2


def start_ranks(tmp_path: Path, world: int, *argv: str) -> list[subprocess.Popen[bytes]]:
    procs = []
    for rank in range(world):
        log = (tmp_path / f"rank-{rank}.log").open("wb")
        args = trainer("--rank", str(rank), "--world-size", str(world), "--sync-dir", str(tmp_path / "sync"))
        procs.append(subprocess.Popen([*args, *argv], stdout=log, stderr=subprocess.STDOUT, env=clean_env()))
        log.close()
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=10)


def log_steps(tmp_path: Path, rank: int) -> list[int]:
    text = (tmp_path / f"rank-{rank}.log").read_text(errors="replace")
    return [int(m["step"]) for m in matches(MEGATRON_STEP, text)]


@pytest.mark.process
def test_two_ranks_run_in_lock_step_and_keep_the_sync_dir_small(tmp_path: Path) -> None:
    procs = start_ranks(tmp_path, 2, "--steps", "15", "--step-time", "0.002")
    try:
        assert [p.wait(timeout=30) for p in procs] == [0, 0]
    finally:
        stop(procs)
    assert log_steps(tmp_path, 0) == log_steps(tmp_path, 1) == list(range(1, 16))
    assert len(list((tmp_path / "sync").iterdir())) <= 4


@pytest.mark.process
@pytest.mark.faults
def test_hang_on_one_rank_stalls_the_other_in_all_reduce(tmp_path: Path) -> None:
    procs = start_ranks(tmp_path, 2, "--steps", "50", "--step-time", "0.01", "--fault", "hang@5:rank=1")
    try:
        assert wait_for(lambda: 4 in log_steps(tmp_path, 0) and 4 in log_steps(tmp_path, 1))
        time.sleep(0.4)  # forty step times: ample for a step to complete if nothing blocked it
        assert max(log_steps(tmp_path, 0)) == 4 and max(log_steps(tmp_path, 1)) == 4
        assert [p.poll() for p in procs] == [None, None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        assert [p.wait(timeout=10) for p in procs] == [143, 143]
        assert "Received SIGTERM at step 5" in (tmp_path / "rank-0.log").read_text()
    finally:
        stop(procs)


@pytest.mark.process
@pytest.mark.faults
def test_dead_peer_ends_in_an_nccl_watchdog_timeout(tmp_path: Path) -> None:
    procs = start_ranks(
        tmp_path, 2, "--steps", "50", *FAST, "--fault", "crash@3:rank=1", "--collective-timeout", "0.3"
    )
    try:
        assert [p.wait(timeout=30) for p in procs] == [134, 1]
    finally:
        stop(procs)
    text = (tmp_path / "rank-0.log").read_text()
    assert re.search(
        r"^\[rank0\]:\[E\d{3,4} \d\d:\d\d:\d\d\.\d{9} ProcessGroupNCCL\.cpp:\d+\] \[Rank 0\] Watchdog caught "
        r"collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=ALLREDUCE, NumelIn=\d+, NumelOut=\d+, "
        r"Timeout\(ms\)=300\) ran for \d+ milliseconds before timing out\.$",
        text,
        re.M,
    )
    assert "To avoid data inconsistency, we are taking the entire process down." in text
    assert max(log_steps(tmp_path, 0)) == 2
    assert not math.isnan(float(matches(MEGATRON_STEP, text)[-1]["loss"]))
