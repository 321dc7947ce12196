"""Checkpoint watcher and verifier, on real safetensors and torch.save files.

safetensors files are written through ``safetensors.numpy`` so their checks run without
torch; only what ``torch.save`` writes (optimizer.pt, .ckpt, .pt) needs torch.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import re
import shutil
import struct
import time
import warnings
import weakref
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePath
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import until
from rankwatch.checkpoints import CheckpointConfig
from rankwatch.checkpoints import layouts as L
from rankwatch.checkpoints.catalog import Catalog, OpenProblems
from rankwatch.checkpoints.cli import add_subcommands
from rankwatch.checkpoints.verify import check_safetensors, check_torch, dcp_items, verify_candidate
from rankwatch.checkpoints.watcher import CheckpointWatcher, open_for_writing
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.detectors.checkpoints import (
    CheckpointDiskDetector,
    CheckpointProblemDetector,
    CheckpointStaleDetector,
)
from rankwatch.engine import RankEngine
from rankwatch.events import CheckpointCleared, CheckpointEvent, CheckpointScan, Event, SavedCheckpoint
from rankwatch.identity import Identity
from rankwatch.records import EvalRecord, Finding, Severity, StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.services import Services
from rankwatch.sources.polled import Poller
from rankwatch.sources.polled.checkpoint_scan import CheckpointScanSource

pytestmark = pytest.mark.timeout(30)
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

T0 = 1_700_000_000.0  # wall time of the fake clocks


def _torch() -> Any:
    return pytest.importorskip("torch")


def _save_st(path: Path, tensors: dict[str, Any]) -> None:
    st = pytest.importorskip("safetensors.numpy")
    st.save_file(tensors, str(path))


def _rand(*shape: int) -> Any:
    np = pytest.importorskip("numpy")
    return np.random.default_rng(sum(shape)).standard_normal(shape, dtype=np.float32)


class Clock:
    """Monotonic and wall clocks moved by hand; the wall starts at T0."""

    def __init__(self) -> None:
        self.t = 1000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> float:
        return T0 + self.t - 1000.0

    def advance(self, s: float) -> None:
        self.t += s


def _touch(path: Path, when: float) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if p.is_file():
            os.utime(p, (when, when))


def _log_history(step: int, nan_at: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in range(8, step + 1, 8):
        bad = nan_at is not None and s >= nan_at
        loss = math.nan if bad else 3.0 - s / 100
        out.append({"epoch": s / 100, "grad_norm": 1.2, "learning_rate": 5e-5, "loss": loss, "step": s})
        if s % 32 == 0:
            out.append({"epoch": s / 100, "eval_loss": 2.5, "eval_runtime": 1.5, "step": s})
    return out


def write_hf(
    root: Path,
    step: int,
    *,
    optimizer: bool = True,
    nan_at: int | None = None,
    width: int = 32,
    state: bool = True,
    when: float | None = None,
    torch_files: bool = True,
    global_step: int | None = None,
) -> Path:
    """A Hugging Face Trainer checkpoint-N folder, files in the order the Trainer writes them.

    ``torch_files=False``: no optimizer and no training_args.bin, so no torch needed (a
    weights-only save as far as the verifier can tell).
    """
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": width}))
    _save_st(d / "model.safetensors", {"wte.weight": _rand(64, width), "ln_f.bias": _rand(width) * 0})
    if torch_files:
        torch = _torch()
        if optimizer:
            weights = [torch.randn(64, width), torch.zeros(width)]
            opt = torch.optim.AdamW([torch.nn.Parameter(t) for t in weights])
            for p in opt.param_groups[0]["params"]:
                p.grad = torch.ones_like(p)
            opt.step()
            torch.save(opt.state_dict(), d / "optimizer.pt")
            torch.save({"last_epoch": step, "_step_count": step + 1}, d / "scheduler.pt")
            torch.save({"python": 1, "cpu": torch.get_rng_state()}, d / "rng_state.pth")
        torch.save({"output_dir": str(root)}, d / "training_args.bin")
    if state:
        doc = {
            "global_step": step if global_step is None else global_step,
            "max_steps": 1000,
            "log_history": _log_history(step, nan_at),
        }
        (d / L.TRAINER_STATE).write_text(json.dumps(doc, indent=2))
    if when is not None:
        _touch(d, when)
    return d


def catalog(root: Path, clock: Clock, **cfg: Any) -> Catalog:
    cfg.setdefault("settle", 5.0)
    cfg.setdefault("incomplete_after", 60.0)
    cfg.setdefault("corrupt_after", 60.0)
    return Catalog(root, CheckpointConfig(**cfg), clock=clock.mono, wall=clock.wall)


_RULES: weakref.WeakKeyDictionary[Any, CheckpointProblemDetector] = weakref.WeakKeyDictionary()


def judge(source: Any, events: list[CheckpointEvent]) -> list[Finding]:
    """What the checkpoint rules make of ``source``'s events (one rule instance per source,
    as one per rank's engine live)."""
    rules = _RULES.setdefault(source, CheckpointProblemDetector())
    return [rules.judge(e) for e in events]


def update(cat: Catalog) -> list[Finding]:
    return judge(cat, cat.update(L.scan(cat.root, glob=cat.cfg.glob, step_regex=cat.cfg.step_regex)))


def kinds(findings: list[Finding]) -> list[tuple[str, str, bool]]:
    return [(f.kind, f.severity.label, f.resolved) for f in findings]


def no_weights_only(findings: list[Finding]) -> list[Finding]:
    """Checkpoints written without torch have no optimizer: that finding is expected there."""
    return [f for f in findings if f.kind != "checkpoint_weights_only"]


# --- file checks ------------------------------------------------------------------------


