"""Prometheus metric families from GPU samples, for a custom prometheus-client collector.

A reading the sample does not have produces no series at all: an unsupported memory
temperature must not show up as 0 C in Grafana. NVML's cumulative counts (ECC errors,
retired pages, remapped rows, PCIe replays) are exported as ``_total`` counters, so that
``increase()`` works on them; they are lifetime values that only grow (a replaced board
has a new UUID, hence new series). Xid counts are the events this agent saw since it
started, labelled by a bounded ``xid`` value (see ``xid.xid_label``). Series carry the
same rank labels as the agent's other per-rank series, ``local_rank`` included, so they
join with them without ``ignoring()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.events import GpuSample
from rankwatch.xid import xid_label

GPU_LABELS = ("run", "rank", "local_rank", "node", "gpu", "uuid")

# metric name (after rankwatch_gpu_), help, GpuSample attribute
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("utilization_ratio", "Share of time a kernel ran on the GPU (NVML utilization.gpu)", "utilization"),
    (
        "memory_utilization_ratio",
        "Share of time device memory was read or written (NVML utilization.memory)",
        "memory_utilization",
    ),
    ("memory_used_bytes", "Device memory in use (all processes)", "memory_used"),
    ("memory_total_bytes", "Device memory in total", "memory_total"),
    ("temperature_celsius", "GPU core temperature", "temperature"),
    (
        "memory_temperature_celsius",
        "GPU memory (HBM) temperature, where the board reports it",
        "memory_temperature",
    ),
    ("power_watts", "Power draw", "power"),
    ("power_limit_watts", "Enforced power limit", "power_limit"),
    ("sm_clock_hertz", "Current SM clock", "sm_clock"),
    ("memory_clock_hertz", "Current memory clock", "memory_clock"),
    ("memory_free_bytes", "Device memory free (dcgm-exporter DCGM_FI_DEV_FB_FREE)", "memory_free"),
    (
        "memory_reserved_bytes",
        "Device memory reserved by the driver (dcgm-exporter DCGM_FI_DEV_FB_RESERVED)",
        "memory_reserved",
    ),
    (
        "sm_active_ratio",
        "Share of cycles an SM had a warp resident (NVML GPM; dcgm-exporter DCGM_FI_PROF_SM_ACTIVE)",
        "sm_active",
    ),
    (
        "sm_occupancy_ratio",
        "Resident warps over the SMs' maximum (NVML GPM; DCGM_FI_PROF_SM_OCCUPANCY)",
        "sm_occupancy",
    ),
    (
        "tensor_active_ratio",
        "Share of cycles a tensor core pipe was busy (NVML GPM; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
        "tensor_active",
    ),
    (
        "dram_active_ratio",
        "Share of cycles device memory was busy (NVML GPM; DCGM_FI_PROF_DRAM_ACTIVE)",
        "dram_active",
    ),
)


def _gauge(name: str, doc: str, extra: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"rankwatch_gpu_{name}", doc, labels=[*GPU_LABELS, *extra])


def _counter(name: str, doc: str, extra: Sequence[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(f"rankwatch_gpu_{name}", doc, labels=[*GPU_LABELS, *extra])


def _label(v: Any) -> str:
    return "" if v is None else str(v)


def gpu_metric_families(
    samples_by_rank: Mapping[Any, Sequence[GpuSample]],
    identity_labels: Mapping[str, str],
    *,
    up: bool | None = None,
    local_ranks: Mapping[Any, Any] | None = None,
) -> list[Metric]:
    """Families for the latest samples of each rank (key: rank number, or None/"" if unknown).

    ``identity_labels`` gives ``run``, ``rank``, ``local_rank`` and ``node``
    (``Identity.labels()`` fits); ``up`` is the sampler's ``up`` (default: whether any sample
    is present). ``local_ranks`` maps other ranks (a node agent watching several) to their
    local rank; the agent's own rank takes it from ``identity_labels``, any other: empty.
    """
    run = str(identity_labels.get("run", ""))
    node = str(identity_labels.get("node", ""))
    own_rank = str(identity_labels.get("rank", ""))
    own_local = str(identity_labels.get("local_rank", ""))
    locals_ = {_label(k): _label(v) for k, v in (local_ranks or {}).items()}

    def local_of(rank_label: str) -> str:
        return locals_.get(rank_label, own_local if rank_label == own_rank else "")

    if up is None:
        up = any(samples_by_rank.values())
    # Per agent, not per GPU: it keeps the labels dashboards and tests already select it by.
    up_family = GaugeMetricFamily(
        "rankwatch_gpu_collector_up",
        "1 when NVML initialised and answers, 0 when GPU metrics are unavailable",
        labels=["run", "rank", "node"],
    )
    up_family.add_metric([run, own_rank, node], 1.0 if up else 0.0)

    gauges = {attr: _gauge(name, doc) for name, doc, attr in _GAUGES}
    lost = _gauge("lost", "1 when NVML reports the GPU lost (fallen off the bus)")
    throttle = _gauge("throttle_reason", "1 while this clock-event (throttle) reason is active", ["reason"])
    ecc = _counter(
        "ecc_errors_total",
        "ECC errors counted by NVML (volatile: since driver load; aggregate: lifetime)",
        ["type", "scope"],
    )
    retired = _counter(
        "retired_pages_total", "Memory pages retired in the board's life, by cause (pre-Ampere)", ["cause"]
    )
    retired_pending = _gauge("retired_pages_pending", "1 when a page retirement waits for a GPU reset")
    remapped = _counter(
        "remapped_rows_total", "Memory rows remapped in the board's life, by error type (Ampere+)", ["type"]
    )
    remap_pending = _gauge("remapped_rows_pending", "1 when a row remapping waits for a GPU reset")
    remap_failure = _gauge("remapped_rows_failure", "1 when a row remapping failed")
    replays = _counter("pcie_replay_total", "PCIe replay counter")
    xids = _counter("xid_errors_total", "Xid critical-error events seen by this agent", ["xid"])
    info = _gauge(
        "info",
        "1 per GPU: model, PCI bus, driver, compute capability and how the GPU was tied to this rank "
        "(attribution=unattributed: every GPU of the node is reported, some may be other jobs')",
        ["name", "pci_bus_id", "driver_version", "compute_capability", "attribution"],
    )
    energy = _counter(
        "energy_joules_total",
        "Energy used since the driver loaded (dcgm-exporter DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, in mJ)",
    )
    pcie = _gauge(
        "pcie_throughput_bytes_per_second",
        "PCIe traffic over NVML's last ~20 ms window (dcgm-exporter DCGM_FI_PROF_PCIE_TX/RX_BYTES)",
        ["direction"],
    )
    violation = _counter(
        "clock_event_seconds_total",
        "Time the clocks were held below their target, by cause (dcgm-exporter DCGM_FI_DEV_*_VIOLATION, us)",
        ["reason"],
    )
    nvlink = _counter(
        "nvlink_data_bytes_total", "Data moved over all NVLinks since the driver loaded", ["direction"]
    )
    nvlink_errors = _counter(
        "nvlink_errors_total",
        "NVLink errors summed over links (dcgm-exporter DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL)",
        ["type"],
    )

    for rank, samples in samples_by_rank.items():
        rank_label = _label(rank)
        local = local_of(rank_label)
        for s in samples:
            base = [run, rank_label, local, node, str(s.index), s.uuid or ""]
            lost.add_metric(base, 1.0 if s.lost else 0.0)
            info.add_metric(
                [
                    *base,
                    s.name or "",
                    s.pci_bus_id or "",
                    s.driver_version or "",
                    s.compute_capability or "",
                    s.attribution or "unattributed",
                ],
                1.0,
            )
            by_label: Counter[str] = Counter()
            for x, n in s.xid_counts.items():
                by_label[xid_label(x)] += n
            for label in sorted(by_label, key=lambda v: (v == "other", int(v) if v.isdigit() else 0)):
                xids.add_metric([*base, label], float(by_label[label]))
            if s.lost:
                continue
            for attr, fam in gauges.items():
                v = getattr(s, attr)
                if v is not None:
                    fam.add_metric(base, float(v))
            for reason, on in sorted((s.throttle or {}).items()):
                throttle.add_metric([*base, reason], 1.0 if on else 0.0)
            for (etype, scope), n in sorted((s.ecc or {}).items()):
                ecc.add_metric([*base, etype, scope], float(n))
            for cause, n in sorted((s.retired_pages or {}).items()):
                retired.add_metric([*base, cause], float(n))
            if s.retired_pages_pending is not None:
                retired_pending.add_metric(base, float(s.retired_pages_pending))
            for etype, n in sorted((s.remapped_rows or {}).items()):
                remapped.add_metric([*base, etype], float(n))
            if s.remap_pending is not None:
                remap_pending.add_metric(base, float(s.remap_pending))
            if s.remap_failure is not None:
                remap_failure.add_metric(base, float(s.remap_failure))
            if s.pcie_replays is not None:
                replays.add_metric(base, float(s.pcie_replays))
            if s.energy is not None:
                energy.add_metric(base, s.energy)
            if s.pcie_tx is not None and s.pcie_rx is not None:
                pcie.add_metric([*base, "tx"], s.pcie_tx)
                pcie.add_metric([*base, "rx"], s.pcie_rx)
            for reason, secs in sorted((s.violations or {}).items()):
                violation.add_metric([*base, reason], secs)
            if s.nvlink_tx is not None and s.nvlink_rx is not None:
                nvlink.add_metric([*base, "tx"], s.nvlink_tx)
                nvlink.add_metric([*base, "rx"], s.nvlink_rx)
            for etype, n in sorted((s.nvlink_errors or {}).items()):
                nvlink_errors.add_metric([*base, etype], float(n))

    families: list[Metric] = [
        up_family,
        lost,
        *gauges.values(),
        throttle,
        ecc,
        retired,
        retired_pending,
        remapped,
        remap_pending,
        remap_failure,
        replays,
        xids,
        info,
        energy,
        pcie,
        violation,
        nvlink,
        nvlink_errors,
    ]
    return [f for f in families if f.samples or f is up_family]
