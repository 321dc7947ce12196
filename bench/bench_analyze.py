"""Throughput of `rankwatch analyze` on a mixed log, against a floor measured in the same run.

    python bench/bench_analyze.py [--lines 2000000] [--keep] [--quick] [--files N] [--gzip]

The log is step lines (Megatron format, one every 50 lines) among NCCL_DEBUG=INFO noise
(``--mix varied`` adds DeepSpeed warnings that have to go through the parsers; ``--gzip``
compresses it). The floor is the least any log tool must do: read the lines and apply one
compiled regex. Targets (issue 2): >= 50% of the floor's rate and
>= 200,000 lines/s. Both ways analyze runs are timed: ``-j 1`` (everything in one process)
and the default, where a file of 64 MiB or more is read by a second process while the
first parses, when there is a second core. Each process's CPU time is printed too: on a
shared machine it compares versions where wall clock cannot.
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import random
import re
import resource
import tempfile
import time
from pathlib import Path

from rankwatch.analyze import PREFETCH_COMPRESSED_MIN_BYTES, PREFETCH_MIN_BYTES, analyze
from rankwatch.config.schema import Config


def write_log(path: Path, n: int, mix: str = "nccl") -> int:
    noise = [
        "gpu-node01:41200:41260 [0] NCCL INFO Channel {c:02d}/32 :    0   1   2   3   4   5   6   7",
        "gpu-node01:41200:41260 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "gpu-node01:41200:41261 [0] NCCL INFO AllReduce: opCount {c:x} sendbuff 0x7f3a1c000000 recvbuff "
        "0x7f3a1c000000 count 131334144 datatype 9 op 0 root 0 comm 0x5581c2d0 [nranks=8] stream 0x55823f10",
        "gpu-node01:41200:41260 [0] NCCL INFO Connected all trees",
        "[2026-11-20 09:00:00,123] [WARNING] [stage3.py:2069:step] 1 pytorch allocator cache flushes since last step.",
    ]
    if mix == "nccl":
        noise = [x for x in noise if "NCCL INFO" in x]
    written = 0
    rng = random.Random(0)  # a healthy run's values, different on every line as in a real log
    with open(path, "w") as f:
        step = 0
        for i in range(n):
            if i % 50 == 0:
                step += 1
                ms = 1532.4 + rng.gauss(0, 15)
                lr = 3e-4 * (0.55 + 0.45 * math.cos(math.pi * step / 500000))
                loss = 2.5 + 2.0 / (1 + step / 2000) + rng.gauss(0, 0.03)
                f.write(
                    f" [2026-11-20 09:00:00] iteration {step:>8}/  500000 | consumed samples: {step * 256:>12} | "
                    f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): "
                    f"{178.3 * 1532.4 / ms:.1f} | learning rate: {lr:.6E} | global batch size:   256 | "
                    f"lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {0.45 + rng.gauss(0, 0.04):.3f} | "
                    "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
                )
            else:
                f.write(noise[i % len(noise)].format(c=i % 32) + "\n")
            written += 1
    return written


def floor(path: Path) -> float:
    rx = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*lm loss: ([0-9.E+-]+)")
    t0 = time.perf_counter()
    hits = 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            if rx.search(line):
                hits += 1
    assert hits > 0
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--quick", action="store_true", help="300,000 lines, best of 2")
    ap.add_argument(
        "--files",
        type=int,
        default=1,
        help="N rank files of --lines each: also time them with one worker process per core (-j)",
    )
    ap.add_argument(
        "--mix",
        choices=("nccl", "varied"),
        default="nccl",
        help="nccl: step lines among NCCL_DEBUG=INFO noise (the issue's mix); varied: 1 in 5 noise lines "
        "is a DeepSpeed warning that must be parsed",
    )
    ap.add_argument(
        "--gzip",
        action="store_true",
        help="the log gzip-compressed (level 6): analyze and the floor both read it through zlib",
    )
    args = ap.parse_args()
    if args.quick:
        args.lines, args.repeat = 300_000, 2
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-"))
    path = tmp / "rank-0.log"
    n = write_log(path, args.lines, args.mix)
    text_size = path.stat().st_size
    if args.gzip:
        packed = path.with_name(path.name + ".gz")
        with open(path, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        path.unlink()
        path = packed
    size = path.stat().st_size
    least = PREFETCH_COMPRESSED_MIN_BYTES if args.gzip else PREFETCH_MIN_BYTES  # as analyze decides
    cfg = Config()

    cpu: dict[int | None, tuple[float, float]] = {}  # jobs -> least CPU s of (this process, the reader)

    def used(who: int) -> float:
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    def timed(jobs: int | None) -> float:
        c0, r0 = used(resource.RUSAGE_SELF), used(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        res = analyze([str(path)], cfg, jobs=jobs)
        took = time.perf_counter() - t0
        own, reader = used(resource.RUSAGE_SELF) - c0, used(resource.RUSAGE_CHILDREN) - r0
        best_own, best_reader = cpu.get(jobs, (math.inf, math.inf))
        cpu[jobs] = (min(best_own, own), min(best_reader, reader))
        assert res.ranks[0].steps == n // 50, res.ranks[0].steps
        return took

    # Interleaved, best of each: a machine that speeds up or slows down during the run
    # moves all three alike.
    best_floor = one = best = float("inf")
    for _ in range(args.repeat):
        best_floor = min(best_floor, floor(path))
        one = min(one, timed(1))
        best = min(best, timed(None))
    rate, frate = n / best, n / best_floor
    packed_note = f", gzip-compressed to {size / 1e6:.0f} MB" if args.gzip else ""
    print(f"log: {n:,} lines, {text_size / 1e6:.0f} MB{packed_note}, mix={args.mix} ({os.cpu_count()} cpus)")
    print(f"floor (read + 1 regex): {frate:,.0f} lines/s  ({best_floor:.2f} s)")
    print(
        f"rankwatch analyze -j 1: {n / one:,.0f} lines/s  ({one:.2f} s, one process; ratio {best_floor / one:.2f})"
    )
    print(
        f"rankwatch analyze:      {rate:,.0f} lines/s  ({best:.2f} s"
        + (", read by a second process)" if size >= least and (os.cpu_count() or 1) > 1 else ")")
    )
    print(f"ratio to floor: {rate / frate:.2f}  (target >= 0.50)")
    # On a shared machine wall clock says more about the neighbours than about analyze: the
    # least CPU time of each process is what to compare between versions.
    print(
        f"CPU (least of {args.repeat}): -j 1 {cpu[1][0]:.2f} s; default: parsing process {cpu[None][0]:.2f} s, "
        f"reader process {cpu[None][1]:.2f} s; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"1 GB (of text) estimate: {1e9 / text_size * best:.0f} s")
    print(
        f"target >= 200,000 lines/s: {'PASS' if rate >= 200_000 else 'MISS'}; "
        f"ratio >= 0.5: {'PASS' if rate / frate >= 0.5 else 'MISS'}"
    )
    if args.files > 1:
        paths = [str(path)]
        for r in range(1, args.files):
            other = tmp / f"rank-{r}.log"
            other.write_bytes(path.read_bytes())
            paths.append(str(other))
        times = {}
        for jobs in (1, None):
            best_n = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                analyze(paths, cfg, jobs=jobs)
                best_n = min(best_n, time.perf_counter() - t0)
            times[jobs] = best_n
        total = n * args.files
        print(
            f"{args.files} files, {total:,} lines: one process {total / times[1]:,.0f} lines/s "
            f"({times[1]:.2f} s); workers (-j {min(args.files, os.cpu_count() or 1)}) "
            f"{total / times[None]:,.0f} lines/s ({times[None]:.2f} s); speed-up {times[1] / times[None]:.2f}x"
        )
        for extra in paths[1:]:
            Path(extra).unlink()
    if not args.keep:
        path.unlink()
        tmp.rmdir()


if __name__ == "__main__":
    main()
