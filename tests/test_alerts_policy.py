"""The alert policy alone: plain calls on a fake clock, no event loop, no sinks, no files."""

from __future__ import annotations

import pytest

from rankwatch.actions.alerts.message import AlertMessage
from rankwatch.actions.alerts.policy import AlertPolicy
from rankwatch.config.schema import AlertsConfig
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity

pytestmark = pytest.mark.unit

IDENT = Identity(run="job", rank=0, local_rank=0, world_size=4, node="n")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def policy(**kw: float) -> tuple[AlertPolicy, list[AlertMessage], Clock]:
    out: list[AlertMessage] = []
    clock = Clock()
    cfg = AlertsConfig(**{"startup_quiet": 0.0, "group_wait": 5.0, "repeat_interval": 0.0, **kw})
    p = AlertPolicy(cfg, IDENT, out.append, clock=clock, wall=clock)
    p.restart([], None, {})
    p.start(clock())
    return p, out, clock


def stall(rank: int, *, resolved: bool = False) -> Finding:
    return Finding("stall", Severity.CRITICAL, rank, "ok" if resolved else "stuck", 5, resolved=resolved)


def test_grouping_dedup_and_resolve_are_plain_calls() -> None:
    p, out, clock = policy()
    for r in range(4):
        p.take(stall(r))
    p.take(stall(1))  # a second firing of an active alert: nothing new
    assert p.pump(clock()) == clock() + 5.0 and out == []
    clock.t += 5.0
    p.pump(clock())
    assert [(m.status, m.ranks, m.title) for m in out] == [("firing", [0, 1, 2, 3], "stall on 4 of 4 ranks")]
    p.take(stall(2, resolved=True))
    clock.t += 5.0
    p.pump(clock())
    assert [(m.status, m.ranks) for m in out[1:]] == [("resolved", [2])]


def test_flap_within_group_wait_is_silent_and_startup_quiet_holds() -> None:
    p, out, clock = policy(startup_quiet=60.0)
    p.take(stall(0))
    p.take(stall(0, resolved=True))
    p.take(stall(3))
    clock.t += 10.0
    assert p.pump(clock()) == 1060.0 and out == []  # held by the quiet window, not dropped
    clock.t = 1060.0
    p.pump(clock())
    assert [m.ranks for m in out] == [[3]]


def test_repeat_interval_resends_what_is_still_firing() -> None:
    p, out, clock = policy(group_wait=0.0, repeat_interval=100.0)
    p.take(stall(1))
    p.pump(clock())
    clock.t += 100.0
    assert p.pump(clock()) == clock() + 100.0
    assert [m.title for m in out] == ["stall on rank 1", "still firing: stall on rank 1"]


def _failure(kind: str, rank: int, severity: Severity, *, first: int, t: float) -> Finding:
    from rankwatch.records import FirstFailure

    f = Finding(kind, severity, rank, f"{kind} on {rank}", 7, time=t)
    if first == rank:
        f.diagnosed(suspects=(rank,), first_failure=FirstFailure(rank, kind, t))
    else:
        f.diagnosed(first_failure=FirstFailure(first, "oom", t - 0.1))
    return f


def test_one_failure_is_one_alert_whatever_its_echoes() -> None:
    """Rank 1's OOM, its crash (the same error's end), and rank 0's gloo error and crash that
    follow it (first failure: rank 1): one alert, titled by the first, naming rank 1; the
    consequences arriving after it was sent add nothing. A failure of its own on another rank
    (rank 3's OOM, its own first failure) is an alert of its own."""
    p, out, clock = policy()
    p.take(_failure("oom", 1, Severity.CRITICAL, first=1, t=1000.0))
    p.take(_failure("crash", 1, Severity.CRITICAL, first=1, t=1000.1))
    p.take(_failure("peer_error", 0, Severity.WARNING, first=1, t=1000.2))
    clock.t += 5.0
    p.pump(clock())
    assert [(m.kind, m.ranks, m.title) for m in out] == [("oom", [1], "oom on rank 1, suspect rank 1")]
    p.take(_failure("crash", 0, Severity.CRITICAL, first=1, t=1006.0))
    p.take(_failure("oom", 3, Severity.CRITICAL, first=3, t=1006.0))
    clock.t += 5.0
    p.pump(clock())
    assert [m.title for m in out[1:]] == ["oom on rank 3, suspect rank 3"]


