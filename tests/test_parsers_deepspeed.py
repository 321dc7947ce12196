"""DeepSpeed tells one step on two or three lines: one StepRecord per step all the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.records import Record, StepRecord
from rankwatch.sources.logparser import LogParser
from rankwatch.sources.parsers.base import LogLine
from rankwatch.sources.parsers.deepspeed import DeepSpeedParser

pytestmark = pytest.mark.unit

GIB = 1 << 30


def ds_lines(steps: range, *, timer: bool = True) -> list[str]:
    out = []
    for i, step in enumerate(steps):
        ts = f"[2024-09-15 00:{13 + i // 60:02d}:{i % 60:02d},261]"
        out.append(
            f"{ts} [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped=0, lr=[1.000000e-04], "
            "mom=[(0.9, 0.999)]"
        )
        if timer:
            out.append(
                f"{ts} [INFO] [timer.py:260:stop] epoch=0/micro_step={step}/global_step={step}, "
                "RunningAvgSamplesPerSec=12.30, CurrSamplesPerSec=12.5, MemAllocated=4.5GB, "
                "MaxMemAllocated=6.7GB"
            )
        out.append("gpu-node01:41200:41260 [0] NCCL INFO Connected all trees")
    return out


def steps_of(recs: list[Record]) -> list[StepRecord]:
    return [r for r in recs if isinstance(r, StepRecord)]


def test_step_and_timer_lines_are_one_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("\n".join(ds_lines(range(10, 70, 10))) + "\n")
    assert main(["analyze", "--json", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ranks"][0]["steps"], doc["ranks"][0]["last_step"]) == (6, 60)


def test_merged_record_has_the_fields_of_both_lines() -> None:
    parser = LogParser(default_rank=0)
    recs: list[Record] = []
    for i, line in enumerate(ds_lines(range(10, 40, 10)), 1):
        recs.extend(parser.feed(line, i))
    recs.extend(parser.finish())
    s = steps_of(recs)
    assert [(r.step, r.line) for r in s] == [(10, 1), (20, 4), (30, 7)]
    assert all(r.learning_rate == 1e-4 and r.skipped_iters == 0 for r in s)
    assert all(r.samples_per_s == 12.5 and r.memory_bytes == pytest.approx(4.5 * GIB) for r in s)


def test_step_lines_without_timer_are_all_counted() -> None:
    parser = LogParser(default_rank=0)
    recs: list[Record] = []
    for i, line in enumerate(ds_lines(range(10, 40, 10), timer=False), 1):
        recs.extend(parser.feed(line, i))
    assert [r.step for r in steps_of(recs)] == [10, 20], "held until a line about another step"
    assert [r.step for r in steps_of(parser.release_pending())] == [30], "a quiet stream hands it out"
    assert parser.finish() == []


def test_a_late_timer_line_does_not_count_the_step_again() -> None:
    lines = ds_lines(range(10, 11))
    late = [lines[0], *(["[INFO] some other output"] * 12), lines[1]]
    parser = DeepSpeedParser()
    recs = [r for i, t in enumerate(late, 1) for r in parser.parse(LogLine(t, i))] + parser.finish()
    (rec,) = steps_of(recs)
    assert rec.step == 10 and rec.samples_per_s == 12.5  # the late fields still land on it


def test_a_loss_is_never_held_back() -> None:
    # The pipeline engine's line carries the loss: a NaN must reach the detectors at once.
    parser = DeepSpeedParser()
    first = parser.parse(LogLine("[Rank 0] step=30, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]", 1))
    got = parser.parse(LogLine("steps: 30 loss: nan iter time (s): 0.498 samples/sec: 257.000", 2))
    assert first == []
    (rec,) = steps_of(got)
    assert rec.step == 30 and rec.loss != rec.loss and rec.learning_rate == 1e-4
    assert parser.finish() == []


DSCHAT = Path(__file__).resolve().parent / "data" / "wild" / "batch3" / "dschat_step2_reward_opt350m.log"


def test_each_ranks_copy_of_one_reduction_is_one_overflow() -> None:
    # DeepSpeedExamples DeepSpeed-Chat step2 opt-350m log, lines 1036-1078: the ranks' scalers
    # each print "Grad overflow on iteration 565" and "Reducing dynamic loss scale from 16.0 to
    # 8.0" (16 copies), unprefixed and interleaved; DeepSpeed's own counter: skipped=16 -> 17.
    from rankwatch.records import OverflowRecord

    lines = DSCHAT.read_text().splitlines()
    assert sum("Reducing dynamic loss scale from 16.0 to 8.0" in t for t in lines[1035:1078]) == 16
    p = LogParser()
    recs = [r for i, t in enumerate(lines) for r in p.feed(t, i + 1)]
    ovf = [r for r in recs if isinstance(r, OverflowRecord)]
    assert [(r.old_scale, r.new_scale) for r in ovf if r.old_scale == 16.0] == [(16.0, 8.0)]
    # 17 skipped steps in DeepSpeed's counter: 10 start-up halvings (65536 -> 64) and 7 later.
    assert len(ovf) == 17
    # The scaler's growth lines ("Increasing dynamic loss scale from 8.0 to 16.0") give the
    # step lines after them their scale.
    grown = [(r.step, r.loss_scale) for r in steps_of(recs) if r.loss_scale is not None]
    assert grown[-1] == (1370, 2048.0)


# https://github.com/deepspeedai/DeepSpeedExamples/issues/307 (DeepSpeed-Chat step 3: the fused
# optimizer's scaler at its floor, then the PPO record with a NaN actor loss)
DSCHAT_307 = [
    "[2023-04-15 05:51:04,058] [INFO] [fused_optimizer.py:362:_update_scale]",
    "Grad overflow on iteration 1860",
    "[2023-04-15 05:51:04,058] [INFO] [fused_optimizer.py:363:_update_scale] "
    "Reducing dynamic loss scale from 1 to 1",
    "[2023-04-15 05:51:04,058] [INFO] [logging.py:96:log_dist] [Rank 0] Overflow detected. Skipping step. "
    "Attempted loss scale: 1, reducing to 1",
    "epoch: 0|step: 3721|ppo_ep: 1|act_loss: nan|cri_loss: nan|unsuper_loss: 0.0",
]


def test_a_trainers_own_records_under_deepspeed_are_read_by_the_general_reader() -> None:
    parser = LogParser()
    recs = [r for i, x in enumerate(DSCHAT_307, 1) for r in parser.feed(x, i)]
    s = steps_of(recs)
    assert [r.step for r in s] == [3721] and s[0].loss is not None and s[0].loss != s[0].loss


def test_a_reduction_from_the_floor_to_the_floor_is_a_loss_scale_collapse() -> None:
    from rankwatch.records import ErrorRecord

    parser = LogParser()
    recs = [r for i, x in enumerate(DSCHAT_307[:4], 1) for r in parser.feed(x, i)]
    errs = [r for r in recs if isinstance(r, ErrorRecord)]
    assert [(e.kind, e.line, e.details["loss_scale"]) for e in errs] == [("loss_scale_collapse", 3, 1.0)]
    # A reduction that lowers the scale is calibration; the "Attempted ... reducing to" form with
    # equal scales is printed during hysteresis too: neither is a collapse by itself.
    for line in (
        "[2023-12-11 16:39:34,450] [INFO] [fused_optimizer.py:345:_update_scale] Reducing dynamic loss scale "
        "from 65536 to 32768.0",
        "[2021-11-27 00:36:54,800] [INFO] [stage2.py:1628:step] [deepscale] OVERFLOW! Rank 0 Skipping step. "
        "Attempted loss scale: 1, reducing to 1",
    ):
        assert not [r for r in LogParser().feed(line, 1) if isinstance(r, ErrorRecord)]
