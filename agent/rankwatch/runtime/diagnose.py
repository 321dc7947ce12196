"""Cross-rank answers in the live agent: which rank a hang waits for, which rank failed first,
which rank is the straggler.

One agent sees one rank (or one launcher's workers); the answer needs all of them. Agents of
a run already share the dumps folder (``<dumps.dir>/<run>/``), so they tell each other
through small files there, in ``.ranks/`` (a name ``dumps list`` ignores):

- ``failed-<r>.json``: rank r's process died or reported a fatal error, when, how and where
  its log is. A peer whose own crash or stall came later names rank r as the first failure;
  gloo's ``Connection closed by peer`` and NCCL's watchdog texts are consequences, not causes.
- ``profile-<r>.json``: on a sustained slowdown each agent samples its own rank with py-spy
  and writes how often its main thread waited in a collective. In a synchronous job every
  rank slows down; the straggler is the one that works while its peers wait.

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
import json
import logging
import os
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from rankwatch import offloop
from rankwatch.config.schema import Config
from rankwatch.dumps.capture import find_py_spy
from rankwatch.dumps.classify import COLLECTIVE, KIND_TEXT, classify_dump, collective_text, describe
from rankwatch.dumps.diff import MISMATCH, MISSING, NOT_IN_COLLECTIVE, ONLY_IN_COLLECTIVE, diff_incident
from rankwatch.dumps.diff import format_ranks as fmt_ranks
from rankwatch.dumps.store import DumpStore
from rankwatch.records import Finding, FirstFailure, Severity
from rankwatch.runtime.agent import capture_off_loop

log = logging.getLogger("rankwatch.diagnose")
T = TypeVar("T")

STALL_WAIT_S = 10.0  # how long a stall finding waits for its peers' stacks
FAILURE_WAIT_S = 3.0  # how long a peer-failure crash waits for the first failure's record
FAILURE_POLL_S = 0.2  # ... re-reading the folder this often
FAILURE_IO_S = 3.0  # how long a failure waits for the shared folder before it goes out unnamed
FAILURE_WINDOW_S = 600.0  # a peer's failure older than this is another incident
PROFILE_SAMPLES = 8
PROFILE_GAP_S = 0.25
PROFILE_WAIT_S = 12.0
PROFILE_FRESH_S = 90.0
PROFILE_EVERY_S = 300.0  # at most one profile per rank this often: py-spy pauses the rank
FAILURE_KINDS = frozenset({"crash", "oom", "cuda_error", "xid", "gpu_lost", "peer_error"})
# What a rank prints when a *peer* died: gloo, NCCL, c10d store and torchelastic texts.
PEER_FAILURE_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
    r"ncclRemoteError|NCCL communicator was aborted|Watchdog caught collective operation timeout|"
    r"DistNetworkError|DistBackendError|Timed out waiting|Socket Timeout|RecvTimeout|"
    r"Failed to recv|SIGTERM from the launcher|failed \(exitcode",
    re.I,
)


def _now_text(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")


class CrossRank:
    """Installed on an :class:`~rankwatch.runtime.agent.Agent` by the services; see the module doc."""

    def __init__(self, agent: Any, cfg: Config, *, wall: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.cfg = cfg
        self.wall = wall
        self.store = DumpStore(Path(cfg.dumps.dir))
        self._stalls: list[Finding] = []  # waiting for the incident's stacks
        self._stall_task: asyncio.Task[Any] | None = None
        # By rank: what came after a held finding and waits for it (resolutions; everything while a
        # failure is being recorded), and how many of the rank's findings are held, failures apart.
        self._later: dict[int | None, list[Finding]] = {}
        self._holding: dict[int | None, int] = {}
        self._failing: dict[int | None, int] = {}
        self._profiled: dict[int | None, float] = {}

    # --- wiring ------------------------------------------------------------------------
    def install(self) -> None:
        self.agent.holds.append(self.hold)
        self.agent.exit_hooks.append(self.clean_exit)

    def clean_exit(self, rank: int | None, step: int | None, t: float) -> None:
        """A rank of many exited with status 0: recorded as a possible first failure. If its
        peers go on into the next collective, their hang or their gloo ``Connection closed by
        peer`` follows it, and they name it; a job that ends well leaves records nobody reads."""
        if not self.multi_rank() or rank is None:
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
            "log": self._log_of(rank),
            "node": self.agent.identity.node,
        }
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._record_failure(rank, t, False, mine)
            return
        self._spawn(self._record_exit(rank, t, mine))

    async def _record_exit(self, rank: int, t: float, mine: dict[str, Any]) -> None:
        try:
            await self._store_io(self._record_failure, rank, t, False, mine, timeout=FAILURE_IO_S)
        except asyncio.TimeoutError:
            pass  # logged once and counted by offloop
        except Exception:
            log.exception("recording rank %s's exit in %s failed", rank, self.shared)

    def _log_of(self, rank: int | None) -> str | None:
        w = next((w for w in self.agent.watchers if w.rank == rank), None)
        return w.path if w is not None else None

    @property
    def shared(self) -> Path:
        return self.store.run_dir(self.agent.identity.run) / ".ranks"

    def multi_rank(self) -> bool:
        world = self.agent.identity.world_size
        return bool(world and world > 1) or len(self.agent.watchers) > 1

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
            if f.rank in self._later:
                self._later[f.rank].append(f)
                return True
            return False
        if self._failing.get(f.rank):  # the rank's failure goes out first, whatever follows it
            self._later[f.rank].append(f)
            return True
        if f.kind in FAILURE_KINDS:
            return self._on_failure(f)
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
    async def _store_io(self, fn: Callable[..., T], *args: Any, timeout: float = STALL_WAIT_S) -> T:
        """A dumps-folder call off the loop (``Agent.dumps_io``), waiting at most ``timeout``."""
        result: T = await self.agent.dumps_io(fn, *args, timeout=timeout)
        return result

    def _write(self, name: str, doc: dict[str, Any]) -> None:
        try:
            self.shared.mkdir(parents=True, exist_ok=True)
            tmp = self.shared / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.shared / name)
        except OSError as e:
            log.debug("cannot write %s: %s", name, e)

    def _read_all(self, prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        try:
            entries = list(self.shared.iterdir())
        except OSError:
            return out
        for p in entries:
            if not (p.name.startswith(prefix) and p.name.endswith(".json")):
                continue
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(p.read_text())
                if isinstance(doc, dict):
                    out.append(doc)
        return out

    # --- first failure -----------------------------------------------------------------
    def _on_failure(self, f: Finding) -> bool:
        """Held while the shared folder is written and read off the loop (``_failure``). With no
        running loop (a caller outside the agent's loop) there is no loop to block, and no
        later in which to emit it: the files are read in place and the finding goes on."""
        t = f.time if f.kind == "crash" and f.time else self.wall()
        sig = f.evidence.get("signal")
        how = f.message.split(". ")[0].strip().rstrip(".")
        text = " ".join([f.message, *[str(x) for x in f.evidence.get("traceback") or []][-5:]])
        consequence = bool(PEER_FAILURE_RE.search(text))
        mine = {
            "rank": f.rank,
            "kind": f.kind,
            "time": t,
            "how": how[:300],
            "signal": sig,
            "consequence": consequence,
            "log": f.path,
            "node": self.agent.identity.node,
        }
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            first = self._record_failure(f.rank, t, consequence, mine)
            if first is not None:
                self._name_first(f, first)
            elif not consequence and f.rank is not None:
                f.diagnosed(suspects=(f.rank,), first_failure=FirstFailure.from_json(mine))
            return False
        self._held(f.rank, failure=True)
        if self._spawn(self._failure(f, t, consequence, mine)) is None:
            self._release(f, failure=True)  # cannot happen with a running loop; never lose it
        return True

    def _record_failure(
        self, rank: int | None, t: float, consequence: bool, mine: dict[str, Any]
    ) -> dict[str, Any] | None:
        """In the shared folder (blocking: off the loop): write this rank's failure record unless
        it already has one of the same incident, and return the first failure it follows."""
        before = {d.get("rank"): d for d in self._read_all("failed-")}.get(rank)
        when = before.get("time") if before is not None else None
        # A launcher's own failure (no rank) is no peer another rank could wait for.
        if rank is not None and (not isinstance(when, (int, float)) or when < t - FAILURE_WINDOW_S):
            self._write(f"failed-{rank}.json", mine)
        return self._first_failure(rank, t, consequence)

    async def _failure(self, f: Finding, t: float, consequence: bool, mine: dict[str, Any]) -> None:
        """The held failure, emitted once whatever the folder does: named after the first failure
        when its record is there (a consequence waits ``FAILURE_WAIT_S`` for it), as it is when
        the folder hangs (``FAILURE_IO_S``, counted under ``dumps`` by offloop) or fails."""
        try:
            first = await self._store_io(
                self._record_failure, f.rank, t, consequence, mine, timeout=FAILURE_IO_S
            )
            if first is None and consequence:
                first = await self._wait_first_failure(f.rank, t)
            if first is not None:
                self._name_first(f, first)
            elif not consequence and f.rank is not None:
                # No peer failed before it: this rank is the first failure, its own suspect.
                f.diagnosed(suspects=(f.rank,), first_failure=FirstFailure.from_json(mine))
        except asyncio.TimeoutError:
            pass  # logged once and counted by offloop
        except Exception:
            errs = self.agent.internal_errors_by_component
            errs["dumps"] = errs.get("dumps", 0) + 1
            log.exception("recording a failure in %s failed; it goes out as it is", self.shared)
        finally:
            self._release(f, failure=True)

    def _first_failure(self, rank: int | None, t: float, consequence: bool) -> dict[str, Any] | None:
        """The earliest failure of another rank that this one's failure (at ``t``) may follow."""
        others = [
            d
            for d in self._read_all("failed-")
            if d.get("rank") != rank
            and isinstance(d.get("time"), (int, float))
            and not d.get("consequence")
            and (consequence or d.get("kind") != "exit")  # a clean exit causes only what waited for it
            and t - FAILURE_WINDOW_S <= d["time"] <= t + (30.0 if consequence else 0.0)
        ]
        return min(others, key=lambda d: d["time"]) if others else None

    def _name_first(self, f: Finding, first: dict[str, Any]) -> None:
        when = first.get("time")
        gap = ""
        if isinstance(when, (int, float)):
            mine = f.time or self.wall()
            before = f", {mine - when:.1f}s before this rank" if mine >= when else ""
            gap = f" at {_now_text(when)}{before}"
        log_at = f" (its log: {first['log']})" if first.get("log") else ""
        f.message = (
            f"rank {first.get('rank')} failed first: {first.get('how')}{gap}{log_at}. This rank's failure "
            f"is a consequence: look at rank {first.get('rank')}, not this one. " + f.message
        )
        f.diagnosed(first_failure=FirstFailure.from_json(first))

    async def _wait_first_failure(self, rank: int | None, t: float) -> dict[str, Any] | None:
        """A consequence came first: the first failure's record may follow within seconds."""
        deadline = time.monotonic() + FAILURE_WAIT_S
        first = None
        while time.monotonic() < deadline:
            try:
                first = await self._store_io(
                    self._first_failure,
                    rank,
                    t,
                    True,
                    timeout=FAILURE_WAIT_S,
                )
            except asyncio.TimeoutError:
                break
            if first is not None:
                break
            await asyncio.sleep(FAILURE_POLL_S)
        return first

    # --- stalls ------------------------------------------------------------------------
    async def _diagnose_stalls(self) -> None:
        await asyncio.sleep(0)  # let stalls of other watchers found in the same pass join
        try:
            runs = {f.run for f in self._stalls}  # one job's hang dumps that job's processes only
            folder = await self.agent.capture_dumps("stall", run=runs.pop() if len(runs) == 1 else None)
            result: Any = None
            own: dict[int | None, Any] = {}
            if folder is not None:
                await self._second_look(folder)
                result, own = await self._diff_when_complete(folder)
            first = await self._store_io(
                self._first_failure,
                None,
                self.wall(),
                True,
            )
            if folder is not None and result is not None:
                await self._record_incident(folder, result, first)
        except Exception:
            log.exception("stall diagnosis failed")
            folder, result, own, first = None, None, {}, None
        while self._stalls:
            f = self._stalls.pop(0)
            try:
                self._complete_stall(f, folder, result, own.get(f.rank), first)
            except Exception:
                log.exception("stall diagnosis failed")
            self._release(f)

    async def _record_incident(self, folder: Path, result: Any, first: dict[str, Any] | None) -> None:
        """The judgement goes into the incident folder (``diagnosis.json``): the world size, the
        ranks with no stack, a peer that failed first. `dumps diff` reads it and blames the rank
        the live agents blamed, not the lowest of those it has stacks of."""
        diagnosis = result.diagnosis(str(folder))
        ff = FirstFailure.from_json(first) if first is not None else None
        if ff is not None and ff.rank is not None:
            diagnosis = diagnosis.but(suspects=(ff.rank,), verdict="first_failure", first_failure=ff)
        try:
            info = await self._store_io(self.store.find, str(folder))
            await self._store_io(self.store.write_diagnosis, info, diagnosis, timeout=offloop.FS_TIMEOUT_S)
        except (OSError, KeyError, asyncio.TimeoutError) as e:
            log.debug("cannot record the diagnosis in %s: %s", folder, e)

    async def _second_look(self, folder: Path) -> None:
        """A rank inside backward with Python frames only may wait for its peers' gradients or
        compute: its native frames tell (``c10d::Reducer`` or kernels), so it is dumped again
        with them, into the same incident."""
        if self.cfg.dumps.native:
            return
        info = await self._store_io(
            self.store.find,
            str(folder),
        )
        for w in list(self.agent.watchers):
            pids = w.pids()
            rank = w.rank if w.rank is not None else 0
            if not pids or rank not in info.ranks:
                continue
            dump = await self._store_io(
                self.store.load_rank,
                info,
                rank,
            )
            act = classify_dump(dump) if dump.get("ok") else None
            if act is None or act.kind != COLLECTIVE or act.certain:
                continue
            res = await capture_off_loop(
                pids[0],
                errors=self.agent.internal_errors_by_component,
                py_spy=self.cfg.dumps.py_spy,
                native=True,
                timeout=float(self.cfg.dumps.timeout),
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
                    )

    async def _diff_when_complete(self, folder: Path) -> tuple[Any, dict[int | None, Any]]:
        world = self.world()
        deadline = time.monotonic() + STALL_WAIT_S
        while True:
            info = await self._store_io(
                self.store.find,
                str(folder),
            )
            done = world is not None and set(range(world)) <= set(info.ranks)
            if done or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.25)
        dumps = await self._store_io(
            lambda: {r: self.store.load_rank(info, r) for r in info.ranks},
        )
        result = diff_incident(dumps, world_size=world)
        return result, {r: a for r, a in result.activities.items()}

    def _complete_stall(
        self, f: Finding, folder: Path | None, result: Any, own: Any, first: dict[str, Any] | None
    ) -> None:
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
        if result is None:
            parts.append("Stack dumps could not be taken (see the agent's log).")
            f.diagnosed(world_size=self.world())
            f.message = " ".join(parts)
            return
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
        )
        f.evidence = {**f.evidence, "activity": own.to_dict() if own is not None else None}

    @staticmethod
    def _advice(rank: int | None, result: Any, own: Any) -> str:
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
            await self._store_io(
                self._write,
                f"profile-{f.rank}.json",
                doc,
                timeout=PROFILE_WAIT_S,
            )
            peers = await self._peer_profiles(started)
            self._judge_straggler(f, doc, peers)
        except Exception:
            log.exception("straggler profile failed")
        self._release(f)

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
        by_rank = {d.get("rank"): d for d in docs if isinstance(d.get("waiting"), (int, float))}
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
