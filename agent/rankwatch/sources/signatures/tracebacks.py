"""The multi-line error reader: a small state machine per (stream, rank).

Errors span lines: a Python traceback is one event from ``Traceback (most recent call
last):`` through its final exception line, plus the lines Python and PyTorch append to
the message (the CUDA "kernel errors might be asynchronously reported" advice, NCCL's
``Last error:``, torchelastic's failure box, chained tracebacks). Interleaved ranks must not
share one matcher. A finished traceback is held back until the next line shows it is not
continued; ``flush`` (end of stream), ``release`` (stream went quiet) or ``expire`` (other ranks
moved on) hand it out. One-line errors are named by ``catalogue.classify``.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from rankwatch.records import ErrorRecord, Severity
from rankwatch.sources.signatures.catalogue import _BOX_ROOT, NOT_AN_ERROR, classify, may_hold_signature
from rankwatch.sources.signatures.rules import (
    _C,
    Hit,
    _host_oom,
    _short,
    message_rank,
    spawn_process,
)

# --- Python tracebacks ----------------------------------------------------------------
_TB_HEAD = "Traceback (most recent call last)"
_EXC_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_EXC_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit", "Iteration", "Warning", "Failure", "Fault")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in (.+))?')
_RICH_FRAME = re.compile(r"[│|] (\S+\.py):(\d+) in (\S+)")  # rich.traceback's boxed frames
_RICH_BOX = frozenset("│╭╰|")
_LIBRARY_PATH = ("site-packages", "dist-packages", "/lib/python", "<frozen", "/bin/", "\\lib\\")
_CHAIN_HEADS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
    # torch.multiprocessing.spawn: the parent's ProcessRaisedException, then the child's own
    # traceback under "-- Process 1 terminated with the following error:". One event.
    "-- Process ",
)
# Lines that extend the message of the error just seen rather than start a new one.
_CONT = re.compile(
    r"\s*(?:CUDA kernel errors might be|For debugging consider passing|Compile with .?TORCH_USE_CUDA_DSA"
    r"|Device-side assertions? w|nccl[A-Z]\w*Error\b|Last error:|Exception raised from |frame #\d+:"
    r"|Search for .cuda|(?:Current thread|Thread) 0x[0-9a-fA-F]+|File \"|If reserved but unallocated"
    r"|See documentation for Memory Management|Including non-PyTorch memory|Of the allocated memory)"
)
_BOX_FIELD = re.compile(r"(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)")
_BOX_RANK = re.compile(r"(\d+)(?: \(local_rank: (\d+)\))?")
_BOX_EXIT = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
_BOX_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\)")

_IDLE, _TB, _TAIL, _CHAIN, _BOX, _LEAD = range(6)
_DEDUP_LINES = 1000  # the same condition re-reported within this many lines is one event
_ATTACH_LINES = 20  # continuation lines this close to a one-line error join its evidence
_OOM_KILL_NEAR = 50  # a "Killed" this soon after an OOM-kill line was that OOM kill
_TAIL_LINES = 200  # a finished traceback waits at most this many stream lines for more
_MAX_NOISE = 50  # stray lines inside a traceback before giving up on its final line
_MAX_TB_LINES = 20000


def _is_exception_line(stripped: str) -> re.Match[str] | None:
    m = _EXC_LINE.match(stripped)
    if m is None:
        return None
    name = m[1]
    if name.endswith(_EXC_SUFFIXES) or (m[2] is not None and ("." in name or name[:1].isupper())):
        return m
    return None


def _glued_head(s: str) -> bool:
    """A traceback's head written after a progress bar that ended without a newline (tqdm on
    stderr, then Python's traceback on the same stream): "...6.04s/it, loss=0.18] Traceback (most
    recent call last):", or straight after the bar's closing bracket ("0/4878 [00:00<?, ?it/s]Traceback
    (most recent call last):"). Its frames follow at Python's own two-space indent."""
    at = s.rfind(_TB_HEAD)
    return s.rstrip().endswith(_TB_HEAD + ":") and at > 0 and s[at - 1] in " ]"


def _is_rule(stripped: str) -> bool:
    return len(stripped) >= 8 and stripped.count("=") == len(stripped)


