"""The alert as the dispatcher hands it to sinks: one finding, or one kind on several ranks.

It is plain JSON-able data so an undelivered alert can wait in the spool across an agent
restart and be rebuilt unchanged (same id, same start time) by the next agent.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Protocol
from urllib.parse import quote

from rankwatch.errorkinds import OWN_FAILURES, cause_text, same_cause
from rankwatch.ranksets import describe_ranks, format_ranks
from rankwatch.records import Diagnosis, FirstFailure, Severity

Status = Literal["firing", "resolved"]


@dataclass
class AlertMember:
    """One rank's part of an alert."""

    rank: int | None
    message: str
    step: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    dump_path: str | None = None
    starts_at: float = 0.0  # wall clock (epoch seconds) when the condition was first seen
    node: str | None = None  # set when a peer agent's rank joins the message (another node)
    subject: str | None = None  # what within the rank it is about (a GPU's UUID): Finding.subject
    diagnosis: Diagnosis | None = None  # Finding.diagnosis: suspect, first failure, stacks
    user: str | None = None  # Finding.user: whose process the rank is (a node daemon's many users)


@dataclass(eq=False)
class AlertMessage:
    run: str
    kind: str
    severity: Severity
    status: Status
    members: list[AlertMember]
    node: str
    world_size: int | None = None
    # The sender saw every rank of the world (its own, or present on the alert board), so
    # "7 of 8 ranks" is a fact; a per-node agent that sees 8 of 32 ranks must not claim it.
    saw_all: bool = False
    repeat: bool = False
    grafana_url: str | None = None
    report_url: str | None = None  # the incident's report (alerts.report_url), where it has one
    ends_at: float | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)

    @property
    def ranks(self) -> list[int | None]:
        return [m.rank for m in self.members]

    @property
    def suspect(self) -> int | None:
        return suspect_rank(self.members, self.kind)

    @property
    def rank(self) -> int | None:
        """The rank to point a human at: the suspect, else the lowest rank."""
        s = self.suspect
        if s is not None:
            return s
        known = sorted(r for r in self.ranks if r is not None)
        return known[0] if known else None

    @property
    def step(self) -> int | None:
        steps = [m.step for m in self.members if m.step is not None]
        return min(steps) if steps else None

    @property
    def message(self) -> str:
        lead = next((m for m in self.members if m.rank == self.rank), self.members[0])
        return lead.message

    @property
    def dump_path(self) -> str | None:
        return next((m.dump_path for m in self.members if m.dump_path), None)

    @property
    def nodes(self) -> list[str]:
        """Every node with a rank in the message, the sender's first."""
        seen = [self.node]
        for m in self.members:
            if m.node and m.node not in seen:
                seen.append(m.node)
        return seen

    @property
    def starts_at(self) -> float:
        return min(m.starts_at for m in self.members)

    @property
    def title(self) -> str:
        """`stall on 7 of 8 ranks, suspect rank 2`; prefixed when resolved or repeated."""
        n = len(self.members)
        ranks = list(dict.fromkeys(self.ranks))
        if len(ranks) == 1 and n > 1:  # several subjects of one rank (two hot GPUs)
            r = ranks[0]
            subjects = ", ".join(str(m.subject) for m in self.members)
            body = (self.kind if r is None else f"{self.kind} on rank {r}") + f" ({subjects})"
        elif n == 1:
            r = self.members[0].rank
            body = self.kind if r is None else f"{self.kind} on rank {r}"
        elif self.world_size and self.saw_all:  # ranks, not members: a rank's two GPUs are one rank
            body = f"{self.kind} on {len(ranks)} of {self.world_size} ranks"
        else:
            body = f"{self.kind} on {len(ranks)} ranks ({rank_list(ranks)})"
        s = self.suspect
        if s is not None and self.status == "firing":
            body += f", suspect rank {s}"
        if self.status == "resolved":
            return f"resolved: {body}"
        return f"still firing: {body}" if self.repeat else body

    @property
    def diagnosis(self) -> Diagnosis | None:
        """The lead member's diagnosis (the suspect's own, else the first one that has one);
        with none, the first failure among the members (``first_member``). It carries the
        alert's world size where the judgement that made it did not know it."""
        lead = same_failure_member(self.members)
        lead = lead or next(
            (m for m in self.members if m.rank == self.rank and m.diagnosis is not None), None
        )
        lead = lead or next((m for m in self.members if m.diagnosis is not None), None)
        if lead is not None:
            d = lead.diagnosis
            assert d is not None
        else:
            first = first_member(self.members, self.kind)
            if first is None or first.rank is None:
                return None
            at = f" at step {first.step}" if first.step is not None else ""
            d = Diagnosis(
                suspects=(first.rank,),
                verdict="first_failure",
                first_failure=FirstFailure(
                    first.rank, self.kind, first.starts_at or None, f"{self.kind}{at}", node=first.node
                ),
            )
        if d.suspect is not None and self.suspect is None and failed_alike(self.members, self.kind):
            d = d.but(suspects=(), verdict="same_failure")
        if d.world_size is None and self.world_size:
            d = d.but(world_size=self.world_size)
        return d

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.label
        for doc, m in zip(d["members"], self.members, strict=True):
            doc["diagnosis"] = m.diagnosis.to_json() if m.diagnosis is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AlertMessage:
        d = dict(d)
        d["severity"] = Severity.parse(d["severity"])
        d["members"] = [
            AlertMember(**{**m, "diagnosis": Diagnosis.from_json(m.get("diagnosis"))}) for m in d["members"]
        ]
        return cls(**d)


