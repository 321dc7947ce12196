"""``rankwatch run -- python train.py`` where the script starts its other ranks itself: a real
Lightning ``Trainer(strategy="ddp", accelerator="cpu", devices=2)`` (tests/workloads/
lightning_ddp.py). Lightning's subprocess launcher runs the script again for local rank 1
with its own environment (LOCAL_RANK, NODE_RANK, WORLD_SIZE, no RANK); everything both ranks
print goes to the one log of the command, rank 0's and rank 1's tracebacks prefixed
``[rank0]:`` and ``[rank1]:`` by PyTorch. Rank 1 raises CUDA's OOM at global step 10; rank 0's
next all-reduce fails with gloo's "Connection closed by peer". The user must get one alert,
the OOM on rank 1 as the suspect, rank 0's error as its consequence, and the exit of the
command explained by it, not "No error was recognised in the log". Harness: tests/torchjobs.py.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from torchjobs import agent_config, finish, rankwatch, run_script, webhook

pytestmark = [
    pytest.mark.tool,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("lightning") is None, reason="Lightning not installed (CI installs it)"
    ),
]

WORKLOAD = Path(__file__).parent / "workloads" / "lightning_ddp.py"


@pytest.mark.timeout(300)
def test_a_lightning_oom_is_one_alert_on_the_rank_lightning_started(tmp_path: Path) -> None:
    env = {"FAULT": "oom", "FAULT_RANK": "1", "FAULT_STEP": "10", "STEPS": "15"}
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        c = finish(run_script(tmp_path, cfg, WORKLOAD, env), tmp_path, posted)
    assert c.rc == 1, c.debug()
    # Rank 1 is a rank of its own: its OOM, told once, and the step it died at.
    [oom] = c.on(1, "oom")
    assert "CUDA out of memory" in oom["message"], c.debug()
    assert oom["diagnosis"]["suspect"] == 1, c.debug()
    # Rank 0's gloo error is rank 1's consequence, named so.
    [peer] = c.on(0, "peer_error")
    assert peer["message"].startswith(("rank 1 failed first", "the connection gloo lost")), c.debug()
    assert peer["diagnosis"]["suspect"] == 1, c.debug()
    # Rank 1's death told once (its OOM); its end tied to it. Its status is unknown to the
    # agent (Lightning is its parent), its cause is not; the step is the run's (rank 1 prints
    # no progress bar of its own): 10 batches done.
    assert not c.on(1, "crash"), c.debug()
    [end] = c.on(1, "process_exit")
    # The run's step reaches rank 1 through a relay that may come after its end is judged.
    assert end["evidence"]["cause_kind"] == "oom" and end["step"] in (None, 10), c.debug()
    # The script's own exit (rank 0, status 1) is the consequence of rank 1's OOM, said so;
    # nothing says no error was recognised.
    [crash] = c.of("crash")
    assert crash["rank"] == 0 and crash["evidence"]["exit_code"] == 1 and crash["step"] == 10, c.debug()
    assert crash["message"].startswith("rank 1 failed first: torch.OutOfMemoryError"), c.debug()
    assert crash["diagnosis"]["suspect"] == 1, c.debug()
    assert not any("No error was recognised" in f["message"] for f in c.findings), c.debug()
    # One alert for the one problem: the OOM, suspect rank 1.
    firing = c.firing()
    assert [(a["kind"], a["rank"], a["suspect"]) for a in firing] == [("oom", 1, 1)], c.debug()
    assert firing[0]["summary"] == "oom on rank 1, suspect rank 1", c.debug()


@pytest.mark.timeout(300)
def test_a_lightning_hang_dumps_each_rank_alone_and_names_the_hung_one(tmp_path: Path) -> None:
    """Rank 1 (Lightning's child) sleeps in its training step; rank 0, the script and rank 1's
    parent, waits in DDP's all-reduce. Each rank's dump holds its own process only (rank 0's
    used to hold rank 1's stacks too, so `dumps diff` saw one stack on every rank and named no
    suspect), and the diff names rank 1."""
    env = {"FAULT": "hang", "FAULT_RANK": "1", "FAULT_STEP": "10", "STEPS": "100000"}

    def stalled(rows: list[dict[str, object]]) -> bool:
        return any(f["kind"] == "stall" and f.get("diagnosis") for f in rows)

    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        # Lightning prints no step line off a terminal: the ranks are silent ranks, judged after
        # the silent-rank timeout (the black-box tester's own settings).
        text = cfg.read_text().replace("startup_grace: 120s", "startup_grace: 30s, silent_rank_timeout: 15s")
        cfg.write_text(text)
        c = finish(run_script(tmp_path, cfg, WORKLOAD, env), tmp_path, posted, hang=stalled)
    [incident] = [p for p in (tmp_path / "dumps").glob("*/*_stall") if p.is_dir()]
    texts = {p.name: p.read_text() for p in incident.glob("rank-*.txt")}
    assert set(texts) == {"rank-0.txt", "rank-1.txt"}, c.debug()
    for name, text in texts.items():
        assert len(re.findall(r"(?m)^Process ", text)) == 1, (name, text[:3000])
    out = subprocess.run(
        rankwatch("dumps", "diff", str(incident)), capture_output=True, text=True, timeout=60
    ).stdout
    assert "suspect: rank 1 " in out, out
