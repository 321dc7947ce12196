# ruff: noqa: E501  (real log lines are kept whole)
"""Issue 27: the general reader, errors read for their step and rank, detectors on a short
history. Every log line here is a real one, copied from the public place named beside it (a
line the public copy cut is dropped; nothing else is changed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rankwatch.analyze import Analysis, analyze, diagnose
from rankwatch.cli import main
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.records import ErrorRecord, EvalRecord, Severity, StepRecord
from rankwatch.sources.logparser import LogParser
from rankwatch.sources.suggest import draft_pattern

pytestmark = pytest.mark.unit


def run(tmp_path: Path, text: str, name: str = "job.log", cfg: Config | None = None) -> Analysis:
    p = tmp_path / name
    p.write_text(text.strip("\n") + "\n")
    return analyze([str(p)], cfg or Config(), jobs=1)


def records(text: str) -> list[object]:
    parser = LogParser()
    out: list[object] = []
    for i, line in enumerate(text.strip("\n").splitlines(), 1):
        out.extend(parser.feed(line, i))
    out.extend(parser.finish())
    return out


def steps(text: str) -> list[StepRecord]:
    return [r for r in records(text) if isinstance(r, StepRecord)]


def serious(result: Analysis) -> list[tuple[str, int | None, int | None]]:
    return [(f.kind, f.rank, f.step) for f in result.findings if f.severity >= Severity.WARNING]


# ---------------------------------------------------------------- the reader

# https://github.com/facebookresearch/d2go/issues/524 (detectron2's d2.utils.events writer)
D2 = """
[04/05 01:30:24 d2.utils.events]:  eta: 0:03:35  iter: 19  total_loss: 1.36  loss_cls: 0.6522  loss_box_reg: 0.5817  loss_rpn_cls: 0.07138  loss_rpn_loc: 0.003773  time: 0.3636  data_time: 0.1102  lr: 3.8077e-06  max_mem: 433M
[04/05 01:30:31 d2.utils.events]:  eta: 0:03:14  iter: 39  total_loss: 1.353  loss_cls: 0.6354  loss_box_reg: 0.637  loss_rpn_cls: 0.0653  loss_rpn_loc: 0.00412  time: 0.3633  data_time: 0.0641  lr: 7.5527e-06  max_mem: 433M
[04/05 01:30:35 d2.utils.events]:  eta: 0:02:45  iter: 59  total_loss: 1.329  loss_cls: 0.6168  loss_box_reg: 0.5782  loss_rpn_cls: 0.08931  loss_rpn_loc: 0.006219  time: 0.3147  data_time: 0.0555  lr: 1.1298e-05  max_mem: 433M
"""


def test_detectron2_events_take_the_total_loss_not_a_part() -> None:
    s = steps(D2)
    assert [(r.step, r.loss, r.learning_rate) for r in s] == [
        (19, 1.36, 3.8077e-06),
        (39, 1.353, 7.5527e-06),
        (59, 1.329, 1.1298e-05),
    ]


def test_mmengine_padded_iteration_fields(tmp_path: Path) -> None:
    """https://github.com/open-mmlab/mmdetection/issues/11893: the NaN at iteration 500 of 2931."""
    line = (
        "08/03 22:09:24 - mmengine - INFO - Epoch(train)  [1][ 500/2931]  lr: 2.0000e-02  eta: 0:39:15  "
        "time: 0.0578  data_time: 0.0017  memory: 2389  loss: nan  loss_rpn_cls: nan  loss_rpn_bbox: nan  "
        "loss_cls: nan  acc: 0.0000  loss_bbox: nan"
    )
    assert serious(run(tmp_path, line)) == [("nan_loss", 0, 500)]


# https://github.com/ultralytics/ultralytics/issues/21765 (YOLOv8 table, tqdm bar behind each row)
YOLOV8 = """
      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size
       9/55      9.02G     0.1295      7.585      3.256         16        640: 100%|██████████| 954/954 [11:32<00:00,  1.38it/s]
                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95): 100%|██████████| 66/66 [00:37<00:00,  1.74it/s]
                   all       1049       1164      0.764      0.776      0.739      0.526

      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size
      10/55      9.02G     0.1271      7.321      3.224         12        640: 100%|██████████| 954/954 [11:25<00:00,  1.39it/s]
"""
# https://github.com/ultralytics/yolov5/issues/4963 (early YOLOv5: box obj cls columns)
YOLOV5 = """
 Epoch   gpu_mem       box       obj       cls    labels  img_size
      1/99     2.64G         nan       nan       nan         4       416: 100%|██████████| 7/7 [00:15<00:00,  2.27s/it]
               Class     Images     Labels          P          R     mAP@.5 mAP@.5:.95: 100%|██████████| 1/1 [00:01<00:00,  1.30s/it]
"""


def test_ultralytics_tables_under_a_header(tmp_path: Path) -> None:
    s = steps(YOLOV8)
    assert [(r.step, r.total_steps) for r in s] == [(9, 55), (10, 55)]
    assert s[0].loss == pytest.approx(0.1295 + 7.585 + 3.256)  # the parts, summed: no total is written
    assert serious(run(tmp_path, YOLOV5)) == [("nan_loss", 0, 1)]


def test_timm_train_lines() -> None:
    """https://github.com/huggingface/pytorch-image-models/issues/814 (timm train.py)."""
    text = """
Train: 1 [ 350/5004 (  7%)]  Loss:  6.732388 (6.8414)  Time: 1.271s,  201.43/s  (0.608s,  420.96/s)  LR: 2.133e-02  Data: 1.056 (0.403)
Train: 1 [ 400/5004 (  8%)]  Loss:  6.717005 (6.8258)  Time: 0.214s, 1197.18/s  (0.608s,  421.14/s)  LR: 2.133e-02  Data: 0.013 (0.402)
"""
    s = steps(text)
    # epoch x (last index + 1) + batch index: timm prints the last index of the epoch.
    assert [(r.step, r.loss, r.learning_rate) for r in s] == [
        (5005 + 350, 6.732388, 2.133e-02),
        (5005 + 400, 6.717005, 2.133e-02),
    ]


def test_litgpt_takes_the_optimizer_step_not_the_iteration() -> None:
    """https://github.com/Lightning-AI/litgpt/issues/1110 (finetune lora): sniffed as key-value
    with 0 steps before issue 27."""
    text = """
Epoch 4 | iter 961 step 961 | loss train: 1.062, val: 1.057 | iter time: 529.46 ms (step)
Epoch 4 | iter 962 step 962 | loss train: 0.937, val: 1.057 | iter time: 503.53 ms (step)
Epoch 5 | iter 965 step 965 | loss train: 1.182, val: 1.057 | iter time: 743.31 ms (step)
Training time: 583.36s
"""
    s = steps(text)
    assert [(r.step, r.loss) for r in s] == [(961, 1.062), (962, 0.937), (965, 1.182)]
    assert s[0].step_time_s == pytest.approx(0.52946)
    # https://github.com/Lightning-AI/litgpt/issues/1224: gradient accumulation, step 1 of many iters.
    acc = "Epoch 1 | iter 46 step 1 | loss train: 3.724, val: n/a | iter time: 45.73 ms\n"
    assert [(r.step, r.loss) for r in steps(acc)] == [(1, 3.724)]


def test_torchtune_multinode_bar(tmp_path: Path) -> None:
    """https://github.com/meta-pytorch/torchtune/pull/2620: "[trainer0|0]:" names global rank 0;
    epoch | global step | loss, redrawn by tqdm."""
    text = """
[trainer0|0]:1|25|Loss: 1.2621808052062988:  26%|██▌       | 26/101 [06:45<17:27, 13.96s/it]
[trainer0|0]:1|26|Loss: 1.2436443567276:  26%|██▌       | 26/101 [06:45<17:27, 13.96s/it]   [trainer0|0]:
[trainer0|0]:1|26|Loss: 1.2436443567276:  27%|██▋       | 27/101 [07:00<17:31, 14.21s/it]
[trainer0|0]:1|27|Loss: 1.1958776712417603:  27%|██▋       | 27/101 [07:00<17:31, 14.21s/it][trainer0|0]:
"""
    res = run(tmp_path, text)
    assert [(r.rank, r.format, r.steps, r.last_step) for r in res.ranks] == [(0, "kv", 3, 27)]


def test_dllogger_training_iteration() -> None:
    """https://github.com/NVIDIA/DeepLearningExamples/issues/1107 (BERT, DLLogger stdout)."""
    text = """
DLL 2022-04-05 02:22:54.614486 - Training Epoch: 1 Training Iteration: 2872  step_loss : 0.6953772306442261  learning_rate : 1.5844598709048836e-05
DLL 2022-04-05 02:23:00.608205 - Training Epoch: 1 Training Iteration: 2922  step_loss : 2.592996120452881  learning_rate : 1.5540129095116308e-05
"""
    assert [(r.step, r.loss) for r in steps(text)] == [(2872, 0.6953772306442261), (2922, 2.592996120452881)]


def test_torchvision_metric_logger() -> None:
    """https://github.com/pytorch/vision/issues/4086 (references/classification MetricLogger)."""
    text = (
        "Epoch: [0]  [   10/40037]  eta: 6:56:59  lr: 0.1  img/s: 120.38295738808868  loss: 22.6492 (28.1895)  "
        "acc1: 0.0000 (0.0000)  acc5: 0.0000 (0.5682)  time: 0.6251  data: 0.1307  max mem: 7117"
    )
    assert [(r.step, r.loss, r.learning_rate) for r in steps(text)] == [(10, 22.6492, 0.1)]


# code index file id 44493781509 (a public repository's README, PI2NLI): Lightning's rich bar
# with max_steps and no max_epochs prints "Epoch 0/-2".
RICH = """
Total estimated model params size (MB): 1.4 K
Epoch 0/-2 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 191/191 0:01:23 • 0:00:00 2.26it/s v_num: 3szp train_step_loss: 0.400 Metric val_f1 improved. New best score: 0.931
"""


def test_lightning_rich_bar_without_max_epochs_in_analyze_and_live(tmp_path: Path) -> None:
    res = run(tmp_path, RICH)
    assert [(r.format, r.steps, r.last_step, r.total_steps) for r in res.ranks] == [
        ("lightning", 1, 191, None)
    ]
    # Live: the bar is written once at the end; an idle stream hands its held step out.
    parser = LogParser()
    got: list[object] = []
    for i, line in enumerate(RICH.strip().splitlines(), 1):
        got.extend(parser.feed(line, i))
    got.extend(parser.release_pending())
    assert [(r.step, r.loss) for r in got if isinstance(r, StepRecord)] == [(191, 0.4)]


def test_lightning_rich_bar_with_no_length_reads_nan() -> None:
    """code index file id 2581728945: an iterable without a length ("5072/--")."""
    line = "Epoch 0/-2 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 5072/-- 2:40:43 • -:--:-- 0.57it/s v_num: xn3p train_loss: nan"
    s = steps(line)
    assert len(s) == 1 and s[0].step == 5072 and s[0].loss is not None and math.isnan(s[0].loss)