def failed_alike(members: list[AlertMember], kind: str | None) -> bool:
    """A rank's own failure that every member reports alike (a script that cannot start, a
    module missing on every rank): a cause common to the ranks, no rank to blame."""
    if kind not in OWN_FAILURES or len({m.rank for m in members}) < 2:
        return False
    cause = cause_text(members[0].message)
    return all(same_cause(cause, cause_text(m.message)) for m in members)


def same_failure_member(members: list[AlertMember]) -> AlertMember | None:
    """The member judged to have failed the same way as another rank, if any."""
    return next(
        (m for m in members if m.diagnosis is not None and m.diagnosis.verdict == "same_failure"), None
    )


def suspect_rank(members: list[AlertMember], kind: str | None = None) -> int | None:
    """The rank a human should look at first, kept deliberately simple.

    1. The rank a member's :class:`~rankwatch.records.Diagnosis` names (the cross-rank judgement).
    2. Else, for a rank's own failure on several ranks (``FIRST_FAILURE_KINDS``), the rank that
       failed first, when that is unambiguous (``first_member``).
    3. Else, with three or more ranks, the single rank whose evidence ``classification``
       differs from the one all the others share (e.g. the one busy rank among idle ones
       waiting in a collective).
    Otherwise none; and none when a member failed the same way as another (``same_failure``:
    a cause common to the ranks, whichever was judged first).
    """
    if same_failure_member(members) is not None:
        return None
    named = [(m, m.diagnosis.suspect) for m in members if m.diagnosis is not None]
    named = [(m, s) for m, s in named if s is not None]
    if len(named) >= 2 and all(s == m.rank for m, s in named):
        # Each judged alone, before the other's record was there: each its own first failure.
        # They do not outvote each other: which failed first, or alike (``first_member``).
        first = first_member(members, kind)
        if first is not None:
            return first.rank
        return None if failed_alike(members, kind) else named[0][1]
    if named:
        return named[0][1]
    first = first_member(members, kind)
    if first is not None:
        return first.rank
    if len(members) < 3:
        return None
    classes = [m.evidence.get("classification") for m in members]
    if any(c is None for c in classes):
        return None
    distinct = set(classes)
    if len(distinct) != 2:
        return None
    odd = [m for m in members if classes.count(m.evidence.get("classification")) == 1]
    return odd[0].rank if len(odd) == 1 else None


# A rank's own failure at a point of the training. In a synchronous job its peers follow a step
# or a collective later: DDP's all-reduce carries one rank's NaN gradients to every rank, whose
# loss is NaN the step after (the s35 tester's torch 2.13 gloo run: rank 1 at step 20, rank 0 at
# 21); a rank's crash ends its peers' next collective (``detectors.crossrank.first_failures``
# orders those by time). The earliest is the one to look at.
FIRST_FAILURE_KINDS = frozenset({*OWN_FAILURES, "nan_loss"})


def first_member(members: list[AlertMember], kind: str | None) -> AlertMember | None:
    """The member of a ``FIRST_FAILURE_KINDS`` alert on several ranks that failed first, when
    that is unambiguous: the lowest step when every member has one, else the earliest start
    when every member has one. A tie names nobody (ranks that went NaN at the same step did
    not follow one another; but of ranks NaN at one step only by their gradients, the one whose
    own loss was NaN is where it came from), nor does a member of no known rank, nor an error every member
    reports alike (a script that cannot start, a module missing on every rank)."""
    if kind not in FIRST_FAILURE_KINDS or len({m.rank for m in members}) < 2:
        return None
    if any(m.rank is None for m in members):
        return None
    if failed_alike(members, kind):
        return None  # every rank failed the same way: a common cause, whichever was seen first
    steps = [m.step for m in members]
    starts = [m.starts_at or None for m in members]
    for values in (steps, starts):
        known = [v for v in values if v is not None]
        if len(known) < len(values):
            continue
        firsts = [m for m, v in zip(members, values, strict=True) if v == min(known)]
        if len({m.rank for m in firsts}) == 1:
            return firsts[0]
        if kind == "nan_loss" and values is steps:
            # Ranks NaN at the same step, only one of them by its own loss: the others' NaN is
            # in their gradients only, which DDP's all-reduce brought from that rank.
            own = [m for m in firsts if "loss" in (m.evidence.get("nonfinite") or ())]
            if len({m.rank for m in own}) == 1 and len(own) < len(firsts):
                return own[0]
        return None
    return None


