"""Real PyTorch (CPU, gloo): a rank blocked before all_reduce leaves its peer inside it."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# find_spec, not importorskip: collecting this module (as `-m unit` does) must not import torch
pytestmark = [
    pytest.mark.tool,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="PyTorch not installed (CI installs torch==2.13.0)"
    ),
]

WORKLOAD = Path(__file__).parent / "workloads" / "torch_hang.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gloo_hang_is_stalled_dumped_and_diffed(tmp_path: Path) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: torchjob}}\nstall: {{startup_grace: 60s, floor: 3s, factor: 10}}\n"
        f"process: {{sample_interval: 250ms}}\ndumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}, term_grace: 3s}}\n"
        f"server: {{listen: '127.0.0.1:0'}}\ngpu: {{enabled: false}}\n"
    )
    port = free_port()
    procs = []
    try:
        for r in range(2):
            env = dict(
                os.environ,
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                HANG_STEP="30",
                OMP_NUM_THREADS="1",
            )
            cmd = [
                sys.executable,
                "-m",
                "rankwatch",
                "run",
                "--config",
                str(cfg),
                "--findings-jsonl",
                str(tmp_path / f"f{r}.jsonl"),
                "--",
                sys.executable,
                str(WORKLOAD),
            ]
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            )
        from rankwatch.dumps.store import DumpStore

        store = DumpStore(tmp_path / "dumps")
        incident = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and incident is None:
            time.sleep(0.25)
            done = [i for i in store.list_incidents() if i.reason == "stall" and len(i.ranks) == 2]
            incident = done[0] if done else None
        assert incident is not None, "no stall incident with both ranks"
        # A stall finding goes out once its incident's stacks are in (it names the suspect).
        for r in (0, 1):
            path, kinds = tmp_path / f"f{r}.jsonl", []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "stall" not in kinds:
                time.sleep(0.2)
                lines = path.read_text().splitlines() if path.exists() else []
                kinds = [json.loads(x)["kind"] for x in lines]
            assert "stall" in kinds, (r, kinds)
        rank0 = (incident.path / "rank-0.txt").read_text()
        assert "all_reduce" in rank0 and "distributed_c10d.py" in rank0
        assert "wait_for_peer_data" in (incident.path / "rank-1.txt").read_text()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "rankwatch",
                "dumps",
                "diff",
                incident.name,
                "--dir",
                str(tmp_path / "dumps"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "suspect: rank 1" in out.stdout, out.stdout
    finally:
        from faultlib import stop_processes

        stop_processes(procs)