def test_a_more_severe_failure_of_a_rank_after_its_sent_warning_is_news() -> None:
    """Rank 0's own NCCL timeout (a warning, its own first failure) is sent; its crash
    (critical) after that is an escalation: sent, not folded away. So is a consequence of
    another rank's failure (rank 2's crash after its sent gloo warning): the job died.
    (``death_wait`` 0: the warning goes out at ``group_wait``, before the death.)"""
    p, out, clock = policy(death_wait=0.0)
    p.take(_failure("nccl_timeout", 0, Severity.WARNING, first=0, t=1000.0))
    clock.t += 5.0
    p.pump(clock())
    p.take(_failure("crash", 0, Severity.CRITICAL, first=0, t=1006.0))
    clock.t += 5.0
    p.pump(clock())
    assert [m.title for m in out] == [
        "nccl_timeout on rank 0, suspect rank 0",
        "crash on rank 0, suspect rank 0",
    ]
    p.take(_failure("peer_error", 2, Severity.WARNING, first=1, t=1010.0))
    clock.t += 5.0
    p.pump(clock())
    p.take(_failure("crash", 2, Severity.CRITICAL, first=1, t=1016.0))
    clock.t += 5.0
    p.pump(clock())
    assert [(m.title, m.severity) for m in out[2:]] == [
        ("peer_error on rank 2, suspect rank 1", Severity.WARNING),
        ("crash on rank 2, suspect rank 1", Severity.CRITICAL),
    ]


def _left_early(kind: str, severity: Severity, t: float) -> Finding:
    """Rank 0's failure after rank 1 returned from main with status 0 (the s35 tester's c25,
    torch 2.13 gloo under ``torchrun --tee 3``): the cross-rank judgement names rank 1."""
    from rankwatch.records import FirstFailure

    f = Finding(kind, severity, 0, "rank 1 failed first: exited with status 0 at step 14", 14, time=t)
    f.diagnosed(first_failure=FirstFailure(1, "exit", t - 5.0, "exited with status 0 at step 14"))
    return f


def test_a_dead_job_pages_when_its_crash_follows_a_sent_warning() -> None:
    """c25: rank 0's gloo error (warning) went out; its crash (critical), held while the
    first failure was judged, comes after. The webhook gets a critical alert for the crash,
    naming rank 1: with ``min_severity: critical`` routing, the job's death pages."""
    from rankwatch.actions.alerts._webhook import payload

    p, out, clock = policy(group_wait=2.0, death_wait=0.0)
    p.take(_left_early("peer_error", Severity.WARNING, 1000.0))
    clock.t += 2.0
    p.pump(clock())
    clock.t += 3.0
    p.take(_left_early("crash", Severity.CRITICAL, 1000.25))
    clock.t += 2.0
    p.pump(clock())
    docs = [payload(m) for m in out]
    assert [(d["summary"], d["severity"], d["suspect"]) for d in docs] == [
        ("peer_error on rank 0, suspect rank 1", "warning", 1),
        ("crash on rank 0, suspect rank 1", "critical", 1),
    ]


def test_a_peers_warning_waits_for_its_ranks_death_which_leads_one_page() -> None:
    """c25 on a loaded node: rank 0's gloo warning, then its crash 5 s later (after
    ``group_wait``): the warning waits ``death_wait`` for the death, so the job's death is one
    critical alert naming rank 1, not a warning and then a page. A warning whose rank lives on
    goes out once ``death_wait`` passed."""
    from rankwatch.actions.alerts._webhook import payload

    p, out, clock = policy(group_wait=2.0)  # death_wait: the default (10 s)
    p.take(_left_early("peer_error", Severity.WARNING, 1000.0))
    clock.t += 2.0
    p.pump(clock())
    assert out == []
    clock.t += 3.0
    p.take(_left_early("crash", Severity.CRITICAL, 1000.25))
    clock.t += 2.0
    p.pump(clock())
    p.pump(clock() + 20.0)
    docs = [payload(m) for m in out]
    assert [(d["summary"], d["severity"], d["suspect"]) for d in docs] == [
        ("crash on rank 0, suspect rank 1", "critical", 1)
    ]
    p2, out2, clock2 = policy(group_wait=2.0)
    p2.take(_left_early("peer_error", Severity.WARNING, 1000.0))
    assert p2.pump(clock2()) == clock2() + 12.0
    clock2.t += 12.0
    p2.pump(clock2())
    assert [m.title for m in out2] == ["peer_error on rank 0, suspect rank 1"]