@pytest.mark.unit
def test_safetensors_checks_catch_truncation_zeroing_and_flipped_header(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    good = tmp_path / "model.safetensors"
    _save_st(good, {"a": _rand(16, 8), "b": np.arange(10, dtype=np.int64)})
    data = good.read_bytes()
    assert check_safetensors(good, "m", len(data)) == []

    def probe(blob: bytes) -> str:
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(blob)
        problems = check_safetensors(bad, "bad.safetensors", len(blob))
        assert len(problems) == 1, blob[:16]
        return problems[0].message

    assert "truncated" in probe(data[:-7])
    assert "header length" in probe(data[:40])
    assert "not valid JSON" in probe(b"\0" * len(data)) or "header" in probe(b"\0" * len(data))
    flipped = bytearray(data)
    flipped[2] ^= 0x40  # header length now points past the end
    assert "runs past the end" in probe(bytes(flipped))
    # One digit changed inside data_offsets: still valid JSON, but the offsets no longer fit.
    i = data.index(b'"data_offsets":[0,') + len(b'"data_offsets":[0,')
    changed = bytearray(data)
    changed[i] = ord("1") if changed[i] != ord("1") else ord("2")
    assert "needs" in probe(bytes(changed))
    assert "bytes after the last tensor" in probe(data + b"\0" * 16)


@pytest.mark.tool
def test_torch_zip_checks_and_pickle_scan(tmp_path: Path) -> None:
    torch = _torch()
    f = tmp_path / "last.ckpt"
    torch.save(
        {"epoch": 3, "global_step": 1234, "state_dict": {"w": torch.randn(8, 8)}, "optimizer_states": [{}]}, f
    )
    data = f.read_bytes()
    ok = check_torch(f, "last.ckpt", len(data))
    assert ok.problems == [] and ok.torch
    assert {"state_dict", "optimizer_states"} <= ok.keys
    assert ok.ints["global_step"] == 1234

    def probe(blob: bytes, deep: bool = False) -> list[str]:
        bad = tmp_path / "bad.pt"
        bad.write_bytes(blob)
        return [p.check for p in check_torch(bad, "bad.pt", len(blob), deep=deep).problems]

    assert probe(data[: len(data) // 2]) == ["truncated"]
    assert probe(data[:-3]) == ["truncated"]
    assert probe(b"\0" * len(data)) == ["zeroed"]
    assert probe(b"garbage!" * 20) == ["format"]
    # A bit flipped inside tensor bytes: the directory is intact, only the CRC tells.
    blob = bytearray(data)
    k = blob.index(b"data/0") + 200
    blob[k] ^= 0xFF
    assert probe(bytes(blob)) == []
    assert probe(bytes(blob), deep=True) == ["crc"]


@pytest.mark.tool  # torch
def test_legacy_torch_pickle_truncation(tmp_path: Path) -> None:
    torch = _torch()
    f = tmp_path / "old.pt"
    torch.save({"model": {"w": torch.randn(5, 3)}, "iteration": 77}, f, _use_new_zipfile_serialization=False)
    data = f.read_bytes()
    good = check_torch(f, "old.pt", len(data))
    assert good.problems == [] and good.ints["iteration"] == 77
    f.write_bytes(data[:-4])
    assert [p.check for p in check_torch(f, "old.pt", len(data) - 4).problems] == ["truncated"]


@pytest.mark.tool  # torch
def test_zero_byte_file_is_corrupt(tmp_path: Path) -> None:
    clock = Clock()
    d = write_hf(tmp_path, 64, when=clock.wall() - 100)
    (d / "optimizer.pt").write_bytes(b"")
    _touch(d, clock.wall() - 100)
    cat = catalog(tmp_path, clock)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    assert "optimizer.pt: zero bytes" in found[0].message
    assert cat.entries["checkpoint-64"].status == "corrupt"


@pytest.mark.unit
def test_plain_safetensors_corrupt_then_superseded_then_deleted(tmp_path: Path) -> None:
    """numpy only: a truncated save fires, a newer good one resolves it, a new one fires again."""
    clock = Clock()
    cat = catalog(tmp_path, clock)

    def save(step: int, cut: int = 0) -> Path:
        f = tmp_path / f"model_step{step}.safetensors"
        _save_st(f, {"w": _rand(32, 16)})
        if cut:
            f.write_bytes(f.read_bytes()[:-cut])
        update(cat)
        clock.advance(70 if cut else 10)  # no completion marker: a bad file gets incomplete_after
        return f

    save(100)
    assert update(cat) == [] and cat.last_good().name == "model_step100.safetensors"
    save(200, cut=64)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    assert "model_step200.safetensors: truncated" in found[0].message
    assert update(cat) == []  # stays firing, no repeat from here
    save(300)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", True)]
    assert "model_step200.safetensors" in found[0].message
    assert "last good: model_step300.safetensors" in found[0].message
    bad = save(400, cut=64)
    assert kinds(update(cat)) == [("checkpoint_corrupt", "critical", False)]  # recurred
    bad.unlink()  # removed by hand: nothing corrupt is left to resume from
    assert kinds(update(cat)) == [("checkpoint_corrupt", "critical", True)]


@pytest.mark.unit
def test_open_problems_clear_a_group_only_when_its_last_cause_clears() -> None:
    open_ = OpenProblems()
    assert open_.open("corrupt", ("saved", "checkpoint-64"))
    assert open_.open("corrupt", ("pointer", "latest", "global_step9"))
    assert not open_.open("corrupt", ("saved", "checkpoint-64"))
    holding = {("pointer", "latest", "global_step9")}
    assert open_.settle(lambda c: c in holding) == []
    assert open_.settle(lambda c: False) == [("corrupt", [("pointer", "latest", "global_step9")])]
    assert open_.open("corrupt", ("saved", "checkpoint-64"))


@pytest.mark.unit
def test_a_cleared_group_resolves_at_the_worst_severity_it_fired_with(tmp_path: Path) -> None:
    """The rule words the watcher's events; its resolve closes the alert the group opened."""
    from rankwatch.events import CheckpointWeightsOnly

    eng = _ckpt_engine(str(tmp_path), rank=2)
    assert any(isinstance(d, CheckpointProblemDetector) for d in eng.detectors)
    ckpt = _saved(tmp_path, 10, T0)
    first = eng.feed(CheckpointWeightsOnly(wall=T0, root=str(tmp_path), checkpoint=ckpt, regressed=False))
    assert kinds(first) == [("checkpoint_weights_only", "info", False)] and first[0].rank == 2
    again = eng.feed(CheckpointWeightsOnly(wall=T0, root=str(tmp_path), checkpoint=ckpt, regressed=True))
    assert kinds(again) == [("checkpoint_weights_only", "warning", False)]
    gone = eng.feed(
        CheckpointCleared(
            wall=T0 + 60, root=str(tmp_path), group="weights_only", causes=("x",), last_good=ckpt
        )
    )
    assert kinds(gone) == [("checkpoint_weights_only", "warning", True)]
    assert gone[0].message.endswith("(x); last good: checkpoint-10 (step 10, 60s ago)")
    assert not any(isinstance(d, CheckpointProblemDetector) for d in RankEngine(Config(), 3).detectors)


# --- layouts ----------------------------------------------------------------------------


@pytest.mark.tool  # torch
def test_layouts_are_recognised(tmp_path: Path) -> None:
    torch = _torch()
    import torch.distributed.checkpoint as dcp

    hf = tmp_path / "hf"
    write_hf(hf, 10)
    (hf / "tmp-checkpoint-20").mkdir()
    (hf / "model.safetensors").write_bytes((hf / "checkpoint-10" / "model.safetensors").read_bytes())
    (hf / "config.json").write_text("{}")

    meg = tmp_path / "megatron"
    for it in (100, 200):
        d = meg / f"iter_{it:07d}" / "mp_rank_00"
        d.mkdir(parents=True)
        torch.save(
            {"iteration": it, "model": {"w": torch.ones(2)}, "optimizer": {}}, d / "model_optim_rng.pt"
        )
    (meg / L.MEGATRON_TRACKER).write_text("100")

    ds = tmp_path / "ds"
    for step in (10, 20):
        d = ds / f"global_step{step}"
        d.mkdir(parents=True)
        torch.save({"module": {"w": torch.ones(2)}, "global_steps": step}, d / "mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {}}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (ds / "latest").write_text("global_step20")

    lt = tmp_path / "lightning" / "version_0" / "checkpoints"
    lt.mkdir(parents=True)
    ck = {"global_step": 50, "state_dict": {"w": torch.ones(2)}, "optimizer_states": [{}]}
    torch.save(ck, lt / "epoch=0-step=50.ckpt")
    torch.save(ck, lt / "last.ckpt")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.randn(4)}}, checkpoint_id=str(tmp_path / "titan" / "step-300"))
    (tmp_path / "titan" / "step-400").mkdir()
    (tmp_path / "titan" / "step-400" / "__0_0.distcp").write_bytes(b"x" * 100)  # .metadata not yet

    plain = tmp_path / "plain"
    plain.mkdir()
    torch.save({"model": {}, "optimizer": {}, "iter_num": 4000}, plain / "ckpt.pt")
    torch.save({"w": torch.ones(1)}, plain / "model_step1500.pt")
    _save_st(plain / "ema-2000.safetensors", {"w": _rand(3)})
    (plain / "notes.bin").write_bytes(b"not a checkpoint")

    def by_name(root: Path, **kw: Any) -> dict[str, L.Candidate]:
        return {c.name: c for c in L.scan(root, **kw).candidates}

    got = by_name(hf)
    assert set(got) == {".", "checkpoint-10", "tmp-checkpoint-20"}
    c10 = got["checkpoint-10"]
    assert (c10.layout, c10.step, c10.marker) == ("hf", 10, True)
    assert got["tmp-checkpoint-20"].staging and got["tmp-checkpoint-20"].marker is False
    assert got["."].layout == "hf_model" and set(got["."].files) == {"model.safetensors", "config.json"}

    got = by_name(meg)
    assert {n: (c.layout, c.step, c.marker) for n, c in got.items()} == {
        "iter_0000100": ("megatron", 100, True),
        "iter_0000200": ("megatron", 200, False),  # the tracker has not moved yet: still being written
    }
    assert verify_candidate(got["iter_0000100"]).resumable is True
    no_optim = meg / "iter_0000050" / "mp_rank_00"
    no_optim.mkdir(parents=True)
    torch.save({"iteration": 50, "model": {"w": torch.ones(2)}}, no_optim / "model_optim_rng.pt")
    v = verify_candidate(by_name(meg)["iter_0000050"])
    assert v.ok and v.weights_only and v.resumable is False
    got = by_name(ds)
    assert {n: (c.layout, c.step, c.marker) for n, c in got.items()} == {
        "global_step10": ("deepspeed", 10, True),
        "global_step20": ("deepspeed", 20, True),
    }
    got = by_name(tmp_path / "lightning")
    assert {n: (c.layout, c.step) for n, c in got.items()} == {
        "version_0/checkpoints/epoch=0-step=50.ckpt": ("lightning", 50),
        "version_0/checkpoints/last.ckpt": ("lightning", None),
    }
    last = got["version_0/checkpoints/last.ckpt"]
    v = verify_candidate(last)
    assert v.ok and v.content_step == 50 and v.resumable is True

    got = by_name(tmp_path / "titan")
    assert {n: (c.layout, c.step, c.marker) for n, c in got.items()} == {
        "step-300": ("dcp", 300, True),
        "step-400": ("dcp", 400, False),
    }
    assert verify_candidate(got["step-300"]).ok

    got = by_name(plain)
    assert {n: (c.layout, c.step) for n, c in got.items()} == {
        "ckpt.pt": ("plain", None),
        "model_step1500.pt": ("plain", 1500),
        "ema-2000.safetensors": ("plain", 2000),
    }
    v = verify_candidate(got["ckpt.pt"])
    assert v.ok and v.content_step == 4000 and v.resumable is True

    # The config's glob and step regex add what the defaults do not know.
    (plain / "snap").mkdir()
    torch.save({"w": torch.ones(1)}, plain / "snap" / "weights.v7")
    got = by_name(plain, glob="snap/*.v*", step_regex=r"\.v(\d+)$")
    assert (got["snap/weights.v7"].layout, got["snap/weights.v7"].step) == ("custom", 7)
    assert verify_candidate(got["snap/weights.v7"]).ok


@pytest.mark.tool  # torch
def test_megatron_and_deepspeed_pointers_must_lead_somewhere(tmp_path: Path) -> None:
    torch = _torch()
    clock = Clock()
    d = tmp_path / "iter_0000100" / "mp_rank_00"
    d.mkdir(parents=True)
    torch.save({"iteration": 100, "model": {}, "optimizer": {}}, d / "model_optim_rng.pt")
    (tmp_path / L.MEGATRON_TRACKER).write_text("300")
    (tmp_path / "latest").write_text("global_step300")
    _touch(tmp_path, clock.wall() - 100)
    cat = catalog(tmp_path, clock)
    found = update(cat)
    assert cat.entries["iter_0000100"].status == "good"
    assert sorted(f.evidence["file"] for f in found if f.kind == "checkpoint_corrupt") == [
        "latest",
        L.MEGATRON_TRACKER,
    ]
    assert all("does not exist" in f.message for f in found)
    assert update(cat) == []  # said once

    # One alert per (kind, rank): it resolves only when the last broken pointer is fixed.
    (tmp_path / L.MEGATRON_TRACKER).write_text("100")
    assert update(cat) == []
    (tmp_path / "latest").unlink()
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", True)]
    assert "latest -> 'global_step300'" in found[0].message
    assert update(cat) == []
    # Broken again: a new finding once it has stayed broken for the settle time.
    (tmp_path / L.MEGATRON_TRACKER).write_text("200")
    assert update(cat) == []
    clock.advance(6)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    assert found[0].evidence["value"] == "200"


# --- completion and settle logic ------------------------------------------------------------


@pytest.mark.tool  # torch
def test_save_in_pieces_is_judged_only_after_marker_and_settle(tmp_path: Path) -> None:
    clock = Clock()
    cat = catalog(tmp_path, clock)
    assert update(cat) == []
    d = write_hf(tmp_path, 32, state=False)
    assert update(cat) == [] and cat.entries["checkpoint-32"].status == "writing"
    assert cat.writing()
    clock.advance(30)  # files quiet, but trainer_state.json (written last) is missing
    assert update(cat) == [] and cat.entries["checkpoint-32"].status == "writing"
    (d / L.TRAINER_STATE).write_text(json.dumps({"global_step": 32, "log_history": _log_history(32)}))
    assert update(cat) == []
    clock.advance(2)
    assert update(cat) == [] and cat.entries["checkpoint-32"].status == "writing"
    clock.advance(5)
    assert update(cat) == []
    e = cat.entries["checkpoint-32"]
    assert e.status == "good" and e.resumable is True
    assert e.save_duration == pytest.approx(30.0)  # first file seen to the last change
    assert not cat.writing()
    assert cat.last_good() is e


@pytest.mark.tool  # torch
def test_empty_folder_at_start_is_a_save_beginning_not_an_ancient_failure(tmp_path: Path) -> None:
    """The watcher's first scan can land between a save's mkdir and its first file (CI saw it)."""
    clock = Clock()
    cat = catalog(tmp_path, clock)
    (tmp_path / "checkpoint-8").mkdir()
    assert update(cat) == [] and cat.entries["checkpoint-8"].status == "writing"
    write_hf(tmp_path / "x", 8)
    for f in (tmp_path / "x" / "checkpoint-8").iterdir():
        f.rename(tmp_path / "checkpoint-8" / f.name)
    assert update(cat) == []
    clock.advance(6)
    assert update(cat) == [] and cat.last_good().name == "checkpoint-8"

    cli = Catalog(tmp_path, CheckpointConfig(settle=5.0), oneshot=True)
    (tmp_path / "checkpoint-16").mkdir()
    update(cli)
    assert cli.entries["checkpoint-16"].status == "incomplete"  # the CLI judges what is there now


@pytest.mark.tool  # torch
def test_markerless_file_written_slowly_is_not_called_corrupt(tmp_path: Path) -> None:
    torch = _torch()
    clock = Clock()
    src = tmp_path / "src.pt"
    torch.save({"model": {"w": torch.randn(64, 64)}, "optimizer": {}}, src)
    data = src.read_bytes()
    src.unlink()
    cat = catalog(tmp_path, clock)
    update(cat)
    f = tmp_path / "ckpt_100.pt"
    f.write_bytes(data[:3000])
    assert update(cat) == []
    clock.advance(10)  # quiet for longer than settle, but the zip has no directory yet
    assert update(cat) == []
    assert cat.entries["ckpt_100.pt"].status == "writing"
    with open(f, "ab") as fh:
        fh.write(data[3000:])
    update(cat)
    clock.advance(10)
    assert update(cat) == []
    assert cat.entries["ckpt_100.pt"].status == "good"

    g = tmp_path / "ckpt_200.pt"
    g.write_bytes(data[:3000])
    update(cat)
    clock.advance(10)
    assert update(cat) == []
    clock.advance(60)  # incomplete_after: the writer is gone, the file stays cut
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    assert "ckpt_200.pt" in found[0].message and "zip directory unreadable" in found[0].message
    assert "last good: ckpt_100.pt (step 100" in found[0].message


@pytest.mark.tool  # torch
def test_interrupted_save_becomes_incomplete(tmp_path: Path) -> None:
    clock = Clock()
    cat = catalog(tmp_path, clock)
    write_hf(tmp_path, 16, when=clock.wall() - 300)
    update(cat)
    write_hf(tmp_path, 32, state=False)
    update(cat)
    clock.advance(59)
    assert update(cat) == []
    clock.advance(2)
    found = update(cat)
    assert kinds(found) == [("checkpoint_incomplete", "warning", False)]
    assert "no trainer_state.json" in found[0].message and "checkpoint-16" in found[0].message
    assert cat.entries["checkpoint-32"].status == "incomplete"
    assert cat.last_good().name == "checkpoint-16"
    # The next save completes: the interrupted one is history, its finding resolves.
    write_hf(tmp_path, 48)
    update(cat)
    clock.advance(10)
    found = update(cat)
    assert kinds(found) == [("checkpoint_incomplete", "warning", True)]
    assert "checkpoint-32" in found[0].message and "last good: checkpoint-48" in found[0].message
    assert update(cat) == []


@pytest.mark.tool  # torch
def test_deleted_mid_save_and_rotation_are_noted_not_alarmed(tmp_path: Path) -> None:
    clock = Clock()
    cat = catalog(tmp_path, clock)
    old = write_hf(tmp_path, 16, when=clock.wall() - 300)
    update(cat)
    partial = write_hf(tmp_path, 32, state=False)
    update(cat)
    shutil.rmtree(partial)
    clock.advance(100)
    assert update(cat) == []
    write_hf(tmp_path, 48)
    update(cat)
    clock.advance(10)
    assert update(cat) == []
    shutil.rmtree(old)  # save_total_limit rotation
    assert update(cat) == []
    counts = cat.counts()
    assert counts["deleted"] == 2 and counts["good"] == 1
    assert [e.reason for e in cat.deleted] == ["deleted before it completed", "deleted (was good)"]
    assert cat.last_good().name == "checkpoint-48"


@pytest.mark.tool  # torch
def test_files_disappearing_from_a_good_checkpoint_wait_for_the_rmtree(tmp_path: Path) -> None:
    clock = Clock()
    cat = catalog(tmp_path, clock)
    d = write_hf(tmp_path, 16, when=clock.wall() - 300)
    update(cat)
    (d / "model.safetensors").unlink()  # rmtree caught half way
    assert update(cat) == []
    clock.advance(10)
    assert update(cat) == []  # not called corrupt while it may still be going away
    shutil.rmtree(d)
    assert update(cat) == []
    assert cat.counts()["deleted"] == 1


# --- verification by layout ---------------------------------------------------------------


@pytest.mark.unit
def test_corrupt_checkpoint_names_file_check_and_last_good(tmp_path: Path) -> None:
    clock = Clock()
    write_hf(tmp_path, 32, torch_files=False, when=clock.wall() - 600)
    bad = write_hf(tmp_path, 64, torch_files=False)
    blob = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(blob[: len(blob) - 100])
    _touch(bad, clock.wall() - 300)
    cat = catalog(tmp_path, clock)
    found = no_weights_only(update(cat))
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    f = found[0]
    assert f.step == 64 and f.path == str(bad)
    assert "checkpoint-64 is corrupt: model.safetensors: truncated" in f.message
    assert "last good: checkpoint-32 (step 32" in f.message
    assert "resume_from_checkpoint" in f.message
    assert f.evidence["check"] == "safetensors"

    write_hf(tmp_path, 96, torch_files=False)
    update(cat)
    clock.advance(10)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", True)]
    assert cat.last_good().name == "checkpoint-96"


@pytest.mark.tool  # torch
def test_hf_checks_step_shards_and_resumability(tmp_path: Path) -> None:
    torch = _torch()
    d = write_hf(tmp_path, 40)
    state = json.loads((d / L.TRAINER_STATE).read_text())
    state["global_step"] = 20
    (d / L.TRAINER_STATE).write_text(json.dumps(state))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model.safetensors"}})
    )
    (d / "scheduler.pt").unlink()
    v = verify_candidate(L.scan(d).candidates[0])
    assert not v.ok
    assert [p.check for p in v.problems] == ["missing", "step_mismatch"]
    assert "model-00001-of-00002.safetensors" in str(v.problems[0])
    assert v.resumable is True and any("scheduler.pt" in n for n in v.notes)

    # DeepSpeed inside an HF checkpoint: the optimizer lives in global_stepN/.
    d2 = write_hf(tmp_path, 80, optimizer=False)
    ds = d2 / "global_step80"
    ds.mkdir()
    torch.save({"module": {}}, ds / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {}}, ds / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (d2 / "latest").write_text("global_step80")
    v = verify_candidate(L.scan(d2).candidates[0])
    assert v.ok and v.resumable is True and not v.weights_only
    (d2 / "latest").write_text("global_step99")
    v = verify_candidate(L.scan(d2).candidates[0])
    assert [p.check for p in v.problems] == ["pointer"]

    # FSDP sharded state: DCP folders inside the HF checkpoint, optimizer included.
    import torch.distributed.checkpoint as dcp

    d3 = write_hf(tmp_path, 120, optimizer=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.randn(4)}, checkpoint_id=str(d3 / "pytorch_model_fsdp_0"))
        dcp.save({"state": {"w": torch.randn(4)}}, checkpoint_id=str(d3 / "optimizer_0"))
    v = verify_candidate(L.scan(d3).candidates[0])
    assert v.ok and v.resumable is True
    (d3 / "optimizer_0" / ".metadata").unlink()
    v = verify_candidate(L.scan(d3).candidates[0])
    assert [str(p) for p in v.problems] == ["optimizer_0/.metadata: missing: DCP cannot load the shards"]


