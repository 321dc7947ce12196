"""`rankwatch demo` is the README's first command: it must work on a fresh machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.tool


def test_demo_finds_nan_stall_and_names_the_hung_rank(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "demo", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "CRITICAL nan_loss step 120" in text
    assert text.count("CRITICAL stall") == 4
    assert "suspect: rank 1" in text
    assert "CRITICAL crash" not in text  # the demo's own shutdown is not a crash
    assert list((tmp_path / "dumps" / "demo").iterdir())
