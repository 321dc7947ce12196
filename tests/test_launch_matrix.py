"""Launch form x failure, on real PyTorch (CPU, gloo): the cheapest real workload that shows
each cell (tests/workloads/ddp_train.py, two ranks, tens of 50 ms steps). Each cell runs the
job as a user launches it, to its end (a hang: until the alert is in, then the user's stop),
and asserts the findings (kind, rank, step), the alerts a loopback webhook received (title
with the suspect, suspect, first failure, one per problem), the exit status the user sees,
and that nothing of the job is left running. The harness is tests/torchjobs.py.

Forms: ``rankwatch run -- torchrun`` plain (no ``--tee``: the combined log is read), with
``--tee 3``, with ``--redirects 3 --log-dir D`` (each worker's own files), with
``--max-restarts``; ``torchrun --no-python rankwatch run -- python train.py`` (an agent per
worker, identity from torchrun); ``watch --pid`` on ranks a script started; the Helm sidecar
(a PID namespace per pod, ``watch --match --log``); one ``run`` per rank as ``srun`` starts
them; ``watch --match`` as the node daemon (no ``--log``: each rank's own stdout file, its
identity from its environment), per job and with two users' jobs. Failures: NaN at a known
step, an OOM exception, SIGKILL of a rank, a rank's clean early exit, a data-loader hang,
healthy completion, a raise that torchrun restarts (forms launched under torchrun only: the
others have no launcher that restarts a rank).

The grid (form x failure -> test; N/A: a torchrun restart where no torchrun starts the ranks):

=========  ===  ===  =======  ====  =======  =======  =======================================
form       nan  oom  sigkill  exit  hang     healthy  restart
=========  ===  ===  =======  ====  =======  =======  =======================================
plain      P    F    F        T     H        S        R
tee        E    F    F        T     H        S        R
redirects  N    O    K        X     H        S        test_torchrun_restart_with_redirects_...
no-python  N    O    K        X     H        S        R
pid        N    O    K        X     H        S        N/A
sidecar    N    O    K        X     H        S        N/A
srun       N    O    K        X     H        S        N/A
daemon     N    O    K        X     H        S        N/A (a new job on the same ranks: the
                                                      two-users test)
daemon-r   -    O    K        -     -        -        -
pid-r      -    O    K        -     -        -        -
=========  ===  ===  =======  ====  =======  =======  =======================================

``daemon-r`` / ``pid-r`` (``daemon-redirects``, ``pid-redirects``): the node daemon and ``watch
--pid W0 --pid W1`` on a job started outside rankwatch by ``torchrun --redirects 3 --log-dir D``,
each worker's stderr a file of its own; the cells where the evidence is on stderr (a raise, a
peer's gloo error after a SIGKILL).

torchrun that is not the command given to rankwatch (``bash-c``: ``run -- bash -c 'cd . &&
torchrun --tee 3 ...'``; ``bash-exec``: ``bash -c 'exec torchrun ...'``; ``script``: ``run --
bash launch.sh``, plain torchrun then ``echo``; ``launcher-pid``: ``watch --pid`` on a
``torchrun --tee 3 ... > job.log 2>&1`` started by hand): a raise on rank 1, the cell that
shows whether the launcher was found in the process tree
(test_a_launcher_the_agent_was_not_given_is_found_in_the_tree).

N test_nan_is_found_on_its_rank_at_its_step, P test_plain_torchrun_nan_is_found_in_the_combined_log,
E test_torchrun_tee_nan_is_found_on_its_rank, O test_an_oom_is_named_on_its_rank_and_by_its_peer,
F test_torchrun_a_failing_rank_is_named_by_its_peer, K test_a_sigkilled_rank_is_named,
X test_a_rank_that_leaves_early_is_named, T test_torchrun_a_rank_that_leaves_early_is_named,
H test_a_data_loader_hang_names_its_rank, S test_a_healthy_run_ends_silent,
R test_torchrun_restart_reports_the_first_attempts_crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import free_port, wait_for
from torchjobs import (
    REAL_TORCH,
    WORKLOAD,
    Cell,
    Running,
    agent_config,
    agent_under_torchrun,
    finish,
    job_env,
    job_processes,
    node_daemon,
    one_agent_per_rank,
    rankwatch,
    reap_leftovers,
    run_launcher,
    run_wrapper,
    sidecars,
    systemd_notify,
    torchrun,
    torchrun_outside,
    two_nodes,
    watch_launcher,
    watch_pids,
    webhook,
)

pytestmark = REAL_TORCH

WORLD = 2
SUSPECT_1 = "suspect: rank 1 (the only rank not waiting in a collective"

Form = Callable[[Path, Path, dict[str, str], Sequence[str]], Running]
# Each form starts the job; ``more``: more of torchrun's options (--max-restarts), for the forms
# launched under torchrun.
FORMS: dict[str, Form] = {
    "plain": lambda tmp, cfg, env, more: run_launcher(tmp, cfg, torchrun(WORLD, *more), env),
    "tee": lambda tmp, cfg, env, more: run_launcher(tmp, cfg, torchrun(WORLD, "--tee", "3", *more), env),
    "redirects": lambda tmp, cfg, env, more: run_launcher(
        tmp, cfg, torchrun(WORLD, "--redirects", "3", "--log-dir", str(tmp / "torchrun-logs"), *more), env
    ),
    "no-python": lambda tmp, cfg, env, more: agent_under_torchrun(tmp, cfg, WORLD, env, *more),
    "pid": lambda tmp, cfg, env, more: watch_pids(tmp, cfg, WORLD, env),
    "sidecar": lambda tmp, cfg, env, more: sidecars(tmp, cfg, WORLD, env),
    "srun": lambda tmp, cfg, env, more: one_agent_per_rank(tmp, cfg, WORLD, env),
    "daemon": lambda tmp, cfg, env, more: node_daemon(tmp, cfg, WORLD, env),
    # A job started by `torchrun --redirects 3 --log-dir D` outside rankwatch: each worker's
    # stderr (its traceback, gloo's errors) is a file of its own, next to its stdout.
    "daemon-redirects": lambda tmp, cfg, env, more: torchrun_outside(tmp, cfg, WORLD, env, by="daemon"),
    "pid-redirects": lambda tmp, cfg, env, more: torchrun_outside(tmp, cfg, WORLD, env, by="pid"),
    # `torchrun train.py > job.log 2>&1` outside rankwatch: every worker and torchrun write one file.
    "daemon-shared": lambda tmp, cfg, env, more: torchrun_outside(tmp, cfg, WORLD, env, by="shared"),
    # torchrun not the command given to rankwatch: `run -- bash -c 'cd . && torchrun --tee 3 ...'`
    # (`bash -c 'exec torchrun ...'`: torchrun is the agent's child, not its command line),
    # `run -- bash launch.sh` (plain torchrun, then echo: exit 0), and `watch --pid <torchrun>` on
    # `torchrun --tee 3 ... > job.log 2>&1` started by hand.
    "bash-c": lambda tmp, cfg, env, more: run_wrapper(
        tmp, cfg, torchrun(WORLD, "--tee", "3"), env, script=False
    ),
    "bash-exec": lambda tmp, cfg, env, more: run_wrapper(
        tmp, cfg, torchrun(WORLD, "--tee", "3"), env, script=False, exec_=True
    ),
    "script": lambda tmp, cfg, env, more: run_wrapper(tmp, cfg, torchrun(WORLD), env, script=True),
    "launcher-pid": lambda tmp, cfg, env, more: watch_launcher(tmp, cfg, torchrun(WORLD, "--tee", "3"), env),
    # A pod whose command is `torchrun --tee 3 ... > pod.log`, its sidecar `watch --match P --log
    # pod.log` (P matches torchrun too): the launcher's workers told apart as under --pid.
    "pod-match": lambda tmp, cfg, env, more: watch_launcher(
        tmp, cfg, torchrun(WORLD, "--tee", "3"), env, match=True
    ),
}
# Forms with an agent per rank: they share a run folder (the alert board), as a job's agents do.
PER_RANK = frozenset({"no-python", "sidecar", "srun"})
# Forms whose agent is not the ranks' parent and has no launcher to ask: a rank's end is "exit
# status unknown" there.
WATCHING = frozenset({"pid", "sidecar", "daemon", "daemon-redirects", "pid-redirects", "daemon-shared"})
# Forms watching a job with separate stdout and stderr files per rank: the failure cells.
REDIRECTED = ["daemon-redirects", "pid-redirects"]


def cell(
    tmp: Path,
    form: str,
    env: dict[str, str],
    *,
    hang: bool = False,
    stuck: tuple[int, ...] = (0, 1),
    more: Sequence[str] = (),
) -> Cell:
    if form == "sidecar" and os.geteuid() != 0:
        pytest.skip("a pod's PID namespace (unshare, nsenter) needs root")
    with webhook() as (url, posted):
        # The node daemon names each run from its processes (Slurm's job id), not from its config.
        named = form not in ("daemon", "daemon-redirects", "daemon-shared")
        cfg = agent_config(tmp, url=url, board=form in PER_RANK, named=named)
        running = FORMS[form](tmp, cfg, env, more)

        def stalled(rows: list[dict[str, Any]]) -> bool:
            return {f["rank"] for f in rows if f["kind"] == "stall" and not f.get("resolved")} >= set(stuck)

        return finish(running, tmp, posted, hang=stalled if hang else None)


def fault(kind: str, *, step: int = 8, steps: int = 40) -> dict[str, str]:
    return {"FAULT": kind, "FAULT_RANK": "1", "FAULT_STEP": str(step), "STEPS": str(steps)}


# How rank 0's failure names rank 1: by rank 1's record of its end in the run folder, or (before
# that record is in) by the process whose socket gloo lost.
NAMED_1 = ("rank 1 failed first", "the connection gloo lost")


def named_after_rank_1(c: Cell) -> None:
    """Rank 0's failures are rank 1's consequence, and every alert points at rank 1."""
    for f in c.on(0, "crash", "peer_error"):
        assert f["message"].startswith(NAMED_1), c.debug()
        assert f["diagnosis"]["suspect"] == 1, c.debug()
    firing = c.firing()
    assert firing, c.debug()
    for a in firing:
        assert a["suspect"] == 1 and a["summary"].endswith(", suspect rank 1"), c.debug()


def one_alert_per_problem(c: Cell, form: str) -> None:
    """One alert for the failure, however many agents see it: a rank's OOM and its peer's gloo
    error after it are one problem, within one agent (the alert policy) and between the agents
    of a job (the alert board folds a consequence into the first failure's alert)."""
    failures = [a for a in c.firing() if a["kind"] != "stall"]
    if len(failures) == 2:
        # The policy's one exception (actions/alerts/policy.py ``_problem_of``): a warning sent
        # before its rank's death came (a peer's gloo error, the rank then dying of it on a
        # loaded node after ``group_wait``) is followed by the death, critical, so that a route
        # on critical pages. Only that shape: the same rank, the same suspect, warning first.
        warn, dead = failures
        assert (warn["severity"], dead["severity"]) == ("warning", "critical"), (form, c.debug())
        assert dead["kind"] == "crash" and dead["rank"] == warn["rank"], (form, c.debug())
        assert dead["suspect"] == warn["suspect"], (form, c.debug())
        return
    assert len(failures) == 1, (form, c.debug())


def one_finding_per_death(c: Cell, rank: int, kind: str) -> None:
    """The rank's death is told once, by the finding of what killed it (README: one finding per
    death): no second critical finding for it, however its log is split (``--redirects``: steps
    in stdout, the traceback in stderr), and its end, where told, names that error."""
    critical = [
        f for f in c.findings if f["rank"] == rank and f["severity"] == "critical" and f["kind"] != "stall"
    ]  # a loaded node may see the dying rank stall first: another problem, the stall rule's
    assert [f["kind"] for f in critical if not f.get("resolved")] == [kind], c.debug()
    for f in c.on(rank, "process_exit"):
        assert f["evidence"].get("cause_kind") == kind, c.debug()


def no_agent_failed(c: Cell) -> None:
    assert all(rc == 0 for rc in c.extra["agent_rcs"]), c.debug()


NEW_FORMS = ["redirects", "no-python", "pid", "sidecar", "srun", "daemon"]
ALL_FORMS = ["plain", "tee", *NEW_FORMS]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", NEW_FORMS)
def test_nan_is_found_on_its_rank_at_its_step(tmp_path: Path, form: str) -> None:
    """Rank 1's inputs go NaN at step 8 (rank 0 follows at step 9 through the all-reduce): the
    first NaN is rank 1's at step 8, one nan_loss alert that names rank 1 first (its rank, and
    on both ranks its suspect and first failure) with the workers' world size, the job's own
    exit status 0."""
    c = cell(tmp_path, form, fault("nan", steps=20))
    first = min(c.of("nan_loss"), key=lambda f: (f["step"], f["rank"]), default=None)
    assert first is not None and (first["rank"], first["step"]) == (1, 8), c.debug()
    assert c.rc == 0, c.debug()
    assert not c.of("crash"), c.debug()
    [alert] = c.alerts_of("nan_loss")
    assert alert["summary"].startswith("nan_loss on"), alert
    assert (alert["rank"], alert["step"], alert["world_size"]) == (1, 8, WORLD), alert
    if len(alert["ranks"]) > 1:
        assert alert["suspect"] == 1 and alert["summary"].endswith(", suspect rank 1"), alert
        assert alert["diagnosis"]["first_failure"]["rank"] == 1, alert
        assert alert["diagnosis"]["world_size"] == WORLD, alert
    assert [a["kind"] for a in c.firing()] == ["nan_loss"], c.debug()
    no_agent_failed(c)


@pytest.mark.timeout(300)
def test_a_nan_shared_through_the_all_reduce_names_the_rank_whose_loss_went_nan(tmp_path: Path) -> None:
    """The s40 tester's l06: each step line carries the grad norm. Rank 1's inputs go NaN at
    step 8; DDP's all-reduce makes rank 0's gradients NaN at the same step while its loss is
    still finite: both ranks are NaN at step 8, and the one alert names rank 1, whose own loss
    went NaN, as its suspect (not "no suspect" for ranks failing at the same step)."""
    c = cell(tmp_path, "tee", {**fault("nan", steps=20), "GRAD_NORM": "1"})
    assert c.rc == 0, c.debug()
    at8 = {f["rank"]: f for f in c.of("nan_loss") if f["step"] == 8}
    assert set(at8) == {0, 1}, c.debug()
    assert "loss is nan" in at8[1]["message"] and "loss is nan" not in at8[0]["message"], c.debug()
    [alert] = c.alerts_of("nan_loss")
    assert alert["suspect"] == 1 and alert["summary"] == "nan_loss on 2 of 2 ranks, suspect rank 1", c.debug()
    assert [a["kind"] for a in c.firing()] == ["nan_loss"], c.debug()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", [*NEW_FORMS, *REDIRECTED])
def test_an_oom_is_named_on_its_rank_and_by_its_peer(tmp_path: Path, form: str) -> None:
    """Rank 1 raises CUDA's OOM at step 8: an ``oom`` finding on rank 1 after step 7, rank 0's
    gloo error named after it, alerts naming rank 1, the job's exit status non-zero."""
    c = cell(tmp_path, form, fault("oom"))
    [oom] = c.on(1, "oom")
    assert oom["step"] == 7 and "CUDA out of memory" in oom["message"], c.debug()
    assert c.rc not in (0, None), c.debug()
    one_finding_per_death(c, 1, "oom")
    named_after_rank_1(c)
    one_alert_per_problem(c, form)
    assert any(a["kind"] == "oom" for a in c.firing()), c.debug()
    oom_alert = next(a for a in c.firing() if a["kind"] == "oom")
    assert oom_alert["diagnosis"]["first_failure"]["rank"] == 1, oom_alert
    no_agent_failed(c)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", [*NEW_FORMS, *REDIRECTED])
def test_a_sigkilled_rank_is_named(tmp_path: Path, form: str) -> None:
    """Rank 1 is SIGKILLed at step 8 (the OOM killer): its end is reported on rank 1 (with the
    signal where the agent or launcher knows it), and what rank 0 reports names rank 1."""
    env = fault("sigkill")
    if form in REDIRECTED:
        # Under torchrun a rank's DataLoader worker keeps its gloo sockets open after it is
        # killed, and torchrun stops the peer before it sees the closed connection: no rank's
        # log would say anything. Without loader workers (the black-box tester's own job) the
        # peer's gloo error is in its stderr file, where only following stderr finds it.
        env["LOADER_WORKERS"] = "0"
    c = cell(tmp_path, form, env)
    assert c.rc not in (0, None), c.debug()
    own = c.on(1, "crash", "process_exit")
    # One end, not a second one for its DataLoader worker, which outlives it by up to 5 s with
    # its command line and RANK: a watcher that finds processes by a match does not take that
    # worker for the rank restarted.
    # The node daemon matches torchrun too (the script's arguments are in its command line): it
    # is no rank, and no second pipeline saying rank 1's end again from its failure box.
    assert len(own) == 1, c.debug()
    if form not in WATCHING:
        assert any("SIGKILL" in f["message"] for f in own), c.debug()
    named_after_rank_1(c)
    if form in REDIRECTED:
        one_alert_per_problem(c, form)
    no_agent_failed(c)


@pytest.mark.timeout(300)
def test_srun_with_the_default_board_sends_one_alert_for_a_crash(tmp_path: Path) -> None:
    """The README's srun form as a user writes it: one ``rankwatch run`` per rank, no
    ``alerts.board_dir`` (the board in the run folder under ``dumps.dir``), no run name (the
    job's own). Rank 1 raises at step 8 and its crash alert goes out; rank 0's gloo crash after
    it, judged later by its own agent, names rank 1 and is part of that alert, not a second
    "crash on rank 0, suspect rank 1" (black-box batch s38, g47)."""
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url, board=None, named=False)
        assert "board_dir" not in cfg.read_text()
        c = finish(one_agent_per_rank(tmp_path, cfg, WORLD, fault("raise")), tmp_path, posted)
    assert c.rc not in (0, None), c.debug()
    assert c.on(1, "crash"), c.debug()
    assert (tmp_path / "dumps" / "4242" / ".alerts" / "crash").is_dir(), c.debug()
    named_after_rank_1(c)
    # One alert, rank 1's: alone ("crash on rank 1") or, when both records wait on the board at
    # once, the one message the lowest rank sends for both; never a second one for rank 0.
    failures = [a for a in c.firing() if a["kind"] != "stall"]
    assert len(failures) == 1 and failures[0]["kind"] == "crash", c.debug()
    alert = failures[0]
    assert (alert["rank"], alert["suspect"]) == (1, 1), c.debug()
    assert alert["summary"].endswith(", suspect rank 1"), c.debug()
    no_agent_failed(c)


