"""Format parsers: one per framework's console format plus generic JSON, key=value and a
user regex. ``FORMATS`` is the sniff priority: specific formats before generic ones, so
the first format whose ``sniff`` accepts a line is the most specific one.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import FormatParser, LogLine
from .deepspeed import DeepSpeedParser
from .generic import JsonParser, KvParser, RegexParser
from .hf import HFParser
from .lightning import LightningCsvParser, LightningParser
from .llmc import LlmcParser
from .megatron import MegatronParser
from .nanogpt import NanoGPTParser
from .olmo import OlmoParser
from .torchtitan import TorchTitanParser

_FACTORIES: dict[str, Callable[[], FormatParser]] = {
    "megatron": MegatronParser,
    "deepspeed": DeepSpeedParser,
    "torchtitan": TorchTitanParser,
    "nanogpt": NanoGPTParser,
    "llmc": LlmcParser,
    "olmo": OlmoParser,
    "lightning": LightningParser,
    "lightning_csv": LightningCsvParser,
    "hf": HFParser,
    "json": JsonParser,
    "kv": KvParser,
}

FORMATS: tuple[str, ...] = (*_FACTORIES, "regex")

# Sniffing is stateless, so one instance of each serves every caller.
_SNIFFERS: tuple[tuple[str, FormatParser], ...] = tuple((n, f()) for n, f in _FACTORIES.items())


def _might_sniff(text: str) -> bool:
    """Every format's lines contain one of these; NCCL chatter contains none."""
    return (
        "oss" in text
        or "step" in text
        or "Epoch" in text
        or "{" in text
        or "verflow" in text
        or "OVERFLOW" in text
        or "OSS" in text
        or "trl:" in text  # llm.c's logfile: "s:0 trl:11.0091 lr:0.000001 norm:15.37"
        or "tel:" in text
    )


def make_parser(name: str, *, regex: str | None = None) -> FormatParser:
    """A fresh parser (parsers keep per-stream state, so never share one)."""
    if name == "regex":
        if not regex:
            raise ValueError("format 'regex' needs a pattern (logs.regex)")
        return RegexParser(regex)
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown log format {name!r}; known: {', '.join(FORMATS)}")
    return factory()


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
    "DeepSpeedParser",
    "FormatParser",
    "HFParser",
    "JsonParser",
    "KvParser",
    "LightningCsvParser",
    "LightningParser",
    "LlmcParser",
    "LogLine",
    "MegatronParser",
    "NanoGPTParser",
    "OlmoParser",
    "RegexParser",
    "TorchTitanParser",
    "make_parser",
    "sniff_format",
]
