"""rankwatch's /metrics side by side with the exporters people run today, in one run.

- GPU: rankwatch (`rankwatch run`, 8 GPUs through the real NvmlBackend and pynvml) against
  `nvitop-exporter` (PyPI), both over the same stand-in libnvidia-ml.so.1
  (tests/nvml_standin) with the same 8 GPUs: scrape p50/p99, CPU per scrape, RSS.
- Host: rankwatch's /metrics against Debian's `prometheus-node-exporter`: p99 per series, RSS.

Scrapes alternate between the exporters so that both see the same machine load; every
ratio is rankwatch / peer from this one run (lower is better for all of them).

Light (issue 30): in the same run a "floor" process imports the agent's own stack
(aiohttp.web, prometheus_client, psutil, yaml, pynvml, watchdog.observers) and does
nothing; rankwatch's RSS is set against it (target: within 10%), and its idle CPU (between
scrapes, over the idle window) against nvitop-exporter's (target: no higher); the stand-in
counts each process's NVML calls (RANKWATCH_NVML_STANDIN_CALLS), printed per second over the
same window with the most frequent functions. rankwatch
runs from a byte-compiled copy of the package it would import, as a pip install leaves it:
the peers' site-packages are byte-compiled, and a tree run with PYTHONDONTWRITEBYTECODE
compiles every module at each start (about 1 MB more RSS).
Needs gcc, `pip install nvitop-exporter` and `apt-get install prometheus-node-exporter`;
a peer that is missing is reported as such and skipped.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from benchlib import (
    PY,
    RANKWATCH,
    agent_env,
    build_nvml_standin,
    cpu_load,
    free_port,
    machine,
    mark,
    nvml_standin_state,
    pct,
    scrape,
    start,
    stop,
    wait_http,
)

# What the agent imports of its dependencies (the floor the issue measures against).
STACK = ("aiohttp.web", "prometheus_client", "psutil", "yaml", "pynvml", "watchdog.observers")


def installed_copy(tmp: Path) -> str:
    """The rankwatch package this interpreter imports, copied and byte-compiled into ``tmp``:
    what a wheel install leaves (pip compiles at install); returns the folder for PYTHONPATH."""
    import rankwatch

    site = tmp / "site"
    shutil.copytree(
        Path(rankwatch.__file__).parent, site / "rankwatch", ignore=shutil.ignore_patterns("__pycache__")
    )
    compileall.compile_dir(str(site / "rankwatch"), quiet=1, legacy=False)
    return str(site)


def rss_mb(pid: int) -> float:
    """RSS of the exporter process itself (for rankwatch: not the watched job it launched)."""
    return psutil.Process(pid).memory_info().rss / 2**20


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def cpu_ns(pid: int) -> dict[str, int] | None:
    """CPU time of each of ``pid``'s live threads in ns, by thread id
    (``/proc/PID/task/*/schedstat``: exact, where ``cpu_times`` counts 10 ms ticks, ~5 of them
    in a 5 s idle window); None off Linux."""
    out: dict[str, int] = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),  # ended meanwhile
                open(f"/proc/{pid}/task/{tid}/schedstat") as fh,
            ):
                out[tid] = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return out


def spent_ns(before: dict[str, int], after: dict[str, int]) -> tuple[int, int]:
    """CPU time between two ``cpu_ns`` readings, and how many threads ended in between (what
    they used after the first reading is not counted: a kept thread that ends has idled for
    its ``LANE_IDLE_S``)."""
    total = sum(ns - before.get(tid, 0) for tid, ns in after.items())
    return total, len(before.keys() - after.keys())


def series_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def measure(arms: dict[str, tuple[int, int]], n: int) -> dict[str, dict[str, float]]:
    """Scrape the arms round-robin ``n`` times each: latency, CPU of the exporter per scrape."""
    lat: dict[str, list[float]] = {a: [] for a in arms}
    cpu0 = {a: cpu_s(pid) for a, (_, pid) in arms.items()}
    wall0 = time.monotonic()
    size: dict[str, int] = {}
    for _ in range(n):
        for a, (port, _pid) in arms.items():
            t = time.perf_counter()
            text = scrape(port)
            lat[a].append(time.perf_counter() - t)
            size[a] = series_count(text)
    wall = time.monotonic() - wall0
    out: dict[str, dict[str, float]] = {}
    for a, (_port, pid) in arms.items():
        used = cpu_s(pid) - cpu0[a]
        out[a] = {
            "p50_ms": pct(lat[a], 50) * 1e3,
            "p99_ms": pct(lat[a], 99) * 1e3,
            "cpu_ms_per_scrape": used / n * 1e3,
            "idle_cpu_pct": 0.0,
            "series": float(size[a]),
            "rss_mb": rss_mb(pid),
            "wall_s": wall,
        }
    return out


def nvml_calls(calls_dir: Path, pid: int) -> dict[str, int]:
    """The stand-in's call counts of process ``pid`` by NVML function (written once a second)."""
    try:
        text = (calls_dir / f"calls-{pid}.txt").read_text()
    except OSError:
        return {}
    return {fn: int(n) for fn, n in (line.split() for line in text.splitlines() if line)}


def idle_cpu(
    arms: dict[str, tuple[int, int]], seconds: float, calls_dir: Path
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """CPU share of one core each exporter uses between scrapes (its own sampling loop), and
    the NVML calls per second it makes meanwhile, by function."""
    c0 = {a: cpu_s(pid) for a, (_, pid) in arms.items()}
    e0 = {a: cpu_ns(pid) for a, (_, pid) in arms.items()}
    n0 = {a: nvml_calls(calls_dir, pid) for a, (_, pid) in arms.items()}
    time.sleep(seconds)
    cpu = {a: (cpu_s(pid) - c0[a]) / seconds * 100 for a, (_, pid) in arms.items()}
    for a, (_, pid) in arms.items():
        before, after = e0[a], cpu_ns(pid)
        if before is None or after is None:
            continue  # ticks, then
        used, ended = spent_ns(before, after)
        cpu[a] = used / 1e9 / seconds * 100
        if ended:
            print(f"  {a}: {ended} thread(s) ended in the idle window (their last moments not counted)")
    rates: dict[str, dict[str, float]] = {}
    for a, (_, pid) in arms.items():
        n1 = nvml_calls(calls_dir, pid)
        if n1:
            rates[a] = {fn: (n - n0[a].get(fn, 0)) / seconds for fn, n in n1.items() if n > n0[a].get(fn, 0)}
    return cpu, rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="60 scrapes, 30 s idle window")
    ap.add_argument("--idle", type=float, help="idle window in seconds (default 60, --quick 30)")
    args = ap.parse_args()
    n = 60 if args.quick else args.scrapes
    # CPU time is counted in 10 ms ticks and the peers use ~1% of a core: a 5 s window holds
    # ~5 ticks each, too few to rank two exporters.
    idle_s = args.idle or (30.0 if args.quick else 60.0)
    print(f"machine: {machine()}")
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-gpu-"))
    lib = build_nvml_standin(tmp)
    state = tmp / "nvml-state.txt"
    state.write_text(nvml_standin_state(args.gpus))
    calls_dir = tmp / "nvml-calls"
    calls_dir.mkdir()
    env = agent_env(
        RANKWATCH_NVML_STANDIN=str(state),
        RANKWATCH_NVML_STANDIN_CALLS=str(calls_dir),
        LD_LIBRARY_PATH=str(lib),
    )
    site = installed_copy(tmp)
    rw_env = dict(env, PYTHONPATH=os.pathsep.join(x for x in (site, env.get("PYTHONPATH")) if x))
    procs: list[subprocess.Popen] = []
    arms: dict[str, tuple[int, int]] = {}
    floor: subprocess.Popen | None = None
    try:
        code = f"import signal, {', '.join(STACK)}; signal.pause()"
        floor = start([PY, "-c", code], env=env, stderr=tmp / "floor.err")
        procs.append(floor)
        port = free_port()
        devices = ", ".join(str(i) for i in range(args.gpus))
        cfg = tmp / "rw.yaml"
        cfg.write_text(
            "run: {name: bench}\n"
            f"gpu: {{interval: 1s, devices: [{devices}]}}\n"
            f"runner: {{log_dir: {tmp / 'logs'}}}\n"
            f"dumps: {{dir: {tmp / 'dumps'}}}\n"
            f'server: {{listen: "127.0.0.1:{port}"}}\n'
        )
        rw = start([*RANKWATCH, "run", "--config", str(cfg), "--", PY, "-c", "import time; time.sleep(3600)"],
                   env=rw_env, stderr=tmp / "rankwatch.err")  # fmt: skip
        procs.append(rw)
        wait_http(port, rw)
        arms["rankwatch"] = (port, rw.pid)

        nvitop = shutil.which("nvitop-exporter") or str(Path(PY).parent / "nvitop-exporter")
        if os.path.exists(nvitop):
            p2 = free_port()
            nv = start([nvitop, "--bind-address", "127.0.0.1", "--port", str(p2), "--interval", "1"],
                       env=env, stderr=tmp / "nvitop.err")  # fmt: skip
            procs.append(nv)
            wait_http(p2, nv)
            arms["nvitop-exporter"] = (p2, nv.pid)
        else:
            print("nvitop-exporter: not installed (pip install nvitop-exporter); skipped")

        node = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
        if node:
            p3 = free_port()
            ne = start([node, f"--web.listen-address=127.0.0.1:{p3}"], stderr=tmp / "node.err")
            procs.append(ne)
            wait_http(p3, ne)
            arms["node-exporter"] = (p3, ne.pid)
        else:
            print("node_exporter: not installed (apt-get install prometheus-node-exporter); skipped")

        time.sleep(3.0)  # both GPU exporters have sampled a few times
        for a in arms:
            scrape(arms[a][0])  # warm
        idle, calls = idle_cpu(arms, idle_s, calls_dir)
        idle_rss = {a: rss_mb(pid) for a, (_port, pid) in arms.items()}
        floor_rss = rss_mb(floor.pid) if floor.poll() is None else float("nan")
        threads = psutil.Process(rw.pid).num_threads()
        res = measure(arms, n)
        for a in arms:
            res[a]["idle_cpu_pct"] = idle[a]
            res[a]["idle_rss_mb"] = idle_rss[a]
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)  # the stand-in build, the copy, logs: ~10 MB a run

    print(f"\n{args.gpus} GPUs on the NVML stand-in; {n} scrapes per exporter, round-robin")
    print(f"{'exporter':<18}{'series':>8}{'p50 ms':>9}{'p99 ms':>9}{'us/series p99':>15}"
          f"{'CPU ms/scrape':>15}{'idle CPU %':>12}{'RSS MB':>9}")  # fmt: skip
    for a, r in res.items():
        print(
            f"{a:<18}{r['series']:>8.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
            f"{r['p99_ms'] / r['series'] * 1e3:>15.1f}{r['cpu_ms_per_scrape']:>15.2f}"
            f"{r['idle_cpu_pct']:>12.2f}{r['rss_mb']:>9.1f}"
        )
    rw = res["rankwatch"]
    print(f"\nlight (idle window {idle_s:.0f} s before the scrapes; {cpu_load()} at the end)")
    print(f"  floor: a process importing {', '.join(STACK)}: RSS {floor_rss:.1f} MB")
    ratio = rw["idle_rss_mb"] / floor_rss
    print(f"  rankwatch RSS at idle {rw['idle_rss_mb']:.1f} MB ({threads} threads) = {ratio:.2f} x floor; "
          f"target <= 1.10: {mark(ratio <= 1.10)}")  # fmt: skip
    if "nvitop-exporter" in res:
        nv = res["nvitop-exporter"]
        cpu_ratio = rw["idle_cpu_pct"] / max(nv["idle_cpu_pct"], 1e-9)
        print(f"  idle CPU rankwatch {rw['idle_cpu_pct']:.2f}% vs nvitop-exporter {nv['idle_cpu_pct']:.2f}% "
              f"= {cpu_ratio:.2f}; target <= 1.00: {mark(cpu_ratio <= 1.0)}")  # fmt: skip
        print(
            f"  nvitop-exporter RSS at idle {nv['idle_rss_mb']:.1f} MB = {nv['idle_rss_mb'] / floor_rss:.2f} x floor"
        )
    for a, rates in calls.items():
        top = ", ".join(
            f"{fn.removeprefix('nvmlDevice')} {r:.0f}"
            for fn, r in sorted(rates.items(), key=lambda x: -x[1])[:6]
        )
        print(f"  NVML calls/s at idle, {a}: {sum(rates.values()):.0f} ({top}, ...)")
    for peer in ("nvitop-exporter", "node-exporter"):
        if peer not in res:
            continue
        p = res[peer]
        print(f"\nrankwatch / {peer} (below 1: rankwatch ahead)")
        print(f"  scrape p50            {rw['p50_ms'] / p['p50_ms']:.2f}")
        print(f"  scrape p99            {rw['p99_ms'] / p['p99_ms']:.2f}")
        print(f"  p99 per series        {(rw['p99_ms'] / rw['series']) / (p['p99_ms'] / p['series']):.2f}")
        print(f"  CPU per scrape        {rw['cpu_ms_per_scrape'] / max(p['cpu_ms_per_scrape'], 1e-9):.2f}")
        print(f"  RSS                   {rw['rss_mb'] / p['rss_mb']:.2f}")


if __name__ == "__main__":
    main()
