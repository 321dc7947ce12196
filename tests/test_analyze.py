from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.identity import rank_from_path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
FINDING_KEYS = {"kind", "severity", "rank", "path", "step", "line", "message"}
RANK_KEYS = {"path", "rank", "format", "steps", "last_step", "findings"}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["analyze", "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out)


def check_contract(doc: dict) -> None:
    assert set(doc) == {"ranks", "findings"}
    for r in doc["ranks"]:
        assert set(r) == RANK_KEYS
        for f in r["findings"]:
            assert set(f) == FINDING_KEYS
            assert f["severity"] in {"info", "warning", "critical"}
    for f in doc["findings"]:
        assert set(f) == FINDING_KEYS


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.log", 3),
        ("rank3.out", 3),
        ("worker_12.txt", 12),
        ("job.task-7.log", 7),
        ("slurm-1234.out", None),
        ("train.log", None),
    ],
)
def test_rank_from_path(name: str, rank: int | None) -> None:
    assert rank_from_path(name) == rank


@pytest.mark.unit
def test_megatron_nan_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, str(EXAMPLES / "megatron-nan"))
    check_contract(doc)
    assert code == 1
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert {r["format"] for r in doc["ranks"]} == {"megatron"}
    assert all(r["last_step"] == 1330 for r in doc["ranks"])
    nan = [f for f in doc["findings"] if f["kind"] == "nan_loss"]
    assert sorted(f["rank"] for f in nan) == [0, 1, 2, 3]
    assert all(f["step"] == 1300 and f["severity"] == "critical" for f in nan)
    assert all("blow-up" in f["message"] for f in nan)
    assert doc["findings"][0]["severity"] == "critical"
    kinds = {f["kind"] for f in doc["findings"]}
    assert "loss_scale_collapse" not in kinds  # bf16 prints a constant scale of 1.0
    assert "grad_explosion" in kinds


@pytest.mark.unit
def test_hf_oom_example_names_rank_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, str(EXAMPLES / "hf-oom" / "train.log"))
    check_contract(doc)
    assert code == 1
    by_kind = {(f["kind"], f["rank"]) for f in doc["findings"]}
    assert ("oom", 1) in by_kind
    assert ("nccl_timeout", 0) in by_kind
    lag = [f for f in doc["findings"] if f["kind"] == "rank_lagging"]
    assert [f["rank"] for f in lag] == [1]
    r0 = next(r for r in doc["ranks"] if r["rank"] == 0)
    assert r0["format"] == "hf" and r0["last_step"] == 1240
    # torchelastic's own 'failed (exitcode: 1) local_rank: 1' line, its ChildFailedError box and
    # rank 1's OOM traceback are one death: the OOM, with the exit code, and no rank-less row.
    assert [f["rank"] for f in doc["findings"] if f["kind"] == "crash"] == []
    oom = next(f for f in doc["findings"] if f["kind"] == "oom")
    assert "torchrun reported exit code 1" in oom["message"]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]


@pytest.mark.unit
def test_human_output_shows_the_failing_frame_and_the_traceback_tail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["analyze", str(EXAMPLES / "hf-oom" / "train.log")]) == 1
    out = capsys.readouterr().out
    assert "    at /workspace/train.py:205 main" in out
    assert "    | torch.OutOfMemoryError: CUDA out of memory." in out
    assert "rank   ?" not in out


@pytest.mark.unit
def test_healthy_example_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, str(EXAMPLES / "healthy-nanogpt"))
    check_contract(doc)
    assert code == 0
    assert [f for f in doc["findings"] if f["severity"] != "info"] == []
    assert [r["last_step"] for r in doc["ranks"]] == [5000, 5000]


@pytest.mark.unit
def test_human_summary_is_most_severe_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--no-color", str(EXAMPLES / "megatron-nan")]) == 1
    out = capsys.readouterr().out
    assert out.index("CRITICAL") < out.index("WARNING")
    assert "rank   0" in out and "format=megatron" in out


@pytest.mark.unit
def test_missing_file_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["analyze", str(tmp_path / "nope.log")]) == 2
    assert "nope.log: no such file" in capsys.readouterr().err


@pytest.mark.unit
def test_bad_config_is_exit_2_with_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text("detectors:\n  loss_spike:\n    factr: 3\n")
    assert main(["analyze", "--config", str(cfg), str(EXAMPLES / "megatron-nan")]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}:3: detectors.loss_spike.factr: unknown key (did you mean 'factor'?)" in err