def test_a_folded_alert_is_led_by_its_most_severe_member() -> None:
    """The same two findings within ``group_wait``: one alert, at the crash's severity and
    titled by it (the job died), still naming rank 1."""
    from rankwatch.actions.alerts._webhook import payload

    p, out, clock = policy(group_wait=2.0)
    p.take(_left_early("peer_error", Severity.WARNING, 1000.0))
    clock.t += 1.0
    p.take(_left_early("crash", Severity.CRITICAL, 1000.25))
    clock.t += 2.0
    p.pump(clock())
    p.pump(clock() + 10.0)
    docs = [payload(m) for m in out]
    assert [(d["summary"], d["severity"], d["suspect"], d["kind"]) for d in docs] == [
        ("crash on rank 0, suspect rank 1", "critical", 1, "crash")
    ]


def _nan(rank: int, step: int | None, t: float, *, run: str = "89663ef6", world: int | None = 2) -> Finding:
    f = Finding("nan_loss", Severity.CRITICAL, rank, f"NaN/Inf at step {step}: loss is nan.", step, time=t)
    f.run, f.world_size = run, world  # stamped by the rank's pipeline from its process's identity
    return f


def _watcher_policy() -> tuple[AlertPolicy, list[AlertMessage], Clock]:
    """An agent whose own identity knows no world (``watch --pid``, the node daemon)."""
    out: list[AlertMessage] = []
    clock = Clock()
    cfg = AlertsConfig(startup_quiet=0.0, group_wait=5.0, repeat_interval=0.0)
    ident = Identity(run="default", rank=None, local_rank=None, world_size=None, node="n")
    p = AlertPolicy(cfg, ident, out.append, clock=clock, wall=clock)
    p.restart([], None, {})
    p.start(clock())
    return p, out, clock


def test_the_rank_that_went_nan_first_is_named_with_its_world() -> None:
    """The s35 tester's real DDP run under ``watch --pid``: rank 1 went NaN at step 20, rank 0 at
    21 through the all-reduce. The webhook's one alert names rank 1 (top-level rank, suspect,
    title, the typed first failure) and the world size both workers' environment says (2)."""
    from rankwatch.actions.alerts._webhook import payload

    p, out, clock = _watcher_policy()
    p.take(_nan(1, 20, 1000.0))
    p.take(_nan(0, 21, 1000.3))
    clock.t += 5.0
    p.pump(clock())
    (doc,) = [payload(m) for m in out]
    assert doc["summary"] == "nan_loss on 2 of 2 ranks, suspect rank 1"
    assert (doc["rank"], doc["ranks"], doc["suspect"], doc["step"]) == (1, [0, 1], 1, 20)
    assert doc["message"].startswith("NaN/Inf at step 20")
    assert doc["world_size"] == 2 and doc["run"] == "89663ef6"
    d = doc["diagnosis"]
    assert (d["suspect"], d["verdict"], d["world_size"]) == (1, "first_failure", 2)
    assert (d["first_failure"]["rank"], d["first_failure"]["kind"]) == (1, "nan_loss")
    assert d["first_failure"]["how"] == "nan_loss at step 20"


def test_ranks_that_went_nan_together_name_nobody() -> None:
    """The same step on both ranks is a tie: no first failure, the lowest rank at top level.
    With no steps the earlier start decides; a tie there names nobody either."""
    from rankwatch.actions.alerts._webhook import payload

    p, out, clock = _watcher_policy()
    p.take(_nan(1, 20, 1000.0))
    p.take(_nan(0, 20, 1000.3))
    clock.t += 5.0
    p.pump(clock())
    p.take(_nan(3, None, 1010.0, run="b"))
    p.take(_nan(2, None, 1009.0, run="b"))
    p.take(_nan(5, None, 1009.0, run="c"))
    p.take(_nan(4, None, 1009.0, run="c"))
    clock.t += 5.0
    p.pump(clock())
    docs = [payload(m) for m in out]
    assert [(d["run"], d["rank"], d["suspect"], d["diagnosis"]) for d in docs] == [
        ("89663ef6", 0, None, None),
        ("b", 2, 2, docs[1]["diagnosis"]),
        ("c", 4, None, None),
    ]
    assert docs[0]["summary"] == "nan_loss on 2 of 2 ranks"
    assert docs[1]["diagnosis"]["first_failure"]["rank"] == 2


