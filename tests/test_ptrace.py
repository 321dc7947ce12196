"""Knowing before a hang whether py-spy will be allowed to attach (Yama, CAP_SYS_PTRACE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.dumps import ptrace
from rankwatch.dumps.ptrace import has_cap_sys_ptrace, ptrace_problem, tracer_preexec, yama_scope
from rankwatch.identity import Identity
from rankwatch.runtime import agent as agent_mod
from rankwatch.runtime.agent import Agent


@pytest.mark.unit
@pytest.mark.parametrize(
    ("scope", "cap", "launched", "expect"),
    [
        (None, False, False, None),  # no Yama: same-user ptrace is allowed
        (0, False, False, None),
        (1, False, True, None),  # run mode: the rank named the agent its tracer
        (1, True, False, None),
        (1, False, False, "ptrace_scope=1"),  # watch mode without the capability
        (2, True, False, None),
        (2, False, True, "ptrace_scope=2"),
        (3, True, True, "ptrace_scope=3"),
    ],
)
def test_ptrace_problem(scope: int | None, cap: bool, launched: bool, expect: str | None) -> None:
    got = ptrace_problem(launched=launched, scope=scope, cap=cap)
    if expect is None:
        assert got is None
    else:
        assert got is not None and expect in got and "Fix:" in got


@pytest.mark.unit
def test_run_mode_through_a_wrapper_is_not_covered_by_the_tracer_exception() -> None:
    got = ptrace_problem(launched=True, scope=1, cap=False, wrapper=True)
    assert got is not None and "not the Python rank" in got and "Fix:" in got
    assert ptrace_problem(launched=True, scope=1, cap=True, wrapper=True) is None
    assert ptrace_problem(launched=True, scope=0, cap=False, wrapper=True) is None


@pytest.mark.unit
def test_yama_scope_and_capability_read_from_proc_files(tmp_path: Path) -> None:
    f = tmp_path / "scope"
    assert yama_scope(f) is None
    f.write_text("1\n")
    assert yama_scope(f) == 1
    f.write_text("garbage")
    assert yama_scope(f) is None
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t0000000000080000\n")  # bit 19
    assert has_cap_sys_ptrace(status)
    status.write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    assert not has_cap_sys_ptrace(status)


@pytest.mark.process
def test_tracer_preexec_only_where_yama_would_refuse_and_child_still_runs() -> None:
    assert tracer_preexec(os.getpid(), scope=None, cap=False) is None
    assert tracer_preexec(os.getpid(), scope=0, cap=False) is None
    assert tracer_preexec(os.getpid(), scope=1, cap=True) is None
    pre = tracer_preexec(os.getpid(), scope=1, cap=False)
    assert pre is not None
    # Without Yama the prctl fails (EINVAL); the child must start all the same.
    out = subprocess.run(
        [sys.executable, "-c", "print('up')"], preexec_fn=pre, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "up"


@pytest.mark.process
def test_watch_mode_stall_says_up_front_that_yama_will_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    a = Agent(cfg, Identity(rank=0, local_rank=0, world_size=1, node="n", run="t"))
    monkeypatch.setattr(agent_mod, "find_py_spy", lambda _exe: "/usr/bin/py-spy")
    monkeypatch.setattr(agent_mod, "yama_scope", lambda: 1)
    monkeypatch.setattr(agent_mod, "has_cap_sys_ptrace", lambda: False)
    problem = a.dump_problem()
    assert problem is not None and "ptrace_scope=1" in problem
    a.launched = True
    assert a.dump_problem() is None  # no process attached: nothing says it is not the rank
    w = a.add_watcher([])
    shell = subprocess.Popen(["sleep", "30"])
    try:
        w.attach(shell.pid)  # `rankwatch run -- bash train.sh`: the exception stops at the shell
        problem = a.dump_problem()
        assert problem is not None and "not the Python rank" in problem
        py = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            w.attach(py.pid)
            assert a.dump_problem() is None
        finally:
            py.kill()
            py.wait(5)
    finally:
        shell.kill()
        shell.wait(5)
    assert ptrace.PR_SET_PTRACER == 0x59616D61
