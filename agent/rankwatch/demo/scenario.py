"""`rankwatch demo`: a simulated multi-rank job, a real agent per rank, real faults.

Each rank is the fake trainer launched under `rankwatch run` exactly as a user would under
srun. The job spikes, goes NaN on every rank, then rank 1 hangs in its data loader while
the others wait in all_reduce: the agents flag the stall, py-spy dumps every rank into one
incident folder, and `dumps diff` names rank 1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rankwatch.dumps.diff import diff_incident, format_diff
from rankwatch.dumps.store import DumpStore

HANG_RANK = 1
DEADLINE_S = 120.0

CONFIG = """\
run:
  name: demo
detectors:
  warmup_steps: 20
  throughput: {{baseline_steps: 10, consecutive: 5}}
stall:
  startup_grace: 60s
  floor: 4s
  factor: 10
process:
  sample_interval: 500ms
dumps:
  dir: {dumps}
runner:
  log_dir: {logs}
  echo: false
  term_grace: 5s
server:
  listen: 127.0.0.1:0
gpu:
  enabled: false
"""


def _reader(proc: subprocess.Popen[str], rank: int, lines: list[str], lock: threading.Lock) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        text = raw.rstrip("\n")
        with lock:
            lines.append(text)
            if text.startswith("rankwatch: ["):
                print(text.replace("rankwatch: ", "", 1), flush=True)


def run_demo(*, workdir: str | None = None, ranks: int = 4, keep: bool = False) -> int:
    ranks = max(2, min(8, ranks))
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="rankwatch-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    dumps, logs, sync = root / "dumps", root / "logs", root / "sync"
    for d in (dumps, logs, sync):
        d.mkdir(exist_ok=True)
    cfg = root / "rankwatch.yaml"
    cfg.write_text(CONFIG.format(dumps=dumps, logs=logs))
    where = f"in {root}" if workdir or keep else f"in {root} (removed at the end; --keep keeps it)"
    print(f"rankwatch demo: {ranks} simulated ranks (Megatron-LM log format), one agent each, {where}")
    print(
        f"faults: loss spike at step 40, NaN at step 120 on every rank, rank 2 slows at 80, "
        f"rank {HANG_RANK} hangs in its data loader at step 160\n",
        flush=True,
    )
    procs: list[subprocess.Popen[str]] = []
    lines: list[str] = []
    lock = threading.Lock()
    code = 1
    try:
        for r in range(ranks):
            env = dict(
                os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks), RANKWATCH_RUN="demo"
            )
            cmd = [
                sys.executable,
                "-m",
                "rankwatch",
                "run",
                "--config",
                str(cfg),
                "--findings-jsonl",
                str(root / f"findings-rank-{r}.jsonl"),
                "--",
                sys.executable,
                "-m",
                "rankwatch.demo.trainer",
                "--rank",
                str(r),
                "--world-size",
                str(ranks),
                "--steps",
                "400",
                "--step-time",
                "0.03",
                "--format",
                "megatron",
                "--sync-dir",
                str(sync),
                "--fault",
                "spike@40",
                "--fault",
                "nan@120",
                "--fault",
                "slow@80:rank=2",
                "--fault",
                f"hang@160:rank={HANG_RANK}",
                "--collective-timeout",
                "600",
            ]
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            threading.Thread(target=_reader, args=(p, r, lines, lock), daemon=True).start()
        store = DumpStore(dumps)
        deadline = time.monotonic() + DEADLINE_S
        incident = None
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if any(p.poll() is not None for p in procs):
                print("rankwatch demo: a rank exited early", file=sys.stderr)
                break
            found = [i for i in store.list_incidents() if i.reason == "stall" and len(i.ranks) >= ranks]
            if found:
                incident = found[0]
                time.sleep(0.5)
                break
        if incident is None:
            print("rankwatch demo: no complete stall incident within the deadline", file=sys.stderr)
            return 1
        result = diff_incident({r: store.load_rank(incident, r) for r in incident.ranks})
        if workdir or keep:
            print(f"\nstack dumps of every rank: {incident.path}")
            print(f"\n$ rankwatch dumps diff {incident.name} --dir {dumps}\n{format_diff(result)}\n")
        else:  # the folder goes when the demo ends: print no command that points into it
            print(
                "\nstack dumps of every rank, compared by `rankwatch dumps diff` (the demo's folder is "
                "removed at the end: `rankwatch demo --keep` keeps it to run that yourself):"
            )
            print(f"{format_diff(result)}\n")
        code = 0 if result.suspects == [HANG_RANK] else 1
        print(
            "rankwatch demo: "
            + ("the suspect is the rank that hung: OK" if code == 0 else "unexpected verdict")
        )
        return code
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        if not workdir and not keep:
            shutil.rmtree(root, ignore_errors=True)
        elif code == 0:
            print(f"logs, findings and dumps kept in {root}")
