"""Test tiers, the strict-skip rule of CI, and the helpers every test file shares.

**Tiers.** Every test carries exactly one tier marker (registered in pyproject.toml):

- ``unit``: in this process only. No subprocess, no fork, no listening socket: an autouse
  fixture makes them raise, so a unit test that needs a process or a server is found at
  once. It is the quick tier (``python -m pytest -m unit``): nothing to start or install.
- ``process``: starts our own programs (a ``rankwatch`` agent, a fake trainer, a Python
  child) or servers on loopback (an agent's HTTP server, a fake Slack), in this process or
  another.
- ``tool``: needs a real external tool or framework: Prometheus, promtool, Alertmanager,
  Chromium, Slurm, py-spy, gcc, Helm, shellcheck, systemd, PyTorch, Transformers, Lightning.

``faults`` (the fault-injection suite) and ``torch`` (needs real PyTorch; always ``tool``)
are extra selections on top of a tier, not tiers. Collection fails on a test with no tier or
with two, naming the line to add, so a new test cannot end up in no tier (``-m unit`` would
silently never run it).

**Strict skips.** Locally a missing promtool or Chromium skips with the install hint; under
``CI=true`` (set by the CI runner) or ``RANKWATCH_STRICT_SKIPS=1`` the same skip fails the
run, so a broken install step cannot turn the real-tool tests into silent passes. What no
install step can give (a GPU, IPv6 loopback, a new enough systemd, root for tmpfs and
slurmd, inotify) stays a skip.

**Shared helpers**: ``FakeClock`` (also the ``fake_clock`` fixture), ``free_port()`` (also
the ``loopback_port`` fixture), ``until`` (async) and ``wait_for`` (sync) bounded waits;
``ticks_during`` (a coroutine's result and how often the loop turned meanwhile: a blocking
call on the loop counts none); ``source_nodes(path)``, every AST node of a source file, parsed
once per run for the tests that read the package's code (layers, finding vocabulary). Test
modules import them with ``from conftest import FakeClock, until``.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

# pytester: tests/test_tiers.py runs the tier rules below on small suites of its own.
pytest_plugins = ["pytester"]

T = TypeVar("T")


@functools.cache
def inspect_unwrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    import inspect

    return inspect.unwrap(fn)


def source_nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s syntax tree (``ast.walk`` order), parsed once per test run."""
    return tuple(ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))))


# pytest rewrites the asserts of every test module (and of plugin packages such as hypothesis)
# at each run unless it may cache the result as bytecode; with PYTHONDONTWRITEBYTECODE set that
# is ~10 s of a run on a busy 2-core machine, more than the unit tier's tests take. The cache
# goes to one git-ignored folder, not into __pycache__ folders beside the sources (tests list
# folders such as examples/).
sys.dont_write_bytecode = False
sys.pycache_prefix = str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "pycache")

# --- tiers -----------------------------------------------------------------------------------
TIERS = ("unit", "process", "tool")
QUICK_FUZZ_ENV = "RANKWATCH_FUZZ"


def pytest_configure(config: pytest.Config) -> None:
    """``-m unit`` alone is a developer's quick loop: the property tests there draw a sixteenth of
    their examples (``fuzz_examples``). Any other run, CI's full one included, draws them all;
    ``RANKWATCH_FUZZ=full`` or ``=quick`` says so explicitly."""
    if QUICK_FUZZ_ENV not in os.environ and (config.option.markexpr or "").strip() == "unit":
        os.environ[QUICK_FUZZ_ENV] = "quick"


