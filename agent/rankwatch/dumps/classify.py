"""What a rank's main thread is doing, read as a distributed-systems engineer reads a stack.

A hung job is a set of ranks waiting for one that never arrives. The question for each
rank is therefore not "which function is on top" but "is it waiting for its peers, and in
which collective": an explicit ``dist.all_reduce``/``barrier``, DDP's gradient reduction
(which runs inside ``loss.backward()`` and shows only ``_engine_run_backward`` in Python),
DDP's buffer broadcast before each forward (on whenever the model has a buffer), FSDP's
all-gather / reduce-scatter — or is it somewhere else: loading data, doing I/O, computing,
or blocked in a wait of its own.

Frames are py-spy's JSON frames, innermost first. Native frames (``--native``) settle the
one ambiguous case, a rank inside backward: ``c10d::Reducer`` / a process group means it
waits for its peers' gradients, kernels alone mean it computes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from rankwatch.dumps.show import basename, group_by_process, is_main_thread, is_training_frame

Frame = dict[str, Any]

COLLECTIVE = "collective"
DATA = "data"
IO = "io"
COMPUTE = "compute"
BLOCKED = "blocked"
UNKNOWN = "unknown"

KIND_TEXT = {
    COLLECTIVE: "waiting in a collective",
    DATA: "in data loading",
    IO: "in I/O",
    COMPUTE: "computing",
    BLOCKED: "blocked in a wait of its own",
    UNKNOWN: "somewhere unclassified",
}

_C10D_RE = re.compile(
    r"torch[/\\]distributed[/\\](distributed_c10d|_functional_collectives|c10d_logger)\.py$"
)
_DIST_RE = re.compile(
    r"torch[/\\]distributed[/\\]|deepspeed[/\\]comm[/\\]|megatron[/\\]core[/\\]parallel_state"
)
_DDP_RE = re.compile(r"torch[/\\]nn[/\\]parallel[/\\]distributed\.py$")
_FSDP_RE = re.compile(r"torch[/\\]distributed[/\\](fsdp|_composable[/\\]fsdp)[/\\]")
_AUTOGRAD_RE = re.compile(r"torch[/\\](autograd[/\\](graph|__init__)|_tensor)\.py$")
_DATALOADER_RE = re.compile(r"torch[/\\]utils[/\\]data[/\\]")
_IO_FILES_RE = re.compile(
    r"torch[/\\]serialization\.py$|safetensors[/\\]|[/\\]shutil\.py$|[/\\]h5py[/\\]|"
    r"torch[/\\]distributed[/\\]checkpoint[/\\]filesystem\.py$|fsspec[/\\]|s3fs[/\\]|[/\\]gzip\.py$"
)
_IO_NAMES = frozenset({"read", "readinto", "readline", "write", "fsync", "flush", "copyfileobj", "copyfile"})

# Explicit c10d entry points (distributed_c10d.py) and the op each one is.
_C10D_OPS = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast",
    "broadcast_object_list": "broadcast",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_object": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "reduce": "reduce",
    "gather": "gather",
    "gather_object": "gather",
    "scatter": "scatter",
    "scatter_object_list": "scatter",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "wait": "wait",
    "wait_tensor": "wait",
    "batch_isend_irecv": "send/recv",
    "send_object_list": "send",
    "recv_object_list": "recv",
    "_store_based_barrier": "barrier",
}
# c10d's variants of one op (torch 2.13's distributed_c10d.py and _functional_collectives.py:
# ``all_gather_single`` that FSDP2 calls, ``reduce_scatter_tensor_coalesced``, the autograd
# and in-place forms): the op is what is left without these affixes.
_VARIANT_RE = re.compile(r"^_+|(_single|_into_tensor|_tensor|_coalesced|_base|_autograd|_inplace)+$")


def c10d_op(name: str) -> str | None:
    """The op a c10d entry point is, whatever its variant; None when it is no collective."""
    if name in _C10D_OPS:
        return _C10D_OPS[name]
    base = name
    for _ in range(3):
        base = _VARIANT_RE.sub("", base)
    return _C10D_OPS.get(base)


# DDP's own collectives (torch/nn/parallel/distributed.py).
_DDP_BUFFERS = frozenset(
    {
        "_distributed_broadcast_coalesced",
        "_default_broadcast_coalesced",
        "_sync_module_buffers",
        "_sync_buffers",
    }
)
_DDP_INIT = frozenset(
    {"_sync_params_and_buffers", "_sync_module_states", "_verify_param_shape_across_processes"}
)
_BACKWARD = frozenset({"_engine_run_backward", "run_backward", "backward"})
# Process group setup waits for every rank of the group (torch 2.13): under torchrun, rank 0 in
# ``_new_process_group_helper`` (gloo's connectFullMesh reads its peers' addresses from the
# store) <- ``init_process_group``; by hand (env://), a rank whose store host has not come up in
# ``_create_c10d_store`` <- ``_env_rendezvous_handler`` (rendezvous.py) <- ``init_process_group``
# (tests/data/ddp_stacks/init_hang*). A peer never there is the one they wait for.
INIT_OP = "init_process_group"
_SETUP_NAMES = frozenset({"init_process_group", "_new_process_group_helper", "new_group", "new_subgroups"})
_RENDEZVOUS_RE = re.compile(r"torch[/\\]distributed[/\\]rendezvous\.py$")
_COLLECTIVE_NAME_RE = re.compile(
    r"(?:^|_)(all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all)(?:_|$)", re.I
)
# Native frames of a rank inside backward that wait for peers (DDP's reducer, a process group).
_NATIVE_COMM_RE = re.compile(r"c10d::|Reducer::|ProcessGroup|gloo::|nccl|ncclGroup|Work::wait", re.I)
_IDLE_FILES = frozenset(
    {"threading.py", "queue.py", "selectors.py", "connection.py", "queues.py", "synchronize.py", "socket.py"}
)
_SLEEP_RE = re.compile(r"^(time_sleep|clock_nanosleep|nanosleep|__nanosleep|usleep|select)$")
_HELPER_LOOPS = frozenset({"_worker_loop", "_pin_memory_loop"})
_LAUNCHER_RE = re.compile(
    r"torch[/\\]distributed[/\\](elastic|run\.py)|deepspeed[/\\]launcher|accelerate[/\\]commands"
)


@dataclass(frozen=True)
class Activity:
    """One rank's main thread, classified.

    ``op`` names the collective (``all_reduce``, ``barrier``, ...) when ``kind`` is
    ``collective``; ``detail`` says it in words; ``frame`` is the frame that decided,
    ``call_site`` the innermost frame of the user's own code (where a human looks first);
    ``certain`` is false where only a guess was possible (a rank in backward, Python frames only).
    """

    kind: str
    op: str | None
    detail: str
    frame: str
    call_site: str | None
    certain: bool = True
    worker: str | None = None  # a DataLoader worker's own place, for a rank in data loading

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def key(self) -> tuple[str, str | None, str]:
        """Ranks with the same key wait in the same collective."""
        return (self.kind, self.op, self.detail)


def short_name(frame: Frame) -> str:
    return str(frame.get("name") or "").rsplit(".", 1)[-1]


def label(frame: Frame) -> str:
    line = frame.get("line")
    file = basename(frame.get("filename") or frame.get("short_filename"))
    return f"{frame.get('name') or '?'} ({file}:{line})" if line else f"{frame.get('name') or '?'} ({file})"


def _file(frame: Frame) -> str:
    return str(frame.get("filename") or "")


def _is_python(frame: Frame) -> bool:
    return _file(frame).endswith(".py")


def _call_site(frames: list[Frame], start: int) -> str | None:
    for f in frames[start:]:
        if is_training_frame(f):
            return label(f)
    return None


def _collective(frames: list[Frame], i: int) -> tuple[str, str, bool] | None:
    """(op, detail, certain) when frame ``i`` is where a rank enters a collective."""
    f = frames[i]
    name, path = short_name(f), _file(f)
    if _DDP_RE.search(path):
        if name in _DDP_BUFFERS:
            return "broadcast", "DDP buffer broadcast before forward (_sync_buffers)", True
        if name in _DDP_INIT:
            return "broadcast", "DDP parameter and buffer broadcast at construction", True
    if _FSDP_RE.search(path):
        low = name.lower()
        if "all_gather" in low or "unshard" in low:
            return "all_gather", "FSDP parameter all-gather", True
        if "reduce_scatter" in low or "reduce_grad" in low or "foreach_reduce" in low:
            return "reduce_scatter", "FSDP gradient reduce-scatter", True
    if (name in _SETUP_NAMES and _C10D_RE.search(path)) or _RENDEZVOUS_RE.search(path):
        whole = any(short_name(g) == "init_process_group" for g in frames[i:]) or _RENDEZVOUS_RE.search(path)
        if whole:
            return INIT_OP, "process group setup: waiting for every rank to join", True
        return "new_group", "process group setup (new_group): waiting for every rank to join", True
    op = c10d_op(name) if _C10D_RE.search(path) else None
    if op is not None:
        if any(_FSDP_RE.search(_file(g)) for g in frames[i + 1 :]):  # FSDP called it
            if op == "all_gather":
                return op, "FSDP parameter all-gather", True
            if op == "reduce_scatter":
                return op, "FSDP gradient reduce-scatter", True
        return op, ("an async collective's Work.wait()" if op == "wait" else ""), True
    first_python = next((j for j, g in enumerate(frames) if _is_python(g)), i)
    if name in _BACKWARD and _AUTOGRAD_RE.search(path) and (name != "backward" or i == first_python):
        native = [g for g in frames[:i] if not _is_python(g)]
        if native:
            if any(_NATIVE_COMM_RE.search(str(g.get("name") or "")) for g in native):
                return "all_reduce", "DDP gradient all-reduce inside loss.backward() (native: c10d)", True
            return None  # native frames show backward computing, not waiting
        return "all_reduce", "DDP gradient all-reduce inside loss.backward()", False
    if name in ("wait", "wait_all") and _DIST_RE.search(path):
        return "wait", "an async collective's Work.wait()", True
    if _COLLECTIVE_NAME_RE.search(name) and "numpy" not in path and _is_python(f):
        m = _COLLECTIVE_NAME_RE.search(name)
        op = (m.group(1) if m else name).lower().replace("allreduce", "all_reduce")
        return op, "a collective by its name", False
    return None


def _data(frames: list[Frame], i: int) -> str | None:
    f = frames[i]
    name, path = short_name(f), _file(f)
    full = str(f.get("name") or "")
    if _DATALOADER_RE.search(path):
        if "MultiProcessing" in full or name in ("_get_data", "_try_get_data"):
            return "waiting for a batch from its DataLoader worker processes"
        if name in ("__next__", "_next_data", "fetch"):
            return "loading a batch in the DataLoader"
    if name in ("__getitem__", "__getitems__") or (name == "__iter__" and "Dataset" in full):
        return f"in the dataset's {name}"
    if name == "__next__" and is_training_frame(f):
        return "in the training code's own data iterator"
    return None


def _io(frames: list[Frame], i: int) -> str | None:
    f = frames[i]
    path = _file(f)
    if _IO_FILES_RE.search(path):
        return f"file I/O in {basename(path)}"
    if short_name(f) in _IO_NAMES and _is_python(f) and not is_training_frame(f):
        return f"I/O ({short_name(f)})"
    return None


def classify_frames(frames: list[Frame], *, active: bool | None = None) -> Activity:
    """Classify one main thread's frames (innermost first)."""
    if not frames:
        return Activity(UNKNOWN, None, "no frames", "?", None, False)
    for i in range(len(frames)):
        coll = _collective(frames, i)
        if coll is not None:
            op, detail, certain = coll
            return Activity(COLLECTIVE, op, detail, label(frames[i]), _call_site(frames, i), certain)
        data = _data(frames, i)
        if data is not None:
            return Activity(DATA, None, data, label(frames[i]), _call_site(frames, i))
        io = _io(frames, i)
        if io is not None:
            return Activity(IO, None, io, label(frames[i]), _call_site(frames, i))
    python = [i for i, f in enumerate(frames) if _is_python(f)]
    if not python:
        return Activity(UNKNOWN, None, "native frames only", label(frames[0]), None, False)
    first = python[0]
    top = frames[first]
    user = next((i for i in python if is_training_frame(frames[i])), None)
    site = label(frames[user]) if user is not None else None
    if basename(_file(top)) in _IDLE_FILES and not active:
        # A wait of the training code's own (an Event, a lock, a queue): named where it was called.
        return Activity(BLOCKED, None, f"in {top.get('name')}", site or label(top), site)
    if active is False:
        # py-spy saw the thread idle (off CPU) in Python code of its own: a sleep or a blocking
        # C call (time.sleep, a socket or lock wait), not computing.
        native = [str(g.get("name") or "") for g in frames[:first]]
        how = "sleeping (time.sleep)" if any(_SLEEP_RE.search(n) for n in native) else "idle off CPU"
        return Activity(BLOCKED, None, f"{how} in {top.get('name')}", label(top), site)
    where = frames[user] if user is not None else top
    return Activity(COMPUTE, None, f"running {where.get('name')}", label(where), site)


