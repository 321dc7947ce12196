"""The web configuration file of Prometheus exporters (exporter-toolkit's ``--web.config.file``).

The same file node_exporter and dcgm-exporter take, so a Prometheus scrape config that
already speaks TLS, client certificates and basic auth to them speaks it to rankwatch:

```yaml
tls_server_config:
  cert_file: /etc/rankwatch/tls.crt
  key_file: /etc/rankwatch/tls.key
  client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
  client_ca_file: /etc/rankwatch/ca.crt
  min_version: TLS12                             # TLS10..TLS13; TLS12 by default, as there
basic_auth_users:
  prometheus: $2y$10$...                         # bcrypt (htpasswd -nBC 10 prometheus)
http_server_config:
  headers: {Strict-Transport-Security: max-age=31536000}
```

Where Python's ``ssl`` cannot do what a key asks, the file is refused, never half applied:
``RequestClientCert`` and ``RequireAnyClientCert`` (a client certificate taken without
verifying it) are refused; ``cipher_suites``, ``curve_preferences`` and
``prefer_server_cipher_suites`` name Go's settings and are refused too — OpenSSL's defaults for
the TLS version chosen apply. Unknown keys are errors, as in exporter-toolkit.

``basic_auth_users`` protect ``/metrics`` (what Prometheus scrapes); the status page and
``/api/*`` keep needing the agent's token, and ``/healthz`` / ``/readyz`` stay open for
probes. A bcrypt check costs ~50-100 ms, so it runs off the loop and a good credential is
remembered (as an HMAC under a per-process key, never the password) for the next scrapes.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import os
import secrets
import ssl
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rankwatch import offloop

_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "cipher_suites",
    "curve_preferences",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
}
_GO_ONLY = ("cipher_suites", "curve_preferences", "prefer_server_cipher_suites", "client_allowed_sans")
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_CACHE = 64  # remembered good credentials
_CHECKS = 2  # bcrypt checks at once


class WebConfigError(ValueError):
    """The web config file is wrong; the message names the file and the key."""


@dataclass
class WebConfig:
    path: str
    ssl: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    _good: OrderedDict[bytes, None] = field(default_factory=OrderedDict, repr=False)
    _checks: asyncio.Semaphore | None = field(default=None, repr=False)

    async def check_basic(self, user: str, password: str) -> bool:
        """Whether ``user:password`` is one of ``basic_auth_users`` (bcrypt, off the loop)."""
        want = self.users.get(user)
        digest = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        if want is None:
            # the same work for an unknown user, so timing does not tell which users exist
            await self._bcrypt(password, None)
            return False
        if digest in self._good:
            self._good.move_to_end(digest)
            return True
        ok = await self._bcrypt(password, want)
        if ok:
            self._good[digest] = None
            while len(self._good) > _CACHE:
                self._good.popitem(last=False)
        return ok

    async def _bcrypt(self, password: str, hashed: bytes | None) -> bool:
        """One bcrypt check on a daemon thread (``offloop``), at most ``_CHECKS`` at once: a
        flood of wrong passwords costs at most that many cores, never the event loop."""
        if self._checks is None:
            self._checks = asyncio.Semaphore(_CHECKS)
        async with self._checks:
            return await offloop.in_daemon(_checkpw, password, hashed, name="rankwatch-bcrypt")


def _checkpw(password: str, hashed: bytes | None) -> bool:
    import bcrypt

    if hashed is None:
        hashed = _dummy_hash()

    try:
        return bool(bcrypt.checkpw(password.encode(), hashed))
    except ValueError:
        return False


@functools.lru_cache(maxsize=1)
def _dummy_hash() -> bytes:
    """A bcrypt hash of a random password (cost 10): what an unknown user is checked against."""
    import bcrypt

    return bytes(bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(10)))


def _fail(path: str, msg: str) -> WebConfigError:
    return WebConfigError(f"{path}: {msg}")


def _file(path: str, base: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, f"tls_server_config.{key}: expected a file path")
    p = Path(value)
    if not p.is_absolute():
        p = base / p  # relative to the web config file, as exporter-toolkit resolves them
    if not p.is_file():
        raise _fail(path, f"tls_server_config.{key}: {p}: no such file")
    return str(p)


def _tls(path: str, base: Path, doc: Any) -> ssl.SSLContext | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise _fail(path, "tls_server_config: expected a mapping")
    unknown = sorted(set(doc) - _TLS_KEYS)
    if unknown:
        raise _fail(path, f"tls_server_config: unknown key(s) {', '.join(unknown)}")
    go_only = [k for k in _GO_ONLY if doc.get(k) not in (None, [], False)]
    if go_only:
        raise _fail(
            path,
            f"tls_server_config.{go_only[0]} is not supported here (Go's TLS settings); remove it: "
            "OpenSSL's defaults for the TLS version apply",
        )
    if not doc.get("cert_file") or not doc.get("key_file"):
        raise _fail(path, "tls_server_config: cert_file and key_file are both required")
    auth = doc.get("client_auth_type") or "NoClientCert"
    if auth in ("RequestClientCert", "RequireAnyClientCert"):
        raise _fail(
            path,
            f"tls_server_config.client_auth_type {auth}: a client certificate taken without being "
            "verified is not supported; use VerifyClientCertIfGiven or RequireAndVerifyClientCert",
        )
    if auth not in _CLIENT_AUTH:
        raise _fail(path, f"tls_server_config.client_auth_type: unknown value {auth!r}")
    ca = doc.get("client_ca_file")
    if auth != "NoClientCert" and not ca:
        raise _fail(path, f"tls_server_config.client_auth_type {auth} needs client_ca_file")
    cert = _file(path, base, "cert_file", doc["cert_file"])
    key = _file(path, base, "key_file", doc["key_file"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for k, attr, default in (
        ("min_version", "minimum_version", "TLS12"),
        ("max_version", "maximum_version", None),
    ):
        name = doc.get(k) or default
        if name is None:
            continue
        if name not in _VERSIONS:
            raise _fail(path, f"tls_server_config.{k}: expected one of {', '.join(_VERSIONS)}, got {name!r}")
        setattr(ctx, attr, _VERSIONS[name])
    try:
        ctx.load_cert_chain(cert, key)
        if ca:
            ctx.load_verify_locations(cafile=_file(path, base, "client_ca_file", ca))
    except (ssl.SSLError, OSError) as e:
        raise _fail(path, f"tls_server_config: cannot load the certificates: {e}") from None
    ctx.verify_mode = _CLIENT_AUTH[auth]
    return ctx


def _users(path: str, doc: Any) -> dict[str, bytes]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _fail(path, "basic_auth_users: expected a mapping of user to bcrypt hash")
    out = {}
    for user, hashed in doc.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise _fail(path, f"basic_auth_users: bad user name {user!r}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise _fail(path, f"basic_auth_users.{user}: expected a bcrypt hash ($2y$...), never a password")
        out[user] = hashed.encode()
    if out:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise _fail(path, "basic_auth_users needs the bcrypt package (pip install bcrypt)") from None
    return out


def _http(path: str, doc: Any) -> dict[str, str]:
    if doc is None:
        return {}
    if not isinstance(doc, dict) or set(doc) - {"http2", "headers"}:
        raise _fail(path, "http_server_config: only http2 and headers are known")
    headers = doc.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise _fail(path, "http_server_config.headers: expected a mapping of strings")
    return dict(headers)


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Parse and check the file; raises ``WebConfigError`` naming the file and the key."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text()
    except OSError as e:
        raise _fail(name, e.strerror or str(e)) from None
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise _fail(name, f"not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise _fail(name, "expected a mapping")
    unknown = sorted(set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config"})
    if unknown:
        raise _fail(name, f"unknown key(s) {', '.join(map(str, unknown))}")
    base = Path(name).resolve().parent
    return WebConfig(
        path=name,
        ssl=_tls(name, base, doc.get("tls_server_config")),
        users=_users(name, doc.get("basic_auth_users")),
        headers=_http(name, doc.get("http_server_config")),
    )
