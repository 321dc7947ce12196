"""A burst of NCCL_DEBUG=INFO-style lines from a ``rankwatch run`` child: never slowed, none lost.

    python bench/bench_burst.py [--rate 200000] [--seconds 10] [--pairs 2] [--quick]
    python bench/bench_burst.py --latency [--lines 2000000] [--cr | --plain | --steps] [--echo-to FILE | --drain MB/s]

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

``--latency``: the loop under a backlog. Once the agent serves, the child writes ``--lines``
lines (2M) as fast as it can, in 1000-line writes (NCCL INFO lines, a Megatron step line
every 1000), with a NaN step line in the middle; ``--cr`` makes half of them CR-only
progress-bar redraws, ``--plain`` application INFO lines (which, unlike NCCL INFO chatter,
are parsed). While the agent works through the backlog, one thread asks
``/healthz`` every 50 ms and another scrapes ``/metrics`` every 0.5 s (each waits as long as
the answer takes). Figures: p50/p99/max of both, the NaN-to-finding latency (the NaN write,
then its line in ``--findings-jsonl``), and when the agent has counted every line. Target
(the Helm liveness probe: 1 s timeout): /healthz p99 < 1 s; NaN found within 5 s.

Measured 2026-11-25 on the shared 2-core dev box (load avg 8-10 from other work, so absolute
figures are pessimistic), before (876ace6) -> after, one run each:

    burst (2M lines)               /healthz p99 (max)          NaN-to-finding    all lines counted
    NCCL INFO, echo to a file      494 (591) ms -> 55 (67) ms   17.0 s -> 2.5 s   37.2 s -> 4.4 s
    NCCL INFO, stdout 10 MB/s      356 (20044) ms -> 94 (100)   32.8 s -> 3.5 s   49.3 s -> 7.4 s
    half CR-only redraws           431 (435) ms -> 274 (300)    19.6 s -> 5.7 s   34.8 s -> 11.6 s
    application INFO (--plain)     723 (798) ms -> 660 (761)    32.2 s -> 32.8 s  69.4 s -> 57.5 s

At load avg ~2 (same box, later): NCCL INFO to a file 207 ms -> 30 ms p99, NaN 5.7 s -> 0.8 s,
counted 13.1 s -> 1.1 s; stdout a pipe nobody reads (``--drain 0``; before: the agent froze for
good) p99 10 ms, NaN 0.7 s; plain 185-242 ms -> 204-345 ms p99, NaN 8.8-12.3 s -> 10.9-12.1 s
(two runs each: unchanged within the noise).

``--steps`` (issue 26): 2M short key=value step lines (~75 MB), every one a record, written
as fast as the child can, then a NaN step after the burst. Also printed: the agent's peak RSS
(``VmHWM``), how many 1 s ``/healthz`` probes (one a second, the Helm liveness probe's
timeout) failed, the largest loop lag seen (the lag gauge and the slowest ``/healthz``
answer) and the NaN-after-burst latency. Targets: RSS <= 150 MiB, no failed probe, lag <= 1 s,
NaN <= 2 s. Measured 2026-11-28 on the shared 2-core dev box (other sessions running, load avg
1.3-2.4), one run each, before (the whole backlog parsed line by line) -> after (reads of
``logs.read_bytes_per_turn``, shed while more than ``logs.shed_backlog`` is unread):

    peak RSS 73 -> 56 MiB; failed 1 s probes 0 of 67 -> 0 of 4; max loop lag 0.51 -> 0.18 s;
    NaN after the burst found 65.5 s -> 1.5 s later (every line counted 65.5 s -> 1.5 s after)

The other bursts with shedding (same day, load avg 2.5-3.8, one run each; the NaN is in the
middle of these): NCCL INFO to a file /healthz p99 23 ms, NaN 0.58 s, counted 0.6 s; half CR
redraws p99 87 ms, NaN 1.25 s, counted 2.3 s; application INFO (--plain) p99 53 ms, NaN
1.35 s, counted 2.4 s (was 10.9-32.8 s and 57-69 s: these lines are parsed, so shedding
helps them most). No failed 1 s probe in any; peak RSS 54-56 MiB.

The plain burst is bound by parsing speed (timestamp stripping in ``sources.decorations``
dominates a profile): the loop stays responsive but a NaN behind 1M such lines waits its turn.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchlib import (
    CHILD,
    PY,
    RANKWATCH,
    agent_cmd,
    agent_cpu_seconds,
    agent_env,
    cpu_load,
    free_port,
    machine,
    mark,
    metric_sum,
    pct,
    read_json,
    scrape,
    start,
    stop,
    wait_http,
)

# The latency child: waits for --go, writes the burst as fast as it can, stamps the NaN write.
BURST_CHILD = r"""
import json, os, sys, time
lines, go, stamps, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
cr = kind == "cr"
def step(n, loss):
    return (" [2026-01-01 00:00:00] iteration %8d/ 1000000 | consumed samples: %12d | elapsed time per "
            "iteration (ms): 5.0 | learning rate: 3.000000E-04 | global batch size:    64 | lm loss: %s | "
            "loss scale: 1.0 | grad norm: 0.900 | number of skipped iterations:   0 |\n") % (n, n * 64, loss)