def _main_thread(threads: list[Frame]) -> Frame | None:
    for thread in threads:
        if is_main_thread(thread):
            return thread
    return threads[0] if threads else None


def _frames(thread: Frame | None) -> list[Frame]:
    return [f for f in (thread or {}).get("frames") or [] if isinstance(f, dict)]


def _score(frames: list[Frame]) -> int:
    """How much a process looks like the training rank rather than a launcher or worker."""
    for frame in frames:
        if _LAUNCHER_RE.search(_file(frame)) or short_name(frame) in _HELPER_LOOPS:
            return -1
    return sum(1 for f in frames if is_training_frame(f))


def main_thread(dump: dict[str, Any]) -> Frame | None:
    """The main thread of the process that runs the training code (not a launcher or worker)."""
    threads = [t for t in dump.get("threads") or [] if isinstance(t, dict)]
    pid_ = dump.get("pid")
    root = pid_ if isinstance(pid_, int) else -1
    best: Frame | None = None
    best_score: int | None = None
    for pid, proc_threads in group_by_process(threads, root).items():
        main = _main_thread(proc_threads)
        score = _score(_frames(main))
        # The watched process wins ties: it is usually the rank itself.
        if best_score is None or score > best_score or (score == best_score and pid == root):
            best, best_score = main, score
    return best


