from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.records import ErrorRecord, Severity
from rankwatch.sources.signatures import SignatureMatcher, classify

pytestmark = pytest.mark.unit

GiB = 1 << 30
MiB = 1 << 20


def run(text: str, rank: int | None = 0, flush: bool = True) -> list[ErrorRecord]:
    m = SignatureMatcher()
    out: list[ErrorRecord] = []
    for i, line in enumerate(textwrap.dedent(text).strip("\n").split("\n"), 1):
        out.extend(m.feed(line, i, rank, 1000.0 + i))
    if flush:
        out.extend(m.flush())
    return out


def one(text: str) -> ErrorRecord:
    recs = run(text)
    assert len(recs) == 1, recs
    return recs[0]


# -- out of memory ---------------------------------------------------------------------


OOM_NEW_TB = """\
    Traceback (most recent call last):
      File "/workspace/train.py", line 301, in <module>
        main()
      File "/workspace/train.py", line 278, in main
        loss = model(batch).loss
               ^^^^^^^^^^^^
      File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1736, in _wrapped_call_impl
        return self._call_impl(*args, **kwargs)
    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.11 GiB of which 6.00 MiB is free. Including non-PyTorch memory, this process has 79.10 GiB memory in use. Of the allocated memory 77.20 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
    """  # noqa: E501


def test_oom_new_wording_in_traceback_is_one_oom_record_with_the_traceback() -> None:
    rec = one(OOM_NEW_TB + "step 10 done\n")
    assert rec.kind == "oom"
    assert rec.severity is Severity.CRITICAL
    assert rec.summary.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB")
    assert rec.evidence[0] == "Traceback (most recent call last):"
    assert len(rec.evidence) == 9
    assert rec.evidence[-1].startswith("torch.OutOfMemoryError")
    d = rec.details
    assert d["tried_bytes"] == 20 * MiB
    assert d["gpu"] == 0
    assert d["total_bytes"] == pytest.approx(79.11 * GiB, rel=1e-6)
    assert d["free_bytes"] == 6 * MiB
    assert d["exception"] == "torch.OutOfMemoryError"
    assert d["frame"] == "/workspace/train.py:278 main"
    assert d["first_line"] == 1
    assert rec.line == 9 and rec.rank == 0 and rec.time == 1009.0


def test_oom_record_waits_for_the_next_line_or_flush() -> None:
    m = SignatureMatcher()
    lines = textwrap.dedent(OOM_NEW_TB).strip("\n").split("\n")
    got = [r for i, line in enumerate(lines, 1) for r in m.feed(line, i)]
    assert got == [] and m.waiting
    assert [r.kind for r in m.release()] == ["oom"]
    assert not m.busy


def test_xla_cumemallocasync_out_of_memory_is_oom() -> None:
    # NovaSky-AI/SkyRL#624 (JAX on an 80 GB GPU): XLA's async allocator names the driver's error.
    rec = one(
        "E1103 18:23:55.103160 3413767 gpu_cudamallocasync_allocator.cc:361] gpu_async_1 "
        "cuMemAllocAsync failed to allocate 1225195446464 bytes: RESOURCE_EXHAUSTED: : "
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    )
    assert rec.kind == "oom"


def test_oom_old_wording() -> None:
    rec = one(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total capacity; "
        "75.10 GiB already allocated; 1.50 GiB free; 77.00 GiB reserved in total by "
        "PyTorch) If reserved memory "
        "is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
    )
    assert rec.kind == "oom"
    assert rec.details["tried_bytes"] == 2 * GiB
    assert rec.details["gpu"] == 3
    assert rec.details["free_bytes"] == int(1.5 * GiB)
    assert rec.details["allocated_bytes"] == int(75.10 * GiB)
    assert "host" not in rec.details


def test_oom_typo_capacty_and_zero_bytes_free() -> None:
    rec = one(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 1 has a total "
        "capacty of 6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is "
        "allocated by PyTorch"
    )
    assert (
        rec.details["free_bytes"] == 0 and rec.details["gpu"] == 1 and rec.details["total_bytes"] == 6 * GiB
    )