def test_a_diagnosis_carries_the_alerts_world_size() -> None:
    """One agent per rank (srun): the first-failure diagnosis made without the world's size
    (rank 0's gloo error after rank 1 left) carries the world the payload states."""
    from rankwatch.actions.alerts._webhook import payload
    from rankwatch.records import FirstFailure

    p, out, clock = policy()
    f = Finding("peer_error", Severity.CRITICAL, 0, "rank 1 failed first", 14, time=1000.0)
    f.diagnosed(first_failure=FirstFailure(1, "exit", 999.0, "exited with status 0 at step 14"))
    p.take(f)
    clock.t += 5.0
    p.pump(clock())
    (doc,) = [payload(m) for m in out]
    assert (doc["suspect"], doc["world_size"], doc["diagnosis"]["world_size"]) == (1, 4, 4)
    assert doc["diagnosis"]["first_failure"]["rank"] == 1


def _slow(kind: str, rank: int, *, straggler: int | None) -> Finding:
    f = Finding(kind, Severity.WARNING, rank, f"{kind} on {rank}", 30, time=1000.0)
    if straggler is not None:
        f.diagnosed(suspects=(straggler,), verdict="straggler")
    return f


def test_a_straggler_and_the_drops_it_explains_are_one_alert() -> None:
    """The straggler finding folds into the drop alert that names the same rank, and a drop
    that comes after that alert went out adds nothing; a drop no straggler explains, or one
    naming another rank, is its own alert."""
    p, out, clock = policy(group_wait=2.0)
    p.take(_slow("throughput_drop", 0, straggler=1))
    p.take(_slow("straggler", 1, straggler=1))
    clock.t += 2.0
    p.pump(clock())
    p.take(_slow("throughput_drop", 1, straggler=1))
    p.take(_slow("throughput_drop", 3, straggler=2))
    clock.t += 2.0
    p.pump(clock())
    assert [(m.title, m.suspect) for m in out] == [
        ("throughput_drop on rank 0, suspect rank 1", 1),
        ("throughput_drop on rank 3, suspect rank 2", 2),
    ]


def test_each_run_counts_its_own_ranks_toward_its_world() -> None:
    """A node daemon (its own run "node") watching two jobs of world 3: job A's three ranks and
    job B's two stall. A's alert says "3 of 3"; B's must not borrow A's rank 2 to claim "2 of 3"
    (its rank 2 was never seen), so it lists its ranks."""
    from rankwatch.actions.alerts._webhook import payload

    out: list[AlertMessage] = []
    clock = Clock()
    cfg = AlertsConfig(startup_quiet=0.0, group_wait=5.0, repeat_interval=0.0)
    p = AlertPolicy(cfg, Identity("node", None, None, None, "n"), out.append, clock=clock, wall=clock)
    p.restart([], None, {})
    p.start(clock())
    for run, ranks in (("jobA", (0, 1, 2)), ("jobB", (0, 1))):
        for r in ranks:
            f = stall(r)
            f.run, f.world_size = run, 3
            p.take(f)
    clock.t += 5.0
    p.pump(clock())
    assert sorted((d["run"], d["summary"]) for d in map(payload, out)) == [
        ("jobA", "stall on 3 of 3 ranks"),
        ("jobB", "stall on 2 ranks (0-1)"),
    ]