# torch.multiprocessing.spawn: the launcher waits in ProcessContext.join / start_processes, and
# each child runs ``_wrap(fn, i, ...)``, where ``i`` is the process index torch passes to ``fn``.
_SPAWN_RE = re.compile(r"torch[/\\]multiprocessing[/\\]spawn\.py$")
_SPAWN_WAITS = frozenset({"join", "start_processes", "spawn"})


@dataclass(frozen=True)
class Peer:
    """One worker process of a launcher whose ranks the agent saw as one process tree.

    ``index``: the process index torch.multiprocessing.spawn gave it (``fn(i, ...)``), from the
    order its processes were started; the script usually makes it the rank, but nothing the
    agent read says so, so it is never reported as one."""

    pid: int
    index: int | None
    activity: Activity

    def name(self) -> str:
        return f"pid {self.pid}" + (f" (spawn process {self.index})" if self.index is not None else "")


def _is_launcher(frames: list[Frame]) -> bool:
    return any(
        _LAUNCHER_RE.search(_file(f)) or (_SPAWN_RE.search(_file(f)) and short_name(f) in _SPAWN_WAITS)
        for f in frames
    )


def launcher_peers(dump: dict[str, Any]) -> list[Peer]:
    """The ranks inside one dump: when the dumped process is a launcher waiting for its workers
    (torch.multiprocessing.spawn's join, torchelastic's agent) and at least two of its processes
    run the training code, each is a peer of the others. Their ranks were set inside them (not
    in their environment), so the agent knew one process tree; they are judged as peers, named
    by pid. Empty otherwise (a rank with its DataLoader workers, a rank and one helper)."""
    threads = [t for t in dump.get("threads") or [] if isinstance(t, dict)]
    pid_ = dump.get("pid")
    root = pid_ if isinstance(pid_, int) else -1
    procs = group_by_process(threads, root)
    if not _is_launcher(_frames(_main_thread(procs.get(root, [])))):
        return []
    found: list[tuple[int, list[Frame], bool | None]] = []
    for pid, proc_threads in procs.items():
        main = _main_thread(proc_threads)
        frames = _frames(main)
        if pid == root or _score(frames) <= 0:
            continue
        active = (main or {}).get("active")
        found.append((pid, frames, active if isinstance(active, bool) else None))
    if len(found) < 2:
        return []
    started: dict[int, tuple[float, int]] = {}
    for p in dump.get("processes") or []:
        if isinstance(p, dict) and isinstance(p.get("pid"), int):
            t = p.get("started")
            started[p["pid"]] = (float(t) if isinstance(t, (int, float)) else float("inf"), p["pid"])
    spawned = sorted(
        (
            pid
            for pid, frames, _ in found
            if any(_SPAWN_RE.search(_file(f)) and short_name(f) == "_wrap" for f in frames)
        ),
        key=lambda pid: started.get(pid, (float("inf"), pid)),
    )
    # The index is known only when every spawn child was dumped and its start time read.
    known = len(spawned) == len(found) and all(
        started.get(pid, (float("inf"),))[0] < float("inf") for pid in spawned
    )
    index = {pid: i for i, pid in enumerate(spawned)} if known else {}
    return [
        Peer(pid, index.get(pid), classify_frames(frames, active=active))
        for pid, frames, active in sorted(found, key=lambda x: (index.get(x[0], len(found)), x[0]))
    ]