def fuzz_examples(n: int) -> int:
    """Hypothesis ``max_examples`` for a property test: ``n``, or a sixteenth of it (at least 10)
    in the quick unit loop: enough to exercise each property while editing; CI draws all ``n``.
    Settings are built when the test module is imported, after ``pytest_configure`` has run."""
    return max(10, n // 16) if os.environ.get(QUICK_FUZZ_ENV) == "quick" else n


_CALL_FAILED = pytest.StashKey[bool]()


def _tier_problem(item: pytest.Item) -> str | None:
    names = [m.name for m in item.iter_markers()]
    tiers = sorted({n for n in names if n in TIERS})
    if "integration" in names:
        return "the `integration` marker is now `tool`: replace it with pytest.mark.tool"
    if not tiers:
        return "no tier"
    if len(tiers) > 1:
        return (
            f"more than one tier ({', '.join(tiers)}): keep one; in a module that mixes tiers, "
            f"drop the module's `pytestmark` tier and mark each test"
        )
    if "torch" in names and tiers != ["tool"]:
        return f"marked torch, so its tier is tool, not {tiers[0]}"
    return None


# --- no wall-clock assertion in the unit tier ------------------------------------------------------
# A unit test that asserts an elapsed wall-clock time (`assert time.monotonic() - t0 < 0.1`)
# passes or fails with the machine's load, not with the code. Collection refuses one: use a fake
# clock, count loop turns (`ticks_during`), or let a hang fail by the test's timeout instead.
_CLOCKS = frozenset({"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"})


def _is_clock_read(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _CLOCKS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def wall_clock_asserts(tree: ast.AST) -> list[int]:
    """Lines of ``assert``s in ``tree`` that compare a wall-clock duration."""
    reads: set[str] = set()
    durations: set[str] = set()

    def mentions_read(e: ast.AST) -> bool:
        return any(_is_clock_read(x) or (isinstance(x, ast.Name) and x.id in reads) for x in ast.walk(e))

    def is_duration(e: ast.AST) -> bool:
        return any(
            (
                isinstance(x, ast.BinOp)
                and isinstance(x.op, ast.Sub)
                and (mentions_read(x.left) or mentions_read(x.right))
            )
            or (isinstance(x, ast.Name) and x.id in durations)
            for x in ast.walk(e)
        )

    for _ in range(2):  # a duration may be derived from a duration assigned later in the text
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                names = [x.id for t in node.targets for x in ast.walk(t) if isinstance(x, ast.Name)]
                if _is_clock_read(node.value):
                    reads.update(names)
                elif is_duration(node.value):
                    durations.update(names)
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        and any(isinstance(c, ast.Compare) and is_duration(c) for c in ast.walk(node.test))
    )


@functools.cache
def _unit_wall_clock_problem(fn: Callable[..., Any]) -> str | None:
    import inspect
    import textwrap

    try:
        src = textwrap.dedent(inspect.getsource(fn))
        first = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return None
    lines = wall_clock_asserts(ast.parse(src))
    if not lines:
        return None
    where = ", ".join(str(first + n - 1) for n in lines)
    return f"asserts a wall-clock duration (line {where}): a unit test may not; see tests/conftest.py"


HOW = (
    "add `pytestmark = pytest.mark.<tier>` below the imports of the file (all its tests alike) or "
    "`@pytest.mark.<tier>` on each test, where <tier> is\n"
    "    unit     in this process only: no subprocess, no listening server (enforced)\n"
    "    process  starts our own programs or servers on loopback (rankwatch agents, trainers, ...)\n"
    "    tool     needs a real external tool (prometheus, promtool, chromium, slurm, py-spy, gcc,\n"
    "             helm, shellcheck, systemd, torch, transformers, lightning)"
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: an untiered test must not vanish
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems: dict[str, list[str]] = {}
    for item in items:
        problem = _tier_problem(item)
        fn = getattr(item, "obj", None)
        if problem is None and item.get_closest_marker("unit") is not None and callable(fn):
            problem = _unit_wall_clock_problem(inspect_unwrap(fn))
        if problem:
            test = re.sub(r"\[.*\]$", "", item.nodeid)
            line = f"  {test}: {problem}"
            if line not in problems.setdefault(problem, []):
                problems[problem].append(line)
    if problems:
        lines = [line for group in problems.values() for line in group]
        raise pytest.UsageError(
            "every test needs exactly one tier marker, and a unit test no wall-clock assertion "
            "(tests/conftest.py):\n" + "\n".join(lines) + ("\n" + HOW if "no tier" in problems else "")
        )
    # Tests that start real programs (agents, trainers, Slurm, Prometheus, Chromium) wait on
    # wall-clock deadlines on a 2-core machine that other work shares: a missed deadline there
    # is retried once (pytest-rerunfailures). Unit tests are deterministic and never retried: a
    # unit test that fails once has found something. Every rerun is named in the summary and
    # more than RERUN_LIMIT of them fail the run (pytest_sessionfinish below), so flakiness
    # cannot hide behind retries.
    if config.pluginmanager.hasplugin("rerunfailures"):
        for item in items:
            if item.get_closest_marker("flaky") is None and item.get_closest_marker("unit") is None:
                item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=1))


