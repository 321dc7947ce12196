"""A burst of NCCL_DEBUG=INFO-style lines from a ``rankwatch run`` child: never slowed, none lost.

    python bench/bench_burst.py [--rate 200000] [--seconds 10] [--pairs 2] [--quick]

The child (``benchchild.py burst``) writes ``--rate`` lines/s for ``--seconds`` (NCCL INFO
lines, a Megatron step line every 1000), paced in 5 ms ticks, to its stdout. Under
``rankwatch run`` that stdout is the agent's log file (no pipe), so the agent can fall
behind without ever blocking the writer. Bare runs write to a file in the same folder.
Runs alternate bare / agent (paired, so other load on the shared cores cancels).

Figures: the child's achieved write rate with vs without the agent (ratio; and how far it
ever fell behind its 5 ms schedule), the agent's ``rankwatch_log_lines_total`` once it has
caught up (must equal the lines written: none lost) and the catch-up time after the
child's last write. Targets: rate ratio >= 0.99 (the child is not slowed), no line lost,
the agent catches up (the time is reported; the issue sets no bound).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchlib import (
    CHILD,
    agent_cmd,
    agent_cpu_seconds,
    agent_env,
    cpu_load,
    free_port,
    machine,
    mark,
    metric_sum,
    read_json,
    scrape,
    start,
    stop,
    wait_http,
)


def bare(root: Path, tag: str, rate: float, seconds: float) -> dict:
    out = root / f"{tag}.json"
    p = start(
        [*CHILD, "burst", "--rate", str(rate), "--seconds", str(seconds), "--out", str(out), "--linger", "0"],
        stdout=root / f"{tag}.log",
        env=agent_env(),
    )
    p.wait(seconds + 60)
    return read_json(out, 10)


def with_agent(root: Path, tag: str, rate: float, seconds: float) -> tuple[dict, float | None, float, float]:
    """(child figures, catch-up seconds or None, lines counted, agent CPU seconds over the burst)."""
    out = root / f"{tag}.json"
    done = root / f"{tag}.done"
    port = free_port()
    child = [
        *CHILD,
        "burst",
        "--rate",
        str(rate),
        "--seconds",
        str(seconds),
        "--out",
        str(out),
        "--done",
        str(done),
    ]
    args = [
        "run",
        "--listen",
        f"127.0.0.1:{port}",
        "--dumps-dir",
        str(root / "dumps"),
        "--set",
        f"runner.log_file={root / tag}.log",
        "--set",
        "process.sample_interval=1s",
        "--",
        *child,
    ]
    # The burst starts as soon as the child does, i.e. while the agent still imports its
    # services: the worst moment, and the real one (NCCL init prints its flood at start).
    p = start(
        agent_cmd(args, fake_gpus=1), stdout=root / f"{tag}.echo", stderr=root / f"{tag}.err", env=agent_env()
    )
    try:
        wait_http(port, p, timeout=60)
        doc = read_json(out, seconds + 60)
        cpu = agent_cpu_seconds(p.pid)
        counted = 0.0
        caught = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            counted = metric_sum(scrape(port), "rankwatch_log_lines_total")
            if counted >= doc["lines"]:
                caught = time.monotonic() - doc["t_end"]
                break
            time.sleep(0.05)
        return doc, caught, counted, cpu
    finally:
        done.touch()
        stop(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1 pair of 4 s bursts")
    a = ap.parse_args()
    pairs, seconds = (1, 4.0) if a.quick else (a.pairs, a.seconds)
    print(f"machine: {machine()}")
    print(
        f"burst: {a.rate:,.0f} lines/s for {seconds:.0f} s ({a.rate * seconds:,.0f} lines), {pairs} pair(s)"
    )
    ratios, lost, catch = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(pairs):
            order = ("bare", "agent") if i % 2 == 0 else ("agent", "bare")
            res: dict = {}
            for arm in order:
                if arm == "bare":
                    res[arm] = bare(root, f"b{i}", a.rate, seconds)
                else:
                    res[arm] = with_agent(root, f"a{i}", a.rate, seconds)
            b = res["bare"]
            doc, caught, counted, cpu = res["agent"]
            ratios.append(doc["rate"] / b["rate"])
            lost.append(doc["lines"] - counted)
            catch.append(caught if caught is not None else float("inf"))
            print(
                f"pair {i + 1}: child rate without {b['rate']:,.0f} lines/s (behind schedule max "
                f"{b['behind_max_s'] * 1000:.1f} ms), with agent {doc['rate']:,.0f} lines/s (max "
                f"{doc['behind_max_s'] * 1000:.1f} ms), ratio {ratios[-1]:.4f}; agent counted {counted:,.0f} of "
                f"{doc['lines']:,} lines, caught up {catch[-1]:.1f} s after the last write (agent CPU "
                f"{cpu:.1f} s by the burst's end)  ({cpu_load()})"
            )
    med = statistics.median(ratios)
    print(f"child write rate with/without agent: median ratio {med:.4f}; target >= 0.99: {mark(med >= 0.99)}")
    ok = all(x == 0 for x in lost) and all(c != float("inf") for c in catch)
    print(
        f"no line lost, agent caught up (max {max(catch):.1f} s after the burst; "
        f"~{a.rate * seconds / (seconds + max(catch)):,.0f} lines/s sustained): {mark(ok)}"
    )


if __name__ == "__main__":
    main()