class _Pending:
    """A traceback (or torchelastic failure box) being collected."""

    __slots__ = (
        "after_last_error", "blanks", "box", "box_entry", "box_section", "cont", "exc", "first_line",
        "first_time", "frame", "frames", "half", "head", "indent", "last_line", "lead", "noise",
        "omitted", "rank", "rules", "tail", "total",
    )  # fmt: skip

    def __init__(self, lineno: int, time: float | None, rank: int | None, indent: int, half: int) -> None:
        self.first_line = lineno
        self.first_time = time
        self.last_line = lineno
        self.rank = rank
        self.indent = indent
        self.half = half
        self.head: list[str] = []
        self.tail: deque[str] = deque(maxlen=half)
        self.omitted = 0
        self.total = 0
        self.exc: list[tuple[str, int, float | None]] = []
        self.frame: str | None = None  # innermost training-code frame of the current section
        self.frames: list[str | None] = []
        self.noise = 0
        self.blanks = 0
        self.cont = 0
        self.after_last_error = False
        self.rules = 0
        self.box: list[tuple[str, dict[str, Any]]] = []
        self.box_entry: dict[str, Any] | None = None
        self.box_section = "other"
        self.lead: Hit | None = None  # a one-line error that a traceback may go on to explain

    def add(self, text: str, lineno: int) -> None:
        self.total += 1
        self.last_line = lineno
        if len(self.head) < self.half:
            self.head.append(text)
            return
        if len(self.tail) == self.half:
            self.omitted += 1
        self.tail.append(text)

    def evidence(self) -> list[str]:
        out = list(self.head)
        if self.omitted:
            out.append(f"... {self.omitted} lines omitted ...")
        out.extend(self.tail)
        return out

    def box_line(self, stripped: str) -> None:
        if stripped.startswith("Root Cause"):
            self.box_section = "root"
            return
        if stripped.startswith("Failures:"):
            self.box_section = "other"
            return
        if stripped.startswith("[") and stripped.endswith("]:"):
            self.box_entry = {}
            self.box.append((self.box_section, self.box_entry))
            return
        m = _BOX_FIELD.match(stripped)
        if m is None or self.box_entry is None or m[1] in self.box_entry:
            return
        key, val = m[1], m[2].strip()
        entry = self.box_entry
        entry[key] = val
        if key == "rank":
            r = _BOX_RANK.match(val)
            if r:
                entry["rank_n"] = int(r[1])
                if r[2]:
                    entry["local_rank"] = int(r[2])
        elif key == "exitcode":
            e = _BOX_EXIT.match(val)
            if e:
                entry["exitcode_n"] = int(e[1])
                if e[2]:
                    entry["pid"] = int(e[2])
        elif key == "traceback":
            s = _BOX_SIGNAL.search(val)
            if s:
                entry["signal"] = s[2]


