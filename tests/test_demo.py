"""`rankwatch demo` is the README's first command: it must work on a fresh machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.tool


def test_demo_finds_nan_stall_and_names_the_hung_rank(tmp_path) -> None:
    """The README's command as it is (no --workdir, no --keep): every folder it names to
    inspect must still exist afterwards, and --keep is said."""
    import os
    import re

    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "demo"],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "CRITICAL nan_loss step 120" in text
    assert text.count("CRITICAL stall") == 4
    assert "suspect: rank 1" in text
    assert "CRITICAL crash" not in text  # the demo's own shutdown is not a crash
    assert "rankwatch demo --keep" in text
    commands = [ln for ln in text.splitlines() if ln.startswith("$ ")]
    named = [p for ln in commands for p in re.findall(rf"{re.escape(str(tmp_path))}/\S+", ln)]
    assert not named, f"commands to run afterwards point into the removed folder: {commands}"
    assert list(tmp_path.iterdir()) == []  # nothing left behind without --keep


def test_demo_keep_leaves_the_folder_the_printed_command_needs(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "demo", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cmd = next(ln for ln in out.stdout.splitlines() if ln.startswith("$ rankwatch dumps diff"))
    again = subprocess.run(
        [sys.executable, "-m", "rankwatch", *cmd.split()[2:]], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "suspect: rank 1" in again.stdout, again.stderr
