"""The JSON documents of the API, built from the same snapshot as the metrics (``rankwatch.snapshot``).

JSON has no NaN: a non-finite number is written as the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"`` so that a NaN loss still reads as one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from rankwatch import __version__
from rankwatch.dumps.store import IncidentInfo
from rankwatch.records import Finding
from rankwatch.snapshot import AgentSnapshot, RankSnapshot

FINDINGS_DEFAULT = 100
FINDINGS_MAX = 1000


def json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def iso(epoch: float | None) -> str | None:
    if epoch is None or not math.isfinite(epoch):
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def finding_doc(f: Finding) -> dict[str, Any]:
    d = f.to_dict()
    d["time_iso"] = iso(f.time)
    return d


def ready(snap: AgentSnapshot) -> tuple[bool, list[str]]:
    if snap.attach_problems:
        return False, list(snap.attach_problems)
    if not snap.sources:
        return False, ["no rank is being watched yet"]
    missing = [s.detail for s in snap.sources if not s.attached]
    return not missing, missing or [s.detail for s in snap.sources]


def _process(v: RankSnapshot) -> dict[str, Any] | None:
    p = v.process
    if p is None:
        return None
    s = p.sample
    doc: dict[str, Any] = {"pid": p.pid, "exited": p.exited, "sampled": s is not None}
    if s is not None:
        doc.update(
            alive=s.alive,
            state=s.state,
            cpu_percent=round(s.cpu_percent, 2),
            cpu_seconds=round(s.cpu_time_s, 3),
            rss_bytes=s.rss_bytes,
            threads=s.threads,
            children=s.children,
        )
    return doc


def rank_doc(v: RankSnapshot, active: Iterable[Finding]) -> dict[str, Any]:
    st = v.state
    run, _, _, node = v.labels
    total, last = (st.total_steps, st.last_step) if st is not None else (None, None)
    latest = v.latest
    doc: dict[str, Any] = {
        "run": run,
        "rank": v.rank,
        "local_rank": v.local_rank if v.own else None,
        "node": node,
        "step": last,
        "total_steps": total,
        "progress_ratio": (last / total) if last is not None and total else None,
        "steps_logged": st.step_count if st is not None else 0,
        "last_progress": {"iso": iso(v.last_progress_time), "epoch": v.last_progress_time},
        "seconds_since_progress": v.seconds_since_progress,
        "stall_timeout_s": v.stall_timeout_s,
        "stalled": v.stalled,
        "rates": {
            "tokens_per_s": latest.get("tokens_per_s"),
            "samples_per_s": latest.get("samples_per_s"),
            "step_time_s": v.step_duration_s,
            "steps_per_s": v.steps_per_s,
            "eta_s": v.eta_s,
            "tflops": latest.get("tflops"),
            "mfu": latest.get("mfu"),
        },
        "loss": latest.get("loss"),
        "eval_loss": v.eval_loss,
        "grad_norm": latest.get("grad_norm"),
        "learning_rate": latest.get("learning_rate"),
        "process": _process(v),
        "logs": list(v.logs.paths) if v.logs is not None else [],
        "active_findings": [finding_doc(f) for f in active if f.rank == v.rank],
    }
    if v.sources is not None:
        doc["sources"] = {"attached": v.sources.attached, "detail": v.sources.detail}
    return doc


def status_doc(snap: AgentSnapshot) -> dict[str, Any]:
    active = snap.findings.active
    ident = snap.identity
    ok, reasons = ready(snap)
    return {
        "run": ident.run,
        "node": ident.node,
        "rank": ident.rank,
        "world_size": ident.world_size,
        "version": __version__,
        "time": iso(snap.time),
        "uptime_s": round(snap.time - snap.started_at, 3),
        "ready": ok,
        "ready_detail": reasons,
        "dumps_captured": snap.dumps.captured,
        "last_incident": snap.dumps.last_incident,
        "ranks": [rank_doc(v, active) for v in snap.ranks],
        "active_findings": [finding_doc(f) for f in active],
    }


def findings_doc(
    snap: AgentSnapshot,
    *,
    limit: int = FINDINGS_DEFAULT,
    active: bool = False,
    kind: str | None = None,
    rank: int | None = None,
) -> dict[str, Any]:
    pool: Iterable[Finding] = snap.findings.active if active else reversed(snap.findings.recent)
    out: list[dict[str, Any]] = []
    for f in pool:
        if (kind is None or f.kind == kind) and (rank is None or f.rank == rank):
            out.append(finding_doc(f))
            if len(out) >= limit:
                break
    return {"findings": out, "count": len(out), "limit": limit, "active": active}


def incident_doc(info: IncidentInfo) -> dict[str, Any]:
    return {
        "run": info.run,
        "incident": info.name,
        "reason": info.reason,
        "time": info.time.isoformat().replace("+00:00", "Z"),
        "ranks": list(info.ranks),
    }
