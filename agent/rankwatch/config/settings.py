"""What a settings dataclass is made of, and the settings plugins declare beside their code.

A section of the configuration is a frozen dataclass whose fields are made with ``opt`` (a
key, its default, its one-line help and the smallest value the loader accepts) or
``section`` (a nested section). ``config/schema.py`` holds the sections of the agent itself;
a plugin (an alert sink, ...) declares its own section in its own file and registers it with
``@settings(parent, key, doc)``: the schema assembles the parent section from its core fields
and every section registered under it (``assemble``), so the loader, ``config show``,
``config check`` and the Helm values schema (helm/gen_values_schema.py) all see the plugin's
keys with no line anywhere else.

A module that declares settings imports this module, never ``config.schema`` at run time
(only under ``TYPE_CHECKING``): the schema imports the plugin modules while it is being
built (tests/test_settings.py holds the rule).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NewType, TypeVar, cast
from urllib.parse import urlsplit

Duration = NewType("Duration", float)
Size = NewType("Size", int)

_T = TypeVar("_T")


def opt(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    zero_off: bool = False,
    secret: str | None = None,
    url: bool = False,
    secret_headers: str | None = None,
) -> Any:
    """A key with its default and help; ``min`` is the smallest value the loader accepts
    (with ``zero_off``, 0 is also accepted: it means "off"), so an interval that would
    spin a core next to the rank (``poll_interval: 0s``) is refused with the key named.

    Credentials are declared where the key is: ``secret`` (the environment variable the docs
    suggest) for a key that is a credential, ``url`` for URLs that may carry one in their
    userinfo, query or path (a string, a list of them, or a mapping keyed by them), and
    ``secret_headers`` (the variable suggested) for a mapping of HTTP headers whose
    authorization-like values are credentials. The loader warns when one is written as a
    literal, and ``config show`` prints them redacted (``credential_keys``)."""
    meta: dict[str, Any] = {"doc": doc}
    if min is not None:
        meta["min"] = min
        meta["zero_off"] = zero_off
    if secret is not None:
        meta["secret"] = secret
    if url:
        meta["url"] = True
    if secret_headers is not None:
        meta["secret_headers"] = secret_headers
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, doc: str) -> Any:
    return field(default_factory=cls, metadata={"doc": doc})


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be POSTed to, or None (the URL itself is never quoted: it may hold a key)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        return f"not a valid URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    return None


def has_userinfo(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.username is not None or parts.password is not None


# trend.sustained_climb judges a climb from at least 2 * CLIMB_SEGMENTS points, one per
# resolution; a window holds window / resolution + 1 of them (tests/test_config.py holds the
# two together). A shorter window makes the rule silent for ever.
CLIMB_POINTS = 8


def climb_problem(window: float, resolution: float, what: str) -> str | None:
    if window >= (CLIMB_POINTS - 1) * resolution:
        return None
    return (
        f"{what} of {window:g}s holds {int(window // resolution) + 1} points of {resolution:g}s; a climb "
        f"is judged from at least {CLIMB_POINTS}, so the rule could never fire: make it at least "
        f"{(CLIMB_POINTS - 1) * resolution:g}s or lower the resolution"
    )


@dataclass(frozen=True)
class Credentials:
    """The keys of a configuration that hold credentials, by dotted key (``credential_keys``)."""

    secrets: dict[str, str]  # key -> the environment variable the docs suggest
    urls: tuple[str, ...]  # keys holding URLs (a string, a list, or a mapping keyed by URLs)
    headers: dict[str, str]  # keys holding HTTP headers -> the variable suggested


def dotted_value(within: object, dotted: str) -> Any:
    """The value of the dotted key ``dotted`` (``"alerts.slack.token"``), None where absent."""
    node: Any = within
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node


def credential_keys(cls: type, prefix: str = "") -> Credentials:
    """Every key of the section ``cls`` (and its nested sections, plugins' included) declared
    a credential with ``opt(secret=...)``, ``opt(url=True)`` or ``opt(secret_headers=...)``."""
    secrets: dict[str, str] = {}
    urls: list[str] = []
    headers: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        inner = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            sub = credential_keys(inner, f"{key}.")
            secrets.update(sub.secrets)
            urls.extend(sub.urls)
            headers.update(sub.headers)
            continue
        if "secret" in f.metadata:
            secrets[key] = f.metadata["secret"]
        if f.metadata.get("url"):
            urls.append(key)
        if "secret_headers" in f.metadata:
            headers[key] = f.metadata["secret_headers"]
    return Credentials(secrets, tuple(urls), headers)


# --- plugin settings ---------------------------------------------------------------------------


def plugin_modules(folder: str | os.PathLike[str]) -> list[str]:
    """The modules of the package in ``folder``, as ``pkgutil.iter_modules`` lists them (in
    name order, each once whatever its suffix, a folder with an ``__init__`` as a package;
    ``__init__`` itself left out), without loading pkgutil into every agent: each plugin
    family discovers its modules with this."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out: list[str] = []
    for name in names:
        mod = inspect.getmodulename(name)
        if mod is None and "." not in name and os.path.isdir(os.path.join(folder, name)):
            try:
                inside = os.listdir(os.path.join(folder, name))
            except OSError:
                inside = []
            mod = name if any(inspect.getmodulename(f) == "__init__" for f in inside) else None
        if mod and mod != "__init__" and "." not in mod and mod not in out:
            out.append(mod)
    return out


@dataclass(frozen=True)
class PluginSettings:
    parent: str  # the section it is a part of, e.g. "alerts"
    key: str  # its key there, e.g. "slack": alerts.slack.*
    cls: type
    doc: str  # the section's one-line help


_REGISTRY: dict[tuple[str, str], PluginSettings] = {}


def settings(parent: str, key: str, doc: str) -> Callable[[type[_T]], type[_T]]:
    """Class decorator: the dataclass is the section ``<parent>.<key>`` of the configuration."""

    def add(cls: type[_T]) -> type[_T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__qualname__}: settings are a frozen dataclass")
        known = _REGISTRY.get((parent, key))
        if known is not None and known.cls.__qualname__ != cls.__qualname__:
            raise TypeError(f"{parent}.{key} is declared twice: {known.cls.__qualname__}, {cls.__qualname__}")
        _REGISTRY[(parent, key)] = PluginSettings(parent, key, cls, doc)
        return cls

    return add


def plugin_settings(parent: str | None = None) -> list[PluginSettings]:
    """The registered sections (of ``parent``), by key: the same order whatever imported first."""
    return sorted(
        (p for p in _REGISTRY.values() if parent in (None, p.parent)), key=lambda p: (p.parent, p.key)
    )


def assemble(core: type[_T], parent: str, name: str, *, discover: str) -> type[_T]:
    """The section ``parent``: ``core``'s fields, then one nested section per plugin registered
    under ``parent``. ``discover`` names the module whose ``load_all()`` imports the plugins of
    that family (the family's own discovery, which the plugins need anyway)."""
    try:
        importlib.import_module(discover).load_all()
    except ImportError as e:
        raise ImportError(
            f"{discover}: a plugin module imports rankwatch.config.schema while the schema is being built "
            f"({e}); import it under TYPE_CHECKING and take opt/settings from rankwatch.config.settings"
        ) from e
    plugins = plugin_settings(parent)
    clash = {p.key for p in plugins} & {f.name for f in dataclasses.fields(cast(Any, core))}
    if clash:
        raise TypeError(f"{parent}: plugin settings reuse the keys {sorted(clash)}")
    made = dataclasses.make_dataclass(
        name, [(p.key, p.cls, section(p.cls, p.doc)) for p in plugins], bases=(core,), frozen=True
    )
    made.__module__ = core.__module__  # found by its name there (pickle, repr)
    made.__doc__ = core.__doc__
    return made


def settings_of(within: object, cls: type[_T]) -> _T:
    """The plugin section of type ``cls``, typed, from the whole configuration or from the
    assembled section it is part of: ``settings_of(cfg, SlackConfig)`` and
    ``settings_of(cfg.alerts, SlackConfig)`` are ``cfg.alerts.slack``, which a type checker
    only knows as ``Any``."""
    for p in _REGISTRY.values():
        if p.cls is not cls:
            continue
        found = getattr(within, p.key, None)
        if not isinstance(found, cls):
            parent: Any = within
            for part in p.parent.split("."):
                parent = getattr(parent, part, None)
            found = getattr(parent, p.key, None)
        if not isinstance(found, cls):
            raise LookupError(f"{type(within).__qualname__} holds no {p.parent}.{p.key} ({cls.__qualname__})")
        return found
    raise LookupError(f"{cls.__qualname__} is not registered with @settings")


class PluginSections:
    """Base of a section that plugins extend: to a type checker, a plugin's section read as an
    attribute (``cfg.alerts.slack``) is ``Any``; ``settings_of`` gives it its type."""

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...
