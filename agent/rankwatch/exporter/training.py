"""Training progress and the numbers the framework printed, one series per rank.

A value appears only if the log carried it: a run that never prints MFU has no
``rankwatch_mfu_ratio`` series rather than a misleading 0. NaN is exported as NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import accumulate

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot
from rankwatch.state import STEP_TIME_BUCKETS

# metric name, help, key in RankSnapshot.latest
_PRINTED: tuple[tuple[str, str, str], ...] = (
    ("loss", "Training loss of the last step line that printed one (NaN stays NaN)", "loss"),
    ("grad_norm", "Gradient norm of the last step line that printed one", "grad_norm"),
    ("learning_rate", "Learning rate of the last step line that printed one", "learning_rate"),
    ("loss_scale", "fp16 dynamic loss scale as last printed", "loss_scale"),
    ("tokens_per_second", "Tokens per second as last printed by the framework", "tokens_per_s"),
    ("samples_per_second", "Samples per second as last printed by the framework", "samples_per_s"),
    (
        "flops_per_second",
        "Achieved FLOP/s per GPU as last printed by the framework (TFLOP/s x 1e12)",
        "tflops",
    ),
    ("mfu_ratio", "Model FLOPs utilisation (0..1) as last printed by the framework", "mfu"),
    ("framework_memory_bytes", "Device memory the framework reported in its step line", "memory_bytes"),
    (
        "framework_max_memory_bytes",
        "Peak device memory the framework reported in its step line",
        "max_memory_bytes",
    ),
)


def _g(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"rankwatch_{name}", doc, labels=RANK_LABELS)


@register("training")
def collect_training(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("ranks")
    step = _g("step", "Last training step (iteration) number seen in the log")
    total = _g("total_steps", "Planned number of training steps, where the log states it")
    eta = _g("eta_seconds", "Estimated time to the last step, from the recent step rate")
    last = _g(
        "last_progress_timestamp_seconds", "Unix time of the last step line that advanced the step number"
    )
    since = _g(
        "seconds_since_progress",
        "Seconds without a new step (ranks that print no steps: without log growth or CPU "
        "progress); on the stall detector's clock",
    )
    timeout = _g("stall_timeout_seconds", "Current stall timeout; above it a stall is reported")
    duration = _g(
        "step_duration_seconds",
        "Median of the last 20 printed step times; derived from the step rate if none is printed",
    )
    hist = HistogramMetricFamily(
        "rankwatch_step_time_seconds",
        "Printed step times since the agent started: rate(_sum)/rate(_count) is the mean over any "
        "range, histogram_quantile() a percentile (ranks that print no step time have none)",
        labels=RANK_LABELS,
    )
    eval_loss = _g("eval_loss", "Last evaluation (validation) loss")
    printed = [(_g(name, doc), key) for name, doc, key in _PRINTED]
    for v in snap.ranks:
        labels = list(v.labels)
        st = v.state
        if st is not None:
            if st.last_step is not None:
                step.add_metric(labels, st.last_step)
            counts = st.step_time_counts
            if any(counts):
                cum = list(accumulate(counts))
                bounds = [f"{b:g}" for b in STEP_TIME_BUCKETS] + ["+Inf"]
                hist.add_metric(labels, list(zip(bounds, cum, strict=True)), st.step_time_sum)
            if st.total_steps is not None:
                total.add_metric(labels, st.total_steps)
        if v.eta_s is not None:
            eta.add_metric(labels, v.eta_s)
        if v.last_progress_time is not None:
            last.add_metric(labels, v.last_progress_time)
        if v.seconds_since_progress is not None:
            since.add_metric(labels, v.seconds_since_progress)
        if v.stall_timeout_s is not None:
            timeout.add_metric(labels, v.stall_timeout_s)
        if v.step_duration_s is not None:
            duration.add_metric(labels, v.step_duration_s)
        if v.eval_loss is not None:
            eval_loss.add_metric(labels, v.eval_loss)
        for fam, key in printed:
            x = v.latest.get(key)
            if x is not None:
                fam.add_metric(labels, x * 1e12 if key == "tflops" else x)  # base units
    return [step, total, eta, last, since, timeout, duration, hist, eval_loss, *(f for f, _ in printed)]
