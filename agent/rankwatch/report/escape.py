"""Text from a log or a stack, made safe for an HTML page or a Markdown message.

A frame name, a thread name, a local's repr and a log line are written by the job (or by
whoever controls its input): ``<script>``, ``</svg>``, ANSI colour and cursor codes, bidi
overrides that reorder what the reader sees, and Markdown that turns a line into a link or
a heading. HTML gets ``html.escape`` (quotes too, for attributes); both get escape
sequences removed and every other control or bidi character shown as a visible ``\\uXXXX``
instead of acting; Markdown gets its markup characters backslash-escaped.
"""

from __future__ import annotations

import html
import re

# CSI / OSC / single-character escape sequences: a terminal's colour and cursor codes.
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# C0 and C1 controls but tab and newline, DEL, and the Unicode controls that reorder or hide
# text (bidi embeddings, overrides and isolates, marks, zero-width joiners, BOM, separators).
_CONTROL_RE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]"
)
# What can start markup inside a line of ours: emphasis, code, links and autolinks, HTML,
# tables, strikethrough, entities. (Line-start markers cannot occur: the line is ours.) An
# underscore inside a word (``all_reduce``) emphasises nothing, so it stays as it is.
_MD_SPECIAL_RE = re.compile(r"[\\`*\[\]<>|~&]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def _visible(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group(0)):04x}"


def neutralise(text: object, *, keep_newlines: bool = True) -> str:
    """``text`` without escape sequences, its other controls shown as ``\\uXXXX``."""
    s = _ANSI_RE.sub("", str(text))
    s = _CONTROL_RE.sub(_visible, s)
    if not keep_newlines:
        s = s.replace("\r", "").replace("\n", " ")
    return s


def h(text: object) -> str:
    """For HTML text and attribute values."""
    return html.escape(neutralise(text), quote=True)


def md(text: object) -> str:
    """For Markdown (CommonMark, GitHub, Slack-pasted): one line, its markup escaped."""
    s = _MD_SPECIAL_RE.sub(lambda m: "\\" + m.group(0), neutralise(text, keep_newlines=False))
    # @channel / @here / @user pasted into a chat pings people: a zero-width space stops it.
    return s.replace("@", "@\u200b")
