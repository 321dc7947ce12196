"""Detectors: pure rules over a rank's state, one failure family per module."""

from __future__ import annotations

from rankwatch.config.schema import DetectorsConfig
from rankwatch.detectors.base import Detector
from rankwatch.detectors.errors import ErrorSignatureDetector
from rankwatch.detectors.grads import (
    GradClippingDetector,
    GradExplosionDetector,
    GradVanishingDetector,
    LossScaleDetector,
)
from rankwatch.detectors.loss import (
    LossDivergenceDetector,
    LossPlateauDetector,
    LossSpikeDetector,
    NanDetector,
    OverfittingDetector,
)
from rankwatch.detectors.throughput import ThroughputDetector


def build_detectors(cfg: DetectorsConfig) -> list[Detector]:
    """A fresh set for one rank (detectors keep per-rank episode state)."""
    w = cfg.warmup_steps
    return [
        ErrorSignatureDetector(),
        NanDetector(cfg.nan, w),
        LossSpikeDetector(cfg.loss_spike, w),
        LossDivergenceDetector(cfg.loss_divergence, w),
        LossPlateauDetector(cfg.loss_plateau, w),
        OverfittingDetector(cfg.overfitting, w),
        GradExplosionDetector(cfg.grad_explosion, w),
        GradClippingDetector(cfg.grad_clipping, w),
        GradVanishingDetector(cfg.grad_vanishing, w),
        LossScaleDetector(cfg.loss_scale, w),
        ThroughputDetector(cfg.throughput, w),
    ]


__all__ = ["Detector", "build_detectors"]