# code index file id 63488297244 (an sglang debugging note): a py-spy dump pasted into a log.
PYSPY = """
Process 165: sglang::data_parallel_controller
Python v3.12.3 (/usr/bin/python3.12)

Thread 165 (active+gil): "MainThread"
    recv_pyobj (zmq/sugar/socket.py:989)
    event_loop (data_parallel_controller.py:273)
    run_data_parallel_controller_process (data_parallel_controller.py:310)
    run (multiprocessing/process.py:108)
"""


def test_a_pyspy_dump_is_recognised_but_is_no_training_record(tmp_path: Path) -> None:
    res = run(tmp_path, PYSPY)
    assert res.recognised_any and res.exit_code() == 0
    assert [(f.kind, f.severity) for f in res.findings] == [("stack_dump", Severity.INFO)]


def test_ray_worker_prefix_is_stripped() -> None:
    """https://github.com/alibaba/ROLL/issues/193: Ray's "(ActorWorker(...) pid=..., ip=...)" prefix."""
    text = (
        "(ActorWorker(actor_train-1) pid=18175, ip=33.199.184.82)   File "
        '"/checkpoint/binary/train_package/roll/pipeline/base_worker.py", line 104, in train_step'
    )
    from rankwatch.sources.decorations import strip

    assert strip(text)[0].startswith('  File "/checkpoint')


# ---------------------------------------------------------------- when nothing is read


def test_nothing_read_says_why_and_drafts_a_pattern_that_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A format forced wrongly (logs.format: megatron on detectron2's lines) reads nothing: the
    diagnosis names the lines that looked like records, and its drafted regex reads them."""
    path = tmp_path / "d2.log"
    path.write_text(D2.strip() + "\n")
    [(_, d)] = diagnose([str(path)], Config())
    assert d.candidates == 3 and d.pattern is not None
    assert "line 1:" in d.render() and "logs.regex" in d.render()
    assert main(["analyze", "--suggest-pattern", str(path)]) == 0
    pattern = capsys.readouterr().out.strip()
    assert pattern == d.pattern
    res = main(
        ["analyze", "--json", "--set", "logs.format=regex", "--set", f"logs.regex={pattern}", str(path)]
    )
    assert res == 0
    forced = main(["analyze", "--set", "logs.format=megatron", str(path)])
    assert forced == 2 and "3 of its 3 lines looked like records" in capsys.readouterr().err


def test_drafted_pattern_names_its_groups_by_meaning() -> None:
    """https://github.com/lucidrains/vit-pytorch/issues/35."""
    line = "Epoch : 1/20 - Iter : 6519/6672 - Iter loss : 27.8335 - Iter acc: 0.0000 - Num correct: 0"
    pattern = draft_pattern(line)
    assert pattern is not None and "(?P<loss>" in pattern


def test_an_unreadable_log_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.log"
    path.write_text("Loading data...\nall done\n")
    assert main(["analyze", str(path)]) == 2
    assert "none of its 2 lines names a number with a metric word" in capsys.readouterr().err


# ---------------------------------------------------------------- errors: step and rank

# https://github.com/facebookresearch/detectron2/issues/838
D2_NAN = """
ERROR [02/10 22:55:41 d2.engine.train_loop]: Exception during training:
Traceback (most recent call last):
  File "/home/yview/work/ai/outside/pytorch/detectron2/detectron2/engine/train_loop.py", line 132, in train
    self.run_step()
  File "/home/yview/work/ai/outside/pytorch/detectron2/detectron2/engine/train_loop.py", line 239, in _detect_anomaly
    self.iter, loss_dict
FloatingPointError: Loss became infinite or NaN at iteration=2137!
"""


def test_detectron2_nan_is_nan_loss_at_its_iteration(tmp_path: Path) -> None:
    assert serious(run(tmp_path, D2_NAN)) == [("nan_loss", 0, 2137)]


def test_megatron_nan_grad_norm_names_its_rank(tmp_path: Path) -> None:
    """https://github.com/alibaba/Pai-Megatron-Patch/issues/366 (the issue's title line)."""
    text = (
        "AssertionError: Rank 11: found NaN in local grad norm in backward pass before data-parallel "
        "communication collective. Device: 3"
    )
    recs = [r for r in records(text) if isinstance(r, ErrorRecord)]
    assert [(r.kind, r.rank) for r in recs] == [("nan_loss", 11)]


def test_torchelastic_failure_line_names_the_local_rank(tmp_path: Path) -> None:
    """https://github.com/showlab/EgoVLP/issues/21."""
    text = (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: 407727) "
        "of binary: /fs/nexus-scratch/sanjoyc/anaconda/envs/egovlp/bin/python"
    )
    res = run(tmp_path, text)
    assert [(f.kind, f.rank) for f in res.findings] == [("crash", 3)]
    assert "SIGKILL" in res.findings[0].message


def test_torch_distributed_launch_names_the_child_that_died_by_a_signal(tmp_path: Path) -> None:
    """https://github.com/pytorch/pytorch/issues/61839 (the command line cut to its head)."""
    text = (
        "subprocess.CalledProcessError: Command '['/opt/tiger/conda/bin/python3', '-u', 'train_imagenet.py', "
        "'--local_rank=7', '--save-dir', './fixArch_model/fixArch_model_0718_1817']' died with <Signals.SIGSEGV: 11>."
    )
    res = run(tmp_path, text)
    assert [(f.kind, f.rank) for f in res.findings] == [("crash", 7)]
    assert "SIGSEGV" in res.findings[0].message


def test_a_torchrun_failure_box_alone_names_its_root_cause_rank(tmp_path: Path) -> None:
    """https://github.com/fudan-generative-vision/hallo2/issues/75 (the box as posted)."""
    text = """
=========================================================
scripts.train_stage1 FAILED
---------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
---------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-03-04_15:41:29
  host      : amax
  rank      : 0 (local_rank: 0)
  exitcode  : -11 (pid: 3182701)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 3182701
=========================================================
"""
    res = run(tmp_path, text)
    assert [(f.kind, f.rank) for f in res.findings] == [("crash", 0)]
    assert "rank 0 (local_rank 0) on amax failed with exitcode -11 (SIGSEGV)" in res.findings[0].message


def test_spawn_names_the_process_that_failed(tmp_path: Path) -> None:
    """https://github.com/greatlog/SWAHR-HumanPose/issues/11 (frames trimmed to the spawn ones)."""
    text = """
Traceback (most recent call last):
  File "tools/dist_train.py", line 320, in <module>
    main()
  File "/home/lab/.conda/envs/pytorch-1.10/lib/python3.7/site-packages/torch/multiprocessing/spawn.py", line 150, in join
    raise ProcessRaisedException(msg, error_index, failed_process.pid)
torch.multiprocessing.spawn.ProcessRaisedException:

-- Process 0 terminated with the following error:
Traceback (most recent call last):
  File "/home/lab/.conda/envs/pytorch-1.10/lib/python3.7/site-packages/torch/multiprocessing/spawn.py", line 59, in _wrap
    fn(i, *args)
"""
    res = run(tmp_path, text.replace("-- Process 0", "-- Process 1"))
    # (The process index is 0; the same text naming process 1 must land on rank 1.)
    assert {f.rank for f in res.findings} == {1}
    res0 = run(tmp_path, text, name="other.log")
    assert {f.rank for f in res0.findings} == {0}


def test_fairseq_overflow_cascade_is_a_loss_scale_collapse(tmp_path: Path) -> None:
    """https://github.com/facebookresearch/fairseq/issues/512."""
    text = """
| epoch 027 | loss 6.343 | nll_loss 4.984 | ppl 31.65 | wps 164346 | ups 0.4 | wpb 364096 | bsz 11907 | num_updates 10198 | lr 0.000626286 | gnorm 0.390 | clip 0% | oom 0 | loss_scale 0.500 | wall 23080 | train_wall 21383
| WARNING: overflow detected, setting loss scale to: 0.25
| WARNING: overflow detected, setting loss scale to: 0.125
| WARNING: overflow detected, setting loss scale to: 0.0625
| WARNING: overflow detected, setting loss scale to: 0.03125
| WARNING: overflow detected, setting loss scale to: 0.015625
| WARNING: overflow detected, setting loss scale to: 0.0078125
| WARNING: overflow detected, setting loss scale to: 0.00390625
| WARNING: overflow detected, setting loss scale to: 0.001953125
| WARNING: overflow detected, setting loss scale to: 0.0009765625
| WARNING: overflow detected, setting loss scale to: 0.00048828125
| WARNING: overflow detected, setting loss scale to: 0.000244140625
| WARNING: overflow detected, setting loss scale to: 0.0001220703125
"""
    assert ("loss_scale_collapse", 0) in {(k, r) for k, r, _ in serious(run(tmp_path, text))}


# ---------------------------------------------------------------- detectors: short history


def test_fp16_calibration_nan_grad_norm_is_not_a_nan_loss(tmp_path: Path) -> None:
    """https://github.com/JiaquanYe/TableMASTER-mmocr/issues/32: the first logging window of an
    fp16 run has grad_norm nan while the scaler calibrates; the maintainer: "it is normal"."""
    text = """
 Epoch [1][100/62598]	lr: 1.000e-03, eta: 6 days, 15:22:46, time: 0.539, data_time: 0.051, memory: 7239, loss_ce: 1.2757, horizon_bbox_loss: 0.2828, vertical_bbox_loss: 0.3507, loss: 1.9091, grad_norm: nan
2021-11-22 01:32:34,502 - mmocr - INFO - Epoch [1][200/62598]	lr: 1.000e-03, eta: 7 days, 15:55:58, time: 0.705, data_time: 0.002, memory: 7239, loss_ce: 0.5921, horizon_bbox_loss: 0.2210, vertical_bbox_loss: 0.1055, loss: 0.9186, grad_norm: 3.9772
"""
    res = run(tmp_path, text)
    assert res.ranks[0].steps == 2 and serious(res) == []
    # The window does not hide a NaN loss (mmdetection#11893's first record: loss nan).
    bad = text.replace("loss: 1.9091", "loss: nan")
    assert serious(run(tmp_path, bad, name="bad.log")) == [("nan_loss", 0, 100)]
    # Nor a NaN grad norm that stays.
    stays = text.replace("grad_norm: 3.9772", "grad_norm: nan")
    assert serious(run(tmp_path, stays, name="stays.log")) == [("nan_loss", 0, 100)]


def test_deepspeed_launcher_names_the_child_that_died(tmp_path: Path) -> None:
    """DeepSeek-Coder#55, quoted in a public note (code index file id 12064442746)."""
    text = " [2023-11-28 10:00:34,590] [ERROR] [launch.py:321:sigkill_handler] ['/home/.python_libs/conda_env/deepseek/bin/python', '-u', 'finetune_deepseekcoder.py', '--local_rank=0', '--model_name_or_path', '/home/project/deepseek/DeepSeek-Coder-main/models/deepseek-coder-6.7b-instruct', '--data_path', '/home/project/deepseek/DeepSeek-Coder-main/data/test.json', '--output_dir', '/home/project/deepseek/DeepSeek-Coder-main/deepseek_finetune', '--num_train_epochs', '1', '--model_max_length', '1024', '--per_device_train_batch_size', '1', '--per_device_eval_batch_size', '1', '--gradient_accumulation_steps', '4', '--evaluation_strategy', 'no', '--save_strategy', 'steps', '--save_steps', '100', '--save_total_limit', '100', '--learning_rate', '2e-5', '--warmup_steps', '10', '--logging_steps', '1', '--lr_scheduler_type', 'cosine', '--gradient_checkpointing', 'True', '--report_to', 'tensorboard', '--deepspeed', 'configs/ds_config_zero3.json', '--bf16', 'True'] exits with return code = -9"
    # The same line for the child of local rank 2 (rank 0 is also the file's default rank).
    res = run(tmp_path, text.replace("--local_rank=0", "--local_rank=2"))
    assert [(f.kind, f.rank) for f in res.findings] == [("crash", 2)]
    assert "SIGKILL" in res.findings[0].message


