"""Load and validate the YAML configuration against the schema dataclasses.

The loader works on the YAML *node* tree (``yaml.compose``) rather than on loaded
Python values so that every error can name the file, the line and the dotted key
the user has to fix. It walks the schema generically (``dataclasses.fields`` and
``typing.get_type_hints``), so new sections need no loader change. It uses PyYAML's public
API only (``compose`` for the tree and its marks, ``serialize`` + ``safe_load`` for a value
in a form this module does not type itself), never a loader's constructor state.

Rules worth knowing:

- A ``str`` field takes any non-null scalar as written (``name: 2024`` is ``"2024"``).
- ``int`` rejects booleans and floats; ``float`` takes integers but not booleans or NaN.
- A null (``key:`` with nothing after it) for a section, list or mapping means "empty /
  defaults", so sections whose keys are all commented out stay valid.
- ``${VAR}`` / ``${VAR:-default}`` are replaced in scalar values from the environment
  (``:-`` also applies when the variable is set but empty, as in the shell) and the result
  is typed as if it had been written unquoted in place, so ``factor: ${SPIKE:-2.0}`` is a
  float. ``$${`` is a literal ``${``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any, Literal, NoReturn

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .redact import redact_url, secret_header
from .schema import Config, Duration, Size
from .settings import Credentials, credential_keys
from .units import DURATION_HINT, SIZE_HINT, format_duration, format_size, parse_duration, parse_size

log = logging.getLogger("rankwatch.config")


@functools.cache
def credentials() -> Credentials:
    """The keys that hold credentials, as each section declares them beside its code
    (``opt(secret=..., url=..., secret_headers=...)``): a literal is warned about (the file is
    then a secret too) and `config show` prints them redacted."""
    return credential_keys(Config)


__all__ = [
    "ConfigError",
    "config_from_dict",
    "config_from_yaml",
    "load_config",
    "parse_override",
    "with_overrides",
]

_T = "tag:yaml.org,2002:"
NULL, BOOL, INT, FLOAT, STR, MERGE = (_T + t for t in ("null", "bool", "int", "float", "str", "merge"))
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:\d[\d_]*\.?\d*|\.\d+)[eE][-+]?\d+")
# Scalars in the forms config files use, typed here; any other form (0x1F, 1_000, 1:30,
# timestamps, explicit tags) is constructed by PyYAML itself (``_scalar_value``).
_PLAIN_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_PLAIN_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}
_ENV_TOKEN = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(Exception):
    """A configuration problem, located as precisely as the input allows."""

    def __init__(
        self, message: str, *, file: str | None = None, line: int | None = None, key: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.key = key

    def __str__(self) -> str:
        where = self.file or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        return ": ".join(p for p in (where, self.key, self.message) if p)


# -- schema introspection (shared with render.py) ---------------------------------------


def is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def section_fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """The init fields of a schema dataclass with their resolved type hints."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls) if f.init)


def union_args(hint: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return None


def strip_optional(hint: Any) -> Any:
    """``X | None`` -> ``X``; anything else unchanged."""
    args = union_args(hint)
    if args is not None:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def describe_type(hint: Any) -> str:
    if hint is Duration:
        return DURATION_HINT
    if hint is Size:
        return SIZE_HINT
    if hint is type(None):
        return "null"
    args = union_args(hint)
    if args is not None:
        return " or ".join(describe_type(a) for a in args)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (list, tuple, Sequence):
        return "a list"
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return "a mapping"
    if is_section(hint):
        return "a mapping of keys"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}
    if hint in names:
        return names[hint]
    return getattr(hint, "__name__", str(hint))