@pytest.mark.parametrize(
    ("line", "extra"),
    [
        ("slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of the step "
         "tasks have been OOM Killed.",
         {"events": 1, "step": "1234.0"}),
        ("slurmstepd: error: Detected 2 oom-kill event(s) in step 3495064.batch cgroup. "
         "Some of your processes may "
         "have been killed by the cgroup out-of-memory handler.", {"events": 2, "step": "3495064.batch"}),
        ("srun: error: node01: task 4: Out Of Memory", {"task": 4, "node": "node01"}),
        ("MemoryError", {}),
        ("[12345.678] Out of memory: Killed process 4242 (python)", {"pid": 4242, "process": "python"}),
        ("[ 5012.345678] Memory cgroup out of memory: Killed process 4242 (python3) total-vm:91234567kB, "
         "anon-rss:81234567kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:160000kB oom_score_adj:0",
         {"pid": 4242, "process": "python3"}),
    ],
)  # fmt: skip
def test_host_oom(line: str, extra: dict[str, object]) -> None:
    rec = one(line)
    assert rec.kind == "oom"
    assert rec.details["host"] is True
    for k, v in extra.items():
        assert rec.details[k] == v


KILLED = "killed (SIGKILL: the kernel OOM killer, scancel or a time limit)"


def test_dataloader_worker_killed_is_a_kill_whose_sender_is_not_named() -> None:
    # https://github.com/hezhangsprinter/DCPDN/issues/12: nothing says who sent the SIGKILL.
    rec = one("RuntimeError: DataLoader worker (pid 19597) is killed by signal: Killed.")
    assert (rec.kind, rec.details["dataloader"], rec.details["signal"]) == ("crash", True, "SIGKILL")
    assert KILLED in rec.summary


@pytest.mark.parametrize(
    "line",
    [
        "Killed",
        "/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed                  python3 main.py",
    ],
)
def test_killed_alone_is_a_crash_that_names_who_sends_sigkill(line: str) -> None:
    # bash only knows the signal: the OOM killer, scancel and a time limit all send SIGKILL.
    rec = one(line)
    assert (rec.kind, rec.severity) == ("crash", Severity.CRITICAL)
    assert rec.details["signal"] == "SIGKILL" and KILLED in rec.summary


@pytest.mark.parametrize(
    "oom_line",
    [
        "slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of the step tasks have been "
        "OOM Killed.",
        "[ 5012.345678] Out of memory: Killed process 8156 (python3) total-vm:91234567kB, "
        "anon-rss:81234567kB",
    ],
)
def test_killed_just_after_an_oom_kill_line_is_that_oom(oom_line: str) -> None:
    recs = run(f"{oom_line}\nsome output\nKilled")
    assert [(r.kind, r.details.get("host")) for r in recs] == [("oom", True), ("oom", True)]
    assert recs[1].details["signal"] == "SIGKILL" and "OOM killer" in recs[1].summary


def test_killed_long_after_an_oom_kill_line_is_a_crash() -> None:
    noise = "\n".join(f"step {i}" for i in range(200))
    recs = run("[1.0] Out of memory: Killed process 1 (python)\n" + noise + "\nKilled")
    assert [r.kind for r in recs] == ["oom", "crash"]


def test_memory_error_traceback_is_host_oom() -> None:
    rec = one(
        """
        Traceback (most recent call last):
          File "/w/data.py", line 12, in load
            arr = np.zeros((1 << 40,))
        MemoryError
        """
    )
    assert rec.kind == "oom" and rec.details["host"] is True and rec.details["frame"] == "/w/data.py:12 load"


# -- NCCL ------------------------------------------------------------------------------


NCCL_TIMEOUT_LOG = """\
    [E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=158046, OpType=GATHER, NumelIn=2867200, NumelOut=0, Timeout(ms)=600000) ran for 600027 milliseconds before timing out.
    [E ProcessGroupNCCL.cpp:1537] [PG 1 Rank 1] Timeout at NCCL work: 158046, last enqueued NCCL work: 158046, last completed NCCL work: 158045.
    [E ProcessGroupNCCL.cpp:577] [Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
    [E ProcessGroupNCCL.cpp:583] [Rank 1] To avoid data inconsistency, we are taking the entire process down.
    [E ProcessGroupNCCL.cpp:1414] [PG 1 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=158046, OpType=GATHER, NumelIn=2867200, NumelOut=0, Timeout(ms)=600000) ran for 600027 milliseconds before timing out.
    Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 (most recent call first):
    frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f8c in /usr/lib/python3/dist-packages/torch/lib/libc10.so)
    frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout() + 0x1d2 (0x7f3b in /usr/lib/python3/dist-packages/torch/lib/libtorch_cuda.so)
    terminate called after throwing an instance of 'c10::DistBackendError'
      what():  [PG 1 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=158046, OpType=GATHER, NumelIn=2867200, NumelOut=0, Timeout(ms)=600000) ran for 600027 milliseconds before timing out.
    """  # noqa: E501


