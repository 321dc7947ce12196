"""The JSON documents of the API, built from the same snapshot as the metrics.

JSON has no NaN: a non-finite number is written as the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"`` so that a NaN loss still reads as one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from rankwatch import __version__
from rankwatch.exporter.findings import FindingTracker
from rankwatch.exporter.view import RankView, rank_views, sources_status
from rankwatch.records import Finding

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


def ready(agent: Any) -> tuple[bool, list[str]]:
    watchers = list(agent.watchers)
    problems = list(getattr(agent, "attach_problems", {}).values())
    if problems:
        return False, problems
    if not watchers:
        return False, ["no rank is being watched yet"]
    results = [sources_status(w) for w in watchers]
    missing = [why for ok, why in results if not ok]
    return not missing, missing or [why for _, why in results]


def _process(v: RankView) -> dict[str, Any] | None:
    w = v.watcher
    if not v.own or w.prober is None:
        return None
    s = w.last_sample
    doc: dict[str, Any] = {"pid": w.prober.pid, "exited": w.exited, "sampled": s is not None}
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


def rank_doc(v: RankView, active: list[Finding]) -> dict[str, Any]:
    st = v.state
    run, _, _, node = v.labels
    total, last = (st.total_steps, st.last_step) if st is not None else (None, None)
    latest = v.latest
    doc: dict[str, Any] = {
        "run": run,
        "rank": v.rank,
        "local_rank": v.watcher.identity.local_rank if v.own else None,
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
        "logs": [str(s.path) for s in v.watcher.streams] if v.own else [],
        "active_findings": [finding_doc(f) for f in active if f.rank == v.rank],
    }
    if v.own:
        ok, why = sources_status(v.watcher)
        doc["sources"] = {"attached": ok, "detail": why}
    return doc


def status_doc(agent: Any, tracker: FindingTracker, *, started: float) -> dict[str, Any]:
    tracker.update(agent.findings)
    active = tracker.active()
    views = rank_views(list(agent.watchers))
    ident = agent.identity
    ok, reasons = ready(agent)
    now = time.time()
    incident = getattr(agent, "last_incident", None)
    return {
        "run": ident.run,
        "node": ident.node,
        "rank": ident.rank,
        "world_size": ident.world_size,
        "version": __version__,
        "time": iso(now),
        "uptime_s": round(now - started, 3),
        "ready": ok,
        "ready_detail": reasons,
        "dumps_captured": getattr(agent, "dumps_captured", 0),
        "last_incident": incident.name if incident is not None else None,
        "ranks": [rank_doc(v, active) for v in views],
        "active_findings": [finding_doc(f) for f in active],
    }


def findings_doc(
    agent: Any,
    tracker: FindingTracker,
    *,
    limit: int = FINDINGS_DEFAULT,
    active: bool = False,
    kind: str | None = None,
    rank: int | None = None,
) -> dict[str, Any]:
    if active:
        tracker.update(agent.findings)
        pool: Iterable[Finding] = tracker.active()
    else:
        pool = reversed(agent.findings)  # no await below: the list cannot change meanwhile
    out: list[dict[str, Any]] = []
    for f in pool:
        if (kind is None or f.kind == kind) and (rank is None or f.rank == rank):
            out.append(finding_doc(f))
            if len(out) >= limit:
                break
    return {"findings": out, "count": len(out), "limit": limit, "active": active}


def incident_doc(info: Any) -> dict[str, Any]:
    return {
        "run": info.run,
        "incident": info.name,
        "reason": info.reason,
        "time": info.time.isoformat().replace("+00:00", "Z"),
        "ranks": list(info.ranks),
    }
