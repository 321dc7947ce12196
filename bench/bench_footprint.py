"""Agent footprint at steady state: one ``rankwatch watch`` agent watching 8 ranks.

    python bench/bench_footprint.py [--window 60] [--ranks 8] [--quick]

Eight fake ranks (``rankwatch.demo.trainer``, Megatron format, a step per second with its
memory lines, sleeping between steps) write their logs; one agent watches all of them
(``--log`` x8, ``--pid`` x8) with default intervals (process 1 s, logs 250 ms, GPU 5 s on 8
scripted GPUs behind the real sampler), a checkpoint watcher on an empty folder and the HTTP
server, scraped every 15 s as Prometheus would (that cost is included). After a warm-up
(10 s, 5 s in --quick) the agent's own CPU time (user + system of all its threads, not its
children: ``watch`` has none) is taken over the window (60 s, 20 s in --quick), with RSS
and USS sampled every second.

Targets (issue): CPU <= 1% of one core per watched rank; RSS <= 80 MB.

With ``--nvml-standin`` the 8 GPUs are the stand-in libnvidia-ml.so.1 of tests/nvml_standin
read through the real pynvml path, and ``nvitop-exporter`` (if installed) runs over the same
stand-in in the same window, scraped as often: the agent's CPU and RSS against it.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from benchlib import (
    PY,
    TRAINER,
    agent_cmd,
    agent_cpu_seconds,
    agent_env,
    build_nvml_standin,
    cpu_load,
    free_port,
    machine,
    mark,
    nvml_standin_state,
    scrape,
    start,
    stop,
    wait_http,
)

MB = 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="5 s warm-up, 20 s window")
    ap.add_argument(
        "--nvml-standin", action="store_true", help="real pynvml over the stand-in; nvitop-exporter beside"
    )
    a = ap.parse_args()
    window, warmup = (20.0, 5.0) if a.quick else (a.window, a.warmup)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ckpt").mkdir()
        ranks = []
        for r in range(a.ranks):
            cmd = [
                *TRAINER,
                "--rank",
                str(r),
                "--world-size",
                str(a.ranks),
                "--steps",
                "100000",
                "--step-time",
                "1.0",
                "--format",
                "megatron",
                "--color",
                "never",
            ]
            env = agent_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.ranks))
            ranks.append(start(cmd, stdout=root / f"rank-{r}.log", env=env))
        port = free_port()
        args = [
            "watch",
            "--listen",
            f"127.0.0.1:{port}",
            "--checkpoint-dir",
            str(root / "ckpt"),
            "--dumps-dir",
            str(root / "dumps"),
        ]
        for r, p in enumerate(ranks):
            args += ["--log", str(root / f"rank-{r}.log"), "--pid", str(p.pid)]
        env = agent_env()
        peer = None
        peer_port = 0
        if a.nvml_standin:
            lib = build_nvml_standin(root)
            (root / "nvml.txt").write_text(nvml_standin_state(a.ranks))
            env.update(LD_LIBRARY_PATH=str(lib), RANKWATCH_NVML_STANDIN=str(root / "nvml.txt"))
            cmd = agent_cmd(args)
            nvitop = shutil.which("nvitop-exporter") or str(Path(PY).parent / "nvitop-exporter")
            if Path(nvitop).exists():
                peer_port = free_port()
                peer = start([nvitop, "--bind-address", "127.0.0.1", "--port", str(peer_port)], env=env)
            else:
                print("nvitop-exporter not installed (pip install nvitop-exporter): no peer arm")
        else:
            cmd = agent_cmd(args, fake_gpus=a.ranks)
        agent = start(cmd, stdout=root / "agent.out", stderr=root / "agent.err", env=env)
        try:
            wait_http(port, agent, timeout=60)
            if peer is not None:
                wait_http(peer_port, peer, timeout=60)
            time.sleep(warmup)
            proc = psutil.Process(agent.pid)
            cpu0, t0 = agent_cpu_seconds(agent.pid), time.monotonic()
            peer_cpu0 = agent_cpu_seconds(peer.pid) if peer is not None else 0.0
            rss, uss, peer_rss = [], [], []
            next_scrape = t0
            while time.monotonic() < t0 + window:
                if time.monotonic() >= next_scrape:
                    scrape(port)
                    if peer is not None:
                        scrape(peer_port)
                    next_scrape += 15.0
                mi = proc.memory_full_info()
                rss.append(mi.rss)
                uss.append(mi.uss)
                if peer is not None:
                    peer_rss.append(psutil.Process(peer.pid).memory_info().rss)
                time.sleep(1.0)
            cpu1, t1 = agent_cpu_seconds(agent.pid), time.monotonic()
            peer_cpu1 = agent_cpu_seconds(peer.pid) if peer is not None else 0.0
            threads = proc.num_threads()
            text = scrape(port)
        finally:
            stop(agent)
            if peer is not None:
                stop(peer)
            for p in ranks:
                stop(p)
    cpu_pct = 100 * (cpu1 - cpu0) / (t1 - t0)
    per_rank = cpu_pct / a.ranks
    attached = sum(
        1 for line in text.splitlines() if line.startswith("rankwatch_process_up{") and line.endswith(" 1.0")
    )
    print(
        f"{a.ranks} ranks (a step/s each), {attached} processes attached, agent threads {threads}, "
        f"window {t1 - t0:.0f} s after {warmup:.0f} s warm-up  ({cpu_load()})"
    )
    print(
        f"agent CPU {cpu_pct:.2f}% of one core = {per_rank:.2f}% per rank; target <= 1% per rank: "
        f"{mark(per_rank <= 1.0)}"
    )
    print(
        f"agent memory: RSS max {max(rss) / MB:.1f} MB (end {rss[-1] / MB:.1f}), USS max {max(uss) / MB:.1f} MB; "
        f"target RSS <= 80 MB: {mark(max(rss) <= 80 * MB)}"
    )
    if peer_rss:
        peer_pct = 100 * (peer_cpu1 - peer_cpu0) / (t1 - t0)
        print(
            f"nvitop-exporter over the same {a.ranks} GPUs (GPU metrics only, no logs, no process): "
            f"CPU {peer_pct:.2f}% of one core, RSS max {max(peer_rss) / MB:.1f} MB"
        )
        print(
            f"rankwatch / nvitop-exporter: CPU {cpu_pct / max(peer_pct, 1e-9):.2f}, "
            f"RSS {max(rss) / max(peer_rss):.2f} (below 1: rankwatch ahead)"
        )


if __name__ == "__main__":
    main()