@pytest.mark.unit
def test_hf_global_step_not_matching_the_folder_fails_verification(tmp_path: Path) -> None:
    clock = Clock()
    write_hf(tmp_path, 40, torch_files=False, when=clock.wall() - 900)
    d = write_hf(tmp_path, 50, global_step=55, torch_files=False, when=clock.wall() - 600)
    v = verify_candidate(L.scan(d).candidates[0])
    assert not v.ok and v.first_problem is not None and v.first_problem.check == "step_mismatch"
    cat = catalog(tmp_path, clock)
    found = [f for f in update(cat) if f.kind == "checkpoint_corrupt"]
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    assert "global_step is 55 but the folder is named for step 50" in found[0].message
    assert found[0].evidence["check"] == "step_mismatch"
    assert cat.entries["checkpoint-50"].status == "corrupt"
    assert cat.last_good().name == "checkpoint-40"


@pytest.mark.tool  # torch
def test_weights_only_and_suspiciously_small(tmp_path: Path) -> None:
    clock = Clock()
    cat = catalog(tmp_path, clock)
    write_hf(tmp_path, 10, width=64, when=clock.wall() - 900)
    update(cat)
    write_hf(tmp_path, 20, width=64, optimizer=False)
    update(cat)
    clock.advance(10)
    found = update(cat)
    # Smaller because the optimizer state is gone: that explains the size, weights-only is the news.
    assert kinds(found) == [("checkpoint_weights_only", "warning", False)]
    assert "restart Adam" in found[0].message
    e = cat.entries["checkpoint-20"]
    assert e.status == "good" and e.resumable is False and "weights-only: resume will restart Adam" in e.notes

    write_hf(tmp_path, 30, width=8, optimizer=False)
    update(cat)
    clock.advance(10)
    found = update(cat)
    # Its own kind: checkpoint_corrupt is critical, and this may be a legitimately smaller model.
    assert kinds(found) == [("checkpoint_suspect", "warning", False)]
    assert "suspiciously small" in found[0].message
    assert cat.entries["checkpoint-30"].status == "suspect"
    assert cat.last_good().name == "checkpoint-20"

    # A full, resumable save afterwards clears both, once.
    write_hf(tmp_path, 40, width=64)
    update(cat)
    clock.advance(10)
    found = update(cat)
    assert sorted(kinds(found)) == [
        ("checkpoint_suspect", "warning", True),
        ("checkpoint_weights_only", "warning", True),
    ]
    assert all("last good: checkpoint-40" in f.message for f in found)
    assert update(cat) == []

    # Weights-only again after a resumable save: fires again.
    write_hf(tmp_path, 50, width=64, optimizer=False)
    update(cat)
    clock.advance(10)
    assert kinds(update(cat)) == [("checkpoint_weights_only", "warning", False)]


