"""Pieces the live-agent benchmarks share: launching agents, reading their port, a webhook
receiver that stamps arrivals, /metrics parsing and percentiles.

Timestamps are ``time.monotonic()`` everywhere: on Linux it is CLOCK_MONOTONIC, one clock
for every process of the machine, so a time taken in a writer process and one taken in
the benchmark compare directly (and NTP cannot move them).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

PY = sys.executable
TRAINER = [PY, "-m", "rankwatch.demo.trainer"]
RANKWATCH = [PY, "-m", "rankwatch"]


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100), as Prometheus and most SLOs read it."""
    s = sorted(xs)
    if not s:
        return math.nan
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summary(xs: Sequence[float], unit: str = "ms", scale: float = 1000.0) -> str:
    if not xs:
        return "no samples"
    return (
        f"n={len(xs)} p50 {pct(xs, 50) * scale:.1f} {unit}  p90 {pct(xs, 90) * scale:.1f} {unit}  "
        f"p99 {pct(xs, 99) * scale:.1f} {unit}  max {max(xs) * scale:.1f} {unit}"
    )


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    return f"{os.cpu_count()} cores {cpu}, Python {sys.version.split()[0]}, load avg {load:.2f} at start"


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def agent_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"):
        env.pop(k, None)
    env.update(extra)
    return env


def start(
    cmd: Sequence[str], *, stdout: Path | None = None, stderr: Path | None = None, env: dict | None = None
) -> subprocess.Popen:
    """Output to files, never pipes: an undrained pipe would block the process under test."""
    out = open(stdout, "wb") if stdout else subprocess.DEVNULL  # noqa: SIM115
    err = open(stderr, "wb") if stderr else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        list(cmd), stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )


def stop(p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
    return p.returncode


def free_port() -> int:
    """A port free now; the agent logs the one it bound only at -v, which would change its load."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Until the agent answers /metrics (it is then fully started: watchers, services)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            scrape(port, timeout=2.0)
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"agent exited with {proc.returncode} before serving")
        time.sleep(0.05)
    raise RuntimeError(f"agent on port {port} did not serve within {timeout}s")


def scrape(port: int, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


class Receiver:
    """A webhook endpoint on loopback; every POST is stamped with monotonic arrival time."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _hook(self, request: web.Request) -> web.Response:
        t = time.monotonic()
        self.received.append((t, await request.json()))
        self.arrived.set()
        return web.Response(text="ok")

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, pred, timeout: float) -> tuple[float, dict[str, Any]] | None:
        """The first received alert (in arrival order) matching ``pred``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        seen = 0
        while True:
            for t, doc in self.received[seen:]:
                if pred(doc):
                    return t, doc
            seen = len(self.received)
            left = deadline - loop.time()
            if left <= 0:
                return None
            self.arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)


def alerts_yaml(hook: str, spool: Path) -> str:
    """Alerts straight out: no startup quiet, no grouping delay, no rate limit."""
    return f"""\
alerts:
  startup_quiet: 0s
  group_wait: 0s
  rate_limit_per_minute: 0
  spool_dir: {spool}
  webhook: {{urls: ["{hook}"]}}
"""


BENCH = Path(__file__).resolve().parent
CHILD = [PY, str(BENCH / "benchchild.py")]


def agent_cmd(args: Sequence[str], fake_gpus: int = 0) -> list[str]:
    """``rankwatch ARGS``, with ``fake_gpus`` scripted GPUs behind the real sampler when > 0."""
    if fake_gpus > 0:
        return [PY, str(BENCH / "fakegpu_agent.py"), str(fake_gpus), "--", *args]
    return [*RANKWATCH, *args]


def nvml_standin_state(gpus: int) -> str:
    """Busy, healthy readings for ``gpus`` GPUs in the stand-in's state-file format."""
    lines = [f"count {gpus}", "driver 550.54.15"]
    for g in range(gpus):
        lines += [
            f"gpu{g}.util {80 + g}",
            f"gpu{g}.mem_util 40",
            f"gpu{g}.mem_used {40 << 30}",
            f"gpu{g}.temp {60 + g}",
            f"gpu{g}.power_mw {600000 + g * 1000}",
            f"gpu{g}.field82 70",
            f"gpu{g}.violation0_ns 1000000",
            f"gpu{g}.field91 18",
            f"gpu{g}.gpm 1",
            f"gpu{g}.gpm2 80",
            f"gpu{g}.gpm5 50",
        ]
    return "\n".join(lines) + "\n"


def build_nvml_standin(out: Path) -> Path:
    """The NVML stand-in of tests/nvml_standin built into ``out`` (a GPU-less machine's NVML)."""
    import shutil

    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        sys.exit("gcc is needed to build the NVML stand-in (apt-get install gcc)")
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(out / "libnvidia-ml.so.1"),
         str(BENCH.parent / "tests" / "nvml_standin" / "nvml_standin.c"), "-lpthread"],
        check=True,
    )  # fmt: skip
    return out


def agent_cpu_seconds(pid: int) -> float:
    """User + system CPU of the agent process itself (all its threads), not of its children."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def read_json(path: Path, timeout: float = 30.0) -> Any:
    """A result file a child writes once at its end (poll: it may not be there yet)."""
    import json

    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not written within {timeout}s")
        time.sleep(0.05)


def cpu_load() -> str:
    """What else the machine is doing (other engineers' tests share these cores)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return f"load avg {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"


def mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"