WILD5 = Path(__file__).resolve().parent / "data" / "wild" / "batch5"


def test_a_config_dump_setting_named_like_a_loss_part_is_no_step() -> None:
    # AntonioLopardo/OLMo@f2d9024:training.log line 7 (the TrainConfig dump), whole: its
    # "auxiliary_loss_multiplier=0.0001" is a setting, not a loss (it made a step 0 with loss
    # 0.0001, then a "spike" at step 1 and a "divergence" at step 3).
    lines = (WILD5 / "olmo_ddp_continue_pretrain_healthy.log").read_text().splitlines()
    assert "auxiliary_loss_multiplier=0.0001" in lines[6]
    assert steps("\n".join(lines[:60]))[0].step == 1


def test_a_running_loss_part_way_through_validation_is_no_eval_result() -> None:
    # ApiaoSamaa/audio_sep@b324f9c:train_log.txt, epoch 9's cross validation: the "i/3" lines are
    # running losses of two validation sets (0.13 -> 0.18), the summary is the result.
    text = """
- Train Summary | Epoch 9 | Loss=0.1133 | Reco=0.1104 | Grad=0.0899 | Penalty=294.9805
- ----------------------------------------------------------------------
- Cross validation...
- Valid | Epoch 9 | 1/3 | 0.30 it/sec | Loss 0.1327 | Reco 0.1327 | Nsdr 7.784
- Valid | Epoch 9 | 2/3 | 0.37 it/sec | Loss 0.1388 | Reco 0.1388 | Nsdr 7.350
- Valid | Epoch 9 | 1/3 | 0.30 it/sec | Loss 0.1428 | Reco 0.1428 | Nsdr 7.154
- Valid | Epoch 9 | 2/3 | 0.36 it/sec | Loss 0.1501 | Reco 0.1501 | Nsdr 6.711
- Valid | Epoch 9 | 1/3 | 0.32 it/sec | Loss 0.1711 | Reco 0.1711 | Nsdr 5.703
- Valid | Epoch 9 | 2/3 | 0.38 it/sec | Loss 0.1787 | Reco 0.1787 | Nsdr 5.299
- Valid | Epoch 9 | 1/3 | 0.29 it/sec | Loss 0.1525 | Reco 0.1525 | Nsdr 6.650
- Valid | Epoch 9 | 2/3 | 0.36 it/sec | Loss 0.1602 | Reco 0.1602 | Nsdr 6.207
- Valid | Epoch 9 | 1/3 | 0.30 it/sec | Loss 0.1587 | Reco 0.1587 | Nsdr 6.335
- Valid | Epoch 9 | 2/3 | 0.37 it/sec | Loss 0.1664 | Reco 0.1664 | Nsdr 5.899
- Valid Summary | Epoch 9 | Loss=0.1388 | Reco=0.1388 | Nsdr=6.350 | Best=0.1388 | Bname=main | Penal86.8787
"""
    evals = [r for r in records(text) if isinstance(r, EvalRecord)]
    assert [e.eval_loss for e in evals] == [0.1388]


def test_caret_escaped_colours_and_two_word_loss_parts() -> None:
    # ByteDance-Seed/Bagel#80: the log as posted, its ANSI colours in caret notation ("^[[34m").
    text = """
[^[[34m2025-05-28 14:37:10^[[0m] (step=0012460) Train Loss mse: 0.0097, Train Loss ce: 0.0194, Train Steps/Sec: 0.16,
[^[[34m2025-05-28 14:38:12^[[0m] (step=0012470) Train Loss mse: 0.0021, Train Loss ce: 0.0505, Train Steps/Sec: 0.16,
"""
    got = steps(text)
    assert [r.step for r in got] == [12460, 12470]
    assert got[0].loss == pytest.approx(0.0097 + 0.0194)


def test_tagged_keys_of_a_loguru_line() -> None:
    # https://github.com/nv-tlabs/LION/issues/9 (turn 3): the trainer's loguru lines.
    text = """
2023-01-25 00:21:09.074 | INFO     | trainers.base_trainer:train_epochs:256 - [R0] | E5 iter[ 14/ 15] | [Loss] 51566519.44 | [exp] ./exp/0125/car/3dbf3ah_hvae_lion_B40 | [step]    89 | [url] none | [time] 0.4m (~5h) |[best] 0 -100.000x1e-2
2023-01-25 00:21:34.569 | INFO     | trainers.base_trainer:train_epochs:256 - [R0] | E6 iter[ 14/ 15] | [Loss] nan | [exp] ./exp/0125/car/3dbf3ah_hvae_lion_B40 | [step]   104 | [url] none | [time] 0.4m (~5h) |[best] 0 -100.000x1e-2
"""
    got = steps(text)
    assert [r.step for r in got] == [89, 104]
    assert got[0].loss == 51566519.44 and math.isnan(got[1].loss or 0.0)


def test_clu_logging_writer_step_in_brackets() -> None:
    # https://github.com/google/flax/issues/3364: the ImageNet example on four hosts, each
    # printing the same step (one record per step).
    text = """
I1002 21:38:13.425730 139917864867392 logging_writer.py:35] [400] steps_per_second=1.583725, train_accuracy=0.3724340796470642, train_learning_rate=0.35846155881881714, train_loss=3.219879150390625
I1002 21:38:13.425510 140400640460352 logging_writer.py:35] [400] steps_per_second=1.583736, train_accuracy=0.3724340796470642, train_learning_rate=0.35846155881881714, train_loss=3.219879150390625
I1002 21:39:09.572115 140400640460352 logging_writer.py:35] [500] steps_per_second=1.781075, train_accuracy=0.8223657011985779, train_learning_rate=0.4610256254673004, train_loss=0.8868171572685242
"""
    got = steps(text)
    assert [r.step for r in got] == [400, 500]
    assert got[-1].loss == 0.8868171572685242


def test_yolov7_results_txt_rows_without_a_header() -> None:
    # mrshahabian/Soccer-Yolov7@eab607d:runs/train/exp/results.txt, its first rows: epoch/last,
    # GPU memory, box obj cls total, labels, img_size, then 7 results (yolov7 train.py).
    text = """
      0/54     12.8G   0.03604    0.2529         0    0.2889        19       640   0.04946   0.03419   0.00595  0.001898   0.03685  0.004025         0
      1/54     12.5G   0.02545  0.001799         0   0.02725        19       640    0.3473     0.484    0.3314    0.1412   0.02462  0.003212         0
"""
    got = steps(text)
    assert [(r.step, r.loss) for r in got] == [(0, 0.2889), (1, 0.02725)]


# ---------------------------------------------------------------- epochs as steps, held-out JSON records

# https://github.com/yuhuan-wu/P2T/issues/13 (DeiT-style engine's log.txt: one JSON object per epoch)
DEIT_JSON = """
{"train_lr": 0.0005257284485959572, "train_loss": 3.5884025637194408, "epoch": 147, "n_parameters": 11590840}
{"train_lr": 0.000520548325743666, "train_loss": 3.5758108694871646, "epoch": 148, "n_parameters": 11590840}
"""

# https://github.com/open-mmlab/mmsegmentation/issues/271 (mmcv's log.json: train and val records)
MMCV_JSON = """
{"mode": "train", "epoch": 5, "iter": 11950, "lr": 0.00446, "memory": 6912, "data_time": 0.00874, "decode.loss_seg": 0.71687, "decode.acc_seg": 70.43675, "aux.loss_seg": 0.38568, "aux.acc_seg": 63.78304, "loss": 1.10256, "time": 1.43798}
{"mode": "val", "epoch": 5, "iter": 12000, "lr": 0.00444, "mIoU": 0.18724, "mAcc": 0.26615, "aAcc": 0.81247}
{"mode": "train", "epoch": 5, "iter": 12050, "lr": 0.00442, "memory": 6912, "data_time": 5.35153, "decode.loss_seg": 0.60969, "decode.acc_seg": 70.07939, "aux.loss_seg": 0.33121, "aux.acc_seg": 64.63887, "loss": 0.94091, "time": 6.77109}
"""

# Dang-Tu-lang/Dino_augseg@268fc5bbe6efa8375c963fe7a9fc8a1f6ee4c44b:train_log.txt (restarted twice)
DINO_RESTARTS = """
Epoch 1/100 | LR: 3.800000e-06 | Train Loss: 2.8484 | Val Loss: 1.2244 | mP=9.95% mR=15.56% mIoU=6.25% mDice=11.24% ← best IoU ← best loss
Epoch 2/100 | LR: 7.100000e-06 | Train Loss: 2.7510 | Val Loss: 1.1408 | mP=13.96% mR=19.86% mIoU=8.73% mDice=15.14% ← best IoU ← best loss
Epoch 1/100 [38.7s] | LR: 3.800000e-06 | Train Loss: 2.7200 | Val Loss: 1.2311 | mP=9.70% mR=15.24% mIoU=6.11% mDice=10.99% ← best IoU ← best loss
Epoch 2/100 [34.3s] | LR: 7.100000e-06 | Train Loss: 2.7786 | Val Loss: 1.2085 | mP=10.20% mR=15.71% mIoU=6.39% mDice=11.46% ← best IoU ← best loss
Epoch 1/100 [138.0s] | LR: 3.800000e-06 | Train Loss: 2.8360 | Val Loss: 1.2237 | mP=9.99% mR=15.42% mIoU=6.26% mDice=11.26% ← best IoU ← best loss
Epoch 2/100 [133.4s] | LR: 7.100000e-06 | Train Loss: 2.6075 | Val Loss: 1.1377 | mP=13.95% mR=19.41% mIoU=8.66% mDice=15.02% ← best IoU ← best loss
Epoch 3/100 [133.2s] | LR: 1.040000e-05 | Train Loss: 2.4425 | Val Loss: 0.9604 | mP=27.01% mR=28.77% mIoU=17.15% mDice=25.62% ← best IoU ← best loss
Epoch 4/100 [133.3s] | LR: 1.370000e-05 | Train Loss: 2.3944 | Val Loss: 0.8944 | mP=34.98% mR=37.17% mIoU=23.69% mDice=33.40% ← best IoU ← best loss
"""


def test_json_epoch_is_the_step_when_no_step_key() -> None:
    assert [(r.step, r.loss) for r in steps(DEIT_JSON)] == [
        (147, 3.5884025637194408),
        (148, 3.5758108694871646),
    ]


def test_mmcv_val_record_is_no_training_step() -> None:
    assert [r.step for r in steps(MMCV_JSON)] == [11950, 12050]


def test_epoch_lines_that_start_again_are_a_restart_not_overfitting(tmp_path: Path) -> None:
    assert [r.step for r in steps(DINO_RESTARTS)] == [1, 2, 1, 2, 1, 2, 3, 4]
    assert serious(run(tmp_path, DINO_RESTARTS)) == []