# How many reruns a whole run may need before it fails; RANKWATCH_RERUN_LIMIT overrides.
RERUN_LIMIT = int(os.environ.get("RANKWATCH_RERUN_LIMIT", "3"))
_RERUNS: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun" and report.when == "call":  # type: ignore[comparison-overlap]
        _RERUNS.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _RERUNS:
        return
    terminalreporter.section(f"reruns ({len(_RERUNS)} of at most {RERUN_LIMIT})")
    for nodeid in _RERUNS:
        terminalreporter.write_line(f"RERUN {nodeid}")
    if len(_RERUNS) > RERUN_LIMIT:
        terminalreporter.write_line(f"more than {RERUN_LIMIT} reruns: the run fails (RANKWATCH_RERUN_LIMIT)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if len(_RERUNS) > RERUN_LIMIT and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _stand_in(name: str, refuse: Callable[[str], NoReturn]) -> Callable[..., NoReturn]:
    def start(*args: Any, **_: Any) -> NoReturn:
        refuse(f"os.{name}{args[:2]}")

    # still pickled by reference as os.<name>, as the real one is (a test pickles os.system)
    start.__module__, start.__name__, start.__qualname__ = "os", name, name
    return start


@pytest.fixture(autouse=True)
def _unit_starts_no_process(request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """A unit test that starts a process or a server is mis-tiered: every way to start one
    raises here, and the test fails even where the code under test swallowed the error."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import _posixsubprocess

    tried: list[str] = []

    def refuse(what: Any) -> NoReturn:
        tried.append(str(what))
        raise RuntimeError(
            f"a unit test started a process or server ({what}): mark the test `process` "
            f"(or `tool` if it needs a real external tool), not `unit`"
        )

    def execute_child(self: subprocess.Popen[Any], args: Any, *_: Any, **__: Any) -> NoReturn:
        refuse(args)

    def listen(self: socket.socket, *_: Any) -> NoReturn:
        refuse(f"a server listening on {self.getsockname()}")

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(subprocess.Popen, "_execute_child", execute_child)
        mp.setattr(socket.socket, "listen", listen)
        mp.setattr(_posixsubprocess, "fork_exec", lambda args, *_, **__: refuse(args))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve"):
            if hasattr(os, name):
                mp.setattr(os, name, _stand_in(name, refuse))
        yield
    finally:
        mp.undo()
    if tried and not request.node.stash.get(_CALL_FAILED, False):  # the error was swallowed
        pytest.fail(f"a unit test started a process or server ({tried[0]}): mark it `process` or `tool`")


@pytest.fixture(autouse=True)
def _private_runtime_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Generator[Path, None, None]:
    """Each test its own ``$XDG_RUNTIME_DIR`` (0700), inherited by the agents it starts: the
    token an agent makes when none is configured never lands in the real runtime folder, and
    tests never share one."""
    folder = tmp_path_factory.mktemp("xdg")
    folder.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    yield folder


def agent_token() -> str:
    """The token this test's agents use when none is configured (the CLI reads the same)."""
    from rankwatch.server.tokenfile import read_token

    token = read_token()
    assert token, "no agent has made a token in this test's runtime folder yet"
    return token


# --- strict skips ------------------------------------------------------------------------------
# What no install step can give: a GPU, IPv6, a new systemd, root for tmpfs/slurmd, inotify.
ALLOWED_SKIPS = re.compile(
    r"no GPU|NVML|IPv6|systemd < 250|needs root|CAP_SYS_ADMIN|no mount\(8\)|slurmd as root|inotify",
    re.IGNORECASE,
)


def _strict() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("RANKWATCH_STRICT_SKIPS") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    if not (_strict() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if ALLOWED_SKIPS.search(reason):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, where every tool is installed: {reason}"


# --- shared helpers ------------------------------------------------------------------------------
class FakeClock:
    """A clock moved by hand: pass it where the code takes ``clock=`` (a ``() -> float``)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def loopback_port() -> int:
    return free_port()


def _timed_out(cond: Callable[[], Any], timeout: float, what: str) -> AssertionError:
    code = getattr(cond, "__code__", None)
    where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}" if code else repr(cond)
    return AssertionError(f"timed out after {timeout}s waiting for {what or where}")


def wait_for(cond: Callable[[], T], timeout: float = 20.0, what: str = "", interval: float = 0.02) -> T:
    """Poll ``cond`` until it is truthy and return its value; fail the test at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise _timed_out(cond, timeout, what)
        time.sleep(interval)


async def ticks_during(
    work: Coroutine[Any, Any, T], *, every: float = 0.002, limit: float = 10.0
) -> tuple[T, int, float]:
    """Await ``work`` (at most ``limit`` s) and count the loop's turns meanwhile, one per
    ``every`` s: a loop wedged by a blocking call counts none. (result, turns, seconds)."""
    n = 0
    stop = False

    async def tick() -> None:
        nonlocal n
        while not stop:
            n += 1
            await asyncio.sleep(every)

    t = asyncio.create_task(tick())
    await asyncio.sleep(0)
    start = time.monotonic()
    try:
        out = await asyncio.wait_for(work, limit)
    finally:
        stop = True
        await t
    return out, n, time.monotonic() - start


async def until(cond: Callable[[], T], timeout: float = 20.0, what: str = "", interval: float = 0.01) -> T:
    """``wait_for`` for a coroutine: the event loop runs between polls. The first polls come
    after a bare turn of the loop, then the pause doubles from 0.5 ms up to ``interval``: a
    fake-clock test waits for tasks that act within a few turns, and a fixed 10 ms per poll
    was most of the unit tier's wall time."""
    deadline = time.monotonic() + timeout
    pause = 0.0
    turns = 0
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise _timed_out(cond, timeout, what)
        await asyncio.sleep(pause)
        turns += 1
        if turns >= 4:
            pause = min(interval, max(0.0005, pause * 2))
