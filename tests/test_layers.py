"""The pipeline of DESIGN.md, checked from the imports.

The parts of ``../shared/house.json``, each a set of packages or top-level modules:

- Types (records, events, state, identity, errorkinds, xid, snapshot) and the shared helpers
  (safeio, offloop, runfolder, sanitize, ranksets, slurm) import no part above them;
- Sources (sources, gpu, checkpoints, k8s) know nothing of rules, actions, faces or the runtime;
- Detectors (detectors, engine) see only events: no source, no I/O, no action, no runtime;
- Actions (actions, dumps, report) take findings, not the agent: no runtime;
- Faces (exporter, server) read a typed snapshot, never the runtime;
- the runtime wires the parts and never climbs into the commands (cli, analyze, top).

No two modules import each other, even lazily (an import inside a function, or one only for
type checking, is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import source_nodes

ROOT = Path(__file__).resolve().parent.parent / "agent" / "rankwatch"

CLI = ("cli", "analyze", "completion", "progress", "top", "demo")
RUNTIME = ("runtime",)
FACES = ("exporter", "server")
ACTIONS = ("actions", "dumps", "report")
DETECTORS = ("detectors", "engine")
SOURCES = ("sources", "gpu", "checkpoints", "k8s")
IO = ("safeio", "offloop", "runfolder")
ABOVE_TYPES = (*SOURCES, *DETECTORS, *ACTIONS, *FACES, *RUNTIME, *CLI)

_TYPES: dict[str, tuple[str, ...]] = {
    name: ABOVE_TYPES for name in ("records", "events", "state", "identity", "errorkinds", "xid", "snapshot")
}
_HELPERS: dict[str, tuple[str, ...]] = {
    name: ABOVE_TYPES for name in ("safeio", "offloop", "runfolder", "sanitize", "ranksets", "slurm")
}
FORBIDDEN: dict[str, tuple[str, ...]] = {
    **_TYPES,
    **_HELPERS,
    **{name: (*SOURCES, *ACTIONS, *RUNTIME, *FACES, *CLI, *IO) for name in DETECTORS},
    **{name: (*DETECTORS, *ACTIONS, *RUNTIME, *FACES, *CLI) for name in SOURCES},
    **{name: (*RUNTIME, *CLI) for name in ACTIONS},
    **{name: (*RUNTIME, *CLI) for name in FACES},
    "runtime": CLI,
    "top": (*RUNTIME, *SOURCES, *DETECTORS, *ACTIONS),  # reads the agents' API, never their insides
}

# Edges that break the rules today, each to be removed by the change that fixes it: the test
# also fails when one listed here no longer exists, so this list can only shrink.
KNOWN_LEAKS: set[tuple[str, str]] = {
    # For type checking only: the snapshot hands the faces the dump store as a handle.
    ("rankwatch.snapshot", "rankwatch.dumps.store"),
}
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every rankwatch module ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in source_nodes(path):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "rankwatch")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "rankwatch":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES else target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _leaks() -> set[tuple[str, str]]:
    out = set()
    for src, targets in GRAPH.items():
        banned = FORBIDDEN.get(_layer(src), ())
        out.update((src, t) for t in targets if _layer(t) in banned)
    return out


def _cycles() -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    counter = 0
    for root in GRAPH:
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in GRAPH:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(GRAPH[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


pytestmark = pytest.mark.unit


def test_the_walk_sees_the_package() -> None:
    assert "rankwatch.detectors.loss" in GRAPH and "rankwatch.records" in GRAPH["rankwatch.detectors.loss"]
    assert "rankwatch.engine" in GRAPH["rankwatch.analyze"]


# What may import any part: the commands, the configuration (assembled from the plugins'
# settings) and the package's entry points.
UNRULED = {"", "__main__", "cli", "analyze", "completion", "progress", "demo", "config"}


def test_every_part_of_the_package_has_a_rule() -> None:
    """A new package or top-level module is placed in a layer before it can import anything."""
    parts = {_layer(name) for name in MODULES}
    assert parts - UNRULED - set(FORBIDDEN) == set()
    assert set(FORBIDDEN) <= parts, sorted(set(FORBIDDEN) - parts)


def test_no_layer_imports_what_the_pipeline_forbids() -> None:
    leaks = _leaks()
    new = sorted(leaks - KNOWN_LEAKS)
    assert not new, "imports against the pipeline of DESIGN.md:\n" + "\n".join(f"{a} -> {b}" for a, b in new)
    gone = sorted(KNOWN_LEAKS - leaks)
    assert not gone, "fixed: remove from KNOWN_LEAKS:\n" + "\n".join(f"{a} -> {b}" for a, b in gone)


def test_no_import_cycle() -> None:
    cycles = _cycles()
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert not gone, f"fixed: remove from KNOWN_CYCLES: {gone}"


def test_the_runtime_reads_no_detectors_insides() -> None:
    """The runtime feeds a rank's engine and reads its typed readings (``RankEngine.liveness``),
    never a detector instance it looked up (``engine.detector(...)``) and then reached into."""
    found = [
        f"{name}:{node.lineno}"
        for name, path in MODULES.items()
        if _layer(name) == "runtime"
        for node in source_nodes(path)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "detector"
    ]
    assert not found, found
