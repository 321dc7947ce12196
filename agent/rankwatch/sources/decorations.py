"""Strip what launchers and log shippers put in front of a training job's own text.

Parsers and error signatures want the line the framework printed. Between it and us sit
ANSI colour, timestamps (python logging, ``ts``, Docker/containerd/Kubernetes), ``srun
--label`` task numbers, torchrun ``--tee``/``--redirects`` prefixes and Open MPI
``--tag-output`` tags, ``[host:N]:`` and, after a timestamp, ``host:N`` process tags (OLMo's
console format puts ``hostname:local_rank`` there), stacked in whatever order the launchers were
nested. The rank they name and the time they carry are worth keeping, so ``strip`` returns
both. A ``host:N`` tag names the local rank: two processes of one host never merge, the same
local rank on two hosts does (a rank is one number).

Almost every line carries no decoration at all, so the fast path is one ``in`` test and
one first-character test; regexes only run on lines that start like a decoration.
Decorations are only recognised at the start of the line (never after leading white
space, so Megatron's own `` [2024-...] iteration`` stays intact), and only one space
after a prefix is consumed so that traceback indentation survives.
"""

from __future__ import annotations

import calendar
import re

__all__ = ["strip"]

# The same colour codes written in caret notation ("^[[34m", ESC as "^[": cat -v, a pasted
# terminal): BAGEL's logs as posted in ByteDance-Seed/Bagel#80.
_CARET_ANSI = re.compile(r"\^\[\[[0-9;?]{0,16}[A-Za-z]")
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x40-\x5f])")

_TS_CORE = (
    r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T ](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
    r"(?:[.,](?P<f>\d{1,9}))?(?P<tz>Z|[+-]\d\d:?\d\d)?"
)
# Bare timestamp (ISO, python logging, containerd/CRI "stdout F"), then its separator.
_TS = re.compile(_TS_CORE + r"(?: (?:stdout|stderr) [FP](?: |$)| - | \| | |$)")
_TS_BRACKET = re.compile(r"\[" + _TS_CORE + r"\](?: - | |$)")
# Hugging Face example scripts: "[INFO|trainer.py:2345] 2024-05-01 10:00:00,123 >> ".
_HF_LOGGING = re.compile(r"\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\|[^\]\s]*\] " + _TS_CORE + r" >> ?")
_PY_LOGGING = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.<>-]+:")
# k2/icefall's logging format after its timestamp: "INFO [train.py:518] (2/4) " (rank/world).
_ICEFALL = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \[[\w.-]{1,64}:\d{1,6}\] \((?P<r>\d{1,7})/\d{1,7}\) "
)
_MPI = re.compile(r"\[\d+,(?P<r>\d{1,7})\]<std(?:out|err|diag)>:")
_SRUN = re.compile(r" *(?P<r>\d{1,7}): ")
# "[gpu187:1]:" (the head before "]:"), and after a timestamp "gpu187:1\t" / "node-3:0  " /
# "gpu187:1: ". A host name holds a digit, "-" or "." ("Epoch:1 ..." is not one); NCCL's
# "host:pid:tid [0]" is not a tag. A bare tag at the very start of a line is not looked for:
# that would cost every NCCL INFO line (they start with their host) a look.
_HOST_HEAD = re.compile(r"\[(?P<h>[A-Za-z][\w.-]{0,63}):(?P<r>\d{1,7})$")
_HOST = re.compile(r"(?P<h>[A-Za-z][\w.-]{0,63}):(?P<r>\d{1,7})(?:\t| {2,8}|: )")

# Ray prefixes a worker's output with its process: "(pid=18175, ip=10.0.0.2) ",
# "(RayTrainWorker pid=1234, ip=10.0.0.2) ", "(ActorWorker(actor_train-1) pid=18175, ip=...) ".
# It names no rank (Ray Train's workers print theirs in the text); the text after it is the job's.
_RAY = re.compile(
    r"\((?:[\w.-]{1,64}(?:\([^()]{0,64}\))? )?pid=\d{1,9}(?:, ip=[\w.:-]{1,64})?"
    r"(?:, rank=(?P<r>\d{1,7}))?\) ?"
)

_START = frozenset("[0123456789 DIWEC(")
_MAX_PREFIXES = 8
_MINUTE_CACHE: dict[tuple[str, str, str, str, str], int] = {}
_RANK_CACHE: dict[str, tuple[int, bool]] = {}  # "[rank3" -> (3, True), "[gpu187:1" -> (1, True)


def _epoch(m: re.Match[str]) -> float | None:
    """Seconds since the epoch; a timestamp without a zone is UTC. None if not a real date."""
    key = (m["y"], m["mo"], m["d"], m["h"], m["mi"])
    base = _MINUTE_CACHE.get(key)
    if base is None:
        y, mo, d, h, mi = (int(v) for v in key)
        if not (1 <= mo <= 12 and 1 <= d <= 31 and h <= 23 and mi <= 59 and y >= 1970):
            return None
        base = calendar.timegm((y, mo, d, h, mi, 0, 0, 0, 0))
        if len(_MINUTE_CACHE) >= 4096:
            _MINUTE_CACHE.clear()
        _MINUTE_CACHE[key] = base
    sec = int(m["s"])
    if sec > 60:
        return None
    t = float(base + sec)
    frac = m["f"]
    if frac:
        t += int(frac) / 10 ** len(frac)
    tz = m["tz"]
    if tz and tz != "Z":
        digits = tz[1:].replace(":", "")
        offset = int(digits[:2]) * 3600 + int(digits[2:]) * 60
        t += -offset if tz[0] == "+" else offset
    return t


