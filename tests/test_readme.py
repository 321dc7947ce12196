"""What the README shows is what the commands print (issue 30: its examples/hf-oom output
had drifted), and its first lines are the quickstart CI and new users run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _shown(command: str) -> list[str]:
    """The lines the README shows under ``$ <command>`` in a code block."""
    m = re.search(rf"```sh\n\$ {re.escape(command)}\n(.*?)```", README, re.S)
    assert m, f"the README shows no output of {command!r}"
    return m.group(1).rstrip("\n").split("\n")


def _matches(shown: list[str], real: list[str]) -> str | None:
    """None when ``real`` prints every shown line in order: a line ending in `` ...`` is a
    prefix, a line that is only ``...`` (indented) skips lines; else what did not match."""
    i = 0
    skipping = False
    for want in shown:
        if want.strip() == "...":
            skipping = True
            continue
        while i < len(real):
            got = real[i]
            i += 1
            ok = got.startswith(want[:-4]) if want.endswith(" ...") else got == want
            if ok:
                skipping = False
                break
            if not skipping:
                return f"README shows {want!r}, the command printed {got!r}"
        else:
            return f"README shows {want!r}, the command printed nothing more"
    return None


@pytest.mark.process
def test_the_readmes_hf_oom_output_is_what_analyze_prints() -> None:
    cmd = "rankwatch analyze examples/hf-oom/train.log"
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", *cmd.split()[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stderr  # findings
    problem = _matches(_shown(cmd), out.stdout.rstrip("\n").split("\n"))
    assert problem is None, problem


@pytest.mark.unit
def test_the_quickstart_installs_the_runtime_and_the_second_line_installs_and_runs_the_tests() -> None:
    block = README.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert "pip install -e . &&" in block[0] and block[0].endswith("rankwatch demo")
    assert "[test]" not in block[0]  # the developer install is a line of its own
    # The second line works on a fresh machine after the first: it adds the developer install.
    assert block[1] == "pip install -e '.[test]' && python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{block[1]}\n" in ci  # CI runs the README's test command as written


@pytest.mark.unit
def test_relative_links_in_the_readme_resolve_in_a_clone() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [x for x in links if "://" not in x and not x.startswith("mailto:")]
    broken = [x for x in local if not (ROOT / x).resolve().is_relative_to(ROOT) or not (ROOT / x).exists()]
    assert not broken, broken
