"""The golden corpus: what real frameworks print, run on the CPU in this test session.

Hugging Face Transformers' Trainer (a tiny GPT-2 built from a config, no download),
PyTorch Lightning (tqdm and rich bars, ``CSVLogger``) and a two-rank DDP loop on gloo
printing nanoGPT's lines, each with the truth its generator read from the trainer (which
global steps were logged, the total, the step whose record first held a NaN). rankwatch
must report the trainer's own steps and find what was injected, at its true step.
Generated logs are cached (``tests/golden/corpus.py``), so a repeated run takes seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))

import corpus

from rankwatch.cli import main
from rankwatch.records import StepRecord
from rankwatch.sources.lines import read_lines
from rankwatch.sources.logparser import LogParser

pytestmark = pytest.mark.timeout(900)

CASES = list(corpus.CASES)


@pytest.fixture(scope="session")
def cases() -> dict[str, corpus.Case]:
    lacking = sorted({p for c in CASES for p in corpus.missing(c)})
    if lacking:
        pytest.skip(f"{', '.join(lacking)} not installed: the golden corpus runs the real frameworks")
    return corpus.generate_all(CASES)


def analyze_json(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict]:
    code = main(["analyze", "--json", str(path)])
    return code, json.loads(capsys.readouterr().out)


def step_records(path: Path) -> list[StepRecord]:
    parser = LogParser(default_rank=0)
    out: list[StepRecord] = []
    for fl in read_lines(str(path), max_line_bytes=1 << 20):
        out.extend(r for r in parser.feed(fl.text, fl.lineno) if isinstance(r, StepRecord))
    out.extend(r for r in parser.finish() if isinstance(r, StepRecord))
    return out


def bar_steps(truth: dict) -> list[int]:
    """Lightning's bar counts steps done (``global_step`` after the step); its CSV the step
    being logged, one less."""
    return [s + 1 for s in truth["logged_steps"]]


def expected_steps(case: corpus.Case) -> list[int | None]:
    t = case.truth
    if t["format"] == "lightning":
        return bar_steps(t)
    if t["format"] == "hf" and not t["tqdm"]:
        # No bar, and logging_steps is printed nowhere: not knowable, the record says so
        # (the state then counts records, right only when logging_steps is 1).
        return [None] * len(t["logged_steps"])
    return t["logged_steps"]


@pytest.mark.tool
@pytest.mark.torch
@pytest.mark.parametrize("name", CASES)
def test_steps_are_the_trainers_own(name: str, cases: dict[str, corpus.Case]) -> None:
    case = cases[name]
    recs = step_records(case.log)
    got = [r.step for r in recs]
    total = case.truth["total_steps"]
    known = [s for s in got if s is not None]
    # Invariants: never past the total, never backwards.
    assert all(0 <= s <= total for s in known), (name, known[-5:], total)
    assert all(b > a for a, b in itertools.pairwise(known)), name
    if name == "lightning_rich":
        # On a file the rich bar prints its last frame only: one record, the last step.
        assert got == [total]
        return
    assert got == expected_steps(case)


@pytest.mark.tool
@pytest.mark.torch
@pytest.mark.parametrize("name", CASES)
def test_analyze_reports_the_trainers_steps_and_the_truth(
    name: str, cases: dict[str, corpus.Case], capsys: pytest.CaptureFixture[str]
) -> None:
    case = cases[name]
    t = case.truth
    code, doc = analyze_json(capsys, case.log)
    (rank,) = doc["ranks"]
    assert rank["format"] == t["format"]
    logged = len(t["logged_steps"])
    assert rank["steps"] == (1 if name == "lightning_rich" else logged)
    assert rank["last_step"] <= t["total_steps"]
    if t.get("tqdm", True):
        assert rank["last_step"] == t["total_steps"]
    serious = [f for f in doc["findings"] if f["severity"] != "info"]
    if t["nan_step"] is not None:
        nan = [f for f in serious if f["kind"] == "nan_loss"]
        assert nan, doc["findings"]
        want = t["nan_step"] + 1 if t["format"] == "lightning" else t["nan_step"]
        if expected_steps(case)[0] is None:
            # Not knowable from this log: the finding says the step is a count of records.
            assert "counted" in nan[0]["message"]
            assert nan[0]["step"] * t["logging_steps"] == want
        else:
            assert nan[0]["step"] == want, nan
        assert code == 1
    elif t["blowup"]:
        early = [f for f in serious if f["kind"] in ("loss_divergence", "grad_explosion")]
        assert early and min(f["step"] for f in early) <= 10, doc["findings"]
    else:
        # Timing on a shared CI machine is the machine's, not the run's: not judged here.
        assert [f for f in serious if f["kind"] != "throughput_drop"] == []


@pytest.mark.tool
@pytest.mark.torch
@pytest.mark.parametrize("name", [c for c in CASES if c.startswith("lightning_tqdm")])
def test_lightning_csvlogger_file(name: str, cases: dict[str, corpus.Case], capsys) -> None:
    case = cases[name]
    (csv,) = [p for p in case.extra if p.name.endswith("metrics.csv")]
    code, doc = analyze_json(capsys, csv)
    (rank,) = doc["ranks"]
    assert rank["format"] == "lightning_csv"
    assert rank["steps"] == len(case.truth["logged_steps"])
    assert rank["last_step"] == case.truth["logged_steps"][-1]
    nan = [f for f in doc["findings"] if f["kind"] == "nan_loss"]
    if case.truth["nan_step"] is None:
        assert nan == [] and code == 0
    else:
        assert nan[0]["step"] == case.truth["nan_step"]


@pytest.mark.tool
@pytest.mark.torch
def test_live_run_finds_the_nan_at_its_true_step(tmp_path: Path) -> None:
    """``rankwatch run`` around the real Trainer: the NaN at global step 40, live."""
    if corpus.missing("hf_ls1_nan40"):
        pytest.skip("transformers not installed: the live golden run needs it")
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: golden}}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}}}\n"
        'server: {listen: "127.0.0.1:0"}\n'
    )
    jsonl = tmp_path / "findings.jsonl"
    env = {
        **os.environ,
        "RANK": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    gen = Path(corpus.HERE / "gen_hf.py")
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--findings-jsonl", str(jsonl)]
    cmd += ["--", sys.executable, str(gen), "hf_ls1_nan40", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    truth = json.loads((tmp_path / "hf_ls1_nan40.json").read_text())
    found = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
    nan = [f for f in found if f["kind"] == "nan_loss" and not f["resolved"]]
    assert nan and nan[0]["step"] == truth["nan_step"] == 40, found


STATIC = sorted((Path(__file__).resolve().parent / "golden" / "static").glob("*.log"))


@pytest.mark.unit
@pytest.mark.parametrize("log", STATIC, ids=[p.stem for p in STATIC])
def test_kept_real_logs(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Real runs CI cannot make in seconds (HF Trainer + DeepSpeed), kept with their truth."""
    truth = json.loads(log.with_suffix(".json").read_text())
    assert [r.step for r in step_records(log)] == truth["logged_steps"]
    code, doc = analyze_json(capsys, log)
    (rank,) = doc["ranks"]
    assert (rank["format"], rank["steps"], rank["last_step"]) == (
        truth["format"],
        len(truth["logged_steps"]),
        truth["total_steps"],
    )
    assert code == 0 and [f for f in doc["findings"] if f["severity"] != "info"] == []
