from __future__ import annotations

import dataclasses
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.config import loader
from rankwatch.config.loader import (
    ConfigError,
    config_from_dict,
    config_from_yaml,
    load_config,
    parse_override,
    with_overrides,
)
from rankwatch.config.render import config_keys, render_config
from rankwatch.config.schema import AlertsConfig, Config, Duration, Size, SlackConfig
from rankwatch.config.units import format_duration, format_size, parse_duration, parse_size


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    assert info.value.file == str(path)
    return info.value


# -- defaults and valid files -------------------------------------------------------------


@pytest.mark.unit
def test_none_means_defaults() -> None:
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.detectors.loss_spike.factor == 2.0
    assert cfg.logs.poll_interval == 0.25


@pytest.mark.unit
@pytest.mark.parametrize(
    "text", ["", "\n\n", "# only a comment\n  # another\n", "---\n", "~\n", "\ufeff# bom\n"]
)
def test_empty_or_comment_only_file_gives_defaults(tmp_path: Path, text: str) -> None:
    assert load_config(write(tmp_path, text)) == Config()


@pytest.mark.unit
def test_realistic_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        # production settings
        run:
          name: llama-70b-pretrain
          rank: 3
          node: 2024            # a number is fine for a string key
        logs:
          format: megatron
          poll_interval: 1.5s
          max_line_bytes: 4MiB
          regex: '(?P<step>\\d+) loss (?P<loss>[\\d.]+)'
        detectors:
          warmup_steps: 500
          nan:
            enabled: no         # YAML 1.1 boolean
          loss_spike:
            factor: 3           # int accepted for float
          grad_vanishing:
            threshold: 1e-7     # YAML 1.1 reads this as a string; still a number here
          loss_plateau:         # all keys commented out: defaults
        """,
    )
    cfg = load_config(path)
    assert cfg.run.name == "llama-70b-pretrain"
    assert cfg.run.rank == 3
    assert cfg.run.node == "2024"
    assert cfg.run.world_size is None
    assert cfg.logs.format == "megatron"
    assert cfg.logs.poll_interval == 1.5
    assert cfg.logs.max_line_bytes == 4 * 1024 * 1024
    assert cfg.logs.regex == r"(?P<step>\d+) loss (?P<loss>[\d.]+)"
    assert cfg.detectors.warmup_steps == 500
    assert cfg.detectors.nan.enabled is False
    assert cfg.detectors.loss_spike.factor == 3.0
    assert isinstance(cfg.detectors.loss_spike.factor, float)
    assert cfg.detectors.grad_vanishing.threshold == 1e-7
    assert cfg.detectors.loss_plateau == Config().detectors.loss_plateau
    assert cfg.detectors.loss_spike.window == 10  # untouched keys keep defaults


@pytest.mark.unit
def test_merge_keys_and_anchors(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            """
            detectors:
              grad_explosion: &strict
                consecutive: 1
                enabled: false
              throughput:
                <<: *strict
                enabled: true
            """,
        )
    )
    assert cfg.detectors.grad_explosion.consecutive == 1
    assert cfg.detectors.throughput.consecutive == 1
    assert cfg.detectors.throughput.enabled is True  # explicit key wins over the merged one


# -- errors, each with its exact line -------------------------------------------------------


@pytest.mark.unit
def test_unknown_key_message_format(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        """
        logs:
          format: hf
        detectors:
          warmup_steps: 10
          loss_spike:
            window: 5
            factr: 3.0
        """,
    )
    assert (err.line, err.key) == (7, "detectors.loss_spike.factr")
    assert str(err) == f"{err.file}:7: detectors.loss_spike.factr: unknown key (did you mean 'factor'?)"


@pytest.mark.unit
def test_unknown_nested_section(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        """
        detectors:
          nan:
            enabled: true
          loss_spikes:
            factor: 3.0
        """,
    )
    assert (err.line, err.key) == (4, "detectors.loss_spikes")
    assert "did you mean 'loss_spike'?" in err.message


@pytest.mark.unit
def test_unknown_top_level_without_close_match_lists_sections(tmp_path: Path) -> None:
    err = error_of(tmp_path, "run:\n  rank: 1\nzzzzzz: {}\n")
    assert (err.line, err.key) == (3, "zzzzzz")
    assert err.message == (
        "unknown key; valid keys: run, logs, detectors, stall, process, dumps, runner, server, alerts, gpu, "
        "checkpoints, reload, kubernetes"
    )


@pytest.mark.unit
def test_dotted_key_written_flat(tmp_path: Path) -> None:
    err = error_of(tmp_path, "detectors.warmup_steps: 10\n")
    assert (err.line, err.key) == (1, "detectors.warmup_steps")
    assert "nest it under 'detectors:'" in err.message


@pytest.mark.unit
def test_duplicate_key(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        """
        detectors:
          loss_spike:
            factor: 2.5
            window: 20
            factor: 4.0
        """,
    )
    assert (err.line, err.key) == (5, "detectors.loss_spike.factor")
    assert err.message == "duplicate key (first defined on line 3)"


@pytest.mark.unit
def test_duplicate_section(tmp_path: Path) -> None:
    err = error_of(tmp_path, "logs:\n  format: hf\nrun:\n  rank: 1\nlogs:\n  format: json\n")
    assert (err.line, err.key) == (5, "logs")


@pytest.mark.unit
def test_literal_error_lists_every_choice(tmp_path: Path) -> None:
    err = error_of(tmp_path, "run:\n  rank: 0\nlogs:\n  format: megatorn\n")
    assert (err.line, err.key) == (4, "logs.format")
    for choice in ("auto", "hf", "lightning", "megatron", "deepspeed", "nanogpt", "torchtitan", "json", "kv"):
        assert f"'{choice}'" in err.message
    assert "(got 'megatorn')" in err.message
    assert "did you mean 'megatron'?" in err.message


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "line", "key", "expected"),
    [
        (
            "detectors:\n  warmup_steps: true\n",
            2,
            "detectors.warmup_steps",
            "expected an integer, got a boolean",
        ),
        (
            "detectors:\n  warmup_steps: yes\n",
            2,
            "detectors.warmup_steps",
            "expected an integer, got a boolean",
        ),
        (
            "detectors:\n  warmup_steps: 1.5\n",
            2,
            "detectors.warmup_steps",
            "expected an integer, got a number",
        ),
        (
            "detectors:\n  warmup_steps: '100'\n",
            2,
            "detectors.warmup_steps",
            "expected an integer, got a string",
        ),
        ("detectors:\n\n  warmup_steps: lots\n", 3, "detectors.warmup_steps", "expected an integer"),
        (
            "detectors:\n  loss_spike:\n    factor: on\n",
            3,
            "detectors.loss_spike.factor",
            "expected a number",
        ),
        ("detectors:\n  loss_spike:\n    factor: .nan\n", 3, "detectors.loss_spike.factor", "NaN"),
        ("detectors:\n  nan:\n    enabled: 1\n", 3, "detectors.nan.enabled", "expected true or false"),
        ("detectors:\n  nan:\n    enabled: 'yes'\n", 3, "detectors.nan.enabled", "expected true or false"),
        (
            "detectors:\n  nan: [1, 2]\n",
            2,
            "detectors.nan",
            "expected a section (a mapping of keys), got a list",
        ),
        ("detectors:\n  nan: true\n", 2, "detectors.nan", "expected a section"),
        ("logs:\n  encoding: [utf-8]\n", 2, "logs.encoding", "expected a string, got a list"),
        ("logs:\n  encoding:\n", 2, "logs.encoding", "expected a string, got null"),
        ("logs:\n  sniff_lines:\n", 2, "logs.sniff_lines", "expected an integer, got null"),
        ("logs:\n  poll_interval: soon\n", 2, "logs.poll_interval", "invalid duration 'soon'"),
        ("logs:\n  poll_interval: 10x\n", 2, "logs.poll_interval", "unknown unit 'x'"),
        ("logs:\n  poll_interval: -1s\n", 2, "logs.poll_interval", "must not be negative"),
        ("logs:\n  poll_interval: true\n", 2, "logs.poll_interval", "expected a duration"),
        ("logs:\n  max_line_bytes: 12 parsecs\n", 2, "logs.max_line_bytes", "unknown unit 'parsecs'"),
        ("logs:\n  max_line_bytes: 1.5\n", 2, "logs.max_line_bytes", "whole number"),
        ("logs:\n  max_line_bytes: -4KiB\n", 2, "logs.max_line_bytes", "must not be negative"),
        ("run:\n  name: !secret x\n", 2, "run.name", "unsupported YAML tag '!secret'"),
        ("run:\n  ? [a, b]\n  : 1\n", 2, "run", "keys must be plain names"),
        ("logs: [hf]\n", 1, "logs", "expected a section"),
    ],
)
def test_type_errors_name_line_key_and_expectation(
    tmp_path: Path, text: str, line: int, key: str, expected: str
) -> None:
    err = error_of(tmp_path, text)
    assert (err.line, err.key) == (line, key)
    assert expected in err.message
    assert str(err).startswith(f"{err.file}:{line}: {key}: ")


@pytest.mark.unit
@pytest.mark.parametrize("text", ["- run\n- logs\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    err = error_of(tmp_path, text)
    assert err.line == 1 and err.key is None
    assert "mapping of sections at the top level" in err.message


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("run:\n  rank: 1\nlogs:\n  format: hf\n  sniff_lines: [1, 2\n", 6),
        ("run:\n  name: a\n  rank: 1: 2\n", 3),
        ("run:\n  name: 'unterminated\n", 3),
        ("run:\n  rank: 1\n bad_indent: 2\n", 3),
        ("run:\n  rank: 1\n---\nlogs: {}\n", 3),
        ("run:\n  name: \x07\n", 2),
    ],
)
def test_yaml_syntax_errors_carry_the_line(tmp_path: Path, text: str, line: int) -> None:
    err = error_of(tmp_path, text)
    assert err.line == line
    assert err.message.startswith("invalid YAML: ")


@pytest.mark.unit
def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: file not found") as info:
        load_config("/nonexistent/nope.yaml")
    assert info.value.file == "/nonexistent/nope.yaml"


@pytest.mark.unit
def test_directory_and_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    path = write(tmp_path, "run: {}\n")

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ConfigError, match="cannot read: Permission denied") as info:
        load_config(path)
    assert info.value.file == str(path)


@pytest.mark.unit
def test_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not valid UTF-8") as info:
        load_config(path)
    assert (info.value.file, info.value.line) == (str(path), 2)


# -- environment interpolation ------------------------------------------------------------


@pytest.mark.unit
def test_env_interpolation_types_the_result(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        run:
          name: ${JOB}-${STAGE:-pretrain}
          rank: ${RANK}
          world_size: ${WORLD:-}
        detectors:
          loss_spike:
            factor: ${SPIKE:-2.5}
          nan:
            enabled: ${NAN_ON:-false}
        logs:
          poll_interval: ${POLL:-2s}
          regex: 'literal $${NOT_A_VAR} and $$ and $HOME'
        """,
    )
    cfg = load_config(path, env={"JOB": "llm", "RANK": "7", "POLL": "", "STAGE": ""})
    assert cfg.run.name == "llm-pretrain"  # ':-' also covers set-but-empty, as in the shell
    assert cfg.run.rank == 7
    assert cfg.run.world_size is None  # empty default reads as null
    assert cfg.detectors.loss_spike.factor == 2.5
    assert cfg.detectors.nan.enabled is False
    assert cfg.logs.poll_interval == 2.0
    assert cfg.logs.regex == "literal ${NOT_A_VAR} and $$ and $HOME"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0x1F", 31),
        ("1_000", 1000),
        ("010", 8),  # YAML 1.1 octal, as PyYAML reads it
        ("+7", 7),
        ("a: b", "a: b"),  # would not stay one plain scalar: a string, not a mapping
        ("[1]", "[1]"),
        ("7 # c", "7 # c"),
    ],
)
def test_env_text_is_typed_as_yaml_types_it_in_place(tmp_path: Path, text: str, value: object) -> None:
    """Through PyYAML's public API (compose, serialize, safe_load): the forms YAML 1.1 has."""
    if isinstance(value, int):
        cfg = load_config(write(tmp_path, "detectors:\n  warmup_steps: ${W}\n"), env={"W": text})
        assert cfg.detectors.warmup_steps == value
        assert load_config(write(tmp_path, f"detectors:\n  warmup_steps: {text}\n"), env={}) == cfg
    else:
        cfg = load_config(write(tmp_path, "run:\n  name: ${N}\n"), env={"N": text})
        assert cfg.run.name == value