@pytest.mark.tool  # torch
def test_weights_only_run_is_said_once_at_info(tmp_path: Path) -> None:
    clock = Clock()
    write_hf(tmp_path, 10, optimizer=False, when=clock.wall() - 900)
    write_hf(tmp_path, 20, optimizer=False, when=clock.wall() - 600)
    cat = catalog(tmp_path, clock)
    assert kinds(update(cat)) == [("checkpoint_weights_only", "info", False)]
    assert cat.counts()["good"] == 2


# --- clean, not just intact ----------------------------------------------------------------


@pytest.mark.tool  # torch
def test_checkpoints_after_nan_finding_are_suspect(tmp_path: Path) -> None:
    clock = Clock()
    for i, step in enumerate((32, 64, 96)):
        write_hf(tmp_path, step, when=clock.wall() - 900 + 100 * i)
    w = CheckpointWatcher(
        tmp_path,
        CheckpointConfig(settle=5.0),
        clock=clock.mono,
        wall=clock.wall,
        statvfs=lambda p: SimpleNamespace(f_bavail=10**9, f_frsize=4096, f_blocks=10**9),
    )
    assert w.tick() == []
    assert w.last_good().name == "checkpoint-96"
    w.on_finding(Finding("loss_spike", Severity.WARNING, 0, "spike", step=50))  # not poison
    assert w.last_good().name == "checkpoint-96"
    w.on_finding(Finding("nan_loss", Severity.CRITICAL, 0, "NaN", step=70))
    assert w.last_good().name == "checkpoint-64"
    assert w.catalog.entries["checkpoint-96"].status_text() == "suspect: saved after nan_loss at step 70"
    w.on_finding(Finding("grad_explosion", Severity.WARNING, 0, "boom", step=90))  # later: changes nothing
    assert w.catalog.entries["checkpoint-96"].reason == "saved after nan_loss at step 70"
    write_hf(tmp_path, 128)
    w.tick()
    clock.advance(10)
    w.tick()
    assert w.catalog.entries["checkpoint-128"].status == "suspect"
    snap = w.snapshot()
    assert snap["last_good_step"] == 64 and snap["last_checkpoint_step"] == 128
    assert snap["checkpoints"]["suspect"] == 2 and snap["poisoned_from_step"] == 70