@pytest.mark.unit
def test_set_override_changes_a_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = run_json(
        capsys, "--set", "detectors.grad_explosion.enabled=false", str(EXAMPLES / "megatron-nan")
    )
    assert "grad_explosion" not in {f["kind"] for f in doc["findings"]}


@pytest.mark.unit
def test_garbage_and_huge_line_do_not_break_analysis(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "rank-0.log"
    src = (EXAMPLES / "megatron-nan" / "rank-0.log").read_bytes()
    head, tail = src[: len(src) // 2], src[len(src) // 2 :]
    cut = head.rfind(b"\n") + 1
    log.write_bytes(
        head[:cut] + b"\xff\xfe\x00garbage\x1b[31m\n" + b"x" * (3 << 20) + b"\n" + head[cut:] + tail
    )
    code, doc = run_json(capsys, str(log))
    assert code == 1
    assert doc["ranks"][0]["last_step"] == 1330
    assert any(f["kind"] == "nan_loss" for f in doc["findings"])


@pytest.mark.unit
def test_srun_label_prefixes_split_one_file_into_ranks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = []
    for i in range(1, 40):
        for r in range(2):
            loss = "nan" if (r == 1 and i >= 30) else f"{2.0 - i * 0.01:.3f}"
            lines.append(f"{r}: step={i} loss={loss} lr=1e-4")
    (tmp_path / "slurm-99.out").write_text("\n".join(lines) + "\n")
    code, doc = run_json(capsys, str(tmp_path / "slurm-99.out"))
    assert code == 1
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    nan = [f for f in doc["findings"] if f["kind"] == "nan_loss"]
    assert [(f["rank"], f["step"]) for f in nan] == [(1, 30)]


@pytest.mark.process
def test_python_dash_m_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="80"),
    )
    assert out.returncode == 0
    for cmd in ("analyze", "run", "watch", "demo", "config", "dumps", "checkpoints"):
        # one line each, even on an 80-column terminal
        (line,) = [x for x in out.stdout.splitlines() if x.strip().startswith(cmd + " ")]
        assert len(line) <= 80 and len(line.split(None, 1)[1]) > 20, line
    ver = subprocess.run(
        [sys.executable, "-m", "rankwatch", "--version"], capture_output=True, text=True, timeout=60
    )
    assert ver.stdout.startswith("rankwatch ")


