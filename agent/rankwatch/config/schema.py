"""The configuration schema: every key, its type, its default and why it has that default.

Each section is a dataclass; a field's ``metadata["doc"]`` is the one-line help that
``rankwatch config show`` prints next to the key. Types the loader understands: bool,
int, float, str, ``Duration`` (seconds, written ``30s``/``10m``/``2h``), ``Size`` (bytes,
written ``512MiB``), ``X | None``, ``tuple[str, ...]`` (a YAML list), ``dict[str, str]``,
``Literal[...]`` and nested sections. Sections are frozen: a config is an immutable snapshot
(``config.snapshot.replaced`` makes a changed copy); lists are tuples for the same reason.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from typing import Any, Literal, NewType
from urllib.parse import urlsplit

Duration = NewType("Duration", float)
Size = NewType("Size", int)

# The registered formats (rankwatch.sources.parsers.FORMATS) and "auto"; tests/test_catalogs.py
# holds the two together.
LogFormat = Literal[
    "auto",
    "hf",
    "lightning",
    "lightning_csv",
    "megatron",
    "deepspeed",
    "nanogpt",
    "torchtitan",
    "llmc",
    "olmo",
    "json",
    "kv",
    "regex",
]


def opt(default: Any, doc: str, *, min: float | None = None, zero_off: bool = False) -> Any:
    """A key with its default and help; ``min`` is the smallest value the loader accepts
    (with ``zero_off``, 0 is also accepted: it means "off"), so an interval that would
    spin a core next to the rank (``poll_interval: 0s``) is refused with the key named."""
    meta: dict[str, Any] = {"doc": doc}
    if min is not None:
        meta["min"] = min
        meta["zero_off"] = zero_off
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be POSTed to, or None (the URL itself is never quoted: it may hold a key)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        return f"not a valid URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    return None


def _has_userinfo(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.username is not None or parts.password is not None


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


# trend.sustained_climb judges a climb from at least 2 * CLIMB_SEGMENTS points, one per
# resolution; a window holds window / resolution + 1 of them (tests/test_config.py holds the
# two together). A shorter window makes the rule silent for ever.
CLIMB_POINTS = 8


def _climb_problem(window: float, resolution: float, what: str) -> str | None:
    if window >= (CLIMB_POINTS - 1) * resolution:
        return None
    return (
        f"{what} of {window:g}s holds {int(window // resolution) + 1} points of {resolution:g}s; a climb "
        f"is judged from at least {CLIMB_POINTS}, so the rule could never fire: make it at least "
        f"{(CLIMB_POINTS - 1) * resolution:g}s or lower the resolution"
    )


def section(cls: type, doc: str) -> Any:
    return field(default_factory=cls, metadata={"doc": doc})


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
    max_line_bytes: Size = opt(Size(1 << 20), "longer lines are cut here and counted (bounded memory)")
    poll_interval: Duration = opt(
        Duration(0.25), "upper bound between two reads of a followed log (at least 10ms)", min=0.01
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
class NanConfig:
    enabled: bool = opt(True, "non-finite loss, grad norm, eval loss or loss scale")
    zero_loss_min_prior: float = opt(
        0.05, "a loss of exactly 0 after the median loss was above this is treated as NaN-filtered"
    )
    lookback_steps: int = opt(10, "steps before a NaN inspected to tell blow-up from bad batch")
    # fp16 dynamic loss scaling starts high (torch GradScaler 2^16, DeepSpeed 2^32) and halves on
    # each overflow, skipping that step (torch/amp/grad_scaler.py, deepspeed loss_scaler.py): the
    # first logging window of a healthy fp16 run can hold a NaN/inf grad norm. Real cases: the
    # three DeepSpeed calibrations in tests/data/wild (ds_*_scale_calibration.log) and the HF
    # Trainer fp16 run of tests/test_general_reader.py. The next record decides.
    # float32 holds up to 3.4e38 and fp16 training multiplies the loss by the loss scale (torch
    # GradScaler starts at 2^16): a loss beyond 3.4e38 / 2^16 = 5.2e33 overflows to inf when
    # scaled; no loss that means something is that large (ESPnet#3885: -3.19e34 after 59.6).
    overflow_magnitude: float = opt(
        5.2e33, "a loss this large in magnitude is numerically broken: reported as a NaN/Inf loss"
    )
    calibration_records: int = opt(
        1,
        "logged records at the start of a run whose non-finite grad norm (with a finite, non-zero "
        "loss) may be fp16 loss-scale calibration: judged by the record after them, 0 to judge at once",
        min=0,
    )


@dataclass(frozen=True)
class LossSpikeConfig:
    enabled: bool = opt(True, "a single step's loss far above its recent mean")
    factor: float = opt(2.0, "spike when loss > factor x rolling mean of the window")
    window: int = opt(10, "logged steps in the rolling mean")
    min_delta: float = opt(0.1, "and at least this absolute rise, so tiny losses do not fire")
    noise_factor: float = opt(
        8.0,
        "and this many robust standard deviations of the step-to-step noise (MAD), so noisy runs do not fire",
    )
    noise_window: int = opt(50, "logged steps the noise is measured over")
    # Per-batch logs at small batch sizes are noisy (YOLOX VOC at batch size 1, step noise 25% of
    # the loss: tests/data/wild/batch2/yolox_voc_s_healthy_bs1.log; LitGPT per-batch SFT losses
    # 3.5..26, awslabs/keys_values#97); smooth pretraining logs are at 1-2% (the llm.c and
    # torchtitan cases of tests/data/wild). In a noisy log one batch that comes straight back is noise.
    confirm_noise_ratio: float = opt(
        0.1,
        "step noise (robust sd) at or above this fraction of the loss level: a spike must still be up "
        "at the next logged step to count",
    )
    min_records: int = opt(
        1,
        "earlier logged steps a spike is judged against at the least; with fewer than `window` the "
        "loss and the one after it must exceed factor x the largest of them (a short log is judged "
        "against what there is)",
        min=1,
    )


@dataclass(frozen=True)
class LossDivergenceConfig:
    enabled: bool = opt(True, "a sustained rise of the loss, not a single spike")
    window: int = opt(50, "logged steps per median window")
    rise_ratio: float = opt(0.25, "diverging when the recent median is this far above the best median")
    consecutive_windows: int = opt(2, "rise must hold over this many consecutive windows")
    min_delta: float = opt(
        0.1, "and the loss must have risen by at least this much, so tiny losses do not fire"
    )
    blowup_factor: float = opt(
        4.0, "blow-up: losses above this many times the lowest of the run's first five"
    )
    blowup_records: int = opt(3, "blow-up: logged steps in a row above it")
    trend_records: int = opt(32, "trend: logged steps over which most changes must be rises")


@dataclass(frozen=True)
class LossPlateauConfig:
    enabled: bool = opt(True, "loss stopped improving long after warmup")
    window: int = opt(500, "training steps (not logged records) over which some improvement is expected")
    min_improvement: float = opt(0.005, "relative improvement of the median below this is a plateau")
    # A loss that never moves from its first record is a model learning nothing (a warning, not
    # the window rule's info): tf2 ALBERT at 11.17 for 8 records (aws-samples/deep-learning-models
    # #45), DINO at 11.0902 = ln 65536 for 11 epochs (facebookresearch/dino#246), lit-gpt at
    # 10.8259 = ln 50257 for 12 (Lightning-AI/litgpt#689); no healthy run of the wild corpus starts
    # with more than 3 records that close.
    flat_records: int = opt(
        8, "logged losses all within flat_tolerance of the first, from the first, before warning", min=2
    )
    flat_tolerance: float = opt(
        0.001, "relative spread of losses counted as flat (ALBERT's 11.166-11.177 is 0.1%)", min=0.0
    )


@dataclass(frozen=True)
class OverfittingConfig:
    enabled: bool = opt(True, "eval loss rising while train loss still falls")
    eval_rise_ratio: float = opt(0.05, "eval loss this far above its minimum")
    min_evals: int = opt(3, "evaluations needed before judging")
    consecutive: int = opt(2, "evaluations in a row above the threshold")
    # A rise counts only beyond this many times the eval curve's own noise (robust sd of its
    # eval-to-eval changes; the 3-sigma control limit). Real curves: a healthy Keras fine-tune's
    # noisy val loss peaks 2.4 sigma above its best (batch6 keras_csvlogger_resnet50_emotion);
    # overfitting LSTMs rise 3.4 sigma (kk7nc/RMDL#14) and 5.8 sigma (keras-team/keras#3056).
    noise_factor: float = opt(3.0, "a rise must also exceed this many eval-to-eval noise sds", min=0.0)


@dataclass(frozen=True)
class GradExplosionConfig:
    enabled: bool = opt(True, "grad norm far above normal for several steps")
    threshold: float = opt(10.0, "absolute grad-norm threshold")
    factor: float = opt(10.0, "and this many times the post-warmup median")
    consecutive: int = opt(3, "steps in a row above both")
    climb_factor: float = opt(
        10.0, "from step 1: grad norm above threshold and this many times the lowest of the few before"
    )
    baseline_steps: int = opt(10, "steps that form the median; before it, only threshold x factor counts")


@dataclass(frozen=True)
class GradClippingConfig:
    enabled: bool = opt(True, "pre-clip grad norm above max_grad_norm on most steps")
    max_grad_norm: float = opt(1.0, "the run's clipping threshold (HF default 1.0)")
    fraction: float = opt(0.9, "share of steps in the window that must exceed it")
    window: int = opt(100, "logged steps judged")


@dataclass(frozen=True)
class GradVanishingConfig:
    enabled: bool = opt(True, "grad norm collapsed to ~0 for many steps")
    threshold: float = opt(1e-6, "grad norm below this counts as vanished")
    consecutive: int = opt(20, "steps in a row below it")
    # A loss 10^4 times below its first value with the gradients gone likewise is no learning
    # but a collapse (every label masked, the target in the input). Real cases: OLMo#692
    # (tests/data/wild/olmo_loss_collapse_zero.log: 12.18 -> 1.8e-6, grad 231 -> 2e-4) and
    # ModernBERT#233 (loss 0.2 -> 0.0 with NaN grads); a cross-entropy's healthy end is within
    # 10^2 of its start (ln(vocab) ~ 10 -> >= 0.1).
    collapse_ratio: float = opt(
        1e-4, "a loss and a grad norm this many times below their first values is a collapse, from step 1"
    )
    # A loss of exactly 0 with a grad norm below ``threshold`` is what a batch with every label
    # masked gives (no token to learn from), from the first record on, so no first value to fall
    # from. Real case: axolotl#2357 (tests/data/wild/batch3/axolotl_qwen32b_loss_grad_zero.log,
    # 11 records of loss 0.0, grad_norm 0.0). A learning model's loss printed as 0.0 after rounding
    # still has a gradient; five records in a row is no single empty batch.
    dead_records: int = opt(
        5, "records in a row with loss exactly 0 and the grad norm below threshold: nothing is learnt", min=1
    )


@dataclass(frozen=True)
class LossScaleConfig:
    enabled: bool = opt(True, "fp16 loss scaler shrinking again and again")
    min_scale: float = opt(1.0, "a scale at or below this is a collapse")
    max_overflows: int = opt(20, "overflow (skipped) steps within the window that count as a collapse")
    window: int = opt(200, "steps the overflow count is taken over")
    halvings: int = opt(
        5, "overflows in a row (no growth between) ending at or below low_scale are a collapse"
    )
    low_scale: float = opt(16.0, "a scale this low after repeated halvings is no start-up calibration")
    # DeepSpeed's dynamic scaler at its floor overflows once more before it raises (hysteresis,
    # delayed_shift=2 by default, runtime/fp16/loss_scaler.py): beyond that, every step is skipped.
    # Real cases: ds_t5_scale_stuck_at_1.log (HF#14531, every step at scale 1) and fairseq#512
    # (the scale halved to 0.000122, fairseq's floor, then FloatingPointError).
    floor_overflows: int = opt(
        3, "overflows in a row at or below min_scale that count as a collapse (beyond the hysteresis)", min=1
    )


@dataclass(frozen=True)
class ThroughputConfig:
    enabled: bool = opt(True, "step time or tokens/s far worse than the learned baseline")
    drop_ratio: float = opt(0.5, "throughput at or below this fraction of baseline is a drop")
    baseline_steps: int = opt(
        20, "logged steps whose median forms the baseline (the best such median so far)"
    )
    consecutive: int = opt(5, "logged steps in a row below the threshold")


@dataclass(frozen=True)
class RankLagConfig:
    enabled: bool = opt(True, "one rank stopped or lags while others carry on")
    min_lag_steps: int = opt(1, "steps behind the leading rank that count as lagging at the end")


@dataclass(frozen=True)
class HostMemoryConfig:
    enabled: bool = opt(True, "the rank's RSS climbing steadily towards its cgroup or host memory limit")
    resolution: Duration = opt(Duration(60.0), "one point per this long: the lowest RSS within it", min=1.0)
    window: Duration = opt(Duration(1800.0), "the climb must hold in every quarter of this span", min=60.0)
    min_growth: Size = opt(Size(512 << 20), "and add at least this much RSS over it")
    warn_within: Duration = opt(Duration(3600.0), "warn when the limit is reached within this at that rate")

    def problems(self) -> list[tuple[str, str]]:
        why = _climb_problem(float(self.window), float(self.resolution), "window")
        return [("window", why)] if why else []


@dataclass(frozen=True)
class DetectorsConfig:
    warmup_steps: int = opt(
        100,
        "steps the info-level rules (clipping saturated, vanishing gradients) ignore; the loss, "
        "gradient, loss-scale and throughput rules are safe in warmup and judge from step 1",
    )
    nan: NanConfig = section(NanConfig, "NaN / Inf detection")
    loss_spike: LossSpikeConfig = section(LossSpikeConfig, "loss spikes")
    loss_divergence: LossDivergenceConfig = section(LossDivergenceConfig, "sustained loss rise")
    loss_plateau: LossPlateauConfig = section(LossPlateauConfig, "loss plateau")
    overfitting: OverfittingConfig = section(OverfittingConfig, "eval rising while train falls")
    grad_explosion: GradExplosionConfig = section(GradExplosionConfig, "gradient explosion")
    grad_clipping: GradClippingConfig = section(GradClippingConfig, "clipping saturated")
    grad_vanishing: GradVanishingConfig = section(GradVanishingConfig, "vanishing gradients")
    loss_scale: LossScaleConfig = section(LossScaleConfig, "fp16 loss-scale collapse")
    throughput: ThroughputConfig = section(ThroughputConfig, "throughput drop")
    rank_lagging: RankLagConfig = section(RankLagConfig, "cross-rank lag")
    host_memory: HostMemoryConfig = section(HostMemoryConfig, "host memory climbing to the OOM killer")


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
    term_grace: Duration = opt(Duration(30.0), "after forwarding SIGTERM, wait this long, then SIGKILL")


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
    )
    metrics_token: str | None = opt(None, "bearer token required on /metrics (default: open)")
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
class SlackConfig:
    token: str | None = opt(None, "bot token (xoxb-...), from ${SLACK_BOT_TOKEN}")
    channel: str | None = opt(None, "channel id or name for chat.postMessage")
    webhook_url: str | None = opt(None, "incoming-webhook URL, instead of token + channel")
    base_url: str | None = opt(None, "Slack Web API base URL (tests, proxies); default slack-sdk's")
    timeout: Duration = opt(Duration(10.0), "per-request timeout", min=0.1)

    def problems(self) -> list[tuple[str, str]]:
        out = []
        for key in ("webhook_url", "base_url"):
            url = getattr(self, key)
            why = _url_problem(url) if url else None
            if why:
                out.append((key, why))
        # chat.postMessage answers channel_not_specified without a channel: a bot token alone
        # sends nothing, so it is refused. A channel alone is not: its token usually comes from
        # the environment (token: ${SLACK_BOT_TOKEN}) of the node that runs the agent, not of the
        # one that checks the file; without it Slack is off and the agent says so once.
        if self.token and not self.channel and not self.webhook_url:
            out.append(
                ("token", "a bot token needs alerts.slack.channel (chat.postMessage: channel_not_specified)")
            )
        return out


@dataclass(frozen=True)
class AlertmanagerConfig:
    urls: tuple[str, ...] = opt((), "Alertmanager base URLs; alerts go to <url>/api/v2/alerts")
    names: dict[str, str] = opt(
        {}, "URL -> sink name (sink label, spool routing); default alertmanager (-<URL hash> if several)"
    )
    timeout: Duration = opt(Duration(10.0), "per-request timeout", min=0.1)

    def problems(self) -> list[tuple[str, str]]:
        return [(f"urls[{i}]", why) for i, u in enumerate(self.urls) if (why := _url_problem(u))]


@dataclass(frozen=True)
class WebhookConfig:
    urls: tuple[str, ...] = opt((), "generic JSON webhooks (POST)")
    names: dict[str, str] = opt(
        {}, "URL -> sink name (sink label, spool routing); default webhook (-<URL hash> if several)"
    )
    headers: dict[str, str] = opt({}, "extra headers, e.g. Authorization: Bearer ${HOOK_TOKEN}")
    timeout: Duration = opt(Duration(10.0), "per-request timeout", min=0.1)

    def problems(self) -> list[tuple[str, str]]:
        out = [(f"urls[{i}]", why) for i, u in enumerate(self.urls) if (why := _url_problem(u))]
        if any(k.strip().lower() == "authorization" for k in self.headers):
            out += [
                (
                    f"urls[{i}]",
                    "holds user:password@ and alerts.webhook.headers sets Authorization: an HTTP "
                    "request carries one or the other; keep the header (Bearer ${HOOK_TOKEN}) or the "
                    "URL's credentials, not both",
                )
                for i, u in enumerate(self.urls)
                if _has_userinfo(u)
            ]
        return out


@dataclass(frozen=True)
class AlertsConfig:
    min_severity: Literal["info", "warning", "critical"] = opt("warning", "findings below this never alert")
    startup_quiet: Duration = opt(Duration(60.0), "no alerts in the first seconds after the agent starts")
    group_wait: Duration = opt(Duration(5.0), "collect findings of many ranks this long into one message")
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
        None, "link template in messages, e.g. https://grafana/d/rankwatch-run?var-run={run}&var-rank={rank}"
    )
    report_url: str | None = opt(
        None,
        "link template to the incident's report in messages, e.g. "
        "https://{node}:9478/incidents/{incident}?run={run} (also {rank}, {kind})",
    )
    slack: SlackConfig = section(SlackConfig, "Slack (slack-sdk)")
    alertmanager: AlertmanagerConfig = section(AlertmanagerConfig, "Prometheus Alertmanager v2 API")
    webhook: WebhookConfig = section(WebhookConfig, "generic JSON webhook")


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