# torchrun's own prefix is ``[${role_name}${local_rank}]:`` (torch/distributed/elastic/agent/
# server/local_elastic_agent.py): ``[default3]:``, or ``[trainer3]:`` under ``--role trainer``.
# A role is the user's word; these words before a number are a log's own counters, not a role.
_ROLE = re.compile(r"\[([a-z][a-z_-]{0,31})(\d{1,7})")
_NOT_ROLES = frozenset(
    {"rank", "epoch", "step", "iter", "iteration", "batch", "gpu", "cuda", "node", "worker"}
)


def _bracket_rank(head: str) -> tuple[int, bool] | None:
    """``[rank3`` / ``[default3`` / ``[trainer3`` (before ``]:``): (rank, whether one following
    space goes too)."""
    for tag, space in (("[rank", True), ("[default", False)):
        if head.startswith(tag):
            digits = head[len(tag) :]
            if 0 < len(digits) <= 7 and digits.isdecimal():
                return int(digits), space
    role = _ROLE.fullmatch(head)
    if role is not None and role[1] not in _NOT_ROLES:
        return int(role[2]), False
    # torchrun --log-line-prefix-template "[${role_name}${local_rank}|${rank}]:" (torchtune's
    # multi-node recipes print "[trainer0|0]:"): the global rank follows the bar.
    bar = head.find("|")
    if bar > 0 and head[1:2].isalpha():
        digits = head[bar + 1 :]
        if 0 < len(digits) <= 7 and digits.isdecimal() and head[bar - 1 : bar].isdecimal():
            return int(digits), False
    return None


def _host_tag(text: str) -> re.Match[str] | None:
    """A ``host:N`` tag at the start of ``text``; cheap for the lines that cannot hold one."""
    i = text.find(":", 1, 72)
    if i < 0:
        return None
    rest = text[i + 1 : i + 11]
    k = len(rest) - len(rest.lstrip("0123456789"))
    if k == 0 or k > 7:
        return None
    after = rest[k : k + 2]
    if not (after[:1] == "\t" or after == "  " or after == ": "):
        return None  # NCCL's "host:pid:tid [0] NCCL INFO" and the like
    m = _HOST.match(text)
    if m is None:
        return None
    h = m["h"]
    if not any(c.isdecimal() or c == "-" or c == "." for c in h):
        return None
    return m


def strip(raw: str) -> tuple[str, int | None, float | None]:
    """(text, rank, epoch seconds) with every leading launcher decoration removed.

    When prefixes nest (``0: [rank3]: ...``) the innermost rank wins: it is the one the
    training process itself belongs to. The first timestamp found wins for the time.
    """
    if "\x1b" in raw:
        raw = _ANSI.sub("", raw)
    if "^[[" in raw:
        raw = _CARET_ANSI.sub("", raw)
    if not raw or raw[0] not in _START:
        return raw, None, None
    if raw[0] == " " and not (raw[1:2] == " " or raw[1:2].isdecimal()):
        return raw, None, None  # Megatron's " [2024-...] iteration": no srun label (the loop's first test)
    text = raw
    rank: int | None = None
    when: float | None = None
    for _ in range(_MAX_PREFIXES):
        if not text or text[0] not in _START:
            break
        c = text[0]
        m: re.Match[str] | None = None
        if c == "[":
            head, sep, rest = text.partition("]:")
            if sep and len(head) <= 72:
                hit = _RANK_CACHE.get(head)
                if hit is None:
                    hit = _bracket_rank(head)
                    if hit is None:
                        hm = _HOST_HEAD.match(head)
                        if hm is not None:
                            hit = (int(hm["r"]), True)
                    if hit is not None and len(_RANK_CACHE) < 4096:
                        _RANK_CACHE[head] = hit
                if hit is not None:
                    rank = hit[0]
                    text = rest[1:] if hit[1] and rest[:1] == " " else rest
                    continue
            # "[1,3]<stdout>:" and "[2024-..." open with a digit, "[INFO|..." with a letter.
            digit = text[1:2].isdigit()
            m = _MPI.match(text) if digit else None
            if m is not None:
                rank = int(m["r"])
            else:
                m = _TS_BRACKET.match(text) if digit else _HF_LOGGING.match(text)
                if m is not None:
                    t = _epoch(m)
                    if t is None:
                        break
                    if when is None:
                        when = t
        elif c == " ":
            if not (text[1:2] == " " or text[1:2].isdecimal()):
                break  # Megatron's own " [2024-...] iteration": no srun label
            m = _SRUN.match(text)
            if m is not None:
                rank = int(m["r"])
        elif c in "DIWEC":
            m = _PY_LOGGING.match(text)
            if m is None and ") " in text[:96]:
                m = _ICEFALL.match(text)
                if m is not None:
                    rank = int(m["r"])
        elif c == "(":
            m = _RAY.match(text)
            if m is not None and m["r"] is not None:
                rank = int(m["r"])
        else:
            m = _TS.match(text)
            if m is not None:
                t = _epoch(m)
                if t is None:
                    break
                if when is None:
                    when = t
            else:
                m = _SRUN.match(text)
                if m is not None:
                    rank = int(m["r"])
        if m is None or m.end() == 0:
            break
        text = text[m.end() :]
        if text and text[0].isalpha() and text[0] not in _START:
            # OLMo: "2024-08-06 09:59:26.181 host:0\tolmo.train:908\tINFO\t[step=1/739328]"
            hm = _host_tag(text)
            if hm is not None:
                rank = int(hm["r"])
                text = text[hm.end() :].lstrip(" \t")
    return text, rank, when
