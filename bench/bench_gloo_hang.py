"""Time from a real gloo hang to its first signal: rankwatch's stall finding vs PyTorch's timeout.

Two real ranks (torch.distributed, gloo, CPU), each under its own `rankwatch run`, step and
all_reduce every 50 ms; rank 1 stops entering the collective at step 40 and stamps the moment
(CLOCK_MONOTONIC, shared by every process of the machine). Rank 0 then waits in all_reduce
until PyTorch's own timeout raises; the agents report `stall`. Both are timed from the hang
in the same run. PyTorch's default process-group timeout (30 min for gloo in torch 2.x) is
reported from torch itself rather than waited for; the measured arms shorten it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchlib import PY, RANKWATCH, agent_env, free_port, machine, start, stop

RANK = r"""
import datetime, os, sys, time
import torch, torch.distributed as dist
timeout = float(sys.argv[1])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
rank = dist.get_rank()
x = torch.ones(1024)
for step in range(1, 100000):
    if rank == 1 and step == 40:
        print(f"HANG_AT {time.monotonic():.6f}", flush=True)
        time.sleep(3600)
    try:
        dist.all_reduce(x)
    except Exception as e:
        print(f"TORCH_ERROR_AT {time.monotonic():.6f} {type(e).__name__}: {str(e)[:200]}", flush=True)
        sys.exit(1)
    x.fill_(1.0)
    print(f"step {step} loss {2.0 / step:.4f}", flush=True)
    time.sleep(0.05)
"""


def first_stall(jsonl: Path) -> float | None:
    if not jsonl.exists():
        return None
    for line in jsonl.read_text().splitlines():
        if line.strip() and json.loads(line).get("kind") == "stall":
            return time.monotonic()
    return None


def marker(log_dir: Path, word: str) -> float | None:
    for p in sorted(log_dir.glob("*.log")):
        for line in p.read_text(errors="replace").splitlines():
            if line.startswith(word + " "):
                return float(line.split()[1])
    return None


def arm(tmp: Path, floor: str, torch_timeout: float, limit: float) -> dict[str, float | None]:
    """One hang; returns seconds from the hang to rankwatch's first stall and to torch's error."""
    script = tmp / "rank.py"
    script.write_text(RANK)
    port = free_port()
    procs = []
    seen: dict[int, float | None] = {0: None, 1: None}
    try:
        for rank in (0, 1):
            logs = tmp / f"logs-{rank}"
            cfg = tmp / f"rw-{rank}.yaml"
            stall = "" if floor == "default" else f"stall: {{floor: {floor}}}\n"
            cfg.write_text(
                f"run: {{name: gloo}}\n{stall}runner: {{log_dir: {logs}, echo: false}}\n"
                f"dumps: {{dir: {tmp / 'dumps'}}}\nserver: {{enabled: false}}\ngpu: {{enabled: false}}\n"
            )
            env = agent_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                            LOCAL_RANK=str(rank))  # fmt: skip
            cmd = [*RANKWATCH, "run", "--config", str(cfg), "--findings-jsonl", str(tmp / f"f-{rank}.jsonl"),
                   "--", PY, str(script), str(torch_timeout)]  # fmt: skip
            procs.append(start(cmd, env=env, stderr=tmp / f"agent-{rank}.err"))
        deadline = time.monotonic() + limit
        hang = torch_at = None
        while time.monotonic() < deadline:
            hang = hang or marker(tmp / "logs-1", "HANG_AT")
            for r in (0, 1):
                seen[r] = seen[r] or first_stall(tmp / f"f-{r}.jsonl")
            torch_at = torch_at or marker(tmp / "logs-0", "TORCH_ERROR_AT")
            if hang and torch_at and all(seen.values()):
                break
            time.sleep(0.02)
    finally:
        for p in procs:
            stop(p)
    first = min((t for t in seen.values() if t), default=None)
    return {
        "rankwatch_s": None if first is None or hang is None else first - hang,
        "torch_s": None if torch_at is None or hang is None else torch_at - hang,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the shortened arm (stall floor 5 s, torch 20 s)")
    args = ap.parse_args()
    import torch
    from torch.distributed import constants

    print(f"machine: {machine()}; torch {torch.__version__}")
    print(f"PyTorch's default process-group timeout: {constants.default_pg_timeout.total_seconds():.0f} s")
    arms = [("5s", 20.0)] if args.quick else [("default", 120.0), ("5s", 20.0)]
    for floor, tt in arms:
        with tempfile.TemporaryDirectory(prefix="rw-gloo-") as d:
            r = arm(Path(d), floor, tt, limit=tt + 60)
        rw, to = r["rankwatch_s"], r["torch_s"]
        print(
            f"stall.floor {floor:>7}, torch timeout {tt:>5.0f} s: rankwatch stall after "
            f"{'-' if rw is None else f'{rw:.1f} s'}, PyTorch's error after {'-' if to is None else f'{to:.1f} s'}"
            + (f"; ratio {rw / to:.2f}" if rw and to else "")
        )
        if rw and floor == "default":
            print(f"  against PyTorch's default timeout: ratio {rw / constants.default_pg_timeout.total_seconds():.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
