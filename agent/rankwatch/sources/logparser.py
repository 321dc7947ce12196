"""One object per log stream: raw lines in, typed records out.

A stream may carry many ranks (``srun --label``, torchrun ``--tee``), so everything that
keeps state — the error-signature matcher and the format parser — exists once per rank
seen on the stream, created on demand.

Format auto-detection: until a format is decided every stripped line is offered to
``sniff_format``; the first positive answer decides. Generic formats (``json``, ``kv``)
match many things a specific format also prints, so for ``sniff_lines`` lines after a
generic decision a specific format may still take over; after that, or once a specific
format is decided, the choice is final. A forced format never sniffs.

Progress bars and run headers come before the first line that gives the format away
(tqdm draws step 10 before Hugging Face prints step 10's dict), so the last few such
lines are kept while the format is unknown and replayed into each rank's new parser.

A format parser that raises loses only that line: the error is counted, logged once per
parser, and the stream goes on.

Ranks come from the log's own text, so they are bounded: a rank outside the world (when its
size is known) or past the first ``max_ranks`` distinct ones is refused. Its lines are
counted (``ParseStats.rank_refused``), said once in the agent's log and dropped, so 20,000
forged ``[rankN]:`` prefixes cost no parser, engine or label set each.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rankwatch.records import ErrorRecord, Record, StepRecord
from rankwatch.sources import parsers as _formats
from rankwatch.sources.decorations import strip
from rankwatch.sources.parsers.base import FormatParser, LogLine
from rankwatch.sources.signatures import SignatureMatcher

if TYPE_CHECKING:
    from rankwatch.config.schema import LogsConfig

__all__ = ["LogParser", "ParseStats"]

log = logging.getLogger("rankwatch.parse")

_GENERIC = _formats.GENERIC
_REPLAY_LINES = 16


@dataclass
class ParseStats:
    lines: int = 0
    parsed: int = 0  # lines that produced at least one record
    unparsed: int = 0  # complete lines that produced none
    cut: int = 0  # lines the follower cut at max_line_bytes (only error signatures look at them)
    errors: int = 0  # exceptions caught from parsers (and, never expected, from matchers)
    rank_refused: int = 0  # lines naming a rank outside the world or past max_ranks: dropped
    shed: int = 0  # lines a reader far behind passed over unparsed (see runtime.watcher.shed)


def _about_other_rank(records: list[Record], admit: Callable[[int], bool]) -> None:
    """A launcher's report names the rank that failed (torchelastic's failure box and its
    "failed ... local_rank: 3" line): an unprefixed one is about that rank, not the stream's.
    ``admit`` keeps the rank inside the world (and the stream's cap on distinct ranks)."""
    for rec in records:
        if isinstance(rec, ErrorRecord):
            about = rec.details.get("about_rank")  # a message about another rank (its flight recorder)
            if isinstance(about, int):
                if admit(about):
                    rec.rank = about
            elif rec.rank is None:
                failed = rec.details.get("failed_rank")
                if isinstance(failed, int) and admit(failed):
                    rec.rank = failed


# A rank the line's own text names as a key=value field, where no launcher prefixed it: OLMo's
# "[olmo.util:158, rank=0]" header, and scripts that print "step=15 loss=nan lr=0.01 rank=3"
# into the one log that plain ``run -- torchrun`` and torch.multiprocessing.spawn share
# (tests/data/blackbox/s35b/repro/d39_plain_4rank_nan.log). "local_rank=", "node_rank=" and
# "--local_rank=0" are other numbers; a line naming two ranks (two records glued by a cut) names none.
_SAID_RANK = re.compile(r"(?<![\w.-])rank=(\d{1,7})(?!\d)")


# accelerate's ``MultiProcessAdapter.process`` (accelerate/logging.py, the logger
# ``accelerate.logging.get_logger`` returns) puts ``f"[RANK {state.process_index}] {msg}"``
# before every message, after whatever the logging format prints first ("11/28/2026 14:54:14 -
# INFO - __main__ - [RANK 1] step 15: loss nan", tests/data/blackbox/s36/repro); with
# ``main_process_only=False`` every process logs into the one pipe ``accelerate launch`` shares.
# Scripts mark their lines the same way by hand: "[rank 2] step 10 | loss nan | lr 0.01" (the
# s40 tester's accelerate script), at the line's start only (DeepSpeed's ``log_dist`` "[Rank 0]"
# inside a line says which ranks print it, not whose the numbers are).
_MARKED_RANK = re.compile(r"\[RANK (\d{1,7})\] |^\[rank (\d{1,7})\] ")


def _marked(body: str) -> bool:
    return "[RANK " in body or body.startswith("[rank ")


def _said_rank(body: str) -> int | None:
    found = {int(m) for m in _SAID_RANK.findall(body, 0, 4096)}
    if _marked(body):
        found.update(int(a or b) for a, b in _MARKED_RANK.findall(body, 0, 4096))
    return found.pop() if len(found) == 1 else None


_GLUED_MARK = re.compile(r"\[rank \d{1,7}\] ")


def _glued_marked(body: str) -> list[str]:
    """Two ranks' marked records run together ("[rank 2] step 3 | loss 6.2 | lr 0.01[rank 0] step
    3 | ..."): cut before each mark after the first, when the line starts with one."""
    starts = [m.start() for m in _GLUED_MARK.finditer(body, 0, 4096)]
    if len(starts) < 2 or starts[0] != 0:
        return []
    return [body[a:b] for a, b in itertools.pairwise([*starts, len(body)])]


_FIRST_KEY = re.compile(r"\s*([A-Za-z_][\w.]{0,40}=)")


def _glued(body: str) -> list[str]:
    """Two ranks' key=value records run together where the workers of one log raced (no
    newline between them: "step=16 loss=nan lr=0.01 rank=1step=16 loss=nan lr=0.01 rank=2" in
    tests/data/blackbox/s35b/repro/d39_plain_4rank_nan.log): cut after each ``rank=N`` that is
    followed at once by the line's own first key. Empty when the line is no such thing."""
    first = _FIRST_KEY.match(body)
    if first is None:
        return []
    key = first[1]
    pieces: list[str] = []
    start = 0
    for m in _SAID_RANK.finditer(body, 0, 4096):
        end = m.end()
        if body.startswith(key, end):
            pieces.append(body[start:end])
            start = end
    if not pieces:
        return []
    pieces.append(body[start:])
    return pieces


def _drawn(body: str) -> bool:
    """A progress bar's drawing: indented by tqdm's own padding ("  2%|▏ | 1/60"), never a
    continuation of the line above. Under the plain ``run -- torchrun`` form rank 0's
    unprefixed bar follows another rank's ``[rank1]:`` warning, and every later line starts with
    the bar: taken as continuations, all of rank 0's records were rank 1's
    (tests/data/blackbox/s35b/repro/hf_plain_torchrun_healthy.log)."""
    return "%|" in body


def _pipes_apart(parser: Any) -> None:
    apart = getattr(parser, "pipes_apart", None)
    if callable(apart):
        apart()


class LogParser:
    def __init__(
        self,
        *,
        default_rank: int | None = None,
        fmt: str = "auto",
        regex: str | None = None,
        sniff_lines: int = 200,
        max_ranks: int = 1024,
        world_size: int | None = None,
        json_repeat_window: int = _formats.JSON_REPEAT_WINDOW,
    ) -> None:
        self.default_rank = default_rank
        self.max_ranks = max(1, max_ranks)
        self.world_size = world_size if world_size is not None and world_size > 0 else None
        self.stats = ParseStats()
        self.ranks_seen: set[int] = set()
        self._last_lineno: int | None = None
        self._last_rank: int | None = None
        self._auto = fmt == "auto"
        self.format: str | None = None if self._auto else fmt
        self._regex = regex
        self._repeat_window = json_repeat_window
        self._sniff_lines = max(0, sniff_lines)
        self._upgrade_left = 0
        self._matchers: dict[int | None, SignatureMatcher] = {}
        self._parsers: dict[int | None, FormatParser] = {}
        self._waiting: set[int | None] = set()
        # Lines a parser may need before the format is known: (text, lineno, rank, time).
        self._before: deque[tuple[str, int, int | None, float | None]] = deque(maxlen=_REPLAY_LINES)
        self._logged: set[Any] = set()
        self._prev: dict[int | None, str] = {}  # each rank's last line while the format is unknown
        self._apart = False  # see pipes_apart
        if not self._auto:
            # Build one now so that an unknown format or a bad regex fails at startup.
            self._parsers[default_rank] = _formats.make_parser(
                fmt, regex=regex, repeat_window=json_repeat_window
            )

    @classmethod
    def configured(cls, logs: LogsConfig, *, default_rank: int | None, world_size: int | None) -> LogParser:
        """The reader ``logs:`` describes: the live agent and ``analyze`` both build theirs here,
        so a key one of them reads the other cannot miss."""
        return cls(
            default_rank=default_rank,
            fmt=logs.format,
            regex=logs.regex,
            sniff_lines=logs.sniff_lines,
            max_ranks=logs.max_ranks,
            world_size=world_size,
            json_repeat_window=logs.json_repeat_window,
        )

    # -- public -------------------------------------------------------------------------------

    def pipes_apart(self) -> None:
        """Another stream's bar segments are fed here too (a worker's stderr file relayed to
        its stdout file's reader): a format that pairs records with a bar's redraws (HF's)
        pairs them as through two pipes from the start."""
        if not self._apart:
            self._apart = True
            for parser in self._parsers.values():
                _pipes_apart(parser)

    def feed(
        self, text: str, lineno: int, *, cut: bool = False, now: float | None = None, clean: bool = False
    ) -> list[Record]:
        """``clean``: the reader already found no error-signature word in ``text``
        (``signatures.may_hold_signature``)."""
        st = self.stats
        st.lines += 1
        body, prank, ts = strip(text)
        if prank is None and ("rank=" in body or _marked(body)):
            pieces = _glued(body) or (_glued_marked(body) if _marked(body) else [])
            if pieces:
                # Two ranks' records one line: each goes its own way, as a \r segment would.
                st.lines -= 1
                when = ts if ts is not None else now
                return [rec for piece in pieces for rec in self.feed(piece, lineno, now=when)]
        if prank is not None:
            if prank not in self.ranks_seen and not self._admit(prank):
                st.rank_refused += 1
                self._last_lineno, self._last_rank = lineno, None
                return []
            rank: int | None = prank
        elif (
            ("rank=" in body or _marked(body))
            and (said := _said_rank(body)) is not None
            and self._admits(said)
        ):
            rank = said
        elif lineno == self._last_lineno:
            # A \r segment (tqdm) of a line whose launcher prefix came with its first segment.
            rank = self._last_rank
        elif (
            self._last_lineno == lineno - 1
            and body[:1] in (" ", "\t")
            and self._last_rank is not None
            and not _drawn(body)
        ):
            # An indented line right after a prefixed one continues its record (OLMo's metrics
            # under a "host:0 olmo.train INFO [step=N]" header, a traceback's frames).
            rank = self._last_rank
        else:
            rank = self.default_rank
        self._last_lineno, self._last_rank = lineno, rank
        when = ts if ts is not None else now

        recs: list[Record] | None = None
        if not cut and not self._waiting:
            parser = self._parsers.get(rank)
            if parser is not None and not self._upgrade_left:  # the format is settled: the usual line
                m = self._matchers.get(rank)
                if m is None or not m.busy:
                    recs = self._run(parser, body, lineno, rank, when)
                    if recs and all(type(r) is StepRecord and r.line == lineno for r in recs):
                        # A training step's own line is no error line (its "nan" is the NaN
                        # detector's): the signatures, the costliest test of a long line, are
                        # spared. A record completed by this line (OLMo's block, a held bar) is
                        # an earlier line's: this one is still looked at.
                        st.parsed += 1
                        return recs
        out: list[Record] = self._signatures(body, lineno, rank, when, clean)  # type: ignore[assignment]
        if out:
            # A launcher's report about another rank, bounded like any rank a stream names.
            _about_other_rank(out, self._admits)
        if cut:
            st.cut += 1
        else:
            if recs is None:
                parser = self._parsers.get(rank)
                if parser is not None and not self._upgrade_left:
                    recs = self._run(parser, body, lineno, rank, when)
                else:
                    recs = self._parse(body, lineno, rank, when)
            if recs:
                # A parser's records come first: they tell steps reached before this line's
                # error (a multi-line record this line completes, a bar drawn before it).
                out = recs + out if out else recs
        if out:
            st.parsed += 1
        elif not cut:
            st.unparsed += 1
        return out

    def finish(self) -> list[Record]:
        """End of stream (or a long quiet spell): flush every held-back error record.

        Feeding may continue afterwards; format parsers keep their state.
        """
        out: list[Record] = []
        for m in self._matchers.values():
            out.extend(self._guard(m.flush, "matcher"))
        _about_other_rank(out, self._admits)
        self._waiting.clear()
        for rank, parser in self._parsers.items():
            fin = getattr(parser, "finish", None)
            if callable(fin):
                recs = self._guard(fin, parser) or []
                out.extend(self._fill(recs, None, rank, None))
        return out

    def _admits(self, rank: int) -> bool:
        """A rank named by a launcher's report is believed as a rank prefix is: inside the
        world, and within the stream's cap on distinct ranks."""
        return rank in self.ranks_seen or self._admit(rank)

    def release_pending(self) -> list[Record]:
        """Records held back in case more lines complete them (a traceback, a DeepSpeed step
        told twice); for idle streams."""
        out: list[Record] = []
        for rank in list(self._waiting):
            out.extend(self._guard(self._matchers[rank].release, "matcher"))
        _about_other_rank(out, self._admits)
        self._waiting.clear()
        for rank, parser in self._parsers.items():
            rel = getattr(parser, "release", None)
            if callable(rel):
                out.extend(self._fill(self._guard(rel, parser) or [], None, rank, None))
        return out

    @property
    def framework(self) -> str | None:
        """The format that names the run: the framework DeepSpeed ran under once it showed
        (HF Trainer, Megatron, Lightning print the step records), else the detected format."""
        if self.format == "deepspeed":
            for parser in self._parsers.values():
                host = getattr(parser, "host", None)
                if host is not None:
                    return str(host.name)
        return self.format

    def progress(self, rank: int | None = None) -> Any:
        """The format parser's own progress view (HF tqdm bars), when it has one."""
        parser = self._parsers.get(rank if rank is not None else self.default_rank)
        attr = getattr(parser, "progress", None)
        if attr is None:
            return None
        if not callable(attr):
            return attr
        try:
            return attr()
        except Exception:
            return None

    # -- internals ------------------------------------------------------------------------------

    def _admit(self, rank: int) -> bool:
        """A rank not seen before: kept (and remembered) when the world holds it and the
        stream has named fewer than ``max_ranks`` ranks; else refused, said once."""
        world = self.world_size
        if (world is None or rank < world) and len(self.ranks_seen) < self.max_ranks:
            self.ranks_seen.add(rank)
            return True
        if "rank_refused" not in self._logged:
            self._logged.add("rank_refused")
            if world is not None and rank >= world:
                bound = f"outside the world of {world} ranks"
            else:
                bound = f"past the {self.max_ranks} ranks this stream may name (logs.max_ranks)"
            log.warning(
                "a log line names rank %d, %s: its lines are dropped and counted "
                '(rankwatch_log_lines_total{result="rank_refused"}); further refusals only counted',
                rank,
                bound,
            )
        return False

    def _signatures(
        self, body: str, lineno: int, rank: int | None, when: float | None, clean: bool = False
    ) -> list[ErrorRecord]:
        m = self._matchers.get(rank)
        if m is None:
            m = self._matchers[rank] = SignatureMatcher()
        try:
            out = m.feed(body, lineno, rank, when, clean)  # positional: the call of every line
        except Exception:
            self._error("matcher", "error-signature matcher failed")
            out = []
        waiting = self._waiting
        if not waiting and not m.busy:  # the usual line: no traceback open on any rank
            return out
        if m.waiting:
            waiting.add(rank)
        elif rank in waiting:
            waiting.discard(rank)
        if waiting and (len(waiting) > 1 or rank not in waiting):
            for r in list(waiting):
                if r != rank:
                    other = self._matchers[r]
                    out = out + self._guard(lambda o=other: o.expire(lineno), "matcher")
                    if not other.waiting:
                        waiting.discard(r)
        return out

    def _parse(self, body: str, lineno: int, rank: int | None, when: float | None) -> list[Record]:
        parser = self._parsers.get(rank)
        if parser is not None and not self._upgrade_left:  # the format is settled: the usual line
            return self._run(parser, body, lineno, rank, when)
        if self._auto and (self.format is None or self._upgrade_left > 0):
            self._sniff(body)
            if self.format is None and ("oss" in body or "OSS" in body):
                # A record may spread over two lines: the step on one, the loss on the next
                # (Horovod examples: "Epoch 0/100, Batch 17/29316" then "Total loss is 29.8").
                prev = self._prev.get(rank)
                if prev is not None:
                    self._sniff(f"{prev} | {body}")
            if self.format is None:
                if body.strip() and len(body) <= 400:
                    self._prev[rank] = body
                    if len(self._prev) > 64:
                        self._prev.clear()
                if "%|" in body or "steps =" in body or "teration" in body:
                    # Bars, run headers, and a step told on a line of its own before the rows of
                    # its metrics (RSL-RL: "Learning iteration 8391/10000", then "Value function
                    # loss: inf" gives the format away).
                    self._before.append((body, lineno, rank, when))
                return []
        parser = self._parsers.get(rank)
        out: list[Record] = []
        if parser is None:
            try:
                parser = _formats.make_parser(
                    self.format or "", regex=self._regex, repeat_window=self._repeat_window
                )
            except Exception:
                self._error("make_parser", f"cannot build a parser for format {self.format!r}")
                return []
            self._parsers[rank] = parser
            if self._apart:
                _pipes_apart(parser)
            if self._before:
                out = self._replay(parser, rank)
        out.extend(self._run(parser, body, lineno, rank, when))
        return out

    def _run(
        self, parser: FormatParser, body: str, lineno: int, rank: int | None, when: float | None
    ) -> list[Record]:
        try:
            recs = parser.parse(LogLine(body, lineno, rank, when))
        except Exception:
            self._error(parser, f"format parser {self.format!r} failed on line {lineno}")
            return []
        return self._fill(recs, lineno, rank, when) if recs else []

    def _replay(self, parser: FormatParser, rank: int | None) -> list[Record]:
        mine = [item for item in self._before if item[2] == rank]
        self._before = deque((item for item in self._before if item[2] != rank), maxlen=_REPLAY_LINES)
        out: list[Record] = []
        for body, lineno, _, when in mine:
            out.extend(self._run(parser, body, lineno, rank, when))
        return out

    def _sniff(self, body: str) -> None:
        if self.format is not None:
            self._upgrade_left -= 1
        try:
            name = _formats.sniff_format(body)
        except Exception:
            self._error("sniff_format", "format sniffing failed")
            return
        if not name:
            return
        if self.format is None:
            self.format = name
            self._upgrade_left = self._sniff_lines if name in _GENERIC else 0
            log.info("log format detected: %s", name)
            return
        if name not in _GENERIC and name != self.format:
            log.info("log format refined: %s -> %s", self.format, name)
            self.format = name
            self._parsers.clear()
            self._upgrade_left = 0

    @staticmethod
    def _fill(recs: list[Record], lineno: int | None, rank: int | None, when: float | None) -> list[Record]:
        for r in recs:
            if r.rank is None:
                r.rank = rank
            if r.line is None:
                r.line = lineno
            if r.time is None:
                r.time = when
        return recs

    def _guard(self, fn: Any, who: Any) -> list[Any]:
        try:
            return list(fn())
        except Exception:
            self._error(who, "error-signature matcher failed" if who == "matcher" else "parser finish failed")
            return []

    def _error(self, who: Any, what: str) -> None:
        self.stats.errors += 1
        key = who if isinstance(who, str) else id(who)
        if key in self._logged:
            return
        self._logged.add(key)
        log.warning("%s (further errors from it are counted, not logged)", what, exc_info=True)
