"""Credentials out of everything a human may paste into a ticket: `config show`, log lines,
delivery errors.

A credential hides in more places than the keys named ``token``: the userinfo of a URL
(``https://user:pass@am.example``), its query (``?key=``, ``token=``, ``sig=``), a secret
path (Slack's ``/services/T.../B.../<secret>``, Discord's ``/api/webhooks/<id>/<token>``),
and webhook headers. :func:`redact_url` keeps what identifies the endpoint (scheme, host,
port, the harmless path) and replaces the rest with ``<redacted>``; :func:`redact_text`
does the same to every URL inside free text and to the secret values a config holds.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from .settings import credential_keys, dotted_value

REDACTED = "<redacted>"

# Query parameters that carry credentials (compared lower-case, '-' read as '_').
SECRET_PARAMS = frozenset(
    {
        "key",
        "api_key",
        "apikey",
        "token",
        "access_token",
        "auth",
        "auth_token",
        "authorization",
        "sig",
        "signature",
        "secret",
        "client_secret",
        "password",
        "pass",
        "pwd",
        "code",
        "x_amz_signature",
        "x_amz_credential",
        "x_amz_security_token",
        "x_goog_signature",
        "x_goog_credential",
    }
)
# Header names whose values are credentials (a literal one in a file draws a warning).
_SECRET_HEADER = re.compile(r"(?i)authorization|cookie|token|secret|key|signature|password|auth")
# A path segment this long, mixing letters and digits, is a key rather than a name.
_KEYLIKE_SEGMENT = re.compile(r"(?=[A-Za-z0-9_\-]*[0-9])(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z0-9_\-]{20,}")
# Hosts whose whole path is the secret (incoming webhooks).
_SECRET_PATH_HOSTS = ("hooks.slack.com", "discord.com", "discordapp.com", "webhook.office.com")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s<>\"'`|]+")
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=\-]{8,}")


def secret_header(name: str) -> bool:
    return bool(_SECRET_HEADER.search(name))


def _secret_param(name: str) -> bool:
    return name.lower().replace("-", "_") in SECRET_PARAMS


def redact_url(url: str) -> str:
    """``url`` with userinfo, secret query values and secret-looking path segments replaced."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return REDACTED
    if not parts.scheme or not parts.netloc:
        return _redact_query_text(url)
    netloc = parts.netloc.rpartition("@")[2]
    if parts.username is not None or parts.password is not None:
        netloc = f"{REDACTED}@{netloc}"
    path = parts.path
    if host and any(host == h or host.endswith("." + h) for h in _SECRET_PATH_HOSTS):
        head = "/".join(path.split("/")[:3]) if path.startswith("/api/") else "/".join(path.split("/")[:2])
        path = f"{head}/{REDACTED}" if path.strip("/") else path
    else:
        path = "/".join(REDACTED if _KEYLIKE_SEGMENT.fullmatch(seg) else seg for seg in path.split("/"))
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{quote(k, safe='{}-_.~')}={REDACTED if _secret_param(k) else quote(v, safe='{}-_.~/:')}"
            for k, v in pairs
        )
    del port
    return urlunsplit((parts.scheme, netloc, path, query, "" if not parts.fragment else REDACTED))


def _redact_query_text(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        return m.group(1) + REDACTED

    return re.sub(r"(?i)((?:^|[?&;\s])(?:" + "|".join(SECRET_PARAMS) + r")=)[^&\s]+", sub, text)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Free text with every URL redacted, bearer/basic credentials and ``secrets`` replaced."""
    for s in sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)


def config_secrets(cfg: object) -> list[str]:
    """Every credential value a loaded config holds (tokens, header values, URL userinfo), as
    its sections declare them (``settings.opt(secret=..., url=..., secret_headers=...)``)."""
    known = credential_keys(type(cfg))
    out = [str(v) for v in (dotted_value(cfg, k) for k in known.secrets) if v]
    for key in known.headers:
        for name, v in (dotted_value(cfg, key) or {}).items():
            if v and secret_header(name):
                out.append(str(v))
                _, _, cred = str(v).partition(" ")
                if len(cred) >= 6:
                    out.append(cred)
    for key in known.urls:
        value = dotted_value(cfg, key)
        urls = [value] if isinstance(value, str) else list(value or ())  # a mapping: its keys
        for url in urls:
            try:
                pw = urlsplit(url).password
            except ValueError:
                continue
            if pw:
                out.append(pw)
    return out


class RedactingFilter(logging.Filter):
    """A handler filter: the formatted message (and traceback text) with credentials replaced."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__("rankwatch.redact")
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:
            return True
        clean = redact_text(msg, self.secrets)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self.secrets)
        return True


def install_log_redaction(secrets: Iterable[str] = ()) -> RedactingFilter:
    """Put one :class:`RedactingFilter` on every root handler (replacing an earlier one)."""
    flt = RedactingFilter(secrets)
    for handler in logging.getLogger().handlers:
        for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(old)
        handler.addFilter(flt)
    return flt
