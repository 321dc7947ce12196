"""The catalogues: the error-signature table and the error kinds.

The fast gate, the classifier's order, the fixes and the crash priority are all derived
from ``sources/signatures.SIGNATURES`` and ``errorkinds.ERROR_KINDS``. What can still go
wrong is a row that lies: a regex that matches a line none of its trigger words is in (the
gate would drop that line before the regex ever sees it, silently disabling part of the
signature). That is proved here for every regex, by generation and over the real corpora.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples, source_nodes
from rankwatch.analyze import analyze
from rankwatch.config.loader import config_from_yaml
from rankwatch.config.schema import Config, LogFormat
from rankwatch.demo import trainer
from rankwatch.detectors.crash import _PRIORITY
from rankwatch.detectors.errors import ErrorSignatureDetector
from rankwatch.errorkinds import BY_KIND, CRASH_PRIORITY, ERROR_KINDS, FIXES
from rankwatch.records import Severity
from rankwatch.sources import parsers
from rankwatch.sources.signatures import (
    GATE_WORDS,
    NOT_AN_ERROR,
    SIGNATURES,
    Hit,
    Signature,
    classify,
    gate_words,
    may_hold_signature,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
CORPORA = [
    ROOT / "tests" / "data" / "wild",
    ROOT / "tests" / "golden",
    ROOT / "tests" / ".golden-cache",  # the generated golden logs, when this checkout made them
    ROOT / "examples",
]
# Real error lines quoted by the signature tests (each with its source there).
QUOTED = [ROOT / "tests" / "test_signatures.py"]

PATTERNS = [(s, p) for s in SIGNATURES for p in s.patterns]


@functools.cache
def _corpus_lines() -> tuple[str, ...]:
    lines: list[str] = []
    for top in CORPORA:
        if not top.is_dir():
            continue
        for path in sorted(top.rglob("*")):
            if path.suffix in (".log", ".txt") and path.is_file():
                lines += path.read_text(encoding="utf-8", errors="replace").split("\n")
    for path in QUOTED:
        lines += path.read_text(encoding="utf-8").split("\n")
    return tuple(lines)


def _taken_by(line: str) -> tuple[Signature, Hit] | None:
    """The signature that names ``line`` (the first whose words admit it and whose rule hits)."""
    if NOT_AN_ERROR in line:
        return None
    for sig in SIGNATURES:
        if sig.admits(line):
            hit = sig.rule(line)
            if hit is not None:
                return sig, hit
    return None


@pytest.mark.parametrize(
    ("sig", "pattern"), PATTERNS, ids=[f"{s.name}:{i}" for i, (s, _) in enumerate(PATTERNS)]
)
@settings(max_examples=fuzz_examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_regex_match_holds_a_trigger_word(
    sig: Signature, pattern: re.Pattern[str], data: st.DataObject
) -> None:
    """A line any of a signature's regexes matches holds one of its trigger words, so it passes
    the gate: no part of a regex is dead behind a missing gate word."""
    line = data.draw(st.from_regex(pattern))
    assert any(w in line for w in sig.triggers), (sig.name, line)
    assert may_hold_signature(line), (sig.name, line)


def test_over_the_corpora_every_match_passes_the_gate() -> None:
    lines = 0
    matched = 0
    for line in _corpus_lines():
        lines += 1
        gate = may_hold_signature(line)
        for sig, pattern in PATTERNS:
            if pattern.search(line):
                matched += 1
                assert any(w in line for w in sig.triggers), (sig.name, line)
                assert gate, (sig.name, line)
        taken = _taken_by(line) if gate else None
        if taken is not None:
            sig, hit = taken
            assert hit.kind in sig.kinds and hit.severity <= sig.severity, (sig.name, hit)
        assert (taken is not None) == (classify(line) is not None), line
    assert lines > 10_000 and matched > 100, (lines, matched)


def test_a_signature_without_a_trigger_word_cannot_be_declared() -> None:
    def rule(t: str) -> Hit | None:
        return None

    for triggers in [(), ("",), ("rror", "")]:
        with pytest.raises(ValueError, match="trigger"):
            Signature(name="x", kinds=("crash",), severity=Severity.CRITICAL, triggers=triggers, rule=rule)
    with pytest.raises(ValueError, match="errorkinds"):
        Signature(name="x", kinds=("no_such_kind",), severity=Severity.CRITICAL, triggers=("x",), rule=rule)
    with pytest.raises(ValueError, match="no kind"):
        Signature(name="x", kinds=(), severity=Severity.CRITICAL, triggers=("x",), rule=rule)


def test_a_new_trigger_word_reaches_the_gate() -> None:
    """The gate is derived: a signature with a word no other one has adds that word."""

    def rule(t: str) -> Hit | None:
        return None

    new = Signature(name="x", kinds=("crash",), severity=Severity.CRITICAL, triggers=("Zorglub",), rule=rule)
    assert "Zorglub" in gate_words((*SIGNATURES, new))
    assert "Zorglub" not in GATE_WORDS


def test_the_gate_is_the_fewest_words_covering_every_trigger() -> None:
    for sig in SIGNATURES:
        for w in sig.triggers:
            assert any(g in w for g in GATE_WORDS), (sig.name, w)
    for g in GATE_WORDS:
        assert not any(h != g and h in g for h in GATE_WORDS), g
        assert may_hold_signature(f"xx {g} yy")
    assert not may_hold_signature("iter 3010: loss 2.8760, time 312.11ms, mfu 38.12%")


@pytest.mark.parametrize("sig", SIGNATURES, ids=[s.name for s in SIGNATURES])
def test_each_signature_takes_its_example(sig: Signature) -> None:
    """The table order is the classifier's: an earlier signature must not take a later one's line."""
    assert sig.example, sig.name
    taken = _taken_by(sig.example)
    assert taken is not None, sig.name
    by, hit = taken
    assert by is sig, (sig.name, by.name)
    assert classify(sig.example) == hit
    assert hit.kind in sig.kinds
    assert hit.severity <= sig.severity


def test_signature_names_are_unique() -> None:
    names = [s.name for s in SIGNATURES]
    assert len(names) == len(set(names))


def test_every_error_kind_has_a_signature_and_the_tables_derive_from_it() -> None:
    assert {k.kind for k in ERROR_KINDS} == {s.kind for s in SIGNATURES}
    assert set(BY_KIND) == set(FIXES)
    assert ErrorSignatureDetector.kinds == tuple(FIXES)
    assert _PRIORITY is CRASH_PRIORITY
    assert list(CRASH_PRIORITY.values()) == sorted(CRASH_PRIORITY.values())
    assert len(set(CRASH_PRIORITY.values())) == len(CRASH_PRIORITY)
    assert all(FIXES.values())


# --- the format registry -------------------------------------------------------------------


@pytest.mark.parametrize("name", [*parsers.FORMATS, "auto"])
def test_every_registered_format_is_a_valid_logs_format(name: str) -> None:
    """Before the registry, `logs: {format: olmo}` (and llmc) was rejected though both parse."""
    cfg = config_from_yaml(
        f"logs:\n  format: {name}\n" + ("  regex: 'loss=(?P<loss>\\S+)'\n" if name == "regex" else "")
    )
    assert cfg.logs.format == name


def test_the_schema_names_exactly_the_registered_formats() -> None:
    assert set(typing.get_args(LogFormat)) == {"auto", *parsers.FORMATS}


def test_registry_names_come_from_the_parsers() -> None:
    names = [cls.name for cls in parsers.PARSERS]
    assert len(names) == len(set(names))
    assert (*names, "regex") == parsers.FORMATS
    for name in names:
        assert parsers.make_parser(name).name == name
    assert set(names) > parsers.GENERIC


def test_the_sniff_order_is_each_parsers_declared_order() -> None:
    """Auto-detection asks the parsers by their own ``order``, not by the order their modules
    happen to be imported in: specific formats first, the generic ones (which claim lines the
    specific ones print too) after every specific one."""
    orders = [cls.order for cls in parsers.PARSERS]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert [cls.name for cls in parsers.PARSERS if cls.generic] == ["json", "kv"]
    assert min(c.order for c in parsers.PARSERS if c.generic) > max(
        c.order for c in parsers.PARSERS if not c.generic
    )
    assert parsers.sniff_format("iter 3: loss 2.5000, time 120.00ms, mfu 40.00%") == "nanogpt"


def test_a_format_name_is_registered_once() -> None:
    from rankwatch.sources.parsers.registry import register_parser

    class Twin:
        name = "kv"

    with pytest.raises(TypeError, match="'kv' is registered twice"):
        register_parser(Twin)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="other than 'auto'"):
        register_parser(type("Auto", (), {"name": "auto"}))  # type: ignore[arg-type]
    assert parsers.REGISTRY["kv"] is parsers.make_parser("kv").__class__


def test_every_sniffed_line_holds_a_hint_of_its_format() -> None:
    """Auto-detection offers a line to the sniffers only when it holds a hint: a parser whose
    sniffable lines lack its hints would never be detected on them."""
    sniffers = [(cls.name, cls.hints, cls()) for cls in parsers.PARSERS]
    seen: set[str] = set()
    for line in _corpus_lines():
        text = line.strip()
        for name, hints, parser in sniffers:
            if len(text) >= 6 and parser.sniff(text):
                seen.add(name)
                assert any(h in text for h in hints), (name, text)
    assert len(seen) >= 8, seen


def test_the_demo_trainer_writes_registered_formats() -> None:
    assert set(trainer.FORMATS) <= set(parsers.FORMATS)
    assert set(trainer.LOG_FORMATS) == set(trainer.FORMATS)
    for name, cls in trainer.LOG_FORMATS.items():
        assert cls.name == name


def test_each_example_is_detected_as_the_format_it_was_written_in() -> None:
    spec = importlib.util.spec_from_file_location("make_examples", ROOT / "examples" / "make_examples.py")
    assert spec is not None and spec.loader is not None
    make_examples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_examples)
    assert set(make_examples.FORMATS.values()) <= set(parsers.FORMATS)
    folders = {p.name for p in (ROOT / "examples").iterdir() if p.is_dir()}
    assert folders == set(make_examples.FORMATS)
    for folder, fmt in make_examples.FORMATS.items():
        logs = sorted(str(p) for p in (ROOT / "examples" / folder).glob("*.log"))
        result = analyze(logs, Config(), jobs=1)
        assert {r.format for r in result.ranks} == {fmt}, folder


def test_the_cli_takes_every_registered_format_and_names_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    """`analyze --format` is checked by the config schema: every registered format is taken,
    and a wrong one is answered with the whole list."""
    from rankwatch.cli import main

    log = str(ROOT / "tests" / "data" / "wild" / "olmo_thread_error_crash.log")
    assert main(["analyze", "--json", "--quiet", "--format", "olmo", log]) == 1
    assert '"format": "olmo"' in capsys.readouterr().out
    assert main(["analyze", "--quiet", "--format", "bogus", log]) == 2
    err = capsys.readouterr().err
    for name in ("auto", *parsers.FORMATS):
        assert f"'{name}'" in err, name


# --- the deploy rules and dashboards against the finding vocabulary ---------------------------

RULES = ROOT / "deploy" / "prometheus" / "rankwatch.rules.yml"
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
# kind="x", kind=~"a|b.*", kind!~"..." in a PromQL expression (JSON escapes its quotes).
_KIND_MATCHER = re.compile(r'\bkind\s*(=~|!~|!=|=)\s*\\?"((?:[^"\\]|\\[^"])*)\\?"')


@functools.cache
def _vocabulary() -> frozenset[str]:
    """Every finding kind the agent can emit, read from its source: the error kinds, each
    detector's declared ``kinds``/``kind``, and every ``kind="..."`` / ``finding("...")``."""
    kinds = {k.kind for k in ERROR_KINDS}
    for path in (ROOT / "agent" / "rankwatch").rglob("*.py"):
        for node in source_nodes(path):
            if isinstance(node, ast.Call):
                f = node.func
                callee = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                for kw in node.keywords:
                    if (
                        kw.arg == "kind"
                        and isinstance(kw.value, ast.Constant)
                        and callee in ("Finding", "finding")
                    ):
                        kinds.add(kw.value.value)
                if callee == "finding" and node.args and isinstance(node.args[0], ast.Constant):
                    kinds.add(node.args[0].value)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and path.parent.name == "detectors":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                value = node.value
                if "kind" in names and isinstance(value, ast.Constant):
                    kinds.add(value.value)
                if "kinds" in names and isinstance(value, ast.Tuple):
                    kinds.update(e.value for e in value.elts if isinstance(e, ast.Constant))
    return frozenset(k for k in kinds if isinstance(k, str) and k)


