"""The configuration schema: every key, its type, its default and why it has that default.

Each section is a dataclass; a field's ``metadata["doc"]`` is the one-line help that
``rankwatch config show`` prints next to the key. Types the loader understands: bool,
int, float, str, ``Duration`` (seconds, written ``30s``/``10m``/``2h``), ``Size`` (bytes,
written ``512MiB``), ``X | None``, ``tuple[str, ...]`` (a YAML list), ``dict[str, str]``,
``Literal[...]`` and nested sections. Sections are frozen: a config is an immutable snapshot
(``config.snapshot.replaced`` makes a changed copy); lists are tuples for the same reason.

A plugin's settings are declared beside its code and registered with
``config.settings.settings``; a section such as ``alerts`` is assembled here from its core
keys and the plugins' sections (``config.settings.assemble``), so the alert sinks' keys
(``alerts.slack``, ...) live in ``actions/alerts/<sink>.py``.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rankwatch.config.settings import CLIMB_POINTS as CLIMB_POINTS
from rankwatch.config.settings import Duration as Duration
from rankwatch.config.settings import PluginSections, assemble, plugin_settings
from rankwatch.config.settings import Size as Size
from rankwatch.config.settings import climb_problem as _climb_problem
from rankwatch.config.settings import opt as opt
from rankwatch.config.settings import section as section
from rankwatch.events import median_save_gap
from rankwatch.sources import parsers as _parsers

# logs.format: "auto" or a registered format (rankwatch.sources.parsers.registry): a parser
# in a new file is a valid choice with no line here. The loader, `config show` and the Helm
# values schema read the choices from this Literal; to mypy it is a str.
if TYPE_CHECKING:
    LogFormat = str
else:
    _FORMAT_CHOICES = ("auto", *_parsers.FORMATS)
    LogFormat = Literal[_FORMAT_CHOICES]


def _encoding_problem(name: str) -> str | None:
    """Why a log cannot be read in encoding ``name``, or None: lines are split on the bytes
    of ``\\n`` and ``\\r`` before decoding, so ASCII must be itself in it (not UTF-16)."""
    ascii_text = bytes(range(1, 128))
    try:
        codecs.lookup(name)
        same = ascii_text.decode(name) == ascii_text.decode("ascii")
    except LookupError:
        return f"unknown encoding {name!r}"
    except (UnicodeError, TypeError):
        same = False
    if not same:
        return f"{name!r} does not keep ASCII as single bytes (lines cannot be found); use e.g. latin-1"
    return None


def _regex_problem(pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as e:
        return f"does not compile: {e}"
    return None


@dataclass(frozen=True)
class RunConfig:
    name: str | None = opt(None, "run label; default: SLURM_JOB_ID, TORCHELASTIC_RUN_ID, else 'default'")
    rank: int | None = opt(
        None, "global rank; default from SLURM_PROCID, RANK, OMPI_COMM_WORLD_RANK, PMI_RANK"
    )
    local_rank: int | None = opt(None, "local rank; default from SLURM_LOCALID, LOCAL_RANK, ...")
    world_size: int | None = opt(None, "number of ranks; default from SLURM_NTASKS, WORLD_SIZE, ...")
    node: str | None = opt(None, "node label; default: SLURMD_NODENAME or the host name")
    job_end: float | None = opt(
        None, "unix time the allocation ends (warn if the run cannot finish); default SLURM_JOB_END_TIME"
    )

    def problems(self) -> list[tuple[str, str]]:
        out = [
            (key, "must be 0 or more")
            for key in ("rank", "local_rank")
            if (v := getattr(self, key)) is not None and v < 0
        ]
        if self.world_size is not None and self.world_size < 1:
            out.append(("world_size", "must be 1 or more"))
        elif self.world_size is not None and self.rank is not None and self.rank >= self.world_size:
            # the run folder refuses every record whose writer rank lies outside the world
            # (runfolder.check_record): this agent's failure records and board votes would be lost
            world = self.world_size
            out.append(("rank", f"{self.rank} lies outside a world of {world} (ranks 0..{world - 1})"))
        return out


@dataclass(frozen=True)
class LogsConfig:
    format: LogFormat = opt("auto", "log format; 'auto' sniffs the first lines")
    regex: str | None = opt(
        None,
        "with format 'regex': a Python regex with named groups (step, loss, grad_norm, lr, ...)",
    )
    sniff_lines: int = opt(200, "how many parseable lines auto-detection looks at before deciding")
    json_repeat_window: int = opt(
        _parsers.JSON_REPEAT_WINDOW,
        "JSON lines: a record whose step and field names repeat one of this many records before it "
        "is a copy (two processes appending one trainer_log.jsonl interleave their copies), counted "
        "once",
        min=1,
    )
    max_line_bytes: Size = opt(Size(1 << 20), "longer lines are cut here and counted (bounded memory)")
    poll_interval: Duration = opt(
        Duration(0.25), "upper bound between two reads of a followed log (at least 10ms)", min=0.01
    )
    watch: bool = opt(
        False,
        "also read a log between two polls when its folder's inotify watch sees it created, renamed, "
        "deleted or closed after a write (appended data always waits for the poll): worth it with a "
        "long poll_interval and a writer that opens, appends and closes; costs each followed log "
        "three threads and an inotify instance (fs.inotify.max_user_instances: 128 by default)",
    )
    replay: Size = opt(
        Size(8 << 20),
        "watch mode: how much of an existing log is re-read at start to rebuild the detectors' "
        "windows (baselines, last step); nothing found in it is reported again. 0: none",
    )
    max_ranks: int = opt(
        1024,
        "most distinct ranks one log stream may name in launcher prefixes ([rankN]:, srun --label); "
        "with the world size known, a rank outside it is refused too. Lines of a refused rank are "
        'counted (rankwatch_log_lines_total{result="rank_refused"}) and dropped: rank labels stay bounded',
        min=1,
    )
    read_bytes_per_turn: Size = opt(
        Size(256 << 10),
        "most bytes of one log read and parsed per event-loop turn: a backlog (a burst, a restart "
        "behind a big log) is worked off in turns, so /healthz, /metrics and the other ranks run "
        "between them and memory stays bounded under any log rate",
        min=4096,
    )
    shed_backlog: Size = opt(
        Size(256 << 10),
        "when the agent is this far behind a log (unread bytes), it parses only the lines that may "
        "hold an error or a non-finite value (nan, inf) and the last line of each read until it "
        "has caught up, so a NaN written after a burst is found within seconds; the lines passed "
        'over are counted (rankwatch_log_lines_total{result="shed"}). 0: parse every line',
    )
    encoding: str = opt(
        "utf-8",
        "how the log's bytes are decoded, for the live tail, its replay and analyze (e.g. latin-1, "
        "cp1252; an encoding in which newline and carriage return are single ASCII bytes); bytes "
        "that do not decode are replaced, never fatal",
    )

    def problems(self) -> list[tuple[str, str]]:
        why = _encoding_problem(self.encoding)
        out = [("encoding", why)] if why else []
        if self.format == "regex" and not self.regex:
            # the parser refuses it at start: "format 'regex' needs a pattern (logs.regex)"
            out.append(("format", "format 'regex' needs a pattern (logs.regex)"))
        if self.format == "regex" and self.regex:
            why = _regex_problem(self.regex)
            if why is None and not re.compile(self.regex).groupindex:
                why = "has no named group: the parser fills records from (?P<step>...), (?P<loss>...), ..."
            if why:
                out.append(("regex", why))
        return out


@dataclass(frozen=True)
class DetectorsCore(PluginSections):
    """The detectors section; each detector's thresholds (detectors.nan, ...) are declared in
    its module (``detectors/<name>.py``) and added by ``assemble``."""

    warmup_steps: int = opt(
        100,
        "steps the info-level rules (clipping saturated, vanishing gradients) ignore; the loss, "
        "gradient, loss-scale and throughput rules are safe in warmup and judge from step 1",
    )


if TYPE_CHECKING:
    DetectorsConfig = DetectorsCore
else:  # warmup_steps, then detectors.<key> for every detector module that declares its settings
    DetectorsConfig = assemble(
        DetectorsCore, "detectors", "DetectorsConfig", discover="rankwatch.detectors.registry"
    )


@dataclass(frozen=True)
class StallConfig:
    enabled: bool = opt(True, "no progress while the process lives")
    startup_grace: Duration = opt(Duration(900.0), "before the first step: model load, compile, data index")
    floor: Duration = opt(Duration(60.0), "never flag a stall sooner than this after the last progress")
    factor: float = opt(10.0, "after the first step: timeout = max(floor, factor x p99 step interval)")
    ceiling: Duration = opt(
        Duration(420.0),
        "once a step interval is known, never wait longer than this (plus the checkpoint allowance): "
        "PyTorch's NCCL watchdog aborts a hung collective after 600 s by default and takes the evidence "
        "with it; 0: none",
    )
    checkpoint_allowance: Duration = opt(
        Duration(600.0), "extra time while a checkpoint is being written (ends when the save finishes)"
    )
    silent_rank_timeout: Duration = opt(
        Duration(300.0), "ranks that print no steps: no log growth and no CPU progress for this long"
    )
    busy_cpu_percent: float = opt(50.0, "CPU % above this while stalled: a spin or loader deadlock")
    idle_cpu_percent: float = opt(5.0, "CPU below this while stalled: blocked in a collective or I/O")


@dataclass(frozen=True)
class ProcessConfig:
    sample_interval: Duration = opt(
        Duration(1.0), "how often the process tree is sampled (psutil; at least 50ms)", min=0.05
    )
    tail_lines: int = opt(50, "last lines of output kept to attach to a crash")
    agent_nice: int = opt(
        10,
        "the agent lowers its own CPU priority by this much (run mode: after starting the child, "
        "which keeps its own), so on saturated cores the rank wins; 0: off",
    )


@dataclass(frozen=True)
class DumpsConfig:
    dir: str = opt("rankwatch-dumps", "root of the incident folders (<dir>/<run>/<UTC time>_<reason>/)")
    on_stall: bool = opt(True, "capture a py-spy dump of every watched process when a stall is found")
    py_spy: str = opt("py-spy", "py-spy executable (PATH, then next to the agent's Python)")
    native: bool = opt(False, "include native (C/C++/CUDA) frames: slower, pauses the target longer")
    locals: bool = opt(False, "include local variables: may reveal data, off by default")
    nonblocking: bool = opt(False, "do not pause the target while sampling (stacks may be torn)")
    timeout: Duration = opt(Duration(20.0), "give up on one dump after this long", min=0.1)
    join_peers: Duration = opt(
        Duration(5.0),
        "look this often for a stall incident another agent of the run opened, and add this agent's "
        "ranks to it (ranks that log no steps stall minutes later than the one that does); 0: off",
        min=0.1,
        zero_off=True,
    )
    first_failure_wait: Duration = opt(
        Duration(10.0),
        "a crash that is a peer's consequence (gloo 'Connection closed by peer', NCCL abort) waits this "
        "long for the first failure's record before it goes out unnamed: the failing rank's agent "
        "writes it only after reading the rank's last lines, seconds later on a loaded node",
        min=0.0,
    )
    group: str | None = opt(
        None,
        "a group (name or gid) that may read the run folder (<dir>/<run>: stacks, failure records, alert "
        "board): it is made 0750 with that group; unset: 0700, the job's user only",
    )
    clock_skew: Duration = opt(
        Duration(60.0),
        "a peer's shared record (failure, claim, board record) dated further in the future than this is "
        "not believed: a forged or far-off clock must not win an election or silence an alert",
        min=0.0,
    )
    flight_recorder: bool = opt(
        True,
        "run mode: give the child a flight-recorder pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE, trace "
        "buffer on unless set) and collect its trace into the incident on a stall",
    )

    def __post_init__(self) -> None:
        # py-spy exits at once with "Can't get native stack traces with the --nonblocking
        # option.": accepted here, every dump of the run would fail.
        if self.native and self.nonblocking:
            raise ValueError(
                "native: true and nonblocking: true cannot be combined: py-spy must pause the "
                "target to read native frames ('Can't get native stack traces with the "
                "--nonblocking option.'); set one of them to false"
            )


@dataclass(frozen=True)
class RunModeConfig:
    log_dir: str | None = opt(
        None,
        "run mode: the child's output file goes here (rank-<r>.log); unset: $XDG_STATE_HOME/rankwatch/logs/"
        "<run> (else ~/.local/state/...). Unwritable: a private temporary folder, said at start",
    )
    log_file: str | None = opt(None, "run mode: exact output file (overrides log_dir)")
    echo: bool = opt(True, "echo the child's output to the agent's stdout")
    unbuffered: bool = opt(True, "set PYTHONUNBUFFERED=1 for the child")
    term_grace: Duration = opt(
        Duration(30.0), "after forwarding a stop signal, wait this long, then SIGKILL the process group"
    )


@dataclass(frozen=True)
class ServerConfig:
    enabled: bool = opt(True, "serve /metrics, health and the JSON API (run and watch modes)")
    listen: str = opt(
        "0.0.0.0:9478",
        "host:port; 9478 avoids node_exporter (9100) and dcgm-exporter (9400). /metrics, /healthz and "
        "/readyz answer everyone; / and /api/* need the token, from loopback too",
    )
    token: str | None = opt(
        None,
        "bearer token for / and /api/* (use ${RANKWATCH_TOKEN}, never a literal); unset: the agent uses "
        "this user's token in $XDG_RUNTIME_DIR/rankwatch/token (else <tmp>/rankwatch-<uid>/token), made "
        "at start, 0600, which `rankwatch url` and `rankwatch top` read. A browser logs in with /?token=...",
        secret="RANKWATCH_TOKEN",
    )
    metrics_token: str | None = opt(
        None, "bearer token required on /metrics (default: open)", secret="RANKWATCH_METRICS_TOKEN"
    )
    web_config: str | None = opt(
        None,
        "exporter-toolkit web config file (--web.config.file): tls_server_config (cert_file, key_file, "
        "client_auth_type, client_ca_file, min_version), basic_auth_users (bcrypt) on /metrics",
    )
    max_request_bytes: Size = opt(Size(64 << 10), "larger requests are refused with 413", min=1024)
    max_connections: int = opt(
        128,
        "open HTTP connections at once; a new one beyond it closes the longest-idle one (or itself "
        "when all are busy), so idle sockets cannot exhaust the agent's file descriptors",
        min=4,
    )
    idle_timeout: Duration = opt(
        Duration(15.0),
        "a connection with no request in progress is closed after this long: idle keep-alive, a "
        "request whose headers are not complete, or a body that has not arrived",
        min=0.5,
    )


@dataclass(frozen=True)
class AlertsCore(PluginSections):
    """The alerts section; each sink's own settings (alerts.slack, ...) are declared in its
    module (``actions/alerts/<sink>.py``) and added by ``assemble``."""

    min_severity: Literal["info", "warning", "critical"] = opt("warning", "findings below this never alert")
    startup_quiet: Duration = opt(Duration(60.0), "no alerts in the first seconds after the agent starts")
    group_wait: Duration = opt(Duration(5.0), "collect findings of many ranks this long into one message")
    death_wait: Duration = opt(
        Duration(10.0),
        "a peer's lost connection or collective error (a warning: gloo's 'Connection closed by peer', "
        "NCCL's) waits this much longer than group_wait for its rank's death, which then leads one "
        "critical alert instead of a warning followed by a page",
    )
    repeat_interval: Duration = opt(Duration(4 * 3600.0), "re-send a still-active alert this often")
    send_resolved: bool = opt(True, "send a resolve message when a finding clears")
    rate_limit_per_minute: int = opt(20, "per sink; beyond it alerts wait in the queue", min=1)
    max_retries: int = opt(
        12, "per alert and sink, with exponential backoff and jitter (12: a sink down ~10 min loses nothing)"
    )
    backoff_max: Duration = opt(Duration(300.0), "longest wait between two retries")
    spool_dir: str = opt("rankwatch-spool", "undelivered alerts survive agent restarts here")
    spool_max_bytes: Size = opt(Size(16 << 20), "bounded spool; the oldest entries are dropped and counted")
    board_dir: str | None = opt(
        None,
        "shared folder where the agents of a run elect one sender per grouped alert (<dir>/<run>/.alerts);"
        " default dumps.dir, '' turns it off",
    )
    board_takeover: Duration = opt(
        Duration(30.0), "a peer that should send a grouped alert and has not after this long is taken over"
    )
    grafana_url: str | None = opt(
        None,
        "link template in messages, e.g. https://grafana/d/rankwatch-run?var-run={run}&var-rank={rank}",
        url=True,
    )
    report_url: str | None = opt(
        None,
        "link template to the incident's report in messages, e.g. "
        "https://{node}:9478/incidents/{incident}?run={run} (also {rank}, {kind})",
        url=True,
    )


if TYPE_CHECKING:
    AlertsConfig = AlertsCore
else:  # the core keys, then alerts.<sink> for every sink module that declares @settings("alerts", ...)
    AlertsConfig = assemble(AlertsCore, "alerts", "AlertsConfig", discover="rankwatch.actions.alerts.sinks")


@dataclass(frozen=True)
class GpuConfig:
    enabled: bool = opt(True, "sample the watched ranks' GPUs through NVML (off on CPU-only nodes is fine)")
    interval: Duration = opt(Duration(5.0), "time between two GPU samples (at least 50ms)", min=0.05)
    health_interval: Duration = opt(
        Duration(30.0),
        "ECC counters, retired pages, remapped rows, PCIe replays, clock-event counters and the power limit "
        "change on events: read this often, last values kept in between (dcgm-exporter collects every 30s); "
        "an Xid reads them at the next sample; below gpu.interval: every sample",
        min=0.05,
    )
    call_timeout: Duration = opt(
        Duration(10.0),
        "one sample (all NVML calls) gives up after this long; a hung driver skips samples",
        min=0.05,
    )
    xid_wait: Duration = opt(Duration(0.1), "how long each sample waits on NVML's Xid event set")
    devices: tuple[str, ...] = opt(
        (), "GPU indices or UUIDs to watch; empty: the watched processes' GPUs, else every GPU"
    )
    overheat_celsius: float = opt(85.0, "GPU temperature at or above this is overheating")
    sustain_samples: int = opt(
        6, "samples in a row a condition must hold (overheat, throttle, memory pressure)"
    )
    clear_samples: int = opt(3, "samples in a row without the condition before it resolves")
    memory_pressure_ratio: float = opt(0.95, "used/total GPU memory above this is an out-of-memory risk")
    leak_window: int = opt(36, "samples over which a staircase of GPU memory growth is judged")
    leak_min_growth: Size = opt(Size(256 << 20), "growth over the window below this is never a leak")
    leak_min_steps: int = opt(4, "rising steps needed within the window for a staircase")
    warmup_samples: int = opt(12, "first samples ignored by the leak rule (allocator warm-up)")
    leak_long_window: Duration = opt(
        Duration(3600.0),
        "a slow leak (the overnight OOM) is judged over this horizon, climbing in each quarter; 0: off",
    )
    leak_long_resolution: Duration = opt(
        Duration(60.0), "the long horizon keeps one point (the lowest reading) per this long"
    )
    leak_long_min_growth: Size = opt(
        Size(512 << 20), "growth over the long horizon (its largest jump left out) below this is never a leak"
    )
    ecc_corrected_rate: float = opt(
        10.0,
        "corrected (single-bit) ECC errors per hour, sustained over ecc_corrected_window, reported as info; "
        "10x this rate: warning",
    )
    ecc_corrected_window: Duration = opt(Duration(3600.0), "the corrected-error rate is judged over this")
    xid_quiet: Duration = opt(Duration(300.0), "an Xid episode resolves after this long without a new Xid")
    dataloader_window: Duration = opt(
        Duration(600.0), "dataloader_stall: GPU starved while the rank steps, judged over this long; 0: off"
    )
    dataloader_max_util: float = opt(0.3, "dataloader_stall: mean GPU utilisation (0..1) below this")
    dataloader_min_cpu_percent: float = opt(
        80.0, "dataloader_stall: ... while the rank's processes (loader workers included) use this much CPU"
    )
    lost_reprobe: Duration = opt(Duration(60.0), "a lost GPU is probed again this often", min=0.05)
    lost_after: int = opt(
        3,
        "samples in a row in which every reading of a GPU fails with NVML's Unknown Error (999) before it "
        "counts as lost; GPU_IS_LOST (fallen off the bus) is immediate",
    )

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if self.xid_wait >= self.call_timeout:
            out.append(
                (
                    "xid_wait",
                    f"must be shorter than gpu.call_timeout ({self.call_timeout:g}s): the Xid wait is part "
                    "of each sample, which gives up after call_timeout, so every sample would time out",
                )
            )
        if self.leak_long_window > 0:
            why = _climb_problem(
                float(self.leak_long_window), float(self.leak_long_resolution), "leak_long_window"
            )
            if why:
                out.append(("leak_long_window", why))
        return out


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = opt(None, "checkpoint directory to watch (it may appear later); unset: not watched")
    mode: Literal["auto", "poll"] = opt(
        "auto",
        "auto: filesystem events plus a slow safety poll; poll: for NFS/Lustre where events are silent",
    )
    poll_interval: Duration | None = opt(
        None, "rescan period (at least 50ms); default 60s with filesystem events, 10s in poll mode", min=0.05
    )
    settle: Duration = opt(
        Duration(10.0), "files unchanged this long (and the framework's marker) = save done"
    )
    incomplete_after: Duration = opt(
        Duration(900.0), "a save with no completion marker this long after its last write is incomplete"
    )
    corrupt_after: Duration = opt(
        Duration(120.0),
        "a layout without a completion marker (.ckpt, .pt, .safetensors) that fails its check is corrupt "
        "once its files have not changed for this long (a writer that only paused gets this much time)",
    )
    glob: str | None = opt(None, "extra checkpoints: glob relative to dir, e.g. 'runs/*/step_*.pt'")
    step_regex: str | None = opt(None, "regex whose first group is the step, applied to a checkpoint's name")
    max_depth: int = opt(3, "folder levels below dir searched for checkpoints")
    max_age: Duration | None = opt(
        None, "no new good checkpoint for this long = stale; default: stale_factor x median save interval"
    )
    stale_factor: float = opt(3.0, "derived max age = this many median save intervals")
    stale_min: Duration = opt(Duration(1800.0), "the derived max age is never shorter than this")
    min_size_ratio: float = opt(0.5, "smaller than this fraction of the previous good checkpoint = suspect")
    disk_margin: float = opt(1.5, "warn when free space < next checkpoint size x this margin")
    min_free: Size = opt(Size(0), "also warn below this many free bytes (0: only the size rule)")
    deep: bool = opt(False, "sha256 every file and catch later silent changes (reads every byte)")
    rehash_interval: Duration = opt(
        Duration(6 * 3600.0), "deep mode: re-hash good checkpoints this often (at least 1m)", min=60.0
    )
    manifest: str | None = opt(None, "deep mode: JSON manifest of sha256 sums, kept across agent restarts")

    def problems(self) -> list[tuple[str, str]]:
        why = _regex_problem(self.step_regex) if self.step_regex else None
        return [("step_regex", why)] if why else []

    def stale_limit(self, save_times: Sequence[float]) -> float | None:
        """How old the newest good save may get: ``max_age`` when set, else ``stale_factor``
        times the run's median save interval (never under ``stale_min``); None before two saves."""
        if self.max_age is not None:
            return float(self.max_age)
        gap = median_save_gap(save_times)
        return None if gap is None else max(float(self.stale_min), self.stale_factor * gap)


