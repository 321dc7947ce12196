"""The agent's CPU for following idle logs: each rank's logs are read off the event loop, one
hop to the rank's log thread per ``logs.poll_interval`` (sources/polled/logs.py).

    python bench/bench_follow_idle.py [--ranks 4] [--seconds 20] [--poll 0.25] [--quick]

One process, ``--ranks`` watchers (as ``rankwatch watch`` runs one per rank) each following
one log that does not grow, the process sampler set aside (an hour's interval): what is left
is the idle follow loop. Prints the process's CPU over the window, in % of one core and per
rank-poll. Run it with PYTHONPATH at another commit's ``agent/`` to compare versions. No
target of its own: the agent's budget per rank is ``bench_footprint.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from benchlib import machine
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.identity import Identity
from rankwatch.runtime.watcher import RankWatcher


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(ranks: int, seconds: float, poll: float) -> tuple[float, float]:
    root = Path(tempfile.mkdtemp(prefix="rw-follow-idle-"))
    conf = replaced(
        Config(),
        {
            "dumps.dir": str(root / "dumps"),
            "logs.format": "kv",
            "logs.poll_interval": poll,
            "process.sample_interval": 3600.0,
        },
    )
    watchers = []
    for r in range(ranks):
        log = root / f"rank-{r}.log"
        log.write_text("step=1 loss=2.5\n")
        ident = Identity(run="bench", rank=r, local_rank=r, world_size=ranks, node="n")
        watchers.append(RankWatcher(conf, ident, [log], emit=lambda f: None))
    tasks = [asyncio.create_task(w.run()) for w in watchers]
    await asyncio.sleep(1.0)  # start-up out of the window
    cpu0, t0 = _cpu(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, wall = _cpu() - cpu0, time.monotonic() - t0
    for w in watchers:
        w.stop()
    await asyncio.gather(*tasks)
    for w in watchers:
        w.close()
    return 100 * cpu / wall, 1e6 * cpu / (ranks * wall / poll)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--poll", type=float, default=0.25, help="logs.poll_interval")
    ap.add_argument("--quick", action="store_true", help="a 5 s window")
    a = ap.parse_args()
    seconds = 5.0 if a.quick else a.seconds
    print(f"machine: {machine()}")
    share, per_poll = asyncio.run(measure(a.ranks, seconds, a.poll))
    per_rank = share / a.ranks
    print(
        f"{a.ranks} idle ranks, poll {a.poll:g}s, {seconds:g}s window: {share:.3f}% of one core "
        f"({per_rank:.3f}% per rank), {per_poll:.0f} us per rank-poll"
    )


if __name__ == "__main__":
    main()
