"""Text from logs made inert for chat markup (Slack's mrkdwn, and what Alertmanager forwards).

Slack reads ``<!channel>``, ``<!here>``, ``<@U123>``, ``<#C123>`` and
``<https://evil|harmless text>`` as commands wherever mrkdwn is parsed, the notification
``text`` included. Its documented rule for text we own is to escape ``&``, ``<`` and ``>``
as ``&amp;``, ``&lt;`` and ``&gt;`` (:func:`slack_escape`). Text that goes through someone
else's template (an Alertmanager annotation, rendered by a receiver we do not control)
cannot be entity-escaped without showing ``&lt;`` in an e-mail, so there only the ``<``
that opens a mention or a link becomes ``‹`` (:func:`defuse_mentions`), and a traceback's
``<module>`` stays as it is.
"""

from __future__ import annotations

import re
from urllib.parse import quote

_SLACK_SEQUENCE = re.compile(r"<(?=[!@#]|[A-Za-z][A-Za-z0-9+.\-]*:)")


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_link(url: str, label: str) -> str | None:
    """``<url|label>`` with nothing in ``url`` able to end the link or start another; http(s) only."""
    if not url.lower().startswith(("https://", "http://")):
        return None
    safe = url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")
    safe = "".join(c if c.isprintable() and not c.isspace() else quote(c, safe="") for c in safe)
    return f"<{safe}|{slack_escape(label)}>"


def defuse_mentions(text: str) -> str:
    """``text`` with Slack mentions and disguised links made inert (their ``<`` becomes ``‹``)."""
    return _SLACK_SEQUENCE.sub("\u2039", text)