def test_nccl_watchdog_timeout_is_one_record_however_often_it_is_repeated() -> None:
    rec = one(NCCL_TIMEOUT_LOG)
    assert rec.kind == "nccl_timeout"
    assert rec.details == {"seq_num": 158046, "op_type": "GATHER", "timeout_ms": 600000, "ran_for_ms": 600027}
    assert rec.line == 1


def test_nccl_timeout_old_wording_without_numel() -> None:
    rec = one(
        "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 "
        "milliseconds before timing out."
    )
    assert rec.details == {
        "seq_num": 469508,
        "op_type": "ALLREDUCE",
        "timeout_ms": 1800000,
        "ran_for_ms": 1802212,
    }


def test_nccl_heartbeat_watchdog_stuck() -> None:
    rec = one(
        "[E704 13:48:58.260494728 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in "
        "monitoring enqueued "
        "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) "
        "hang blocking the watchdog"
    )
    assert rec.kind == "nccl_timeout" and rec.details["watchdog_stuck_s"] == 480


def test_nccl_error_traceback_with_multiline_message() -> None:
    rec = one(
        """
        Traceback (most recent call last):
          File "/lus/bench/train.py", line 301, in <module>
            main()
          File "/usr/local/lib/python3.12/dist-packages/torch/distributed/utils.py", line 281, in _verify
            return dist._verify_params_across_processes(process_group, tensors, logger)
        torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network error, NCCL version 2.28.8
        ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
        Last error:
        NET/OFI Request 0x7f14cc5b60c0 completed with error. RC: 113. Error: 2 (UNDELIVERABLE). Completed length: 0
        iteration 5 restarted
        """  # noqa: E501
    )
    assert rec.kind == "nccl_error" and rec.severity is Severity.CRITICAL
    assert rec.details["error"] == "remote process exited or there was a network error"
    assert rec.details["nccl_version"] == "2.28.8"
    assert rec.details["exception"] == "torch.distributed.DistBackendError"
    assert rec.evidence[-1].startswith("NET/OFI Request")
    assert rec.summary.startswith("torch.distributed.DistBackendError: NCCL error in:")


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
        "unhandled system error, "
        "NCCL version 2.7.8",
        "RuntimeError: NCCL Error 2: unhandled system error",
        "RuntimeError: NCCL communicator was aborted on rank 2. Original reason for failure was: NCCL error: "
        "remote process exited",
        "ncclInternalError: Internal check failed.",
    ],
)
def test_nccl_errors(line: str) -> None:
    rec = one(line)
    assert rec.kind == "nccl_error" and rec.severity is Severity.CRITICAL


def test_communicator_aborted_by_watchdog_timeout_is_a_timeout() -> None:
    rec = one(
        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 2. "
        "Original reason for failure "
        "was: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=BROADCAST, "
        "NumelIn=112, NumelOut=112, Timeout(ms)=1800000) ran for 1800010 milliseconds before timing out."
    )
    assert rec.kind == "nccl_timeout" and rec.details["seq_num"] == 7


def test_nccl_warn_is_a_warning_and_does_not_flood() -> None:
    lines = [
        f"kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
        f"10.216.210.236<{50000 + i}> with status=12 opcode=0 len=0 vendor err 129 (Recv)"
        for i in range(50)
    ]
    recs = run("\n".join(lines))
    assert len(recs) == 1
    assert recs[0].kind == "nccl_error" and recs[0].severity is Severity.WARNING


def test_nccl_info_lines_are_noise() -> None:
    noise = """
        node17-2:36748:36748 [0] NCCL INFO Using network IB
        node17-2:36754:36754 [6] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB ens5f0np0:192.168.89.206<0>
        node17-2:36754:36754 [6] NCCL INFO ncclCommInitRank comm 0xa624cf0 rank 6 nranks 8 cudaDev 6 nvmlDev 6 busId 90000 commId 0x551d - Init START
        dgx1v-loki-23:5892:6289 [2] NCCL INFO misc/socket.cc:47 -> 3
        a100-st-p4d24xlarge-22:183006:183220 [1] NCCL INFO transport/net_socket.cc:368 -> 6 ncclRemoteError
        """  # noqa: E501
    assert run(noise) == []


# -- CUDA and the driver ------------------------------------------------------------------


CUDA_TB = """\
    Traceback (most recent call last):
      File "/workspace/train.py", line 88, in train_step
        loss.backward()
      File "/usr/lib/python3.10/site-packages/torch/_tensor.py", line 521, in backward
        torch.autograd.backward(
    RuntimeError: CUDA error: an illegal memory access was encountered
    CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
    For debugging consider passing CUDA_LAUNCH_BLOCKING=1
    Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
    """  # noqa: E501


