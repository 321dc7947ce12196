"""Detection latency on real 4-rank DDP jobs (CPU torch, gloo), one agent per rank.

Runs the scenarios of ``tests/test_ddp_real.py`` (each asserts its verdict) and prints, per
scenario, the time from the fault to the finding that names the rank at fault:

- dataloader_deadlock / torchrun_dataloader_deadlock / collective_mismatch: from the last step
  line before the hang to the stall finding naming the suspect on every rank (includes the
  4 s ``stall.floor`` of the test config and waiting for every rank's stacks);
- sigkill_first_failure: from rank 3's crash finding to every peer's finding naming rank 3;
- straggler: from rank 1's first slow step to its ``straggler`` finding (includes the
  throughput detector's 4 slow steps and the py-spy sampling of every rank).

    python bench/bench_ddp.py            # all five, ~5 minutes on 2 cores
    python bench/bench_ddp.py --quick    # the data-loader deadlock only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the data-loader deadlock")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "latency.jsonl"
        env = dict(os.environ, RANKWATCH_DDP_LATENCY=str(out))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "agent"), env.get("PYTHONPATH")]))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "test_ddp_real.py"),
        ]
        if args.quick:
            cmd += ["-k", "dataloader_deadlock"]
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        rows = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    print(f"{'scenario':<32} {'latency':>9}")
    for row in rows:
        print(f"{row['scenario']:<32} {row['latency_s']:>8.1f}s")
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    print("verdicts (pytest):", *tail)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
