"""GPU samples for the live agent, safe against missing and partial drivers.

The calls block; the polled source ``sources.polled.gpu`` runs them off the loop under the
polled sources' policy (one daemon thread at a time, given up after ``gpu.call_timeout``,
later samples skipped while one is stuck), which is what keeps a hung driver from hanging
the agent or piling up threads.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rankwatch.events import GpuInfo, GpuSample
from rankwatch.gpu import GpuConfig
from rankwatch.gpu.backend import FIELDS, HEALTH_FIELDS, GpuBackend, GpuError, NvmlBackend
from rankwatch.identity import LOCAL_RANK_VARS

log = logging.getLogger("rankwatch.gpu")

_NO_DEVICES = frozenset({"", "nodevfiles", "none", "void"})


def _parse_visible(value: str, devices: Sequence[GpuInfo]) -> list[int]:
    """CUDA_VISIBLE_DEVICES as NVML indices. Like CUDA, parsing stops at the first bad entry.

    Integer entries are CUDA ordinals, which match NVML's PCI order on nodes of identical
    GPUs (CUDA breaks FASTEST_FIRST ties by PCI bus id). ``MIG-`` entries cannot be tied to
    a parent GPU without more NVML calls and stop the list.
    """
    out: list[int] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.isascii() and entry.isdigit():  # "²".isdigit() too, but int() refuses it
            idx = int(entry)
            if devices and idx >= len(devices):
                break
            out.append(idx)
        elif entry.upper().startswith("GPU-"):
            match = [d.index for d in devices if d.uuid and d.uuid.lower().startswith(entry.lower())]
            if len(match) != 1:
                break
            out.append(match[0])
        else:
            break
    return out


def attribute_pids_to_gpus(
    pids: Iterable[int],
    env: Mapping[str, str],
    *,
    processes: Mapping[int, Iterable[int]] | None = None,
    devices: Sequence[GpuInfo] = (),
) -> tuple[list[int] | None, str]:
    """The NVML indices of the GPUs the watched processes use, and how that was found.

    First NVML's compute-process lists (``processes``: GPU index -> PIDs; pass the whole
    process tree, the launcher's children hold the contexts; ``nvml_process``); then the
    rank's ``CUDA_VISIBLE_DEVICES`` (one entry per local rank when it lists several and a
    local rank is known; ``cuda_visible_devices``); then the local rank alone
    (``local_rank``). ``(None, "unattributed")`` when nothing ties a GPU to the processes;
    an empty list means "no GPU visible".
    """
    wanted = set(pids)
    if processes:
        hit = sorted(i for i, ps in processes.items() if wanted.intersection(ps))
        if hit:
            return hit, "nvml_process"
    local: int | None = None
    for name in LOCAL_RANK_VARS:
        v = env.get(name, "").strip()
        if v.isdigit():
            local = int(v)
            break
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        if cvd.strip().lower() in _NO_DEVICES:
            return [], "cuda_visible_devices"
        visible = _parse_visible(cvd, devices)
        if len(visible) > 1 and local is not None and local < len(visible):
            return [visible[local]], "cuda_visible_devices"
        if visible:
            return visible, "cuda_visible_devices"
    if local is not None and (not devices or local < len(devices)):
        return [local], "local_rank"
    return None, "unattributed"


def namespace_pids(pid: int, proc: str = "/proc") -> set[int]:
    """Every PID this process has in nested PID namespaces (``NSpid`` in its status file).

    NVML names processes by their PID in the namespace the driver sees, which is not the
    agent's when the trainer runs in another container of the pod or the agent runs on the
    host. Matching on all of a process's PIDs ties its GPU to it in either direction;
    a trainer in a sibling namespace the agent cannot see stays unmatched, and its GPUs are
    then attributed from the environment or reported as unattributed.
    """
    out = {pid}
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    out.update(int(x) for x in line.split()[1:] if x.isdigit())
                    break
    except OSError:
        pass
    return out


@dataclass
class _Lost:
    reason: str
    probed: float


class GpuSampler:
    """Samples the watched GPUs; ``open`` once, then ``map`` and ``sample``, then ``shutdown``.

    Every method blocks on NVML: the agent calls them through its polled source
    (``sources.polled.gpu``), off the loop with a timeout; ``hung`` and ``answered`` are how
    that policy tells the sampler a call is stuck."""

    def __init__(
        self,
        cfg: GpuConfig | None = None,
        *,
        backend: GpuBackend | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg or GpuConfig()
        self.backend: GpuBackend = backend if backend is not None else NvmlBackend()
        self.clock = clock
        self.available = False
        self.reason: str | None = None
        self.devices: dict[int, GpuInfo] = {}
        self.watched: list[int] | None = None  # None: every device
        self.timeouts = 0
        self.errors = 0
        self._hung = False
        self._hung_since = 0.0
        self._failing: str | None = None  # why every reading of every watched GPU failed last round
        self._latest: list[GpuSample] = []
        self._lost: dict[int, _Lost] = {}
        self._unsupported: dict[int, set[str]] = {}
        self._unknown: dict[int, int] = {}  # GPU -> samples in a row that read nothing but error 999
        self._logged: set[tuple[str, str]] = set()
        self._xid_counts: dict[int, Counter[int]] = {}
        # The health readings (HEALTH_FIELDS) last read per GPU, carried into the samples in
        # between, and when each GPU's are next due (clock time; absent: at the next sample).
        self._health: dict[int, dict[str, Any]] = {}
        self._health_due: dict[int, float] = {}
        self._xid_off = False
        self.attribution: dict[int, str] = {}  # GPU index -> how it was tied to a watched rank
        self._warned_unattributed = False

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def up(self) -> bool:
        """What ``rankwatch_gpu_collector_up`` reports: NVML initialised, not hung, and answering."""
        return self.available and not self._hung and self._failing is None

    def hung_for(self) -> float | None:
        """Seconds NVML has not answered a call (real time: the call hangs in real time), or None."""
        return time.monotonic() - self._hung_since if self._hung else None

    def open(self) -> bool:
        """Initialise NVML (blocking); on failure log one line and stay disabled (everything
        else runs on)."""
        if not self.cfg.enabled:
            self.reason = "disabled in the configuration"
            log.info("GPU sampling disabled in the configuration")
            return False
        try:
            infos = self._init()
        except GpuError as e:
            return self.unavailable(str(e) or e.kind)
        except Exception as e:  # a broken binding must not take the agent down
            return self.unavailable(f"{type(e).__name__}: {e}")
        if not infos:
            return self.unavailable("no GPU visible to NVML")
        self.devices = {i.index: i for i in infos}
        self.available = True
        if self.cfg.devices:
            for i in self.watch(self.cfg.devices):
                self.attribution[i] = "configured"
        names = sorted({i.name for i in infos if i.name})
        log.info("NVML: %d GPU(s) %s", len(infos), ", ".join(names))
        return True

    def unavailable(self, reason: str) -> bool:
        """NVML cannot be used (``reason``): said in one line; returns False."""
        self.reason = reason
        # A CPU-only node (no NVIDIA library, or no GPU) is normal, not worth a WARNING at
        # every start; a GPU node whose NVML fails otherwise (driver, timeout) is.
        quiet = reason == "no GPU visible to NVML" or "library not found" in reason.lower()
        log.log(
            logging.INFO if quiet else logging.WARNING,
            "NVML not available: %s; GPU metrics disabled",
            reason,
        )
        return False

    def _init(self) -> list[GpuInfo]:
        self.backend.init()
        infos: list[GpuInfo] = []
        for i in range(self.backend.device_count()):
            try:
                infos.append(self.backend.device_info(i))
            except GpuError as e:
                infos.append(GpuInfo(index=i))
                if e.kind == "gone":
                    self._mark_lost(i, str(e), self.clock())
        return infos

    def shutdown(self) -> None:
        """Release NVML (blocking); the sampler is disabled from now on."""
        if not self.available:
            return
        self.available = False
        with contextlib.suppress(GpuError):
            self.backend.shutdown()

    # --- which GPUs ----------------------------------------------------------------------

    def watch(self, gpus: Iterable[int | str] | None) -> list[int]:
        """Watch these GPUs (NVML indices or UUID prefixes); ``None`` or nothing known: all."""
        if gpus is None:
            self.watched = None
            unknown = [i for i in sorted(self.devices) if i not in self.attribution]
            if unknown and not self._warned_unattributed:
                self._warned_unattributed = True
                log.warning(
                    "no GPU could be tied to the watched processes (NVML lists none of their PIDs, "
                    "and no CUDA_VISIBLE_DEVICES or LOCAL_RANK says which): reporting all %d GPU(s) of "
                    'this node, which may belong to other jobs (attribution="unattributed" on '
                    "rankwatch_gpu_info); set gpu.devices to name them",
                    len(self.devices),
                )
            return sorted(self.devices)
        chosen: list[int] = []
        for g in gpus:
            s = str(g).strip()
            if s.isdigit() and int(s) in self.devices:
                chosen.append(int(s))
                continue
            hit = [d.index for d in self.devices.values() if d.uuid and d.uuid.lower().startswith(s.lower())]
            if len(hit) == 1:
                chosen.append(hit[0])
            else:
                log.warning("GPU %r is not among NVML's devices; ignored", s)
        self.watched = sorted(set(chosen)) if chosen else None
        return sorted(self.devices) if self.watched is None else list(self.watched)

    def _gpus_of(
        self, pids: Iterable[int], env: Mapping[str, str], procs: Mapping[int, list[int]] | None
    ) -> list[int] | None:
        wanted: set[int] = set()
        for pid in pids:
            wanted |= namespace_pids(pid)
        mapped, how = attribute_pids_to_gpus(
            wanted, env, processes=procs, devices=[self.devices[i] for i in sorted(self.devices)]
        )
        if mapped is None:
            return None
        mapped = [i for i in mapped if i in self.devices]
        for i in mapped:
            self.attribution.setdefault(i, how)
        return mapped

    def map(
        self, trees: Iterable[tuple[int | None, Sequence[int], Mapping[str, str]]]
    ) -> dict[int, int | None]:
        """Tie GPUs to ranks and watch them (blocking: reads NVML's process lists): ``trees``
        holds each watched process tree's rank, PIDs and environment. Returns GPU index ->
        rank (the first rank that maps it).

        Configured ``devices`` win; when no GPU maps to any rank, every GPU is watched (and a
        warning says they may be other jobs')."""
        if not self.available:
            return {}
        return self._map(trees, self._compute_pids())

    def _map(
        self,
        trees: Iterable[tuple[int | None, Sequence[int], Mapping[str, str]]],
        procs: Mapping[int, list[int]] | None,
    ) -> dict[int, int | None]:
        owner: dict[int, int | None] = {}
        for rank, pids, env in trees:
            for i in self._gpus_of(pids, env, procs) or []:
                owner.setdefault(i, rank)
        if self.cfg.devices:
            if self.watched is None:
                self.watch(self.cfg.devices)
        else:
            self.watch(sorted(owner) or None)
        return owner

    def _compute_pids(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i in self.devices:
            if i in self._lost:
                continue
            try:
                out[i] = self.backend.compute_pids(i)
            except GpuError:
                continue
        return out

    # --- sampling ------------------------------------------------------------------------

    def latest(self) -> list[GpuSample]:
        return list(self._latest)

    def sample(self) -> list[GpuSample]:
        """One sample of every watched GPU (blocking); ``[]`` when disabled. A sample that
        returns ends a hang (``hung``)."""
        if not self.available:
            return []
        samples = self._latest = self._collect(self._indices())
        self.answered()
        return samples

    def _indices(self) -> list[int]:
        return sorted(self.devices) if self.watched is None else list(self.watched)

    def hung(self, seconds: float) -> None:
        """A sample has not returned for ``seconds``: no stale readings in /metrics, ``up``
        is 0, and the first time it is said in one line and counted in ``timeouts``."""
        self._latest = []
        if not self._hung:
            self._hung = True
            self.timeouts += 1
            log.warning(
                "NVML did not answer within %gs; GPU samples are skipped until it does", self.cfg.call_timeout
            )
        self._hung_since = time.monotonic() - seconds

    def answered(self) -> None:
        if self._hung:
            self._hung = False
            log.warning("NVML answers again")

    def _collect(self, indices: Sequence[int]) -> list[GpuSample]:
        now = self.clock()
        failed: dict[int, str] = {}
        samples = [self._read_gpu(i, now, failed) for i in indices]
        self._judge_round(samples, failed)
        by_index = {s.index: s for s in samples}
        for ev in self._xid_events():
            counts = self._xid_counts.setdefault(ev.gpu if ev.gpu is not None else -1, Counter())
            counts[ev.xid] += 1
            s = by_index.get(ev.gpu) if ev.gpu is not None else None
            if s is not None:
                s.xids.append(ev.xid)
                # Many Xids come with memory errors (48: double-bit ECC, 63/64: row remapping):
                # the board's counters are read at the next sample, not a health interval later.
                self._health_due.pop(s.index, None)
            elif ev.gpu is None:
                log.warning("Xid %d on a GPU that NVML could not name: see the kernel log (dmesg)", ev.xid)
            else:
                log.info("Xid %d on GPU %s, which this agent does not watch", ev.xid, ev.gpu)
        for s in samples:
            s.xid_counts = dict(self._xid_counts.get(s.index, {}))
        return samples

    def _xid_events(self) -> list[Any]:
        if self._xid_off:
            return []
        try:
            return self.backend.xid_events(self.cfg.xid_wait)
        except GpuError as e:
            if e.kind == "not_supported":
                self._xid_off = True
            self._log_once("xid", e.kind, "Xid events: %s (%s)", e.kind.replace("_", " "), e)
            return []

    def _judge_round(self, samples: Sequence[GpuSample], failed: Mapping[int, str]) -> None:
        """A driver that fails every call (unloaded, wedged) is down, said in one line, not one per field."""
        answering = [s for s in samples if not s.lost]
        why = next(iter(failed.values()), None)
        if answering and all(s.index in failed for s in answering):
            if self._failing is None:
                log.warning("NVML fails every reading (%s); GPU metrics are down until it answers", why)
            self._failing = why or "failed"
        elif self._failing is not None:
            self._failing = None
            log.warning("NVML answers again")

    def _read_gpu(self, i: int, now: float, failed: dict[int, str] | None = None) -> GpuSample:
        info = self.devices.get(i) or GpuInfo(index=i)
        s = self._blank(info, now)
        lost = self._lost.get(i)
        if lost is not None:
            if now - lost.probed < self.cfg.lost_reprobe:
                s.lost, s.lost_reason = True, lost.reason
                return s
            lost.probed = now
        skip = self._unsupported.setdefault(i, set())
        errors: list[tuple[str, str]] = []
        unknown: str | None = None
        read = 0
        health = now >= self._health_due.get(i, now)
        kept = self._health.setdefault(i, {})
        s.health_fresh = health
        for name in FIELDS:
            if name in skip:
                continue
            if name in HEALTH_FIELDS and not health:
                if name in kept:  # carried forward: unchanged since it was read, as far as we know
                    _assign(s, name, kept[name])
                continue
            try:
                value = getattr(self.backend, name)(i)
            except GpuError as e:
                if e.kind == "gone":
                    self._mark_lost(i, str(e), now)
                    s = self._blank(info, now)
                    s.lost, s.lost_reason = True, str(e)
                    return s
                if e.kind == "not_supported":
                    skip.add(name)
                    self._log_once(
                        name, "not_supported", "GPU %d: %s not supported (%s); skipped", i, name, e
                    )
                else:
                    if e.kind == "unknown" and unknown is None:
                        unknown = str(e) or "Unknown Error"
                    self.errors += 1
                    errors.append((name, f"{e}"))
                kept.pop(name, None)
                continue
            except Exception as e:
                self.errors += 1
                errors.append((name, repr(e)))
                kept.pop(name, None)
                continue
            _assign(s, name, value)
            if name in HEALTH_FIELDS:
                kept[name] = value
            read += 1
        if health:
            if any(name in HEALTH_FIELDS for name, _why in errors):
                self._health_due.pop(i, None)  # a failed health reading is retried next sample
            else:
                self._health_due[i] = now + self.cfg.health_interval
        if errors and not read and failed is not None:
            failed[i] = errors[0][1]
        else:
            for name, why in errors:
                self._log_once(name, "failed", "GPU %d: reading %s failed (%s); retried", i, name, why)
        if read:
            self._unknown.pop(i, None)
            if self._lost.pop(i, None) is not None:
                log.warning("GPU %d answers NVML again", i)
            return s
        reason = lost.reason if lost is not None else None
        if unknown is not None:
            streak = self._unknown[i] = self._unknown.get(i, 0) + 1
            if streak >= self.cfg.lost_after:
                reason = f"{unknown} (NVML error 999) on every reading for {streak} samples in a row"
        if reason is None:  # nothing read, but not (yet) lost: a hiccup is retried next sample
            return s
        self._mark_lost(i, reason, now)  # also a reprobe that read nothing: still lost
        s.lost, s.lost_reason = True, reason
        return s

    def _blank(self, info: GpuInfo, now: float) -> GpuSample:
        return GpuSample(
            index=info.index,
            time=now,
            uuid=info.uuid,
            name=info.name,
            pci_bus_id=info.pci_bus_id,
            driver_version=info.driver_version,
            compute_capability=info.compute_capability,
            attribution=self.attribution.get(info.index, "unattributed"),
        )

    def _mark_lost(self, i: int, reason: str, now: float) -> None:
        self._health.pop(i, None)  # a GPU that answers again is read in full at once
        self._health_due.pop(i, None)
        if i not in self._lost:
            log.error("GPU %d is lost: %s", i, reason)
        self._lost[i] = _Lost(reason=reason, probed=now)

    def _log_once(self, what: str, kind: str, msg: str, *args: Any) -> None:
        if (what, kind) in self._logged:
            return
        self._logged.add((what, kind))
        (log.info if kind == "not_supported" else log.warning)(msg, *args)


def _assign(s: GpuSample, name: str, v: Any) -> None:
    if name == "memory":
        s.memory_used, s.memory_total = int(v[0]), int(v[1])
    elif name == "utilization":
        s.utilization, s.memory_utilization = float(v[0]), float(v[1])
    elif name == "clocks":
        s.sm_clock, s.memory_clock = float(v[0]), float(v[1])
    elif name == "throttle_reasons":
        s.throttle = dict(v)
    elif name == "ecc_errors":
        s.ecc = dict(v)
    elif name == "retired_pages":
        s.retired_pages, s.retired_pages_pending = dict(v[0]), bool(v[1])
    elif name == "remapped_rows":
        s.remapped_rows = {"correctable": int(v[0]), "uncorrectable": int(v[1])}
        s.remap_pending, s.remap_failure = bool(v[2]), bool(v[3])
    elif name == "pcie_replays":
        s.pcie_replays = int(v)
    elif name == "memory_detail":
        s.memory_free = int(v[0])
        s.memory_reserved = None if v[1] is None else int(v[1])
    elif name == "energy":
        s.energy = float(v)
    elif name == "pcie_throughput":
        s.pcie_tx, s.pcie_rx = float(v[0]), float(v[1])
    elif name == "violations":
        s.violations = dict(v)
    elif name == "nvlink":
        s.nvlink_tx, s.nvlink_rx, s.nvlink_errors = float(v[0]), float(v[1]), dict(v[2])
    elif name == "gpm":
        for attr, ratio in v.items():
            setattr(s, attr, float(ratio))
    else:  # temperature, memory_temperature, power, power_limit
        setattr(s, name, float(v))