@pytest.mark.unit
def test_unrecognised_input_is_exit_2_naming_the_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    binary = tmp_path / "model.bin.log"
    binary.write_bytes(bytes(range(256)) * 64)
    prose = tmp_path / "notes.txt"
    prose.write_text("meeting notes\nnothing about training here\n")
    for args in ([str(binary)], ["--json", str(binary), str(prose)]):
        assert main(["analyze", *args]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "no training records or error lines recognised" in captured.err
        assert str(binary) in captured.err


@pytest.mark.unit
def test_unrecognised_file_among_good_ones_is_exit_neutral(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Megatron prints iterations on the last rank only: a file without step lines is normal.
    quiet = tmp_path / "rank-2.log"
    quiet.write_text("gpu-node01:41200:41260 [0] NCCL INFO Connected all trees\nusing world size: 4\n")
    good = EXAMPLES / "healthy-nanogpt"
    assert main(["analyze", "--no-color", str(good), str(quiet)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "rank-2.log" in x)
    assert line.endswith("no training records recognised (format unknown)")
    assert "no findings: the run looks healthy" in out


MEG_ITER = (
    " [2024-05-01 10:{m:02d}:{s:02d}] iteration {i:>8}/  500000 | consumed samples: {c:>12} | "
    "elapsed time per iteration (ms): 1234.5 | learning rate: 3.000000E-04 | global batch size:   128 | "
    "lm loss: {loss:.6E} | "
    "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)
WATCHDOG = (
    "[rank{r}]:[E ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=4021, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 "
    "milliseconds before timing out."
)


@pytest.mark.unit
def test_lagging_rank_is_listed_before_the_timeouts_it_caused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for r in range(3):
        lines = [
            MEG_ITER.format(m=i // 60, s=i % 60, i=i * 10, c=i * 1280, loss=6.0 - i * 0.01)
            for i in range(1, 30)
        ]
        if r < 2:
            lines.append(WATCHDOG.format(r=r))
        (tmp_path / f"rank-{r}.log").write_text("\n".join(lines) + "\n")
    code, doc = run_json(capsys, str(tmp_path))
    assert code == 1
    crit = [(f["kind"], f["rank"]) for f in doc["findings"] if f["severity"] == "critical"]
    assert crit[0] == ("rank_lagging", 2), crit
    assert {("nccl_timeout", 0), ("nccl_timeout", 1)} <= set(crit[1:])
    assert main(["analyze", "--no-color", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.index("rank_lagging") < out.index("nccl_timeout")


@pytest.mark.process
def test_files_in_worker_processes_give_the_same_answer(tmp_path: Path) -> None:
    """-j N: per-file work in spawned workers, cross-rank findings after: identical output."""
    from rankwatch.analyze import analyze
    from rankwatch.config.schema import Config

    logs = sorted((Path(__file__).resolve().parent.parent / "examples" / "megatron-nan").glob("rank-*.log"))
    serial = analyze([str(p) for p in logs], Config(), jobs=1).to_json()
    parallel = analyze([str(p) for p in logs], Config(), jobs=2).to_json()
    assert parallel == serial
    assert any(f["kind"] == "nan_loss" for f in serial["findings"])


@pytest.mark.unit
def test_jobs_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    from rankwatch.cli import main

    log = Path(__file__).resolve().parent.parent / "examples" / "hf-oom" / "train.log"
    assert main(["analyze", "-j", "0", str(log)]) == 2
    assert "--jobs must be 1 or more" in capsys.readouterr().err


@pytest.mark.process
def test_nan_dict_glued_to_an_nccl_info_line_is_found(tmp_path: Path) -> None:
    """analyze skips NCCL INFO chatter unseen, but not a step dict that block-buffered stdout
    glued onto such a line."""
    lines = [f"{{'loss': {2.0 - i / 100:.4f}, 'grad_norm': 0.5, 'learning_rate': 1e-4, 'epoch': 0.{i:02d}}}"
             for i in range(30)]  # fmt: skip
    lines.append("gpu1:123:456 [0] NCCL INFO Connected all trees{'loss': 'nan', 'grad_norm': 'nan', "
                 "'learning_rate': 1e-4, 'epoch': 0.31}")  # fmt: skip
    p = tmp_path / "rank-0.log"
    p.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "analyze", "--json", str(p)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    doc = json.loads(out.stdout)
    assert out.returncode == 1, out.stdout
    assert [f["line"] for f in doc["findings"] if f["kind"] == "nan_loss"] == [31]


@pytest.mark.process
def test_counted_hf_steps_are_said_to_be_counted(tmp_path: Path) -> None:
    """Without its progress bar an HF log has no step numbers: a finding must not present the
    count of logged dicts as the trainer's step."""
    lines = [f"{{'loss': {2.0 - i / 100:.4f}, 'grad_norm': 0.5, 'learning_rate': 1e-4, 'epoch': 0.{i:02d}}}"
             for i in range(30)]  # fmt: skip
    lines.append("{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': 1e-4, 'epoch': 0.31}")
    p = tmp_path / "rank-0.log"
    p.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "rankwatch", "analyze", "--json", str(p)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    (nan,) = [f for f in json.loads(out.stdout)["findings"] if f["kind"] == "nan_loss"]
    assert nan["step"] == 31 and "counted log records" in nan["message"]


TORCHRUN = Path(__file__).resolve().parent / "data" / "torchrun"


def _ranks_by_file(doc: dict, root: Path) -> dict[str, int | None]:
    return {str(Path(r["path"]).relative_to(root)): r["rank"] for r in doc["ranks"]}


@pytest.mark.unit
def test_torchrun_log_dir_layout_takes_ranks_from_the_worker_folders(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """torchrun ``--redirects 3 --log-dir D`` (a real torch 2.13 job, rank 1 raising a CUDA OOM
    at step 12): ``D/<run>/attempt_0/<local rank>/{stdout,stderr}.log``. Each folder is one
    worker, whose stdout.log (steps, no prefixes) is its rank as much as its stderr.log."""
    root = TORCHRUN / "redirects_oom"
    files = sorted(str(p) for p in root.glob("*/attempt_0/*/*.log"))
    code, doc = run_json(capsys, *files)
    check_contract(doc)
    assert code == 1
    ranks = {k.split("/attempt_0/")[1]: v for k, v in _ranks_by_file(doc, root).items()}
    assert ranks == {"0/stderr.log": 0, "0/stdout.log": 0, "1/stderr.log": 1, "1/stdout.log": 1}
    crit = [(f["kind"], f["rank"]) for f in doc["findings"] if f["severity"] == "critical"]
    assert crit[:2] == [("rank_lagging", 1), ("oom", 1)], crit
    first = doc["findings"][0]
    # The worker's traceback is in its stderr.log; its steps in its stdout.log.
    assert first["path"].endswith("/1/stderr.log") and first["step"] == 11, first
    assert "lost peers on rank(s) 0 are" in first["message"], first["message"]


@pytest.mark.unit
def test_torchrun_worker_folder_of_a_second_node_takes_the_rank_its_lines_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On node rank 1 the worker folder ``0/`` holds global rank 1 (a real two-node torchrun job
    on one host, ``--redirects 3 --log-dir``, rank 1 raising at step 4): the ``[rank1]:`` lines of
    its stderr.log say so, and its stdout.log, which names no rank, follows them."""
    root = TORCHRUN / "two_nodes_crash"
    files = sorted(str(p) for p in root.glob("n*/*/attempt_0/*/*.log"))
    code, doc = run_json(capsys, *files)
    assert code == 1
    ranks = {
        k.split("/")[0] + ":" + k.split("/attempt_0/")[1]: v for k, v in _ranks_by_file(doc, root).items()
    }
    assert ranks == {"n0:0/stderr.log": 0, "n0:0/stdout.log": 0, "n1:0/stderr.log": 1, "n1:0/stdout.log": 1}
    first = doc["findings"][0]
    assert (first["kind"], first["rank"]) == ("rank_lagging", 1), doc["findings"]
    assert first["path"].startswith(str(root / "n1")) and first["step"] == 3, first


@pytest.mark.unit
@pytest.mark.parametrize(
    ("path", "rank", "local", "worker"),
    [
        ("D/run_x1/attempt_0/3/stdout.log", 3, 3, "D/run_x1/attempt_0/3"),
        ("D/run_x1/attempt_2/0/stderr.log.gz", 0, 0, "D/run_x1/attempt_2/0"),
        ("D/run_x1/attempt_0/3/rank-7.log", 7, None, None),  # the file's own name wins
        ("D/run_x1/attempt_0/3/error.json", 5, None, None),  # not a log: numbered by position
        ("D/run_x1/attempts/3/stdout.log", 5, None, None),
        ("D/run_x1/attempt_0/x3/stdout.log", 5, None, None),
    ],
)
def test_place_of_a_log_file(path: str, rank: int, local: int | None, worker: str | None) -> None:
    from rankwatch.sources.logfiles import log_place

    place = log_place(path, 5)
    assert (place.rank, place.local_rank, place.worker) == (rank, local, worker)


@pytest.mark.unit
def test_rotated_backups_are_read_as_the_one_log_they_were(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``analyze train.log*`` on a RotatingFileHandler's files (s39 k53): the backups and the
    live file are one stream, oldest first, so a NaN that began in ``.log.1`` has one onset,
    told with its own file and line, not an onset per file. The log is a real one (mp.spawn,
    two ranks, NaN from step 15 on rank 1), cut where a rotation would cut it."""
    real = REPO / "tests/data/blackbox/s35b/repro/d28_spawn_nan.log"
    lines = real.read_text().splitlines(keepends=True)
    log = tmp_path / "train.log"
    (tmp_path / "train.log.2").write_text("".join(lines[:20]))
    (tmp_path / "train.log.1").write_text("".join(lines[20:40]))
    log.write_text("".join(lines[40:]))
    code, whole = run_json(capsys, str(real))
    code2, doc = run_json(capsys, str(tmp_path / "train.log.2"), str(log), str(tmp_path / "train.log.1"))
    assert code == code2 == 1
    onsets = sorted((f["rank"], f["step"], f["line"]) for f in whole["findings"] if f["kind"] == "nan_loss")
    got = [f for f in doc["findings"] if f["kind"] == "nan_loss"]
    assert sorted((f["rank"], f["step"], f["line"] + 20) for f in got) == onsets, got
    assert {f["path"] for f in got} == {str(tmp_path / "train.log.1")}, got
    assert [r["path"] for r in doc["ranks"]] == [str(log)] * len(doc["ranks"]), doc["ranks"]


@pytest.mark.unit
def test_numbered_files_without_their_log_are_files_of_their_own() -> None:
    """Slurm's ``-o train.%t`` names a file per task (``train.0``, ``train.1``): no rotation."""
    from rankwatch.analyze import rotation_chains

    assert rotation_chains(["train.0", "train.1"]) == [("train.0", ()), ("train.1", ())]
    assert rotation_chains(["a.log.1", "a.log", "a.log.3.gz", "b.log.1"]) == [
        ("a.log", ("a.log.3.gz", "a.log.1")),
        ("b.log.1", ()),
    ]


@pytest.mark.unit
def test_an_eval_loss_nan_at_every_eval_is_one_finding_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    """The eval loss NaN from step 15 on, the training loss finite between evals (s39 k28, a
    real torchrun --tee run): the finite training lines do not clear the eval's NaN, so it is
    one finding per rank, not a fire and a clear at every eval."""
    code, doc = run_json(capsys, str(REPO / "tests/data/torchrun/eval_nan_every_eval.log"))
    assert code == 1
    nan = [(f["rank"], f["step"]) for f in doc["findings"] if f["kind"] == "nan_loss"]
    assert sorted(nan) == [(0, 15), (1, 15)], doc["findings"]
    assert all("eval" in f["message"] for f in doc["findings"] if f["kind"] == "nan_loss")


@pytest.mark.unit
def test_torchrun_role_prefixes_name_the_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    """``torchrun --role trainer --tee 3`` prefixes each line ``[trainer1]:`` (s40 l01, a real
    run): the NaN is rank 1's at step 15, rank 0's follows at 16 through DDP, and no rank is
    read twice (no loss_divergence made of doubled records)."""
    code, doc = run_json(capsys, str(REPO / "tests/data/torchrun/role_trainer_nan.log"))
    assert code == 1
    got = sorted((f["kind"], f["rank"], f["step"]) for f in doc["findings"])
    assert got == [("nan_loss", 0, 16), ("nan_loss", 1, 15)], doc["findings"]


@pytest.mark.unit
def test_a_rich_bar_whose_metrics_wrap_onto_the_next_line_is_read_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Lightning's RichProgressBar beside a CSVLogger (s40 l31, a real run): ``v_num`` fills the
    bar's line and Rich wraps ``train_loss: nan`` onto the next one; the NaN is the bar's."""
    code, doc = run_json(capsys, str(REPO / "tests/data/lightning/rich_bar_wrapped_nan.log"))
    assert code == 1
    assert [(f["kind"], f["step"]) for f in doc["findings"]] == [("nan_loss", 40)], doc["findings"]


@pytest.mark.unit
def test_ranks_marked_by_the_script_are_told_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """Every accelerate process prints "[rank r] step N | loss X" into the one pipe (s40 l32 and
    l33, real runs, some records glued on one line): rank 2's NaN at step 10 comes first, each
    rank's steps are its own; the healthy run's noisy start (rank 0: 1.45, then 11.2 .. 4.9 and
    back at 1.9) is no loss spike."""
    code, doc = run_json(capsys, str(REPO / "tests/data/accelerate/marked_ranks_nan_rank2.log"))
    assert code == 1
    got = sorted((f["kind"], f["rank"], f["step"]) for f in doc["findings"])
    assert got == [("nan_loss", 0, 11), ("nan_loss", 1, 11), ("nan_loss", 2, 10)], doc["findings"]
    assert sorted((r["rank"], r["steps"]) for r in doc["ranks"]) == [(0, 30), (1, 30), (2, 30)]
    code, doc = run_json(capsys, str(REPO / "tests/data/accelerate/marked_ranks_healthy.log"))
    assert (code, doc["findings"]) == (0, []), doc["findings"]


@pytest.mark.unit
def test_a_tqdm_count_drawn_twice_is_one_step_with_its_last_drawing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real tqdm bar on a --redirects worker's stderr.log (s40 l49), ``update(1)`` then
    ``set_postfix(loss=...)``: each count is drawn first with the step before's loss, then its
    own. One step per count (30, not 74), its own loss: no loss_divergence on the healthy rank 0
    made of the doubled drawings, and each rank's NaN at its step."""
    tree = REPO / "tests/data/torchrun/redirects_tqdm_nan"
    code, doc = run_json(capsys, *sorted(str(p) for p in tree.glob("*/attempt_0/*/*.log")))
    assert code == 1
    assert {(f["kind"], f["rank"], f["step"]) for f in doc["findings"]} == {
        ("nan_loss", 0, 16),
        ("nan_loss", 1, 15),
    }
    assert all(r["steps"] == 30 for r in doc["ranks"]), doc["ranks"]
