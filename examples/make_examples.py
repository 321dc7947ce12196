"""Regenerates the example logs in this folder (deterministic: fixed seeds).

    python examples/make_examples.py

Each example is a realistic multi-rank incident written in a real framework's format:
- megatron-nan/: 4 ranks of a Megatron-LM GPT run whose grad norm blows up into NaN.
- hf-oom/: one torchrun log (`--tee 3` prefixes) of a 2-rank HF Trainer run; rank 1 dies of
  CUDA OOM, rank 0 then hits the NCCL watchdog timeout, torchelastic reports the failure.
- healthy-nanogpt/: 2 ranks of a nanoGPT run that trains normally (analyze exits 0).
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = datetime(2026, 11, 20, 9, 0, 0, tzinfo=timezone.utc)

# Each example folder and the log format it is written in (a name in the parser registry,
# rankwatch.sources.parsers.FORMATS; tests/test_catalogs.py checks both).
FORMATS = {"megatron-nan": "megatron", "hf-oom": "hf", "healthy-nanogpt": "nanogpt"}


def nccl_preamble(rank: int, world: int, pid: int) -> list[str]:
    host = f"gpu-node{rank // 8 + 1:02d}"
    lines = [
        f"{host}:{pid}:{pid} [{rank % 8}] NCCL INFO Bootstrap : Using eth0:10.0.0.{rank + 1}<0>",
        f"{host}:{pid}:{pid} [{rank % 8}] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
        f"{host}:{pid}:{pid} [{rank % 8}] NCCL INFO cudaDriverVersion 12040",
        "NCCL version 2.21.5+cuda12.4" if rank == 0 else "",
        f"{host}:{pid}:{pid + 60} [{rank % 8}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0",
        f"{host}:{pid}:{pid + 60} [{rank % 8}] NCCL INFO comm 0x5581c2d0 rank {rank} nranks {world} cudaDev "
        f"{rank % 8} nvmlDev {rank % 8} busId {0x18 + rank:x}000 commId 0x7d3a94e1c5b2f0a1 - Init START",
    ]
    for ch in range(4):
        lines.append(
            f"{host}:{pid}:{pid + 60} [{rank % 8}] NCCL INFO Channel {ch:02d}/04 :    "
            + "   ".join(str(r) for r in range(world))
        )
    lines.append(f"{host}:{pid}:{pid + 60} [{rank % 8}] NCCL INFO Connected all rings")
    lines.append(
        f"{host}:{pid}:{pid + 60} [{rank % 8}] NCCL INFO comm 0x5581c2d0 rank {rank} nranks {world} "
        f"cudaDev {rank % 8} nvmlDev {rank % 8} busId {0x18 + rank:x}000 commId 0x7d3a94e1c5b2f0a1 - Init COMPLETE"
    )
    return [x for x in lines if x]


def megatron_nan() -> None:
    out = HERE / "megatron-nan"
    out.mkdir(exist_ok=True)
    world, total, nan_at = 4, 500000, 1300
    for rank in range(world):
        rng = random.Random(100 + rank)
        lines = [
            "using world size: 4, data-parallel size: 4, context-parallel size: 1, tensor-model-parallel size: 1, "
            "pipeline-model-parallel size: 1",
            "using torch.bfloat16 for parameters ...",
            "------------------------ arguments ------------------------",
            "  lr .............................................. 0.0003",
            "  lr_warmup_iters ................................. 200",
            "  micro_batch_size ................................ 4",
            "  global_batch_size ............................... 256",
            "-------------------- end of arguments ---------------------",
            "> building GPT model ...",
            f" > number of parameters on (tensor, pipeline) model parallel rank ({rank}, 0): 1315577856",
        ]
        lines += nccl_preamble(rank, world, 41200 + rank)
        lines.append(
            f"[after model, optimizer, and learning rate scheduler are built] datetime: "
            f"{T0:%Y-%m-%d %H:%M:%S}"
        )
        t = T0 + timedelta(seconds=95)
        it = 0
        for it in range(10, nan_at + 40, 10):
            step_ms = 38211.4 if it == 10 else 1532.0 * (1 + rng.gauss(0, 0.01))
            t += timedelta(milliseconds=step_ms * 10 if it > 10 else step_ms)
            lr = 3e-4 * min(1.0, it / 200) * (0.5 * (1 + math.cos(math.pi * it / total)))
            loss = 2.9 + 8.1 * math.exp(-it / 260) + rng.gauss(0, 0.02)
            grad = (4.0 * math.exp(-it / 60) + 0.45) * (1 + rng.gauss(0, 0.08))
            nan_iters = 0
            if nan_at - 50 <= it < nan_at:
                k = (it - (nan_at - 50)) // 10
                grad = 0.5 * 4.2 ** (k + 1)
                loss += 0.15 * k * k
            if it >= nan_at:
                loss, grad, nan_iters = math.nan, math.nan, 10
            tflops = 0.0 if it == 10 else 178.4 * (1 + rng.gauss(0, 0.01))
            ts = f"[{t:%Y-%m-%d %H:%M:%S}]"
            lossf = "nan" if math.isnan(loss) else f"{loss:.6E}"
            gradf = "nan" if math.isnan(grad) else f"{grad:.3f}"
            lines.append(
                f" {ts} iteration {it:>8}/{total:>8} | consumed samples: {it * 256:>12} | elapsed time per "
                f"iteration (ms): {step_ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: "
                f"{lr:.6E} | global batch size:   256 | lm loss: {lossf} | loss scale: 1.0 | grad norm: {gradf} | "
                f"number of skipped iterations:   0 | number of nan iterations: {nan_iters:>3} |"
            )
            if it == 10 and rank == 0:
                lines.append(
                    "[Rank 0] (after 10 iterations) memory (MB) | allocated: 31833.5 | max allocated: "
                    "52218.9 | reserved: 56420.0 | max reserved: 56420.0"
                )
            if it % 500 == 0:
                vl = 2.95 + 8.1 * math.exp(-it / 260) + rng.gauss(0, 0.01)
                bar = "-" * 100
                lines += [
                    bar,
                    f" validation loss at iteration {it} | lm loss value: {vl:.6E} | lm loss PPL: "
                    f"{math.exp(vl):.6E} | ",
                    bar,
                ]
        (out / f"rank-{rank}.log").write_text("\n".join(lines) + "\n")


def hf_oom() -> None:
    out = HERE / "hf-oom"
    out.mkdir(exist_ok=True)
    rng = random.Random(7)
    total = 3000
    lines: list[str] = [
        "W1120 09:00:01.231000 51200 torch/distributed/run.py:793] ",
        "W1120 09:00:01.231000 51200 torch/distributed/run.py:793] *****************************************",
        "W1120 09:00:01.231000 51200 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable "
        "for each process to be 1 in default, to avoid your system being overloaded, please further tune the "
        "variable for optimal performance in your application as needed. ",
        "W1120 09:00:01.231000 51200 torch/distributed/run.py:793] *****************************************",
    ]
    for r in range(2):
        lines += [f"[default{r}]:" + x for x in nccl_preamble(r, 2, 51210 + r)]
    lines += [
        "[default0]:[INFO|trainer.py:2314] 2026-11-20 09:00:40,112 >> ***** Running training *****",
        "[default0]:[INFO|trainer.py:2315] 2026-11-20 09:00:40,112 >>   Num examples = 192,000",
        "[default0]:[INFO|trainer.py:2320] 2026-11-20 09:00:40,112 >>   Total optimization steps = 3,000",
    ]
    crash_at = 1240
    for step in range(1, crash_at + 1):
        pct = int(100 * step / total)
        if step % 5 == 0 or step == 1:
            el = step * 1.02
            rem = (total - step) * 1.02
            lines.append(
                f"[default0]:\r{pct:3d}%|{'█' * (pct // 10):<10}| {step}/{total} "
                f"[{int(el // 60):02d}:{int(el % 60):02d}<{int(rem // 60):02d}:{int(rem % 60):02d},  0.98it/s]"
            )
        if step % 10 == 0:
            loss = 1.55 + 1.9 * math.exp(-step / 400) + rng.gauss(0, 0.015)
            grad = (2.5 if step < 100 else 0.42) * (1 + rng.gauss(0, 0.1))
            lr = 2e-5 * min(1.0, step / 100) * (1 - step / total)
            lines.append(
                f"[default0]:{{'loss': '{loss:.4f}', 'grad_norm': '{grad:.4f}', 'learning_rate': '{lr:.3e}', "
                f"'epoch': '{step / 1000:.2f}'}}"
            )
        if step % 500 == 0:
            ev = 1.62 + 1.9 * math.exp(-step / 400) + rng.gauss(0, 0.01)
            lines.append(
                f"[default0]:{{'eval_loss': '{ev:.4f}', 'eval_runtime': '41.2', 'eval_samples_per_second': "
                f"'97.09', 'eval_steps_per_second': '3.034', 'epoch': '{step / 1000:.2f}'}}"
            )
    lines += [
        "[default1]:[rank1]: Traceback (most recent call last):",
        '[default1]:[rank1]:   File "/workspace/train.py", line 212, in <module>',
        "[default1]:[rank1]:     main()",
        '[default1]:[rank1]:   File "/workspace/train.py", line 205, in main',
        "[default1]:[rank1]:     trainer.train()",
        '[default1]:[rank1]:   File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 2241, '
        "in train",
        "[default1]:[rank1]:     return inner_training_loop(",
        '[default1]:[rank1]:   File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 2548, '
        "in _inner_training_loop",
        "[default1]:[rank1]:     tr_loss_step = self.training_step(model, inputs, num_items_in_batch)",
        '[default1]:[rank1]:   File "/opt/conda/lib/python3.11/site-packages/torch/autograd/graph.py", line 825, '
        "in _engine_run_backward",
        "[default1]:[rank1]:     return Variable._execution_engine.run_backward(  # Calls into the C++ engine "
        "to run the backward pass",
        "[default1]:[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 1 has a "
        "total capacity of 79.15 GiB of which 2.12 GiB is free. Including non-PyTorch memory, this process has "
        "77.02 GiB memory in use. Of the allocated memory 71.33 GiB is allocated by PyTorch, and 4.87 GiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "[default0]:[rank0]:[E1120 09:31:40.118023 51210 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=24817, OpType=ALLREDUCE, NumelIn=131334144, "
        "NumelOut=131334144, Timeout(ms)=600000) ran for 600085 milliseconds before timing out.",
        "[default0]:[rank0]:[E1120 09:31:40.118290 51210 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0] Exception (either an error or timeout) detected by watchdog at work: 24817, last enqueued NCCL "
        "work: 24817, last completed NCCL work: 24816.",
        "W1120 09:31:41.002000 51200 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 51210 "
        "closing signal SIGTERM",
        "E1120 09:31:41.520000 51200 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        "local_rank: 1 (pid: 51211) of binary: /opt/conda/bin/python",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-20_09:31:41",
        "  host      : gpu-node01",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 51211)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ]
    (out / "train.log").write_text("\n".join(lines) + "\n")


def healthy_nanogpt() -> None:
    out = HERE / "healthy-nanogpt"
    out.mkdir(exist_ok=True)
    for rank in range(2):
        rng = random.Random(300 + rank)
        lines = [
            "Overriding config with config/train_shakespeare_char.py:",
            "tokens per iteration will be: 16,384",
            "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)",
            "Initializing a new model from scratch",
            "number of parameters: 10.65M",
            "num decayed parameter tensors: 26, with 10,740,096 parameters",
            "num non-decayed parameter tensors: 13, with 4,992 parameters",
            "using fused AdamW: True",
            "compiling the model... (takes a ~minute)",
        ]
        for it in range(0, 5001):
            if it % 250 == 0:
                tl = 1.0 + 3.2 * math.exp(-it / 700) + rng.gauss(0, 0.005)
                vl = tl + 0.07 + rng.gauss(0, 0.01)
                lines.append(f"step {it}: train loss {tl:.4f}, val loss {vl:.4f}")
                if it:
                    lines.append("saving checkpoint to out-shakespeare-char")
            if it % 10 == 0:
                loss = 1.0 + 3.2 * math.exp(-it / 700) + rng.gauss(0, 0.04)
                ms = 28521.33 if it == 0 else 41.2 * (1 + rng.gauss(0, 0.03))
                mfu = -100.0 if it < 5 else 24.6 * (1 + rng.gauss(0, 0.01))
                lines.append(f"iter {it}: loss {loss:.4f}, time {ms:.2f}ms, mfu {mfu:.2f}%")
        (out / f"rank-{rank}.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    megatron_nan()
    hf_oom()
    healthy_nanogpt()