# ---------------------------------------------------------------- errors of other runtimes

ERROR_LINES = [
    # https://github.com/NVIDIA/DeepLearningExamples/issues/549 (BERT, TF estimator)
    ("ERROR:tensorflow:Model diverged with loss = NaN.", "nan_loss"),
    (
        "E0606 09:34:26.659411 46912496659904 basic_session_run_hooks.py:760] Model diverged with loss = NaN.",
        "nan_loss",
    ),
    # https://github.com/espnet/espnet/issues/3170
    (
        "[user] 2021-04-23 19:22:52,420 (trainer:581) WARNING: The grad norm is nan. Skipping updating the model.",
        "nan_loss",
    ),
    # https://github.com/DLR-RM/stable-baselines3/issues/1401
    (
        "ValueError: Expected parameter loc (Tensor of shape (1, 50)) of distribution Normal(loc: torch.Size([1, 50]), scale: torch.Size([1, 50])) to satisfy the constraint Real(), but found invalid values:",
        "crash",
    ),
    # https://github.com/ray-project/ray/issues/31828
    (
        "2023-01-17 17:21:35,472\tWARNING worker.py:1829 -- A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the problem, check the logs for the dead worker.",
        "crash",
    ),
    # https://github.com/ray-project/ray/issues/49252
    ("(RayTrainWorker pid=7315) *** SIGABRT received at time=1734086759 ***", "crash"),
    # https://github.com/hezhangsprinter/DCPDN/issues/12
    ("RuntimeError: DataLoader worker (pid 19597) is killed by signal: Killed.", "crash"),
]


@pytest.mark.parametrize(("line", "kind"), ERROR_LINES)
def test_error_lines_of_other_runtimes(line: str, kind: str) -> None:
    errs = [r for r in records(line) if isinstance(r, ErrorRecord)]
    assert [e.kind for e in errs] == [kind]


def test_torchelastic_failed_event_names_its_global_rank() -> None:
    # https://github.com/exiawsh/StreamPETR/issues/19 (the event's raw_error cut here)
    line = '{"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp": 0, "metadata": {"run_id": "none", "global_rank": 3, "group_rank": 0, "worker_id": "11376", "role": "default", "hostname": "sajadi", "state": "FAILED"}}'
    errs = [r for r in records(line) if isinstance(r, ErrorRecord)]
    assert [(e.kind, e.rank) for e in errs] == [("crash", 3)]


# ---------------------------------------------------------------- Trainer dicts: their own step, told twice

# https://github.com/PaddlePaddle/PaddleNLP/pull/1761 (PaddleNLP's Trainer logs 'global_step')
PADDLENLP = """
{'loss': 0.1856, 'learning_rate': 4.5e-05, 'global_step': 150, 'epoch': 2.0}
{'loss': 0.1202, 'learning_rate': 4.4000000000000006e-05, 'global_step': 160, 'epoch': 2.13}
"""

# https://github.com/hiyouga/LlamaFactory/issues/6286 (LogCallback's rounded copy, then the Trainer's dict)
LLAMAFACTORY_ECHO = """
[INFO|2024-12-08 01:09:59] llamafactory.train.callbacks:157 >> {'loss': 0.0000, 'learning_rate': 4.9985e-05, 'epoch': 0.03}
{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.998452110450943e-05, 'epoch': 0.03}
"""


def test_trainer_dict_with_its_own_global_step() -> None:
    assert [(r.step, r.loss) for r in steps(PADDLENLP)] == [(150, 0.1856), (160, 0.1202)]


def test_a_logged_copy_of_the_trainer_dict_is_one_step() -> None:
    s = steps(LLAMAFACTORY_ECHO)
    assert len(s) == 1 and s[0].line == 2 and math.isnan(s[0].grad_norm)  # type: ignore[arg-type]


def test_a_logged_dict_alone_still_counts() -> None:
    s = steps(LLAMAFACTORY_ECHO.strip().splitlines()[0] + "\nsome other line\n")
    assert [(r.loss, r.epoch) for r in s] == [(0.0, 0.03)]


# ---------------------------------------------------------------- RL blocks: Ray Tune results, RSL-RL iterations

# 01jongmin/Shogi-RL@ffb10b12d9fe23215b1016476a4f7b8204ed05f3:nohup.out (Ray Tune's pretty-printed
# DQN result; the td_error list and most keys left out)
RLLIB_RESULT = """
Result for DQN_shogi_96499_00000:
  agent_timesteps_total: 1217
  custom_metrics: {}
  date: 2022-04-22_01-29-09
  done: false
  episode_len_mean: 7.1625
  info:
    last_target_update_ts: 1320
    learner:
      player_0:
        custom_metrics: {}
        learner_stats:
          allreduce_latency: 0.0
          cur_lr: 0.0005
          grad_gnorm: 0.18033289909362793
          max_q: 0.05319087952375412
        mean_td_error: 0.06492121517658234
        td_error:
        - -0.030639369040727615
        - -0.14049682021141052
    num_steps_trained: 32
  iterations_since_restore: 1
  training_iteration: 1
  trial_id: '96499_00000'
  warmup_time: 3.954873561859131

== Status ==
"""

# https://github.com/isaac-sim/IsaacLab/issues/1999 (RSL-RL's OnPolicyRunner.log block)
RSL_RL = """
################################
                     Learning iteration 8391/10000

                       Computation: 14963 steps/s (collection: 6.407s, learning
0.163s)
               Value function loss: inf
                    Surrogate loss: 0.0000
             Mean action noise std: 0.56
                 Mean total reward: 25.66
"""


def test_ray_tune_result_block_is_one_record_at_its_training_iteration() -> None:
    parser = LogParser(fmt="kv")
    s = [r for i, x in enumerate(RLLIB_RESULT.strip("\n").splitlines(), 1) for r in parser.feed(x, i)]
    assert [(r.step, r.grad_norm, r.learning_rate) for r in s if isinstance(r, StepRecord)] == [
        (1, 0.18033289909362793, 0.0005)
    ]
    # Unforced, the first block's episode statistics give the format away: the whole log is read,
    # its first block too.
    whole = Path(__file__).parent / "data/wild/batch5/rllib_tune_dqn_shogi_grad_explodes.log"
    s = steps(whole.read_text())
    assert [r.step for r in s[:3]] == [1, 6, 11] and s[0].grad_norm == 0.18033289909362793


def test_rsl_rl_iteration_block_value_function_loss_is_a_training_loss(tmp_path: Path) -> None:
    s = steps(RSL_RL)
    assert [r.step for r in s] == [8391] and not math.isfinite(s[0].loss)  # type: ignore[arg-type]
    assert ("nan_loss", 0, 8391) in serious(run(tmp_path, RSL_RL))


# ---------------------------------------------------------------- CSV files, bare lists

# davidADSP/SIMPLE@ba6b9b50cab153eae75091f586aec39b89cd3342:logs/progress.csv (OpenAI baselines PPO1)
BASELINES_CSV = """
TimeElapsed,loss_vf_loss,EpisodesSoFar,EpRewMean,TimestepsSoFar,EpThisIter,loss_kl,loss_pol_surr,ev_tdlam_before,loss_ent,loss_pol_entpen,EpLenMean
2.374695301055908,0.059557907,12,0.08333333333333333,1024,12,0.0015515797,-0.008476209,-0.2864949703216553,1.1641085,-0.11641085,84.0
4.318211078643799,0.03881309,21,0.047619047619047616,2048,9,0.001284814,-0.0062062843,-0.9207720756530762,1.147481,-0.1147481,96.23809523809524
"""

# https://github.com/jaywalnut310/vits/issues/233 (VITS train.py: losses, then global step and lr)
VITS = """
ljs_base INFO [2.384028673171997, 2.508051872253418, 7.846828937530518, 17.78978157043457, 1.4343225955963135, 2.2450718879699707, 843400, 0.00013416124686580283]
ljs_base INFO ====> Epoch: 3195
"""

# 0Xero7/slm_training@e8703f9f44e28c4dbfc50376b633ccf1c415350a:lightning_logs/version_0/metrics.csv
LIGHTNING_CSV = """
epoch,epoch_time,step,train_epoch_perplexity,train_loss_epoch,train_loss_step,train_perplexity_epoch,train_perplexity_step,val_epoch_perplexity,val_loss,val_perplexity
9,,140699,,,3.565943479537964,,35.37281036376953,,,
9,,140739,,,,,,35.53385925292969,3.570486068725586,36.68146514892578
9,2419.625244140625,140739,39.934356689453125,3.687237024307251,,40.125675201416016,,,,
"""


def test_rl_progress_csv_steps_by_its_timestep_counter() -> None:
    assert [r.step for r in steps(BASELINES_CSV)] == [1024, 2048]


def test_vits_bare_loss_list() -> None:
    s = steps(VITS)
    assert [(r.step, r.learning_rate) for r in s] == [(843400, 0.00013416124686580283)]
    assert s[0].loss == pytest.approx(34.2081, abs=1e-3)  # the sum of the six losses


def test_lightning_csv_epoch_end_row_is_the_last_step() -> None:
    assert [(r.step, r.loss) for r in steps(LIGHTNING_CSV)] == [
        (140699, 3.565943479537964),
        (140739, 3.687237024307251),
    ]


# ---------------------------------------------------------------- loss scaler exhausted, a traceback after a bar


def test_loss_scaler_exhausted_is_a_collapse() -> None:
    # https://github.com/yangjianxin1/Firefly/issues/68 (DeepSpeed's loss_scaler.py);
    # https://github.com/EleutherAI/gpt-neox/issues/482 (GPT-NeoX's OverflowMonitor)
    for line in (
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
        "Exception: Skipped 50 iterations in a row due to Overflow - Exiting training.",
    ):
        errs = [r for r in records(line) if isinstance(r, ErrorRecord)]
        assert [(e.kind, e.severity) for e in errs] == [("loss_scale_collapse", Severity.CRITICAL)]


# https://github.com/TheLastBen/fast-stable-diffusion/issues/1789 (the bar, then the traceback on its line)
GLUED_TRACEBACK = """
Progress:|█                        |  4% 13/300 [01:21<28:53,  6.04s/it, loss=0.18, lr=9.57e-7] dramine  Traceback (most recent call last):
  File "/content/diffusers/examples/dreambooth/train_dreambooth.py", line 803, in <module>
    main()
  File "/content/diffusers/examples/dreambooth/train_dreambooth.py", line 668, in main
    latents = vae.encode(batch["pixel_values"].to(dtype=weight_dtype)).latent_dist.sample()
"""


def test_traceback_head_glued_to_a_progress_bar_starts_a_traceback() -> None:
    errs = [r for r in records(GLUED_TRACEBACK) if isinstance(r, ErrorRecord)]
    assert [(e.kind, e.line) for e in errs] == [("crash", 5)]
    assert "train_dreambooth.py:668 main" in str(errs[0].details.get("frame"))