@pytest.mark.timeout(300)
def test_two_torchrun_nodes_send_one_alert_naming_the_rank_and_the_job(tmp_path: Path) -> None:
    """A two-node job (``torchrun --nnodes 2 --rdzv-id J`` per node, one ``rankwatch run`` each,
    no run name configured): NaN on global rank 3 from step 12, the other ranks a step later
    through DDP. The agents share the job's run (torchrun's run id, read from its command line
    before the workers start) and so its alert board: ONE alert across both nodes, "nan_loss on
    4 of 4 ranks, suspect rank 3", run J, world size 4 (the s39 tester's k10: two alerts, one
    under run "default" with no world size, the other with no suspect)."""
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url, board=None, named=False)
        env = {"FAULT": "nan", "FAULT_RANK": "3", "FAULT_STEP": "12", "STEPS": "24"}
        c = finish(two_nodes(tmp_path, cfg, 2, env), tmp_path, posted)
    assert c.rc == 0, c.debug()
    [nan3] = c.on(3, "nan_loss")
    assert nan3["step"] == 12 and nan3["run"].startswith("job-"), c.debug()
    job = nan3["run"]
    assert {f["run"] for f in c.findings} == {job}, c.debug()
    [alert] = c.alerts_of("nan_loss")
    assert (alert["run"], alert["suspect"], alert["world_size"]) == (job, 3, 4), c.debug()
    assert alert["summary"] == "nan_loss on 4 of 4 ranks, suspect rank 3", c.debug()
    assert len(c.firing()) == 1, c.debug()
    no_agent_failed(c)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", [*NEW_FORMS])