class HoldingBoard:
    """A coordinator (``policy.Coordinator``) that holds every due group, as the alert board
    does while it decides who sends it; ``settle`` sends what it holds, as its leader would."""

    def __init__(self, host: AlertPolicy) -> None:
        self.host = host
        self.stats = {"led": 0, "took_over": 0, "grouped_by_peer": 0, "fallback": 0}
        self.held: list = []

    @property
    def where(self) -> str:
        return "board"

    def usable(self, now: float) -> bool:
        return True

    def post(self, *args: object) -> None:
        pass

    def hold(self, g, now: float) -> bool:  # type: ignore[no-untyped-def]
        self.held.append(g)
        return True

    def forget(self, key, status: str) -> None:  # type: ignore[no-untyped-def]
        for g in self.held:
            if g.status == status:
                g.members.pop(key, None)

    def watch(self, *args: object) -> bool:
        return False

    def abandon(self) -> tuple[list, list]:
        return [], []

    def settle(self, now: float) -> None:
        held, self.held = self.held, []
        for g in held:
            if g.members:
                # PeerGroups asks its host with the ranks the board saw (the agent's own run's).
                self.host.emit(g, now, saw_all=self.host.saw_all({k[1] for k in g.members}))


def test_a_dead_job_pages_when_its_crash_comes_while_the_board_holds_its_warning() -> None:
    """s36 e04 (``run -- torchrun --redirects``, rank 0 returned with status 0 at step 10):
    rank 1's gloo warning was handed to the alert board at the agent's close, and rank 1's
    crash (critical, the job's death) came while the board decided. One alert, the crash,
    critical, naming rank 0; the warning never leaves on its own."""
    from rankwatch.actions.alerts._webhook import payload
    from rankwatch.records import FirstFailure

    p, out, clock = policy(group_wait=2.0)
    board = HoldingBoard(p)
    p.coord = board

    def left(kind: str, severity: Severity) -> Finding:
        f = Finding(kind, severity, 1, "rank 0 failed first: exited with status 0 at step 9", 9, time=1000.0)
        f.diagnosed(first_failure=FirstFailure(0, "exit", 995.0, "exited with status 0 at step 9"))
        return f

    p.take(left("peer_error", Severity.WARNING))
    p.hold_pending(clock())  # the agent closes: the board takes the waiting group
    p.take(left("crash", Severity.CRITICAL))
    board.settle(clock())
    p.pump(clock(), force=True)
    docs = [payload(m) for m in out]
    assert [(d["kind"], d["severity"], d["suspect"], d["summary"]) for d in docs] == [
        ("crash", "critical", 0, "crash on rank 1, suspect rank 0")
    ]


def test_a_crash_after_a_peers_alerted_failure_stays_with_the_board() -> None:
    """One agent per rank (srun, sidecar): rank 1's OOM is alerted by rank 1's agent; rank 0's
    gloo warning, then its crash, both name it first. The board holds rank 0's warning to fold
    it into rank 1's alert; the crash follows it there, not a second critical page of its own
    (CI: "oom" and "crash" both critical, two alerts for one OOM)."""
    from rankwatch.records import FirstFailure

    p, out, clock = policy(group_wait=2.0)
    board = HoldingBoard(p)
    p.coord = board

    def after_oom(kind: str, severity: Severity) -> Finding:
        f = Finding(kind, severity, 0, "rank 1 failed first: torch.OutOfMemoryError", 7, time=1000.0)
        f.diagnosed(suspects=(1,), first_failure=FirstFailure(1, "oom", 995.0, "torch.OutOfMemoryError"))
        return f

    p.take(after_oom("peer_error", Severity.WARNING))
    p.hold_pending(clock())
    p.take(after_oom("crash", Severity.CRITICAL))
    p.pump(clock(), force=True)
    p.hold_pending(clock())
    assert [sorted(k[2] for k in g.members) for g in board.held] == [["peer_error"]]
    assert out == []


INCIDENT = "dumps/job16/20261128T145323Z_stall"


def _hang(rank: int, t: float, *, suspect: int = 1, incident: str = INCIDENT) -> Finding:
    f = Finding("stall", Severity.CRITICAL, rank, f"stall on rank {rank}", 6, time=t)
    f.run, f.world_size = "job16", 2
    f.diagnosed(suspects=(suspect,), verdict="not_in_collective", incident=incident)
    return f