# https://github.com/Noble-Lab/casanovo/issues/367 (a history table: each row fills one loss, nan in the other)
CASANOVO = """
2024-08-19 13:28:48,101 INFO [casanovo/MainProcess] model._log_history : Step\tTrain loss\tValid loss\t
2024-08-19 13:28:48,101 INFO [casanovo/MainProcess] model._log_history : 20000\tnan\t1.594399
2024-08-19 13:49:20,856 INFO [casanovo/MainProcess] model._log_history : 33440\t1.816622\tnan
2024-08-19 14:01:56,689 INFO [casanovo/MainProcess] model._log_history : 40000\tnan\t1.010075
"""


def test_tab_table_behind_a_logger_prefix_nan_beside_a_value_is_not_logged(tmp_path: Path) -> None:
    recs = records(CASANOVO)
    assert [(r.step, r.loss) for r in recs if isinstance(r, StepRecord)] == [(33440, 1.816622)]
    assert [(r.step, r.eval_loss) for r in recs if isinstance(r, EvalRecord)] == [
        (20000, 1.594399),
        (40000, 1.010075),
    ]
    assert serious(run(tmp_path, CASANOVO)) == []


# https://github.com/unslothai/unsloth/issues/1145 (unsloth_train's "step, loss" after the bar)
UNSLOTH_BAR = """
  0%|          | 1/312 [00:25<2:13:19, 25.72s/it]0, 2.5521
  4%|▎         | 11/312 [02:27<1:00:48, 12.12s/it]10, 2.2398
"""


def test_bare_step_loss_pair_after_a_bar_when_the_bar_counts_it() -> None:
    assert [(r.step, r.loss, r.total_steps) for r in steps(UNSLOTH_BAR)] == [
        (0, 2.5521, 312),
        (10, 2.2398, 312),
    ]


# https://github.com/axolotl-ai-cloud/axolotl/issues/2357 (loss and grad norm exactly 0 from the first record)
AXOLOTL_DEAD = """
{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 4.0000000000000003e-07, 'epoch': 0.05}
{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 6.000000000000001e-07, 'epoch': 0.08}
{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 8.000000000000001e-07, 'epoch': 0.1}
{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 1.0000000000000002e-06, 'epoch': 0.13}
{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 1.2000000000000002e-06, 'epoch': 0.15}
"""


def test_loss_and_grad_norm_exactly_zero_from_the_start_is_no_learning(tmp_path: Path) -> None:
    assert [k for k, _, _ in serious(run(tmp_path, AXOLOTL_DEAD))] == ["grad_vanishing"]
    four = "\n".join(AXOLOTL_DEAD.strip().splitlines()[:4])
    assert serious(run(tmp_path, four, name="four.log")) == []  # fewer than dead_records


# https://github.com/facebookresearch/fairseq/issues/301 (an epoch summary: "words/batch 906" is a rate)
FAIRSEQ_SUMMARY = """
| epoch 010  8000 / 8223 loss=1.33 (1.45), wps=961, wpb=905, bsz=32, lr=0.001, clip=100%, gnorm=2.1133
| epoch 010 | train loss 1.44 | train ppl 2.72 | s/checkpoint    7747 | words/s    961 | words/batch    906 | bsz    32 | lr 0.001000 | clip 100% | gnorm 2.1113
"""

# https://github.com/facebookresearch/fastText/issues/604 (progress JSON: loss and lr, no counter)
FASTTEXT = """
{"progress":83,"loss":0.596971,"lr":0.00836,"words":210226,"eta":"0h0m","eta_msec":0}
{"progress":83.6,"loss":0.595277,"lr":0.008207,"words":210351,"eta":"0h0m","eta_msec":0}
"""


def test_a_per_batch_rate_is_no_step() -> None:
    assert 906 not in [r.step for r in steps(FAIRSEQ_SUMMARY)]


def test_json_with_loss_and_lr_but_no_counter_is_numbered_by_position() -> None:
    assert [(r.loss, r.learning_rate) for r in steps(FASTTEXT)] == [(0.596971, 0.00836), (0.595277, 0.008207)]


# https://github.com/mira-ai-lab/MUSIC-AVQA-R/issues/1 (the epoch told on every progress line)
EPOCH_REPEATED = """
[2024-07-06 06:40:54,438]-[engine.py line:78]:Epoch 1 complete [0%]     Loss: 3.709857
[2024-07-06 06:41:25,455]-[engine.py line:78]:Epoch 1 complete [10%]    Loss: 2.799116
[2024-07-06 06:41:56,752]-[engine.py line:78]:Epoch 1 complete [20%]    Loss: 1.711389
"""

# https://github.com/maudzung/RTM3D/issues/4 ("Epoch: [127/300][ 35/464]": epoch of epochs, then the batch)
RTM3D_EPOCH_OF = """
Train - Epoch: [127/300][ 35/464]\tTime  0.738 ( 0.738)\tData  0.000 ( 0.014)\tLoss 2.1274e+00 (1.5406e+00)
Train - Epoch: [127/300][ 85/464]\tTime  0.730 ( 0.730)\tData  0.000 ( 0.006)\tLoss 1.2996e+00 (1.5485e+00)
"""


def test_an_epoch_told_on_every_line_is_no_step() -> None:
    s = records(EPOCH_REPEATED)
    assert len({r.step for r in s if isinstance(r, StepRecord)} - {None}) <= 1  # no two records share a step
    assert len([r for r in s if isinstance(r, StepRecord)]) == 3


def test_epoch_of_epochs_then_batch_in_brackets() -> None:
    s = steps(RTM3D_EPOCH_OF)
    assert [r.step is not None and r.step % 464 for r in s] == [35, 85] and s[0].epoch == 127


MPI_LINES = [
    # https://github.com/horovod/horovod/issues/469
    ("mpirun noticed that process rank 7 with PID 0 on node HOSTNAME exited on signal 9 (Killed).", 7),
    # https://github.com/Kay1794/Aware-of-the-history/issues/2
    ("mpirun noticed that process rank 1 with PID xxxxxx on node xxxxxxxx exited on signal 9 (Killed).", 1),
    # https://github.com/horovod/horovod/issues/1421
    ("mpirun detected that one or more processes exited with non-zero status, thus causing", None),
    # https://github.com/horovod/horovod/issues/410
    (
        "2018-07-30 06:41:52.525932: W tensorflow/core/framework/op_kernel.cc:1318] OP_REQUIRES failed at mpi_ops.cc:422 : Aborted: Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished execution.",
        None,
    ),
]


@pytest.mark.parametrize(("line", "rank"), MPI_LINES)
def test_mpirun_and_horovod_failures(line: str, rank: int | None) -> None:
    errs = [r for r in records(line) if isinstance(r, ErrorRecord)]
    assert [(e.kind, e.rank) for e in errs] == [("crash", rank)]


STOP_LINES = [
    # DETR/DeiT-style engine.py print("Loss is {}, stopping training"), as reported in
    # https://github.com/Intellindust-AI-Lab/DEIM/issues/96
    ("Loss is nan, stopping training", "nan_loss"),
    # fairseq/optim/dynamic_loss_scaler.py raises this text (reported in fairseq#282)
    (
        "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try lowering the learning rate, using gradient clipping or increasing the batch size.",
        "loss_scale_collapse",
    ),
    # https://github.com/hezhangsprinter/DCPDN/issues/58
    (
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        "crash",
    ),
    # https://github.com/THU-DA-6D-Pose-Group/GDR-Net/issues/16
    ("RuntimeError: DataLoader worker (pid(s) 3216) exited unexpectedly", "crash"),
]


@pytest.mark.parametrize(("line", "kind"), STOP_LINES)
def test_loops_and_loaders_that_stop_themselves(line: str, kind: str) -> None:
    errs = [r for r in records(line) if isinstance(r, ErrorRecord)]
    assert [e.kind for e in errs] == [kind]


# ---------------------------------------------------------------- batch 6 forms

# https://github.com/intel/ipex-llm/issues/2494 (BigDL DistriOptimizer, description by nwang2):
# prose "Loss is NaN." ending its sentence with a full stop, the step in "[Iteration N]".
BIGDL = """
2018-04-14 00:58:52 INFO  DistriOptimizer$:392 - [Epoch 149 390144/1281167][Iteration 61991][Wall Clock 90297.102702327s] Trained 3072 records in 1.402170578 seconds. Throughput is 2190.889 records/second. Loss is NaN. Current learning rate is 0.0011379211379215811. Current weight decay is 1.0E-4. Current momentum is 0.9.
2018-04-14 00:58:53 INFO  DistriOptimizer$:392 - [Epoch 149 393216/1281167][Iteration 61992][Wall Clock 90298.51743813s] Trained 3072 records in 1.414735803 seconds. Throughput is 2171.4302 records/second. Loss is NaN. Current learning rate is 0.0010795267780450456. Current weight decay is 1.0E-4. Current momentum is 0.9.
"""


def test_prose_loss_is_value_ending_a_sentence(tmp_path: Path) -> None:
    s = steps(BIGDL)
    assert [r.step for r in s] == [61991, 61992]
    assert all(math.isnan(r.loss or 0.0) for r in s)
    assert s[0].learning_rate == pytest.approx(0.0011379211379215811)
    assert ("nan_loss", 0, 61991) in serious(run(tmp_path, BIGDL, "rank-0.log"))


# https://github.com/isl-org/PhotorealismEnhancement/issues/66 (description by WouterBesse): EPE
# prints an iteration and its loss terms with no header, "----" where a term was not computed.
EPE = """
2024-05-27 12:22:39,683 2 ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ----
2024-05-27 12:22:40,036 3 1.00 2.79 0.00 6.03 0.62 0.32 0.01 0.48 0.00 1.39 0.00 0.99 0.67 1.00 0.19 0.32 0.94 3.16 0.12 0.26 0.86 0.00 0.26 0.17 0.15 0.00 0.25 0.01 0.99 0.09 1001.44 ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ----
2024-05-27 12:23:01,982 4 ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- ---- nan nan nan nan nan nan nan nan nan nan nan
"""


def test_headerless_placeholder_columns_nan_is_a_nan_loss(tmp_path: Path) -> None:
    s = steps(EPE)
    assert [r.step for r in s] == [4] and math.isnan(s[0].loss or 0.0)
    assert serious(run(tmp_path, EPE, "rank-0.log")) == [("nan_loss", 0, 4)]
    assert steps(EPE.replace("nan", "0.10")) == []  # finite unnamed cells tell nothing


# https://github.com/jeffffffli/HybrIK/issues/198 (description by zengyiwen123): the parent's
# traceback from torch.multiprocessing.spawn, its head written straight after tqdm's bar, ending
# in old torch's plain "Exception: process 3 terminated with signal SIGKILL".
HYBRIK = """
############# Starting Epoch 0 | LR: 0.001 #############
  0%|                                                                                                                                         | 0/4878 [00:00<?, ?it/s]Traceback (most recent call last):
  File "./scripts/train_smpl_cam.py", line 375, in <module>
    main()
  File "./scripts/train_smpl_cam.py", line 213, in main
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(opt, cfg))
  File "/home/ubuntu/anaconda3/envs/3D/lib/python3.6/site-packages/torch/multiprocessing/spawn.py", line 199, in spawn
    return start_processes(fn, args, nprocs, join, daemon, start_method='spawn')
  File "/home/ubuntu/anaconda3/envs/3D/lib/python3.6/site-packages/torch/multiprocessing/spawn.py", line 157, in start_processes
    while not context.join():
  File "/home/ubuntu/anaconda3/envs/3D/lib/python3.6/site-packages/torch/multiprocessing/spawn.py", line 107, in join
    (error_index, name)
Exception: process 3 terminated with signal SIGKILL
"""