def _describe_node(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == NULL:
        return "null"
    if node.tag == STR:
        return f"a string ({node.value!r})"
    kinds = {BOOL: "a boolean", INT: "an integer", FLOAT: "a number", _T + "timestamp": "a date"}
    return f"{kinds.get(node.tag, 'a value')} ({node.value})"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    import difflib  # only for a key that is not known: not in every agent's memory

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- YAML through PyYAML's public API: compose, serialize, safe_load ---------------------


def _plain_tag(text: str) -> str:
    """The tag YAML gives ``text`` written unquoted as a value (``2.0`` a float, ``off`` a
    bool, ``30s`` a string): ``yaml.compose`` of the text alone; text that would not stay one
    plain scalar (``a: b``, ``[x]``, ``# c``, a trailing space) is a string."""
    if text == "":
        return NULL
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return STR
    if not isinstance(node, ScalarNode) or node.style is not None or node.value != text:
        return STR
    return str(node.tag)


def _scalar_value(node: ScalarNode) -> Any:
    """The Python value of a scalar node with a YAML core tag (null, bool, int, float, ...)."""
    value, tag = node.value, node.tag
    if tag == NULL and node.style is None and value in ("", "~", "null", "Null", "NULL"):
        return None
    if tag == BOOL and value.lower() in _BOOLS:
        return _BOOLS[value.lower()]
    if tag == INT and _PLAIN_INT.fullmatch(value):
        return int(value)
    if tag == FLOAT and _PLAIN_FLOAT.fullmatch(value):
        return float(value)
    return _node_value(node)


def _problem(e: Exception) -> str:
    """An exception's text without the position inside the re-serialized scalar."""
    if isinstance(e, yaml.MarkedYAMLError):
        return str(e.problem or e.context or "not a valid value")
    return str(e)


def _node_value(node: Node) -> Any:
    """What ``yaml.safe_load`` makes of ``node`` (a tree composed earlier, with its tags)."""
    return yaml.safe_load(yaml.serialize(node))


# -- node -> dataclass tree --------------------------------------------------------------


class _Builder:
    def __init__(self, file: str | None, env: Mapping[str, str] | None) -> None:
        self.file = file
        self.env = env

    def fail(self, message: str, node: Node | None, path: str) -> NoReturn:
        mark = node.start_mark if node is not None else None
        raise ConfigError(message, file=self.file, line=mark.line + 1 if mark else None, key=path or None)

    def convert(self, node: Node, hint: Any, path: str) -> Any:
        if isinstance(node, ScalarNode):
            if not node.tag.startswith(_T):
                self.fail(f"unsupported YAML tag {node.tag!r}", node, path)
            if self.env is not None and node.value and "${" not in node.value:
                self._warn_literal_secret(node, path)
            node = self._interpolate(node, path)
        return self._convert(node, hint, path)

    def _warn_literal_secret(self, node: ScalarNode, path: str) -> None:
        """A credential written into the file makes the file a secret: say so, with its line."""
        where = f"{self.file}:{node.start_mark.line + 1}" if self.file else "config"
        known = credentials()
        parent, _, leaf = path.rpartition(".")
        if path in known.secrets:
            var = known.secrets[path]
        elif parent in known.headers and secret_header(leaf):
            var = known.headers[parent]
        elif path.split("[", 1)[0] in known.urls and redact_url(node.value) != node.value:
            log.warning(
                "%s: %s holds a credential in its URL (%s); take the URL from the environment "
                "(${...}) so the file can be shared and read without it",
                where,
                path,
                redact_url(node.value),
            )
            return
        else:
            return
        log.warning(
            "%s: %s holds a literal secret; write ${%s} and set it in the environment, so the "
            "file can be shared and read without it",
            where,
            path,
            var,
        )

    def _convert(self, node: Node, hint: Any, path: str) -> Any:
        """Like ``convert`` for a node already interpolated."""
        if hint is Any:
            return self._construct_any(node, path)
        if hint is Duration or hint is Size:
            return self._unit(node, hint, path)
        if hasattr(hint, "__supertype__"):
            return self._convert(node, hint.__supertype__, path)
        args = union_args(hint)
        if args is not None:
            return self._union(node, args, hint, path)
        origin = typing.get_origin(hint)
        if origin is Literal:
            return self._literal(node, typing.get_args(hint), path)
        if is_section(hint):
            return self.section(node, hint, path)
        if origin in (list, tuple, Sequence) or hint in (list, tuple):
            return self._list(node, hint, origin, path)
        if origin in (dict, Mapping) or hint in (dict, Mapping):
            return self._dict(node, hint, path)
        if not isinstance(node, ScalarNode):
            self.fail(f"expected {describe_type(hint)}, got {_describe_node(node)}", node, path)
        if hint is str:
            return self._scalar_text(node, hint, path)
        if hint is bool:
            if node.tag != BOOL:
                self.fail(f"expected true or false, got {_describe_node(node)}", node, path)
            return self._construct(node, path)
        if hint is int:
            if node.tag != INT:
                self.fail(f"expected an integer, got {_describe_node(node)}", node, path)
            return self._construct(node, path)
        if hint is float:
            return self._float(node, path)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return self._enum(node, hint, path)
        if isinstance(hint, type) and issubclass(hint, PurePath):
            return hint(self._scalar_text(node, hint, path))
        raise TypeError(f"config schema type {hint!r} at {path!r} is not supported by the loader")

    # scalars

    def _interpolate(self, node: ScalarNode, path: str) -> ScalarNode:
        if self.env is None or "${" not in node.value:
            return node
        env = self.env
        substituted = False

        def replace(m: re.Match[str]) -> str:
            nonlocal substituted
            if m.group(0) == "$${":
                return "${"
            inner = m.group(1)
            if inner is None:
                self.fail("unterminated '${' (write '$${' for a literal '${')", node, path)
            name, sep, default = inner.partition(":-")
            if not _ENV_NAME.fullmatch(name):
                self.fail(f"invalid environment variable reference '${{{inner}}}'", node, path)
            substituted = True
            value = env.get(name)
            if value is None or (sep and value == ""):
                if not sep:
                    self.fail(
                        f"environment variable {name!r} is not set"
                        f" (write ${{{name}:-default}} to give a default)",
                        node,
                        path,
                    )
                return default
            return value

        text = _ENV_TOKEN.sub(replace, node.value)
        tag = _plain_tag(text) if substituted else node.tag
        return ScalarNode(
            tag, text, node.start_mark, node.end_mark, style=None if substituted else node.style
        )

    def _construct(self, node: ScalarNode, path: str) -> Any:
        try:
            return _scalar_value(node)
        except Exception as e:
            self.fail(f"invalid value {node.value!r}: {_problem(e)}", node, path)

    def _scalar_text(self, node: ScalarNode, hint: Any, path: str) -> str:
        if node.tag == NULL:
            self.fail(f"expected {describe_type(hint)}, got null", node, path)
        return str(node.value)

    def _float(self, node: ScalarNode, path: str) -> float:
        if node.tag in (INT, FLOAT):
            try:
                value = float(self._construct(node, path))
            except OverflowError:
                self.fail(f"number {node.value} is too large", node, path)
        elif node.tag == STR and node.style is None and _EXPONENT_FLOAT.fullmatch(node.value):
            value = float(node.value.replace("_", ""))  # YAML 1.1 reads 1e-6 as a string
        else:
            self.fail(f"expected a number, got {_describe_node(node)}", node, path)
        if value != value:
            self.fail("expected a number, got NaN", node, path)
        return value

    def _unit(self, node: Node, hint: Any, path: str) -> float | int:
        parse: Callable[[Any], float | int] = parse_duration if hint is Duration else parse_size
        if not isinstance(node, ScalarNode) or node.tag not in (INT, FLOAT, STR):
            self.fail(f"expected {describe_type(hint)}, got {_describe_node(node)}", node, path)
        raw = self._construct(node, path) if node.tag != STR else node.value
        try:
            return parse(raw)
        except (ValueError, OverflowError) as e:
            self.fail(str(e), node, path)

    def _literal(self, node: Node, choices: tuple[Any, ...], path: str) -> Any:
        if isinstance(node, ScalarNode):
            value = self._construct(node, path) if node.tag in (NULL, BOOL, INT, FLOAT) else node.value
            for choice in choices:
                if isinstance(choice, str) and node.tag != NULL and node.value == choice:
                    return choice
                if type(value) is type(choice) and value == choice:
                    return choice
            got = repr(node.value) if node.tag != NULL else "null"
        else:
            got = _describe_node(node)
        names = [c for c in choices if isinstance(c, str)]
        hint = _did_you_mean(node.value, names) if isinstance(node, ScalarNode) else ""
        allowed = ", ".join(repr(c) for c in choices)
        self.fail(f"must be one of {allowed} (got {got}){hint}", node, path)

    def _enum(self, node: ScalarNode, hint: type[enum.Enum], path: str) -> enum.Enum:
        for member in hint:
            if node.value in (str(member.value), member.name):
                return member
        allowed = ", ".join(repr(str(m.value)) for m in hint)
        self.fail(f"must be one of {allowed} (got {node.value!r})", node, path)

    def _construct_any(self, node: Node, path: str) -> Any:
        try:
            return _node_value(node)
        except Exception as e:
            self.fail(f"invalid value: {_problem(e)}", node, path)

    # collections

    def _union(self, node: Node, args: tuple[Any, ...], hint: Any, path: str) -> Any:
        if type(None) in args and isinstance(node, ScalarNode) and node.tag == NULL:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return self._convert(node, rest[0], path)
        for arm in rest:
            try:
                return self._convert(node, arm, path)
            except ConfigError:
                continue
        self.fail(f"expected {describe_type(hint)}, got {_describe_node(node)}", node, path)

    def _flow(self, node: Node, want: str, example: str, path: str) -> Node:
        """Override text where ``want`` is expected: the text read as a YAML flow value."""
        if not isinstance(node, _TextNode) or node.tag == NULL:
            return node
        try:
            flow = yaml.compose(node.value, Loader=yaml.SafeLoader)
        except (yaml.YAMLError, RecursionError) as e:
            self.fail(f"expected {want} as a YAML flow value such as {example}: {_problem(e)}", None, path)
        if not isinstance(flow, (SequenceNode, MappingNode)):
            self.fail(f"expected {want}, got {_describe_node(node)}: write it as {example}", None, path)
        stack: list[Node] = [flow]
        while stack:  # positions inside the one-line text would read as lines of a file
            n = stack.pop()
            n.start_mark = n.end_mark = None
            if isinstance(n, SequenceNode):
                stack.extend(n.value)
            elif isinstance(n, MappingNode):
                stack.extend(x for pair in n.value for x in pair)
        return flow

    def _list(self, node: Node, hint: Any, origin: Any, path: str) -> list[Any] | tuple[Any, ...]:
        node = self._flow(node, "a list", "[a, b]", path)
        args = typing.get_args(hint)
        item = args[0] if args else Any
        if isinstance(node, ScalarNode) and node.tag == NULL:
            items: list[Any] = []
        elif not isinstance(node, SequenceNode):
            self.fail(f"expected a list, got {_describe_node(node)}", node, path)
        else:
            items = [self.convert(child, item, f"{path}[{i}]") for i, child in enumerate(node.value)]
        return tuple(items) if origin is tuple or hint is tuple else items

    def _dict(self, node: Node, hint: Any, path: str) -> dict[Any, Any]:
        node = self._flow(node, "a mapping", "{key: value}", path)
        args = typing.get_args(hint)
        key_hint, value_hint = args if len(args) == 2 else (Any, Any)
        if isinstance(node, ScalarNode) and node.tag == NULL:
            return {}
        if not isinstance(node, MappingNode):
            self.fail(f"expected a mapping, got {_describe_node(node)}", node, path)
        out: dict[Any, Any] = {}
        for key, key_node, value_node in self.pairs(node, path):
            child = _join(path, key)
            # a key is a name: interpolated, typed, but never warned about as a secret
            key_value = self._convert(self._interpolate(key_node, child), key_hint, child)
            out[key_value] = self.convert(value_node, value_hint, child)
        return out

    def pairs(self, node: MappingNode, path: str) -> list[tuple[str, ScalarNode, Node]]:
        """Key/value pairs with ``<<`` merges applied and duplicate keys rejected."""
        explicit: dict[str, tuple[ScalarNode, Node]] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode) or key_node.tag == NULL:
                self.fail(f"keys must be plain names, got {_describe_node(key_node)}", key_node, path)
            key = key_node.value
            if key in explicit:
                first = explicit[key][0].start_mark
                where = f" (first defined on line {first.line + 1})" if first else ""
                self.fail(f"duplicate key{where}", key_node, _join(path, key))
            explicit[key] = (key_node, value_node)
        merged: dict[str, tuple[ScalarNode, Node]] = {}
        for source in merges:
            sources = source.value if isinstance(source, SequenceNode) else [source]
            for src in sources:
                if not isinstance(src, MappingNode):
                    self.fail(f"'<<' merges mappings, got {_describe_node(src)}", src, path)
                for key, key_node, value_node in self.pairs(src, path):
                    merged.setdefault(key, (key_node, value_node))
        merged.update(explicit)
        return [(key, k, v) for key, (k, v) in merged.items()]

    def section(self, node: Node, cls: type, path: str) -> Any:
        node = self._flow(node, "a section", "{key: value}", path)
        if isinstance(node, ScalarNode) and node.tag == NULL:
            return self._instantiate(cls, {}, node, path)
        if not isinstance(node, MappingNode):
            what = "a section (a mapping of keys)" if path else "a mapping of sections at the top level"
            self.fail(f"expected {what}, got {_describe_node(node)}", node, path)
        fields = {f.name: hint for f, hint in section_fields(cls)}
        meta = {f.name: f.metadata for f, _ in section_fields(cls)}
        values: dict[str, Any] = {}
        nodes: dict[str, Node] = {}
        for key, key_node, value_node in self.pairs(node, path):
            child = _join(path, key)
            if key not in fields:
                self.fail(self._unknown(key, list(fields)), key_node, child)
            values[key] = self.convert(value_node, fields[key], child)
            nodes[key] = value_node
            self._check_min(values[key], fields[key], meta[key], value_node, child)
        obj = self._instantiate(cls, values, node, path)
        problems = getattr(obj, "problems", None)
        for key, message in problems() if callable(problems) else ():
            head, _, index = key.partition("[")
            where = nodes.get(head, node)
            if isinstance(where, SequenceNode) and index.rstrip("]").isdigit():
                items = where.value
                where = items[int(index.rstrip("]"))] if int(index.rstrip("]")) < len(items) else where
            self.fail(message, where, _join(path, key))
        return obj

    def _check_min(self, value: Any, hint: Any, meta: Mapping[str, Any], node: Node, path: str) -> None:
        low = meta.get("min")
        if low is None or not isinstance(value, (int, float)) or isinstance(value, bool) or value >= low:
            return
        if meta.get("zero_off") and value == 0:
            return
        hint = strip_optional(hint)
        show: Callable[[Any], str] = {Duration: format_duration, Size: format_size}.get(hint, str)
        off = " or 0 (off)" if meta.get("zero_off") else ""
        why = ""
        if hint is Duration and ("interval" in path or "join_peers" in path or "reprobe" in path):
            why = ": a shorter interval keeps a CPU core busy next to the rank"
        self.fail(f"must be at least {show(low)}{off} (got {show(value)}){why}", node, path)

    @staticmethod
    def _unknown(key: str, names: list[str]) -> str:
        hint = _did_you_mean(key, names)
        head = key.split(".", 1)[0]
        if not hint and "." in key and head in names:
            hint = f" (dotted keys are not expanded here; nest it under '{head}:')"
        if not hint:
            hint = f"; valid keys: {', '.join(names)}" if names else "; this section takes no keys"
        return f"unknown key{hint}"

    def _instantiate(self, cls: type, values: dict[str, Any], node: Node, path: str) -> Any:
        for f, _ in section_fields(cls):
            if (
                f.name not in values
                and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING
            ):
                self.fail("missing required key", node, _join(path, f.name))
        try:
            return cls(**values)
        except (ValueError, TypeError) as e:
            self.fail(str(e), node, path)


