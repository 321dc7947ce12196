"""The stack classifier and ``dumps diff`` on real py-spy dumps of hung 4-rank DDP jobs
(tests/data/ddp_stacks/README.md says how they were recorded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rankwatch.dumps.classify import (
    BLOCKED,
    COLLECTIVE,
    COMPUTE,
    DATA,
    classify_dump,
    classify_frames,
    describe,
)
from rankwatch.dumps.diff import MISMATCH, NOT_IN_COLLECTIVE, diff_incident, format_diff

pytestmark = pytest.mark.unit

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


@pytest.mark.parametrize(("name", "waiting", "hung"), [("init_hang", 0, 1), ("init_hang_by_hand", 1, 0)])
def test_a_rank_that_never_reached_init_process_group_is_the_suspect(
    name: str, waiting: int, hung: int
) -> None:
    """The s35b tester's d49: a rank sleeps before ``init_process_group`` while its peer waits
    inside it (under torchrun in gloo's setup on the store, by hand in the env:// rendezvous):
    the peer waits for it as in a collective, so the rank not there is the suspect."""
    dumps = _load(name)
    act = classify_dump(dumps[waiting])
    assert (act.kind, act.op) == (COLLECTIVE, "init_process_group"), act
    assert classify_dump(dumps[hung]).kind == BLOCKED
    result = diff_incident(dumps, world_size=2)
    assert result.suspects == [hung] and result.verdict == NOT_IN_COLLECTIVE
    assert f"rank {hung} never reached init_process_group" in result.reason, result.reason
    assert f"suspect: rank {hung}" in format_diff(result)


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
    act = classify_frames(frames, active=None)
    assert (act.kind, act.op) == (kind, op), act


# ---------------------------------------------------------------- flight recorder

FR_DIR = Path(__file__).parent / "data" / "flight_recorder"


def test_flight_recorder_names_the_rank_that_never_entered() -> None:
    from rankwatch.dumps.flight import analyze, load_folder

    traces = load_folder(FR_DIR / "missing")
    assert sorted(traces) == [0, 1, 2]
    verdict = analyze(traces)
    assert verdict is not None and verdict.suspects == [1]
    assert verdict.reason.startswith(
        "rank 1 never entered collective #5 (all_reduce from <module> (rec.py:17))"
    )
    assert verdict.last_entered == {0: 5, 1: 4, 2: 5}


def test_flight_recorder_names_the_mismatched_op() -> None:
    from rankwatch.dumps.flight import analyze, load_folder

    verdict = analyze(load_folder(FR_DIR / "mismatch"))
    assert verdict is not None and verdict.suspects == [0]
    assert "collective #5 mismatch: rank 0 entered barrier" in verdict.reason
    assert "ranks 1,2 entered all_reduce (sizes [[4]])" in verdict.reason


def test_flight_recorder_refuses_code_in_a_pickle(tmp_path: Path) -> None:
    import os
    import pickle

    from rankwatch.dumps.flight import load_folder

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (tmp_path / "flight-recorder-rank-0.pkl").write_bytes(pickle.dumps({"entries": [Boom()]}))
    assert load_folder(tmp_path) == {}
    assert not (tmp_path / "pwned").exists()


def test_dumps_diff_prints_the_flight_recorder_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import shutil

    from rankwatch.dumps.cli import add_subcommands

    folder = tmp_path / "run" / "20261125T120000Z_stall"
    folder.mkdir(parents=True)
    for r in range(3):
        shutil.copy(DATA_DIR / "loader_hang" / f"rank-{r}.json", folder / f"rank-{r}.json")
        shutil.copy(FR_DIR / "missing" / f"flight-recorder-rank-{r}.pkl", folder)
    parser = argparse.ArgumentParser(prog="rankwatch")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["dumps", "diff", str(folder), "--dir", str(tmp_path)])
    assert args.func(args) == 0
    assert "flight recorder: rank 1 never entered collective #5" in capsys.readouterr().out
    args = parser.parse_args(["dumps", "diff", str(folder), "--dir", str(tmp_path), "--json"])
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["flight_recorder"]["verdict"]["suspects"] == [1]


IDLE_DIR = Path(__file__).parent / "data" / "idle_stacks"


@pytest.mark.parametrize("name", ["sleep", "sleep_native"])
def test_a_rank_idle_in_time_sleep_is_not_computing(name: str) -> None:
    threads = json.loads((IDLE_DIR / f"{name}.json").read_text())
    act = classify_dump({"pid": threads[0]["pid"], "ok": True, "threads": threads})
    assert act.kind == BLOCKED, act
    assert "wait_for_peer" in act.detail and "computing" not in describe(act)
    if name == "sleep_native":
        assert act.detail.startswith("sleeping (time.sleep)")


C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
FSDP2 = f"{SITE}/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"


@pytest.mark.parametrize(
    ("inner", "op", "detail"),
    [
        ("all_gather_single", "all_gather", "FSDP parameter all-gather"),
        ("reduce_scatter_single", "reduce_scatter", "FSDP gradient reduce-scatter"),
        ("all_gather_into_tensor", "all_gather", "FSDP parameter all-gather"),
        ("_reduce_scatter_base", "reduce_scatter", "FSDP gradient reduce-scatter"),
    ],
)
def test_fsdp2_collectives_by_their_c10d_names(inner: str, op: str, detail: str) -> None:
    """torch 2.13's FSDP2 calls ``dist.all_gather_single``/``reduce_scatter_single`` from
    ``_fsdp_collectives.py`` (``DefaultAllGather.__call__``): the FSDP wording shows."""
    frames = [
        _f(inner, C10D),
        _f("DefaultAllGather.__call__", FSDP2),
        _f("forward", "/w/model.py"),
    ]
    act = classify_frames(frames, active=False)
    assert (act.kind, act.op, act.detail, act.certain) == (COLLECTIVE, op, detail, True), act
    plain = classify_frames([_f("reduce_scatter_tensor_coalesced", C10D), _f("step", "/w/train.py")])
    assert (plain.op, plain.certain) == ("reduce_scatter", True)


def _dump(rank: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    thread = {
        "thread_id": 1,
        "thread_name": "MainThread",
        "active": False,
        "frames": frames,
        "pid": 100 + rank,
    }
    return {"pid": 100 + rank, "ok": True, "threads": [thread]}


def test_ranks_waiting_in_different_process_groups_are_two_groups() -> None:
    """Ranks 0,1 wait in an all-reduce of their tensor-parallel group (train.py:40), ranks 2,3
    in one of their data-parallel group (train.py:44): two groups with two call sites, not
    one group showing one of them."""

    def frames(line: int) -> list[dict[str, Any]]:
        return [_f("all_reduce", C10D, 3000), _f("sync", "/w/train.py", line), _f("main", "/w/train.py", 60)]

    dumps = {r: _dump(r, frames(40 if r < 2 else 44)) for r in range(4)}
    result = diff_incident(dumps, world_size=4)
    assert sorted(g.ranks for g in result.groups) == [[0, 1], [2, 3]]
    text = format_diff(result)
    assert "train.py:40" in text and "train.py:44" in text, text
    assert result.verdict != "same_collective"


def test_a_spawn_launchers_workers_are_judged_as_peers_by_pid() -> None:
    """One dump holds a torch.multiprocessing.spawn launcher and its workers (their ranks set
    inside them): the worker that is not in the collective is named by pid and spawn index, and
    no rank is claimed for it; the process picked for "rank 0" is no verdict."""
    result = diff_incident(_load("spawn_hang"))
    assert [(p.pid, p.index) for p in result.peers[0]] == [(15715, 0), (15716, 1)]
    assert result.suspects == [] and result.suspect_pids == [15716]
    assert result.verdict == NOT_IN_COLLECTIVE
    assert result.diagnosis().suspect is None and result.diagnosis().suspect_pids == (15716,)
    text = format_diff(result)
    assert "rank 0: a launcher waiting for 2 worker processes" in text
    assert "  pid 15715 (spawn process 0): waiting in all_reduce (DDP gradient all-reduce" in text
    assert "  pid 15716 (spawn process 1): blocked in a wait of its own" in text
    assert "suspect: pid 15716 (spawn process 1) (the only worker process not waiting in a collective" in text
    assert "no suspect" not in text and "all ranks wait" not in text


def test_a_ranks_dataloader_workers_are_no_peers() -> None:
    """A rank's DataLoader workers run the training code too, but under a rank, not a launcher."""
    assert diff_incident(_load("loader_hang"), world_size=4).peers == {}