def test_spawn_traceback_after_a_bar_is_a_crash_of_the_process_it_names(tmp_path: Path) -> None:
    assert serious(run(tmp_path, HYBRIK)) == [("crash", 3, None)]


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        # https://github.com/Plachtaa/VITS-fast-fine-tuning/issues/284 (description by Hyponarch)
        ("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 1", 0),
        # https://github.com/dingjiansw101/ZegFormer/issues/19 (description by BanaBanaBanaa)
        ("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL", 1),
        # https://github.com/SayaSS/vits-finetuning/issues/32 (description by Decan29, Windows)
        (
            "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 3221226505",
            0,
        ),
    ],
)
def test_spawn_exited_line_alone_is_a_crash_of_that_process(line: str, rank: int) -> None:
    errs = [r for r in records(line) if isinstance(r, ErrorRecord)]
    assert [(e.kind, e.rank) for e in errs] == [("crash", rank)]


def test_spawn_worker_killed_traceback_is_that_ranks_kill_by_signal() -> None:
    """s38 g21: a real ``rankwatch run -- python spawn5.py`` log (torch 2.13), worker 1 SIGKILLed:
    the launcher's ProcessExitedException traceback is rank 1's crash, told as the signal."""
    text = (Path(__file__).parent / "data/blackbox/s38/repro/g21/rank-0.log").read_text()
    errs = [r for r in records(text) if isinstance(r, ErrorRecord)]
    assert [(e.kind, e.rank) for e in errs] == [("crash", 1)]
    assert "killed by signal 9 (SIGKILL)" in errs[0].summary
    assert errs[0].details["signal"] == "SIGKILL"


@pytest.mark.parametrize(
    ("last", "told"),
    [
        # torch/multiprocessing/spawn.py ProcessContext.join, its two ProcessExitedException texts
        ("process 1 terminated with signal SIGSEGV", "killed by signal 11 (SIGSEGV)"),
        ("process 1 terminated with exit code 3", "terminated with exit code 3"),
    ],
)
def test_spawn_exited_traceback_variants_name_the_process_and_how(last: str, told: str) -> None:
    text = (Path(__file__).parent / "data/blackbox/s38/repro/g21/rank-0.log").read_text()
    text = text.replace("process 1 terminated with signal SIGKILL", last)
    errs = [r for r in records(text) if isinstance(r, ErrorRecord)]
    assert [(e.kind, e.rank) for e in errs] == [("crash", 1)]
    assert told in errs[0].summary


# CS15B001/HER_Improvements@67d25ccf4e96ff92f565a73f85c4030b32532ff3:Logs/output_256batch_largerbuffer
# (OpenAI baselines HER on stdout): one framed table per epoch and no loss in it.
HER = """
Training...
-----------------------------------
| epoch              | 0          |
| stats_g/mean       | 0.0        |
| stats_g/std        | 1.0        |
| stats_o/mean       | 0.0        |
| stats_o/std        | 1.0        |
| test/episode       | 20.0       |
| test/mean_Q        | -1.3563926 |
| test/success_rate  | 0.0        |
| train/episode      | 20.0       |
| train/success_rate | 0.0        |
-----------------------------------
New best success rate: 0.0. Saving policy to /tmp/openai-2018-04-16-17-05-02-131582/policy_best.pkl ...
Saving periodic policy to /tmp/openai-2018-04-16-17-05-02-131582/policy_0.pkl ...
-----------------------------------
| epoch              | 1          |
| stats_g/mean       | 0.0        |
| stats_g/std        | 1.0        |
| stats_o/mean       | 0.0        |
| stats_o/std        | 1.0        |
| test/episode       | 40.0       |
| test/mean_Q        | -1.9132456 |
| test/success_rate  | 0.0        |
| train/episode      | 40.0       |
| train/success_rate | 0.0        |
-----------------------------------
"""


def test_framed_logger_table_without_a_loss_is_one_record_at_its_counter(tmp_path: Path) -> None:
    s = steps(HER)
    assert [(r.step, r.loss) for r in s] == [(0, None), (1, None)]
    res = run(tmp_path, HER)
    assert res.recognised_any and serious(res) == []


# jackokeefe11/nanoGPT@b79be64da991e268dad3f747459cbbdc3c171e59:wandb/run-20240215_012725-vgpqdf1r/files/output.log
# (a nanoGPT fork on enwik8 printing the loss in bits per character): the eval line is an eval at
# its step, not one more training step.
NANOGPT_BPC = """
step 0: train loss 12.5201 BPC, val loss 12.5218 BPC
iter 0: loss 12.5435 BPC, time 242620.93ms, mfu -100.00%
iter 10: loss 10.0507 BPC, time 263.86ms, mfu 9.31%
step 250: train loss 3.1345 BPC, val loss 3.1441 BPC
saving checkpoint to out-enwik-char
iter 250: loss 3.1895 BPC, time 32924.41ms, mfu 8.23%
"""


def test_nanogpt_loss_with_its_unit_evals_are_not_steps() -> None:
    recs = records(NANOGPT_BPC)
    assert [(r.step, r.loss) for r in recs if isinstance(r, StepRecord)] == [
        (0, 12.5435),
        (10, 10.0507),
        (250, 3.1895),
    ]
    assert [(r.step, r.eval_loss) for r in recs if isinstance(r, EvalRecord)] == [(0, 12.5218), (250, 3.1441)]


# https://github.com/keras-team/keras/issues/3056 (description by zero76114): Keras fit, "Epoch i/N" on
# its own line, then the finished bar counting samples: each epoch a record of its own.
KERAS_3056 = """
Epoch 1/15
47808/47808 [==============================] - 300s - loss: 0.6807 - acc: 0.5745 - val_loss: 0.6770 - val_acc: 0.5802
Epoch 2/15
47808/47808 [==============================] - 324s - loss: 0.6693 - acc: 0.5843 - val_loss: 0.6765 - val_acc: 0.5796
Epoch 3/15
47808/47808 [==============================] - 349s - loss: 0.6678 - acc: 0.5857 - val_loss: 0.6789 - val_acc: 0.5801
Epoch 4/15
47808/47808 [==============================] - 345s - loss: 0.6485 - acc: 0.6128 - val_loss: 0.6913 - val_acc: 0.5599
"""

# https://github.com/kk7nc/RMDL/issues/14 (turn 5 by zhuzhangli): Keras verbose=2, no bar at all.
RMDL_14 = r"""
Epoch 8/100
 - 660s - loss: 0.6090 - acc: 0.8146 - val_loss: 0.8632 - val_acc: 0.7744

Epoch 00008: val_acc improved from 0.76232 to 0.77444, saving model to weights\weights_RNN_1.hdf5
Epoch 9/100
 - 688s - loss: 0.4891 - acc: 0.8539 - val_loss: 0.8302 - val_acc: 0.7916

Epoch 00009: val_acc improved from 0.77444 to 0.79156, saving model to weights\weights_RNN_1.hdf5
Epoch 10/100
"""


def test_keras_metrics_on_the_line_after_their_epoch_belong_to_it() -> None:
    s = steps(KERAS_3056)
    assert [(r.step, r.epoch, r.loss) for r in s][1:] == [
        (95616, 2, 0.6693),
        (143424, 3, 0.6678),
        (191232, 4, 0.6485),
    ]
    recs = records(RMDL_14)
    assert [(r.step, r.loss) for r in recs if isinstance(r, StepRecord)] == [(9, 0.4891)]
    assert [(r.step, r.eval_loss) for r in recs if isinstance(r, EvalRecord)][1:] == [(9, 0.8302)]


# ---------------------------------------------------------------- batch 7: GAN losses, joined keys,
# Apex AMP's scaler, a zero loss on a short history

# https://github.com/XPixelGroup/BasicSR/issues/204 (turn 0 by shah0nawaz): a thousands separator
# in the counter, BasicSR's "l_" loss prefix, a discriminator loss swinging 1e-5 -> 1e-8.
BASICSR_204 = """
19-08-09 08:25:25.996 - INFO: <epoch: 86, iter: 107,200, lr:2.500e-05> l_g_pix: 1.4819e-03 l_g_fea: 1.0389e+00 l_g_gan: 7.2056e-02 l_d_real: 1.4378e-05 l_d_fake: 4.0903e-06 D_real: -2.5625e+01 D_fake: -4.0036e+01
19-08-09 08:27:27.746 - INFO: <epoch: 87, iter: 107,400, lr:2.500e-05> l_g_pix: 1.5971e-03 l_g_fea: 9.9606e-01 l_g_gan: 9.4154e-02 l_d_real: 1.4901e-08 l_d_fake: 7.4506e-09 D_real: -2.6405e+01 D_fake: -4.5235e+01
"""

# https://github.com/open-mmlab/mmagic/issues/82 (description by singulart): padded counters.
MMEDIT_82 = """
20-05-22 17:42:09.481 - INFO: [epoch:  0, iter:     600, lr:(1.000e-04,)] l_g_pix: 4.1864e-04 l_g_fea: 8.7215e-01 l_g_gan: 4.5786e-02 l_d_real: 1.1156e-04 l_d_fake: 8.2644e-05 D_real: 2.0082e+01 D_fake: 1.0925e+01
"""


def test_gan_losses_are_the_generator_parts_at_a_separated_or_padded_counter() -> None:
    s = steps(BASICSR_204)
    assert [r.step for r in s] == [107200, 107400]
    assert s[0].loss == pytest.approx(1.4819e-03 + 1.0389 + 7.2056e-02)  # no l_d_* in it
    assert s[1].loss == pytest.approx(1.5971e-03 + 9.9606e-01 + 9.4154e-02)
    m = steps(MMEDIT_82)
    assert [(r.step, r.epoch) for r in m] == [(600, 0)]
    assert m[0].loss == pytest.approx(4.1864e-04 + 8.7215e-01 + 4.5786e-02)


def test_a_discriminator_loss_alone_or_nan_still_makes_the_loss() -> None:
    # The DCGAN example's print ("[%d/%d][%d/%d]\tLoss_D: %.4f\tLoss_G: %.4f", pytorch/examples
    # dcgan/main.py): Loss_G is the loss; a NaN Loss_D is the run's NaN.
    s = steps(
        "step: 10 Loss_D: 1.3862 Loss_G: 0.6931\nstep: 20 Loss_D: nan Loss_G: 0.7001\nstep: 30 d_loss: 0.52"
    )
    assert [r.loss for r in s][:1] == [pytest.approx(0.6931)]
    assert math.isnan(s[1].loss)  # type: ignore[arg-type]
    assert s[2].loss == pytest.approx(0.52)


# https://github.com/NVIDIA/waveglow/issues/32 (description by hdmjdp): train.py's
# print("{}:\t{:.9f}".format(iteration, loss)) behind "step_"/"loss_" prefixes.
WAVEGLOW_32 = "step_78600:\tloss_-4.322495461\nstep_78620:\tloss_4191.683593750\n"


def test_underscore_joined_key_value_lines_are_read() -> None:
    assert [(r.step, r.loss) for r in steps(WAVEGLOW_32)] == [(78600, -4.322495461), (78620, 4191.68359375)]
    assert steps("model_v2 layer_3 config_a\n") == []