@dataclass(frozen=True)
class ReloadConfig:
    interval: Duration = opt(
        Duration(5.0),
        "live agent: check the --config file for edits this often (0: never); bad edits keep the last good",
        min=0.01,
        zero_off=True,
    )


@dataclass(frozen=True)
class KubernetesConfig:
    enabled: bool = opt(
        False,
        "`watch` as a node DaemonSet: find the opted-in pods' rank processes by their cgroup, follow "
        "their /var/log/pods logs and map GPUs through the kubelet's pod-resources API (rankwatch[k8s])",
    )
    opt_in_env: str = opt(
        "RANKWATCH_WATCH",
        "a rank process is watched when this variable is true in its environment (pod labels and "
        "annotations are not readable without the API server)",
    )
    namespaces: tuple[str, ...] = opt(
        (), "also watch every rank process of pods in these namespaces, opted in or not"
    )
    proc_root: str = opt("/proc", "the host's /proc (the DaemonSet runs with hostPID)")
    pod_logs: str = opt(
        "/var/log/pods", "the kubelet's pod log folder (<namespace>_<pod>_<uid>/<container>/<n>.log)"
    )
    container_logs: str = opt(
        "/var/log/containers",
        "the kubelet's links <pod>_<namespace>_<container>-<id>.log (names only are read)",
    )
    pod_resources_socket: str = opt(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "the kubelet pod-resources gRPC socket; empty: no GPU mapping",
    )
    gpu_resources: tuple[str, ...] = opt(("nvidia.com/gpu",), "extended resources that are GPUs")
    interval: Duration = opt(Duration(10.0), "how often pods are looked for", min=0.1)