def test_a_rank_judged_stalled_later_joins_the_hangs_alert() -> None:
    """s36 e16 (HF Trainer, rank 1 blocked in its data collator, HF prints steps on rank 0
    only): rank 0's stall went out; rank 1, a silent rank, is judged stalled 19 s later with
    the same suspect and incident. One stall alert for the one hang; its resolve is one
    message. A stall naming another suspect and incident is another hang: its own alert."""
    p, out, clock = policy(group_wait=2.0)
    p.take(_hang(0, 1000.0))
    clock.t += 2.0
    p.pump(clock())
    clock.t += 19.0
    p.take(_hang(1, 1019.0))
    clock.t += 2.0
    p.pump(clock())
    assert [(m.status, m.title) for m in out] == [("firing", "stall on rank 0, suspect rank 1")]
    for r in (0, 1):
        p.take(Finding("stall", Severity.CRITICAL, r, "ok", 6, resolved=True, run="job16"))
    clock.t += 2.0
    p.pump(clock())
    assert [(m.status, m.ranks) for m in out[1:]] == [("resolved", [0])]
    p.take(_hang(0, 1100.0))
    clock.t += 2.0
    p.pump(clock())
    p.take(_hang(1, 1110.0, suspect=0, incident="dumps/job16/20261128T150000Z_stall"))
    clock.t += 2.0
    p.pump(clock())
    titles = [m.title for m in out[2:]]
    assert titles == ["stall on rank 0, suspect rank 1", "stall on rank 1, suspect rank 0"]


def test_the_title_counts_the_world_the_workers_know_under_a_launcher() -> None:
    """s36 e26 (``run -- python -m torch.distributed.run --nproc-per-node 4``): the agent's own
    run is "default" with no world, the workers' findings carry run job26 and world 4, and the
    alert board sends the group. "stall on 4 of 4 ranks", as one agent per rank says."""
    out: list[AlertMessage] = []
    clock = Clock()
    cfg = AlertsConfig(startup_quiet=0.0, group_wait=2.0, repeat_interval=0.0)
    ident = Identity(run="default", rank=None, local_rank=None, world_size=None, node="n")
    p = AlertPolicy(cfg, ident, out.append, clock=clock, wall=clock)
    p.restart([], None, {})
    p.start(clock())
    board = HoldingBoard(p)
    p.coord = board
    for r in range(4):
        f = _hang(r, 1000.0, suspect=2)
        f.run, f.world_size = "job26", 4
        p.take(f)
    clock.t += 2.0
    p.pump(clock())
    board.settle(clock())
    assert [m.title for m in out] == ["stall on 4 of 4 ranks, suspect rank 2"]


@pytest.mark.parametrize("new_job", [False, True])
def test_run_again_in_the_same_folder_is_a_new_job(new_job: bool) -> None:
    """`rankwatch run` again in the same folder, minutes after the last job crashed (the same
    mistyped script; s37 coordinator's rerun of d46): the state file holds that crash as firing
    and sent. An agent that restarted beside a running job (``watch``) takes it for the same
    episode; one that started the job itself (``run``) knows it is not: the new job's crash
    pages, and the old job's stall, still firing when its agent stopped, is resolved."""
    from rankwatch.actions.alerts.state import Remembered

    out: list[AlertMessage] = []
    clock = Clock()
    cfg = AlertsConfig(startup_quiet=0.0, group_wait=1.0, repeat_interval=0.0)
    p = AlertPolicy(cfg, IDENT, out.append, clock=clock, wall=clock, new_job=new_job)
    old_crash = Remembered(0, "crash", "critical", 900.0, True, member={"message": "old"}, alert_id="a1")
    old_stall = Remembered(0, "stall", "critical", 900.0, True, member={"message": "hung"}, alert_id="a2")
    p.restart([old_crash, old_stall], 950.0, {})
    p.take(Finding("crash", Severity.CRITICAL, 0, "could not open the script 'x.py'", time=1000.0))
    clock.t += 2.0
    p.pump(clock())
    sent = [(m.status, m.kind) for m in out]
    if new_job:
        assert sorted(sent) == [("firing", "crash"), ("resolved", "stall")], sent
        [resolved] = [m for m in out if m.status == "resolved"]
        assert "its job ended" in resolved.message and resolved.id == "a2"
    else:
        assert ("firing", "crash") not in sent, sent