@pytest.mark.tool  # torch
def test_nan_in_trainer_state_log_history_marks_later_checkpoints(tmp_path: Path) -> None:
    clock = Clock()
    write_hf(tmp_path, 32, when=clock.wall() - 900)
    write_hf(tmp_path, 64, when=clock.wall() - 600)
    write_hf(tmp_path, 96, nan_at=72, when=clock.wall() - 300)
    cat = catalog(tmp_path, clock)
    assert update(cat) == []
    assert [(e.name, e.status) for e in cat.ordered()] == [
        ("checkpoint-32", "good"),
        ("checkpoint-64", "good"),
        ("checkpoint-96", "suspect"),
    ]
    assert "step 72 (trainer_state.json log_history)" in cat.entries["checkpoint-96"].reason


@pytest.mark.tool  # torch
def test_records_from_trainer_state(tmp_path: Path) -> None:
    d = write_hf(tmp_path, 64, nan_at=56)
    recs = L.records_from_trainer_state(d / L.TRAINER_STATE)
    steps = [r for r in recs if isinstance(r, StepRecord)]
    evals = [r for r in recs if isinstance(r, EvalRecord)]
    assert [r.step for r in steps] == list(range(8, 65, 8))
    assert steps[0].loss == pytest.approx(2.92) and steps[0].grad_norm == 1.2 and steps[0].total_steps == 1000
    assert math.isnan(steps[-1].loss) and not steps[0].step_inferred
    assert [(r.step, r.eval_loss, r.metrics["eval_runtime"]) for r in evals] == [
        (32, 2.5, 1.5),
        (64, 2.5, 1.5),
    ]
    assert L.first_bad_step(recs) == (56, "loss nan")
    filtered = [StepRecord(step=s, loss=2.0 if s < 40 else 0.0, grad_norm=1.0) for s in range(8, 65, 8)]
    assert L.first_bad_step(filtered) == (40, "loss 0 (NaN losses filtered out of the logged mean)")
    fp16 = [
        StepRecord(step=s, loss=2.0, grad_norm=math.inf if s in (16, 40, 48) else 1.0)
        for s in range(8, 65, 8)
    ]
    assert L.first_bad_step(fp16) == (40, "grad_norm inf")


@pytest.mark.unit
def test_trainer_state_history_is_handed_out_once_newest_tail_only(tmp_path: Path) -> None:
    clock = Clock()
    write_hf(tmp_path, 64, torch_files=False, when=clock.wall() - 900)
    write_hf(tmp_path, 32, torch_files=False, when=clock.wall() - 1200)
    cat = catalog(tmp_path, clock)
    update(cat)
    recs = cat.new_history()
    assert [(type(r).__name__, r.step) for r in recs if r.step in (32, 64)] == [
        ("StepRecord", 32),
        ("EvalRecord", 32),
        ("StepRecord", 64),
        ("EvalRecord", 64),
    ]
    assert [r.step for r in recs if isinstance(r, StepRecord)] == list(range(8, 65, 8))
    assert cat.new_history() == []
    write_hf(tmp_path, 96, torch_files=False)
    update(cat)
    clock.advance(10)
    update(cat)
    assert [r.step for r in cat.new_history() if isinstance(r, StepRecord)] == [72, 80, 88, 96]


def _history_services(tmp_path: Path, logs: list[Path]) -> tuple[Agent, Services]:
    cfg = replaced(
        Config(),
        {
            "gpu.enabled": False,
            "dumps.dir": str(tmp_path / "dumps"),
            "alerts.spool_dir": str(tmp_path / "spool"),
            "checkpoints": CheckpointConfig(
                dir=str(tmp_path / "ckpt"), settle=0.0, mode="poll", poll_interval=0.01
            ),
        },
    )
    agent = Agent(cfg, Identity(run="h", rank=0, local_rank=0, world_size=1, node="n"))
    agent.add_watcher(logs)
    return agent, Services(agent, cfg, server=False)


@pytest.mark.unit
def test_nan_only_in_log_history_reaches_the_detectors_once(tmp_path: Path) -> None:
    """`watch --checkpoint-dir` with no log: the checkpoints' own history is the only loss curve."""
    root = tmp_path / "ckpt"
    agent, svc = _history_services(tmp_path, [])

    def nan_findings() -> list[tuple[str, str, bool]]:
        return kinds([f for f in agent.findings if f.kind == "nan_loss"])

    async def scenario() -> None:
        await svc.start()
        try:
            state = agent.watchers[0].engine.state
            await asyncio.to_thread(write_hf, root, 96, nan_at=72, torch_files=False)
            await until(lambda: state.last_step == 96)
            assert nan_findings() == [("nan_loss", "critical", False)]
            nan = next(f for f in agent.findings if f.kind == "nan_loss")
            assert nan.step == 72  # the exact step from log_history, not a count of lines
            # The next checkpoint repeats the whole history: only its new tail is fed.
            await asyncio.to_thread(write_hf, root, 128, nan_at=72, torch_files=False)
            await until(lambda: state.last_step == 128)
            assert nan_findings() == [("nan_loss", "critical", False)]
            assert state.step_count == 16
        finally:
            await svc.close()

    asyncio.run(scenario())


