"""PyTorch's Flight Recorder, read: which rank never entered collective N, or entered another op.

Every process group keeps a ring of the collectives its rank *entered*, numbered per group
(``collective_seq_id``), with the op (``profiling_name``, e.g. ``gloo:all_reduce``), tensor
sizes and the Python call site. Across ranks, the first sequence number where the ranks
disagree is the answer: a rank whose last entry is below the others' never entered the next
collective; ranks with different ops at the same number took different code paths.

What torch 2.13 records for gloo (tests/data/flight_recorder/README.md): the entries above and
``pg_status`` (``last_enqueued_collective``, ``last_completed_collective``), but every entry
stays ``state: scheduled`` with no start or completion time, and gloo has neither the debug
pipe (``TORCH_FR_DEBUG_INFO_PIPE_FILE``) nor the dump on timeout (``TORCH_FR_DUMP_TEMP_FILE``):
the trace exists only inside the process, from ``torch._C._distributed_c10d._dump_fr_trace()``.
Under NCCL the agent collects it through the pipe into the incident folder
(``flight-recorder-rank-<r>.pkl``).

Traces are pickles; they are read with an unpickler that builds only plain containers, so a
file planted in the dumps folder cannot run code.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwatch.ranksets import format_ranks

_FILE_RE = re.compile(r"^flight-recorder-rank-(\d+)(?:\.pkl|\.json)?$")
MAX_BYTES = 64 << 20


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing {module}.{name}: a flight-recorder trace holds plain data only"
        )


def load_trace(data: bytes) -> dict[str, Any] | None:
    """A trace from its bytes (pickle or JSON), or None when it is neither."""
    if data[:1] in (b"{", b"["):
        try:
            doc = json.loads(data)
        except ValueError:
            return None
    else:
        try:
            doc = _PlainUnpickler(io.BytesIO(data)).load()
        except Exception:
            return None
    return doc if isinstance(doc, dict) else None


def load_folder(folder: Path) -> dict[int, dict[str, Any]]:
    """Every rank's trace in an incident folder."""
    out: dict[int, dict[str, Any]] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return out
    for p in entries:
        m = _FILE_RE.match(p.name)
        if not m or not p.is_file():
            continue
        try:
            if p.stat().st_size > MAX_BYTES:
                continue
            doc = load_trace(p.read_bytes())
        except OSError:
            continue
        if doc is not None:
            out[int(m.group(1))] = doc
    return out


@dataclass
class Collective:
    seq: int
    op: str
    sizes: Any
    site: str | None


@dataclass
class FrVerdict:
    group: str
    suspects: list[int]
    reason: str
    last_entered: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "suspects": self.suspects,
            "reason": self.reason,
            "last_entered": {str(k): v for k, v in self.last_entered.items()},
        }


def _site(frames: Any) -> str | None:
    """The innermost frame outside torch (the call site a human looks at)."""
    for f in frames or []:
        if not isinstance(f, dict):
            continue
        name = str(f.get("filename") or "")
        if "/torch/" not in name and "\\torch\\" not in name:
            return f"{f.get('name')} ({name.rsplit('/', 1)[-1]}:{f.get('line')})"
    return None


def _by_group(trace: dict[str, Any]) -> dict[str, dict[int, Collective]]:
    groups: dict[str, dict[int, Collective]] = {}
    for e in trace.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        seq = e.get("collective_seq_id")
        if not isinstance(seq, int) or seq <= 0:
            continue
        pg = e.get("process_group")
        key = str(pg[0] if isinstance(pg, (list, tuple)) and pg else e.get("pg_id", ""))
        op = str(e.get("profiling_name") or "?").split(":", 1)[-1]
        groups.setdefault(key, {})[seq] = Collective(seq, op, e.get("input_sizes"), _site(e.get("frames")))
    return groups


def _who(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks, limit=16)


def analyze(traces: dict[int, dict[str, Any]]) -> FrVerdict | None:
    """The first disagreement between ranks, per process group; None when they agree."""
    per_rank = {r: _by_group(t) for r, t in traces.items()}
    groups = sorted({g for gs in per_rank.values() for g in gs})
    for g in groups:
        seqs = {r: gs.get(g, {}) for r, gs in per_rank.items()}
        last = {r: max(s) if s else 0 for r, s in seqs.items()}
        top = max(last.values())
        # Compare the sequence numbers every rank still holds in its ring.
        start = max(min(s) if s else 0 for s in seqs.values())
        for n in range(max(start, 1), top + 1):
            present = {r: s[n] for r, s in seqs.items() if n in s}
            absent = sorted(r for r in seqs if n not in seqs[r] and last[r] < n)
            kinds: dict[tuple[str, str], list[int]] = {}
            for r, c in present.items():
                kinds.setdefault((c.op, json.dumps(c.sizes)), []).append(r)
            if absent:
                c = next(iter(present.values()))
                at: dict[int, list[int]] = {}
                for r in absent:
                    at.setdefault(last[r], []).append(r)
                behind = ", ".join(f"{_who(rs)} at #{seq}" for seq, rs in sorted(at.items()))
                return FrVerdict(
                    g,
                    absent,
                    f"{_who(absent)} never entered collective #{n} ({c.op} from {c.site or '?'}) that "
                    f"{_who(sorted(present))} entered ({behind})",
                    last,
                )
            if len(kinds) > 1:
                sides = sorted(kinds.items(), key=lambda kv: (len(kv[1]), kv[1]))
                text = "; ".join(
                    f"{_who(sorted(rs))} entered {present[rs[0]].op} (sizes {json.loads(sz)}) from "
                    f"{present[rs[0]].site or '?'}"
                    for (_, sz), rs in sides
                )
                unique = len(sides) > 1 and len(sides[0][1]) < len(sides[1][1])
                return FrVerdict(
                    g, sorted(sides[0][1]) if unique else [], f"collective #{n} mismatch: {text}", last
                )
    return None


def format_verdict(v: FrVerdict | None, ranks: list[int]) -> str:
    if not ranks:
        return ""
    if v is None:
        who = format_ranks(ranks, limit=16)
        return f"flight recorder (ranks {who}): every rank entered the same collectives\n"
    return f"flight recorder: {v.reason}\n"