@pytest.mark.unit
def test_scalars_pyyaml_refuses_name_line_and_key(tmp_path: Path) -> None:
    err = error_of(tmp_path, "run:\n  rank: 0\ndetectors:\n  nan:\n    enabled: !!bool maybe\n")
    assert (err.line, err.key) == (5, "detectors.nan.enabled") and "invalid value 'maybe'" in err.message
    err = error_of(tmp_path, "logs:\n  sniff_lines: !!int many\n")
    assert (err.line, err.key) == (2, "logs.sniff_lines") and "invalid value 'many'" in err.message


@pytest.mark.unit
def test_env_value_is_validated_like_literal_text(tmp_path: Path) -> None:
    err = error_of(
        tmp_path, "run:\n  rank: 0\ndetectors:\n  warmup_steps: ${WARMUP}\n", env={"WARMUP": "many"}
    )
    assert (err.line, err.key) == (4, "detectors.warmup_steps")
    assert "expected an integer, got a string ('many')" in err.message


@pytest.mark.unit
def test_env_missing_variable_names_line_key_and_variable(tmp_path: Path) -> None:
    err = error_of(tmp_path, "run:\n  name: x\n  node: node-${NODE_ID}\n")
    assert (err.line, err.key) == (3, "run.node")
    assert "environment variable 'NODE_ID' is not set" in err.message