# https://github.com/whai362/PVT/issues/94 (description by Williamlizl): apex amp's only line.
PVT_94 = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.03125\n"
# https://github.com/NVIDIA/apex/issues/318 (turn 9 by mobassir94): halving on and on, no floor.
APEX_318 = """
Gradient overflow. Skipping step, loss scaler 0 reducing loss scale to 8.165126103939127e-202
Gradient overflow. Skipping step, loss scaler 0 reducing loss scale to 4.082563051969564e-202
"""


def test_apex_amp_overflow_below_a_scale_of_one_is_a_collapse(tmp_path: Path) -> None:
    assert [k for k, _, _ in serious(run(tmp_path, PVT_94))] == ["loss_scale_collapse"]
    assert [k for k, _, _ in serious(run(tmp_path, APEX_318, "b.log"))] == ["loss_scale_collapse"]
    # apex amp's start-up calibration from 2^16 (amp/scaler.py): a few halvings, no alarm.
    calib = "\n".join(
        f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {2.0 ** (15 - i)}"
        for i in range(4)
    )
    assert serious(run(tmp_path, calib, "c.log")) == []


# https://github.com/QwenLM/Qwen3-VL/issues/1981 (description by piqiuni, HF Trainer).
QWEN3VL_1981 = """
{'loss': 2.7584, 'grad_norm': 1.4142135381698608, 'learning_rate': 0.0, 'epoch': 0.02}
{'loss': 0.0, 'grad_norm': 1.4142135381698608, 'learning_rate': 5e-06, 'epoch': 0.05}
"""


def test_a_zero_loss_beside_a_live_grad_norm_on_a_short_history_is_nan_filtered(tmp_path: Path) -> None:
    assert serious(run(tmp_path, QWEN3VL_1981)) == [("nan_loss", 0, 2)]
    # A zero loss whose grad norm went to 0 too is a loss that really is 0: no NaN this early.
    quiet = QWEN3VL_1981.replace(
        "'loss': 0.0, 'grad_norm': 1.4142135381698608", "'loss': 0.0, 'grad_norm': 0.0"
    )
    assert "nan_loss" not in [k for k, _, _ in serious(run(tmp_path, quiet, "b.log"))]


# https://github.com/prajdabre/yanmtt/issues/7 (description by gorka96): print(ctr, loss).
YANMTT_7 = """
76960 2.735384
76970 2.6265104
76980 nan
76990 nan
Saving the model
Loading from checkpoint
77000 nan
"""


def test_bare_step_value_rows_with_a_rising_first_column_are_read(tmp_path: Path) -> None:
    s = steps(YANMTT_7)
    assert [r.step for r in s] == [76960, 76970, 76980, 76990, 77000]
    assert s[0].loss == 2.735384 and math.isnan(s[2].loss)  # type: ignore[arg-type]
    assert serious(run(tmp_path, YANMTT_7))[:1] == [("nan_loss", 0, 76980)]
    # Two numbers whose first does not count up, or bare pairs inside a log of named metrics: none.
    assert steps("10 2.5\n5 2.4\n30 2.3\n40 2.3\n") == []
    assert [r.step for r in steps("step 5 loss 2.0\n10 2.5\n20 2.4\n30 2.3\n")] == [5]


# yunjey/pytorch-tutorial's print (tutorials/01-basics/feedforward_neural_network/main.py):
# 'Epoch [{}/{}], Step [{}/{}], Loss: {:.4f}'.format(epoch+1, num_epochs, i+1, total_step, ...),
# the step counting the epoch's batches. These rows: a committed Jupyter notebook's output of an
# MNIST CNN printing it (found by the code search of this project's library, file id 702482886).
TUTORIAL_STEPS = """
    Epoch [1/10], Step [600/600], Loss: 0.0183
    Epoch [2/10], Step [100/600], Loss: 0.0625
"""


def test_an_epoch_then_a_bracketed_step_counting_its_batches_is_one_rising_step() -> None:
    s = steps(TUTORIAL_STEPS)
    assert [(r.epoch, r.loss) for r in s] == [(1, 0.0183), (2, 0.0625)]
    assert s[0].step is not None and s[1].step is not None and s[1].step > s[0].step


# https://github.com/zhangxiann/PyTorch_Practice/issues/1 (description by backkon): the DCGAN
# example's print('[%d/%d][%d/%d]\tLoss_D: ...' % (epoch, niter, i, len(dataloader), ...)).
DCGAN_LOG = (
    "[0/20][30/32]\tLoss_D: 0.2492\tLoss_G: 57.3842\tD(x): 0.9787\tD(G(z)): 0.0000 / 0.0000\n"
    "[1/20][0/32]\tLoss_D: 0.0000\tLoss_G: 56.7433\tD(x): 1.0000\tD(G(z)): 0.0000 / 0.0000\n"
)


def test_dcgan_epoch_and_batch_counters_make_one_rising_step_and_loss_g_is_the_loss() -> None:
    s = steps(DCGAN_LOG)
    assert [(r.step, r.epoch, r.loss) for r in s] == [(30, 0, 57.3842), (32, 1, 56.7433)]


# ---------------------------------------------------------------- step identity in structured records

# rameyjm7/SFT-Training-LLM@dbf63c4:trainer_log.jsonl lines 199-203 (batch9; LLaMA-Factory, two writers interleave
# their copies of each record): "current_steps" is the step, each step counted once.
LLAMAFACTORY_DOUBLED = """
{"current_steps": 1000, "total_steps": 6566, "loss": 0.5602, "lr": 9.439617489181439e-06, "epoch": 1.0661333333333334, "percentage": 15.23, "elapsed_time": "4:12:42", "remaining_time": "23:26:32"}
{"current_steps": 1000, "total_steps": 6566, "loss": 0.5601, "lr": 9.439617489181439e-06, "epoch": 1.0661333333333334, "percentage": 15.23, "elapsed_time": "4:13:32", "remaining_time": "23:31:10"}
{"current_steps": 1010, "total_steps": 6566, "loss": 0.5479, "lr": 9.428562260256644e-06, "epoch": 1.0768, "percentage": 15.38, "elapsed_time": "4:16:18", "remaining_time": "23:29:59"}
{"current_steps": 1020, "total_steps": 6566, "loss": 0.5624, "lr": 9.417405649551203e-06, "epoch": 1.0874666666666666, "percentage": 15.53, "elapsed_time": "4:18:51", "remaining_time": "23:27:29"}
{"current_steps": 1010, "total_steps": 6566, "loss": 0.5478, "lr": 9.428562260256644e-06, "epoch": 1.0768, "percentage": 15.38, "elapsed_time": "4:18:50", "remaining_time": "23:43:54"}
"""


def test_llamafactory_current_steps_is_the_step_and_a_doubled_record_counts_once(tmp_path: Path) -> None:
    s = steps(LLAMAFACTORY_DOUBLED)
    assert [(r.step, r.loss) for r in s] == [(1000, 0.5602), (1010, 0.5479), (1020, 0.5624)]
    # logs.json_repeat_window: the copy of 1010 comes 2 kept records after it; a window of 1 misses it.
    assert Config().logs.json_repeat_window == 4
    short = replaced(Config(), {"logs.json_repeat_window": 1})
    assert [r.steps for r in run(tmp_path, LLAMAFACTORY_DOUBLED, "t.jsonl").ranks] == [3]
    assert [r.steps for r in run(tmp_path, LLAMAFACTORY_DOUBLED, "t.jsonl", cfg=short).ranks] == [4]


def test_the_live_reader_honours_the_logs_keys_analyze_does(tmp_path: Path) -> None:
    """The live agent's stream builds its reader from ``logs:`` as ``analyze`` does: the same
    doubled records give the same steps under the same config, in both."""
    from rankwatch.runtime.watcher import Stream

    path = tmp_path / "t.jsonl"
    path.write_text(LLAMAFACTORY_DOUBLED.strip("\n") + "\n")
    for window, want in ((4, 3), (1, 4)):
        cfg = replaced(Config(), {"logs.json_repeat_window": window})
        parser = Stream(path, cfg, 0, False).parser
        got = [r for i, line in enumerate(path.read_text().splitlines(), 1) for r in parser.feed(line, i)]
        got += parser.finish()
        assert len([r for r in got if isinstance(r, StepRecord)]) == want
        assert [r.steps for r in run(tmp_path, LLAMAFACTORY_DOUBLED, "t.jsonl", cfg=cfg).ranks] == [want]


# LLaMA-Factory trainer_log.jsonl (batch9 llamafactory_mistral_translator_healthy.jsonl).
LLAMAFACTORY = """
{"current_steps": 10, "total_steps": 8660, "loss": 2.4977, "learning_rate": 5.773672055427253e-07, "epoch": 0.004618937644341801, "percentage": 0.12, "elapsed_time": "0:00:24", "remaining_time": "5:58:33", "throughput": "0.00", "total_tokens": 0}
{"current_steps": 20, "total_steps": 8660, "loss": 2.7655, "learning_rate": 1.1547344110854505e-06, "epoch": 0.009237875288683603, "percentage": 0.23, "elapsed_time": "0:00:47", "remaining_time": "5:41:14", "throughput": "0.00", "total_tokens": 0}
"""


def test_llamafactory_current_steps_not_position() -> None:
    assert [r.step for r in steps(LLAMAFACTORY)] == [10, 20]


# BoogaQ/PPO-exploration@0099410:progress.csv, header and first rows (batch9): the
# "total timesteps" column is the step, not the episode count or the position.
PPO_PROGRESS = """
num_episodes,policy_gradient_loss,value_loss,ep_rew_mean,total_loss,total_time,total timesteps,entropy_loss
11,-0.005182718403551173,0.07205698246252723,-628.9608993636364,0.052684879181294324,0.78645920753479,1280,-1.4189385175704956
21,-0.006227885914636348,0.030942515848437324,-551.1840361904761,0.010525245056119244,1.5885744094848633,2560,-1.4189385175704956
34,-0.003845649563208403,0.03825378270994406,-479.72035794117653,0.020218748269053927,2.375253677368164,3840,-1.4189385175704956
"""


def test_rl_progress_csv_total_timesteps_is_the_step() -> None:
    assert [r.step for r in steps(PPO_PROGRESS)] == [1280, 2560, 3840]


# ---------------------------------------------------------------- loss-ish text in capitals, one key a line

# https://github.com/apoorvnandan/speech-recognition-primer/issues/2 (batch9): a Keras callback
# prints "Epoch    :  N" and "LOSS     :  x" on rows of their own; the epoch is the step.
CTC_BLOCKS = """
Epoch    :  5
LOSS     :  24.569025

called epoch end, epoch num:  5
Epoch    :  6
LOSS     :  20.572273

called epoch end, epoch num:  6
BREAK
BREAKating train data 2/10
BREAKating train data 4/10
BREAKating train data 6/10
BREAKating train data 8/10
Epoch    :  7ain data 10/10
LOSS     :  29.43734

called epoch end, epoch num:  7
Epoch    :  8
LOSS     :  nan
"""


