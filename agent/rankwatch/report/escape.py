"""Text from a log or a stack, made safe for an HTML page or a Markdown message.

A frame name, a thread name, a local's repr and a log line are written by the job (or by
whoever controls its input): ``<script>``, ``</svg>``, ANSI colour and cursor codes, bidi
overrides that reorder what the reader sees, and Markdown that turns a line into a link or
a heading. HTML gets ``html.escape`` (quotes too, for attributes); both get terminal escape
sequences removed (a page shows no colours) and every other control or bidi character shown
by the one sanitizer of every face (``rankwatch.sanitize``); Markdown gets its markup
characters backslash-escaped.
"""

from __future__ import annotations

import html
import re

from rankwatch.sanitize import visible

# CSI / OSC / single-character escape sequences: a terminal's colour and cursor codes.
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# What can start markup inside a line of ours: emphasis, code, links and autolinks, HTML,
# tables, strikethrough, entities. (Line-start markers cannot occur: the line is ours.) An
# underscore inside a word (``all_reduce``) emphasises nothing, so it stays as it is.
_MD_SPECIAL_RE = re.compile(r"[\\`*\[\]<>|~&]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def neutralise(text: object, *, keep_newlines: bool = True) -> str:
    """``text`` without escape sequences, its other controls shown (``sanitize.visible``)."""
    s = _ANSI_RE.sub("", str(text))
    if not keep_newlines:
        s = s.replace("\r", "").replace("\n", " ")
    return visible(s, multiline=keep_newlines)


def h(text: object) -> str:
    """For HTML text and attribute values."""
    return html.escape(neutralise(text), quote=True)


def md(text: object) -> str:
    """For Markdown (CommonMark, GitHub, Slack-pasted): one line, its markup escaped."""
    s = _MD_SPECIAL_RE.sub(lambda m: "\\" + m.group(0), neutralise(text, keep_newlines=False))
    # @channel / @here / @user pasted into a chat pings people: a zero-width space stops it.
    return s.replace("@", "@\u200b")
