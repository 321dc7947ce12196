"""Durations and sizes as people write them in config files (``30s``, ``1h30m``, ``512MiB``).

Sizes: ``KiB``/``MiB``/``GiB``/``TiB``/``PiB`` (and ``Ki``/``Mi``/... as in Kubernetes) are
powers of 1024, ``kB``/``KB``/``MB``/``GB``/``TB``/``PB`` powers of 1000, and a bare ``K``/
``M``/``G``/``T``/``P`` is binary, as in Docker's ``--memory`` and the JVM's ``-Xmx``: that
is what people mean when they size memory. Units are case-insensitive. A plain number is
seconds or bytes.
"""

from __future__ import annotations

import math
import re

_DURATION_UNITS: dict[str, float] = {
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 604800.0,
    "week": 604800.0,
    "weeks": 604800.0,
}
_DURATION_DIVISORS = {"us": 1_000_000, "µs": 1_000_000, "ms": 1000}

_SIZE_UNITS: dict[str, int] = {"b": 1, "": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _SIZE_UNITS[_p] = 1024**_i
    _SIZE_UNITS[_p + "i"] = 1024**_i
    _SIZE_UNITS[_p + "ib"] = 1024**_i
    _SIZE_UNITS[_p + "b"] = 1000**_i

_NUMBER = r"(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_COMPONENT = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Zµ]*)\s*")
_FULL_NUMBER = re.compile(rf"[-+]?{_NUMBER}")

DURATION_HINT = "a duration such as 250ms, 30s, 10m, 2h, 1d or 1h30m"
SIZE_HINT = "a size such as 512MiB, 1GiB, 10MB or a number of bytes"


def _check_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected {what}, got {type(value).__name__} {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return value


def parse_duration(text: str | int | float) -> float:
    """Seconds from ``30s``/``1h30m``/``250ms``; a bare number is seconds."""
    if not isinstance(text, str):
        return float(_check_number(text, "a duration"))
    s = text.strip()
    if not s:
        raise ValueError(f"empty duration; expected {DURATION_HINT}")
    if s.startswith("-"):
        raise ValueError(f"duration must not be negative: {text!r}")
    if _FULL_NUMBER.fullmatch(s):
        return float(_check_number(float(s.replace("_", "")), "a duration"))
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _COMPONENT.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"invalid duration {text!r}; expected {DURATION_HINT}")
        number, unit = m.group(1).replace("_", ""), m.group(2).lower()
        if not unit:
            raise ValueError(f"invalid duration {text!r}: {number!r} has no unit; expected {DURATION_HINT}")
        if unit not in _DURATION_UNITS:
            raise ValueError(f"invalid duration {text!r}: unknown unit {unit!r} (use ms, s, m, h, d, w)")
        divisor = _DURATION_DIVISORS.get(unit)
        total += float(number) / divisor if divisor else float(number) * _DURATION_UNITS[unit]
        pos = m.end()
    return float(_check_number(total, "a duration"))


def parse_size(text: str | int | float) -> int:
    """Bytes from ``512MiB``/``10MB``/``1G``; a bare integer is bytes."""
    if not isinstance(text, str):
        value = _check_number(text, "a size")
        if value != int(value):
            raise ValueError(f"a size in bytes must be a whole number, got {text!r}")
        return int(value)
    s = text.strip()
    if not s:
        raise ValueError(f"empty size; expected {SIZE_HINT}")
    if s.startswith("-"):
        raise ValueError(f"size must not be negative: {text!r}")
    m = _COMPONENT.fullmatch(s)
    if not m:
        raise ValueError(f"invalid size {text!r}; expected {SIZE_HINT}")
    unit = m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(
            f"invalid size {text!r}: unknown unit {m.group(2)!r} (use B, KiB, MiB, GiB, TiB, kB, MB, GB)"
        )
    from decimal import Decimal, InvalidOperation  # a size with a unit, in a config file only

    try:
        exact = Decimal(m.group(1).replace("_", "")) * _SIZE_UNITS[unit]
    except InvalidOperation as e:
        raise ValueError(f"invalid size {text!r}") from e
    if _SIZE_UNITS[unit] == 1 and exact != exact.to_integral_value():
        raise ValueError(f"a size in bytes must be a whole number, got {text!r}")
    return int(exact.to_integral_value())


def format_duration(seconds: float) -> str:
    """Canonical short form, e.g. ``250ms``, ``30s``, ``1h30m``; it parses back to the same float."""
    seconds = _check_number(seconds, "a duration")
    ms = round(seconds * 1000)
    if ms / 1000 == seconds:
        parts = []
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
            count, ms = divmod(ms, size)
            if count:
                parts.append(f"{count}{unit}")
        text = "".join(parts) or "0s"
        if parse_duration(text) == seconds:
            return text
    return f"{float(seconds)!r}s"


def format_size(num_bytes: int) -> str:
    """Canonical short form: the shortest exact spelling, binary units first (``512MiB``)."""
    if isinstance(num_bytes, float) and num_bytes == int(num_bytes):
        num_bytes = int(num_bytes)
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 0:
        raise ValueError(f"a size must be a non-negative whole number of bytes, got {num_bytes!r}")
    candidates = []
    if num_bytes:
        for base, suffixes in (
            (1024, ("KiB", "MiB", "GiB", "TiB", "PiB")),
            (1000, ("kB", "MB", "GB", "TB", "PB")),
        ):
            for power in range(len(suffixes), 0, -1):
                if num_bytes % base**power == 0:
                    candidates.append(f"{num_bytes // base**power}{suffixes[power - 1]}")
                    break
    candidates.append(f"{num_bytes}B")
    return min(candidates, key=len)


def format_age(seconds: float | None) -> str:
    """For a person reading a table: ``42s``, ``17m``, ``2.5h``; ``–`` when unknown. Not meant
    to parse back (``format_duration`` is)."""
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