nccl = ["gpu-node01:41200:41260 [0] NCCL INFO Channel %02d/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n" % (i % 32)
        for i in range(999)]
if kind == "plain":
    nccl = ["2026-01-01 00:00:00,123 - data - INFO - shard %d: fetched batch %d (%d samples)\n" % (i % 7, i, 64)
            for i in range(999)]
# --steps: short key=value step lines, every one a record (~38 bytes: 2M lines ~ 75 MB)
losses = ["%.6f" % (2.6 + (i % 97) / 1000.0) for i in range(1000)]
bar = ["%3d%%|######    | %d/999 [00:01<00:00, 900.00it/s]\r" % (i // 10, i) for i in range(999)]
while not os.path.exists(go):
    time.sleep(0.01)
t0 = time.monotonic()
t_nan = None
blocks = lines // 1000
for b in range(blocks):
    nan = b == blocks // 2 and kind != "steps"
    if kind == "steps":
        base = b * 1000 + 1
        os.write(1, "".join(["step=%d loss=%s lr=3.0e-04\n" % (base + i, losses[i]) for i in range(1000)]).encode())
        continue
    body = "".join(bar if cr and b % 2 else nccl)
    os.write(1, (step(b + 1, "nan" if nan else "%E" % (2.6 + 1.0 / (b + 1))) + body).encode())
    if nan:
        t_nan = time.monotonic()
t1 = time.monotonic()
total = blocks * 1000
if kind == "steps":  # the NaN after the burst: how long a finding waits behind the backlog
    os.write(1, b"step=%d loss=nan lr=3.0e-04\n" % (blocks * 1000 + 1))
    t_nan = time.monotonic()
    total += 1
with open(stamps, "w") as f:
    json.dump({"lines": total, "t0": t0, "t_nan": t_nan, "t_end": t1, "nan_step": blocks // 2 + 1}, f)
while True:
    time.sleep(60)
"""


class Prober(threading.Thread):
    """Asks ``url`` every ``every`` seconds; each answer's latency, however long it takes."""

    def __init__(self, url: str, every: float, timeout: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.timeout = url, every, timeout
        self.latencies: list[float] = []
        self.failures = 0
        self.bodies: list[str] = []
        self.keep = False
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
                    body = r.read()
                if self.keep:
                    self.bodies.append(body.decode())
                self.latencies.append(time.monotonic() - t)
            except OSError:  # a timeout, a refusal, a 503
                self.failures += 1
                self.latencies.append(time.monotonic() - t)
            self.halt.wait(max(0.0, self.every - (time.monotonic() - t)))


class PeakRss(threading.Thread):
    """The agent's own peak resident memory (``VmHWM``; its child, the rank, is not counted)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.kib = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            self._read()
        self._read()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.kib = max(self.kib, int(line.split()[1]))

    def peak_mib(self) -> float:
        return self.kib / 1024


class SlowReader(threading.Thread):
    """The agent's stdout as a pipe read at ``rate`` bytes/s: a terminal over ssh, a busy
    ``| tee``, srun's output channel. 0: never read (the pipe fills and stays full)."""

    def __init__(self, fd: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.fd, self.rate = fd, rate
        self.read = 0

    def run(self) -> None:
        if self.rate <= 0:
            return
        chunk = 64 << 10
        with contextlib.suppress(OSError):
            while data := os.read(self.fd, chunk):
                self.read += len(data)
                time.sleep(len(data) / self.rate)


def latency(lines: int, kind: str, echo_to: str, drain: float | None) -> None:
    print(f"machine: {machine()}")
    print(f"latency: {lines:,} lines ({kind}) written at full speed, NaN in the middle")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        child = root / "child.py"
        child.write_text(BURST_CHILD)
        go, stamps, found = root / "go", root / "stamps.json", root / "findings.jsonl"
        port = free_port()
        args = [
            "run", "--listen", f"127.0.0.1:{port}", "--dumps-dir", str(root / "dumps"),
            "--findings-jsonl", str(found),
            "--set", f"runner.log_file={root / 'rank-0.log'}", "--set", "gpu.enabled=false",
            "--set", "process.sample_interval=1s",
            "--", PY, str(child), str(lines), str(go), str(stamps), kind,
        ]  # fmt: skip
        reader = None
        if drain is not None:
            r, w = os.pipe()
            p = subprocess.Popen(
                [*RANKWATCH, *args],
                stdout=w,
                stderr=open(root / "agent.err", "wb"),  # noqa: SIM115
                stdin=subprocess.DEVNULL,
                env=agent_env(),
                start_new_session=True,
            )
            os.close(w)
            reader = SlowReader(r, drain * 1e6)
            reader.start()
            print(
                f"agent stdout: a pipe read at {drain:g} MB/s"
                if drain > 0
                else "agent stdout: a pipe nobody reads"
            )
        else:
            out = Path(echo_to) if echo_to else root / "echo.out"
            p = start([*RANKWATCH, *args], stdout=out, stderr=root / "agent.err", env=agent_env())
        try:
            wait_http(port, p, timeout=60)
            health = Prober(f"http://127.0.0.1:{port}/healthz", 0.05)
            metrics = Prober(f"http://127.0.0.1:{port}/metrics", 0.5)
            metrics.keep = True
            # Kubernetes' liveness probe: every 1 s, a 1 s timeout (the Helm chart's), 3 misses restart.
            live = Prober(f"http://127.0.0.1:{port}/healthz", 1.0, timeout=1.0)
            rss = PeakRss(p.pid)
            for th in (health, metrics, live, rss):
                th.start()
            go.touch()
            doc = read_json(stamps, 300)
            nan_found = None
            caught = None
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and (nan_found is None or caught is None):
                if nan_found is None and found.exists():
                    for line in found.read_text().splitlines():
                        if json.loads(line).get("kind") == "nan_loss":
                            nan_found = time.monotonic() - doc["t_nan"]
                            break
                if caught is None:
                    try:
                        if metric_sum(scrape(port, 120.0), "rankwatch_log_lines_total") >= doc["lines"]:
                            caught = time.monotonic() - doc["t_end"]
                    except OSError:
                        pass
                time.sleep(0.01)
            for th in (health, metrics, live, rss):
                th.halt.set()
            for th in (health, metrics, live, rss):
                th.join(130)
            peak = rss.peak_mib()
            lag = max(
                (metric_sum(b, "rankwatch_event_loop_lag_seconds") for b in metrics.bodies), default=0.0
            )
            print(f"child wrote {doc['lines']:,} lines in {doc['t_end'] - doc['t0']:.2f} s  ({cpu_load()})")
            for name, pr in (("/healthz", health), ("/metrics", metrics)):
                xs = pr.latencies
                print(
                    f"{name}: n={len(xs)} p50 {pct(xs, 50) * 1000:.0f} ms  p99 {pct(xs, 99) * 1000:.0f} ms  "
                    f"max {max(xs) * 1000:.0f} ms  failures {pr.failures}"
                )
            nf = "not found" if nan_found is None else f"{nan_found:.2f} s"
            cu = "not within 300 s" if caught is None else f"{caught:.1f} s after the last write"
            print(f"NaN-to-finding: {nf}; every line counted: {cu}")
            h99 = pct(health.latencies, 99)
            loop_lag = max(lag, max(health.latencies, default=0.0))
            print(
                f"agent peak RSS {peak:.0f} MiB; 1 s /healthz probes every 1 s: {live.failures} of "
                f"{len(live.latencies)} failed; max loop lag {loop_lag:.2f} s (lag gauge max {lag:.2f} s, "
                f"slowest /healthz answer {max(health.latencies, default=0.0):.2f} s)"
            )
            print(
                f"/healthz p99 < 1 s: {mark(h99 < 1.0)}; NaN found within 5 s: {mark(nan_found is not None and nan_found < 5)}"
            )
            if kind == "steps":
                ok_nan = nan_found is not None and nan_found <= 2.0
                print(
                    f"issue 26 targets: RSS <= 150 MiB {mark(peak <= 150)}; no failed 1 s probe "
                    f"{mark(live.failures == 0)}; loop lag <= 1 s {mark(loop_lag <= 1.0)}; NaN after the "
                    f"burst found <= 2 s {mark(ok_nan)}"
                )
        finally:
            stop(p)


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
    ap.add_argument("--latency", action="store_true", help="/healthz and NaN-to-finding under a backlog")
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--cr", action="store_true", help="half of the burst CR-only progress redraws")
    ap.add_argument("--plain", action="store_true", help="application INFO lines instead of NCCL INFO ones")
    ap.add_argument(
        "--steps", action="store_true", help="key=value step lines only (2M: ~75 MB), a NaN step after them"
    )
    ap.add_argument("--echo-to", default="", help="the agent's stdout (default: a file in the temp folder)")
    ap.add_argument(
        "--drain", type=float, default=None, help="the agent's stdout is a pipe read at MB/s (0: never)"
    )
    a = ap.parse_args()
    if a.latency:
        kind = "cr" if a.cr else "plain" if a.plain else "steps" if a.steps else "nccl"
        latency(a.lines, kind, a.echo_to, a.drain)
        return
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
