"""Print the effective configuration as commented YAML (``rankwatch config show``).

The output is meant to be copied into a config file and edited, so it must load back
to the same values: strings are quoted whenever YAML would read them otherwise, and
``${`` is escaped as ``$${`` so that nothing is interpolated on the way back. Secrets are
the exception: they print as the ``${VAR}`` to take them from (webhook headers as
``<redacted>``, credentials inside URLs as ``<redacted>``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import typing
from typing import Any

import yaml

from .loader import is_section, section_fields, strip_optional
from .schema import Config, Duration, Size
from .units import format_duration, format_size

__all__ = ["config_keys", "render_config"]

_FLOW_UNSAFE = set(",[]{}:#")


def _doc(f: dataclasses.Field[Any]) -> str:
    return " ".join(str(f.metadata.get("doc", "")).split())


def _comment(doc: str) -> str:
    return f"  # {doc}" if doc else ""


class EnvRef(str):
    """A value printed as the ``${VAR}`` it should come from (a redacted secret): not escaped."""

    __slots__ = ()


def _string(text: str, in_flow: bool) -> str:
    text = str(text) if isinstance(text, EnvRef) else text.replace("${", "$${")
    out = yaml.safe_dump(text, allow_unicode=True, width=float("inf")).removesuffix("\n...\n").rstrip("\n")
    plain = not out.startswith(("'", '"'))
    if "\n" in out or (in_flow and plain and _FLOW_UNSAFE & set(out)):
        out = yaml.safe_dump(text, allow_unicode=True, width=float("inf"), default_style='"').rstrip("\n")
    return out


def _inline(value: Any, hint: Any, in_flow: bool = False) -> str:
    """One-line YAML for a non-section value, typed by its schema hint."""
    hint = strip_optional(hint)
    if value is None:
        return "null"
    if hint is Duration:
        return format_duration(value)
    if hint is Size:
        return format_size(value)
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return yaml.safe_dump(value).removesuffix("\n...\n").rstrip("\n")
    if isinstance(value, EnvRef):
        return _string(value, in_flow)
    if isinstance(value, (str, os.PathLike)):
        return _string(os.fspath(value), in_flow)
    args = typing.get_args(hint)
    if isinstance(value, dict):
        key_hint, value_hint = args if len(args) == 2 else (Any, Any)
        items = (f"{_inline(k, key_hint, True)}: {_inline(v, value_hint, True)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        item_hint = args[0] if args else Any
        return "[" + ", ".join(_inline(v, item_hint, True) for v in value) + "]"
    raise TypeError(f"cannot render config value {value!r}")


def _is_block(value: Any) -> bool:
    if dataclasses.is_dataclass(value):
        return True
    if isinstance(value, dict):
        return any(_is_block(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_is_block(v) for v in value)
    return False


def _section_lines(obj: Any, indent: str) -> list[str]:
    cls: type = type(obj)
    fields = section_fields(cls)
    lines: list[str] = []
    for i, (f, hint) in enumerate(fields):
        value = getattr(obj, f.name)
        doc = _doc(f)
        if dataclasses.is_dataclass(value):
            if i and not indent:
                lines.append("")
            if doc:
                lines.append(f"{indent}# {doc}")
            body = _section_lines(value, indent + "  ")
            lines.extend([f"{indent}{f.name}:", *body] if body else [f"{indent}{f.name}: {{}}"])
        elif _is_block(value):
            lines.append(f"{indent}{f.name}:{_comment(doc)}")
            lines.extend(_block_lines(value, hint, indent + "  "))
        else:
            lines.append(f"{indent}{f.name}: {_inline(value, hint)}{_comment(doc)}")
    return lines


def _block_lines(value: Any, hint: Any, indent: str) -> list[str]:
    """A list or mapping holding sections, as block YAML."""
    args = typing.get_args(strip_optional(hint))
    if isinstance(value, dict):
        value_hint = args[1] if len(args) == 2 else Any
        lines = []
        for key, item in value.items():
            head = f"{indent}{_inline(key, args[0] if args else Any, True)}:"
            lines.extend(_entry_lines(head, item, value_hint, indent + "  "))
        return lines
    item_hint = args[0] if args else Any
    lines = []
    for item in value:
        body = _entry_lines("", item, item_hint, indent + "  ")
        if body[0].lstrip().startswith("#"):
            lines.extend([f"{indent}-", *body])
        else:
            lines.extend([f"{indent}- {body[0].lstrip()}", *body[1:]])
    return lines


def _entry_lines(head: str, item: Any, hint: Any, indent: str) -> list[str]:
    if dataclasses.is_dataclass(item):
        body = _section_lines(item, indent)
        if not body:
            return [f"{head} {{}}" if head else f"{indent}{{}}"]
        return [head, *body] if head else body
    if _is_block(item):
        return ([head] if head else []) + _block_lines(item, hint, indent)
    text = _inline(item, hint)
    return [f"{head} {text}"] if head else [f"{indent}{text}"]


REDACTED = "<redacted>"


def redacted(cfg: Config) -> Config:
    """A copy with credentials replaced: `config show` output gets pasted into tickets, and
    copied into config files: a token becomes the ``${VAR}`` it should come from (so the copy
    loads back, from the environment), header values ``<redacted>``, and URLs keep their host
    but lose their userinfo, secret query values and key-like path segments."""
    from rankwatch.config.loader import credentials
    from rankwatch.config.redact import redact_url
    from rankwatch.config.settings import dotted_value
    from rankwatch.config.snapshot import replaced

    known = credentials()
    changes: dict[str, Any] = {}
    for dotted, var in known.secrets.items():
        if dotted_value(cfg, dotted):
            changes[dotted] = EnvRef(f"${{{var}}}")
    for dotted in known.headers:
        headers = dotted_value(cfg, dotted)
        if isinstance(headers, dict):
            changes[dotted] = dict.fromkeys(headers, REDACTED)
    for dotted in known.urls:
        value = dotted_value(cfg, dotted)
        if isinstance(value, str) and value:
            changes[dotted] = redact_url(value)
        elif isinstance(value, dict):
            changes[dotted] = {redact_url(u): v for u, v in value.items()}
        elif isinstance(value, (tuple, list)):
            changes[dotted] = type(value)(redact_url(u) for u in value)
    return replaced(cfg, changes)


def render_config(cfg: Config, *, redact: bool = True) -> str:
    """The effective configuration as YAML with every key and its doc as a comment."""
    if redact:
        cfg = redacted(cfg)
    return "\n".join(_section_lines(cfg, "")) + "\n"


def config_keys(cls: type = Config) -> list[str]:
    """Every leaf key of the schema in dotted form, in schema order."""
    keys: list[str] = []
    for f, hint in section_fields(cls):
        inner = strip_optional(hint)
        if is_section(inner):
            keys.extend(f"{f.name}.{k}" for k in config_keys(inner))
        else:
            keys.append(f.name)
    return keys