class SignatureMatcher:
    """Turns the lines of one rank's stream into ``ErrorRecord``s.

    ``feed`` returns the records a line completes; a traceback's record comes out when
    the line after it shows it is over (or on ``flush``/``release``/``expire``).
    """

    def __init__(self, *, max_evidence: int = 200) -> None:
        self._state = _IDLE
        self._p: _Pending | None = None
        self._half = max(2, max_evidence // 2)
        self._seen: dict[tuple[Any, ...], int] = {}
        self._last: ErrorRecord | None = None
        self._last_line = 0
        self._last_wants_next = False
        self._oom_kill_line = -_OOM_KILL_NEAR - 1  # last line that reported a host OOM kill
        self._spawn: tuple[int, int] | None = None  # torch.multiprocessing's "-- Process N": (N, line)

    @property
    def waiting(self) -> bool:
        """A finished traceback is held back, waiting to see whether it continues."""
        return self._state == _TAIL or self._state == _CHAIN or self._state == _LEAD

    @property
    def busy(self) -> bool:
        return self._state != _IDLE

    def feed(
        self,
        text: str,
        lineno: int,
        rank: int | None = None,
        time: float | None = None,
        clean: bool = False,
    ) -> list[ErrorRecord]:
        """``clean``: the caller found that ``may_hold_signature`` is false for this line."""
        if self._state == _IDLE:
            if NOT_AN_ERROR in text:
                return []
            return self._idle(text, lineno, rank, time, clean)
        if self._state == _TB:
            return self._in_traceback(text, lineno, rank, time)
        if self._state == _TAIL:
            return self._in_tail(text, lineno, rank, time)
        if self._state == _CHAIN:
            return self._in_chain(text, lineno, rank, time)
        if self._state == _LEAD:
            return self._in_lead(text, lineno, rank, time)
        return self._in_box(text, lineno, rank, time)

    def flush(self) -> list[ErrorRecord]:
        """End of stream: whatever was being collected becomes a record."""
        out = self._finish() if self._p is not None else []
        self._last = None
        return out

    def release(self) -> list[ErrorRecord]:
        """The stream went quiet: hand out a finished traceback that was held back."""
        return self._finish() if self.waiting else []

    def expire(self, lineno: int) -> list[ErrorRecord]:
        """Hand out a held-back traceback once the stream is far past it."""
        p = self._p
        if self.waiting and p is not None and lineno - p.last_line > _TAIL_LINES:
            return self._finish()
        return []

    # -- idle ---------------------------------------------------------------------------

    def _idle(
        self, text: str, lineno: int, rank: int | None, time: float | None, clean: bool = False
    ) -> list[ErrorRecord]:
        last = self._last
        if last is not None:
            if lineno - self._last_line <= _ATTACH_LINES and (self._last_wants_next or _CONT.match(text)):
                if len(last.evidence) < 2 * self._half:
                    last.evidence.append(text)
                self._last_line = lineno
                self._last_wants_next = text.strip() == "Last error:"
                return []
            self._last = None
            self._last_wants_next = False
        if "Traceback" in text:
            s = text.lstrip()
            if s.startswith(_TB_HEAD) or (s.startswith("╭") and _TB_HEAD in s) or _glued_head(s):
                p = self._start(text, lineno, rank, time, len(text) - len(s))
                spawn = self._spawn
                if rank is None and spawn is not None and 0 < lineno - spawn[1] <= 3:
                    p.rank = spawn[0]  # the child's traceback under "-- Process 1 terminated ..."
                return []
        if clean or not may_hold_signature(text):
            return []
        if text.startswith("-- Process "):  # holds "error": past the gate
            n = spawn_process(text)
            if n is not None:
                self._spawn = (n, lineno)
                return []
        if "ChildFailedError" in text:
            s = text.lstrip()
            if _is_exception_line(s):
                p = self._start(text, lineno, rank, time, len(text) - len(s))
                p.exc.append((s, lineno, time))
                p.frames.append(None)
                self._state = _BOX
                return []
        if _BOX_ROOT in text and text.lstrip().startswith(_BOX_ROOT):
            # A failure box whose ChildFailedError traceback was not kept: read from its root cause.
            p = self._start(text, lineno, rank, time, 0)
            p.rules = 1
            p.box_line(text.strip())
            self._state = _BOX
            return []
        hit = classify(text)
        if hit is None:
            return []
        if hit.kind == "oom":
            d = hit.details
            if d.get("host") and ("events" in d or "process" in d or "tasks" in d):
                self._oom_kill_line = lineno
        elif hit.details.get("shell") and lineno - self._oom_kill_line <= _OOM_KILL_NEAR:
            hit = _host_oom(
                _short(f"{text.strip()}: SIGKILL from the OOM killer (line {self._oom_kill_line})"),
                signal="SIGKILL",
                killed=True,
            )
        said = message_rank(text) if rank is None else None
        if said is not None:
            rank = said
        if hit.key is not None:
            # Unprefixed lines of several ranks share this matcher: the rank a message names
            # keeps their repetitions apart (one OOM is one event whoever tells it).
            key = hit.key if said is None or hit.kind == "oom" else (*hit.key, said)
            prev = self._remember(key, lineno)
            if prev is not None and lineno - prev <= _DEDUP_LINES:
                return []
        if hit.details.get("lead"):
            # torchrun logs the failed child, then raises ChildFailedError with a box that
            # names its global rank: one event, told best by the box when it comes.
            p = self._start(text, lineno, rank, time, 0)
            p.lead = hit
            self._state = _LEAD
            return []
        rec = ErrorRecord(
            kind=hit.kind,
            summary=hit.summary,
            evidence=[text],
            severity=hit.severity,
            details=hit.details,
            rank=rank,
            line=lineno,
            time=time,
        )
        self._last = rec
        self._last_line = lineno
        self._last_wants_next = False
        return [rec]

    def _remember(self, key: tuple[Any, ...], lineno: int) -> int | None:
        prev = self._seen.get(key)
        if prev is None and len(self._seen) >= 512:
            self._seen = {k: v for k, v in self._seen.items() if lineno - v <= _DEDUP_LINES}
        self._seen[key] = lineno
        return prev

    def _start(self, text: str, lineno: int, rank: int | None, time: float | None, indent: int) -> _Pending:
        self._last = None
        p = _Pending(lineno, time, rank, indent, self._half)
        p.add(text, lineno)
        self._p = p
        self._state = _TB
        return p

    def _in_lead(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.lstrip()
        if not s:
            p.blanks += 1
            return self._finish() if p.blanks > 2 else []
        if s.startswith(_TB_HEAD):
            p.add(text, lineno)
            p.indent = len(text) - len(s)
            p.blanks = 0
            self._state = _TB
            return []
        out = self._finish()
        out.extend(self._idle(text, lineno, rank, time))
        return out

    # -- inside a traceback ----------------------------------------------------------------

    def _in_traceback(
        self, text: str, lineno: int, rank: int | None, time: float | None
    ) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.lstrip()
        indent = len(text) - len(s)
        if s and indent > p.indent:
            p.add(text, lineno)
            if s.startswith('File "'):
                m = _FRAME.match(s)
                if m and not any(x in m[1] for x in _LIBRARY_PATH):
                    p.frame = f"{m[1]}:{m[2]} {m[3] or '?'}".rstrip()
            return self._finish() if p.total > _MAX_TB_LINES else []
        if s.startswith(_TB_HEAD):
            out = self._finish()
            self._start(text, lineno, rank, time, indent)
            return out
        if s[:1] in _RICH_BOX:
            p.add(text, lineno)
            m = _RICH_FRAME.match(s)
            if m and not any(x in m[1] for x in _LIBRARY_PATH):
                p.frame = f"{m[1]}:{m[2]} {m[3]}"
            return self._finish() if p.total > _MAX_TB_LINES else []
        if s and _is_exception_line(s.rstrip()):
            p.add(text, lineno)
            p.exc.append((s.rstrip(), lineno, time))
            p.frames.append(p.frame)
            p.frame = None
            p.blanks = 0
            p.cont = 0
            self._state = _BOX if "ChildFailedError" in s else _TAIL
            return []
        p.add(text, lineno)
        p.noise += 1
        return self._finish() if p.noise > _MAX_NOISE else []

    def _in_tail(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.strip()
        if not s:
            p.blanks += 1
            return self._finish() if p.blanks > 2 else []
        if s.startswith(_CHAIN_HEADS):
            p.add(text, lineno)
            self._state = _CHAIN
            return []
        if (
            p.blanks == 0
            and p.cont < 2 * self._half
            and (p.after_last_error or _CONT.match(text) or text[0].isspace())
        ):
            p.add(text, lineno)
            p.cont += 1
            p.after_last_error = s == "Last error:"
            return []
        out = self._finish()
        out.extend(self._idle(text, lineno, rank, time))
        return out

    def _in_chain(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.lstrip()
        if not s.strip():
            p.blanks += 1
            return self._finish() if p.blanks > 6 else []
        if s.startswith(_TB_HEAD):
            p.add(text, lineno)
            p.indent = len(text) - len(s)
            p.noise = 0
            self._state = _TB
            return []
        out = self._finish()
        out.extend(self._idle(text, lineno, rank, time))
        return out

    def _in_box(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.strip()
        if _is_rule(s):
            p.add(text, lineno)
            p.rules += 1
            return self._finish() if p.rules >= 2 else []
        if p.rules == 0:
            if not s:
                p.blanks += 1
                return self._finish() if p.blanks > 2 else []
            out = self._finish()  # no box follows this ChildFailedError line
            out.extend(self._idle(text, lineno, rank, time))
            return out
        p.add(text, lineno)
        p.box_line(s)
        return self._finish() if p.total > 2000 else []

    # -- the record ------------------------------------------------------------------------

    def _finish(self) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        self._p = None
        self._state = _IDLE
        self._last = None
        details: dict[str, Any] = {"first_line": p.first_line}
        kind, severity = "crash", _C
        lead = p.lead
        if lead is not None:
            details = {**lead.details, **details}
            details.pop("lead", None)
        if lead is not None and not p.exc:
            kind, severity, summary = lead.kind, lead.severity, lead.summary
            line, time = p.first_line, p.first_time
            if p.total > 1:
                details["incomplete"] = True
        elif p.exc:
            summary, line, time = p.exc[-1]
            m = _EXC_LINE.match(summary)
            if m:
                details["exception"] = m[1]
                if m[2]:
                    details["message"] = m[2]
            if len(p.exc) > 1:
                details["chained"] = len(p.exc)
            frame = next((f for f in reversed(p.frames) if f), None)
            if frame:
                details["frame"] = frame
            hit = None
            for exc_line, _, _ in reversed(p.exc):
                h = classify(exc_line)
                if h is not None and h.kind != "crash":
                    hit = h
                    break
            if hit is not None:
                kind, severity = hit.kind, hit.severity
                details = {**hit.details, **details}
                if hit.key is not None:
                    prev = self._remember(hit.key, line)
                    if kind == "oom" and prev is not None and 0 <= line - prev <= _DEDUP_LINES:
                        return []  # the framework's one-line report of this OOM came first
            elif details.get("exception", "").endswith("KeyboardInterrupt"):
                # SIGINT: a Ctrl-C in its terminal, or a launcher or scheduler passing one on. A
                # stop from outside, not a failure (a hang it ended has its own stall finding).
                severity = Severity.INFO
                details["interrupted"] = True
            else:
                # torch.multiprocessing.spawn's join() on a child that died without a traceback of
                # its own (a signal, an exit code): the child and how it ended, not the parent's
                # exception text.
                spawned = next((h for h in map(classify, (x for x, _, _ in p.exc)) if _spawned(h)), None)
                if spawned is not None:
                    summary = spawned.summary
                    details = {**spawned.details, **details, "said_rank": spawned.details["failed_rank"]}
            if p.box:
                summary = self._box_summary(p, details) or summary
        elif p.box:
            line, time = p.first_line, p.first_time
            summary = self._box_summary(p, details) or "torchelastic failure box"
            if "failed_rank" in details:
                details["said_rank"] = details["failed_rank"]  # the launcher's box names the rank
        else:
            line, time = p.last_line, p.first_time
            summary = "Traceback without its final exception line (stream ended or output interleaved)"
            if p.frame:
                details["frame"] = p.frame
            details["incomplete"] = True
            # Interleaved output can glue the exception onto a frame line ("main(args)RuntimeError:
            # [!] NaN loss with decoder_loss."): a known error in the frames still names it.
            for text in p.evidence():
                h = classify(text) if may_hold_signature(text) else None
                if h is not None and h.kind != "crash":
                    kind, severity, summary = h.kind, h.severity, h.summary
                    details = {**h.details, **details}
                    break
        evidence = p.evidence()
        rank = p.rank
        if rank is None:
            # No launcher prefix: the rank the error names itself (Megatron's "Rank 3: found NaN
            # ..."), or the process torch.multiprocessing.spawn says failed.
            said = details.get("said_rank")
            if said is None and p.exc:
                said = message_rank(p.exc[-1][0])
            if said is None:
                said = next((n for n in map(spawn_process, evidence) if n is not None), None)
            if said is not None:
                rank = details["said_rank"] = said
        rec = ErrorRecord(
            kind=kind,
            summary=_short(summary),
            evidence=evidence,
            severity=severity,
            details=details,
            rank=rank,
            line=line,
            time=time if time is not None else p.first_time,
        )
        return [rec]

    @staticmethod
    def _box_summary(p: _Pending, details: dict[str, Any]) -> str | None:
        roots = [e for sec, e in p.box if sec == "root"] or [e for _, e in p.box]
        if not roots:
            return None
        root = roots[0]
        details["failed_ranks"] = [e["rank_n"] for _, e in p.box if "rank_n" in e]
        for src, dst in (
            ("rank_n", "failed_rank"), ("local_rank", "local_rank"), ("exitcode_n", "exitcode"),
            ("pid", "pid"), ("signal", "signal"), ("host", "host"),
        ):  # fmt: skip
            if src in root:
                details[dst] = root[src]
        parts = ["torchelastic: rank", str(root.get("rank_n", "?"))]
        if "local_rank" in root:
            parts.append(f"(local_rank {root['local_rank']})")
        if root.get("host"):
            parts.append(f"on {root['host']}")
        parts.append(f"failed with exitcode {root.get('exitcode_n', '?')}")
        text = " ".join(parts)
        if "signal" in root:
            text += f" ({root['signal']})"
            if root["signal"] == "SIGKILL":
                text += " - SIGKILL usually means the host OOM killer"
        return text


def _spawned(h: Hit | None) -> bool:
    return h is not None and h.key is not None and h.key[0] == "spawn_exited"
