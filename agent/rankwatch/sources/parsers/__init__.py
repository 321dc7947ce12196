"""Format parsers: one per framework's console format plus generic JSON, key=value and a
user regex. Each registers itself with ``@register_parser`` (``registry.py``) and is found by
importing the package's modules: a new format is one new file. ``FORMATS`` is the sniff
priority, each parser's ``order``: specific formats before generic ones, so the first format
whose ``sniff`` accepts a line is the most specific one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import FormatParser, LogLine
from .generic import JSON_REPEAT_WINDOW, JsonParser, RegexParser
from .registry import REGISTRY, load_all, register_parser

# The format registry: every parser, in sniff order. A format's name, its detection hints,
# its place and its sniffer come from its class; the config schema's ``logs.format`` values
# are read from here, and the demo trainer's and the examples' formats are held to this list
# by tests/test_catalogs.py.
_ALL = load_all()
PARSERS: tuple[type[FormatParser], ...] = tuple(cls for cls in _ALL if cls.hints)  # the sniffed ones
FORMATS: tuple[str, ...] = tuple(cls.name for cls in _ALL)
GENERIC: frozenset[str] = frozenset(cls.name for cls in PARSERS if cls.generic)

# Sniffing is stateless, so one instance of each serves every caller.
_SNIFFERS: tuple[tuple[str, FormatParser], ...] = tuple((cls.name, cls()) for cls in PARSERS)

HINTS: tuple[str, ...] = tuple(dict.fromkeys(w for cls in PARSERS for w in cls.hints))


def _make_might_sniff(words: tuple[str, ...]) -> Callable[[str], bool]:
    # One chain of ``in`` tests: until a format is decided it runs on every line.
    src = "def might_sniff(text):\n    return " + " or ".join(f"{w!r} in text" for w in words) + "\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<sniff gate of {__name__}>", "exec"), ns)
    fn: Callable[[str], bool] = ns["might_sniff"]
    fn.__doc__ = "Every format's sniffable lines hold one of its hints; NCCL chatter holds none."
    return fn


_might_sniff = _make_might_sniff(HINTS)


def make_parser(
    name: str, *, regex: str | None = None, repeat_window: int = JSON_REPEAT_WINDOW
) -> FormatParser:
    """A fresh parser (parsers keep per-stream state, so never share one)."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown log format {name!r}; known: {', '.join(FORMATS)}")
    if cls is JsonParser:
        return JsonParser(repeat_window)
    if cls is RegexParser:  # chosen by name only, built from the user's pattern
        if not regex:
            raise ValueError("format 'regex' needs a pattern (logs.regex)")
        return RegexParser(regex)
    return cls()


def sniff_format(text: str) -> str | None:
    """The first format (in ``FORMATS`` order) that claims this stripped line."""
    if len(text) < 6 or not _might_sniff(text):
        return None
    for name, parser in _SNIFFERS:
        if parser.sniff(text):
            return name
    return None


__all__ = [
    "FORMATS",
    "GENERIC",
    "HINTS",
    "JSON_REPEAT_WINDOW",
    "PARSERS",
    "REGISTRY",
    "FormatParser",
    "LogLine",
    "RegexParser",
    "make_parser",
    "register_parser",
    "sniff_format",
]
