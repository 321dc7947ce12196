"""Text from the job made safe to show: one sanitizer for every face that shows it.

Log lines, a process's argv, thread and frame names and the locals in a stack dump are
written by the job (or by whoever can write its log), and they reach a terminal (console
findings, ``rankwatch dumps show``), a browser (the status page) and chat (Slack, a webhook,
Alertmanager's receivers). A terminal obeys escape sequences: ``ESC c`` resets it, ``ESC ( 0``
switches it to line drawing, ``ESC # 8`` (DECALN) fills it with ``E``, OSC 52 writes the
reader's clipboard, and the 8-bit C1 forms (``\\x9b`` is CSI) do the same on terminals that
take them. Bidi overrides (U+202A-U+202E, U+2066-U+2069) reorder what a reader sees
("Trojan Source", CVE-2021-42574) in a terminal, a page and a chat client alike.

So every control character is rendered visibly instead of obeyed: C0 controls and DEL as
their Unicode control pictures (``ESC`` -> ``␛``, BEL -> ``␇``), so ``\\x1b]52;c;...\\x07``
reads ``␛]52;c;...␇``; C1 controls, bidi controls, zero-width and other invisible format
characters, and the line/paragraph separators as ``\\x9b`` / ``\\u202e`` escapes. The text
stays readable and nothing in it acts. A tab is kept; a newline only where the face shows
several lines (an evidence block, a dump), else it becomes ``␤``, so a log line cannot
forge a line of the agent's own output.

The chat-markup rules (Slack's mrkdwn entities and mentions) live here too, applied after
the above (:func:`slack_escape`, :func:`slack_link`, :func:`defuse_mentions`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

__all__ = ["deep", "defuse_mentions", "slack_escape", "slack_link", "visible", "visible_lines"]

# What can never pass: C0 but tab and newline, DEL, C1, and the format and separator
# characters a reader does not see (bidi embeddings, overrides and isolates, marks, zero
# widths, the BOM, interlinear annotation, U+2028/U+2029). Other non-ASCII text is then
# looked at one character at a time for the rest of Unicode's format category.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb]"
)
_NEWLINE = "\u2424"  # ␤
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _picture(c: str) -> str:
    o = ord(c)
    if o < 0x20:
        return chr(0x2400 + o)  # ␀ .. ␟ (␛ for ESC)
    if o == 0x7F:
        return "\u2421"  # ␡
    if o <= 0xFF:
        return f"\\x{o:02x}"
    if o <= 0xFFFF:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def _shown(m: re.Match[str]) -> str:
    return _picture(m.group())


def _slow(text: str) -> str:
    """The rest of Unicode's invisible characters (format characters, lone surrogates)."""
    out = []
    for c in text:
        if c > "\x7f" and unicodedata.category(c) in _INVISIBLE:
            out.append(_picture(c))
        else:
            out.append(c)
    return "".join(out)


def visible(text: object, *, multiline: bool = False) -> str:
    """``text`` with every control and invisible format character shown, not obeyed.

    ``multiline``: a newline stays (the face shows several lines); otherwise it is ``␤``.
    A carriage return is always shown (``␍``): it would let a line overwrite the one before.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isascii():
        if s.isprintable() or (multiline and _ascii_ok(s)):
            return s
    elif not _UNSAFE.search(s) and "\n" not in s and _ok_unicode(s):
        return s
    s = _UNSAFE.sub(_shown, s)
    if not multiline and "\n" in s:
        s = s.replace("\n", _NEWLINE)
    return s if s.isascii() or _ok_unicode(s) else _slow(s)


def visible_lines(text: object) -> str:
    """:func:`visible` for a face that shows several lines."""
    return visible(text, multiline=True)


def _ascii_ok(s: str) -> bool:
    return s.replace("\n", "").replace("\t", "").isprintable()


def _ok_unicode(s: str) -> bool:
    """No character of Unicode's invisible categories (a cheap test first: most text has none)."""
    return all(c <= "\x7f" or unicodedata.category(c) not in _INVISIBLE for c in s)


def deep(obj: Any, *, multiline: bool = True) -> Any:
    """Every string in a JSON-like document (keys too) through :func:`visible`: a payload
    for a webhook or Alertmanager, whose receivers show its values to people."""
    if isinstance(obj, str):
        return visible(obj, multiline=multiline)
    if isinstance(obj, Mapping):
        return {visible(k) if isinstance(k, str) else k: deep(v, multiline=multiline) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [deep(v, multiline=multiline) for v in obj]
    return obj


# --- chat markup -------------------------------------------------------------------------
# Slack reads ``<!channel>``, ``<!here>``, ``<@U123>``, ``<#C123>`` and
# ``<https://evil|harmless text>`` as commands wherever mrkdwn is parsed, the notification
# ``text`` included. Its documented rule for text we own is to escape ``&``, ``<`` and ``>``
# as ``&amp;``, ``&lt;`` and ``&gt;`` (:func:`slack_escape`). Text that goes through someone
# else's template (an Alertmanager annotation, rendered by a receiver we do not control)
# cannot be entity-escaped without showing ``&lt;`` in an e-mail, so there only the ``<``
# that opens a mention or a link becomes ``‹`` (:func:`defuse_mentions`), and a traceback's
# ``<module>`` stays as it is.
_SLACK_SEQUENCE = re.compile(r"<(?=[!@#]|[A-Za-z][A-Za-z0-9+.\-]*:)")


def slack_escape(text: str, *, multiline: bool = True) -> str:
    """Shown (:func:`visible`) and entity-escaped for Slack's mrkdwn."""
    return visible(text, multiline=multiline).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_link(url: str, label: str) -> str | None:
    """``<url|label>`` with nothing in ``url`` able to end the link or start another; http(s) only."""
    if not url.lower().startswith(("https://", "http://")):
        return None
    safe = url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")
    safe = "".join(c if c.isprintable() and not c.isspace() else quote(c, safe="") for c in safe)
    return f"<{safe}|{slack_escape(label, multiline=False)}>"


def defuse_mentions(text: str, *, multiline: bool = True) -> str:
    """Shown (:func:`visible`), with Slack mentions and disguised links made inert (their
    ``<`` becomes ``‹``)."""
    return _SLACK_SEQUENCE.sub("\u2039", visible(text, multiline=multiline))