def test_a_peers_timeout_that_ends_a_hang_is_part_of_the_stalls_alert() -> None:
    """k18: the stall alert named rank 1 and went out; rank 0's gloo timeout ends the hang
    later, its crash diagnosed a consequence of that hang (suspect 1): no second page."""
    p, out, clock = policy(group_wait=2.0)
    for r in (0, 1):
        s = stall(r)
        s.diagnosed(suspects=(1,), verdict="not_in_collective")
        p.take(s)
    clock.t += 2.0
    p.pump(clock())
    assert [m.title for m in out] == ["stall on 2 ranks (0-1), suspect rank 1"]
    clock.t += 25.0
    crash = Finding("crash", Severity.CRITICAL, 0, "rank 1 hung first: ... Timed out", 7, time=clock())
    crash.diagnosed(suspects=(1,), verdict="hang")
    p.take(crash)
    clock.t += 15.0
    p.pump(clock())
    assert len(out) == 1, [m.title for m in out]


def test_a_failure_found_in_a_replayed_history_waits_for_its_judged_twin() -> None:
    """An agent that attached after rank 1 died (``watch --match`` finding a running torchrun,
    the matrix's pod-match cell) reads its crash in the replayed log: that finding was never
    judged against the peers, so it waits ``death_wait`` more; the live finding of the same
    death, judged (suspect rank 1) after the cross-rank wait, names the suspect of the one
    alert. With no live twin, the replayed failure goes out all the same."""
    p, out, clock = policy(group_wait=1.0, death_wait=10.0)
    p.replayed([Finding("crash", Severity.CRITICAL, 1, "crash on 1", 7, time=999.0)])
    clock.t += 3.0
    p.pump(clock())
    assert out == []
    p.take(_failure("crash", 1, Severity.CRITICAL, first=1, t=999.0))
    clock.t += 10.0
    p.pump(clock())
    assert [(m.title, m.suspect) for m in out] == [("crash on rank 1, suspect rank 1", 1)]
    q, out2, clock2 = policy(group_wait=1.0, death_wait=10.0)
    q.replayed([Finding("oom", Severity.CRITICAL, 2, "oom on 2", 7, time=999.0)])
    clock2.t += 11.0
    q.pump(clock2())
    assert [m.title for m in out2] == ["oom on rank 2"]


def test_one_ranks_loss_blowing_up_is_a_warning_and_its_escalation() -> None:
    """The s40 tester's l13: rank 1's loss jumps at step 12 (loss_spike), keeps rising
    (loss_divergence at 14) and overflows at 17 (nan_loss, critical): the divergence is the
    spike's alert going on, the overflow pages as its escalation. Another rank's spike, or the
    same rank's a long while after, is news."""
    p, out, clock = policy(group_wait=1.0)
    p.take(Finding("loss_spike", Severity.WARNING, 1, "jump", 12, time=clock()))
    clock.t += 2.0
    p.pump(clock())
    p.take(Finding("loss_divergence", Severity.WARNING, 1, "rising", 14, time=clock()))
    clock.t += 2.0
    p.pump(clock())
    p.take(Finding("nan_loss", Severity.CRITICAL, 1, "inf", 17, time=clock()))
    clock.t += 2.0
    p.pump(clock())
    assert [m.title for m in out] == ["loss_spike on rank 1", "nan_loss on rank 1"]
    p.take(Finding("loss_spike", Severity.WARNING, 0, "jump", 20, time=clock()))
    clock.t += 2.0
    p.pump(clock())
    assert [m.title for m in out[2:]] == ["loss_spike on rank 0"]


def test_the_end_of_the_job_the_agent_ran_resolves_its_conditions() -> None:
    """``rankwatch run``: the user stops a hung job (the s40 tester's l54); as the agent closes,
    the stall alert it sent is resolved, saying the job ended; a crash (an event) is not."""
    out: list[AlertMessage] = []
    clock = Clock()
    cfg = AlertsConfig(startup_quiet=0.0, group_wait=1.0, repeat_interval=0.0)
    p = AlertPolicy(cfg, IDENT, out.append, clock=clock, wall=clock, new_job=True)
    p.restart([], None, {})
    p.start(clock())
    p.take(stall(1))
    p.take(Finding("crash", Severity.CRITICAL, 2, "boom", 5))
    clock.t += 2.0
    p.pump(clock())
    assert sorted(m.title for m in out) == ["crash on rank 2", "stall on rank 1"]
    p.job_ended()
    clock.t += 2.0
    p.pump(clock())
    assert [(m.status, m.kind, m.ranks) for m in out[2:]] == [("resolved", "stall", [1])]
    assert "its job ended" in out[2].members[0].message
