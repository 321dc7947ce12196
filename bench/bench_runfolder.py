"""Metadata operations on the shared run folder per agent, per incident and per alert.

    python bench/bench_runfolder.py [--quick] [--ranks 64,256,1024]

On Lustre or NFS a job-wide incident seen by every agent at once is a metadata storm when each
agent reads every peer's file: 1,024 agents x 1,024 records is a million opens. The run folder
(``rankwatch.runfolder``) counts its own operations (``runfolder.OPS``: creates, renames,
listings, reads, stats, unlinks, folder opens), so this script drives the real code of N
simulated agents of one run against one folder, in one process, and prints what each agent
did:

- an incident: rank 3 dies first, every other rank then fails as a consequence (gloo's
  "Connection closed by peer") and records it, names the first failure; each agent's stall
  check reads the first failure again; a slowdown makes every agent write its profile and judge
  the straggler from one listing;
- a clean end: every rank exits 0; each agent records it and lists the folder, and the one
  that finds every rank's exit record withdraws them all (a healthy job leaves nothing);
- an alert: every agent posts its stall record and presence on the alert board and reads the
  board; the leader (lowest rank) reads its peers' records, claims them and writes its marker;
  every follower reads the board once more and finds the marker.

The target: per agent, O(1) operations, the same at 64 and at 1,024 agents (a listing returns
more names as the run grows, but it is one operation, and one readdir RPC batch on Lustre).
Only the leader of an alert reads one record per peer: O(ranks) for the one agent that sends
the grouped message, O(1) per agent on average.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rankwatch import runfolder
from rankwatch.actions.alerts.board import Board, Marker, Record, stamp
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.identity import Identity
from rankwatch.runtime.diagnose import CrossRank

RUN = "bench"
KINDS = ("create", "rename", "list", "read", "stat", "unlink", "mkdir", "open")


def _ops() -> Counter[str]:
    return Counter(runfolder.OPS)


def _delta(before: Counter[str]) -> Counter[str]:
    after = _ops()
    return Counter({k: after[k] - before[k] for k in KINDS if after[k] - before[k]})


def _cross(root: Path, rank: int, world: int) -> CrossRank:
    cfg = replaced(Config(), {"dumps.dir": str(root)})
    agent = SimpleNamespace(
        identity=Identity(RUN, rank, rank, world, f"node-{rank // 8}"),
        internal_errors_by_component={},
        watchers=[],
        holds=[],
    )
    return CrossRank(agent, cfg, wall=time.time)


def _summary(per_agent: list[Counter[str]]) -> str:
    totals = [sum(c.values()) for c in per_agent]
    by_kind = {k: max(c[k] for c in per_agent) for k in KINDS if any(c[k] for c in per_agent)}
    kinds = ", ".join(f"{k} <= {v}" for k, v in by_kind.items())
    return f"mean {statistics.mean(totals):.1f}, max {max(totals)} ops ({kinds})"


def incident(root: Path, n: int) -> dict[str, Any]:
    crosses = [_cross(root, r, n) for r in range(n)]
    t0 = time.time() - 10
    out: dict[str, Any] = {}
    per: list[Counter[str]] = []
    first = crosses[3 % n]
    mine = {"rank": first.agent.identity.rank, "kind": "crash", "time": t0, "how": "killed by signal 9"}
    before = _ops()
    first._record_failure(first.agent.identity.rank, t0, False, mine)
    per.append(_delta(before))
    named = 0
    for c in crosses:
        r = c.agent.identity.rank
        if c is first:
            continue
        doc = {
            "rank": r,
            "kind": "crash",
            "time": t0 + 0.5,
            "how": "Connection closed by peer",
            "consequence": True,
        }
        before = _ops()
        got = c._record_failure(r, t0 + 0.5, True, doc)
        per.append(_delta(before))
        named += got is not None and got["rank"] == first.agent.identity.rank
    out["failure: record + first failure"] = _summary(per)
    out["failure: agents naming the first failure"] = f"{named} of {n - 1}"
    per = []
    for c in crosses:
        before = _ops()
        c._first_failure(None, time.time(), True)
        per.append(_delta(before))
    out["stall: first-failure check"] = _summary(per)
    per = []
    for c in crosses:
        r = c.agent.identity.rank
        before = _ops()
        c._write_profile({"rank": r, "time": time.time(), "waiting": 0.1 if r == 5 else 0.8, "top": None})
        per.append(_delta(before))
    for i, c in enumerate(crosses):
        before = _ops()
        docs = c._read_all("profile-")
        per[i] += _delta(before)
        assert len(docs) == n
    out["slowdown: profile + peers' listing"] = _summary(per)
    return out


def clean_end(root: Path, n: int) -> dict[str, Any]:
    """Every rank exits 0, one after the other: each records its exit and looks whether the
    whole world has; the last one withdraws the set (the job ended well, nothing is left)."""
    since = time.time() - 60
    crosses = [_cross(root, r, n) for r in range(n)]
    for c in crosses:  # each agent's rank, as its process started
        ident = c.agent.identity
        c.agent.watchers = [
            SimpleNamespace(rank=ident.rank, identity=ident, prober=SimpleNamespace(started=since))
        ]
    per: list[Counter[str]] = []
    for c in crosses:
        r = c.agent.identity.rank
        mine = {"rank": r, "kind": "exit", "time": since + 30, "how": "exited with status 0"}
        before = _ops()
        c._record_failure(r, since + 30, False, mine)
        per.append(_delta(before))
    left = len(list((root / RUN / ".ranks").glob("failed-*")))
    return {
        "clean end: exit record + the world's check": _summary(per[:-1]),
        "clean end: the last agent (withdraws every record)": _summary(per[-1:]),
        "clean end: records left": f"{left}",
    }


def alert(root: Path, n: int) -> dict[str, Any]:
    now = time.time()
    boards = [Board(runfolder.RunFolder(root, RUN, ".alerts"), RUN, 600.0, world=n) for _ in range(n)]
    per = [Counter[str]() for _ in range(n)]
    member = {
        "message": "no progress for 12m",
        "step": 1200,
        "evidence": {},
        "dump_path": None,
        "starts_at": now,
    }
    for r, b in enumerate(boards):
        before = _ops()
        b.present([r], f"node-{r // 8}", now)
        b.post([Record(RUN, "stall", r, "firing", now, f"node-{r // 8}", "critical", member)])
        per[r] += _delta(before)
    views = []
    for r, b in enumerate(boards):
        before = _ops()
        views.append(b.view("stall", now, [r]))
        per[r] += _delta(before)
    leader = boards[0]
    before = _ops()
    open_members = views[0].open("firing")
    loaded = leader.load([views[0].records[m] for m in open_members if m != 0])
    covers = {m: views[0].records[m].us for m in open_members}
    got = leader.claim("stall", "firing", covers)
    leader.mark("stall", Marker("firing", 0, now, {m: covers[m] for m in got}))
    per[0] += _delta(before)
    covered = 0
    for r, b in enumerate(boards[1:], start=1):
        before = _ops()
        v = b.view("stall", now, [r])
        per[r] += _delta(before)
        covered += v.covered(r, "firing", stamp(now))
    assert sum(rec is not None for rec in loaded.values()) == n - 1
    return {
        "alert: leader (reads, claims every peer's record)": _summary(per[:1]),
        "alert: each follower": _summary(per[1:]),
        "alert: mean per agent": f"{statistics.mean(sum(c.values()) for c in per):.1f} ops",
        "alert: followers that see the leader's marker": f"{covered} of {n - 1}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--quick", action="store_true", help="64 and 256 agents only")
    args = ap.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    if args.quick:
        sizes = [s for s in sizes if s <= 256] or [64]
    rows: dict[int, dict[str, Any]] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="rw-bench-runfolder-") as tmp:
            started = time.perf_counter()
            rows[n] = {**incident(Path(tmp) / "dumps", n), **alert(Path(tmp) / "dumps", n)}
            rows[n].update(clean_end(Path(tmp) / "clean", n))
            rows[n]["wall time (all agents, this process)"] = f"{time.perf_counter() - started:.2f} s"
    for n, row in rows.items():
        print(f"\n== {n} agents of one run ==")
        for k, v in row.items():
            print(f"  {k:52s} {v}")
    small, big = min(rows), max(rows)

    def mean_of(row: dict[str, Any], key: str) -> float:
        return float(str(row[key]).split()[1].rstrip(","))

    keys = [
        "failure: record + first failure",
        "stall: first-failure check",
        "slowdown: profile + peers' listing",
    ]
    keys.append("alert: each follower")
    keys.append("clean end: exit record + the world's check")
    flat = all(mean_of(rows[big], k) <= mean_of(rows[small], k) + 0.5 for k in keys)
    print(
        f"\nper-agent operations flat from {small} to {big} agents (O(1), not O(ranks)): "
        f"{'PASS' if flat else 'MISS'}"
    )


if __name__ == "__main__":
    main()