@pytest.mark.unit
@pytest.mark.parametrize(("value", "fragment"), [("a${B", "unterminated"), ("${1X}", "invalid environment")])
def test_env_bad_references(tmp_path: Path, value: str, fragment: str) -> None:
    err = error_of(tmp_path, f"run:\n  name: '{value}'\n")
    assert (err.line, err.key) == (2, "run.name")
    assert fragment in err.message


@pytest.mark.unit
def test_env_defaults_to_process_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RW_TEST_RANK", "5")
    assert load_config(write(tmp_path, "run:\n  rank: ${RW_TEST_RANK}\n")).run.rank == 5


# -- units ----------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("10min", 600.0),
        ("2 hours", 7200.0),
        ("1w", 604800.0),
        ("500us", 0.0005),
        ("45", 45.0),
        ("0.5", 0.5),
        ("1e-3", 0.001),
        (" 5S ", 5.0),
        (12, 12.0),
        (0.1, 0.1),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("-5s", "negative"),
        ("5 fortnights", "unknown unit 'fortnights'"),
        ("5m30", "has no unit"),
        ("s", "invalid duration"),
        ("1h-30m", "invalid duration"),
        (-1, "negative"),
        (float("inf"), "finite"),
        (True, "expected a duration"),
    ],
)
def test_parse_duration_rejects(text: str | float, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_duration(text)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512MiB", 512 * 2**20),
        ("1GiB", 2**30),
        ("10MB", 10_000_000),
        ("100KiB", 102_400),
        ("1kB", 1000),
        ("1G", 2**30),
        ("512m", 512 * 2**20),
        ("2Gi", 2 * 2**30),
        ("1.5KiB", 1536),
        ("64B", 64),
        ("4096", 4096),
        ("1_000", 1000),
        (" 3 MiB ", 3 * 2**20),
        (8192, 8192),
        (8192.0, 8192),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("-1MiB", "negative"),
        ("10 bananas", "unknown unit"),
        ("1.5B", "whole"),
        (2.5, "whole"),
        ("MiB", "invalid size"),
    ],
)
def test_parse_size_rejects(text: str | float, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_size(text)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "30s"),
        (600, "10m"),
        (5400, "1h30m"),
        (86400, "1d"),
        (0.25, "250ms"),
        (1.5, "1s500ms"),
        (0, "0s"),
        (90061, "1d1h1m1s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.unit
@pytest.mark.parametrize(
    ("size", "text"),
    [
        (2**20, "1MiB"),
        (512 * 2**20, "512MiB"),
        (10_000_000, "10MB"),
        (1000, "1kB"),
        (1536, "1536B"),
        (0, "0B"),
        (2**40, "1TiB"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.unit
@given(
    st.floats(min_value=0, max_value=1e9, allow_nan=False) | st.integers(0, 10**7).map(lambda ms: ms / 1000)
)
def test_format_duration_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.unit
@given(st.integers(min_value=0, max_value=2**62))
def test_format_size_round_trips(size: int) -> None:
    assert parse_size(format_size(size)) == size


# -- programmatic use -------------------------------------------------------------------------


@pytest.mark.unit
def test_config_from_dict() -> None:
    cfg = config_from_dict(
        {"logs": {"poll_interval": "2s", "format": "hf"}, "detectors": {"warmup_steps": 5}}
    )
    assert cfg.logs.poll_interval == 2.0 and cfg.logs.format == "hf" and cfg.detectors.warmup_steps == 5
    with pytest.raises(ConfigError) as info:
        config_from_dict({"detectors": {"loss_spike": {"factr": 3}}})
    assert (info.value.file, info.value.line, info.value.key) == (
        "<dict>",
        None,
        "detectors.loss_spike.factr",
    )
    assert str(info.value) == "<dict>: detectors.loss_spike.factr: unknown key (did you mean 'factor'?)"
    with pytest.raises(ConfigError, match="expected an integer, got a string"):
        config_from_dict({"detectors": {"warmup_steps": "10"}})  # no YAML guessing for Python values
    with pytest.raises(ConfigError, match="expected an integer, got a boolean"):
        config_from_dict({"detectors": {"warmup_steps": False}})


@pytest.mark.unit
def test_with_overrides() -> None:
    base = Config()
    cfg = with_overrides(
        base,
        {"detectors.warmup_steps": 10, "logs.poll_interval": "1s", "detectors.nan": {"lookback_steps": 3}},
    )
    assert cfg.detectors.warmup_steps == 10
    assert cfg.logs.poll_interval == 1.0
    assert cfg.detectors.nan.lookback_steps == 3 and cfg.detectors.nan.enabled is True  # merged
    assert base == Config()  # the input is not mutated
    with pytest.raises(ConfigError) as info:
        with_overrides(base, {"detectors.warmup_stepz": 10})
    assert info.value.key == "detectors.warmup_stepz" and "did you mean 'warmup_steps'?" in info.value.message
    with pytest.raises(ConfigError, match="expected an integer, got a boolean"):
        with_overrides(base, {"detectors.warmup_steps": True})
    with pytest.raises(ConfigError, match=r"expected an integer, got a number \(2\.5\)"):
        with_overrides(base, {"detectors.warmup_steps": 2.5})
    with pytest.raises(ConfigError, match=r"'detectors\.warmup_steps' is not a section"):
        with_overrides(base, {"detectors.warmup_steps.x": 1})
    with pytest.raises(ConfigError, match="did you mean 'detectors'"):
        with_overrides(base, {"detectorz.nan.enabled": False})


@pytest.mark.unit
def test_with_overrides_reads_text_like_a_file() -> None:
    cfg = with_overrides(
        Config(),
        {
            "detectors.warmup_steps": "50",
            "detectors.nan.enabled": "off",
            "detectors.loss_spike.factor": "3",
            "logs.max_line_bytes": "2MiB",
            "run.name": "007",
            "run.rank": "",
        },
    )
    assert cfg.detectors.warmup_steps == 50 and cfg.detectors.nan.enabled is False
    assert cfg.detectors.loss_spike.factor == 3.0 and cfg.logs.max_line_bytes == 2 * 2**20
    assert cfg.run.name == "007" and cfg.run.rank is None
    with pytest.raises(ConfigError) as info:
        with_overrides(Config(), {"detectors.warmup_steps": "fifty"})
    assert str(info.value) == (
        "<overrides>: detectors.warmup_steps: expected an integer, got a string ('fifty')"
    )
    kept = with_overrides(config_from_dict({"run": {"name": "null"}}), {"run.rank": "1"})
    assert kept.run.name == "null"  # values already in the config are not re-read as text


@pytest.mark.unit
def test_parse_override_reads_values_as_yaml() -> None:
    assert parse_override("detectors.warmup_steps=10") == ("detectors.warmup_steps", 10)
    assert parse_override("logs.poll_interval=2s") == ("logs.poll_interval", "2s")
    assert parse_override("run.name=") == ("run.name", None)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("detectors.warmup_steps")
    key, value = parse_override("detectors.nan.enabled=off")
    assert with_overrides(Config(), {key: value}).detectors.nan.enabled is False


@pytest.mark.unit
def test_set_text_is_a_yaml_flow_value_where_a_list_or_mapping_is_expected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--set alerts.webhook.urls='["http://..."]'``: a list key takes a YAML flow list, a
    mapping or section key a flow mapping; where a string is expected the text stays itself (a
    regex opening with ``[``, a Slack channel ``#train``); bad input names its key."""
    from rankwatch.cli import main

    cfg = with_overrides(
        Config(),
        {
            "alerts.webhook.urls": '["http://127.0.0.1:1/h", http://b/x]',
            "alerts.webhook.names": "{http://b/x: oncall}",
            "logs.regex": r"[0-9]+ step=(?P<step>\d+)",
            "alerts.slack.channel": "#train",
        },
    )
    assert list(cfg.alerts.webhook.urls) == ["http://127.0.0.1:1/h", "http://b/x"]
    assert cfg.alerts.webhook.names == {"http://b/x": "oncall"}
    assert cfg.logs.regex == r"[0-9]+ step=(?P<step>\d+)" and cfg.alerts.slack.channel == "#train"
    section = with_overrides(Config(), {"alerts.webhook": "{urls: [http://a/h]}"})
    assert list(section.alerts.webhook.urls) == ["http://a/h"]
    assert not with_overrides(Config(), {"alerts.webhook.urls": "[]"}).alerts.webhook.urls
    flow = "alerts.webhook.urls: expected a list as a YAML flow value such as [a, b]"
    bad = {
        "[http://a/h": f"{flow}: expected ','",
        "http://a/h": "alerts.webhook.urls: expected a list, got a string ('http://a/h'): write it as [a, b]",
        "{a: b}": "alerts.webhook.urls: expected a list, got a mapping",
        "[[x]]": "alerts.webhook.urls[0]: expected a string, got a list",
    }
    for text, said in bad.items():
        with pytest.raises(ConfigError) as info:
            with_overrides(Config(), {"alerts.webhook.urls": text})
        assert str(info.value).startswith("<overrides>: " + said), info.value
    assert main(["config", "show", "--set", "alerts.webhook.urls=[http://a/h"]) == 2
    err = capsys.readouterr().err
    assert "alerts.webhook.urls: expected a list as a YAML flow value such as [a, b]" in err
    assert "Traceback" not in err


# -- rendering --------------------------------------------------------------------------------


@pytest.mark.unit
def test_render_defaults_round_trip_and_docs(tmp_path: Path) -> None:
    text = render_config(Config())
    assert load_config(write(tmp_path, text), env={}) == Config()
    assert "  poll_interval: 250ms  # upper bound between two reads of a followed log (at least 10ms)\n" in (
        text
    )
    assert "  max_line_bytes: 1MiB  # " in text
    assert "# thresholds of every detector\ndetectors:\n" in text
    assert "  # loss spikes\n  loss_spike:\n    enabled: true  # " in text
    value_lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    leaves = [ln for ln in value_lines if not ln.endswith(":")]
    assert len(leaves) == len(config_keys())
    assert all(re.search(r"\S  # \S", ln) for ln in leaves)


@pytest.mark.unit
def test_render_round_trips_awkward_values(tmp_path: Path) -> None:
    awkward = {
        "run": {"name": "yes", "node": "${HOME} and $${X}", "rank": 3},
        "logs": {
            "regex": "(?P<step>\\d+): 'loss' # \"x\"\nnext",
            "encoding": "8859",  # latin-1, and it looks like a number
            "poll_interval": 0.1234567,
            "max_line_bytes": 1536,
            "format": "regex",
        },
        "detectors": {"grad_vanishing": {"threshold": 1e-9}, "loss_plateau": {"window": 0}},
    }
    cfg = config_from_dict(awkward)
    assert cfg.run.node == "${HOME} and $${X}"
    again = load_config(write(tmp_path, render_config(cfg)), env={"HOME": "/root"})
    assert again == cfg


@pytest.mark.unit
def test_config_keys() -> None:
    keys = config_keys()
    assert keys[:2] == ["run.name", "run.rank"]
    assert "detectors.loss_spike.factor" in keys and "logs.max_line_bytes" in keys
    assert "detectors.nan" not in keys
    assert len(keys) == len(set(keys))
    for key in keys:  # every key is settable by its dotted name
        section, _, leaf = key.rpartition(".")
        obj = Config()
        for part in section.split("."):
            obj = getattr(obj, part)
        value = getattr(obj, leaf)
        assert with_overrides(Config(), {key: value}) == Config()


# -- generic schema (the lead adds sections later) ----------------------------------------------


@dataclass
class SinkConf:
    kind: Literal["slack", "webhook"] = field(metadata={"doc": "where to send"})
    url: str = field(default="", metadata={"doc": "endpoint"})
    timeout: Duration = field(default=Duration(5.0), metadata={"doc": "per request"})


@dataclass
class TlsConf:
    cert: Path = field(default=Path("/etc/cert.pem"), metadata={"doc": "certificate"})


@dataclass
class Extended:
    sinks: list[SinkConf] = field(default_factory=list, metadata={"doc": "alert sinks"})
    labels: dict[str, str] = field(default_factory=dict, metadata={"doc": "extra labels"})
    ranks: list[int] = field(default_factory=list, metadata={"doc": "ranks to watch"})
    intervals: list[Duration] = field(default_factory=list, metadata={"doc": "backoff"})
    tls: TlsConf | None = field(default=None, metadata={"doc": "optional TLS"})
    quota: Size | None = field(default=None, metadata={"doc": "disk quota"})
    mode: Literal["fast", "safe"] | None = field(default=None, metadata={"doc": "mode"})


def load_extended(text: str) -> Extended:
    return loader._build(loader._parse_yaml(textwrap.dedent(text), "ext.yaml"), Extended, "ext.yaml", {})


@pytest.mark.unit
def test_generic_schema_lists_dicts_and_optional_sections() -> None:
    cfg = load_extended(
        """
        sinks:
          - kind: slack
            url: https://hooks.example/x
          - {kind: webhook, timeout: 30s}
        labels: {team: ml, "zone": 1}
        ranks: [0, 1, 7]
        intervals: [1s, 2m]
        tls:
          cert: /tmp/c.pem
        quota: 10GiB
        """
    )
    assert cfg.sinks == [
        SinkConf("slack", "https://hooks.example/x"),
        SinkConf("webhook", timeout=Duration(30.0)),
    ]
    assert cfg.labels == {"team": "ml", "zone": "1"}
    assert cfg.ranks == [0, 1, 7] and cfg.intervals == [1.0, 120.0]
    assert cfg.tls == TlsConf(Path("/tmp/c.pem")) and cfg.quota == 10 * 2**30 and cfg.mode is None
    assert load_extended(render_config(cfg)) == cfg  # type: ignore[arg-type]
    assert load_extended(render_config(Extended())) == Extended()  # type: ignore[arg-type]
    with_doc = render_config(Extended(sinks=[SinkConf("slack")]))  # type: ignore[arg-type]
    assert "sinks:  # alert sinks\n  - kind: slack  # where to send\n    url: ''  # endpoint\n" in with_doc


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "line", "key", "fragment"),
    [
        ("sinks:\n  - kind: slack\n  - url: x\n", 3, "sinks[1].kind", "missing required key"),
        (
            "sinks:\n  - kind: slack\n  - kind: email\n",
            3,
            "sinks[1].kind",
            "must be one of 'slack', 'webhook'",
        ),
        ("sinks:\n  - kind: slack\n    timeout: forever\n", 3, "sinks[0].timeout", "invalid duration"),
        ("sinks: {kind: slack}\n", 1, "sinks", "expected a list"),
        ("ranks: [0, true]\n", 1, "ranks[1]", "expected an integer"),
        ("labels: [a]\n", 1, "labels", "expected a mapping"),
        ("labels:\n  a: x\n  a: y\n", 3, "labels.a", "duplicate key"),
        ("labels:\n  team: [x]\n", 2, "labels.team", "expected a string"),
        ("tls:\n  crt: x\n", 2, "tls.crt", "did you mean 'cert'?"),
        ("mode: quick\n", 1, "mode", "must be one of 'fast', 'safe'"),
    ],
)
def test_generic_schema_errors(text: str, line: int, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_extended(text)
    assert (info.value.line, info.value.key) == (line, key)
    assert fragment in info.value.message


@pytest.mark.unit
def test_generic_schema_null_optional_section() -> None:
    assert load_extended("tls: null\nmode: ~\nquota:\n") == Extended()
    assert load_extended("tls:\n").tls is None


# -- robustness -------------------------------------------------------------------------------------

# fmt: off
_TOKENS = [
    *{part for key in config_keys() for part in key.split(".")},
    "run", "logs", "detectors", ":", ": ", "\n", "\n  ", "\n    ", "- ", "[", "]", "{", "}", ",", "&a ", "*a",
    "<<: ", "!!int ", "!!bool ", "!x ", "'", '"', "#", "|", ">", "~", "null", "yes", "1e5", "10m", "5MiB",
    "${X}", "${Y:-3}", "$${", "${", "-1", ".nan", "\t", "?", "%", "@", "`", "\x00", "\ufeff", "é", "---\n",
]
# fmt: on


@pytest.mark.unit
@settings(
    max_examples=fuzz_examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(pieces=st.lists(st.sampled_from(_TOKENS) | st.text(max_size=4), max_size=40))
def test_arbitrary_yamlish_text_raises_only_config_error(tmp_path: Path, pieces: list[str]) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes("".join(pieces).encode("utf-8", "surrogatepass"))
    try:
        cfg = load_config(path, env={"X": "1"})
    except ConfigError as e:
        assert str(e).startswith(str(path))
    else:
        assert isinstance(cfg, Config)
        assert dataclasses.is_dataclass(cfg)


@pytest.mark.unit
def test_config_error_str_without_location() -> None:
    assert str(ConfigError("boom")) == "boom"
    assert str(ConfigError("boom", line=3)) == "line 3: boom"
    assert str(ConfigError("boom", file="a.yaml", key="x.y")) == "a.yaml: x.y: boom"


@pytest.mark.unit
def test_literal_secrets_warned_and_config_show_redacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from rankwatch.cli import main

    f = tmp_path / "rw.yaml"
    f.write_text(
        "alerts:\n"
        "  slack: {token: xoxb-literal-secret, channel: C1}\n"
        "  webhook: {urls: ['http://127.0.0.1:1/hook'], headers: {Authorization: Bearer hook-secret}}\n"
        "server:\n"
        "  token: ${RW_TEST_TOKEN}\n"
    )
    caplog.set_level("WARNING", logger="rankwatch.config")
    env = {"RW_TEST_TOKEN": "env-secret"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert main(["config", "show", "--config", str(f)]) == 0
    out = capsys.readouterr().out
    assert "xoxb-literal-secret" not in out and "hook-secret" not in out and "env-secret" not in out
    assert out.count("<redacted>") == 1  # the header
    assert "token: ${SLACK_BOT_TOKEN}" in out and "token: ${RANKWATCH_TOKEN}" in out
    copied = tmp_path / "copied.yaml"  # what a user pastes into a new file loads back from the env
    copied.write_text(out)
    again = load_config(copied, env={"SLACK_BOT_TOKEN": "xoxb-from-env", "RANKWATCH_TOKEN": "t"})
    assert again.alerts.slack.token == "xoxb-from-env" and again.server.token == "t"
    warned = [r.getMessage() for r in caplog.records]
    want = f"{f}:2: alerts.slack.token holds a literal secret; write ${{SLACK_BOT_TOKEN}}"
    assert any(want in m for m in warned), warned
    assert not any("server.token" in m for m in warned)  # from the environment: fine


# -- intervals that would spin a core, sink settings, credentials (issue 16 items 5, 11) ----


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("logs:\n  poll_interval: 0s\n", "logs.poll_interval", 2),
        ("process:\n  sample_interval: 0s\n", "process.sample_interval", 2),
        ("gpu: {interval: 1ms}\n", "gpu.interval", 1),
        ("checkpoints:\n  dir: /x\n  poll_interval: 0\n", "checkpoints.poll_interval", 3),
        ("reload: {interval: 1ms}\n", "reload.interval", 1),
        ("dumps: {join_peers: 1ms}\n", "dumps.join_peers", 1),
        ("server: {max_connections: 0}\n", "server.max_connections", 1),
        ("server: {idle_timeout: 0s}\n", "server.idle_timeout", 1),
    ],
)
def test_spinning_or_zero_settings_are_rejected_naming_the_key(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    err = error_of(tmp_path, text)
    assert err.key == key and err.line == line
    assert "must be at least" in err.message


@pytest.mark.unit
def test_interval_minimum_names_the_reason_and_zero_means_off_where_documented(tmp_path: Path) -> None:
    err = error_of(tmp_path, "logs: {poll_interval: 0s}\n")
    assert "CPU core" in err.message and "10ms" in err.message
    cfg = load_config(write(tmp_path, "reload: {interval: 0s}\ndumps: {join_peers: 0s}\n"), env={})
    assert cfg.reload.interval == 0 and cfg.dumps.join_peers == 0
    with pytest.raises(ConfigError) as info:
        with_overrides(Config(), {"process.sample_interval": "0s"})
    assert info.value.key == "process.sample_interval"


@pytest.mark.unit
def test_webhook_userinfo_with_authorization_header_is_rejected(tmp_path: Path) -> None:
    text = """
        alerts:
          webhook:
            urls:
              - https://ok.example/hook
              - https://bob:pw@hooks.example/x
            headers: {Authorization: "Bearer ${HOOK_TOKEN}"}
        """
    err = error_of(tmp_path, text, env={"HOOK_TOKEN": "t"})
    assert err.key == "alerts.webhook.urls[1]" and err.line == 5
    assert "Authorization" in err.message and "pw" not in err.message
    # either one alone is fine
    ok = "alerts:\n  webhook:\n    urls: [https://bob:pw@hooks.example/x]\n"
    assert load_config(write(tmp_path, ok), env={}).alerts.webhook.urls
    ok = 'alerts:\n  webhook:\n    urls: [https://hooks.example/x]\n    headers: {Authorization: "x"}\n'
    assert load_config(write(tmp_path, ok), env={}).alerts.webhook.headers


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("alerts: {webhook: {urls: [hooks.example/x]}}\n", "alerts.webhook.urls[0]"),
        ("alerts: {alertmanager: {urls: ['ftp://am:9093']}}\n", "alerts.alertmanager.urls[0]"),
        ("alerts: {slack: {webhook_url: 'http://[::1'}}\n", "alerts.slack.webhook_url"),
    ],
)
def test_sink_urls_are_validated(tmp_path: Path, text: str, key: str) -> None:
    assert error_of(tmp_path, text).key == key


@pytest.mark.unit
def test_literal_secret_in_webhook_headers_or_url_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = """
        alerts:
          webhook:
            urls: ["https://hooks.example/x?sig=abc123"]
            headers: {Authorization: "Bearer s3cr3t-literal", X-Team: ml}
        """
    with caplog.at_level("WARNING", logger="rankwatch.config"):
        load_config(write(tmp_path, text), env={})
    msgs = [r.getMessage() for r in caplog.records]
    assert any(
        "alerts.webhook.headers.Authorization holds a literal secret" in m and ":4:" in m for m in msgs
    )
    assert any("alerts.webhook.urls[0] holds a credential" in m for m in msgs)
    assert not any("X-Team" in m for m in msgs)
    assert not any("s3cr3t" in m or "abc123" in m for m in msgs)
    caplog.clear()
    text = 'alerts:\n  webhook:\n    headers: {Authorization: "Bearer ${HOOK_TOKEN}"}\n'
    with caplog.at_level("WARNING", logger="rankwatch.config"):
        load_config(write(tmp_path, text), env={"HOOK_TOKEN": "x"})
    assert not caplog.records


@pytest.mark.unit
def test_config_show_redacts_every_credential(tmp_path: Path) -> None:
    secrets = [
        "t0psecret-abc",
        "glsa_ABCDEF123456",
        "XXXXsecretXXXX",
        "pw123456",
        "deadbeef",
        "k123",
        "abcdefABCDEF0123456789xyz",
        "hook-secret-42",
        "xoxb-1-2-3",
    ]
    text = """
        server: {token: "${RANKWATCH_TOKEN:-t0psecret-abc}", metrics_token: m3trics-secret}
        alerts:
          grafana_url: "https://grafana.example/d/rw?var-run={run}&auth_token=glsa_ABCDEF123456"
          slack: {webhook_url: "https://hooks.slack.com/services/T000/B000/XXXXsecretXXXX", token: xoxb-1-2-3}
          alertmanager: {urls: ["https://admin:pw123456@am.example:9093/?sig=deadbeef"]}
          webhook:
            urls: ["https://hooks.example/rw/abcdefABCDEF0123456789xyz?key=k123&team=ml"]
            names: {"https://hooks.example/rw/abcdefABCDEF0123456789xyz?key=k123&team=ml": hook}
            headers: {Authorization: "Bearer ${HOOK_TOKEN:-hook-secret-42}"}
        """
    shown = render_config(load_config(write(tmp_path, text), env={}))
    for s in [*secrets, "m3trics-secret"]:
        assert s not in shown, s
    assert "https://<redacted>@am.example:9093/?sig=<redacted>" in shown
    assert "team=ml" in shown and "var-run={run}" in shown and "hooks.example" in shown


@pytest.mark.unit
@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("https://u:p@am:9093/x", "https://<redacted>@am:9093/x"),
        ("https://h/x?token=a&b=c", "https://h/x?token=<redacted>&b=c"),
        ("https://hooks.slack.com/services/T1/B2/abc", "https://hooks.slack.com/services/<redacted>"),
        ("https://discord.com/api/webhooks/1/tok", "https://discord.com/api/webhooks/<redacted>"),
        ("http://am:9093", "http://am:9093"),
        ("https://grafana/d/rankwatch-run?var-run={run}", "https://grafana/d/rankwatch-run?var-run={run}"),
    ],
)
def test_redact_url(url: str, want: str) -> None:
    from rankwatch.config.redact import redact_url

    assert redact_url(url) == want


@pytest.mark.unit
def test_redacting_log_filter(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from rankwatch.config.redact import RedactingFilter

    record = logging.LogRecord(
        "x",
        logging.ERROR,
        __file__,
        1,
        "delivery to %s failed: %s",
        ("https://u:pw@h/x?key=zz", "s3cr3tv4lue"),
        None,
    )
    assert RedactingFilter(["s3cr3tv4lue"]).filter(record)
    msg = record.getMessage()
    assert "pw" not in msg and "zz" not in msg and "s3cr3tv4lue" not in msg and "h/x" in msg


@pytest.mark.process
def test_cli_config_check_and_show(tmp_path: Path) -> None:
    """The real CLI: `config check` exits 2 naming the key; `config show` prints no credential."""
    import os
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH_")}
        return subprocess.run(
            [sys.executable, "-m", "rankwatch", *args], capture_output=True, text=True, timeout=60, env=env
        )

    bad = write(tmp_path, "logs:\n  poll_interval: 0s\n", "bad.yaml")
    out = cli("config", "check", str(bad))
    assert out.returncode == 2 and f"{bad}:2: logs.poll_interval: must be at least 10ms" in out.stderr
    both = write(
        tmp_path,
        'alerts:\n  webhook:\n    urls: ["https://u:pw0rd-x@h.example/x"]\n'
        "    headers: {Authorization: lit3ral-s3cret}\n",
        "both.yaml",
    )
    out = cli("config", "check", str(both))
    assert out.returncode == 2 and "alerts.webhook.urls[0]" in out.stderr
    assert "pw0rd-x" not in out.stderr and "lit3ral-s3cret" not in out.stderr
    assert "alerts.webhook.headers.Authorization holds a literal secret" in out.stderr
    shown = write(
        tmp_path,
        'alerts:\n  webhook:\n    urls: ["https://u:pw0rd-x@h.example/x?sig=s1gn4ture"]\n'
        "    headers: {X-Api-Key: lit3ral-s3cret}\nserver: {token: t0k3n-literal}\n",
        "show.yaml",
    )
    out = cli("config", "show", "-c", str(shown))
    assert out.returncode == 0, out.stderr
    for secret in ("pw0rd-x", "s1gn4ture", "lit3ral-s3cret", "t0k3n-literal"):
        assert secret not in out.stdout and secret not in out.stderr, secret


@pytest.mark.unit
def test_dumps_native_with_nonblocking_is_refused_as_py_spy_refuses_it() -> None:
    with pytest.raises(ConfigError) as e:
        config_from_yaml("dumps:\n  native: true\n  nonblocking: true\n", source="rw.yaml")
    msg = str(e.value)
    assert "rw.yaml" in msg and "dumps" in msg and "--nonblocking" in msg, msg
    assert config_from_yaml("dumps: {native: true}\n").dumps.native


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("logs: {format: regex}\n", "logs.format", "needs a pattern (logs.regex)"),
        ('logs: {format: regex, regex: "(?P<step>\\\\d+"}\n', "logs.regex", "does not compile"),
        ('logs: {format: regex, regex: "step (\\\\d+)"}\n', "logs.regex", "no named group"),
        ('checkpoints: {step_regex: "(step"}\n', "checkpoints.step_regex", "does not compile"),
        ('alerts: {slack: {token: "${T:-xoxb-1}"}}\n', "alerts.slack.token", "channel_not_specified"),
        ("gpu: {xid_wait: 2s, call_timeout: 2s}\n", "gpu.xid_wait", "every sample would time out"),
        ("run: {rank: 4, world_size: 4}\n", "run.rank", "outside a world of 4"),
        ("run: {world_size: 0}\n", "run.world_size", "1 or more"),
        ("run: {local_rank: -1}\n", "run.local_rank", "0 or more"),
        ("gpu: {leak_long_window: 5m}\n", "gpu.leak_long_window", "could never fire"),
        ("detectors: {host_memory: {window: 5m}}\n", "detectors.host_memory.window", "could never fire"),
    ],
)
def test_combinations_a_dependency_refuses_are_refused_naming_file_and_key(
    text: str, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_yaml(text, source="rw.yaml", env={})
    msg = str(e.value)
    assert "rw.yaml:1" in msg and key in msg and words in msg, msg


@pytest.mark.unit
@pytest.mark.parametrize(
    "text",
    [
        'logs: {format: regex, regex: "step (?P<step>\\\\d+)"}\n',
        'logs: {regex: "unused unless format is regex ("}\n',
        'alerts: {slack: {channel: "#ops", webhook_url: "https://hooks.example/x"}}\n',
        'alerts: {slack: {token: "${T:-xoxb-1}", channel: "#ops"}}\n',
        "gpu: {xid_wait: 1s, call_timeout: 2s, leak_long_window: 0s}\n",
        "gpu: {leak_long_window: 7m}\ndetectors: {host_memory: {window: 7m}}\n",
        "run: {rank: 3, local_rank: 3, world_size: 4}\n",
        "run: {rank: 9}\n",
        "detectors: {host_memory: {window: 5m, resolution: 30s}}\n",
    ],
)
def test_the_neighbouring_combinations_still_load(text: str) -> None:
    config_from_yaml(text, env={})


@pytest.mark.unit
def test_the_slack_pairs_refused_are_the_ones_the_sink_would_drop() -> None:
    """The refused pair is one the Slack sink builder turns into no sink at all; a channel whose
    token is not in this environment loads (the agent's node has it) and is dropped with a word."""
    from rankwatch.actions.alerts.slack import slack_sinks

    assert slack_sinks(AlertsConfig(slack=SlackConfig(token="xoxb-1"))) == []
    assert config_from_yaml('alerts: {slack: {channel: "#ops", token: "${SLACK_BOT_TOKEN:-}"}}\n', env={})
    assert slack_sinks(AlertsConfig(slack=SlackConfig(channel="#ops"))) == []


@pytest.mark.unit
def test_climb_points_is_what_the_trend_rule_needs() -> None:
    """The window check and the rule agree: one point fewer than CLIMB_POINTS is no climb."""
    from rankwatch.config.schema import CLIMB_POINTS
    from rankwatch.detectors.trend import CLIMB_SEGMENTS, FloorHistory, sustained_climb

    assert CLIMB_POINTS == 2 * CLIMB_SEGMENTS
    for span, fires in ((CLIMB_POINTS - 2, False), (CLIMB_POINTS - 1, True)):
        h = FloorHistory(60.0, 60.0 * span)
        for i in range(40 * span):
            h.add(i * 5.0, float(i) * 1e6)
        assert (sustained_climb(h.points, min_growth=1.0) is not None) is fires


@pytest.mark.unit
@pytest.mark.parametrize(
    ("server", "says"),
    [
        ('{listen: "::1:9478"}', "server.listen: listen '::1:9478': an IPv6 address needs brackets"),
        ('{listen: "host-without-port"}', "server.listen: listen 'host-without-port': expected host:port"),
        ("{web_config: WEB, metrics_token: '${T:-m3trics}'}", "server.web_config: WEB: basic_auth_users and"),
        ("{web_config: NONE}", "server.web_config: NONE"),
    ],
)
def test_config_check_refuses_what_the_server_refuses_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], server: str, says: str
) -> None:
    """The address and the web config file are checked as the server's start checks them."""
    import argparse

    import bcrypt

    from rankwatch.cli import cmd_config_check

    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    web.write_text(f'basic_auth_users: {{prometheus: "{hashed}"}}\n')
    none = tmp_path / "absent.yml"
    server = server.replace("WEB", str(web)).replace("NONE", str(none))
    path = write(tmp_path, f"server: {server}\n")
    with pytest.raises(ConfigError) as e:
        cmd_config_check(argparse.Namespace(file=str(path)))
    assert str(e.value).startswith(f"{path}: " + says.replace("WEB", str(web)).replace("NONE", str(none))), (
        e.value
    )
    off = write(tmp_path, "server: {enabled: false, listen: nope}\n", "off.yaml")
    assert cmd_config_check(argparse.Namespace(file=str(off))) == 0
    assert capsys.readouterr().out == f"{off}: ok\n"
