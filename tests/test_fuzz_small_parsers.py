"""Bounded fuzzing of the small parsers the suite's format fuzzers do not reach: every one
either answers or raises its own documented error, whatever the text."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=fuzz_examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


@FUZZ
@given(TEXT)
def test_set_override(text: str) -> None:
    from rankwatch.config.loader import ConfigError, parse_override

    try:
        key, _ = parse_override(text)
    except ConfigError:
        return
    assert key and key == key.strip()


@FUZZ
@given(st.one_of(TEXT, st.from_regex(r"\A(\[[0-9a-f:]*\]|[a-z0-9.]*):[0-9²³¹٣]{0,6}\Z")))
def test_listen_address(text: str) -> None:
    from rankwatch.server import parse_listen

    try:
        host, port = parse_listen(text)
    except ValueError as e:
        assert "listen" in str(e)
        return
    assert 0 <= port <= 65535 and isinstance(host, str)


VISIBLE = st.lists(st.sampled_from(["0", "7", "GPU-ab", "MIG-1", "²", "-1", " 2", ""])).map(",".join)


@FUZZ
@given(st.one_of(TEXT, VISIBLE))
def test_cuda_visible_devices(value: str) -> None:
    from rankwatch.events import GpuInfo
    from rankwatch.gpu.sampler import _parse_visible

    devices = [GpuInfo(index=i, uuid=f"GPU-ab{i}cd") for i in range(4)]
    out = _parse_visible(value, devices)
    assert all(0 <= i < len(devices) for i in out)


@FUZZ
@given(TEXT, st.sets(TEXT, max_size=6))
def test_checkpoint_names(name: str, names: set[str]) -> None:
    from rankwatch.checkpoints.layouts import classify_dir, classify_file

    d = classify_dir(name, names)
    if d is not None:
        assert d[1] is None or d[1] >= 0
    f = classify_file(name)
    if f is not None:
        assert f[1] is None or f[1] >= 0


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
ENTRY = st.dictionaries(
    st.sampled_from(["step", "loss", "grad_norm", "learning_rate", "eval_loss", "epoch", "x"]),
    JSONISH,
    max_size=6,
)


HISTORY = st.one_of(JSONISH, st.lists(st.one_of(ENTRY, JSONISH), max_size=6))


@FUZZ
@given(st.one_of(st.dictionaries(st.text(max_size=12), JSONISH, max_size=4),
                 st.fixed_dictionaries({"log_history": HISTORY})))  # fmt: skip
def test_trainer_state_log_history(state: dict) -> None:
    """A trainer_state.json of any shape: records or nothing, never an exception."""
    from rankwatch.checkpoints.layouts import records_from_state

    for rec in records_from_state(state):
        assert rec.step is None or isinstance(rec.step, int)
