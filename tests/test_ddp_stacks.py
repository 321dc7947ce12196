"""The stack classifier and ``dumps diff`` on real py-spy dumps of hung 4-rank DDP jobs
(tests/data/ddp_stacks/README.md says how they were recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankwatch.dumps.classify import BLOCKED, COLLECTIVE, COMPUTE, DATA, classify_dump, classify_frames
from rankwatch.dumps.diff import MISMATCH, NOT_IN_COLLECTIVE, diff_incident, format_diff

DATA_DIR = Path(__file__).parent / "data" / "ddp_stacks"


def _load(name: str) -> dict[int, dict[str, Any]]:
    return {
        int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (DATA_DIR / name).glob("rank-*.json")
    }


@pytest.mark.parametrize("name", ["loader_hang", "loader_hang_native"])
def test_loader_hang_names_the_rank_in_data_loading(name: str) -> None:
    dumps = _load(name)
    acts = {r: classify_dump(d) for r, d in dumps.items()}
    # DDP's gradient reduction runs inside loss.backward(): waiting, not the odd one out.
    assert (acts[1].kind, acts[1].op) == (COLLECTIVE, "all_reduce") and "backward" in acts[1].detail
    assert acts[1].certain is name.endswith("native")  # the native frames show c10d::Reducer
    # DDP's buffer broadcast (the causal mask) before forward: waiting too.
    assert (acts[0].kind, acts[0].op) == (COLLECTIVE, "broadcast") and "buffer" in acts[0].detail
    assert acts[2].kind == DATA and acts[2].call_site == "main (ddp_train.py:102)"
    assert acts[2].worker is not None and "read_shard_forever (ddp_train.py:70)" in acts[2].worker
    result = diff_incident(dumps, world_size=4)
    assert result.suspects == [2] and result.verdict == NOT_IN_COLLECTIVE
    text = format_diff(result)
    assert "suspect: rank 2 (the only rank not waiting in a collective: in data loading" in text
    assert "Tokens.__getitem__ (ddp_train.py:62)" in text
    assert "mismatch" not in text


@pytest.mark.parametrize("name", ["barrier", "barrier_native"])
def test_extra_barrier_is_a_collective_mismatch_with_both_call_sites(name: str) -> None:
    result = diff_incident(_load(name), world_size=4)
    assert result.verdict == MISMATCH and result.suspects == [0]
    assert result.reason.startswith(
        "collective mismatch: rank 0 in barrier called from sync_metrics (ddp_train.py:90)"
    )
    assert "ranks 1-3 in broadcast (DDP buffer broadcast before forward" in result.reason
    assert "called from compute (ddp_train.py:74)" in result.reason
    assert "real error" not in format_diff(result)


def test_a_missing_rank_is_suspected_when_every_dumped_rank_waits() -> None:
    dumps = _load("loader_hang")
    del dumps[2]
    result = diff_incident(dumps, world_size=4)
    assert result.suspects == [2] and "could not be dumped" in result.reason


def _f(name: str, filename: str, line: int = 1) -> dict[str, Any]:
    return {"name": name, "filename": filename, "short_filename": filename.rsplit("/", 1)[-1], "line": line}


SITE = "/usr/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("frames", "kind", "op"),
    [
        (
            [_f("all_gather_into_tensor", f"{SITE}/torch/distributed/distributed_c10d.py")],
            COLLECTIVE,
            "all_gather",
        ),
        (
            [_f("_all_gather_flat_param", f"{SITE}/torch/distributed/fsdp/_flat_param.py")],
            COLLECTIVE,
            "all_gather",
        ),
        (
            [_f("foreach_reduce", f"{SITE}/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py")],
            COLLECTIVE,
            "reduce_scatter",
        ),
        (
            [_f("_sync_params_and_buffers", f"{SITE}/torch/nn/parallel/distributed.py")],
            COLLECTIVE,
            "broadcast",
        ),
        ([_f("wait", f"{SITE}/torch/distributed/distributed_c10d.py")], COLLECTIVE, "wait"),
        ([_f("_save", f"{SITE}/torch/serialization.py"), _f("save_ckpt", "/w/train.py")], "io", None),
        (
            [_f("Event.wait", "/usr/lib/python3.11/threading.py"), _f("wait_peer", "/w/train.py")],
            BLOCKED,
            None,
        ),
        ([_f("forward", "/w/model.py"), _f("main", "/w/train.py")], COMPUTE, None),
        # Native frames show backward computing, not waiting for peers' gradients.
        (
            [
                _f("at::native::addmm", "libtorch_cpu.so"),
                _f("_engine_run_backward", f"{SITE}/torch/autograd/graph.py"),
            ],
            COMPUTE,
            None,
        ),
    ],
)
def test_classify_frames(frames: list[dict[str, Any]], kind: str, op: str | None) -> None:
    act = classify_frames(frames, active=False)
    assert (act.kind, act.op) == (kind, op), act