def test_a_rank_that_leaves_early_is_named(tmp_path: Path, form: str) -> None:
    """Rank 1 returns from main with status 0 at step 30 while rank 0 enters the next
    collective: rank 0's gloo ``Connection closed by peer`` names rank 1 ("failed first:
    exited"), and the address gloo lost is the one rank 1's socket had; rank 1 is no crash of
    its own, one alert, suspect rank 1. (Step 30: the agent reads a rank's sockets about once a
    second, and gloo connects them at ``init_process_group``.)"""
    # gloo on rank 0 mostly errors out; sometimes it hangs instead (as NCCL would): then the
    # stall names rank 1 and the user stops the job once its alert is in.
    c = cell(tmp_path, form, fault("exit", step=30, steps=60), hang=True, stuck=(0,))
    assert "rank 1 leaves early at step 30" in c.log, c.debug()
    assert c.rc not in (0, None), c.debug()  # rank 0 failed, or was stopped
    blamed = c.on(0, "crash", "peer_error")
    if blamed:
        assert any(f["message"].startswith("rank 1 failed first: exited") for f in blamed), c.debug()
        assert any("was to rank 1" in f["message"] for f in blamed), c.debug()  # gloo's peer address
        one_alert_per_problem(c, form)
    else:
        [stall, *_] = c.on(0, "stall")
        assert stall["diagnosis"]["suspect"] == 1, c.debug()
    assert not c.on(1, "crash"), c.debug()
    named_after_rank_1(c)
    no_agent_failed(c)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ALL_FORMS)
def test_a_healthy_run_ends_silent(tmp_path: Path, form: str) -> None:
    """Two healthy ranks to the end: no finding above info, no alert, exit status 0. Where the
    agent is the ranks' parent or has their launcher to ask (torchrun's exit 0), not even an
    "exit status unknown"."""
    c = cell(tmp_path, form, {"FAULT": "none", "STEPS": "15"})
    assert c.rc == 0, c.debug()
    assert not c.serious() and not c.alerts, c.debug()
    if form not in WATCHING:
        assert not c.of("process_exit"), c.debug()
    no_agent_failed(c)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ALL_FORMS)