# -- entry points -------------------------------------------------------------------------


def _parse_yaml(text: str, file: str) -> Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        detail = ", ".join(str(p) for p in (e.context, e.problem) if p)
        raise ConfigError(
            f"invalid YAML: {detail}", file=file, line=mark.line + 1 if mark else None
        ) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character[:1] or b"?")
        raise ConfigError(
            f"invalid YAML: character U+{code:04X} is not allowed", file=file, line=line
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}", file=file) from None
    except RecursionError:
        raise ConfigError("invalid YAML: nested too deeply", file=file) from None


def _build(node: Node | None, cls: type, file: str | None, env: Mapping[str, str] | None) -> Any:
    if node is None or (isinstance(node, ScalarNode) and node.tag == NULL):
        return cls()
    try:
        return _Builder(file, env).section(node, cls, "")
    except RecursionError:
        raise ConfigError("nested too deeply (a recursive alias?)", file=file) from None


def config_from_yaml(text: str, *, source: str = "<string>", env: Mapping[str, str] | None = None) -> Config:
    """Validate YAML text; ``env`` defaults to ``os.environ`` for ``${VAR}`` interpolation."""
    text = text.removeprefix("\ufeff")
    cfg: Config = _build(_parse_yaml(text, source), Config, source, os.environ if env is None else env)
    return cfg