def _worker_place(dump: dict[str, Any]) -> str | None:
    """Where the rank's DataLoader workers are: the user's frame in each ``_worker_loop`` process."""
    threads = [t for t in dump.get("threads") or [] if isinstance(t, dict)]
    pid_ = dump.get("pid")
    root = pid_ if isinstance(pid_, int) else -1
    places: list[str] = []
    for pid, proc_threads in group_by_process(threads, root).items():
        frames = _frames(_main_thread(proc_threads))
        if not any(short_name(f) == "_worker_loop" for f in frames):
            continue
        user = [label(f) for f in frames if is_training_frame(f)]
        loop = next(i for i, f in enumerate(frames) if short_name(f) == "_worker_loop")
        inner = [label(f) for f in frames[:loop] if is_training_frame(f)]
        if inner:
            chain = " <- ".join(inner[:2])
            places.append(f"its DataLoader worker (pid {pid}) is in {chain}")
        elif user:
            places.append(f"its DataLoader worker (pid {pid}) waits for work")
    return "; ".join(places) or None


def classify_dump(dump: dict[str, Any]) -> Activity:
    """Classify one rank's dump (the JSON document of ``rank-<r>.json``)."""
    main = main_thread(dump)
    active = (main or {}).get("active")
    act = classify_frames(_frames(main), active=active if isinstance(active, bool) else None)
    if act.kind == DATA:
        worker = _worker_place(dump)
        if worker:
            act = Activity(act.kind, act.op, act.detail, act.frame, act.call_site, act.certain, worker)
    return act


def collective_text(act: Activity) -> str:
    """``all_reduce`` or ``all_reduce (DDP gradient all-reduce inside loss.backward())``."""
    return f"{act.op} ({act.detail})" if act.detail else str(act.op)


def describe(act: Activity) -> str:
    """``waiting in all_reduce (DDP gradient ...) at f (x.py:3) <- g (train.py:9)``."""
    if act.kind == COLLECTIVE:
        head = f"waiting in {collective_text(act)}"
    else:
        head = f"{KIND_TEXT.get(act.kind, act.kind)} ({act.detail})"
    text = f"{head} at {act.frame}"
    if act.call_site and act.call_site != act.frame:
        text += f" <- {act.call_site}"
    if not act.certain:
        text += " (from the Python stack alone)"
    return text