def test_a_data_loader_hang_names_its_rank(tmp_path: Path, form: str) -> None:
    """Rank 1's DataLoader worker blocks at step 8: both ranks stall, each stall names rank 1
    (in data loading), one stall alert with suspect rank 1; the user's stop ends every process
    of the job, the hung worker included, and is the exit status the user sees. Under plain
    ``run -- torchrun`` the workers' step lines carry no rank: the run's step lines are each
    worker's progress, so each stalls as a stepping rank, at the run's last step. The stall
    comes after the step-interval timeout, not the startup grace: the agent saw the steps come."""
    step = 8
    c = cell(tmp_path, form, fault("loader_hang", step=step, steps=step + 40), hang=True)
    assert c.rc not in (0, None), c.debug()  # stopped by the user, not ended on its own
    for r in (0, 1):
        [stall, *_] = c.on(r, "stall")
        assert stall["step"] == step and f"{SUSPECT_1}: in data loading" in stall["message"], c.debug()
        assert "startup grace" not in stall["message"], c.debug()
    [alert] = c.alerts_of("stall")
    assert alert["suspect"] == 1 and alert["summary"].endswith(", suspect rank 1"), alert
    assert alert["diagnosis"]["suspects"] == [1], alert
    no_agent_failed(c)


# --- run -- torchrun, plain and --tee 3 ---------------------------------------------------------


@pytest.mark.timeout(300)
def test_plain_torchrun_nan_is_found_in_the_combined_log(tmp_path: Path) -> None:
    """`rankwatch run -- torchrun --nproc-per-node 2 train.py`, no --tee: the workers' step lines
    carry no rank prefix, so they go to the run's pipeline, which finds the NaN at its step."""
    env = {"FAULT": "nan", "FAULT_RANK": "0", "FAULT_STEP": "12", "STEPS": "20"}
    c = cell(tmp_path, "plain", env)
    nan = c.of("nan_loss")
    assert nan and nan[0]["step"] == 12, c.debug()
    assert c.rc == 0, c.debug()
    assert not c.of("crash") and not c.of("process_exit"), c.debug()
    [alert] = c.alerts_of("nan_loss")  # one alert, whatever the later NaN steps (it updates)
    assert alert["step"] >= 12 and "nan_loss" in alert["summary"], alert


@pytest.mark.timeout(300)
def test_plain_torchrun_a_worker_that_exits_after_an_error_line_is_quoted(tmp_path: Path) -> None:
    """s36 e08: `run -- torchrun` without --tee, rank 1 prints ``ERROR: ...`` on stderr and
    calls ``sys.exit(3)``: its crash quotes that line (the combined log holds it, unprefixed),
    never "No error was recognised in the log and it printed nothing"."""
    c = cell(tmp_path, "plain", {"FAULT": "sysexit", "FAULT_RANK": "1", "FAULT_STEP": "6", "STEPS": "30"})
    [crash] = c.on(1, "crash")
    assert "exited with code 3" in crash["message"], c.debug()
    assert "printed nothing" not in crash["message"], c.debug()
    assert "ERROR: tokenizer vocab mismatch on rank 1 at step 6" in crash["message"], c.debug()
    assert c.rc == 1, c.debug()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["plain", "tee", "no-python"])
