"""What torchrun says of its workers' ends, read from the combined log (runtime/workers.py).

``data/torchrun/sigkill_box.log``: torchrun's own lines (the workers' ``[defaultN]:`` lines
left out) of ``rankwatch run -- torchrun --nproc-per-node 2 --tee 3 tests/workloads/ddp_train.py``
on torch 2.13 (CPU, gloo), rank 1 SIGKILLed at step 8: tests/test_launch_matrix.py's
``test_torchrun_a_failing_rank_is_named_by_its_peer[tee-sigkill]``, recorded on 2026-11-28.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from rankwatch.runtime.workers import LauncherLog

pytestmark = pytest.mark.unit

BOX = Path(__file__).parent / "data" / "torchrun" / "sigkill_box.log"


def test_the_failure_box_names_each_workers_rank_and_fate() -> None:
    """A worker that died before the agent's first look is known by the box alone: its rank,
    local rank and exit status by pid (the agent gives it its pipeline at the end)."""
    launcher = LauncherLog(BOX, 0)
    launcher.read()
    assert launcher.ranks == {2196: (0, 0), 2197: (1, 1)}
    assert launcher.fate(2197) == (-9, None)  # its failure line: SIGKILL
    assert launcher.fate(2196) == (None, int(signal.SIGTERM))  # the launcher stopped it
    assert launcher.boxed == {2196: -15, 2197: -9}
