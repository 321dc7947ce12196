"""One watched rank, live: its logs, its process, its detectors.

Log data flows follower -> parser -> engine exactly as in ``analyze``; on top of that a
rank has a process and a stall detector fed with monotonic time. The process and the logs
are polled sources made for each rank (``sources/polled/process.py`` and ``logs.py``, scope
``"rank"``) under the sources' policy: the watcher attaches the process it samples and
polls it every period (``sample_once``); the logs are read off the loop, on the rank's own
thread, and the watcher parses what they read on the loop, in slices (``_follow``), so a
log on a hung mount stops that rank's lines only. Any other source made for each rank runs
beside them. Everything found goes to ``emit``; this module does no alerting or dumping
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch import offloop
from rankwatch.config.schema import Config
from rankwatch.detectors.liveness import Liveness
from rankwatch.engine import RankEngine
from rankwatch.events import Event, LogActivity, ProcessExit, ProcessStart, Progress
from rankwatch.identity import Identity
from rankwatch.records import ErrorRecord, Finding, Record, Severity, StepRecord
from rankwatch.sources.follower import NOISE, LogFollower, LogReader
from rankwatch.sources.logparser import LogParser
from rankwatch.sources.polled import Poller, RankContext, Sampled, ToRank, build_rank_sources
from rankwatch.sources.polled.logs import LOG_HINT, LogSource
from rankwatch.sources.polled.process import ProcessSource
from rankwatch.sources.process import ProcessProber, ProcessSample
from rankwatch.sources.signatures import may_hold_signature

if TYPE_CHECKING:  # set by the node daemon (runtime/podwatch.py), which imports it
    from rankwatch.k8s.crilog import Joiner

log = logging.getLogger("rankwatch.watcher")

QUIET_RELEASE_S = 1.0  # a stream idle this long hands out tracebacks held back for continuation
# A traceback in the log of a live process is held this long: if the process dies, its exit is
# the one crash finding (with that traceback as cause); if it lives on, it was no crash.
CRASH_HOLD_S = 15.0
# Lines parsed per loop turn: a backlog (a 2M-line burst, a restart behind a big log) is worked
# off in slices, so /healthz, /metrics and the other ranks' detection run between them.
FEED_SLICE = 2048
# A non-finite number as frameworks print it (nan, NaN, -inf, Infinity), not "info".
_NON_FINITE = re.compile(r"(?<![A-Za-z])(?:nan|inf(?:inity)?)(?![A-Za-z])")


def _non_finite(text: str) -> bool:
    """``text`` may print a NaN or an infinity: a substring test first (C speed over a whole
    batch), the word test only where one of them is there."""
    low = text.lower()
    if "inf" in low:
        low = low.replace("info", "")  # every INFO log line: not an infinity
    return ("nan" in low or "inf" in low) and _NON_FINITE.search(low) is not None


LINE_COUNT_S = 10.0
# At exit, how long the loop waits for a log's read in flight before it leaves that log (a read
# from the page cache takes milliseconds; one on a dead mount never returns).
DRAIN_WAIT_S = 2.0
# Numbers the sets of log files the agent's watchers follow: each set's reads have a thread
# name of their own (two watchers of unknown rank, or a rank's attempts, never share one).
_LOG_SETS = itertools.count()


class Stream:
    __slots__ = (
        "cri", "dropped", "follower", "last_data", "parser", "path", "reader", "shed_backlog", "shedding",
        "thinned",
    )  # fmt: skip

    def __init__(
        self,
        path: Path,
        cfg: Config,
        rank: int | None,
        from_end: bool,
        world_size: int | None = None,
        *,
        replay: int = 0,
        start_at: int | None = None,
    ) -> None:
        """Touches nothing on disk: the file's first open, from its end with ``from_end`` (its
        earlier lines counted, ``replay`` bytes of its history read back), every read and its
        close run on the rank's log source's thread (``LogReader``, ``sources/polled/logs.py``)."""
        self.path = path
        # NCCL INFO chatter is skipped before parsing, as ``analyze`` does: it is often most of
        # a burst and never evidence; it is still counted (unparsed) and still a sign of life.
        self.follower = LogFollower(
            path,
            max_line_bytes=cfg.logs.max_line_bytes,
            from_end=from_end,
            drop=NOISE,
            encoding=cfg.logs.encoding,
            lazy=True,
            start_at=start_at,
        )
        self.reader = LogReader(
            self.follower,
            int(cfg.logs.read_bytes_per_turn),
            thin=self.thin,
            count=from_end,
            replay=replay,
            count_s=LINE_COUNT_S,
            watch=cfg.logs.watch,
        )
        self.shed_backlog = int(cfg.logs.shed_backlog)
        self.dropped = 0
        self.parser = LogParser.configured(cfg.logs, default_rank=rank, world_size=world_size)
        self.last_data = 0.0
        self.shedding = False
        self.thinned = 0  # the follower's thinned_lines already counted
        # A kubelet container log (node mode on Kubernetes): CRI prefixes off, cut lines joined.
        self.cri: Joiner | None = None

    def thin(self) -> Callable[[str], bool] | None:
        """Before a read (on the thread that reads): the follower's ``thin`` test while the
        log's unread bytes exceed ``logs.shed_backlog`` (the agent far behind), else None
        (every line is parsed)."""
        limit = self.shed_backlog
        behind = self.follower.backlog() if limit > 0 else 0
        if behind <= limit:
            if self.shedding:
                self.shedding = False
                log.info("%s: caught up; every line is parsed again", self.path)
            return None
        if not self.shedding:
            self.shedding = True
            log.warning(
                "%s: %.1f MiB behind the log: until caught up only lines that may hold an error or a "
                "non-finite value (and the last of each read) are parsed; the rest are counted "
                '(rankwatch_log_lines_total{result="shed"})',
                self.path,
                behind / (1 << 20),
            )
        return matters


def matters(text: str) -> bool:
    """What a reader far behind still parses: text that may hold an error signature, a
    non-finite value or an escape sequence (which may split a signature's words)."""
    return may_hold_signature(text) or _non_finite(text) or "\x1b" in text


def shed(batch: list[Any]) -> list[Any]:
    """What a reader far behind still parses of ``batch``: the lines that may hold an error
    signature or a non-finite value, and the last line (the step reached). One test over
    the joined batch spares the per-line tests when it holds neither (the usual burst)."""
    texts = [fl.text for fl in batch]
    joined = "\n".join(texts)
    if not may_hold_signature(joined) and not _non_finite(joined) and "\x1b" not in joined:
        return batch[-1:]
    keep = [
        fl
        for fl in batch[:-1]
        if fl.cut or "\x1b" in fl.text or may_hold_signature(fl.text) or _non_finite(fl.text)
    ]
    keep.append(batch[-1])
    return keep


class RankWatcher:
    # The run's pipeline of a launcher (``runtime/workers.py``): the failures in its lines are
    # held for the launcher's exit to tell, so they are never its own cause (``_records``).
    launcher = False

    def __init__(
        self,
        cfg: Config,
        identity: Identity,
        logs: list[Path],
        *,
        emit: Callable[[Finding], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        from_end: bool = False,
        replay: bool = False,
        start_at: int | None = None,
    ) -> None:
        """``start_at`` (with ``from_end``): where the lines of its last log (a run's combined
        log) begin, known now; its first open, on its reads' thread, starts there."""
        self.cfg = cfg
        self.identity = identity
        self.rank = identity.rank
        self.emit = self._stamped(emit)
        self.clock = clock
        self.wall = wall
        self.path = str(logs[0]) if logs else None
        budget = int(cfg.logs.replay) if replay and from_end else 0
        self.streams = [
            Stream(
                p,
                cfg,
                self.rank,
                from_end,
                identity.world_size,
                replay=budget,
                start_at=start_at if i == len(logs) - 1 else None,
            )
            for i, p in enumerate(logs)
        ]
        self.engines: dict[int | None, RankEngine] = {}
        self._engine(self.rank)  # its liveness rules start their grace now
        self.tail: deque[str] = deque(maxlen=max(1, cfg.process.tail_lines))
        self.prober: ProcessProber | None = None
        # offloop's name for the prober's calls: its own thread, and with ``one_stuck`` at most
        # one of them left on a hung process (a restarted rank's new pid is sampled at once).
        self.proc_io = f"rankwatch-proc-{self.rank}"
        self.last_sample: ProcessSample | None = None
        self.alive_at: float | None = None  # the prober's clock at the last sample that found it alive
        self.exited = False
        self.internal_errors = 0
        self.lines = 0
        # The sources made for this rank (its process, its logs), each polled under the sources'
        # policy; their failures by source name, exported under that name (``logs``, ``process``).
        self.source_errors: dict[str, int] = {}
        # offloop's name for the thread of the rank's log reads: a new one for each set of files
        # (``follow_instead``), so new attempt files are read while a read of the old ones is stuck.
        self.log_io = f"rankwatch-log-{self.rank}-{next(_LOG_SETS)}"
        ctx = RankContext(
            cfg,
            self.rank,
            clock,
            prober=self._attached,
            io=lambda: self.proc_io,
            logs=lambda: [st.reader for st in self.streams],
            log_io=lambda: self.log_io,
        )
        self.pollers = {
            s.name: Poller(s, self.source_errors) for s in build_rank_sources(ctx, self.source_errors)
        }
        self._held: list[tuple[float, Finding]] = []
        # Held crashes of other ranks this process printed as its own end (``_own_end``).
        self._held_own: list[tuple[Finding, ErrorRecord]] = []
        self._stop = asyncio.Event()
        self.replayed: list[Finding] = []  # what the replayed history held, for the alert dispatcher
        self.history_fed = 0  # step records taken from the checkpoints' trainer_state.json
        # Set over the process's environment when its GPUs are mapped (node mode on Kubernetes:
        # the container's GPUs from the kubelet, as host-wide UUIDs).
        self.gpu_env: dict[str, str] = {}
        # Told of a clean exit (status 0): rank, last step, wall time. Set by the agent.
        self.on_clean_exit: Callable[[int | None, int | None, float], None] | None = None
        # Told of what each replayed history held (``replayed`` keeps it too). Set by the agent.
        self.on_replayed: Callable[[list[Finding]], None] | None = None
        if from_end:
            # A log followed from its end starts where it is now: its first open is started
            # at once, under the name of its reads' thread, not at the first poll. A thread of
            # its own, ended once it returns: run mode makes the watcher before it lowers the
            # agent's priority, and a kept thread (``offloop.start``) would keep the old one.
            threading.Thread(
                target=functools.partial(_attach, list(self.streams)), name=self.log_io, daemon=True
            ).start()

    def _stamped(self, emit: Callable[[Finding], None]) -> Callable[[Finding], None]:
        """Every finding of this pipeline carries its process's run (the alert key, the
        incident folder and the cross-rank records are the run's), world size and user."""

        def stamped(f: Finding) -> None:
            if f.run is None:
                f.run = self.identity.run
            if f.world_size is None:
                f.world_size = self.identity.world_size
            if f.user is None:
                f.user = self.identity.user
            emit(f)

        return stamped

    # --- state -------------------------------------------------------------------------
    @property
    def engine(self) -> RankEngine:
        """The watched rank's own engine: its log records, and every event of its process,
        GPUs, checkpoints and timers."""
        return self._engine(self.rank)

    def _engine(self, rank: int | None) -> RankEngine:
        eng = self.engines.get(rank)
        if eng is None:
            eng = self.engines[rank] = RankEngine(
                self.cfg, rank, self.path, started=self.clock(), job_end=self.identity.job_end
            )
        return eng

    def liveness(self) -> Liveness:
        """The stall rule's reading of the rank now, on the watcher's clock."""
        reading = self.engine.liveness(self.clock())
        assert reading is not None  # the stall rule is built for every rank
        return reading

    def push(self, event: Event) -> list[Finding]:
        """One event of the rank (not a log record) through its engine; findings emitted."""
        found = self.engine.feed(event)
        for f in found:
            self.emit(f)
        return found

    def history(self, records: Sequence[Record]) -> None:
        """HF log_history from the checkpoint folder, with exact step numbers, for a rank whose
        log shows no steps (none followed, or no step lines): else a NaN seen only there finds
        nothing. Once the log has steps of its own it is the source, and history would count
        twice. Its findings go straight out (no crash in it is held for the process's fate)."""
        if self.engine.state.step_count > self.history_fed:
            return
        for rec in records:
            if isinstance(rec, StepRecord):
                self.history_fed += 1
            for f in self.engine.feed(rec):
                self.emit(f)

    def attach(self, pid: int, prober: ProcessProber | None = None) -> None:
        """Watch ``pid``; ``prober``: one made off the loop (making one reads the process's
        command line, which a process in D state blocks)."""
        # A new pid after a restart (torchrun, a requeue) gets the startup grace again, and
        # starts with no step and none of its predecessor's errors (judged with its end).
        if self.prober is not None and self.prober.pid != pid:
            self.engine.state.restarted()
        self.engine.feed(ProcessStart(self.clock(), pid))
        self.prober = prober if prober is not None else ProcessProber(pid, clock=self.clock)
        self.proc_io = f"rankwatch-proc-{self.rank}-pid{pid}"
        self.last_sample = None
        self.alive_at = None
        self.exited = False
        log.info("rank %s: watching pid %d", self.rank, pid)

    def _attached(self) -> ProcessProber | None:
        """The process the rank's sources sample: none before the first attach, or after its exit."""
        return None if self.exited else self.prober

    def pids(self) -> list[int]:
        if self.prober is None:
            return []
        try:
            return self.prober.pids()
        except Exception:
            return []

    def known_pids(self) -> list[int]:
        """``pids`` as the last process sample knew them, without a walk of /proc."""
        if self.prober is None:
            return []
        try:
            return self.prober.known_pids()
        except Exception:
            return []

    # --- logs --------------------------------------------------------------------------
    def _replay(self, stream: Stream, batch: list[Any]) -> None:
        """An agent started (or restarted) next to a running rank: rebuild its windows from the
        log's recent history (read back off the loop, ``LogReader.attach``), as ``analyze``
        would, so baselines and the last step are known before its live lines. Its findings are
        not emitted again: they go to ``replayed`` and ``on_replayed``, for the alert dispatcher,
        whose state file tells what was reported before the restart (and so what happened while
        no agent ran)."""
        found: list[Finding] = []
        if len(batch) > 1 and batch[-1].lineno - batch[0].lineno + 1 < len(batch):
            batch = _latest_redraws(batch, stream.parser.stats)
        kinds: dict[str, int] = {}
        lines = 0
        for fl in batch:
            lines += 1
            try:
                recs = stream.parser.feed(fl.text, fl.lineno, cut=fl.cut)
            except Exception:
                self.internal_errors += 1
                continue
            for rec in recs:
                if not self._replays(stream, rec):
                    continue
                eng = self._engine(rec.rank if rec.rank is not None else self.rank)
                try:
                    for f in eng.feed(rec):
                        found.append(f)
                        if not f.resolved:
                            kinds[f.kind] = kinds.get(f.kind, 0) + 1
                except Exception:
                    self.internal_errors += 1
        self.replayed += found
        if found and self.on_replayed is not None:
            self.on_replayed(found)
        state = self.engine.state
        if state.last_step is not None:
            self.engine.feed(Progress(self.clock(), state.last_step))  # the stall clock starts from it
        if lines:
            seen = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"
            log.info(
                "rank %s: replayed the last %d lines of %s: %d steps, last step %s; findings then: %s",
                self.rank, lines, stream.path, state.step_count, state.last_step, seen,
            )  # fmt: skip

    def _replays(self, stream: Stream, rec: Record) -> bool:
        """Whether a record of the replayed history is this pipeline's (a file several pipelines
        follow replays each record once: ``runtime/sharedlog.py``)."""
        return True

    def _records(self, records: list[Record]) -> None:
        now = self.clock()
        for rec in records:
            eng = self._engine(rec.rank if rec.rank is not None else self.rank)
            before = eng.state.last_step
            try:
                found = eng.feed(rec)
            except Exception:
                self.internal_errors += 1
                log.exception("engine failed on a record")
                continue
            if isinstance(rec, StepRecord) and eng.state.last_step != before:
                found = found + self.engine.feed(Progress(now, eng.state.last_step))
            for f in found:
                if f.kind == "crash" and not f.resolved and self.prober is not None and _may_be_handled(f):
                    self._held.append((now, f))
                    if type(rec) is ErrorRecord and self._own_end(eng, f):
                        self._held_own.append((f, rec))
                else:
                    self.emit(f)
                    if type(rec) is ErrorRecord and f.kind == rec.kind:
                        rec.reported = True  # the death it causes is told by this finding
                        if self._own_end(eng, f):
                            self.engine.state.errors.append(rec)

    def _own_end(self, eng: RankEngine, f: Finding) -> bool:
        """A fatal error of another rank that this process, no rank itself, printed as its own
        end (torch.multiprocessing.spawn re-raises its worker's traceback): its exit is that
        error's, told by that rank's finding. A rank's own pipeline keeps its own causes, and a
        launcher's run pipeline holds its failures for the launcher's exit (``launcher``)."""
        return (
            eng is not self.engine
            and self.rank is None
            and not self.launcher
            and f.severity >= Severity.CRITICAL
        )

    @property
    def holds_crash(self) -> bool:
        """Crash text from its log waits for the process's end to say what it was (a handled
        exception while it runs on, or the cause of its death)."""
        return bool(self._held)

    def release_held(self, force: bool = False) -> None:
        """Crash text from a process that is still running: a handled exception, not a crash."""
        if not force and self.last_sample is not None and not self.last_sample.alive:
            return  # it died: on_exit reports the crash, with this traceback as its cause
        now = self.clock()
        keep: list[tuple[float, Finding]] = []
        for t, f in self._held:
            if force or now - t >= CRASH_HOLD_S:
                self.emit(_still_running(f, now - t))
            else:
                keep.append((t, f))
        self._held = keep
        self._held_own = [(f, r) for f, r in self._held_own if any(h is f for _, h in keep)]

    def _thin(self, stream: Stream) -> Callable[[str], bool] | None:
        return stream.thin()

    def _shed(self, stream: Stream, batch: list[Any]) -> list[Any]:
        """``batch`` as read while shedding: the pieces the follower kept, thinned to the lines
        that matter (``shed``); every line passed over is counted."""
        n = stream.follower.stats.thinned_lines - stream.thinned
        stream.thinned += n
        if stream.shedding and len(batch) > 1:
            kept = shed(batch)
            n += len(batch) - len(kept)
            batch = kept
        if n:
            self.lines += n
            st = stream.parser.stats
            st.lines += n
            st.shed += n
        return batch

    def feed_lines(self, stream: Stream, batch: list[Any]) -> None:
        now_wall = self.wall()
        stream.last_data = self.clock()
        self.push(LogActivity(stream.last_data))
        dropped = stream.follower.stats.dropped_lines
        if dropped != stream.dropped:
            self.lines += dropped - stream.dropped
            stream.parser.stats.lines += dropped - stream.dropped
            stream.parser.stats.unparsed += dropped - stream.dropped
            stream.dropped = dropped
        if stream.cri is not None:
            batch = stream.cri.feed(batch)
        if len(batch) > 1 and batch[-1].lineno - batch[0].lineno + 1 < len(batch):  # \r segments in it
            batch = _latest_redraws(batch, stream.parser.stats)
        out: list[Record] = []
        for fl in batch:
            self.lines += 1
            if not fl.cut:
                self.tail.append(fl.text)
            try:
                recs = stream.parser.feed(fl.text, fl.lineno, cut=fl.cut, now=now_wall)
            except Exception:
                self.internal_errors += 1
                continue
            if recs:
                out.extend(recs)
        if out:
            self._records(_from(out, stream))

    def release_quiet(self, force: bool = False) -> None:
        now = self.clock()
        for s in self.streams:
            if force or now - s.last_data >= QUIET_RELEASE_S:
                recs = s.parser.finish() if force else s.parser.release_pending()
                if recs:
                    self._records(_from(recs, s))

    def drain(self) -> None:
        """Everything still in the files, then every held line and traceback (on exit). Read
        in turns of ``logs.read_bytes_per_turn`` (bounded memory), thinned as the live tail is
        while far behind (a backlog at exit is worked off in about a second, not a minute)."""
        for s in self.streams:
            self._drain(s)
        self.release_quiet(force=True)

    def catch_up(self) -> None:
        """Every complete line the files hold now, parsed (a line still being written stays,
        the parsers keep what they hold): before another pipeline's end is judged on what this
        one relays (the run's step), so that the judgement does not race this one's reads."""
        for s in self.streams:
            self._drain(s, final=False)

    def _drain(self, s: Stream, *, final: bool = True) -> None:
        """What the log's reads queued, then the rest of the file in turns of at most
        ``logs.read_bytes_per_turn``, each read on a thread and waited for at most
        ``DRAIN_WAIT_S`` (not at all once the rank's reads are stuck): a log on a hung mount is
        left, and said, instead of freezing the agent as it stops. ``final``: the last line
        even with no newline yet (the writer is gone)."""
        self._take_history(s)
        while (queued := s.reader.take()) is not None:  # read before: parsed first
            self._feed_read(s, queued)
        if s.reader.closed:
            return
        wait = self._drain_wait()
        while True:
            before = s.follower.stats.bytes_read
            behind = _fill_within(s.reader, wait, f"{self.log_io}-drain")
            if behind is None:
                log.warning("%s: not read to its end: a read of it has not returned (%s)", s.path, LOG_HINT)
                return
            got = False
            self._take_history(s)
            while (batch := s.reader.take()) is not None:
                if batch:
                    got = True
                    self._feed_read(s, batch)
            if not behind and (not got or s.follower.stats.bytes_read == before):
                break
        if not final:
            return
        with s.reader.owned(wait) as mine:
            rest = s.follower.flush() if mine else []
        if rest:
            self.feed_lines(s, rest)
        held = s.cri.flush() if s.cri is not None else []
        if held:
            self.feed_lines(s, held)  # the last line of a container that never got its F

    def _drain_wait(self) -> float:
        """How long the loop may wait for a read of the rank's logs in flight: not at all for
        one given up on (the source's thread is stuck)."""
        return 0.0 if offloop.stuck(self.log_io) else DRAIN_WAIT_S

    def _take_history(self, s: Stream) -> None:
        history = s.reader.take_history()
        if history is not None:
            self._replay(s, history)

    def _feed_read(self, s: Stream, batch: list[Any]) -> None:
        batch = self._shed(s, batch)
        for i in range(0, max(1, len(batch)), FEED_SLICE):
            self.feed_lines(s, batch[i : i + FEED_SLICE])

    def follow_instead(self, old: Sequence[Path], new: Sequence[Path]) -> list[Stream]:
        """The process restarted into files of its own that are new (torchelastic's
        ``<log-dir>/<run>/attempt_<n>/<local rank>/``): what is left in the ``old`` ones is
        read, they are closed, and the ``new`` ones are followed from their start, in the same
        pipeline (on a thread of their own: a read of the old ones may be stuck). Returns the
        new streams."""
        gone = [s for s in self.streams if s.path in old]
        for s in gone:
            self._drain(s)
            s.reader.close(self.log_io)
        added = [Stream(p, self.cfg, self.rank, False, self.identity.world_size) for p in new]
        self.streams = added + [s for s in self.streams if s not in gone]
        if gone:
            self.log_io = f"rankwatch-log-{self.rank}-{next(_LOG_SETS)}"
        poller = self.pollers.get(LogSource.name)
        if poller is not None and isinstance(poller.source, LogSource):
            poller.source.renew()  # a sample holding the old set returns
        if added and gone and self.path in {str(s.path) for s in gone}:
            self.path = str(added[0].path)  # what the findings of the rank's log name from now on
            for eng in self.engines.values():
                eng.state.path = self.path
        return added

    async def _follow(self) -> None:
        """Read the rank's logs (its log source, ``sources/polled/logs.py``, off the loop) until
        ``stop()``, then what they hold by then; every batch parsed on the loop, in slices."""
        poller = self.pollers.get(LogSource.name)
        if poller is None:
            return
        try:
            await poller.run(self._stop, self._take_lines)
            while self.streams:  # the old follower read on after the stop until caught up
                if await poller.once() is None:
                    break
                await self._take_lines([])
                if not any(s.reader.behind for s in self.streams):
                    break
        finally:
            for s in self.streams:
                s.reader.unwatch_on(self.log_io)

    async def _take_lines(self, _: list[Sampled]) -> None:
        """What the rank's log reads queued, through the parser, yielding to the loop after
        every slice of ``FEED_SLICE`` lines: /healthz, /metrics and the other ranks run between."""
        for s in list(self.streams):
            self._take_history(s)
            while (batch := s.reader.take()) is not None:
                batch = self._shed(s, batch)
                for i in range(0, max(1, len(batch)), FEED_SLICE):
                    self.feed_lines(s, batch[i : i + FEED_SLICE])
                    await asyncio.sleep(0)

    # --- process -----------------------------------------------------------------------
    async def sample_once(self) -> list[Finding]:
        """One sample of the rank's process (its source, ``sources/polled/process.py``), through
        its engine. While a sample is stuck (a process in D state) each period fails at once and
        is counted: no sample means no verdict, so stall and exit are judged from samples only."""
        poller = self.pollers.get(ProcessSource.name)
        if poller is None or self.prober is None or self.exited:
            return []
        events = await poller.once()
        return [] if events is None else self._sampled(events)

    def _deliver(self, events: list[Sampled]) -> None:
        self._sampled(events)

    def _sampled(self, events: Sequence[Sampled]) -> list[Finding]:
        """What a source of this rank sampled, through its engine; a process sample is also
        the rank's last reading of its process."""
        found: list[Finding] = []
        for e in events:
            event = e.event if isinstance(e, ToRank) else e
            if isinstance(event, ProcessSample):
                self.last_sample = event
                if event.alive:
                    self.alive_at = event.time
            found += self.push(event)
        return found

    def on_exit(
        self,
        exit_code: int | None,
        signal: int | None,
        *,
        requested: bool | int = False,
        disk_full: str | None = None,
        stopped_by: str = "we forwarded",
    ) -> Finding | None:
        """The process ended: a crash finding unless it ended cleanly, on our forwarded stop
        signal, or we cannot tell.

        ``requested``: we forwarded a stop (SIGTERM, SIGINT, SIGHUP; the number when known).
        However the child then ends (killed by it, or exiting non-zero from its handler, with
        a KeyboardInterrupt traceback) it did what it was told: no critical crash. Only an
        error of its own in the log makes it a ``crash``, and then a warning.
        """
        if self.exited:
            return None
        self.exited = True
        self.drain()
        held, self._held = self._held, []
        own, self._held_own = self._held_own, []
        for f, rec in own:
            # The process died: the worker traceback it printed as its end (mp.spawn's join) was
            # no handled exception but that worker's crash, and this exit is told by it.
            if any(h is f for _, h in held):
                held = [(t, h) for t, h in held if h is not f]
                self.emit(f)
                rec.reported = True
                self.engine.state.errors.append(rec)
        event = ProcessExit(
            exit_code, signal, tuple(self.tail), requested, disk_full, wall=self.wall(), stopped_by=stopped_by
        )
        found = self.engine.feed(event)
        for f in found:
            self.emit(f)
        if not found:  # a clean end: what it printed was handled
            for _, h in held:
                self.emit(_still_running(h, None))
            if exit_code == 0 and signal is None and not requested and self.on_clean_exit is not None:
                # Not a finding: a rank of many that leaves while its peers go on is the first
                # failure their hang or crash follows (runtime/diagnose.py judges that).
                self.on_clean_exit(self.rank, self.engine.state.last_step, event.wall or self.wall())
        return next((f for f in found if f.kind in ("crash", "process_exit")), None)

    # --- lifecycle ---------------------------------------------------------------------
    async def run(self) -> None:
        """Follow every log and sample the process until ``stop()``."""
        others = [
            asyncio.create_task(p.run(self._stop, self._deliver), name=f"source-{name}-{self.rank}")
            for name, p in self.pollers.items()
            # the process is sampled below, each period; the logs are read by ``_follow``
            if name not in (ProcessSource.name, LogSource.name)
        ]
        others.append(asyncio.create_task(self._follow(), name=f"logs-{self.rank}"))
        try:
            while not self._stop.is_set():
                await self.sample_once()
                self.release_quiet()
                if self._held and not self.exited:
                    self.release_held()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.cfg.process.sample_interval)
        finally:
            self._stop.set()
            tasks = others
            for t in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(t, 2.0)
            for t in tasks:
                t.cancel()

    def stop(self) -> None:
        self._stop.set()

    def flush_held(self) -> None:
        """The agent is stopping: nothing held may be lost. A dead process's traceback is its
        crash; a live one's goes out as the ``traceback`` warning."""
        if not self._held:
            return
        s = self.last_sample
        if s is not None and not s.alive and not self.exited:
            self.on_exit(s.exit_code, None)
        else:
            self.release_held(force=True)

    def close(self) -> None:
        """Every log closed, on the thread of its reads; returns at once."""
        for s in self.streams:
            s.reader.close(self.log_io)


def _attach(streams: list[Stream]) -> None:
    """Each log's first open (and history), on the thread of its reads."""
    for s in streams:
        try:
            s.reader.attach()
        except Exception:
            log.exception("%s: cannot open it", s.path)


def _fill_within(reader: LogReader, wait: float, name: str) -> bool | None:
    """One ``reader.fill()`` on a thread, waited for at most ``wait`` seconds (the caller may be
    the event loop): whether more is waiting, or None when it did not return in time (the
    reader is then marked abandoned: it is not waited for again)."""
    if wait <= 0 or reader.abandoned:
        return None
    done = threading.Event()
    out: list[bool] = []

    def work() -> None:
        try:
            out.append(reader.fill())
        except Exception:
            log.exception("%s: read failed", reader.follower.path)
            out.append(False)

    offloop.start(work, name, then=done.set)
    if not done.wait(wait) or not out:
        reader.abandoned = True
        return None
    return out[0]


def _latest_redraws(batch: list[Any], stats: object) -> list[Any]:
    """A progress bar redraws one line with ``\r`` hundreds of times a second: of the segments
    of one line read together only the first (it carries a launcher's rank prefix) and the
    last (what the screen shows) are parsed, and any that may hold an error signature. The
    rest are counted as unparsed lines."""
    out = [batch[0]]
    first = 0  # index in ``out`` of the first segment of the current line
    for fl in batch[1:]:
        prev = out[-1]
        if fl.lineno != prev.lineno:
            first = len(out)
            out.append(fl)
        elif len(out) - 1 > first and not prev.cut and not may_hold_signature(prev.text):
            out[-1] = fl
        else:
            out.append(fl)
    skipped = len(batch) - len(out)
    if skipped:
        stats.lines += skipped  # type: ignore[attr-defined]
        stats.unparsed += skipped  # type: ignore[attr-defined]
    return out


def _from(records: list[Record], stream: Stream) -> list[Record]:
    """The records of ``stream``'s lines, each marked with the file its line number counts in."""
    source = str(stream.path)
    for r in records:
        r.source = source
    return records


def _may_be_handled(f: Finding) -> bool:
    """A bare Python traceback: printed by handled exceptions too (logging.exception,
    traceback.print_exc), so it waits for the process's fate. Launcher and signal lines
    (torchelastic's "failed (exitcode", ChildFailedError, srun, a fatal signal) report a
    death that already happened and go out at once."""
    lines = [str(x) for x in (f.evidence.get("lines") or [])]
    if not lines or "Traceback (most recent call last)" not in lines[0]:
        return False
    return not any("ChildFailedError" in x or "failed (exitcode" in x for x in lines)


def _still_running(f: Finding, after: float | None) -> Finding:
    when = f"was still running {after:.0f}s later" if after is not None else "then exited cleanly"
    return Finding(
        kind="traceback",
        severity=Severity.WARNING,
        rank=f.rank,
        message=(
            f"the log shows a crash-like error, but the process {when}: a handled exception, or a rank "
            f"stuck tearing down (a stall would follow). {f.message}"
        ),
        step=f.step,
        line=f.line,
        path=f.path,
        time=f.time,
        evidence=f.evidence,
    )