def load_config(path: str | os.PathLike[str] | None, *, env: Mapping[str, str] | None = None) -> Config:
    """The effective configuration: defaults when ``path`` is None, else the validated file."""
    if path is None:
        return Config()
    file = os.fsdecode(path)
    try:
        data = Path(file).read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", file=file) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a file", file=file) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}", file=file) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})", file=file, line=line
        ) from None
    return config_from_yaml(text, source=file, env=env)


class _Text(str):
    """An override given as text (a CLI flag): typed like an unquoted YAML scalar, or read as
    a YAML flow value where a list or a mapping is expected (``_TextNode``)."""

    __slots__ = ()


class _TextNode(ScalarNode):
    """A scalar made from override text (``--set KEY=VALUE``). Where the schema wants a list,
    a mapping or a section, the text is read as a YAML flow value (``[a, b]``, ``{k: v}``);
    anywhere else it is the plain scalar, so a regex or a channel name starting with ``[`` or
    ``#`` stays the text it is."""


def _to_node(value: Any, path: str, source: str) -> Node:
    if isinstance(value, enum.Enum):
        return _to_node(value.value, path, source)
    if isinstance(value, _Text):
        return _TextNode(_plain_tag(str(value)), str(value))
    if isinstance(value, Mapping):
        pairs = [
            (_to_node(k, path, source), _to_node(v, _join(path, str(k)), source)) for k, v in value.items()
        ]
        return MappingNode(_T + "map", pairs)
    if isinstance(value, (list, tuple)):
        return SequenceNode(_T + "seq", [_to_node(v, f"{path}[{i}]", source) for i, v in enumerate(value)])
    if value is None:
        return ScalarNode(NULL, "null")
    if isinstance(value, bool):
        return ScalarNode(BOOL, "true" if value else "false")
    if isinstance(value, int):
        return ScalarNode(INT, str(int(value)))
    if isinstance(value, float):
        return ScalarNode(FLOAT, repr(float(value)))
    if isinstance(value, (str, os.PathLike)):
        return ScalarNode(STR, os.fspath(value), style='"')
    raise ConfigError(f"unsupported value type {type(value).__name__}", file=source, key=path or None)


