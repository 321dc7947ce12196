#!/usr/bin/env python3
"""Writes the JSON schema of the chart's ``agent.config`` from the agent's own config schema.

One source of truth: ``agent/rankwatch/config/schema.py`` names every key, its type and its
one-line doc; this turns it into ``properties.agent.properties.config`` of
``helm/rankwatch/values.schema.json``, so a key the agent would reject (``stall.startup_grase``)
fails ``helm lint`` and ``helm install`` instead of crash-looping the sidecar. Every other part
of values.schema.json is written by hand and left as it is.

    python helm/gen_values_schema.py          # rewrite values.schema.json
    python helm/gen_values_schema.py --check  # exit 1 if it is stale (tests/test_deploy_kubernetes.py)

Any scalar may be a ``${VAR}`` reference (the agent reads the environment); secrets must be one,
since the chart puts ``agent.config`` in a ConfigMap.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "helm" / "rankwatch" / "values.schema.json"
sys.path.insert(0, str(ROOT / "agent"))

from rankwatch.config.loader import credentials, is_section, section_fields, union_args  # noqa: E402
from rankwatch.config.schema import Config, Duration, Size  # noqa: E402
from rankwatch.config.units import _DURATION_UNITS, _SIZE_UNITS  # noqa: E402

# A ${VAR} or ${VAR:-default} reference somewhere in a string (the loader substitutes it).
ENV_REF = r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}"
_ENV = {"type": "string", "pattern": ENV_REF}
_NUMBER = r"([0-9][0-9_]*(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?"


def _units(units: typing.Iterable[str]) -> str:
    return "|".join(sorted((u for u in units if u), key=lambda u: (-len(u), u)))


DURATION_PATTERN = rf"(?i)^\s*([+]?{_NUMBER}|(\s*{_NUMBER}\s*({_units(_DURATION_UNITS)})\s*)+)\s*$"
SIZE_PATTERN = rf"(?i)^\s*{_NUMBER}\s*({_units(_SIZE_UNITS)})?\s*$"


def _or_env(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, _ENV]}


def _type(hint: Any, path: str) -> dict[str, Any]:
    secrets = credentials().secrets
    if path in secrets:
        return {
            "anyOf": [
                {
                    "type": "string",
                    "pattern": ENV_REF,
                    "description": f"a secret: write ${{{secrets[path]}}} and give the variable "
                    "from a Secret (agent.config is a ConfigMap)",
                },
                {"type": "null"},
            ]
        }
    if hint is Duration:
        return {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": DURATION_PATTERN},
                _ENV,
            ]
        }
    if hint is Size:
        return {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": SIZE_PATTERN},
                _ENV,
            ]
        }
    args = union_args(hint)
    if args is not None:
        arms = [_type(a, path) for a in args if a is not type(None)]
        if type(None) in args:
            arms.append({"type": "null"})
        return arms[0] if len(arms) == 1 else {"anyOf": arms}
    origin = typing.get_origin(hint)
    if origin is Literal:
        return _or_env({"enum": list(typing.get_args(hint))})
    if is_section(hint):
        return _section(hint, path)
    if origin is list or (origin is tuple and typing.get_args(hint)[1:] == (Ellipsis,)):
        item = typing.get_args(hint)[0]  # list[X] or tuple[X, ...]: a YAML sequence either way
        return {"type": ["array", "null"], "items": _type(item, f"{path}[]")}
    if origin is dict:
        _, value = typing.get_args(hint)
        return {"type": ["object", "null"], "additionalProperties": _type(value, f"{path}.*")}
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return _or_env({"type": "boolean"})
    if hint is int:
        return _or_env({"type": "integer"})
    if hint is float:
        # YAML 1.1 reads 1e-6 as a string; the agent takes it as the number it means.
        return {"anyOf": [{"type": "number"}, {"type": "string", "pattern": rf"^[-+]?{_NUMBER}$"}, _ENV]}
    raise TypeError(f"{path}: no JSON schema for {hint!r}")


MINIMUMS_FILE = ROOT / "helm" / "rankwatch" / "files" / "config-minimums.json"
_MINIMUMS: list[dict[str, Any]] = []


def _kind(hint: Any) -> str:
    args = union_args(hint)
    if args is not None:
        hint = next(a for a in args if a is not type(None))
    return "duration" if hint is Duration else "size" if hint is Size else "number"


def _shown(value: float, kind: str) -> str:
    if kind == "duration":
        return f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"
    return f"{value:g} bytes" if kind == "size" else f"{value:g}"


def _with_min(schema: dict[str, Any], low: float, zero_off: bool) -> dict[str, Any]:
    """The number arms of ``schema`` with the agent's minimum (strings: the chart's template
    check, files/config-minimums.json, since JSON schema cannot compare durations)."""
    if schema.get("type") in ("number", "integer") and "minimum" in schema:
        bounded = {**schema, "minimum": low}
        return {"anyOf": [{"const": 0}, bounded]} if zero_off else bounded
    if "anyOf" in schema:
        return {**schema, "anyOf": [_with_min(a, low, zero_off) for a in schema["anyOf"]]}
    return schema


def _section(cls: type, path: str) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for f, hint in section_fields(cls):
        child = f"{path}.{f.name}" if path else f.name
        schema = _type(hint, child)
        if f.metadata.get("min") is not None:
            low, zero_off, kind = float(f.metadata["min"]), bool(f.metadata.get("zero_off")), _kind(hint)
            schema = _with_min(schema, low, zero_off)
            entry = {"path": child.split("."), "min": low, "zero_off": zero_off, "kind": kind}
            _MINIMUMS.append({**entry, "shown": _shown(low, kind)})
        doc = f.metadata.get("doc")
        if doc and "description" not in schema:
            schema = {"description": doc, **schema}
        props[f.name] = schema
    return {"type": ["object", "null"], "additionalProperties": False, "properties": props}


def config_schema() -> dict[str, Any]:
    schema = _section(Config, "")
    schema["type"] = "object"
    return {
        "description": "rankwatch configuration merged over the chart's (rankwatch config show); generated "
        "from the agent's config schema by helm/gen_values_schema.py",
        **schema,
    }


def render() -> str:
    doc = json.loads(SCHEMA_FILE.read_text())
    _MINIMUMS.clear()
    doc["properties"]["agent"]["properties"]["config"] = config_schema()
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_minimums() -> str:
    """The agent's minimums for the chart's template check (``rankwatch.checkMinimums``)."""
    units = {
        "duration": {u.lower(): v for u, v in _DURATION_UNITS.items()} | {"": 1.0},
        "size": {u.lower(): float(v) for u, v in _SIZE_UNITS.items()},
        "number": {"": 1.0},
    }
    keys = sorted(_MINIMUMS, key=lambda m: m["path"])
    return json.dumps({"keys": keys, "units": units}, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    minimums = render_minimums()
    if "--check" in argv:
        for path, want in ((SCHEMA_FILE, text), (MINIMUMS_FILE, minimums)):
            if not path.exists() or path.read_text() != want:
                print(f"{path} is stale: run python helm/gen_values_schema.py", file=sys.stderr)
                return 1
        return 0
    SCHEMA_FILE.write_text(text)
    MINIMUMS_FILE.write_text(minimums)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
