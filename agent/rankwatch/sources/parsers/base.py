"""What every format parser provides.

A parser is created once per (stream, rank) and may keep state (Hugging Face logs carry
no step number, so its parser counts). It receives lines whose launcher decorations
(timestamps, ``[rank3]:`` prefixes, ANSI colour) are already stripped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from rankwatch.records import Record


@dataclass(slots=True)
class LogLine:
    text: str  # decorations stripped
    lineno: int  # 1-based line number in the file (\n-separated)
    rank: int | None = None  # rank named by a launcher prefix, if any
    time: float | None = None  # epoch seconds from a timestamp prefix, if any


class FormatParser(Protocol):
    name: ClassVar[str]  # the format's name in logs.format, --format and analyze's output
    # Words one of which every line ``sniff`` accepts contains: auto-detection offers a line
    # to the sniffers only when it holds one (most lines, NCCL chatter, hold none).
    hints: ClassVar[tuple[str, ...]]
    # A generic format (JSON, key=value) claims lines that specific formats print too, so a
    # specific format seen soon after may take over (``LogParser``'s ``sniff_lines``).
    generic: ClassVar[bool]
    # Auto-detection asks the parsers in this order, smaller first (``registry.load_all``):
    # a format whose lines another also claims sits before it (generic formats at 200+).
    order: ClassVar[int]

    def sniff(self, text: str) -> bool:
        """True when this (stripped) line is unmistakably in this parser's format."""
        ...

    def parse(self, line: LogLine) -> list[Record]:
        """Records found on the line; an empty list for lines that carry none."""
        ...