def test_torchrun_restart_reports_the_first_attempts_crash(tmp_path: Path, form: str) -> None:
    """`torchrun --max-restarts 1` (under `run`, or starting an agent per worker), rank 1 raises
    once at step 6 in a real process group: that crash is reported (the old worker's end is
    judged before the new one is attached), rank 0's end is no crash of its own or one named
    after rank 1, one alert, and the job's clean end after the restart is no crash.

    The rendezvous is c10d's with a store of its own per round: torchrun's default static
    rendezvous keeps one TCPStore, under the same prefix, across restarts, so attempt 1's gloo
    reads attempt 0's addresses (``connectFullMesh failed ... Connection refused, remote=`` the
    dead rank's old listener) and the restart fails or hangs about half the time."""
    env = {"FAULT": "raise", "FAULT_RANK": "1", "FAULT_STEP": "6", "STEPS": "12"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    rdzv = ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    c = cell(tmp_path, form, env, more=("--max-restarts", "1", *rdzv))
    assert c.rc == 0, c.debug()
    assert c.log.count("rank 1 hit a bad batch at step 6") >= 1 and "step=12 " in c.log, c.debug()
    crashes = c.on(1, "crash")
    assert len(crashes) == 1, c.debug()
    assert "rank 1 hit a bad batch at step 6" in crashes[0]["message"], c.debug()
    assert "code 1" in crashes[0]["message"], c.debug()
    assert not c.on(None, "crash"), c.debug()
    if form != "no-python":
        # Rank 0 was stopped by the launcher after rank 1 failed: no crash of its own.
        assert not c.on(0, "crash"), c.debug()
    assert not [f for f in c.findings if f["kind"] == "process_exit" and "unknown" in f["message"]], c.debug()
    named_after_rank_1(c)
    [alert] = c.firing()
    assert alert["kind"] == "crash" and alert["summary"] == "crash on rank 1, suspect rank 1", alert
    no_agent_failed(c)


@pytest.mark.timeout(300)
def test_torchrun_restart_with_redirects_follows_the_new_attempts_files(tmp_path: Path) -> None:
    """`run -- torchrun --max-restarts 1 --redirects 3 --log-dir D`: each worker writes
    ``D/<run>/attempt_<n>/<local rank>/stdout.log``. Rank 1 raises at step 6 in attempt 0 (its
    crash is reported from attempt 0's files), and its inputs go NaN from step 6 in attempt 1:
    that NaN is found, from attempt 1's files, which only a pipeline that follows the new
    attempt reads. The job's own end is clean."""
    env = {"FAULT": "raise_then_nan", "FAULT_RANK": "1", "FAULT_STEP": "6", "STEPS": "12"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see the restart test above
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    logs = ["--redirects", "3", "--log-dir", str(tmp_path / "torchrun-logs")]
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        launcher = torchrun(WORLD, "--max-restarts", "1", *rdzv, *logs)
        c = finish(run_launcher(tmp_path, cfg, launcher, env), tmp_path, posted)
    assert c.rc == 0, c.debug()
    [crash] = c.on(1, "crash")
    assert "rank 1 hit a bad batch at step 6" in crash["message"], c.debug()
    assert "/attempt_0/" in (crash["path"] or ""), c.debug()
    nan = c.on(1, "nan_loss")
    assert nan and nan[0]["step"] == 6 and "/attempt_1/" in nan[0]["path"], c.debug()
    assert {a["kind"] for a in c.firing()} == {"crash", "nan_loss"}, c.debug()


@pytest.mark.timeout(300)
def test_node_daemon_on_a_restarted_torchrun_follows_the_new_attempts_files(tmp_path: Path) -> None:
    """The node daemon (`watch --match`) next to `torchrun --max-restarts 1 --redirects 3
    --log-dir D` started by hand (s38 g11b): rank 1 raises at step 6 in attempt 0, and its inputs
    go NaN from step 6 in attempt 1. The restarted worker's output is in attempt_1's files, its
    new process's own: the NaN is found there, at its step."""
    env = {"FAULT": "raise_then_nan", "FAULT_RANK": "1", "FAULT_STEP": "6", "STEPS": "12"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see the restart test above
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        more = ["--max-restarts", "1", *rdzv]
        running = torchrun_outside(tmp_path, cfg, WORLD, env, by="daemon", extra=more)
        c = finish(running, tmp_path, posted)
    assert c.rc == 0, c.debug()
    [crash] = c.on(1, "crash")
    assert "rank 1 hit a bad batch at step 6" in crash["message"], c.debug()
    assert "/attempt_0/" in (crash["path"] or ""), c.debug()
    nan = c.on(1, "nan_loss")
    assert nan and nan[0]["step"] == 6 and "/attempt_1/" in nan[0]["path"], c.debug()
    assert {a["kind"] for a in c.firing()} == {"crash", "nan_loss"}, c.debug()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["plain", "tee"])
def test_torchrun_a_rank_that_leaves_early_is_named(tmp_path: Path, form: str) -> None:
    """Rank 1 returns from main with status 0 at step 30 while rank 0 enters the next collective:
    rank 0's gloo `Connection closed by peer` is a consequence, named after rank 1 — and the
    address gloo lost is the one rank 1's socket had; one alert, suspect rank 1; the agent exits
    with torchrun's status."""
    c = cell(tmp_path, form, fault("exit", step=30, steps=60))
    assert c.rc == 1, c.debug()  # torchrun's: rank 0 failed
    blamed = c.on(0, "crash", "peer_error")
    assert blamed, c.debug()
    first = [f for f in blamed if f["message"].startswith("rank 1 failed first: exited with status 0")]
    assert first and first[0]["diagnosis"]["first_failure"]["kind"] == "exit", c.debug()
    assert any("was to rank 1" in f["message"] for f in blamed), c.debug()  # gloo's peer address
    assert not c.on(1, "crash"), c.debug()
    named_after_rank_1(c)
    one_alert_per_problem(c, form)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("form", "kind"), [("plain", "oom"), ("plain", "sigkill"), ("tee", "oom"), ("tee", "sigkill")]
)
def test_torchrun_a_failing_rank_is_named_by_its_peer(tmp_path: Path, form: str, kind: str) -> None:
    """Rank 1 fails at step 8 (a CUDA OOM exception's text, or SIGKILL as the OOM killer sends
    it): its failure is reported on rank 1 (the launcher's account gives a killed worker its
    signal), rank 0's gloo error is named after it, every alert's suspect is rank 1, one alert,
    and the agent exits with torchrun's status."""
    c = cell(tmp_path, form, fault(kind))
    assert c.rc == 1, c.debug()
    own = c.on(1, "crash", "oom")
    assert own, c.debug()
    text = " ".join(f["message"] for f in own)
    assert ("CUDA out of memory" in text) if kind == "oom" else ("SIGKILL" in text), c.debug()
    named_after_rank_1(c)
    one_alert_per_problem(c, form)


@pytest.mark.timeout(300)
def test_torchrun_tee_nan_is_found_on_its_rank(tmp_path: Path) -> None:
    """With --tee 3 every worker line carries its prefix: the NaN is found on the rank that
    printed it, at its step."""
    env = {"FAULT": "nan", "FAULT_RANK": "0", "FAULT_STEP": "12", "STEPS": "20"}
    c = cell(tmp_path, "tee", env)
    assert c.rc == 0, c.debug()
    first = {f["rank"]: f["step"] for f in reversed(c.of("nan_loss"))}
    assert first.get(0) == 12, c.debug()
    assert not c.of("crash") and not [f for f in c.findings if "unknown" in f["message"]], c.debug()


@pytest.mark.timeout(300)
def test_node_daemon_on_one_shared_log_names_only_the_rank_that_raised(tmp_path: Path) -> None:
    """The node daemon next to `torchrun train.py > job.log 2>&1`: the workers and torchrun write
    one file, and only tracebacks carry a `[rankN]:` prefix. Rank 1 raises at step 8: the crash
    is rank 1's alone (torchrun's unprefixed `failed (exitcode: 1) local_rank: 1` line and its
    failure box are no other rank's), rank 0 is a consequence (its gloo error named after rank 1,
    or stopped by the launcher), one alert, suspect rank 1."""
    c = cell(tmp_path, "daemon-shared", fault("raise"))
    assert c.rc not in (0, None), c.debug()
    assert c.on(1, "crash"), c.debug()
    assert not c.on(0, "crash", "oom"), c.debug()  # not a crash "on 2 of 2 ranks"
    for f in c.on(0, "peer_error"):
        assert f["message"].startswith(NAMED_1), c.debug()
    crashes = c.alerts_of("crash")
    assert len(crashes) == 1 and crashes[0]["suspect"] == 1 and crashes[0]["rank"] == 1, c.debug()
    one_alert_per_problem(c, "daemon-shared")
    no_agent_failed(c)


# --- the node daemon: `watch --match`, two users' jobs --------------------------------------


def _job(out: Path, run: str, tag: str, *, user: int | None, steps: int = 400) -> subprocess.Popen[bytes]:
    """One single-rank job (rank 0 of its own world), NaN from step 10, its stdout a file as
    Slurm's --output makes it; as another user with ``setpriv`` when ``user`` is given."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RW_TEST_TAG=tag, DIST="0", FAULT="nan", FAULT_RANK="0")
    env.update(FAULT_STEP="10", STEPS=str(steps), STEP_S="0.05", SLURM_JOB_ID=run, RANK="0", WORLD_SIZE="1")
    env.update(LOCAL_RANK="0", PYTHONUNBUFFERED="1")
    out.touch()
    cmd = [sys.executable, str(WORKLOAD), "--node-daemon-test"]
    if user is not None:
        os.chown(out, user, user)
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    with open(out, "ab") as fh:
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="two users' jobs needs root for setpriv")
def test_node_daemon_keeps_two_users_jobs_apart_and_a_new_job_is_a_new_pipeline(tmp_path: Path) -> None:
    """One `watch --match` on a node running job A (root) and job B (nobody), both rank 0 going
    NaN at step 10: two nan_loss findings and two alerts, each with its own run and user. Job A
    ends and job C starts on the same rank numbers: a new pipeline, whose NaN is reported."""
    tag = uuid.uuid4().hex
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    found = tmp_path / "f.jsonl"
    procs: list[subprocess.Popen[bytes]] = []

    def nans() -> list[dict[str, Any]]:
        rows = [json.loads(x) for x in found.read_text().splitlines() if x.strip()] if found.exists() else []
        return [f for f in rows if f["kind"] == "nan_loss" and not f.get("resolved")]

    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url, floor="30s", named=False)
        cmd = rankwatch("watch", "--config", str(cfg), "--match=--node-daemon-test")
        cmd += ["--findings-jsonl", str(found)]
        agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            a = _job(jobs / "a.out", "9001", tag, user=None, steps=60)
            b = _job(jobs / "b.out", "9002", tag, user=65534)
            procs += [a, b]
            wait_for(lambda: {f["run"] for f in nans()} >= {"9001", "9002"}, 120, "NaN of both jobs", 0.2)
            seen = sorted((f["run"], f["rank"], f["step"]) for f in nans())
            assert seen == [("9001", 0, 10), ("9002", 0, 10)], [
                (f["run"], f["path"], f["line"]) for f in nans()
            ]

            def alerted_runs() -> set[str]:
                return {json.loads(b_)["run"] for b_ in posted if json.loads(b_)["kind"] == "nan_loss"}

            wait_for(lambda: len(alerted_runs()) == 2, 30, "two nan_loss alerts", 0.2)
            a.wait(timeout=120)  # job A runs to its end
            c = _job(jobs / "c.out", "9003", tag, user=None)
            procs.append(c)
            wait_for(
                lambda: "9003" in {f["run"] for f in nans()}, 120, "NaN of the next job on the same rank", 0.2
            )
        finally:
            agent.terminate()
            try:
                agent.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.communicate()
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                p.wait(timeout=10)
    alerts = [json.loads(b_) for b_ in posted]
    alerts = [a_ for a_ in alerts if a_["kind"] == "nan_loss" and a_["status"] == "firing"]
    assert sorted({a_["run"] for a_ in alerts}) == ["9001", "9002", "9003"], [a_["summary"] for a_ in alerts]
    assert not job_processes(tag)


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root for setpriv")
def test_node_daemon_never_lets_another_user_take_a_rank_of_a_job(tmp_path: Path) -> None:
    """One `watch --match` (systemd's node daemon) on a node running root's torchrun job
    (``--rdzv-id``, healthy, ``--redirects 3``) and a ``nobody`` process that says it is rank 1
    of that run (``TORCHELASTIC_RUN_ID``, ``RANK`` in its environment: the id is in torchrun's
    argv for every user to read) and goes NaN later. The impostor starts first, so the daemon
    sees it first. Root's real rank 1 is watched too; nobody's NaN is never reported as root's
    job (each user's processes are run ``<id>@<user>``, the user in findings and alerts); the
    daemon says so, naming both pids and users."""
    tag = uuid.uuid4().hex
    rdzv = f"job{tag[:8]}"
    found = tmp_path / "f.jsonl"
    os.chmod(tmp_path, 0o755)
    fake_out = tmp_path / "fake.out"
    fake_out.touch()
    os.chown(fake_out, 65534, 65534)

    def rows() -> list[dict[str, Any]]:
        return [json.loads(x) for x in found.read_text().splitlines() if x.strip()] if found.exists() else []

    procs: list[subprocess.Popen[bytes]] = []
    agent_err = tmp_path / "agent.err"
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url, named=False)
        cmd = rankwatch("watch", "--config", str(cfg), f"--match=--rw-job={tag}")
        cmd += ["--findings-jsonl", str(found)]
        with systemd_notify() as (notify_env, ready), open(agent_err, "wb") as err:
            agent = subprocess.Popen(cmd, env=job_env(tag, notify_env), stdout=subprocess.DEVNULL, stderr=err)
            ready(agent, agent_err)
        try:
            # NaN from step 100 at 0.2 s a step: well after root's ranks are there.
            fenv = job_env(tag, {"DIST": "0", "FAULT": "nan", "FAULT_RANK": "1", "FAULT_STEP": "100"})
            fenv.update(STEPS="130", STEP_S="0.2", RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
            fenv.update(TORCHELASTIC_RUN_ID=rdzv)
            setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            with open(fake_out, "ab") as fh:
                fake = subprocess.Popen(
                    [*setpriv, sys.executable, str(WORKLOAD), f"--rw-job={tag}"],
                    env=fenv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            procs.append(fake)
            wait_for(
                lambda: "step=1 " in fake_out.read_text(errors="replace"), 60, "the impostor's steps", 0.2
            )
            rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
            rendezvous += [
                "--rdzv-id",
                rdzv,
                "--redirects",
                "3",
                "--log-dir",
                str(tmp_path / "torchrun-logs"),
            ]
            job = subprocess.Popen(
                [*torchrun(WORLD, *rendezvous), str(WORKLOAD), f"--rw-job={tag}"],
                env=job_env(tag, {"FAULT": "none", "STEPS": "60"}), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            procs.append(job)

            def ranks() -> int:
                with contextlib.suppress(psutil.Error):
                    return sum("RANK" in k.environ() for k in psutil.Process(job.pid).children())
                return 0

            wait_for(lambda: ranks() == WORLD, 120, "root's ranks", 0.1)
            assert "step=95 " not in fake_out.read_text(errors="replace"), (
                "the impostor's NaN would come first"
            )
            assert job.wait(timeout=240) == 0
            wait_for(lambda: any(f["kind"] == "nan_loss" for f in rows()), 120, "the impostor's NaN", 0.2)
            wait_for(lambda: '"nan_loss"' in "".join(posted), 30, "the impostor's alert", 0.2)
        finally:
            agent.terminate()
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                p.wait(timeout=10)
    said = agent_err.read_text(errors="replace")
    findings = rows()
    debug = (
        f"{[(f['kind'], f['run'], f['rank'], f.get('user'), f['step']) for f in findings]}\n{said[-3000:]}"
    )
    # Root's real ranks were watched: each pipeline ended with the job (run <id>@root, user root).
    ends = {(f["run"], f["rank"], f.get("user")) for f in findings if f["kind"] == "process_exit"}
    assert {(f"{rdzv}@root", 0, "root"), (f"{rdzv}@root", 1, "root")} <= ends, debug
    nans = [f for f in findings if f["kind"] == "nan_loss" and not f.get("resolved")]
    assert nans and all((f["run"], f["user"]) == (f"{rdzv}@nobody", "nobody") for f in nans), debug
    assert not [f for f in findings if f["run"] == rdzv and f["user"] == "root"], debug
    alerts = [json.loads(b) for b in posted]
    nan_alerts = [a for a in alerts if a["kind"] == "nan_loss" and a["status"] == "firing"]
    assert nan_alerts, debug
    for a in nan_alerts:
        assert (a["run"], a["user"]) == (f"{rdzv}@nobody", "nobody"), a
        assert all(m["user"] == "nobody" for m in a["members"]), a
    assert f"of run {rdzv}, as pid {fake.pid} (user nobody) does" in said, debug
    assert not job_processes(tag)


@pytest.mark.timeout(300)
def test_torchrun_ranks_failing_together_never_blame_the_rank_the_launcher_stopped(tmp_path: Path) -> None:
    """Every rank raises at step 6 (the s35b tester's d31; d47 is every rank's ImportError):
    torchrun sees rank 1's exit 1 and sends SIGTERM to rank 0, still tearing down. A death by the
    launcher's stop signal is never the first failure: no finding names it first, no alert
    names it suspect; one alert; torchrun's exit status."""
    c = cell(tmp_path, "tee", {"FAULT": "raise_all", "FAULT_RANK": "1", "FAULT_STEP": "6", "STEPS": "12"})
    assert c.rc == 1, c.debug()
    stopped = {f["rank"] for f in c.findings if f["message"].startswith("after the stop signal the launcher")}
    for f in c.findings:
        assert "failed first: after the stop signal" not in f["message"], c.debug()
        first = (f.get("diagnosis") or {}).get("first_failure") or {}
        assert first.get("rank") is None or first["rank"] not in stopped, c.debug()
    for a in c.firing():
        assert a["suspect"] is None or a["suspect"] not in stopped, c.debug()
    one_alert_per_problem(c, "tee")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["tee", "plain"])
def test_a_failed_rank_the_launcher_stopped_after_its_peers_consequence_is_paged(
    tmp_path: Path, form: str
) -> None:
    """The s38 tester's g58 (a race of torch, kept in tests/data/blackbox/s38/repro/g58): rank
    1 raised and its peers lost it at once, but its own end was slow; torchrun's poll saw rank
    0's death (the consequence) first and stopped rank 1 with SIGTERM. Rank 1's own error is
    still the first failure: one critical alert, crash on rank 1, suspect rank 1."""
    c = cell(tmp_path, form, fault("raise_slow_exit", step=6, steps=12))
    assert c.rc == 1, c.debug()
    stopped = [f for f in c.on(1, "crash") if "stop signal the launcher sent" in f["message"]]
    assert stopped, c.debug()  # the race this cell is about happened
    [own] = [f for f in c.on(1, "crash") if not f.get("resolved")]
    assert own["severity"] == "critical" and own["diagnosis"]["suspect"] == 1, c.debug()
    assert "RuntimeError: rank 1 hit a bad batch at step 6" in own["message"], c.debug()
    named_after_rank_1(c)
    [alert] = [a for a in c.firing() if a["kind"] != "stall"]
    assert alert["severity"] == "critical" and alert["kind"] == "crash", c.debug()
    assert alert["diagnosis"]["first_failure"]["rank"] == 1, c.debug()


@pytest.mark.timeout(300)
def test_a_peers_timeout_that_ends_a_hang_names_the_hung_rank(tmp_path: Path) -> None:
    """The s39 tester's k18: `run -- torchrun --tee 3 --max-restarts 1`, rank 1's DataLoader
    hangs in the first attempt; the stall alert names rank 1; gloo's own timeout (15 s here)
    then ends rank 0, and torchrun restarts the job. Rank 0's crash is that hang's
    consequence: it names rank 1 (verdict ``hang``), and no alert says otherwise."""
    env = {**fault("loader_hang_once", step=8, steps=30), "PG_TIMEOUT_S": "15"}
    c = cell(tmp_path, "tee", env, more=["--max-restarts", "1"])
    # The restarted attempt is torch's: 2.13's gloo sometimes fails its connectFullMesh (the new
    # workers read the last attempt's addresses from the store), and the job then ends 1.
    assert c.rc in (0, 1), c.debug()
    stalls = c.of("stall")
    assert stalls and all(f["diagnosis"]["suspect"] == 1 for f in stalls if f.get("diagnosis")), c.debug()
    [crash] = [f for f in c.on(0, "crash") if "Timed out waiting" in f["message"]]
    assert crash["message"].startswith("rank 1 hung first"), c.debug()
    assert crash["diagnosis"]["suspect"] == 1 and crash["diagnosis"]["verdict"] == "hang", c.debug()
    hang = [a for a in c.firing() if a["kind"] == "stall" or a["summary"].startswith("crash on rank 0")]
    assert hang and all(a["suspect"] == 1 for a in hang), c.debug()
    # The hang ended (the hung process died, or torchrun restarted it): the stall alert with it.
    fired = {a["id"] for a in c.alerts if a["kind"] == "stall" and a["status"] == "firing"}
    ended = {a["id"] for a in c.alerts if a["kind"] == "stall" and a["status"] == "resolved"}
    assert fired and fired <= ended, c.debug()


@pytest.mark.timeout(300)
def test_torchrun_restarts_exhausted_is_told_naming_the_root_cause(tmp_path: Path) -> None:
    """`run -- torchrun --tee 3 --max-restarts 2`, rank 1 raises at step 5 in every attempt (the
    s35b tester's d11): each attempt's crash is rank 1's, nothing says a rank exited cleanly or
    with status 0, nothing names rank 0 first; when torchrun gives up, the job's death is an
    alert of its own: restarts exhausted (2 of 2), root cause rank 1 at its step."""
    env = {"FAULT": "raise_always", "FAULT_RANK": "1", "FAULT_STEP": "5", "STEPS": "30"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see the restart test above
    rdzv = ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    c = cell(tmp_path, "tee", env, more=("--max-restarts", "2", *rdzv))
    assert c.rc == 1, c.debug()
    assert c.log.count("rank 1 hit a bad batch at step 5") >= 3, c.debug()
    for f in c.findings:
        assert "exited cleanly" not in f["message"] and "exited with status 0" not in f["message"], c.debug()
        assert not f["message"].startswith("rank 0 failed first"), c.debug()
        assert (f.get("diagnosis") or {}).get("suspect") in (None, 1), c.debug()
    assert any("rank 1 hit a bad batch at step 5" in f["message"] for f in c.on(1, "crash")), c.debug()
    [gave_up] = c.of("restarts_exhausted")
    assert gave_up["rank"] == 1 and gave_up["severity"] == "critical", c.debug()
    assert "restarts exhausted (2 of 2)" in gave_up["message"], c.debug()
    assert "root cause rank 1 at step 4: RuntimeError: rank 1 hit a bad batch" in gave_up["message"], (
        c.debug()
    )
    [alert] = c.alerts_of("restarts_exhausted")
    assert alert["suspect"] == 1 and alert["summary"].endswith(", suspect rank 1"), alert
    for a in c.firing():
        assert a["suspect"] in (None, 1), c.debug()


@pytest.mark.timeout(300)
def test_torchrun_ranks_that_fail_in_one_poll_are_no_clean_exits(tmp_path: Path) -> None:
    """Every rank raises at step 5 in every attempt, `--max-restarts 1`: torchrun logs one
    `failed (exitcode: 1)` line per attempt, for the first failure its poll saw; the other rank,
    failed in the same poll, gets no line of its own until the last attempt's failure box. Its
    end is no clean exit (nothing says "exited cleanly" or "exited with status 0"), and the job's
    death is told as restarts exhausted (1 of 1)."""
    env = {"FAULT": "raise_all", "FAULT_RANK": "-1", "FAULT_STEP": "5", "STEPS": "30"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see the restart test above
    rdzv = ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    c = cell(tmp_path, "tee", env, more=("--max-restarts", "1", *rdzv))
    assert c.rc == 1, c.debug()
    for f in c.findings:
        assert "exited cleanly" not in f["message"] and "exited with status 0" not in f["message"], c.debug()
    for r in (0, 1):
        assert c.on(r, "crash"), c.debug()
    [gave_up] = c.of("restarts_exhausted")
    assert "restarts exhausted (1 of 1)" in gave_up["message"], c.debug()


# --- s36: one alert per problem with the alert board on (its default: the dumps folder) ---------


def board_cell(
    tmp: Path,
    form: str,
    env: dict[str, str],
    *,
    more: Sequence[str] = (),
    hang: bool = False,
    stuck: tuple[int, ...] = (0, 1),
    stall: str = "",
    grace: str = "120s",
    react_s: float = 0.0,
) -> Cell:
    """A cell with the alert board on, as a user's default config has it, and the run named
    from torchrun's ``--rdzv-id`` (the agent's own run is "default", the workers' the id).
    ``react_s``: the user stops a hang this long after the last stuck rank's stall is found (a
    pager's reaction, not at once: whatever that stall would send has had its group wait)."""
    with webhook() as (url, posted):
        cfg = agent_config(tmp, url=url, board=True, named=False, stall=stall, grace=grace)
        running = FORMS[form](tmp, cfg, env, ("--rdzv-id", f"job{uuid.uuid4().hex[:6]}", *more))
        found_at: list[float] = []

        def stalled(rows: list[dict[str, Any]]) -> bool:
            if not {f["rank"] for f in rows if f["kind"] == "stall" and not f.get("resolved")} >= set(stuck):
                return False
            found_at[:] = found_at or [time.monotonic()]
            return time.monotonic() - found_at[0] >= react_s

        return finish(running, tmp, posted, hang=stalled if hang else None)


@pytest.mark.timeout(300)
def test_a_rank_that_leaves_early_pages_once_at_the_jobs_death(tmp_path: Path) -> None:
    """s36 e04: rank 0 (the store's host) returns from main with status 0 at step 10 under
    ``run -- torchrun --redirects 3 --log-dir``; rank 1 dies in its next collective (its gloo
    warning, then its crash as the agent closes and the board holds the warning). ONE alert for
    the dead job, at critical severity (a route on ``min_severity: critical`` pages), naming
    rank 0, the rank that left first."""
    env = {"FAULT": "exit", "FAULT_RANK": "0", "FAULT_STEP": "10", "STEPS": "60"}
    c = board_cell(tmp_path, "redirects", env, hang=True, stuck=(1,))
    assert "rank 0 leaves early at step 10" in c.log, c.debug()
    assert c.rc not in (0, None), c.debug()
    failures = [a for a in c.firing() if a["kind"] != "stall"]
    if c.on(1, "crash"):
        [alert] = failures or [None]
        assert alert is not None and alert["severity"] == "critical", c.debug()
    else:  # gloo hung instead of erroring out: the stall names rank 0
        assert not failures, c.debug()
        [alert] = c.alerts_of("stall")
    assert alert["suspect"] == 0 and alert["summary"].endswith(", suspect rank 0"), c.debug()


@pytest.mark.timeout(300)
def test_a_silent_rank_judged_later_joins_the_hangs_one_alert(tmp_path: Path) -> None:
    """s36 e16: only rank 0 prints step lines (as HF Trainer does), rank 1's DataLoader worker
    blocks at step 8. Rank 0 stalls after the step-interval timeout and its alert goes out;
    rank 1, a silent rank, is judged stalled after ``silent_rank_timeout``, naming the same
    suspect and incident: it joins that alert. One stall alert for the one hang."""
    env = {**fault("loader_hang", step=8, steps=60), "LOG_RANKS": "0"}
    c = board_cell(
        tmp_path, "tee", env, hang=True, stall=", silent_rank_timeout: 8s", grace="30s", react_s=4.0
    )
    for r in (0, 1):
        [stall, *_] = c.on(r, "stall")
        assert stall["diagnosis"]["suspect"] == 1, c.debug()
    alerts = c.alerts_of("stall")
    assert len(alerts) == 1, c.debug()
    [alert] = alerts
    assert alert["suspect"] == 1 and alert["summary"].endswith(", suspect rank 1"), c.debug()


@pytest.mark.timeout(300)
def test_the_stall_title_counts_the_world_under_torchrun(tmp_path: Path) -> None:
    """s36 e26: under ``run -- torchrun`` the workers' world is known (WORLD_SIZE), so a stall of
    every rank is "stall on 2 of 2 ranks", as the srun form says, also when the alert board
    sends it."""
    c = board_cell(tmp_path, "redirects", fault("loader_hang", step=8, steps=60), hang=True)
    [alert] = c.alerts_of("stall")
    assert alert["world_size"] == 2, c.debug()
    if len(alert["ranks"]) == 2:
        assert alert["summary"] == "stall on 2 of 2 ranks, suspect rank 1", c.debug()
    else:  # one rank judged first; the other joined its alert
        assert alert["summary"].endswith(", suspect rank 1"), c.debug()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("form", "status"),
    [("bash-c", 1), ("bash-exec", 1), ("script", 0), ("launcher-pid", 1), ("pod-match", 1)],
)
def test_a_launcher_the_agent_was_not_given_is_found_in_the_tree(
    tmp_path: Path, form: str, status: int
) -> None:
    """torchrun run by a wrapper (``bash -c``, with or without ``exec``, a script that exits 0 after
    it) or followed by its
    pid (``watch --pid``) is handled as ``run -- torchrun`` is: rank 1's RuntimeError at step 8 is
    its crash, quoted; rank 0's gloo error is named after it; one alert, suspect rank 1; the
    wrapper's exit 0 is never read as a worker's clean exit ("then exited cleanly"). The status
    the user sees is the wrapper's (the script's echo: 0) or torchrun's (1)."""
    c = cell(tmp_path, form, fault("raise", steps=30))
    assert c.rc == status, c.debug()
    [crash] = c.on(1, "crash")
    assert "RuntimeError: rank 1 hit a bad batch at step 8" in crash["message"], c.debug()
    assert crash["world_size"] == WORLD, c.debug()
    assert not c.of("traceback"), c.debug()
    assert not [f for f in c.serious() if f["rank"] is None], c.debug()
    named_after_rank_1(c)
    one_alert_per_problem(c, form)
    no_agent_failed(c)


@pytest.mark.timeout(300)
def test_a_pods_sidecar_matching_its_torchrun_names_the_hung_rank(tmp_path: Path) -> None:
    """The s39 tester's k49: a pod running `torchrun --tee 3 ... > pod.log`, its sidecar
    `watch --match P --log pod.log` (P matches torchrun and its workers). Rank 1's DataLoader
    hangs: the stall names rank 1 (not "pid N" of a rank-less tree), world size 2, one alert."""
    c = cell(tmp_path, "pod-match", fault("loader_hang", steps=400), hang=True)
    stalls = c.of("stall")
    assert stalls and all(f["rank"] in (0, 1) and f["world_size"] == WORLD for f in stalls), c.debug()
    for f in stalls:
        assert f["diagnosis"]["suspect"] == 1, c.debug()
    [alert] = c.alerts_of("stall")
    assert alert["suspect"] == 1 and alert["summary"].endswith(", suspect rank 1"), c.debug()
    assert alert["world_size"] == WORLD, c.debug()


@pytest.mark.timeout(300)
def test_an_agent_following_a_launcher_stopped_mid_run_judges_no_live_worker(tmp_path: Path) -> None:
    """``watch --pid <torchrun>`` stopped (Ctrl-C) while the job runs: the agent ends with
    status 0 and says nothing of its workers' ends (they still run: no clean exit, no crash, no
    "exit status unknown"), and the job goes on to its own end."""
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        env = {"FAULT": "none", "STEPS": "100000"}
        running = watch_launcher(tmp_path, cfg, torchrun(WORLD, "--tee", "3"), env, verbose=True)
        try:
            [agent] = running.agents
            out = tmp_path / "agent.out"
            wait_for(lambda: "rank 1 is pid" in out.read_text(errors="replace"), 120, "rank 1's worker", 0.25)
            agent.send_signal(signal.SIGINT)
            assert agent.wait(timeout=60) == 0, out.read_text(errors="replace")[-3000:]
            assert running.procs[0].poll() is None, "the job ended with the agent"
        except BaseException:
            # A job of 100,000 steps must not outlive a failed test (torchrun runs in the background).
            for p in [*running.procs, *running.agents]:
                if p.poll() is None:
                    p.kill()
            reap_leftovers(running.tag, grace=0)
            raise
        running.stop()  # the user's own stop of the job, once the agent is gone
        c = finish(running, tmp_path, posted)
    assert not [f for f in c.findings if f["kind"] in ("process_exit", "crash", "traceback")], c.debug()
    assert not c.firing(), c.debug()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("form", "status"), [("bash-c", 0), ("script", 0), ("launcher-pid", 0), ("pod-match", 0)]
)
def test_a_healthy_launcher_the_agent_was_not_given_ends_silent(
    tmp_path: Path, form: str, status: int
) -> None:
    """Two healthy workers under a wrapper's torchrun, or under a torchrun followed by pid: no
    finding at all (not even "exit status unknown": torchrun's silence on every worker it saw
    end is their clean exit, and its own), no alert, exit status 0."""
    # The sidecar starts once the pod's job runs: a job long enough to be seen running.
    c = cell(tmp_path, form, {"FAULT": "none", "STEPS": "100" if form == "pod-match" else "15"})
    assert c.rc == status, c.debug()
    assert not c.findings and not c.alerts, c.debug()
    no_agent_failed(c)