def _finding_alerts() -> dict[str, tuple[str, str]]:
    """alert name -> (operator, kind regex) of the rules that repeat the agents' findings."""
    doc = yaml.safe_load(RULES.read_text())
    out: dict[str, tuple[str, str]] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and "rankwatch_active_findings" in rule["expr"]:
                m = _KIND_MATCHER.search(rule["expr"])
                assert m is not None, rule["alert"]
                out[rule["alert"]] = (m[1], m[2])
    return out


def _named_kinds(text: str) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in _KIND_MATCHER.finditer(text)]


def _matches(op: str, value: str, kind: str) -> bool:
    hit = re.fullmatch(value, kind) is not None if "~" in op else value == kind
    return hit if op in ("=", "=~") else not hit


def test_the_vocabulary_is_read_from_the_source() -> None:
    vocab = _vocabulary()
    must = {"nan_loss", "stall", "crash", "oom", "xid", "gpu_lost", "ecc_error", "checkpoint_corrupt"}
    assert must | {"disk_low", "rank_lagging", "gpu_overheat", "dataloader_stall"} <= vocab


@pytest.mark.parametrize("source", [RULES, *DASHBOARDS], ids=lambda p: p.name)
def test_every_kind_a_rule_or_dashboard_names_exists(source: Path) -> None:
    vocab = _vocabulary()
    named = _named_kinds(source.read_text())
    assert named or source != RULES
    for _, value in named:
        for alt in value.split("|"):
            assert any(re.fullmatch(alt, k) for k in vocab), f"{source.name}: kind {alt!r} is no finding kind"


def test_every_finding_kind_pages_through_exactly_one_alert() -> None:
    """The catch-all RankwatchFinding excludes exactly what the dedicated alerts take."""
    alerts = _finding_alerts()
    for kind in _vocabulary():
        firing = [name for name, (op, value) in alerts.items() if _matches(op, value, kind)]
        assert len(firing) == 1, (kind, firing)


def test_each_error_kind_pages_through_the_alert_its_catalogue_row_names() -> None:
    alerts = _finding_alerts()
    for k in ERROR_KINDS:
        assert k.alert in alerts, k.kind
        op, value = alerts[k.alert]
        assert _matches(op, value, k.kind), (k.kind, k.alert)
    crash_causes = {k.kind for k in ERROR_KINDS if k.crash_priority is not None and k.kind != "xid"}
    op, value = alerts["RankwatchRankCrashed"]
    assert {k for k in crash_causes if _matches(op, value, k)} == {"oom", "cuda_error", "crash"}
