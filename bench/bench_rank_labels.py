"""Rank labels from log text stay bounded (issue 26 item 6).

    python bench/bench_rank_labels.py [--prefixes 20000] [--world N]

One watched log holds ``--prefixes`` forged ``[rankN]:`` prefixes (three step lines each, as
torchrun ``--tee`` writes them). Printed: the rank label sets (engines) the agent keeps, the
size of ``/metrics`` and the time to render it, the lines refused, and the process's peak
RSS. Without ``--world`` the world size is unknown and ``logs.max_ranks`` (1024) bounds the
ranks; with it, a rank outside the world is refused. No target in the issue beyond "bounded";
measured 2026-11-28 on the shared 2-core dev box (other sessions' tests running, load avg
~4.2), 20,000 prefixes, before (PYTHONPATH at the base commit's agent/) -> after:

    before (every prefix a rank):  20,000 label sets, /metrics 6.70 MB in 2979 ms, lines fed in 11.3 s, RSS 684 MiB
    after, world unknown:           1,024 label sets, /metrics 0.34 MB in 95 ms, lines fed in 0.7 s, RSS 84 MiB
    after, world of 2:                  2 label sets, /metrics 0.01 MB in 2 ms, lines fed in 0.3 s, RSS 55 MiB
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from benchlib import machine
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.exporter import render
from rankwatch.identity import Identity
from rankwatch.runtime.agent import Agent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefixes", type=int, default=20_000)
    ap.add_argument("--world", type=int, default=None)
    a = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cfg = replaced(Config(), {"dumps.dir": str(d / "dumps")})
        ident = Identity(run="t", rank=0, local_rank=0, world_size=a.world, node="n")
        agent = Agent(cfg, ident)
        w = agent.add_watcher([d / "rank-0.log"], ident)
        with (d / "rank-0.log").open("w") as fh:
            for s in (1, 2, 3):
                fh.writelines(f"[rank{r}]: step={s} loss={2.5 - s * 0.001:.4f}\n" for r in range(a.prefixes))
        stream = w.streams[0]
        t = time.perf_counter()
        w.feed_lines(stream, stream.follower.read_available())  # every line, none shed
        fed = time.perf_counter() - t
        t = time.perf_counter()
        body = render(agent)
        took = time.perf_counter() - t
        refused = getattr(stream.parser.stats, "rank_refused", 0)  # 0 before the bound existed
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{a.prefixes:,} prefixes, world {a.world or 'unknown'}: {len(w.engines):,} rank label sets; "
            f"/metrics {len(body) / 1e6:.2f} MB rendered in {took * 1000:.0f} ms; {refused:,} lines "
            f"refused; lines fed in {fed:.1f} s; peak RSS {rss:.0f} MiB"
        )


if __name__ == "__main__":
    main()