def test_padded_capital_rows_are_one_record_per_epoch() -> None:
    # Epoch 5's rows come before the first line the reader is sniffed on, and epoch 7's row is
    # overwritten by a progress line ("Epoch    :  7ain data 10/10"): neither is a record.
    s = steps(CTC_BLOCKS)
    assert [r.step for r in s] == [6, 8]
    assert s[0].loss == 20.572273
    assert s[1].loss is not None and math.isnan(s[1].loss)


# AtariRL/atari-dqn@2e95e3e:progress.csv, header and first rows (batch9): no loss column, an
# episode column and a "steps_done" counter: one record per episode at its environment step.
DQN_PROGRESS = """
episode,episode time,episode_reward,running_reward,steps_done
0,0.7828805213794112,168.0,122.43,389
1,0.5403541754931211,84.0,58.59,645
2,0.6599322035908699,168.0,162.96,975
"""


def test_rl_progress_csv_without_a_loss_is_read_at_its_step_counter() -> None:
    s = steps(DQN_PROGRESS)
    assert [(r.step, r.loss) for r in s] == [(389, None), (645, None), (975, None)]


# facebookresearch/3detr issue 61 (atti0127, 2025-10-10), batch10: "Name [i/n]" counters with
# no ":" between the word and its bracket; the Iter counter is the step, not the record count.
DETR3D_ITERS = """
Epoch [0/1080]; Iter [0/713880]; Loss 36.86; LR 1.00e-06; Iter time 0.86; ETA 7 days, 2:52:36; Mem 11266.68MB
Epoch [0/1080]; Iter [10/713880]; Loss 39.25; LR 2.17e-06; Iter time 0.47; ETA 3 days, 20:36:27; Mem 11358.37MB
Epoch [0/1080]; Iter [20/713880]; Loss 39.06; LR 3.35e-06; Iter time 0.47; ETA 3 days, 21:07:55; Mem 11358.37MB
"""


def test_bracketed_counter_after_its_name_is_the_step() -> None:
    s = steps(DETR3D_ITERS)
    assert [(r.step, r.loss) for r in s] == [(0, 36.86), (10, 39.25), (20, 39.06)]


# CTMX-Zhen/pokemon_classification@12ec6b4:train_log.txt (batch9), from its 'Epoch 3:' line: Keras's
# TqdmCallback through logging tells each val loss twice (the logged value at the batch bar's
# step, then the epoch bar's rounded one at the epoch): one evaluation, no restart; the best
# eval comes before any train loss of the excerpt. Its epoch-end lines, batch bars' ends kept.
KERAS_TQDM = Path(__file__).parent / "data/wild/batch9/keras_tqdm_logging_pokemon_val_loss_rising.log"


def test_keras_tqdm_val_loss_told_twice_rising_is_overfitting(tmp_path: Path) -> None:
    keep = ("Epoch ", "val_loss=", "s/epoch", "| 0.00/171", "| 171/171", "- loss=")
    lines = [ln for ln in KERAS_TQDM.read_text().splitlines() if any(k in ln for k in keep)]
    assert len(lines) > 40
    assert "overfitting" in [k for k, _, _ in serious(run(tmp_path, "\n".join(lines)))]


# Batch9 t5_custom_loop_batch_loss_healthy (a T5 fine-tune's per-batch "Epoch N - Batch loss: x"):
# its 50-record medians wander 29-63% above their best within the batches' own spread.
T5_BATCHES = Path(__file__).parent / "data/wild/batch9/t5_custom_loop_batch_loss_healthy.log"


def test_noisy_per_batch_losses_are_no_divergence(tmp_path: Path) -> None:
    text = T5_BATCHES.read_text()
    assert "loss_divergence" not in [k for k, _, _ in serious(run(tmp_path, text))]
    loud = replaced(Config(), {"detectors.loss_divergence.noise_factor": 0.0})
    assert "loss_divergence" in [k for k, _, _ in serious(run(tmp_path, text, cfg=loud))]


# ---------------------------------------------------------------- headerless rows, RLlib episode statistics

# https://github.com/yitu-opensource/T2T-ViT/issues/26 (timm train.py's summary.csv, pasted without
# its header; timm/utils/summary.py update_summary writes epoch, train_* and eval_* metrics, lr)
TIMM_SUMMARY_ROWS = """
207,4.37085485458374,4.158743778991699,7.820000009155273,24.019999743652345
208,4.367704391479492,4.161868629837036,7.62000002746582,23.86000018310547
209,nan,4.160795520019532,7.7200000274658205,24.01999976196289
210,nan,nan,1.0,5.0
"""


def test_headerless_rows_of_a_rising_counter_are_records_and_a_nan_cell_is_a_nan_loss(tmp_path: Path) -> None:
    s = steps(TIMM_SUMMARY_ROWS)
    assert [r.step for r in s] == [207, 208, 209, 210]
    assert s[0].loss is None and s[1].loss is None  # unnamed finite cells: no loss to judge
    assert s[2].loss is not None and math.isnan(s[2].loss)
    assert serious(run(tmp_path, TIMM_SUMMARY_ROWS))[:1] == [("nan_loss", 0, 209)]
    # A first column that does not rise, or rows of changing width: no table of bare rows.
    assert steps("10,1.5,2.5\n5,1.4,2.4\n30,1.3,2.3\n40,1.2,nan\n") == []
    assert steps("10,1.5,2.5\n20,1.4\n30,1.3,2.3\n40,1.2,nan\n") == []


def test_a_header_still_names_the_columns_of_the_rows_after_it() -> None:
    # YOLOv5's results.csv (header with an epoch and loss columns): its rows are CSV rows, not bare.
    text = "epoch,train/box_loss,train/obj_loss,metrics/mAP_0.5\n0,0.1,0.05,0.2\n1,0.09,0.04,0.3\n2,0.08,0.03,0.4\n"
    s = steps(text)
    assert [(r.step, r.loss) for r in s] == [(0, 0.1 + 0.05), (1, 0.09 + 0.04), (2, 0.08 + 0.03)]


# https://github.com/ray-project/ray/issues/10416 (RLlib's pretty_print of a result in which no episode
# ended: summarize_episodes writes float("nan") for the reward and length statistics then)
RLLIB_NO_EPISODE = """
episode_len_mean: .nan
episode_reward_max: .nan
episode_reward_mean: .nan
episode_reward_min: .nan
episodes_this_iter: 0
episodes_total: 0
"""


def test_rllib_episode_statistics_are_one_iteration_record_with_no_loss(tmp_path: Path) -> None:
    s = steps(RLLIB_NO_EPISODE)
    assert len(s) == 1 and s[0].loss is None
    result = run(tmp_path, RLLIB_NO_EPISODE)
    assert result.recognised_any and serious(result) == []
    # The same statistics without the iteration's episode counter: no record (a stats dump).
    assert steps("episode_len_mean: .nan\nepisode_reward_mean: .nan\n") == []


# deepspeedai/DeepSpeedExamples@45b4b7156c8794a3452a5a7d03dbd8d797068569:applications/DeepSpeed-Chat/
# training/step3_rlhf_finetuning/training_log_output/actor_opt-1.3b_critic_opt-350m_globalBatchSize64.log
# (a healthy PPO run: the actor's and critic's losses swing and change sign) and
# https://github.com/deepspeedai/DeepSpeedExamples/issues/444 (the same print going inf)
DSCHAT_PPO = """
epoch: 0|step: 107|ppo_ep: 1|act_loss: 0.1241455078125|cri_loss: 0.10479736328125|unsuper_loss: 0.0
epoch: 0|step: 108|ppo_ep: 1|act_loss: -1.0703125|cri_loss: -0.34423828125|unsuper_loss: 0.0
epoch: 0|step: 109|ppo_ep: 1|act_loss: -0.70654296875|cri_loss: -0.2393798828125|unsuper_loss: 0.0
epoch: 0|step: 110|ppo_ep: 1|act_loss: 0.35400390625|cri_loss: 0.2198486328125|unsuper_loss: 0.0
epoch: 0|step: 111|ppo_ep: 1|act_loss: 1.591796875|cri_loss: 0.94677734375|unsuper_loss: 0.0
epoch: 0|step: 112|ppo_ep: 1|act_loss: 2.216796875|cri_loss: 1.3603515625|unsuper_loss: 0.0
epoch: 0|step: 113|ppo_ep: 1|act_loss: 1.38671875|cri_loss: 0.8466796875|unsuper_loss: 0.0
"""
DSCHAT_INF = "epoch: 0|step: 3184|ppo_ep: 1|act_loss: inf|cri_loss: inf|unsuper_loss: 0.0\n"


def test_rl_objectives_are_records_judged_only_for_nan(tmp_path: Path) -> None:
    s = steps(DSCHAT_PPO)
    assert [r.step for r in s] == list(range(107, 114)) and all(r.loss is None for r in s)
    assert serious(run(tmp_path, DSCHAT_PPO)) == []
    s = steps(DSCHAT_PPO + DSCHAT_INF)
    assert s[-1].step == 3184 and s[-1].loss is not None and math.isnan(s[-1].loss)
    assert ("nan_loss", 0, 3184) in serious(run(tmp_path, DSCHAT_PPO + DSCHAT_INF))
    # A loss that is no RL objective is still summed from its parts and judged as before.
    assert steps("step: 5|loss_cls: 0.5|loss_box: 0.25\n")[0].loss == 0.75


def test_an_iteration_still_rising_when_the_epoch_moves_on_counts_the_run() -> None:
    # 3DETR's engine.py prints Iter [curr_iter/max_iters] with curr_iter = curr_epoch *
    # len(loader) + batch: at its first epoch change (these two lines follow that print, the
    # loader 661 batches long as 713880 / 1080 says) the step goes on from 660, not from 713880.
    text = DETR3D_ITERS + (
        "Epoch [0/1080]; Iter [660/713880]; Loss 30.12; LR 6.00e-05; Iter time 0.47; ETA 3 days, 21:00:00; "
        "Mem 11358.37MB\n"
        "Epoch [1/1080]; Iter [670/713880]; Loss 30.05; LR 6.10e-05; Iter time 0.47; ETA 3 days, 21:00:00; "
        "Mem 11358.37MB\n"
    )
    s = steps(text)
    assert [r.step for r in s] == [0, 10, 20, 660, 670] and s[-1].total_steps == 713880
    # The tutorial's counter starts again at each epoch: it counts within it (steps keep rising).
    s = steps(TUTORIAL_STEPS)
    assert s[0].step is not None and s[1].step is not None and s[1].step > s[0].step


# https://github.com/PaddlePaddle/PaddleOCR/issues/11054 (turn 0): ppocr/utils/stats.py formats
# each value as '{}: {:x<6f}', so a NaN is "nanxxx" (wild batch 11).
PADDLEOCR = """
[2023/10/06 13:31:29] ppocr INFO: epoch: [2/500], global_step: 920, lr: 0.000243, acc: 0.000000, norm_edit_dis: 0.000000, CTCLoss: nanxxx, SARLoss: nanxxx, loss: nanxxx, avg_reader_cost: 0.00015 s, avg_batch_cost: 0.51186 s, avg_samples: 128.0, ips: 250.06955 samples/s, eta: 2 days, 21:06:39
"""


def test_paddleocr_pads_a_nan_with_x() -> None:
    [s] = steps(PADDLEOCR)
    assert s.step == 920 and s.loss is not None and math.isnan(s.loss)
    assert s.learning_rate == 0.000243
