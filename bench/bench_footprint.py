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
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import psutil

from benchlib import (
    TRAINER,
    agent_cmd,
    agent_cpu_seconds,
    agent_env,
    cpu_load,
    free_port,
    machine,
    mark,
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
        agent = start(
            agent_cmd(args, fake_gpus=a.ranks),
            stdout=root / "agent.out",
            stderr=root / "agent.err",
            env=agent_env(),
        )
        try:
            wait_http(port, agent, timeout=60)
            time.sleep(warmup)
            proc = psutil.Process(agent.pid)
            cpu0, t0 = agent_cpu_seconds(agent.pid), time.monotonic()
            rss, uss = [], []
            next_scrape = t0
            while time.monotonic() < t0 + window:
                if time.monotonic() >= next_scrape:
                    scrape(port)
                    next_scrape += 15.0
                mi = proc.memory_full_info()
                rss.append(mi.rss)
                uss.append(mi.uss)
                time.sleep(1.0)
            cpu1, t1 = agent_cpu_seconds(agent.pid), time.monotonic()
            threads = proc.num_threads()
            text = scrape(port)
        finally:
            stop(agent)
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


if __name__ == "__main__":
    main()