def rank_list(ranks: list[int | None]) -> str:
    """`0-3, 5`, `odd 1-4095`: short for a human, whatever the count (``rankwatch.ranksets``)."""
    known = sorted({r for r in ranks if r is not None})
    text = format_ranks(known, sep=", ", min_run=2, limit=RANK_ITEMS)
    if None in ranks:  # a member of no known rank (a rank with two subjects is listed once)
        text = f"{text}, ?" if text else "?"
    return text


RANK_ITEMS = 12  # a title or a field names at most this many items of a rank set


def jsonable(v: Any) -> Any:
    """Evidence as strict JSON: NaN/Inf become strings (receivers reject bare NaN), odd types str()."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x) for x in v]
    return str(v)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render_link(template: str | None, run: str, rank: int | None, kind: str) -> str | None:
    """Fill `{run}`, `{rank}`, `{kind}`; other braces stay, so any URL is a valid template."""
    if not template:
        return None
    return (
        template.replace("{run}", run)
        .replace("{rank}", "" if rank is None else str(rank))
        .replace("{kind}", kind)
    )


def render_report_link(
    template: str | None, run: str, rank: int | None, kind: str, incident: str | None, node: str
) -> str | None:
    """``alerts.report_url`` filled like ``grafana_url``, plus ``{incident}`` (the folder's name)
    and ``{node}``; None when the template names an incident and the alert has none."""
    if not template or ("{incident}" in template and not incident):
        return None
    filled = render_link(template, run, rank, kind) or ""
    return filled.replace("{incident}", quote(incident or "", safe="")).replace(
        "{node}", quote(node, safe="")
    )


def verdict_lines(diagnosis: Diagnosis | None) -> list[str]:
    """The diagnosis a cross-rank finding carries, as a few plain lines: the suspect and why,
    the first failure with its time."""
    out: list[str] = []
    if diagnosis is None:
        return out
    suspects = list(diagnosis.suspects)
    verdict = diagnosis.verdict or ""
    why = VERDICT_WHY.get(verdict, "")
    if suspects:
        who = describe_ranks(suspects)
        out.append(f"suspect: {who}" + (f": {why}" if why else ""))
    elif verdict:
        out.append(f"no single suspect: {why or verdict}")
    first = diagnosis.first_failure
    if first is not None and first.rank is not None:
        at = f" at {iso(first.time)}" if first.time is not None else ""
        out.append(f"first failure: rank {first.rank}, {first.how or first.kind or 'failed'}{at}")
    return out


# What each of ``dumps.diff``'s verdicts (and the first failure) says about the suspect.
VERDICT_WHY = {
    "not_in_collective": "the only rank not waiting in a collective; the others wait for it",
    "only_in_collective": "the only rank in a collective the others never entered",
    "collective_mismatch": "the ranks wait in different collectives (a code path taken on some ranks only)",
    "missing_ranks": "every dumped rank waits; this one could not be dumped",
    "majority": "its stack differs from the majority's",
    "same_collective": "every rank waits in the same collective: the cause is outside the dumped ranks",
    "first_failure": "it failed first; the others' failures and stalls are consequences",
    "straggler": "it works while its peers wait in collectives for it; their slowdown is its",
    "hang": "it hung first (a stall named it); the others' timeouts are consequences",
    "same_failure": "the ranks failed the same way: a cause common to them (code, data, configuration, "
    "environment), not one rank",
}


class DeliveryError(Exception):
    """A sink could not deliver. ``permanent`` means retrying cannot help (bad token, unknown channel)."""

    def __init__(self, reason: str, *, retry_after: float | None = None, permanent: bool = False) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.permanent = permanent


class AlertSink(Protocol):
    """Where alerts go. ``deliver`` raises DeliveryError; anything else counts as a retryable failure.

    Optional attributes the dispatcher looks for: ``timeout`` (seconds one delivery may take),
    ``refresh_interval`` (re-post active alerts this often, for receivers that forget them)
    and ``async aclose()``.
    """

    name: str

    async def deliver(self, alert: AlertMessage) -> None: ...