def test_cuda_error_traceback_keeps_the_advice_lines_as_evidence() -> None:
    rec = one(CUDA_TB)
    assert rec.kind == "cuda_error"
    assert rec.details["error"] == "an illegal memory access was encountered"
    assert rec.evidence[-1] == "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
    assert rec.line == 6


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("RuntimeError: CUDA error: device-side assert triggered", "device_assert"),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "ecc"),
        ("RuntimeError: CUDA error: unspecified launch failure", None),
        ("  what():  CUDA error: an illegal memory access was encountered", None),
        ("cudaErrorLaunchFailure: unspecified launch failure", None),
        (
            "[PG 0 Rank 3] Process group watchdog thread terminated with exception: CUDA "
            "error: misaligned address",
            None,
        ),
    ],
)
def test_cuda_errors(line: str, key: str | None) -> None:
    rec = one(line)
    assert rec.kind == "cuda_error"
    if key:
        assert rec.details[key] is True


def test_cuda_error_then_its_cpp_stack_is_one_record() -> None:
    recs = run(
        """
        terminate called after throwing an instance of 'c10::Error'
          what():  CUDA error: an illegal memory access was encountered
        CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
        For debugging consider passing CUDA_LAUNCH_BLOCKING=1.
        Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most recent call first):
        frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7ff6 in /x/torch/lib/libc10.so)
        frame #1: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool) + 0x118
        """  # noqa: E501
    )
    assert [r.kind for r in recs] == ["cuda_error"]
    assert len(recs[0].evidence) == 6