@dataclass(frozen=True)
class Config:
    run: RunConfig = section(RunConfig, "identity of the run and this rank")
    logs: LogsConfig = section(LogsConfig, "log following and parsing")
    detectors: DetectorsConfig = section(DetectorsConfig, "thresholds of every detector")
    stall: StallConfig = section(StallConfig, "hang detection (live agent)")
    process: ProcessConfig = section(ProcessConfig, "process sampling (live agent)")
    dumps: DumpsConfig = section(DumpsConfig, "py-spy stack dumps")
    runner: RunModeConfig = section(RunModeConfig, "`rankwatch run`: the child's output and signals")
    server: ServerConfig = section(ServerConfig, "HTTP server: /metrics, health, JSON API")
    alerts: AlertsConfig = section(AlertsConfig, "alert routing and sinks")
    gpu: GpuConfig = section(GpuConfig, "GPU telemetry through NVML")
    checkpoints: CheckpointConfig = section(CheckpointConfig, "checkpoint directory watching")
    reload: ReloadConfig = section(ReloadConfig, "config hot reload (live agent)")
    kubernetes: KubernetesConfig = section(KubernetesConfig, "node mode on Kubernetes (`watch --k8s`)")


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """A plugin's settings class by its name (``from rankwatch.config.schema import
        SlackConfig``), as when it was declared here; its home is the plugin's module."""
        for p in plugin_settings():
            if p.cls.__name__ == name:
                return p.cls
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
