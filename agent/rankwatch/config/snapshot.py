"""Derived copies of an immutable config snapshot.

A ``Config`` and its sections are frozen dataclasses: a component that holds one can rely
on it never changing under it, and a hot reload hands out a new snapshot instead of
editing the one in use. ``replaced`` is ``dataclasses.replace`` addressed by dotted key,
for code and tests that want "this config, but with ``dumps.dir`` elsewhere".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def replaced(obj: T, changes: Mapping[str, Any] | None = None, /, **fields: Any) -> T:
    """A copy of the frozen dataclass ``obj`` with dotted keys replaced (not validated: use
    ``loader.with_overrides`` for user input). ``replaced(cfg, {"dumps.dir": d})`` or, for
    top-level fields, ``replaced(section, enabled=False)``."""
    todo: dict[str, dict[str, Any]] = {}
    direct: dict[str, Any] = dict(fields)
    for dotted, value in (changes or {}).items():
        head, sep, rest = dotted.partition(".")
        if sep:
            todo.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    for head, inner in todo.items():
        base = direct[head] if head in direct else getattr(obj, head)
        direct[head] = replaced(base, inner)
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"not a config section: {type(obj).__name__}")
    return dataclasses.replace(obj, **direct)
