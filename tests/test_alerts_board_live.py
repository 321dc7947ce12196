"""Two real `rankwatch run` agents, one per rank, sharing a dumps folder: a job-wide hang
reaches the webhook as one grouped stall alert naming both ranks, not one per agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.process


def _receiver() -> tuple[ThreadingHTTPServer, list[dict]]:
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, got


def test_two_agents_send_one_grouped_stall_alert(tmp_path: Path) -> None:
    srv, got = _receiver()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: grp}}\ndetectors: {{warmup_steps: 5}}\n"
        "stall: {startup_grace: 20s, floor: 2s, factor: 10}\nprocess: {sample_interval: 200ms}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}, on_stall: false}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}, echo: false, term_grace: 3s}}\n"
        "server: {enabled: false}\ngpu: {enabled: false}\n"
        f"alerts: {{startup_quiet: 0s, group_wait: 1s, spool_dir: {tmp_path / 'spool'},"
        f" webhook: {{urls: ['{url}']}}}}\n"
    )
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = []
    try:
        for r in range(2):
            cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--",
                   sys.executable, "-m", "rankwatch.demo.trainer", "--rank", str(r), "--world-size", "2",
                   "--sync-dir", str(sync), "--step-time", "0.02", "--steps", "100000",
                   "--fault", "hang@30:rank=1"]  # fmt: skip
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2")
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(a.get("kind") == "stall" for a in got):
            time.sleep(0.2)
        # A second sender posts before its agent is gone: stop both (each flushes what is queued
        # and exits) and count then, not after a guessed delay.
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        stalls = [a for a in got if a.get("kind") == "stall" and a.get("status", "firing") == "firing"]
        assert len(stalls) == 1, json.dumps(got, indent=1)[:3000]
        assert stalls[0]["ranks"] == [0, 1], json.dumps(stalls[0])[:2000]
    finally:
        from faultlib import stop_processes

        stop_processes(procs)
        srv.shutdown()
        srv.server_close()
