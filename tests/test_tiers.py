"""The tier rules of tests/conftest.py, run on small suites of their own in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
INI = """[pytest]
markers =
    unit: u
    process: p
    tool: t
    torch: t
    faults: f
"""

# plugins the small suites do not need; each costs their start-up time
NOT_NEEDED = ("cacheprovider", "rerunfailures", "hypothesispytest", "anyio", "timeout", "cloudcoil")


def run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_it=body)
    # importlib mode: the copied conftest must not collide with this suite's `conftest` module
    return pytester.runpytest_inprocess("--import-mode=importlib", *[f"-pno:{p}" for p in NOT_NEEDED], *args)


@pytest.mark.unit
def test_a_test_without_a_tier_fails_collection_and_names_the_line_to_add(pytester: pytest.Pytester) -> None:
    res = run(pytester, "import pytest\n\ndef test_a():\n    pass\n", "-m", "unit")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*test_it.py::test_a: no tier", "add `pytestmark = pytest.mark.<tier>`*"])


@pytest.mark.unit
def test_two_tiers_and_the_old_integration_marker_are_refused(pytester: pytest.Pytester) -> None:
    body = (
        "import pytest\n\npytestmark = pytest.mark.unit\n\n"
        "@pytest.mark.process\ndef test_two():\n    pass\n\n"
        "@pytest.mark.integration\ndef test_old():\n    pass\n\n"
        "@pytest.mark.torch\ndef test_torch_unit():\n    pass\n"
    )
    res = run(pytester, body)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(
        [
            "*test_two: more than one tier (process, unit)*",
            "*test_old: the `integration` marker is now `tool`*",
            "*test_torch_unit: marked torch, so its tier is tool, not unit*",
        ]
    )


@pytest.mark.unit
def test_one_tier_each_runs_and_m_selects_it(pytester: pytest.Pytester) -> None:
    body = (
        "import pytest\n\n"
        "@pytest.mark.unit\ndef test_u():\n    pass\n\n"
        "@pytest.mark.tool\n@pytest.mark.torch\ndef test_t():\n    pass\n"
    )
    run(pytester, body, "-m", "unit").assert_outcomes(passed=1, deselected=1)


STARTS = {
    "subprocess": "subprocess.run(['true'])",
    "system": "os.system('true')",
    "asyncio": "asyncio.run(asyncio.create_subprocess_exec('true'))",
    "multiprocessing": "multiprocessing.get_context('spawn').Process(target=print).start()",
    "fork": "os.fork()",
    "server": "asyncio.run(asyncio.start_server(lambda r, w: None, '127.0.0.1', 0))",
}


@pytest.mark.unit
def test_a_unit_test_that_starts_a_process_fails_even_if_it_swallows_the_error(
    pytester: pytest.Pytester,
) -> None:
    body = "import asyncio, multiprocessing, os, subprocess\nimport pytest\n\npytestmark = pytest.mark.unit\n"
    for name, start in STARTS.items():
        body += f"\ndef test_{name}():\n    {start}\n"
        body += f"\ndef test_{name}_swallowed():\n    try:\n        {start}\n"
        body += "    except Exception:\n        pass\n"
    res = run(pytester, body, "--tb=line")  # twelve full tracebacks are most of its time
    # a swallowed start fails in the fixture's teardown: an error, not a failure
    res.assert_outcomes(failed=len(STARTS), passed=len(STARTS), errors=len(STARTS))
    res.stdout.fnmatch_lines(["*a unit test started a process*", "*mark it `process` or `tool`*"])
    for name in STARTS:
        res.stdout.fnmatch_lines([f"FAILED test_it.py::test_{name} - RuntimeError*"])
        res.stdout.fnmatch_lines([f"ERROR test_it.py::test_{name}_swallowed - Failed*"])


@pytest.mark.process  # the suite it runs starts a process in this one
def test_a_process_test_may_start_one(pytester: pytest.Pytester) -> None:
    body = "import subprocess\nimport pytest\n\npytestmark = pytest.mark.process\n\n"
    body += "def test_spawns():\n    assert subprocess.run(['true']).returncode == 0\n"
    run(pytester, body).assert_outcomes(passed=1)


@pytest.mark.unit
def test_a_unit_test_asserting_a_wall_clock_duration_fails_collection(pytester: pytest.Pytester) -> None:
    body = (
        "import time, pytest\n\n"
        "@pytest.mark.unit\n"
        "def test_fast():\n"
        "    t0 = time.monotonic()\n"
        "    took = time.monotonic() - t0\n"
        "    assert took < 0.1\n\n"
        "@pytest.mark.process\n"
        "def test_real_process_may():\n"
        "    t0 = time.monotonic()\n"
        "    assert time.monotonic() - t0 < 5\n"
    )
    res = run(pytester, body)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*test_it.py::test_fast: asserts a wall-clock duration (line 7)*"])
    assert "test_real_process_may" not in res.stderr.str()


@pytest.mark.unit
def test_only_tests_that_start_real_programs_are_rerun_and_each_rerun_is_named(
    pytester: pytest.Pytester,
) -> None:
    body = (
        "import pytest\n\n"
        "N = {'p': 0, 'u': 0}\n\n"
        "@pytest.mark.process\n"
        "def test_p():\n"
        "    N['p'] += 1\n"
        "    assert N['p'] > 1\n\n"
        "@pytest.mark.unit\n"
        "def test_u():\n"
        "    N['u'] += 1\n"
        "    assert N['u'] > 1\n"
    )
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_it=body)
    off = [f"-pno:{p}" for p in NOT_NEEDED if p != "rerunfailures"]
    res = pytester.runpytest_inprocess("--import-mode=importlib", "-p", "rerunfailures", *off)
    res.assert_outcomes(passed=1, failed=1)  # the unit test is not retried
    res.stdout.fnmatch_lines(["*1 failed, 1 passed, 1 rerun*"])
    res.stdout.fnmatch_lines(["*reruns (1 of at most *)*", "RERUN test_it.py::test_p"])