def config_from_dict(data: Mapping[str, Any], *, source: str = "<dict>") -> Config:
    """Validate plain Python data (no line numbers, no ``${VAR}`` interpolation)."""
    cfg: Config = _from_plain(data, Config, source)
    return cfg


def _from_plain(data: Any, cls: type, source: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"the top level must be a mapping, got {type(data).__name__}", file=source)
    return _build(_to_node(data, "", source), cls, source, None)


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f, _ in section_fields(type(value))}
    if isinstance(value, Mapping):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _as_text(value: Any) -> Any:
    if isinstance(value, str):
        return _Text(value)
    if isinstance(value, Mapping):
        return {k: _as_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_text(v) for v in value]
    return _to_plain(value)


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = _as_text(value)


def with_overrides(cfg: Config, overrides: Mapping[str, object]) -> Config:
    """A copy of ``cfg`` with dotted keys replaced, validated like a file; mappings are merged.

    String values are read as unquoted YAML scalars, so CLI text such as ``"50"``, ``"off"``
    or ``"2s"`` types itself as it would in a file; other values must already have the type.
    """
    source = "<overrides>"
    plain = _to_plain(cfg)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if not all(parts):
            raise ConfigError("invalid dotted key", file=source, key=dotted)
        target = plain
        for i, part in enumerate(parts[:-1]):
            nxt = target.get(part)
            if nxt is None:
                nxt = target[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])!r} is not a section", file=source, key=dotted)
            target = nxt
        _merge(target, {parts[-1]: value})
    out: Config = _from_plain(plain, type(cfg), source)
    return out


def parse_override(text: str) -> tuple[str, object]:
    """``"detectors.warmup_steps=10"`` -> ``("detectors.warmup_steps", 10)``, the value read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"expected KEY=VALUE, got {text!r}", file="<overrides>")
    try:
        return key, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid value {raw!r}: {e}", file="<overrides>", key=key) from None
