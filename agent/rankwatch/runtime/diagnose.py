"""Cross-rank answers in the live agent: which rank a hang waits for, which rank failed first,
which rank is the straggler.

One agent sees one rank (or one launcher's workers); the answer needs all of them. Agents of
a run already share the dumps folder (``<dumps.dir>/<run>/``), so they tell each other
through small files there, in ``.ranks/`` (a name ``dumps list`` ignores):

- ``failed-r<r>-<us>-<f|c|x>.json``: rank r's process died or reported a fatal error at ``us``
  (wall-clock microseconds), as a first failure (``f``) or a consequence (``c``), or left with
  status 0 while its peers may go on (``x``); inside, how and where its log is. A peer whose own
  crash or stall came later names rank r as the first failure; gloo's ``Connection closed by
  peer`` and NCCL's watchdog texts are consequences, not causes. A clean exit is only a
  possible first failure: once every rank of the world has one, or the launcher of the agent's
  ranks exits 0, the job ended well and they are withdrawn.
- ``profile-r<r>-<us>-w<permille>.json``: on a sustained slowdown each agent samples its own
  rank with py-spy and writes how often its main thread waited in a collective. In a synchronous job every
  rank slows down; the straggler is the one that works while its peers wait.

What a peer needs to decide sits in the file names, so an agent pays one listing per look,
not one read per rank (1,024 agents on Lustre): the first failure is the earliest ``f`` name,
and only that record is read; the straggler is judged from the names alone. The folder and
every file in it go through :mod:`rankwatch.runfolder` (owned by the job's user, no link
followed, capped reads), and a record is believed only when it is of this run, its rank lies
within the world and its time is not beyond ``dumps.clock_skew`` in the future. The folder
outlives a job and a run name may be reused (``run.name``, a fixed ``--rdzv-id``, a torchrun
restart): a record dated before the job began (the watched process's start, to the clock tick;
for a job the agent launched, the agent's start) is another job's, never this one's first failure.

A stall finding is held until the incident's stacks are in (every rank of the world, or a
bounded wait), so the alert itself names the rank the others wait for. A failure finding is
held while its record is written and its peers' are read: the folder may be a hung NFS or
Lustre mount, so that I/O runs off the loop (``offloop.fs``) and a failure whose folder does
not answer within ``FAILURE_IO_S`` goes out as it is, with no peer named. Whatever a rank
reports while one of its findings is held waits behind it (``_later``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from rankwatch import offloop, runfolder
from rankwatch.config.schema import Config
from rankwatch.detectors.crossrank import PeerFailure, first_failures
from rankwatch.dumps.capture import find_py_spy
from rankwatch.dumps.store import DumpStore, sanitise_run
from rankwatch.errorkinds import PEER_FAILURE_RE, RECORDED_FAILURES, cause_text, same_cause
from rankwatch.records import Diagnosis, Finding, FirstFailure, Severity
from rankwatch.runtime.agent import DUMPS_IO, capture_off_loop, multi_rank

log = logging.getLogger("rankwatch.diagnose")
T = TypeVar("T")

STALL_WAIT_S = 10.0  # how long a stall finding waits for its peers' stacks
FAILURE_POLL_S = 0.2  # ... re-reading the folder this often
FAILURE_IO_S = 3.0  # how long a failure waits for the shared folder before it goes out unnamed
FAILURE_WINDOW_S = 600.0  # a peer's failure older than this is another incident
CAUSE_LATE_S = 30.0  # a consequence's cause may be recorded this long after it (its agent is slower)
PROFILE_SAMPLES = 8
PROFILE_GAP_S = 0.25
PROFILE_WAIT_S = 12.0
PROFILE_FRESH_S = 90.0
PROFILE_EVERY_S = 300.0  # at most one profile per rank this often: py-spy pauses the rank
RANKS_IO = "rankwatch-ranks"  # offloop's name for the .ranks calls: stuck, they block only their kind
READ_IO = "rankwatch-dumps-read"  # ... for reading an incident's stacks back
# While looking for the first failure: records read at most (one that is read and fails validation
# counts), and names tried at most (a link, FIFO or oversized file is refused before any read).
FIRST_READS = 3
FIRST_TRIES = 16
# failed-r<rank>-<µs>-<f: a failure, c: a consequence of a peer's, x: a clean exit>.json;
# profile-r<rank>-<µs>-w<permille waiting>.json
_NAME_RE = re.compile(r"^(failed|profile)-r(\d{1,9})-(\d{1,20})-(f|c|x|w\d{1,4})\.json$")
MAX_RUN_FOLDERS = 64  # other jobs' .ranks folders kept open at once (a node daemon's runs)


MAX_ADDRESSES = 256  # addresses a record carries (sources.process.MAX_ADDRESSES)
# gloo's and the c10d store's peer: "Connection closed by peer [10.0.0.2]:41235",
# "Read error [127.0.0.1]:28370: Connection reset by peer" (sources.signatures reads the same).
_PEER_ADDR_RE = re.compile(r"\[([0-9A-Fa-f.:]{1,64})\]:(\d{1,5})")
_WILDCARD = frozenset({"0.0.0.0", "::", ""})


def peer_address(f: Finding) -> str | None:
    """``host:port`` of the peer a gloo error names, from its evidence or its text."""
    peer = f.evidence.get("peer")
    if isinstance(peer, str) and peer:
        return peer[:80]
    texts = [f.message, *[str(x) for x in f.evidence.get("traceback") or []][-5:]]
    for text in texts:
        if PEER_FAILURE_RE.search(text) and (m := _PEER_ADDR_RE.search(text)) is not None:
            return f"{m[1]}:{m[2]}"
    return None


def _address_list(v: Any) -> list[str]:
    if not isinstance(v, list):
        return []
    return [a[:80] for a in v[:MAX_ADDRESSES] if isinstance(a, str)]


def _listened(peer: str, addresses: Any) -> bool:
    """The peer address is one of these socket ends: the same port, on the same host or on a
    wildcard bind (a port is one host's, so another node's wildcard may match too:
    ``_peer_rank`` wants exactly one match). gloo (torch 2.13's, ``pair.cc``) prints the port
    as it holds it, in network byte order: the peer that listened on 43617 (0xAA61) is printed
    ``[127.0.0.1]:25002`` (0x61AA) on a little-endian host, so both orders are tried."""
    host, _, port = peer.rpartition(":")
    if not port.isdigit() or int(port) > 0xFFFF:
        return False
    ports = {int(port), int.from_bytes(int(port).to_bytes(2, "big"), "little")}
    for addr in addresses:
        h, _, p = str(addr).rpartition(":")
        if p.isdigit() and int(p) in ports and (h == host or h in _WILDCARD or h == f"::ffff:{host}"):
            return True
    return False


def _of_job(entry: dict[str, Any], since: float | None) -> bool:
    """A record named by ``_read_all`` is of the job that began at ``since`` (None: unknown)."""
    return since is None or float(entry["time"]) >= since


def same_failure(first: dict[str, Any], mine: dict[str, Any]) -> bool:
    """Two ranks' own failures that read the same but for their numbers (a rank, a device, a
    port): one cause common to the ranks (the code, the data, the configuration, the
    environment), not one rank's failure that took the other down. A consequence reads
    otherwise (a lost peer, a timeout), so neither may be one; a clean exit is no error."""
    if first.get("consequence") or mine.get("consequence") or first.get("kind") != mine.get("kind"):
        return False
    if mine.get("kind") == "exit":
        return False
    return same_cause(str(first.get("cause") or ""), str(mine.get("cause") or ""))


def _now_text(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")


class CrossRank:
    """Wired into an :class:`~rankwatch.runtime.agent.Agent` by the services; see the module doc."""

    def __init__(self, agent: Any, cfg: Config, *, wall: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.cfg = cfg
        self.wall = wall
        self.store = DumpStore(Path(cfg.dumps.dir))
        self.folder = self._runfolder()
        self._folders: dict[str, runfolder.RunFolder] = {}  # other jobs' (node daemon), by run
        self._read_last = False  # the last _load read a file (not refused by its kind, owner or size)
        self.skew = float(getattr(cfg.dumps, "clock_skew", runfolder.CLOCK_SKEW_S))
        self._stalls: list[Finding] = []  # waiting for the incident's stacks
        # The ranks each run's last stall named (suspects, wall time, incident, when a stall of it
        # resolved): a peer's timeout that ends the hang names them.
        self._hangs: dict[str, tuple[tuple[int, ...], float, str | None, float | None]] = {}
        self._stall_task: asyncio.Task[Any] | None = None
        # By rank: what came after a held finding and waits for it (resolutions; everything while a
        # failure is being recorded), and how many of the rank's findings are held, failures apart.
        self._later: dict[int | None, list[Finding]] = {}
        self._holding: dict[int | None, int] = {}
        self._failing: dict[int | None, int] = {}
        self._profiled: dict[int | None, float] = {}
        self._exits: set[asyncio.Task[Any]] = set()  # exit records being written

    # --- what the agent calls (runtime/agent.py: CrossRankJudge) ------------------------
    def clean_exit(
        self, rank: int | None, step: int | None, t: float, run: str | None = None, how: str | None = None
    ) -> None:
        """A rank of many exited with status 0 (or with a status this agent cannot know: ``how``
        says so): recorded as a possible first failure. If its peers go on into the next
        collective, their hang or their gloo ``Connection closed by peer`` follows it, and they
        name it. It stays only while a peer may still need it: once every rank of the world has
        ended so, or the launcher of this agent's ranks (``rank`` None) exited 0, the job ended
        well and the records are withdrawn (``_close_exits``, ``_withdraw``): the next job in the
        same run folder finds no failure of this one."""
        if not self.multi_rank():
            return
        if rank is None:
            if how is None and getattr(self.agent, "launched", False):
                self._withdraw_later(run)  # the launcher it started exited 0: its ranks all ended well
            return
        at = f" at step {step}" if step is not None else ""
        mine = {
            "rank": rank,
            "kind": "exit",
            "time": t,
            "how": f"exited with status 0{at} while its peers went on (a rank that left early: an early "
            "return, a rank-dependent break, an uneven last batch)",
            "signal": None,
            "consequence": False,
            "log": self._log_of(rank, run),
            "node": self.agent.identity.node,
            "addresses": self._addresses(rank, run),
        }
        if how is not None:
            mine["how"] = how
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._record_failure(rank, t, False, mine, run)
            return
        task = self._spawn(self._record_exit(rank, t, mine, run))
        if task is not None:
            self._exits.add(task)
            task.add_done_callback(self._exits.discard)

    async def _record_exit(self, rank: int, t: float, mine: dict[str, Any], run: str | None) -> None:
        try:
            await self._store_io(self._record_failure, rank, t, False, mine, run, timeout=FAILURE_IO_S)
        except asyncio.TimeoutError:
            pass  # logged once and counted by offloop
        except Exception:
            log.exception("recording rank %s's exit in %s failed", rank, self.shared)

    def _withdraw_later(self, run: str | None) -> None:
        ranks = sorted(
            {
                w.rank
                for w in self.agent.watchers
                if w.rank is not None and (run is None or w.identity.run == run)
            }
        )
        if not ranks:
            return
        since = self._since(None, run)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._withdraw(ranks, run, since)
            return
        self._spawn(self._withdraw_after_exits(ranks, run, since))

    async def _withdraw_after_exits(self, ranks: list[int], run: str | None, since: float | None) -> None:
        """After the exit records still being written (their writes run on threads of their own)."""
        pending = [t for t in self._exits if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=FAILURE_IO_S * 2)
        try:
            await self._store_io(self._withdraw, ranks, run, since, timeout=FAILURE_IO_S)
        except asyncio.TimeoutError:
            pass  # logged once and counted by offloop
        except Exception:
            log.exception("withdrawing the exit records in %s failed", self.shared)

    def _withdraw(self, ranks: list[int], run: str | None, since: float | None) -> None:
        """The launcher of ``ranks`` exited 0: their exit records of this job go (blocking)."""
        mine = set(ranks)
        done = [
            d["name"]
            for d in self._read_all("failed-", run)
            if d["exit"] and d["rank"] in mine and _of_job(d, since)
        ]
        self._unlink(done, run)

    def _close_exits(self, run: str | None, since: float | None) -> None:
        """Every rank of the world ended with an exit record of this job: nobody is left to
        wait for any of them, so none is a failure (blocking, listed after this rank's own
        record is written: of two agents writing at once, the later listing sees both; two that
        withdraw the same set are harmless). Without a known job start or world size nothing is
        withdrawn: an earlier job's records could complete the set."""
        world = self.world()
        if since is None or not world or world < 2:
            return
        exits = [d for d in self._read_all("failed-", run) if d["exit"] and _of_job(d, since)]
        if {d["rank"] for d in exits} >= set(range(world)):
            # Ranks that end together may all see the set complete: each takes the names in an
            # order of its own and stops at one already gone (another agent is at it), so 1,024
            # agents do not each try 1,024 unlinks.
            names = [d["name"] for d in exits]
            random.shuffle(names)
            self._unlink(names, run, contended=True)

    def _unlink(self, names: list[str], run: str | None, *, contended: bool = False) -> None:
        if not names:
            return
        try:
            with self._folder(run).open(create=False) as d:
                for name in names:
                    if not d.unlink(name) and contended:
                        return
        except OSError as e:
            log.debug("cannot withdraw exit records: %s", e)
            return
        log.info(
            "the job ended well: %d exit record(s) withdrawn from %s", len(names), self._folder(run).path
        )

    def _since(self, rank: int | None, run: str | None) -> float | None:
        """When this job began, for a judgement about ``rank`` (None: every watched rank of
        ``run``): when its process started (this incarnation: a launcher's restart starts it
        anew), else, for a job the agent launched, when the agent started. A record dated before
        it is another job's or an earlier attempt's, whatever its run name: the run folder
        outlives jobs, and a run name (``run.name``, a reused ``--rdzv-id``) may be reused."""
        starts = [
            float(started)
            for w in self.agent.watchers
            if (rank is None or w.rank == rank)
            and (run is None or w.identity.run == run)
            and (started := getattr(w.prober, "started", None)) is not None
        ]
        if starts:
            return min(starts)
        return float(self.agent.started_at) if getattr(self.agent, "launched", False) else None

    def _addresses(self, rank: int | None, run: str | None = None) -> list[str]:
        """The local ends of the rank's process's TCP sockets (its gloo pairs, the c10d store)."""
        w = next(
            (w for w in self.agent.watchers if w.rank == rank and (run is None or w.identity.run == run)),
            None,
        )
        prober = w.prober if w is not None else None
        return list(getattr(prober, "addresses", ()) or ())[:MAX_ADDRESSES]

    def _peer_rank(self, addr: str | None, rank: int | None, run: str | None) -> int | None:
        """The rank of this agent's own processes whose socket was ``addr`` (a launcher's
        workers, a node daemon's ranks): the process table, no record needed."""
        if addr is None:
            return None
        found = {
            w.rank
            for w in self.agent.watchers
            if w.rank is not None
            and w.rank != rank
            and (run is None or w.identity.run == run)
            and _listened(addr, getattr(w.prober, "addresses", ()) or ())
        }
        return found.pop() if len(found) == 1 else None

    def _log_of(self, rank: int | None, run: str | None = None) -> str | None:
        w = next(
            (w for w in self.agent.watchers if w.rank == rank and (run is None or w.identity.run == run)),
            None,
        )
        return w.path if w is not None else None

    @property
    def shared(self) -> Path:
        return self.folder.path

    def _folder(self, run: str | None) -> runfolder.RunFolder:
        """The ``.ranks`` folder of ``run`` (a watched job's own, on a node daemon that watches
        several), else the agent's: one job's failure is never another job's first failure."""
        if run is None or run == self.agent.identity.run:
            return self.folder
        found = self._folders.get(run)
        if found is None:
            if len(self._folders) >= MAX_RUN_FOLDERS:
                self._folders.pop(next(iter(self._folders)))
            found = self._folders[run] = self._runfolder(run)
        return found

    def _runfolder(self, run: str | None = None) -> runfolder.RunFolder:
        d = self.cfg.dumps
        return runfolder.RunFolder(
            d.dir,
            sanitise_run(run or self.agent.identity.run),
            ".ranks",
            group=runfolder.resolve_group(getattr(d, "group", None)),
            errors=self.agent.internal_errors_by_component,
        )

    def multi_rank(self) -> bool:
        return multi_rank(self.agent)

    def world(self) -> int | None:
        world: int | None = self.agent.identity.world_size
        ranks = {w.rank for w in self.agent.watchers if w.rank is not None}
        if len(ranks) > 1:  # a launcher's workers: their own WORLD_SIZE says more than the agent's
            sizes = [getattr(w.identity, "world_size", None) for w in self.agent.watchers]
            world = max([int(s) for s in sizes if s] or [world or 0]) or None
        return world

    def hold(self, f: Finding) -> bool:
        """True when this takes the finding and emits it itself, completed, a little later."""
        if not self.multi_rank() or f.evidence.get("cross_rank"):
            return False
        if f.resolved:
            if f.kind == "stall":  # its process ended, or progress came back: noted once
                run = f.run or self.agent.identity.run
                if run in self._hangs and self._hangs[run][3] is None:
                    self._hangs[run] = (*self._hangs[run][:3], self.wall())
            if f.rank in self._later:
                self._later[f.rank].append(f)
                return True
            return False
        if self._failing.get(f.rank):  # the rank's failure goes out first, whatever follows it
            self._later[f.rank].append(f)
            return True
        if f.kind in RECORDED_FAILURES:
            return self._on_failure(f)
        if f.kind == "process_exit" and f.evidence.get("status_known") is False:
            # A watched rank ended and this agent, not its parent, cannot tell how: a peer's gloo
            # error that follows names it (the address gloo lost, if it says, decides).
            at = f" at step {f.step}" if f.step is not None else ""
            how = (
                f"exited{at} while its peers went on (its exit status is unknown to this agent, "
                "which is not its parent)"
            )
            self.clean_exit(f.rank, f.step, f.time or self.wall(), f.run, how=how)
            return False
        if f.kind == "stall" and self.cfg.dumps.on_stall:
            self._held(f.rank)
            self._stalls.append(f)
            if self._stall_task is None or self._stall_task.done():
                self._stall_task = self._spawn(self._diagnose_stalls())
            return True
        if f.kind == "throughput_drop" and self._may_profile(f):
            self._held(f.rank)
            self._spawn(self._profile(f))
            return True
        return False

    def _spawn(self, coro: Any) -> asyncio.Task[Any] | None:
        self.agent._spawn(coro)
        tasks = [t for t in self.agent._tasks if t.get_coro() is coro]
        return tasks[0] if tasks else None

    def _held(self, rank: int | None, *, failure: bool = False) -> None:
        self._holding[rank] = self._holding.get(rank, 0) + 1
        if failure:
            self._failing[rank] = self._failing.get(rank, 0) + 1
        self._later.setdefault(rank, [])

    def _release(self, f: Finding, *, failure: bool = False) -> None:
        """Emit a held finding, completed, then what waited for it, offered again in order: a
        failure among them is held in its turn and what follows it waits again; while another
        finding of the rank is still held (a stall), resolutions stay behind that one."""
        rank = f.rank
        if failure:
            left = self._failing.get(rank, 0) - 1
            if left > 0:
                self._failing[rank] = left
            else:
                self._failing.pop(rank, None)
        f.evidence = {**f.evidence, "cross_rank": True}
        self.agent.emit(f)
        holding = self._holding.get(rank, 0) - 1
        if holding > 0:
            self._holding[rank] = holding
        else:
            self._holding.pop(rank, None)
        queued = self._later.pop(rank, [])
        if holding > 0:
            self._later[rank] = []
        for later in queued:
            if later.resolved and rank not in self._later:
                later.evidence = {**later.evidence, "cross_rank": True}
            self.agent.emit(later)

    # --- shared files ------------------------------------------------------------------
    async def _store_io(
        self, fn: Callable[..., T], *args: Any, timeout: float | None = None, name: str = RANKS_IO
    ) -> T:
        """A shared-folder call off the loop (``Agent.dumps_io``), waiting at most ``timeout``
        (``STALL_WAIT_S``); a call stuck on a hung mount blocks only later calls of its ``name``."""
        wait = STALL_WAIT_S if timeout is None else timeout
        result: T = await self.agent.dumps_io(fn, *args, timeout=wait, name=name)
        return result

    def _write(
        self, name: str, doc: dict[str, Any], drop: tuple[str, ...] = (), run: str | None = None
    ) -> None:
        """This rank's record (and ``drop``: its own older ones, so the folder stays small)."""
        try:
            with self._folder(run).open() as d:
                d.write_json(name, {"v": 1, "run": run or self.agent.identity.run, **doc})
                for old in drop:
                    d.unlink(old)
        except OSError as e:
            log.debug("cannot write %s: %s", name, e)

    def _read_all(self, prefix: str, run: str | None = None) -> list[dict[str, Any]]:
        """The records of one kind as their names tell them (one listing, no read): rank, time,
        and ``consequence`` (failures) or ``waiting`` (profiles). Names of a rank outside the
        world or dated beyond the clock-skew bound are ignored and counted."""
        kind = prefix.rstrip("-")
        out: list[dict[str, Any]] = []
        folder = self._folder(run)
        try:
            with folder.open(create=False) as d:
                names = d.names()
        except OSError:
            return out
        world = self.world()
        limit = self.wall() + self.skew
        for name in names:
            m = _NAME_RE.match(name)
            if m is None or m[1] != kind:
                continue
            rank, t = int(m[2]), int(m[3]) / 1e6
            if world is not None and rank >= world:
                folder.reject(name, f"rank {rank} outside a world of {world}")
                continue
            if t > limit:
                folder.reject(name, f"dated {t - self.wall():.0f}s in the future")
                continue
            doc: dict[str, Any] = {"rank": rank, "time": t, "name": name}
            if kind == "failed":
                doc["consequence"] = m[4] == "c"
                doc["exit"] = m[4] == "x"
            elif m[4].startswith("w"):
                doc["waiting"] = min(int(m[4][1:]), 1000) / 1000
            else:
                continue
            out.append(doc)
        return out

    def _load(self, entry: dict[str, Any], run: str | None = None) -> dict[str, Any] | None:
        """A failure record named by ``_read_all``, read (capped) and believed only when its
        content agrees with its name and passes ``runfolder.check_record``; texts bounded."""
        self._read_last = False
        folder = self._folder(run)
        try:
            with folder.open(create=False) as d:
                before = d.owner.rejected
                doc = d.read_json(entry["name"])
                self._read_last = d.owner.rejected == before  # not refused before the read
        except OSError:
            return None
        if doc is None:
            return None
        why = runfolder.check_record(
            doc, run=run or self.agent.identity.run, world=self.world(), now=self.wall(), skew=self.skew
        )
        if why is None and (
            doc.get("rank") != entry["rank"]
            or abs(float(doc["time"]) - entry["time"]) > 1e-3
            or (doc.get("kind") == "exit") != bool(entry.get("exit"))
        ):
            why = "its content does not match its name"
        if why is not None:
            folder.reject(entry["name"], why)
            return None
        sig = doc.get("signal")
        return {
            "rank": entry["rank"],
            "kind": runfolder.bounded(doc.get("kind"), 64),
            "time": entry["time"],
            "how": runfolder.bounded(doc.get("how"), 300) or "failed",
            "cause": runfolder.bounded(doc.get("cause"), 300),
            "signal": sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
            "consequence": bool(doc.get("consequence")),
            "log": runfolder.bounded(doc.get("log"), 1000),
            "node": runfolder.bounded(doc.get("node"), 255),
            "addresses": _address_list(doc.get("addresses")),
        }

    # --- first failure -----------------------------------------------------------------
    def _on_failure(self, f: Finding) -> bool:
        """Held while the shared folder is written and read off the loop (``_failure``). With no
        running loop (a caller outside the agent's loop) there is no loop to block, and no
        later in which to emit it: the files are read in place and the finding goes on."""
        t = f.time if f.kind == "crash" and f.time else self.wall()
        sig = f.evidence.get("signal")
        how = f.message.split(". ")[0].strip().rstrip(".")
        text = " ".join([f.message, *[str(x) for x in f.evidence.get("traceback") or []][-5:]])
        # A rank that died of the stop signal its launcher sent after a peer failed (or the
        # user's) ended because of that failure: a consequence, never the first failure, even
        # when its log holds an error of its own from the same step (every rank failing at once).
        consequence = bool(PEER_FAILURE_RE.search(text)) or bool(f.evidence.get("stopped_by"))
        # Stopped by the launcher, but its log holds an error of its own, none a peer's: when no
        # other rank's own failure turns up, that error is the first failure (torchrun's poll saw
        # a consequence die first and stopped this rank, still tearing down: the s38 tester's g58).
        own_error = bool(f.evidence.get("stopped_by")) and not PEER_FAILURE_RE.search(text)
        mine = {
            "rank": f.rank,
            "kind": f.kind,
            "time": t,
            "how": how[:300],
            "cause": cause_text(f.message),
            "signal": sig,
            "consequence": consequence,
            "log": f.path[:1000] if f.path else None,
            "node": self.agent.identity.node,
            "addresses": self._addresses(f.rank, f.run),
        }
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            peer = peer_address(f) if consequence else None
            first = self._record_failure(f.rank, t, consequence, mine, f.run, peer)
            self._conclude(f, first, mine, peer, self._hung_before(f) if consequence else None)
            return False
        self._held(f.rank, failure=True)
        # When the failing process began, taken now: while its failure waits for the first
        # failure's record, a launcher's restart may give the rank a new process, whose start
        # would pass the peer's record (this attempt's) for an earlier attempt's.
        since = self._since(f.rank, f.run)
        # The hang it may end, taken now: once the launcher's restart makes progress again, the
        # stall resolves while this failure still waits for a first failure's record.
        hung = self._hung_before(f) if consequence else None
        if self._spawn(self._failure(f, t, consequence, mine, since, own_error, hung)) is None:
            self._release(f, failure=True)  # cannot happen with a running loop; never lose it
        return True

    def _record_failure(
        self,
        rank: int | None,
        t: float,
        consequence: bool,
        mine: dict[str, Any],
        run: str | None = None,
        peer: str | None = None,
        since: float | None = None,
    ) -> dict[str, Any] | None:
        """In the shared folder (blocking: off the loop): write this rank's failure record unless
        it already has one of the same incident, and return the first failure it follows. One
        listing, one create and rename, one read: the same for 2 ranks or 1,024. A launcher's own
        failure (no rank) is no peer another rank could wait for: not written. ``run``: the
        failing process's job (a node daemon watches several), else the agent's."""
        entries = self._read_all("failed-", run)
        since = self._since(rank, run) if since is None else since
        exit_ = mine.get("kind") == "exit"
        own = sorted((d for d in entries if d["rank"] == rank), key=lambda d: d["time"])
        current = [d for d in own if _of_job(d, since)]  # an earlier job's is no incident of this one
        # A new incident; or a failure after its own exit record (a worker judged clean before the
        # launcher's word on it came): the failure says more.
        new = not current or current[-1]["time"] < t - FAILURE_WINDOW_S or (current[-1]["exit"] and not exit_)
        if rank is not None and new:
            tag = "x" if exit_ else "c" if consequence else "f"
            name = f"failed-r{rank}-{round(t * 1e6)}-{tag}.json"
            self._write(name, mine, tuple(d["name"] for d in own), run)
        if exit_:
            self._close_exits(run, since)
            return None
        return self._first_failure(rank, t, consequence, entries, run, peer, since)

    async def _failure(
        self,
        f: Finding,
        t: float,
        consequence: bool,
        mine: dict[str, Any],
        since: float | None = None,
        own_error: bool = False,
        hung: tuple[tuple[int, ...], str | None] | None = None,
    ) -> None:
        """The held failure, emitted once whatever the folder does: named after the first failure
        when its record is there (a consequence waits ``dumps.first_failure_wait`` for it), as it is when
        the folder hangs (``FAILURE_IO_S``, counted under ``dumps`` by offloop) or fails.
        ``own_error``: a rank the launcher stopped whose own error may be the first failure."""
        peer = peer_address(f) if consequence else None
        try:
            first = await self._store_io(
                self._record_failure, f.rank, t, consequence, mine, f.run, peer, since, timeout=FAILURE_IO_S
            )
            if first is None and consequence:
                first = await self._wait_first_failure(f.rank, t, f.run, peer, since, own_error)
            if first is None and own_error and f.rank is not None:
                await self._own_first(f, t, mine)
                return
            self._conclude(f, first, mine, peer, hung)
        except asyncio.TimeoutError:  # logged once and counted by offloop
            f.evidence = {
                **f.evidence,
                "shared_folder": f"{self._folder(f.run).path} did not answer within {FAILURE_IO_S:g}s "
                "(hung filesystem?): no peer's failure was checked",
            }
        except Exception:
            errs = self.agent.internal_errors_by_component
            errs["dumps"] = errs.get("dumps", 0) + 1
            log.exception("recording a failure in %s failed; it goes out as it is", self.shared)
        finally:
            self._release(f, failure=True)

    async def _own_first(self, f: Finding, t: float, mine: dict[str, Any]) -> None:
        """No other rank failed on its own: the stopped rank's own error came first. It pages as
        the crash it was, and its record becomes a first failure's (``f``), so a peer's
        consequence still waiting names it."""
        f.severity = Severity.CRITICAL
        stop = str(f.evidence.get("stopped_by") or "the launcher sent")
        prefix = f"after the stop signal {stop}: "
        body = f.message[len(prefix) :] if f.message.startswith(prefix) else f.message
        f.message = (
            "this rank failed first: its own error, before the stop signal "
            f"{stop} (no other rank failed on its own; a peer's consequence ended first): {body}"
        )
        first = {**mine, "consequence": False, "how": f.message.split(". ")[0].strip().rstrip(".")[:300]}
        name = f"failed-r{f.rank}-{round(t * 1e6)}-f.json"
        try:
            await self._store_io(self._write, name, first, (), f.run, timeout=FAILURE_IO_S)
        except asyncio.TimeoutError:
            pass  # logged once and counted by offloop; the finding goes out all the same
        f.diagnosed(
            suspects=(f.rank,) if f.rank is not None else (), first_failure=FirstFailure.from_json(first)
        )

    def _conclude(
        self,
        f: Finding,
        first: dict[str, Any] | None,
        mine: dict[str, Any],
        peer: str | None,
        hung: tuple[tuple[int, ...], str | None] | None = None,
    ) -> None:
        """Name the first failure ``f`` follows, or the rank gloo lost, or ``f``'s own rank."""
        if first is not None and same_failure(first, mine):
            self._name_same(f, first)
        elif first is not None:
            self._name_first(f, first, peer)
        elif mine["consequence"] and hung is not None:
            suspects, incident = hung
            names = ", ".join(str(r) for r in suspects)
            ranks = f"rank {names}" if len(suspects) == 1 else f"ranks {names}"
            f.message = (
                f"{ranks} hung first (the stall judged before this rank failed named it"
                + (f"; its stacks: {incident}" if incident else "")
                + f"): this rank's failure is its consequence: look at {ranks}, not this one. "
                + f.message
            )
            f.diagnosed(suspects=suspects, verdict="hang", incident=incident)
        elif (known := self._peer_rank(peer, f.rank, f.run)) is not None:
            # No record of its end (yet), but this agent watched the process whose socket was
            # the one gloo lost: that rank left.
            f.message = (
                f"the connection gloo lost ({peer}) was to rank {known}: look at rank {known}, "
                "not this one. " + f.message
            )
            f.diagnosed(suspects=(known,))
        elif (refused := self._folder(f.run).refused) is not None:
            f.evidence = {
                **f.evidence,
                "shared_folder": f"refused ({refused}): no peer's failure was read",
            }
        elif not mine["consequence"] and f.rank is not None:
            # No peer failed before it: this rank is the first failure, its own suspect.
            f.diagnosed(suspects=(f.rank,), first_failure=FirstFailure.from_json(mine))

    def _first_failure(
        self,
        rank: int | None,
        t: float,
        consequence: bool,
        entries: list[dict[str, Any]] | None = None,
        run: str | None = None,
        peer: str | None = None,
        since: float | None = None,
    ) -> dict[str, Any] | None:
        """The earliest failure of another rank that this one's failure (at ``t``) may follow:
        chosen from the names, then read; a record that fails validation is skipped (counted).
        A clean exit causes only what waited for it (a consequence), never a failure of its own.
        ``peer``: the address gloo says it lost; of the records read, the one whose rank's socket
        it was is the rank that left (else the earliest, as without it)."""
        if entries is None:
            entries = self._read_all("failed-", run)
        since = self._since(rank, run) if since is None else since
        entries = [d for d in entries if _of_job(d, since)]
        named = {
            PeerFailure(d["rank"], d["time"], consequence=d["consequence"], exit=bool(d.get("exit"))): d
            for d in entries
        }
        this = PeerFailure(rank, t, consequence=consequence)
        chosen = first_failures(list(named), of=this, window=FAILURE_WINDOW_S, slack=CAUSE_LATE_S)
        others = [named[p] for p in chosen]
        reads = 0
        earliest = None
        for entry in others[:FIRST_TRIES]:
            doc = self._load(entry, run)
            if doc is not None:
                if peer is None or _listened(peer, doc["addresses"]):
                    return doc
                earliest = earliest or doc
            if self._read_last:
                reads += 1
                if reads >= FIRST_READS:
                    break
        return earliest

    def _hung_before(self, f: Finding) -> tuple[tuple[int, ...], str | None] | None:
        """The ranks a stall of ``f``'s job named before ``f`` failed, when ``f``'s rank is not
        one of them."""
        got = self._hangs.get(f.run or self.agent.identity.run)
        if got is None:
            return None
        suspects, when, incident, resolved = got
        t = f.time or self.wall()
        # A failure long after the stall resolved (progress came back) is no end of that hang;
        # one at its resolve is (a rank's stall resolves as its process ends).
        if (
            f.rank in suspects
            or when > t + CAUSE_LATE_S
            or (resolved is not None and t > resolved + CAUSE_LATE_S)
        ):
            return None
        return suspects, incident

    def _told_ranks(self, run: str | None, since: float | None) -> set[int]:
        """The ranks with a failure record of this job (their names only: one listing)."""
        entries = self._read_all("failed-", run)
        return {int(d["rank"]) for d in entries if d["rank"] is not None and _of_job(d, since)}

    def _name_first(self, f: Finding, first: dict[str, Any], peer: str | None = None) -> None:
        when = first.get("time")
        gap = ""
        if isinstance(when, (int, float)):
            mine = f.time or self.wall()
            before = f", {mine - when:.1f}s before this rank" if mine >= when else ""
            gap = f" at {_now_text(when)}{before}"
        log_at = f" (its log: {first['log']})" if first.get("log") else ""
        if peer is not None and _listened(peer, first.get("addresses") or ()):
            log_at += f"; the connection gloo lost ({peer}) was to rank {first.get('rank')}"
        f.message = (
            f"rank {first.get('rank')} failed first: {first.get('how')}{gap}{log_at}. This rank's failure "
            f"is a consequence: look at rank {first.get('rank')}, not this one. " + f.message
        )
        f.diagnosed(first_failure=FirstFailure.from_json(first))

    def _name_same(self, f: Finding, first: dict[str, Any]) -> None:
        """Every failing rank failed the same way: no rank is the first failure to look at."""
        when = first.get("time")
        gap = ""
        if isinstance(when, (int, float)):
            mine = f.time or self.wall()
            gap = f", {abs(mine - when):.1f}s apart" if abs(mine - when) >= 0.05 else ", at once"
        f.message = (
            f"rank {first.get('rank')} failed the same way{gap}: a cause common to the ranks (the code, "
            "the data, the configuration or the environment), not one rank that took the others "
            "down. " + f.message
        )
        f.diagnosed(suspects=(), verdict="same_failure", first_failure=FirstFailure.from_json(first))

    async def _wait_first_failure(
        self,
        rank: int | None,
        t: float,
        run: str | None = None,
        peer: str | None = None,
        since: float | None = None,
        until_all: bool = False,
    ) -> dict[str, Any] | None:
        """A consequence came first: the first failure's record may follow within seconds.
        ``until_all``: no longer than until every other rank of the world has told its failure
        (none of them its own: nothing more is coming)."""
        wait = float(self.cfg.dumps.first_failure_wait)
        deadline = time.monotonic() + wait
        first = None
        world = self.world() if until_all else None
        while time.monotonic() < deadline:
            if world is not None and rank is not None:
                try:
                    told = await self._store_io(self._told_ranks, run, since, timeout=FAILURE_IO_S)
                except asyncio.TimeoutError:
                    break
                if told >= set(range(world)) - {rank}:
                    world = None  # one more look for an own failure, then no more waiting
                    deadline = time.monotonic()
            try:
                first = await self._store_io(
                    self._first_failure,
                    rank,
                    t,
                    True,
                    None,
                    run,
                    peer,
                    since,
                    timeout=FAILURE_IO_S,
                )
            except asyncio.TimeoutError:
                break
            if first is not None:
                break
            await asyncio.sleep(FAILURE_POLL_S)
        return first

    # --- stalls ------------------------------------------------------------------------
    async def _diagnose_stalls(self) -> None:
        """Each step on its own: a shared folder that hangs or refuses costs what it touches
        (the comparison, the peers' failure records), never the stacks already written, and the
        finding says which part did not answer."""
        await asyncio.sleep(0)  # let stalls of other watchers found in the same pass join
        folder: Path | None = None
        result: Any = None
        own: dict[int | None, Any] = {}
        first: dict[str, Any] | None = None
        problems: list[str] = []
        stall_run: str | None = None
        try:
            runs = {f.run for f in self._stalls}  # one job's hang dumps that job's processes only
            stall_run = runs.pop() if len(runs) == 1 else None
            folder = await self.agent.capture_dumps("stall", run=stall_run)
        except Exception:
            log.exception("stall diagnosis failed")
        if folder is not None:
            try:
                await self._second_look(folder)
                result, own = await self._diff_when_complete(folder)
            except asyncio.TimeoutError:
                problems.append(
                    f"the dumps folder did not answer within {STALL_WAIT_S:.0f}s (hung filesystem?), "
                    "so the ranks' stacks could not be read back and compared"
                )
            except Exception as e:
                log.exception("stall diagnosis failed")
                problems.append(f"reading them back failed ({type(e).__name__})")
        try:
            first = await self._store_io(self._first_failure, None, self.wall(), True, None, stall_run)
        except asyncio.TimeoutError:
            problems.append(
                f"the shared folder {self._folder(stall_run).path} did not answer within {STALL_WAIT_S:.0f}s "
                "(hung filesystem?), so no peer's failure record could be checked"
            )
        except Exception:
            log.exception("stall diagnosis failed")
        if (refused := self._folder(stall_run).refused) is not None:
            problems.append(f"the shared folder is refused ({refused}), so no peer's failure record was read")
        if folder is not None and result is not None:
            await self._record_incident(folder, result, first)
        while self._stalls:
            f = self._stalls.pop(0)
            try:
                self._complete_stall(f, folder, result, own.get(f.rank), first, problems)
                self._remember_hang(f)
            except Exception:
                log.exception("stall diagnosis failed")
            self._release(f)

    def _remember_hang(self, f: Finding) -> None:
        """The ranks a stall's judgement named, per run: a peer's collective timeout that ends
        the hang later (gloo's "Timed out waiting ... for recv") is that hang's consequence."""
        d = f.diagnosis
        if d is None or not d.suspects or f.resolved:
            return
        run = f.run or self.agent.identity.run
        self._hangs.pop(run, None)
        self._hangs[run] = (tuple(d.suspects), self.wall(), d.incident, None)
        while len(self._hangs) > MAX_RUN_FOLDERS:
            self._hangs.pop(next(iter(self._hangs)))

    async def launcher_workers(self, f: Finding, folder: Path) -> bool:
        """One pipeline stands for a whole launcher whose ranks were set inside its workers
        (torch.multiprocessing.spawn, RANK put in ``os.environ`` by each child): the agent knew one
        process tree, but its stacks show the workers, and those are peers. Their stall is judged
        as a hang of ranks is, the worker the others wait for named by pid; False (the finding
        left as it is) when the stacks hold no such workers."""
        from rankwatch.dumps.diff import diff_incident  # the stack readers: at a stall

        info = await self._store_io(self.store.find, str(folder), name=READ_IO)
        dumps = await self._store_io(
            lambda: {r: self.store.load_rank(info, r) for r in info.ranks}, name=READ_IO
        )
        result = diff_incident(dumps, world_size=self.world())
        if not result.peers:
            return False
        await self._record_incident(folder, result, None)
        self._complete_stall(f, folder, result, None, None)
        return True

    async def _record_incident(self, folder: Path, result: Any, first: dict[str, Any] | None) -> None:
        """The judgement goes into the incident folder (``diagnosis.json``): the world size, the
        ranks with no stack, a peer that failed first. `dumps diff` reads it and blames the rank
        the live agents blamed, not the lowest of those it has stacks of."""
        diagnosis = result.diagnosis(str(folder))
        ff = FirstFailure.from_json(first) if first is not None else None
        if ff is not None and ff.rank is not None:
            diagnosis = diagnosis.but(suspects=(ff.rank,), verdict="first_failure", first_failure=ff)
        try:
            info = await self._store_io(self.store.find, str(folder), name=READ_IO)
            await self._store_io(
                self.store.write_diagnosis, info, diagnosis, timeout=offloop.FS_TIMEOUT_S, name=DUMPS_IO
            )
        except (OSError, KeyError, asyncio.TimeoutError) as e:
            log.debug("cannot record the diagnosis in %s: %s", folder, e)

    async def _second_look(self, folder: Path) -> None:
        """A rank inside backward with Python frames only may wait for its peers' gradients or
        compute: its native frames tell (``c10d::Reducer`` or kernels), so it is dumped again
        with them, into the same incident."""
        from rankwatch.dumps.classify import COLLECTIVE, classify_dump

        if self.cfg.dumps.native:
            return
        info = await self._store_io(self.store.find, str(folder), name=READ_IO)
        for w in list(self.agent.watchers):
            pids = w.pids()
            rank = w.rank if w.rank is not None else 0
            if not pids or rank not in info.ranks:
                continue
            dump = await self._store_io(self.store.load_rank, info, rank, name=READ_IO)
            act = classify_dump(dump) if dump.get("ok") else None
            if act is None or act.kind != COLLECTIVE or act.certain:
                continue
            res = await capture_off_loop(
                pids[0],
                errors=self.agent.internal_errors_by_component,
                py_spy=self.cfg.dumps.py_spy,
                native=True,
                timeout=float(self.cfg.dumps.timeout),
                others=self.agent.other_ranks(w),
            )
            if res.ok:
                meta = {
                    **(dump.get("meta") or {}),
                    "second_look": f"native frames: {act.detail} was ambiguous",
                }
                with contextlib.suppress(OSError, asyncio.TimeoutError):
                    await self._store_io(
                        self.store.write_rank,
                        info.run,
                        info.name,
                        rank,
                        res,
                        meta,
                        timeout=offloop.FS_TIMEOUT_S,
                        name=DUMPS_IO,
                    )

    async def _diff_when_complete(self, folder: Path) -> tuple[Any, dict[int | None, Any]]:
        from rankwatch.dumps.diff import diff_incident  # the stack readers: at a stall, not at start

        world = self.world()
        deadline = time.monotonic() + STALL_WAIT_S
        while True:
            info = await self._store_io(self.store.find, str(folder), name=READ_IO)
            done = world is not None and set(range(world)) <= set(info.ranks)
            if done or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.25)
        dumps = await self._store_io(
            lambda: {r: self.store.load_rank(info, r) for r in info.ranks}, name=READ_IO
        )
        result = diff_incident(dumps, world_size=world)
        # A launcher's dump holds its workers: the one process picked from them says nothing of
        # "this rank" (the peers are named one by one instead).
        return result, {r: a for r, a in result.activities.items() if r not in result.peers}

    def _complete_stall(
        self,
        f: Finding,
        folder: Path | None,
        result: Any,
        own: Any,
        first: dict[str, Any] | None,
        problems: list[str] | None = None,
    ) -> None:
        from rankwatch.dumps.classify import describe
        from rankwatch.dumps.diff import format_ranks as fmt_ranks

        head, _, _ = f.message.partition(" Usual fix:")
        parts = [head.rstrip()]
        if first is not None and first.get("rank") != f.rank:
            # A peer died or failed first: that is the answer, whatever the stacks of the rest say.
            dead = first.get("rank")
            parts.append(
                f"Rank {dead} failed first: {first.get('how')} at {_now_text(float(first.get('time') or 0))}"
                + (f" (its log: {first['log']})" if first.get("log") else "")
                + "; this rank then stalled waiting for it."
            )
            if folder is not None:
                parts.append(f"Stacks: {folder}.")
            if own is not None:
                parts.append(f"This rank is {describe(own)}.")
            parts.append(
                f"Usual fix: read rank {dead}'s log and fix that failure; nothing to fix on this rank."
            )
            f.message = " ".join(parts)
            f.diagnosed(
                incident=str(folder) if folder is not None else None,
                suspects=(dead,) if isinstance(dead, int) else (),
                verdict="first_failure",
                first_failure=FirstFailure.from_json(first),
                world_size=result.world_size if result is not None else self.world(),
                missing=tuple(result.missing) if result is not None else (),
            )
            f.evidence = {**f.evidence, "activity": own.to_dict() if own is not None else None}
            return
        said = "; ".join(problems or [])
        if result is None and folder is not None:
            # The stacks are there; only reading them back failed: say so, and where they are.
            parts.append(f"Stacks are in {folder}, but {said or 'they could not be compared'}.")
            f.diagnosed(incident=str(folder), world_size=self.world())
            f.message = " ".join(parts)
            return
        if result is None:
            # Why no stack came is the capture's outcome, which the agent appends to the message.
            if said:
                parts.append(f"Also, {said}.")
            f.diagnosed(world_size=self.world())
            f.message = " ".join(parts)
            return
        if said:
            parts.append(f"Note: {said}.")
        suspects = result.suspects
        ranks_dumped = sorted(result.activities) + sorted(result.failed)
        parts.append(f"Stacks of ranks {fmt_ranks(sorted(ranks_dumped))} in {folder}: {result.summary()}.")
        if own is not None:
            parts.append(f"This rank is {describe(own)}.")
        parts.append(self._advice(f.rank, result, own))
        f.message = " ".join(p for p in parts if p)
        f.diagnosed(
            incident=str(folder),
            suspects=tuple(suspects),
            verdict=result.verdict,
            world_size=result.world_size,
            missing=tuple(result.missing),
            suspect_pids=tuple(result.suspect_pids),
        )
        f.evidence = {**f.evidence, "activity": own.to_dict() if own is not None else None}

    @staticmethod
    def _advice(rank: int | None, result: Any, own: Any) -> str:
        from rankwatch.dumps.classify import COLLECTIVE, KIND_TEXT, collective_text
        from rankwatch.dumps.diff import MISMATCH, MISSING, NOT_IN_COLLECTIVE, ONLY_IN_COLLECTIVE
        from rankwatch.dumps.diff import format_ranks as fmt_ranks

        suspects = result.suspects
        who = f"rank {fmt_ranks(suspects)}" if suspects else "the suspect"
        if result.verdict == MISMATCH:
            return (
                "Usual fix: the ranks called different collectives, a code path taken on some ranks only "
                "(a rank-dependent branch, an early return, an uneven last batch): compare the call sites "
                "above (`rankwatch dumps diff`)."
            )
        if rank in suspects and own is not None:
            if own.kind == "data":
                extra = f" ({own.worker})" if own.worker else ""
                return (
                    f"Usual fix: this rank's data loading is stuck{extra}: read its stacks "
                    "(`rankwatch dumps show`), a DataLoader worker deadlock or a hung read; confirm with "
                    "num_workers=0."
                )
            if own.kind == "io":
                return "Usual fix: check the filesystem this rank reads or writes (NFS/Lustre, disk full)."
            return f"Usual fix: read this rank's stack (`rankwatch dumps show`): it is {KIND_TEXT[own.kind]}."
        if not suspects and result.suspect_pids:
            pids = ", ".join(str(p) for p in result.suspect_pids)
            return (
                f"Usual fix: read the stack of pid {pids} (`rankwatch dumps show`): the other workers wait "
                "for it; the log shows what it did last."
            )
        if suspects and result.verdict in (NOT_IN_COLLECTIVE, ONLY_IN_COLLECTIVE, MISSING):
            waits = f" in {collective_text(own)}" if own is not None and own.kind == COLLECTIVE else ""
            return f"This rank only waits{waits} for {who}: fix {who}, not this one."
        return "Usual fix: compare the ranks' stacks with `rankwatch dumps diff`."

    # --- stragglers --------------------------------------------------------------------
    def _may_profile(self, f: Finding) -> bool:
        if find_py_spy(self.cfg.dumps.py_spy) is None or not self.cfg.dumps.on_stall:
            return False
        last = self._profiled.get(f.rank)
        now = time.monotonic()
        if last is not None and now - last < PROFILE_EVERY_S:
            return False
        self._profiled[f.rank] = now
        return self._watcher(f.rank) is not None

    def _watcher(self, rank: int | None) -> Any:
        for w in self.agent.watchers:
            if w.rank == rank and w.pids():
                return w
        return None

    async def _sample(self, pid: int) -> tuple[float, str | None]:
        """Fraction of py-spy samples in which the main thread waited in a collective, and the
        most common place it was otherwise."""
        from rankwatch.dumps.classify import COLLECTIVE, KIND_TEXT, classify_dump

        waits, other = 0, dict[str, int]()
        n = 0
        for i in range(PROFILE_SAMPLES):
            if i:
                await asyncio.sleep(PROFILE_GAP_S)
            res = await capture_off_loop(
                pid,
                errors=self.agent.internal_errors_by_component,
                py_spy=self.cfg.dumps.py_spy,
                subprocesses=False,
                timeout=5.0,
            )
            if not res.ok:
                continue
            act = classify_dump({"pid": pid, "ok": True, "threads": res.threads})
            n += 1
            if act.kind == COLLECTIVE:
                waits += 1
            else:
                key = f"{KIND_TEXT.get(act.kind, act.kind)} at {act.call_site or act.frame}"
                other[key] = other.get(key, 0) + 1
        top = max(other, key=lambda k: other[k]) if other else None
        return (waits / n if n else -1.0), top

    async def _profile(self, f: Finding) -> None:
        try:
            w = self._watcher(f.rank)
            pids = w.pids() if w is not None else []
            if not pids:
                self._release(f)
                return
            started = self.wall()
            waiting, top = await self._sample(pids[0])
            if waiting < 0:
                self._release(f)
                return
            cpu = w.last_sample.cpu_percent if w.last_sample is not None and w.last_sample.alive else None
            doc = {"rank": f.rank, "time": self.wall(), "waiting": waiting, "top": top, "cpu_percent": cpu}
            await self._store_io(self._write_profile, doc, timeout=PROFILE_WAIT_S)
            peers = await self._peer_profiles(started)
            self._judge_straggler(f, doc, peers)
        except Exception:
            log.exception("straggler profile failed")
        self._release(f)

    def _write_profile(self, doc: dict[str, Any]) -> None:
        """This rank's profile, its waiting share in the name (peers judge from one listing)."""
        rank = doc.get("rank")
        if rank is None:
            return
        own = tuple(d["name"] for d in self._read_all("profile-") if d["rank"] == rank)
        permille = min(1000, max(0, round(float(doc["waiting"]) * 1000)))
        self._write(f"profile-r{rank}-{round(float(doc['time']) * 1e6)}-w{permille}.json", doc, own)

    async def _peer_profiles(self, since: float) -> list[dict[str, Any]]:
        world = self.world()
        deadline = time.monotonic() + PROFILE_WAIT_S
        while True:
            docs = await self._store_io(
                self._read_all,
                "profile-",
                timeout=PROFILE_WAIT_S,
            )
            fresh = [
                d
                for d in docs
                if isinstance(d.get("time"), (int, float)) and d["time"] >= since - PROFILE_FRESH_S
            ]
            complete = world is not None and len({d.get("rank") for d in fresh}) >= world
            if complete or time.monotonic() > deadline:
                return fresh
            await asyncio.sleep(0.5)

    def _judge_straggler(self, f: Finding, mine: dict[str, Any], docs: list[dict[str, Any]]) -> None:
        from rankwatch.dumps.diff import format_ranks as fmt_ranks

        by_rank = {d.get("rank"): d for d in docs if isinstance(d.get("waiting"), (int, float))}
        if f.rank in by_rank:
            by_rank[f.rank] = mine  # this rank's own, with what it did (read from no file)
        if len(by_rank) < 2:
            return
        least = min(by_rank.values(), key=lambda d: d["waiting"])
        others = [d["waiting"] for r, d in by_rank.items() if r != least.get("rank")]
        median = sorted(others)[len(others) // 2]
        if not (least["waiting"] <= 0.35 and median >= 0.5 and median - least["waiting"] >= 0.3):
            return
        srank = least.get("rank")
        peers = fmt_ranks(sorted(r for r in by_rank if r != srank and isinstance(r, int)))
        evidence = {"straggler": srank, "waiting": {str(r): d["waiting"] for r, d in by_rank.items()}}
        # The suspect as typed data, as every cross-rank judgement gives it: the alert's title
        # and payload read the diagnosis, never this evidence's keys.
        verdict = Diagnosis(suspects=(srank,), verdict="straggler") if isinstance(srank, int) else None
        head, _, _ = f.message.partition(" Usual causes:")
        if srank == f.rank:
            where = f" ({least.get('top')})" if least.get("top") else ""
            self.agent.emit(
                Finding(
                    kind="straggler",
                    severity=Severity.WARNING,
                    rank=f.rank,
                    message=(
                        f"rank {f.rank} is the straggler: in py-spy samples it waited for its peers "
                        f"{least['waiting']:.0%} of the time and worked the rest{where}, while ranks {peers} "
                        f"waited in collectives for it {median:.0%} of the time (median). Usual fix: compare "
                        "this rank's GPU clocks and throttle reasons, its data-loader CPU and its node's "
                        "load with its peers', then drain or fix the slow part."
                    ),
                    step=f.step,
                    path=f.path,
                    time=f.time,
                    evidence={**evidence, "cross_rank": True},
                    diagnosis=verdict,
                    # The job of the drop it comes from: made here, it passes no pipeline's stamp.
                    run=f.run,
                    world_size=f.world_size,
                    user=f.user,
                )
            )
            f.message = f"{head} This rank is the straggler (see its straggler finding)."
        else:
            f.message = (
                f"{head} Rank {srank} is the straggler: this rank waited in collectives for it "
                f"{mine['waiting']:.0%} of the time in py-spy samples. Nothing to fix on this rank: "
                f"look at rank {srank}."
            )
        f.evidence = {**f.evidence, **evidence}
        if verdict is not None:
            f.diagnosis = (
                verdict if f.diagnosis is None else f.diagnosis.but(suspects=(srank,), verdict="straggler")
            )