@pytest.mark.unit
def test_log_history_is_not_fed_when_the_log_has_steps(tmp_path: Path) -> None:
    agent, svc = _history_services(tmp_path, [tmp_path / "train.log"])
    eng = agent.watchers[0].engine
    eng.feed(StepRecord(step=5, loss=2.0))  # from the log
    svc._history([StepRecord(step=8, loss=math.nan)])
    assert eng.state.last_step == 5 and not agent.findings
    fresh, svc2 = _history_services(tmp_path / "b", [])
    svc2._history([StepRecord(step=8, loss=math.nan)])
    assert kinds(fresh.findings) == [("nan_loss", "critical", False)]


# --- stale and disk_low -------------------------------------------------------------------------


def _ckpt_engine(root: str, rank: int | None = None, **cfg: Any) -> RankEngine:
    """A rank's engine with the checkpoint rules of a watched ``root``."""
    return RankEngine(Config(checkpoints=CheckpointConfig(dir=root, **cfg)), rank)


def _saved(root: Path, step: int, saved_at: float) -> SavedCheckpoint:
    return SavedCheckpoint(
        name=f"checkpoint-{step}", path=PurePath(root, f"checkpoint-{step}"), step=step, saved_at=saved_at
    )


@pytest.mark.unit
def test_stale_rule_from_cadence(tmp_path: Path) -> None:
    cfg = CheckpointConfig()
    assert cfg.stale_limit([T0]) is None
    times = (T0, T0 + 600, T0 + 1200)
    assert cfg.stale_limit(times) == 1800.0  # 3 x 10 min, and never under 30 min
    assert cfg.stale_limit([T0, T0 + 3600, T0 + 7200]) == 3 * 3600
    root = str(tmp_path)
    eng = _ckpt_engine(root, rank=3)
    assert any(isinstance(d, CheckpointStaleDetector) for d in eng.detectors)
    last = _saved(tmp_path, 30, T0 + 1200)

    def scan(
        wall: float,
        good: SavedCheckpoint | None,
        saves: tuple[float, ...],
        started: float,
        engine: RankEngine = eng,
    ) -> list[Finding]:
        return engine.feed(
            CheckpointScan(
                now=wall - T0, wall=wall, root=root, started=started, save_times=saves, last_good=good
            )
        )

    assert scan(T0 + 2900, last, times, T0) == []
    found = scan(T0 + 3100, last, times, T0)
    assert kinds(found) == [("checkpoint_stale", "warning", False)]
    assert found[0].rank == 3 and "no new good checkpoint for 32m" in found[0].message
    assert "checkpoint-30 (step 30, 32m ago)" in found[0].message
    assert found[0].evidence == {"age_s": 1900.0, "max_age_s": 1800.0}
    assert (found[0].path, found[0].subject, found[0].step) == (root, root, 30)
    assert scan(T0 + 3200, last, times, T0) == []
    newer = _saved(tmp_path, 40, T0 + 3300)
    back = scan(T0 + 3310, newer, (*times, T0 + 3300), T0)
    assert kinds(back) == [("checkpoint_stale", "warning", True)]
    assert (
        back[0].subject == root and back[0].message == "new good checkpoint: checkpoint-40 (step 40, 10s ago)"
    )
    # Checkpoints older than the agent (a restarted job) count from the agent's start.
    assert scan(T0 + 10_000, last, times, T0 + 9_000) == []
    fixed = _ckpt_engine(root, rank=3, max_age=600.0)
    assert kinds(scan(T0 + 601, None, (), T0, fixed)) == [("checkpoint_stale", "warning", False)]
    # No checkpoint folder watched: the rules are not built.
    assert not any(isinstance(d, CheckpointStaleDetector) for d in RankEngine(Config(), 3).detectors)


@pytest.mark.unit
def test_disk_rule_warns_before_the_save_fails() -> None:
    eng = _ckpt_engine("/ckpt", rank=0)
    assert any(isinstance(d, CheckpointDiskDetector) for d in eng.detectors)
    gib = 1 << 30

    def scan(free: int | None, next_size: int | None, engine: RankEngine = eng) -> list[Finding]:
        return engine.feed(
            CheckpointScan(now=1.0, wall=T0, root="/ckpt", started=T0, free=free, next_size=next_size)
        )

    assert scan(100 * gib, None) == []
    assert scan(16 * gib, 10 * gib) == []
    assert scan(None, 10 * gib) == []  # statvfs failed: nothing to judge
    found = scan(14 * gib, 10 * gib)
    assert kinds(found) == [("disk_low", "warning", False)]
    assert "14.0 GiB free" in found[0].message and "10.0 GiB" in found[0].message
    assert (found[0].rank, found[0].path, found[0].time) == (0, "/ckpt", T0)
    assert found[0].evidence == {
        "free_bytes": 14 * gib,
        "next_checkpoint_bytes": 10 * gib,
        "need_bytes": 15 * gib,
    }
    assert scan(13 * gib, 10 * gib) == []
    assert kinds(scan(9 * gib, 10 * gib)) == [("disk_low", "critical", False)]
    assert kinds(scan(20 * gib, 10 * gib)) == [("disk_low", "critical", True)]
    floor = _ckpt_engine("/ckpt", rank=0, min_free=5 * gib)
    assert kinds(scan(4 * gib, None, floor)) == [("disk_low", "warning", False)]


@pytest.mark.unit
def test_live_scans_reach_the_agents_engine_once(tmp_path: Path) -> None:
    """The watcher's scans go through the engine: one stale and one disk_low alert for the
    folder, from this agent's rank, however many ranks a node daemon watches."""
    root = tmp_path / "ckpt"
    cfg = replaced(
        Config(),
        {
            "gpu.enabled": False,
            "dumps.dir": str(tmp_path / "dumps"),
            "alerts.spool_dir": str(tmp_path / "spool"),
            "checkpoints": CheckpointConfig(
                dir=str(root), settle=0.0, mode="poll", poll_interval=0.01, max_age=600.0, min_free=1 << 60
            ),
        },
    )
    agent = Agent(cfg, Identity(run="h", rank=0, local_rank=0, world_size=2, node="n"))
    agent.add_watcher([tmp_path / "r0.log"])
    agent.add_watcher([tmp_path / "r1.log"], Identity(run="h", rank=1, local_rank=1, world_size=2, node="n"))
    svc = Services(agent, cfg, server=False)

    def mine(kind: str) -> list[Finding]:
        return [f for f in agent.findings if f.kind == kind]

    async def scenario() -> None:
        await svc.start()
        try:
            await until(lambda: mine("disk_low"))
            svc.checkpoints.started -= 3600.0  # the agent has watched for an hour: stale
            await until(lambda: mine("checkpoint_stale"))
            scans = svc.checkpoints.scans
            await until(lambda: svc.checkpoints.scans > scans + 2)
        finally:
            await svc.close()

    asyncio.run(scenario())
    assert kinds(mine("disk_low")) == [("disk_low", "warning", False)]
    assert kinds(mine("checkpoint_stale")) == [("checkpoint_stale", "warning", False)]
    stale = mine("checkpoint_stale")[0]
    assert (stale.rank, stale.path, stale.subject) == (0, str(root), str(root))
    assert "none since the agent started" in stale.message
    assert mine("disk_low")[0].rank == 0 and mine("disk_low")[0].path == str(root)


@pytest.mark.unit
def test_checkpoint_settings_still_wait_for_a_restart() -> None:
    """The watcher is built once at start: a reload must not call its settings applied."""
    from rankwatch.runtime.reload import hand_over

    old = Config(checkpoints=CheckpointConfig(dir="/ckpt"))
    new = Config(checkpoints=CheckpointConfig(dir="/ckpt", max_age=60.0))
    assert hand_over(old, new, watchers=[]).checkpoints.max_age is None