def test_xid() -> None:
    rec = one(
        "[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    )
    assert rec.kind == "xid" and rec.severity is Severity.CRITICAL
    assert rec.details["xid"] == 79 and rec.details["pci"] == "0000:3b:00" and rec.details["pid"] == "1234"
    app = one("kernel: NVRM: Xid (PCI:0000:19:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception")
    assert app.details["xid"] == 13 and app.severity is Severity.WARNING and "pid" not in app.details


# -- crashes -------------------------------------------------------------------------------


def test_plain_traceback_is_a_crash() -> None:
    recs = run(
        """
        {'loss': 1.2, 'epoch': 0.1}
        Traceback (most recent call last):
          File "/w/train.py", line 40, in <module>
            main(cfg)
          File "/w/train.py", line 31, in main
            batch = next(it)
          File "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 630, in __next__
            data = self._next_data()
        KeyError: 'input_ids'
        {'loss': 1.1, 'epoch': 0.2}
        """
    )
    assert len(recs) == 1
    rec = recs[0]
    assert rec.kind == "crash" and rec.summary == "KeyError: 'input_ids'"
    assert rec.details["exception"] == "KeyError" and rec.details["message"] == "'input_ids'"
    assert rec.details["frame"] == "/w/train.py:31 main"
    assert rec.line == 9 and rec.details["first_line"] == 2 and len(rec.evidence) == 8


def test_chained_traceback_is_one_record_named_by_the_root_cause() -> None:
    recs = run(
        CUDA_TB
        + """
    During handling of the above exception, another exception occurred:

    Traceback (most recent call last):
      File "/workspace/train.py", line 120, in <module>
        main()
      File "/workspace/train.py", line 95, in main
        save_checkpoint(model)
    RuntimeError: checkpoint save failed
    """
    )
    assert len(recs) == 1
    rec = recs[0]
    assert rec.kind == "cuda_error"
    assert rec.summary == "RuntimeError: checkpoint save failed"
    assert rec.details["chained"] == 2
    assert rec.details["frame"] == "/workspace/train.py:95 main"
    assert rec.evidence[0] == "Traceback (most recent call last):"
    assert rec.evidence[-1] == "RuntimeError: checkpoint save failed"
    assert "During handling of the above exception, another exception occurred:" in rec.evidence


def test_direct_cause_chain() -> None:
    rec = one(
        """
        Traceback (most recent call last):
          File "/w/a.py", line 1, in f
        ValueError: inner

        The above exception was the direct cause of the following exception:

        Traceback (most recent call last):
          File "/w/a.py", line 9, in g
        RuntimeError: outer
        """
    )
    assert rec.kind == "crash" and rec.summary == "RuntimeError: outer" and rec.details["chained"] == 2


def test_two_separate_tracebacks_are_two_records() -> None:
    tb = 'Traceback (most recent call last):\n  File "/w/a.py", line 1, in f\nValueError: {}\n'
    recs = run(tb.format("one") + tb.format("two"))
    assert [r.summary for r in recs] == ["ValueError: one", "ValueError: two"]


def test_traceback_cut_short_by_end_of_stream() -> None:
    rec = one('Traceback (most recent call last):\n  File "/w/a.py", line 7, in f\n    g()')
    assert rec.kind == "crash" and rec.details["incomplete"] is True and rec.details["frame"] == "/w/a.py:7 f"


def test_long_traceback_evidence_is_capped_keeping_first_and_last() -> None:
    frames = "".join(f'  File "/w/rec.py", line {i}, in f\n    f()\n' for i in range(1000))
    rec = one(
        "Traceback (most recent call last):\n" + frames + "RecursionError: maximum recursion depth exceeded\n"
    )
    assert len(rec.evidence) == 201
    assert rec.evidence[0] == "Traceback (most recent call last):"
    assert rec.evidence[100].startswith("... ") and "omitted" in rec.evidence[100]
    assert rec.evidence[-1] == "RecursionError: maximum recursion depth exceeded"


CHILD_FAILED = """\
    E0501 10:00:01.123000 1200 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 1 (pid: 1234) of binary: /usr/bin/python
    Traceback (most recent call last):
      File "/usr/local/bin/torchrun", line 8, in <module>
        sys.exit(main())
      File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 346, in wrapper
        return f(*args, **kwargs)
      File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 250, in launch_agent
        raise ChildFailedError(
    torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2024-05-01_10:00:01
      host      : node01
      rank      : 2 (local_rank: 2)
      exitcode  : -15 (pid: 1235)
      error_file: <N/A>
      traceback : Signal 15 (SIGTERM) received by PID 1235
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : 2024-05-01_10:00:01
      host      : node01
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 1234)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 1234
    ============================================================
    """  # noqa: E501, W291


def test_torchelastic_child_failed_box() -> None:
    lines = textwrap.dedent(CHILD_FAILED).strip("\n").split("\n")
    m = SignatureMatcher()
    recs = [r for i, line in enumerate(lines, 1) for r in m.feed(line, i, None)]
    assert len(recs) == 1, "the closing rule ends the record without waiting for another line"
    rec = recs[0]
    assert rec.kind == "crash" and rec.severity is Severity.CRITICAL
    d = rec.details
    assert d["failed_rank"] == 1 and d["local_rank"] == 1 and d["exitcode"] == -9 and d["signal"] == "SIGKILL"
    assert d["host"] == "node01" and d["pid"] == 1234 and d["failed_ranks"] == [2, 1]
    assert "rank 1" in rec.summary and "SIGKILL" in rec.summary
    assert rec.evidence[-1].startswith("=====") and len(rec.evidence) == len(lines)
    assert "failed (exitcode: -9)" in rec.evidence[0], "the launcher's own line is the same event"
    assert d["binary"] == "/usr/bin/python"
    assert m.flush() == []


ELASTIC_FAILED = (
    "E0101 12:00:00.123000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
    "local_rank: 0 (pid: 1234) of binary: /usr/bin/python3"
)


def test_torchelastic_failed_line_alone_is_a_crash() -> None:
    recs = run(
        ELASTIC_FAILED + "\nI0101 12:00:01.000000 140 torch/distributed/elastic/agent/server/api.py:8] done"
    )
    (rec,) = recs
    assert (rec.kind, rec.severity, rec.line) == ("crash", Severity.CRITICAL, 1)
    assert rec.details["exitcode"] == 1 and rec.details["local_rank"] == 0 and rec.details["pid"] == 1234
    assert rec.summary == "torchelastic: local_rank 0 (pid 1234) failed with exitcode 1"
    assert rec.evidence == [ELASTIC_FAILED]


def test_torchelastic_failed_line_at_end_of_stream_and_when_idle() -> None:
    # The old logging format, and a function entrypoint killed by a signal.
    line = (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: 77) "
        "of fn: main (start_method: spawn)"
    )
    (rec,) = run(line)
    assert rec.details["signal"] == "SIGKILL" and rec.details["fn"] == "main"
    assert "local_rank 3" in rec.summary and "SIGKILL" in rec.summary
    m = SignatureMatcher()
    assert m.feed(line, 1) == [] and m.waiting, "a ChildFailedError box may follow"
    assert [r.kind for r in m.release()] == ["crash"] and not m.busy


