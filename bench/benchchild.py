"""The processes the live-agent benchmarks watch: small, stdlib-only, and self-timing.

    python bench/benchchild.py train  --seconds S --go F --out F       # CPU-bound steps, reports steps/s
    python bench/benchchild.py nan    --episodes K --stamps F            # NaN episodes, stamps each NaN line
    python bench/benchchild.py stall  --hang-at T --stamps F             # steps until monotonic T, then hangs
    python bench/benchchild.py crash  --steps N --stamps F               # steps, then SIGKILLs itself
    python bench/benchchild.py burst  --rate R --seconds S --out F       # NCCL_DEBUG=INFO flood, then waits

Why not ``rankwatch.demo.trainer``: its ``--busy`` burns CPU for a fixed *time* per step,
so contention can never show up in its step rate, and it does not stamp the moment a line
is written. Every line here is written with one ``os.write`` on fd 1 (in run mode that is
the agent's log file, no pipe), and the stamp is ``time.monotonic()`` taken right after the
write returned: CLOCK_MONOTONIC is machine-wide, so the benchmark compares it directly with
the arrival time its webhook receiver takes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import time
from pathlib import Path

HOST = "gpu-node01"


def megatron_line(step: int, total: int, loss: float, ms: float, grad: float = 0.9) -> bytes:
    """One Megatron-LM iteration line, as the real framework prints it."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    loss_s = "nan" if math.isnan(loss) else f"{loss:E}"
    grad_s = "nan" if math.isnan(grad) else f"{grad:.3f}"
    return (
        f" [{stamp}] iteration {step:8d}/{total:8d} | consumed samples: {step * 64:12d} | "
        f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 388.8 | "
        f"learning rate: 3.000000E-04 | global batch size:    64 | lm loss: {loss_s} | loss scale: 1.0 | "
        f"grad norm: {grad_s} | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    ).encode()


def emit(data: bytes) -> float:
    os.write(1, data)
    return time.monotonic()


def loss_at(step: int) -> float:
    return 2.6 + 6.0 * math.exp(-step / 300) + random.gauss(0, 0.01)


# --- modes ---------------------------------------------------------------------------------
def cpu_work(n: int) -> int:
    """Pure-Python work of a fixed size: its rate drops if anything else takes this core."""
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFFFFFF
    return acc


def train(a: argparse.Namespace) -> None:
    """Fixed work per step, a step line per step; steps/s over ``--seconds`` counted from the
    moment ``--go`` exists (the benchmark creates it once every agent is up, so agent start-up,
    imports above all, stays out of the window in both arms of a pair)."""
    step = 0
    n_win = 0
    t_first: float | None = None
    end = math.inf
    last = time.monotonic()
    cpu0 = 0.0
    while True:
        cpu_work(a.work)
        step += 1
        now = time.monotonic()
        emit(megatron_line(step, 1_000_000, loss_at(step), (now - last) * 1000))
        last = now
        if t_first is None:
            if os.path.exists(a.go):
                t_first, end = now, now + a.seconds
                cpu0 = sum(os.times()[:2])
        else:
            n_win += 1
        if now >= end:
            break
    rate = n_win / (last - t_first) if t_first is not None and last > t_first else math.nan
    cpu = sum(os.times()[:2]) - cpu0
    Path(a.out).write_text(
        json.dumps(
            {"steps": step, "window_steps": n_win, "steps_per_s": rate, "cpu_ratio": cpu / (last - t_first)}
        )
    )


def nan(a: argparse.Namespace) -> None:
    """Finite steps every ``--interval``; every 8-14 steps ``--nan-steps`` NaN steps (then finite
    again, so the finding resolves and the next NaN is a fresh alert). The episode lasts longer
    than the agent's log poll: a NaN that is already gone when the agent reads it is, by the
    alert policy, a flap that fires no alert. Stamps: one JSON line per episode's first NaN."""
    rng = random.Random(a.seed)
    stamps = open(a.stamps, "a", buffering=1)  # noqa: SIM115
    step = 0
    for _ in range(a.lead):
        step += 1
        emit(megatron_line(step, 1_000_000, loss_at(step), a.interval * 1000))
        time.sleep(a.interval)
    for _ in range(a.episodes):
        for _ in range(rng.randint(8, 14)):
            step += 1
            emit(megatron_line(step, 1_000_000, loss_at(step), a.interval * 1000))
            time.sleep(a.interval * rng.uniform(0.7, 1.3))
        for i in range(a.nan_steps):
            step += 1
            t = emit(megatron_line(step, 1_000_000, math.nan, a.interval * 1000, grad=math.nan))
            if i == 0:
                stamps.write(json.dumps({"step": step, "t": t}) + "\n")
            time.sleep(a.interval)
    for _ in range(5):
        step += 1
        emit(megatron_line(step, 1_000_000, loss_at(step), a.interval * 1000))
        time.sleep(a.interval)
    time.sleep(a.linger)


def stall(a: argparse.Namespace) -> None:
    """Steps every ``--interval`` until monotonic ``--hang-at``, then blocks idle (as a rank
    waiting in a collective does); the stamp is the last step line's write time."""
    step = 0
    t = time.monotonic()
    while t < a.hang_at:
        step += 1
        t = emit(megatron_line(step, 1_000_000, loss_at(step), a.interval * 1000))
        time.sleep(a.interval)
    Path(a.stamps).write_text(json.dumps({"step": step, "t": t}))
    time.sleep(a.linger)


def crash(a: argparse.Namespace) -> None:
    """Some steps, then SIGKILL to itself (an OOM kill); the stamp is taken just before."""
    for step in range(1, a.steps + 1):
        emit(megatron_line(step, 1_000_000, loss_at(step), a.interval * 1000))
        time.sleep(a.interval)
    Path(a.stamps).write_text(json.dumps({"step": a.steps, "t": time.monotonic()}))
    os.kill(os.getpid(), signal.SIGKILL)


NCCL = [
    HOST + ":41200:41260 [0] NCCL INFO Channel {c:02d}/32 :    0   1   2   3   4   5   6   7\n",
    HOST + ":41200:41260 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n",
    HOST + ":41200:41261 [0] NCCL INFO AllReduce: opCount {c:x} sendbuff 0x7f3a1c000000 recvbuff "
    "0x7f3a1c000000 count 131334144 datatype 9 op 0 root 0 comm 0x5581c2d0 [nranks=8] stream 0x55823f10\n",
    HOST + ":41200:41260 [0] NCCL INFO Connected all trees\n",
]


def burst(a: argparse.Namespace) -> None:
    """``--rate`` lines/s for ``--seconds``, paced in 5 ms ticks (a step line every 1000 lines),
    then waits for ``--done`` to appear so a run-mode agent stays up while it catches up.

    The rate is what the writer achieved (lines / time to write them), and ``behind_max_s``
    how far it ever fell behind its schedule: an agent that slowed the writer shows in both.
    """
    block = [NCCL[i % 4].format(c=i % 32) for i in range(1000)]
    tick = 0.005
    per_tick = max(1, int(a.rate * tick))
    total = int(a.rate * a.seconds)
    written = 0
    step = 0
    behind = 0.0
    t0 = time.monotonic()
    while written < total:
        n = min(per_tick, total - written)
        lines: list[str] = []
        while len(lines) < n:
            take = min(n - len(lines), 1000 - (written + len(lines)) % 1000)
            off = (written + len(lines)) % 1000
            lines.extend(block[off : off + take])
            if (written + len(lines)) % 1000 == 0:
                step += 1
                lines[-1] = megatron_line(step, 1_000_000, loss_at(step), 5.0).decode()
        os.write(1, "".join(lines).encode())
        written += n
        due = t0 + written / a.rate
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            behind = max(behind, now - due)
    t1 = time.monotonic()
    Path(a.out).write_text(
        json.dumps(
            {
                "lines": written,
                "seconds": t1 - t0,
                "rate": written / (t1 - t0),
                "behind_max_s": behind,
                "t_end": t1,
            }
        )
    )
    deadline = time.monotonic() + a.linger
    while a.done and not os.path.exists(a.done) and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("train")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--go", required=True, help="the window starts when this file exists")
    p.add_argument("--work", type=int, default=400_000)
    p.add_argument("--out", required=True)
    p = sub.add_parser("nan")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--nan-steps", type=int, default=5)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--lead", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stamps", required=True)
    p.add_argument("--linger", type=float, default=2.0)
    p = sub.add_parser("stall")
    p.add_argument("--hang-at", type=float, required=True)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--stamps", required=True)
    p.add_argument("--linger", type=float, default=120.0)
    p = sub.add_parser("crash")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--stamps", required=True)
    p = sub.add_parser("burst")
    p.add_argument("--rate", type=float, default=200_000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--out", required=True)
    p.add_argument("--done", default="")
    p.add_argument("--linger", type=float, default=300.0)
    a = ap.parse_args()
    {"train": train, "nan": nan, "stall": stall, "crash": crash, "burst": burst}[a.mode](a)


if __name__ == "__main__":
    main()