@pytest.mark.tool  # torch
def test_watcher_stale_and_disk_low_with_injected_clock_and_statvfs(tmp_path: Path) -> None:
    clock = Clock()
    free = {"bytes": 10**12}
    for i, step in enumerate((10, 20, 30)):
        write_hf(tmp_path, step, when=clock.wall() + 600 * i)
    clock.advance(1200)
    w = CheckpointWatcher(
        tmp_path,
        CheckpointConfig(settle=5.0),
        clock=clock.mono,
        wall=clock.wall,
        statvfs=lambda p: SimpleNamespace(f_bavail=free["bytes"] // 4096, f_frsize=4096, f_blocks=10**9),
    )
    w.started = clock.wall() - 1200
    eng = _ckpt_engine(str(tmp_path), settle=5.0)

    def tick() -> list[Finding]:
        found = [f for e in w.tick() for f in eng.feed(e)]
        assert w.last_scan is not None
        return found + eng.feed(w.last_scan)

    assert tick() == []
    size = w.catalog.next_size()
    assert size and size > 1000
    clock.advance(1700)
    assert tick() == []
    clock.advance(200)
    assert kinds(tick()) == [("checkpoint_stale", "warning", False)]
    free["bytes"] = int(size * 1.2)
    found = tick()
    assert kinds(found) == [("disk_low", "warning", False)]
    snap = w.snapshot()
    assert snap["fs_free_bytes"] == (int(size * 1.2) // 4096) * 4096
    assert snap["max_age_seconds"] == 1800.0 and snap["seconds_since_last_good"] == pytest.approx(1900.0)
    assert snap["last_checkpoint_step"] == 30 and snap["checkpoints"]["good"] == 3


# --- deep mode -------------------------------------------------------------------------------


@pytest.mark.unit
def test_deep_mode_catches_a_silent_change(tmp_path: Path) -> None:
    clock = Clock()
    root = tmp_path / "run"
    d = write_hf(root, 10, torch_files=False, when=clock.wall() - 900)
    # A newer good save does not excuse bit rot in an older one.
    write_hf(root, 20, torch_files=False, when=clock.wall() - 800)
    manifest = tmp_path / "manifest.json"
    cfg = {"deep": True, "manifest": str(manifest), "rehash_interval": 3600.0}
    cat = catalog(root, clock, **cfg)
    assert no_weights_only(update(cat)) == []
    doc = json.loads(manifest.read_text())
    assert len(doc["checkpoints"]["checkpoint-10"]["files"]["model.safetensors"]["sha256"]) == 64
    # Bit rot: same size, same mtime, different bytes.
    f = d / "model.safetensors"
    st = f.stat()
    blob = bytearray(f.read_bytes())
    blob[-5] ^= 0x01
    f.write_bytes(bytes(blob))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert update(cat) == []
    clock.advance(3601)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    assert "model.safetensors changed on disk" in found[0].message
    # A fresh agent with the manifest catches it too.
    again = catalog(root, clock, **cfg)
    found = no_weights_only(update(again))
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
    assert update(cat) == []
    # Restored (rewritten) and verified again: resolved.
    blob[-5] ^= 0x01
    f.write_bytes(bytes(blob))
    update(cat)
    clock.advance(10)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", True)]
    assert cat.entries["checkpoint-10"].status == "good"


# --- the CLI ------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> Callable[[], int]:
    parser = argparse.ArgumentParser(prog="rankwatch")
    add_subcommands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return lambda: args.func(args)


@pytest.mark.tool  # torch
def test_dcp_save_with_a_cut_data_file_is_corrupt_quick_and_deep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``.distcp`` shorter than the items its ``.metadata`` places in it cannot load."""
    torch = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    now = time.time()
    steps = []
    for step in (20, 30):
        d = tmp_path / f"step{step:05d}"
        sd = {"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(4)}, "step": step}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(sd, storage_writer=FileSystemWriter(str(d)))
        _touch(d, now - 3600 + step)
        steps.append(d)
    for deep in (False, True):
        v = verify_candidate(L.scan(steps[1]).candidates[0], deep=deep)
        assert v.ok and not v.problems, v.problems
    data = steps[1] / "__0_0.distcp"
    full = data.stat().st_size
    with open(data, "r+b") as fh:
        fh.truncate(full // 2)
    _touch(steps[1], now - 3600 + 30)
    for deep in (False, True):
        v = verify_candidate(L.scan(steps[1]).candidates[0], deep=deep)
        assert [(p.file, p.check) for p in v.problems] == [("__0_0.distcp", "truncated")]
        assert f"the file holds {full // 2}" in str(v.problems[0])
        argv = ["checkpoints", str(tmp_path), "--settle", "0", *(["--deep"] if deep else [])]
        assert _cli(argv)() == 1
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith("step00030"))
        assert "corrupt: __0_0.distcp: truncated" in row
        assert out.splitlines()[-1].startswith("last good: step00020 (step 20, ")

    # Same size, one tensor byte flipped: only --deep reads the items' bytes (CRC-32).
    flipped = tmp_path / "step00040"
    shutil.copytree(steps[0], flipped)
    with open(flipped / ".metadata", "rb") as fh:
        last = max(dcp_items(fh), key=lambda i: i.offset)
    blob = bytearray((flipped / last.relative_path).read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(blob[last.offset : last.offset + last.length]))) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("/data/0"))
    n, extra = struct.unpack(
        "<HH", blob[last.offset + info.header_offset + 26 : last.offset + info.header_offset + 30]
    )
    blob[last.offset + info.header_offset + 30 + n + extra] ^= 0xFF
    (flipped / last.relative_path).write_bytes(bytes(blob))
    assert verify_candidate(L.scan(flipped).candidates[0]).ok
    v = verify_candidate(L.scan(flipped).candidates[0], deep=True)
    assert [(p.check, p.message) for p in v.problems] == [("crc", "member 'archive/data/0' fails its CRC-32")]

    (flipped / last.relative_path).unlink()
    v = verify_candidate(L.scan(flipped).candidates[0])
    assert ("__0_0.distcp", "missing") in [(p.file, p.check) for p in v.problems]


@pytest.mark.tool  # torch
def test_cli_table_last_good_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    write_hf(tmp_path, 32, when=now - 3 * 3600)
    write_hf(tmp_path, 64, when=now - 2 * 3600)
    assert _cli(["checkpoints", str(tmp_path)])() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "STEP", "SAVED", "(UTC)", "SIZE", "LAYOUT", "STATUS"]
    assert out[1].split()[:2] == ["checkpoint-32", "32"] and out[1].endswith("good")
    assert out[-1] == "last good: checkpoint-64 (step 64, 2h ago)"

    bad = write_hf(tmp_path, 96, when=now - 3600)
    (bad / "optimizer.pt").write_bytes((bad / "optimizer.pt").read_bytes()[:100])
    _touch(bad, now - 3600)
    assert _cli(["checkpoints", str(tmp_path)])() == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("checkpoint-96"))
    assert "corrupt: optimizer.pt: zip directory unreadable" in row
    assert out.rstrip().endswith("last good: checkpoint-64 (step 64, 2h ago)")

    assert _cli(["checkpoints", str(tmp_path), "--json"])() == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["status"]) for c in doc["checkpoints"]] == [
        ("checkpoint-32", "good"),
        ("checkpoint-64", "good"),
        ("checkpoint-96", "corrupt"),
    ]
    assert doc["last_good"]["step"] == 64 and doc["newest_is_good"] is False

    shutil.rmtree(bad)
    assert _cli(["checkpoints", str(tmp_path), "--bad-from", "50"])() == 1
    out = capsys.readouterr().out
    assert "suspect: saved after --bad-from at step 50" in out
    assert out.rstrip().endswith("last good: checkpoint-32 (step 32, 3h ago)")

    assert _cli(["checkpoints", str(tmp_path / "missing")])() == 2
    assert "no such file" in capsys.readouterr().err
    assert _cli(["checkpoints", str(tmp_path), "--step-regex", "("])() == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli(["checkpoints", str(empty)])() == 1
    assert "no checkpoints found" in capsys.readouterr().out


@pytest.mark.tool  # torch
def test_cli_shows_incomplete_and_single_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    write_hf(tmp_path, 10, when=now - 600)
    write_hf(tmp_path, 20, state=False, when=now - 300)
    assert _cli(["checkpoints", str(tmp_path)])() == 1
    out = capsys.readouterr().out
    assert "incomplete: no trainer_state.json" in out
    assert _cli(["checkpoints", str(tmp_path / "checkpoint-10")])() == 0
    assert capsys.readouterr().out.rstrip().endswith("last good: checkpoint-10 (step 10, 10m ago)")


# --- the live watcher ------------------------------------------------------------------------------


@pytest.mark.tool  # torch
@pytest.mark.parametrize("mode", ["auto", "poll"])
def test_async_watcher_picks_up_a_new_checkpoint(tmp_path: Path, mode: str) -> None:
    _torch()
    root = tmp_path / "out"  # appears only after the watcher started
    emitted: list[Finding] = []
    cfg = CheckpointConfig(settle=0.2, mode=mode, poll_interval=0.1 if mode == "poll" else 30.0)
    eng = RankEngine(Config(checkpoints=replaced(cfg, dir=str(root))), 0)

    def deliver(events: list[Event]) -> None:
        emitted.extend(f for e in events for f in eng.feed(e) if f.kind != "checkpoint_stale")

    async def scenario() -> tuple[float, bool]:
        w = CheckpointWatcher(root, cfg)
        stop = asyncio.Event()
        # The agent's policy for every polled source: scans off the loop, woken by events.
        task = asyncio.create_task(Poller(CheckpointScanSource(w)).run(stop, deliver))
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: write_hf(root, 8))
        t0 = loop.time()
        saw_writing = False
        if mode == "auto" and not w.events_active:
            stop.set()
            await task
            pytest.skip("no filesystem events (inotify) here")
        while w.last_good() is None and loop.time() - t0 < 10:
            saw_writing = saw_writing or w.writing
            await asyncio.sleep(0.02)
        waited = loop.time() - t0
        bad = root / "checkpoint-16"
        await loop.run_in_executor(None, lambda: write_hf(root, 16))
        (bad / "scheduler.pt").write_bytes(b"")
        while not emitted and loop.time() - t0 < 10:
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(task, 5)
        return waited, saw_writing

    waited, _saw_writing = asyncio.run(scenario())
    assert waited < 10, "the new checkpoint was never taken as the last good one"
    if mode == "auto":
        # Only events can be this fast (its poll is 30 s, 5 s while the folder is missing); a
        # poll every 0.1 s proves nothing by its speed, so a loaded machine does not fail it.
        # Whether it is seen "writing" first is a race: a save whose completion marker
        # (trainer_state.json) is already there when the watcher looks is judged at once.
        assert waited < 3.0
    assert kinds(emitted) == [("checkpoint_corrupt", "critical", False)]
    assert "scheduler.pt: zero bytes" in emitted[0].message


@pytest.mark.tool  # torch
def test_async_watcher_reports_writing_while_a_save_runs(tmp_path: Path) -> None:
    clock = Clock()
    w = CheckpointWatcher(tmp_path, CheckpointConfig(settle=5.0), clock=clock.mono, wall=clock.wall)
    w.tick()
    assert not w.writing
    write_hf(tmp_path, 8, state=False)
    w.tick()
    assert w.writing and w.snapshot()["writing"] is True
    clock.advance(1000)
    w.tick()
    assert not w.writing and w.catalog.entries["checkpoint-8"].status == "incomplete"


@pytest.mark.unit
def test_a_cut_markerless_save_is_corrupt_after_corrupt_after_not_the_quarter_hour(tmp_path: Path) -> None:
    """A truncated .safetensors (no completion marker to wait for) is reported two minutes after its
    last write by default, not after incomplete_after (15 min): the moment it matters."""
    clock = Clock()
    cat = Catalog(tmp_path, CheckpointConfig(settle=5.0), clock=clock.mono, wall=clock.wall)
    f = tmp_path / "model_step100.safetensors"
    _save_st(f, {"w": _rand(32, 16)})
    f.write_bytes(f.read_bytes()[:-64])
    update(cat)
    clock.advance(60)
    assert update(cat) == []  # a writer that paused still has time
    clock.advance(61)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]


@pytest.mark.tool  # torch
def test_cli_judges_a_fresh_copy_with_completion_markers_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rankwatch checkpoints DIR` right after `cp -r`/rsync: every file is seconds old, but a
    save whose layout's completion marker is there is done, and judged by its content."""
    torch = _torch()
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "src"
    write_hf(src / "hf", 32)
    write_hf(src / "hf", 64)
    no_state = write_hf(src / "hf", 96, state=False)  # no trainer_state.json: not finished
    meg = src / "megatron" / "iter_0000100" / "mp_rank_00"
    meg.mkdir(parents=True)
    torch.save({"iteration": 100, "model": {"w": torch.ones(2)}, "optimizer": {}}, meg / "model_optim_rng.pt")
    (src / "megatron" / L.MEGATRON_TRACKER).write_text("100")
    ds = src / "ds" / "global_step20"
    ds.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "global_steps": 20}, ds / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {}}, ds / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (src / "ds" / "latest").write_text("global_step20")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.randn(4)}}, checkpoint_id=str(src / "dcp" / "step-300"))
    plain = src / "plain"
    plain.mkdir()
    torch.save({"model": {}, "optimizer": {}, "iter_num": 4000}, plain / "ckpt.pt")  # no marker to go by

    old = time.time() - 3600
    for p in src.rglob("*"):
        os.utime(p, (old, old))
    assert no_state.exists()
    copy = tmp_path / "copy"
    shutil.copytree(src, copy, copy_function=shutil.copyfile)  # new files, new mtimes

    def statuses(root: Path) -> dict[str, str]:
        _cli(["checkpoints", str(root), "--json"])()
        doc = json.loads(capsys.readouterr().out)
        return {c["name"]: c["status"] for c in doc["checkpoints"]}

    assert statuses(copy / "hf") == {
        "checkpoint-32": "good",
        "checkpoint-64": "good",
        "checkpoint-96": "writing",
    }
    assert _cli(["checkpoints", str(copy / "hf")])() == 0
    assert re.search(r"last good: checkpoint-64 \(step 64, \d+s ago\)$", capsys.readouterr().out.rstrip())
    assert statuses(copy / "megatron") == {"iter_0000100": "good"}
    assert statuses(copy / "ds") == {"global_step20": "good"}
    assert statuses(copy / "dcp") == {"step-300": "good"}
    assert statuses(copy / "plain") == {"ckpt.pt": "writing"}  # only settling tells, as before
    # The originals, long settled, read the same.
    assert statuses(src / "hf")["checkpoint-64"] == "good"


@pytest.mark.unit
def test_a_save_its_writer_still_holds_open_is_not_called_corrupt(tmp_path: Path) -> None:
    """Rank 0 hung inside torch.save: its .pt file has zero bytes and stops changing, but the
    writer still has it open. That is a save in progress (the hang is the stall's to report),
    not a corrupt file from a full disk; once closed as it is, it is corrupt."""
    clock = Clock()
    cat = Catalog(
        tmp_path,
        CheckpointConfig(settle=5.0, corrupt_after=60.0),
        clock=clock.mono,
        wall=clock.wall,
        writers=open_for_writing,
    )
    path = tmp_path / "ckpt_step30.pt"
    with open(path, "wb") as fh:
        assert open_for_writing(path) and open_for_writing(tmp_path)
        update(cat)
        for _ in range(5):
            clock.advance(61)
            assert update(cat) == []
        assert cat.entries[path.name].status == "writing"
    assert not open_for_writing(path) and fh.closed
    clock.advance(61)
    found = update(cat)
    assert kinds(found) == [("checkpoint_corrupt", "critical", False)]