CUDA_ASSERT = (
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [{b},0,0], thread: [{t},0,0] "
    'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.'
)
CUDA_ASSERT_TB = """Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    loss.item()
RuntimeError: CUDA error: device-side assert triggered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""  # noqa: E501


def test_device_side_assert_burst_is_one_cuda_error() -> None:
    burst = "\n".join(CUDA_ASSERT.format(b=b, t=t) for b in range(16) for t in range(128))
    recs = run(burst + "\n" + CUDA_ASSERT_TB)
    assert [r.kind for r in recs] == ["cuda_error", "cuda_error"]
    first = recs[0]
    assert first.line == 1 and first.details["device_assert"] is True
    assert first.details["where"] == "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92"
    assert first.details["block"] == [0, 0, 0] and first.details["thread"] == [0, 0, 0]
    assert first.summary.startswith("CUDA device-side assert in IndexKernel.cu:92 (operator()): `-sizes[i]")
    assert recs[1].details["error"] == "device-side assert triggered"


def test_device_side_assert_from_a_loss_kernel() -> None:
    rec = one(
        "../aten/src/ATen/native/cuda/Loss.cu:240: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
        "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed."
    )
    assert rec.kind == "cuda_error" and rec.details["assertion"] == "t >= 0 && t < n_classes"
    assert rec.details["kernel"] == "nll_loss_forward_reduce_cuda_kernel_2d"


def test_child_failed_box_without_its_traceback() -> None:
    box = textwrap.dedent(CHILD_FAILED).split("\n")[8:]
    recs = run("\n".join(box))
    assert len(recs) == 1 and recs[0].details["exitcode"] == -9


@pytest.mark.parametrize(
    ("line", "kind", "severity", "details"),
    [
        ("srun: error: node01: task 3: Exited with exit code 1", "crash", Severity.CRITICAL,
         {"task": 3, "exit_code": 1, "node": "node01"}),
        ("srun: error: node01: task 3: Killed", "crash", Severity.CRITICAL, {"task": 3, "killed": True}),
        ("srun: error: nid01934: tasks 2,4-5,7: Terminated", "crash", Severity.WARNING, {"tasks": "2,4-5,7"}),
        ("slurmstepd: error: *** JOB 1234 ON node01 CANCELLED AT 2024-05-01T10:00:00 DUE TO TIME LIMIT ***",
         "crash", Severity.CRITICAL, {"reason": "time_limit", "id": "1234", "node": "node01"}),
        ("slurmstepd: error: *** JOB 32391783 ON cn119 CANCELLED AT 2021-06-18T13:05:36 DUE "
         "TO PREEMPTION ***",
         "crash", Severity.CRITICAL, {"reason": "preemption"}),
        ("slurmstepd: *** JOB 830329 CANCELLED AT 2018-08-06T17:21:44 DUE TO TIME LIMIT on n447 ***",
         "crash", Severity.CRITICAL, {"reason": "time_limit", "node": "n447"}),
        ("slurmstepd: error: *** STEP 3495064.0 ON orion-01-01 CANCELLED AT 2021-10-27T19:35:36 ***",
         "crash", Severity.WARNING, {"reason": "cancelled"}),
        ("Segmentation fault (core dumped)", "crash", Severity.CRITICAL, {"signal": "SIGSEGV"}),
        ("Fatal Python error: Segmentation fault", "crash", Severity.CRITICAL, {"signal": "SIGSEGV"}),
    ],
)  # fmt: skip
def test_launcher_and_scheduler_lines(
    line: str, kind: str, severity: Severity, details: dict[str, object]
) -> None:
    rec = one(line)
    assert (rec.kind, rec.severity) == (kind, severity)
    for k, v in details.items():
        assert rec.details[k] == v


def test_time_limit_summary_says_so() -> None:
    rec = one(
        "slurmstepd: error: *** JOB 1234 ON node01 CANCELLED AT 2024-05-01T10:00:00 DUE TO TIME LIMIT ***"
    )
    assert "time limit" in rec.summary


def test_job_and_step_cancel_lines_are_one_event() -> None:
    recs = run(
        """
        srun: Job step aborted: Waiting up to 47 seconds for job step to finish.
        slurmstepd: error: *** JOB 494583 ON n1 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***
        slurmstepd: error: *** STEP 494583.0 ON n1 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***
        """
    )
    assert len(recs) == 1 and recs[0].details["reason"] == "time_limit"


def test_slurm_oom_sequence() -> None:
    recs = run(
        """
        slurmstepd: error: Detected 1 oom-kill event(s) in step 3495064.0 cgroup. Some of your processes may have been killed by the cgroup out-of-memory handler.
        srun: error: Orion-01-01: task 4: Out Of Memory
        srun: Terminating job step 3495064.0
        """  # noqa: E501
    )
    assert [r.kind for r in recs] == ["oom", "oom"]
    assert all(r.details["host"] for r in recs)


@pytest.mark.parametrize(
    "line",
    [
        "Aborted training run because the config asked for it",
        "Killed 3 stale workers",
        "{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 1.0}",
        " iteration      100/    1000 | lm loss: 2.345678E+00 | number of nan iterations:   0 |",
        "[E ProcessGroupNCCL.cpp:577] [Rank 1] Some NCCL operations have failed or timed out.",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        "eval_loss: 1.23 error_rate: 0.1",
        "Error(s) are fine",
    ],
)
def test_healthy_lines_are_silent(line: str) -> None:
    assert run(line) == []
    assert classify(line) is None


def test_keyboard_interrupt_is_an_interruption_not_a_failure() -> None:
    """SIGINT (a user's Ctrl-C, a launcher passing one on) is a stop from outside: no alert
    (wild batch 11: an skrl run stopped at 2101/500000)."""
    rec = one(
        """
        Traceback (most recent call last):
          File "/w/t.py", line 3, in <module>
            time.sleep(9)
        KeyboardInterrupt
        """
    )
    assert rec.kind == "crash" and rec.severity is Severity.INFO and rec.details["interrupted"]


LINES = st.sampled_from(
    [
        "Traceback (most recent call last):",
        '  File "/w/a.py", line 1, in f',
        "    f()",
        "ValueError: x",
        "",
        "During handling of the above exception, another exception occurred:",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 40,
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 1)",
        "[0]:",
        "Root Cause (first observed failure):",
        "Last error:",
        "  what():  CUDA error: x",
        "NCCL WARN x",
        "srun: error: n: task 1: Killed",
        "Killed",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=1.0. Some of the step tasks have been "
        "OOM Killed.",
        ELASTIC_FAILED,
        CUDA_ASSERT.format(b=0, t=1),
    ]
)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.lists(st.one_of(LINES, st.text(max_size=80)), max_size=40))
def test_matcher_never_raises(lines: list[str]) -> None:
    m = SignatureMatcher()
    for i, line in enumerate(lines, 1):
        for r in m.feed(line, i, 0, None):
            assert r.kind in {"oom", "nccl_timeout", "nccl_error", "cuda_error", "xid", "crash"}
        m.expire(i + 500)
    m.flush()
    assert not m.busy


RICH_TB = """\
╭───────────────────── Traceback (most recent call last) ──────────────────────╮
│ /w/train.py:12 in <module>                                                   │
│                                                                              │
│ ❱ 12 │   main()                                                              │
│                                                                              │
│ /w/train.py:8 in main                                                        │
│                                                                              │
│ ❱  8 │   1 / 0                                                               │
╰──────────────────────────────────────────────────────────────────────────────╯
ZeroDivisionError: division by zero
"""


def test_rich_traceback() -> None:
    rec = one(RICH_TB)
    assert rec.kind == "crash" and rec.summary == "ZeroDivisionError: division by zero"
    assert rec.details["frame"] == "/w/train.py:8 main" and len(rec.evidence) == 10


# -- the rank a message names; gloo peers; one OOM per event (wild logs) -------------------


def test_watchdog_lines_without_a_prefix_belong_to_the_rank_they_name() -> None:
    # OFA-Sys/OFA#271: eight ranks' watchdog lines on one stream, no launcher prefix.
    text = "\n".join(
        f"[E ProcessGroupNCCL.cpp:737] [Rank {r}] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds "
        "before timing out."
        for r in (1, 3, 2, 6, 7, 3)
    )
    recs = run(text, rank=None)
    assert [r.rank for r in recs] == [1, 3, 2, 6, 7]  # rank 3's repetition folded
    assert {r.kind for r in recs} == {"nccl_timeout"}


def test_a_launcher_prefix_wins_over_the_message() -> None:
    line = (
        "[PG 1 Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out."
    )
    assert run(line, rank=5)[0].rank == 5
    assert run(line, rank=None)[0].rank is None  # a subgroup's rank is not the global one


@pytest.mark.parametrize(
    ("line", "peer"),
    [
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
            "[18.25.6.30]:30872",
            "18.25.6.30:30872",
        ),
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
            "[192.168.70.92]:25266: Connection reset by peer",
            "192.168.70.92:25266",
        ),
    ],
)
def test_gloo_lost_peer_is_a_consequence_naming_the_peer(line: str, peer: str) -> None:
    rec = one(
        f"""\
        Traceback (most recent call last):
          File "/home/u/test.py", line 20, in main_worker
            dist.recv(input,0)
          File "/usr/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py", line 1002, in recv
            pg.recv([tensor], src, tag).wait()
        {line}
        """
    )
    assert rec.kind == "peer_error" and rec.severity is Severity.WARNING
    assert rec.details["peer"] == peer
    assert rec.details["frame"] == "/home/u/test.py:20 main_worker"


def test_connection_reset_outside_torch_distributed_is_not_a_peer_error() -> None:
    assert classify("curl: (56) Recv failure: Connection reset by peer") is None


def test_framework_uncaught_line_is_a_crash_of_the_rank_it_names() -> None:
    # allenai/OLMo#552
    (rec,) = run(
        "CRITICAL [olmo.util:158, rank=0] Uncaught OLMoThreadError: generator thread data thread 3 failed",
        rank=None,
    )
    assert (rec.kind, rec.rank, rec.details["exception"]) == ("crash", 0, "OLMoThreadError")


def test_oom_traceback_and_the_frameworks_uncaught_line_are_one_event() -> None:
    oom = (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which "
        "3.56 MiB is free."
    )
    tb = f"""\
        Traceback (most recent call last):
          File "/opt/olmo/scripts/train.py", line 300, in main
            trainer.fit()
        torch.OutOfMemoryError: {oom}
        """
    uncaught = f"CRITICAL [olmo.util:158, rank=0] Uncaught OutOfMemoryError: {oom}"
    for text in (uncaught + "\n" + textwrap.dedent(tb), textwrap.dedent(tb) + uncaught):
        recs = run(text, rank=None)
        assert [r.kind for r in recs] == ["oom"], recs
    # Two OOMs far apart are two events.
    far = textwrap.dedent(tb) + "\n".join(["step"] * 1200) + "\n" + uncaught
    assert [r.kind for r in run(far, rank=None)] == ["oom", "oom"]


@pytest.mark.parametrize(
    "line",
    [
        # https://github.com/Yochengliu/Relation-Shape-CNN/issues/17 (PyTorch 0.3)
        "THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1518241554738/work/torch/lib/THC/generic/THCStorage.cu line=58 error=2 : out of memory",  # noqa: E501
        "RuntimeError: cuda runtime error (2) : out of memory at /opt/conda/conda-bld/pytorch_1518241554738/work/torch/lib/THC/generic/THCStorage.cu:58",  # noqa: E501
        # https://github.com/SeanNaren/deepspeech.pytorch/issues/28 (comment by StephenZengCn)
        "THCudaCheck FAIL file=/b/wheel/pytorch-src/torch/lib/THC/generic/THCStorage.cu line=66 error=2 : out of memory",  # noqa: E501
    ],
)
def test_old_thc_out_of_memory_is_oom(line: str) -> None:
    assert classify(line) is not None and classify(line).kind == "oom"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("line", "host", "tried"),
    [
        # https://github.com/tensorflow/models/issues/1993 (description by ehfo0, TF 1.2)
        (
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[2304,384]",  # noqa: E501
            False,
            None,
        ),
        # https://github.com/zzw922cn/Automatic_Speech_Recognition/issues/78 (description by cjjjy)
        (
            "2018-06-08 17:26:00.908130: W tensorflow/core/framework/op_kernel.cc:1202] OP_REQUIRES failed at tile_ops.cc:123 : Resource exhausted: OOM when allocating tensor with shape[16,1,892800,8,4,2,2] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",  # noqa: E501
            False,
            None,
        ),
        # https://github.com/huggingface/pytorch-image-models/issues/432 (description by etetteh)
        (
            "RuntimeError: [enforce fail at CPUAllocator.cpp:65] . DefaultCPUAllocator: can't allocate memory: you tried to allocate 359661568 bytes. Error code 12 (Cannot allocate memory)",  # noqa: E501
            True,
            359661568,
        ),
        # https://github.com/austinxu87/handsoff/issues/4 (description by YnuhS, Windows)
        (
            "RuntimeError: [enforce fail at ..\\c10\\core\\CPUAllocator.cpp:73] data. DefaultCPUAllocator: not enough memory: you tried to allocate 318767104000 bytes. Buy new RAM!",  # noqa: E501
            True,
            318767104000,
        ),
    ],
)
def test_tensorflow_and_host_allocator_out_of_memory_is_oom(line: str, host: bool, tried: int | None) -> None:
    hit = classify(line)
    assert hit is not None and hit.kind == "oom"
    assert bool(hit.details.get("host")) is host and hit.details.get("tried_bytes") == tried


def test_yolact_moving_average_ignoring_nan_is_a_nan_loss() -> None:
    # https://github.com/dbolya/yolact/issues/318 (batch9): MovingAverage.add prints this for a
    # non-finite loss it leaves out of the mean.
    r = one("Warning: Moving average ignored a value of nan")
    assert r.kind == "nan_loss" and r.severity == Severity.CRITICAL
    assert one("Warning: Moving average ignored a value of inf").kind == "nan_loss"
