"""``rankwatch report``: the model of an incident, its HTML page and Markdown, and its escaping.

The incidents are the real recordings kept as test data: py-spy dumps of hung 4-rank DDP jobs
(tests/data/ddp_stacks: a DataLoader deadlock, an extra barrier, each also with --native), the
Flight Recorder traces of a collective mismatch and a missing rank (tests/data/flight_recorder)
and, in tests/data/report_incidents, whole incident folders written by this agent during real
gloo runs (see its README). The browser checks live in test_report_browser.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.actions.alerts._slack import build_blocks
from rankwatch.actions.alerts.message import AlertMember, AlertMessage, render_report_link, verdict_lines
from rankwatch.cli import main
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.dumps.store import DumpStore
from rankwatch.identity import Identity
from rankwatch.records import Diagnosis, Finding, FirstFailure, Severity, StepRecord
from rankwatch.report import build_report, render_html, render_markdown
from rankwatch.report.escape import h, md
from rankwatch.report.model import MAX_ROWS, Report
from rankwatch.runtime.agent import Agent

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data"
STACKS = DATA / "ddp_stacks"
FLIGHT = DATA / "flight_recorder"
WHEN = "20261125T135811Z"
# Every tag a report may hold: anything else came from unescaped input.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "h3", "p", "strong", "code",
    "span", "section", "div", "ul", "li", "table", "tr", "th", "td", "a", "br", "i", "details", "summary",
    "pre", "dl", "dt", "dd", "svg", "g", "rect", "line", "text", "circle", "path",
}  # fmt: skip


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.extend(attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def incident(tmp_path: Path, source: Path, name: str, run: str = "job1") -> tuple[DumpStore, Any]:
    folder = tmp_path / "dumps" / run / name
    shutil.copytree(source, folder)
    store = DumpStore(tmp_path / "dumps")
    return store, store.find(name, run=run)


def report_of(tmp_path: Path, case: str) -> Report:
    store, info = incident(tmp_path, STACKS / case, f"{WHEN}_stall")
    return build_report(store, info)


def _tags(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    return p


# --- the verdict on real recordings --------------------------------------------------------
@pytest.mark.parametrize("case", ["loader_hang", "loader_hang_native"])
def test_loader_hang_names_rank_2_what_it_does_and_its_peers_as_consequences(
    tmp_path: Path, case: str
) -> None:
    rep = report_of(tmp_path, case)
    v = rep.verdict
    assert v.suspects == [2] and v.kind == "not_in_collective"
    assert v.suspect_doing is not None and "in data loading" in v.suspect_doing
    assert v.suspect_worker is not None and "read_shard_forever" in v.suspect_worker
    assert any("ranks 0,1,3 (3) wait for it" in c and "consequence" in c for c in v.consequences)
    assert v.first_failure is None
    assert [r.state for r in rep.rows] == ["waiting", "waiting", "suspect", "waiting"]
    # The merged tree: every rank passes through main(), and they part there: rank 2 loads data.
    assert rep.tree.count == 4
    node = rep.tree
    while not node.label.startswith("<module>"):  # past the native frames below Python's, if any
        (node,) = node.children.values()
    (main,) = node.children.values()  # merged by function: the lines they stopped on are counted
    assert node.count == main.count == 4 and main.divergent
    assert main.label == "main (ddp_train.py: lines 109 (3), 102 (1))"
    assert rep.workers is not None and rep.workers.count == 4  # each rank's DataLoader worker
    html = render_html(rep)
    assert html.index('id="verdict"') < html.index("Timeline") < html.index("Stacks, merged")
    assert 'data-rank="2" data-ranks="2" data-state="suspect"' in html
    assert "read_shard_forever" in html and "▶" in html  # the suspect's path through its stack


def test_a_spawn_launchers_hung_worker_is_the_pages_suspect_by_pid(tmp_path: Path) -> None:
    """The page says what `dumps diff` says: the worker the others wait for, by pid."""
    v = report_of(tmp_path, "spawn_hang").verdict
    assert v.headline == "suspect: pid 15716 (spawn process 1)" and v.kind == "not_in_collective"
    assert v.suspects == []  # no rank was learned for it


def test_extra_barrier_is_a_mismatch_shown_with_both_call_sites(tmp_path: Path) -> None:
    rep = report_of(tmp_path, "barrier")
    v = rep.verdict
    assert v.kind == "collective_mismatch" and v.suspects == [0]
    sides = [(s.ranks, s.collective.split(" ")[0], s.call_site.split(" ")[0]) for s in v.mismatch]
    assert sides == [([0], "barrier", "sync_metrics"), ([1, 2, 3], "broadcast", "compute")]
    html = render_html(rep)
    assert "Collective mismatch" in html and "sync_metrics (ddp_train.py:90)" in html
    assert "compute (ddp_train.py:74)" in html
    md_text = render_markdown(rep)
    assert "sync\\_metrics" not in md_text and "sync_metrics (ddp_train.py:90)" in md_text


def test_native_frames_are_in_the_tree_where_they_were_captured(tmp_path: Path) -> None:
    with_native = render_html(report_of(tmp_path / "a", "barrier_native"))
    without = render_html(report_of(tmp_path / "b", "barrier"))
    assert 'class="n nat' in with_native and "native frames: not captured" not in with_native
    assert "native frames: not captured" in without


@pytest.mark.parametrize(
    ("case", "suspect", "words"),
    [("mismatch", 0, "collective #5 mismatch"), ("missing", 1, "never entered collective #5")],
)
def test_flight_recorder_only_incidents_name_the_rank(
    tmp_path: Path, case: str, suspect: int, words: str
) -> None:
    store, info = incident(tmp_path, FLIGHT / case, f"{WHEN}_stall")
    assert info.ranks == []  # traces only, no stacks
    rep = build_report(store, info)
    assert rep.ranks == [0, 1, 2] and rep.verdict.suspects == [suspect] and words in rep.verdict.why
    assert [r.ranks for r in rep.rows if r.state == "suspect"] == [[suspect]]
    entered = {r.ranks[0]: r.collective for r in rep.rows}
    assert entered == ({0: 5, 1: 5, 2: 5} if case == "mismatch" else {0: 5, 1: 4, 2: 5})
    assert "traces of ranks 0-2 (3)" in render_html(rep)


def test_first_failure_across_ranks_is_the_answer_and_later_failures_are_consequences(tmp_path: Path) -> None:
    store, info = incident(tmp_path, STACKS / "loader_hang", f"{WHEN}_stall")
    shared = tmp_path / "dumps" / "job1" / ".ranks"
    shared.mkdir()
    t0 = info.time.timestamp()
    records = [
        {"rank": 3, "kind": "crash", "time": t0 - 20, "how": "killed by SIGKILL", "consequence": False},
        {
            "rank": 1,
            "kind": "crash",
            "time": t0 - 15,
            "how": "Connection closed by peer",
            "consequence": True,
        },
        {"rank": 0, "kind": "crash", "time": t0 - 5000, "how": "an older incident", "consequence": False},
    ]
    for d in records:
        (shared / f"failed-{d['rank']}.json").write_text(json.dumps(d))
    (shared / "failed-9.json").write_text("{not json")
    rep = build_report(store, info)
    v = rep.verdict
    assert v.first_failure is not None and v.first_failure.rank == 3 and v.kind == "first_failure"
    assert v.suspects == [3] and "rank 3 failed first: killed by SIGKILL" in v.why
    assert any("rank 1's crash" in c and "consequence of rank 3's failure" in c for c in v.consequences)
    assert not any("older incident" in c for c in v.consequences)
    row3 = next(r for r in rep.rows if r.ranks == [3])
    assert row3.state == "suspect" and row3.failed_at == t0 - 20
    assert "First failure across ranks:</strong> rank 3, crash at" in render_html(rep)


def test_world_size_names_ranks_without_a_dump(tmp_path: Path) -> None:
    store, info = incident(tmp_path, STACKS / "loader_hang", f"{WHEN}_stall")
    rep = build_report(store, info, world_size=6)
    assert rep.missing == [4, 5]
    assert rep.verdict.not_dumped == [4, 5] and "No stack dump from:</strong> ranks 4,5 (2)" in render_html(
        rep
    )
    assert [r.state for r in rep.rows if r.ranks[0] >= 4] == ["no dump", "no dump"]


# --- what a capture records for the report -------------------------------------------------
def test_capture_records_steps_tail_findings_readings_and_settings(tmp_path: Path) -> None:
    ident = Identity(run="r1", rank=0, local_rank=0, world_size=4, node="n1")
    agent = Agent(replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")}), ident)
    log = tmp_path / "rank-0.log"
    log.touch()
    w = agent.add_watcher([log], ident)
    now = time.time()
    w._records([StepRecord(step=i, loss=2.0, time=now - 60 + i) for i in range(1, 41)])
    w.tail.extend(["step 40 loss 2.0", "RuntimeError: \x1b[31mboom\x1b[0m"])
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "no progress for 90s", step=40, time=now))
    ctx = agent._report_context(w, 0)
    assert ctx["world_size"] == 4
    assert [s for s, _ in ctx["recent_steps"]] == list(range(21, 41))
    assert ctx["log_tail"][-1].startswith("RuntimeError")
    assert [f["kind"] for f in ctx["findings"]] == ["stall"]
    assert ctx["judged_by"]["stall.floor"] == 60.0 and ctx["judged_by"]["stall.enabled"] is True
    assert len(json.dumps(ctx)) < 20_000


# --- escaping ------------------------------------------------------------------------------
HOSTILE = "<script>alert(1)</script></svg></pre><img src=x onerror=alert(2)>"
ANSI_BIDI = "\x1b[31mMain\x1b[0m\u202eThread\u2066x\x07"
MD_HOSTILE = "[click](javascript:alert(1)) <!channel> @here *bold* `code` | table ~~x~~ &amp;"


def _hostile_incident(tmp_path: Path) -> tuple[DumpStore, Any]:
    src = json.loads((STACKS / "loader_hang" / "rank-2.json").read_text())
    main_thread = next(t for t in src["threads"] if t.get("thread_name") == "MainThread")
    main_thread["thread_name"] = "MainThread"  # found as the main thread; the name below is a worker's
    frame = main_thread["frames"][0]
    frame["name"] = f"{HOSTILE}{MD_HOSTILE}"
    frame["filename"] = "/w/</svg><b>x</b>.py"
    frame["locals"] = [{"name": "<i>", "repr": HOSTILE, "arg": True}]
    for t in src["threads"]:
        if t.get("thread_name") != "MainThread":
            t["thread_name"] = ANSI_BIDI
    src["meta"] = {
        "log_tail": [HOSTILE, ANSI_BIDI, MD_HOSTILE, "Traceback (most recent call last):"],
        "findings": [
            {
                "kind": "stall<b>",
                "severity": "critical",
                "rank": 2,
                "time": None,
                "message": HOSTILE + ANSI_BIDI,
            }
        ],
        "judged_by": {"stall.floor": HOSTILE},
        "process": {"state": HOSTILE, "cpu_percent": 3.0, "rss_bytes": 2**30},
        "recent_steps": [[9, 1764079080.0], [10, 1764079081.0]],
        "last_step": 10,
    }
    folder = tmp_path / "dumps" / "job<1>" / f"{WHEN}_stall"
    shutil.copytree(STACKS / "loader_hang", folder)
    (folder / "rank-2.json").write_text(json.dumps(src))
    store = DumpStore(tmp_path / "dumps")
    return store, store.find(f"{WHEN}_stall")


def test_hostile_frames_threads_locals_and_log_lines_cannot_run_or_break_the_page(tmp_path: Path) -> None:
    store, info = _hostile_incident(tmp_path)
    rep = build_report(store, info)
    html = render_html(rep, link=lambda r: f"rank-{r}.txt")
    page = _tags(html)
    assert page.tags <= ALLOWED_TAGS, page.tags - ALLOWED_TAGS
    low = html.lower()
    assert "<script" not in low and "<img" not in low and "<b>" not in low and "<i>" not in low
    assert low.count("<svg") == low.count("</svg>") == 1 and low.count("<pre") == low.count("</pre>")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;/svg&gt;" in html  # shown, as text
    assert "\x1b" not in html and "\u202e" not in html and "\u2066" not in html and "\x07" not in html
    assert "\\u202e" in html  # the override is shown, not obeyed
    assert all(not (v or "").lower().lstrip().startswith("javascript:") for _, v in page.attrs)
    assert "stall&lt;b&gt;" in html and "Traceback" in html  # the finding and the log tail are there


def test_hostile_text_in_markdown_is_inert(tmp_path: Path) -> None:
    store, info = _hostile_incident(tmp_path)
    text = render_markdown(build_report(store, info))
    assert "<script" not in text and "\x1b" not in text and "\u202e" not in text
    assert "[click](" not in text and "<!channel>" not in text and "@here" not in text
    out = md(MD_HOSTILE + ANSI_BIDI)
    assert out.startswith("\\[click\\](javascript:alert(1)) \\<!channel\\> @\u200bhere \\*bold\\* \\`code\\`")
    assert "\\u202e" in out and "\n" not in md("a\nb\r\nc")
    assert h("</svg>\x1b[1m") == "&lt;/svg&gt;"


# --- at scale --------------------------------------------------------------------------------
def _replicate(tmp_path: Path, source: Path, world: int, distinct: bool = False) -> tuple[DumpStore, Any]:
    folder = tmp_path / "dumps" / "big" / f"{WHEN}_stall"
    folder.mkdir(parents=True)
    docs = {r: json.loads((source / f"rank-{r}.json").read_text()) for r in range(4)}
    for r in range(world):
        d = docs[2 if r == 2 else (1 if r % 2 else 0)]
        if distinct:  # each rank stopped on a line of its own
            d = json.loads(json.dumps(d))
            for t in d["threads"]:
                for f in t["frames"]:
                    if str(f.get("filename", "")).endswith("ddp_train.py"):
                        f["line"] = 1000 + r
        (folder / f"rank-{r}.json").write_text(json.dumps({**d, "rank": r}))
    store = DumpStore(tmp_path / "dumps")
    return store, store.find(f"{WHEN}_stall")


def test_at_512_ranks_rows_are_groups_and_the_page_stays_small(tmp_path: Path) -> None:
    store, info = _replicate(tmp_path, STACKS / "loader_hang", 512)
    rep = build_report(store, info)
    assert rep.rows_grouped and len(rep.rows) <= MAX_ROWS
    assert rep.rows[0].ranks == [2] and rep.rows[0].state == "suspect"
    waiting = [r for r in rep.rows if r.state == "waiting"]
    assert sorted(len(r.ranks) for r in waiting) == [255, 256]
    assert {r.label for r in waiting} == {"256 ranks: odd 1-511", "ranks 0,4-510 step 2 (255)"}
    html = render_html(rep)
    assert len(html) < 200_000
    text = render_markdown(rep)
    assert len(text.splitlines()) <= 10 and max(map(len, text.splitlines())) < 600


def test_ranks_on_lines_of_their_own_merge_by_function(tmp_path: Path) -> None:
    store, info = _replicate(tmp_path, STACKS / "loader_hang", 512, distinct=True)
    rep = build_report(store, info)
    html = render_html(rep)
    assert len(html) < 200_000
    assert "more on other lines" in html  # the lines beyond the few named are counted


# --- command line and alerts -------------------------------------------------------------------
def test_cli_writes_the_page_and_the_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    incident(tmp_path, STACKS / "loader_hang", f"{WHEN}_stall")
    out = tmp_path / "r.html"
    assert main(["report", f"{WHEN}_stall", "--dir", str(tmp_path / "dumps"), "-o", str(out)]) == 0
    page = out.read_text()
    assert "Suspect: rank 2" in page and 'href="dumps/job1/' in page  # stacks linked relative to the page
    assert main(["report", f"{WHEN}_st", "--dir", str(tmp_path / "dumps"), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1] == "**Verdict: suspect: rank 2**"
    assert main(["report", "nope", "--dir", str(tmp_path / "dumps")]) == 1


def test_report_url_template_and_the_slack_verdict_lines() -> None:
    url = render_report_link(
        "https://{node}:9478/incidents/{incident}?run={run}", "job1", 2, "stall", "2026_stall", "n1"
    )
    assert url == "https://n1:9478/incidents/2026_stall?run=job1"
    assert render_report_link("https://x/{incident}", "job1", 2, "stall", None, "n1") is None
    diagnosis = Diagnosis(
        suspects=(2,),
        verdict="not_in_collective",
        first_failure=FirstFailure(rank=3, kind="crash", how="killed by <!channel>", time=1764079080.0),
        incident="/d/job1/2026_stall",
    )
    lines = verdict_lines(diagnosis)
    assert lines[0].startswith("suspect: rank 2: the only rank not waiting")
    assert lines[1].startswith("first failure: rank 3, killed by <!channel> at 2025-11-25T")
    assert verdict_lines(None) == []
    member = AlertMember(rank=2, message="stall", starts_at=1.0, diagnosis=diagnosis)
    alert = AlertMessage("job1", "stall", Severity.CRITICAL, "firing", [member], "n1", report_url=url)
    blocks = build_blocks(alert)
    text = json.dumps(blocks)
    assert "*Verdict:* suspect: rank 2" in blocks[1]["text"]["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "Open the incident report" in text and "incidents/2026_stall" in text


def test_alerts_config_takes_report_url() -> None:
    cfg = replaced(Config(), {"alerts.report_url": "https://{node}:9478/incidents/{incident}"})
    assert cfg.alerts.report_url == "https://{node}:9478/incidents/{incident}"


# --- the status page route ---------------------------------------------------------------------
def test_incident_route_renders_the_same_report(tmp_path: Path) -> None:
    from aiohttp.test_utils import make_mocked_request

    from rankwatch.config.schema import ServerConfig
    from rankwatch.server import make_app
    from rankwatch.server.keys import CFG
    from rankwatch.server.routes import incident_page

    ident = Identity(run="job1", rank=0, local_rank=0, world_size=4, node="n1")
    agent = Agent(replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")}), ident)
    incident(tmp_path, STACKS / "loader_hang", f"{WHEN}_stall")
    app = make_app(agent, ServerConfig(token="t0ken-value-1234"))
    assert app[CFG].token

    async def go(name: str) -> Any:
        req = make_mocked_request("GET", f"/incidents/{name}", match_info={"incident": name}, app=app)
        return await incident_page(req)

    resp = asyncio.run(go(f"{WHEN}_stall"))
    assert resp.status == 200 and "default-src 'none'" in resp.headers["Content-Security-Policy"]
    assert "Suspect: rank 2" in resp.text and f"../api/dumps/{WHEN}_stall/2?format=text" in resp.text
    assert asyncio.run(go("20990101T000000Z_stall")).status == 404
    assert asyncio.run(go("..%2Fetc")).status == 400


def test_incident_route_is_behind_the_token() -> None:
    from rankwatch.server.auth import is_private_path

    assert is_private_path("/incidents/20261125T135811Z_stall") and is_private_path("/api/dumps")


# --- whole incident folders of real gloo runs (tests/data/report_incidents) --------------------
REAL = DATA / "report_incidents"


def real_report(tmp_path: Path, case: str) -> Report:
    if not (tmp_path / case).exists():
        shutil.copytree(REAL / case, tmp_path / case)
    store = DumpStore(tmp_path / case / "dumps")
    (info,) = store.list_incidents()
    return build_report(
        store,
        info,
        findings=[json.loads(x) for x in (tmp_path / case / "findings.jsonl").read_text().splitlines()],
    )


@pytest.mark.parametrize("names", ["as recorded", "as agents name them now"])
def test_real_sigkill_names_rank_3_first_and_every_peer_a_consequence(tmp_path: Path, names: str) -> None:
    if names != "as recorded":  # runtime/diagnose.py: failed-r<rank>-<microseconds>-<f|c>.json
        shutil.copytree(REAL / "sigkill", tmp_path / "renamed")
        ranks = next((tmp_path / "renamed" / "dumps").iterdir()) / ".ranks"
        for p in ranks.glob("failed-*.json"):
            doc = json.loads(p.read_text())
            how = "c" if doc.get("consequence") else "f"
            p.rename(ranks / f"failed-r{doc['rank']}-{round(doc['time'] * 1e6)}-{how}.json")
        (ranks / "failed-r7-1-f.json").write_text(json.dumps({**doc, "rank": 7}))  # outside the world
    rep = real_report(tmp_path, "sigkill" if names == "as recorded" else "renamed")
    v = rep.verdict
    assert v.kind == "first_failure" and v.suspects == [3] and "SIGKILL" in v.why
    assert rep.world_size == 4 and v.not_dumped == [3]  # it was dead when the others were dumped
    assert sum("a consequence of rank 3's failure" in c for c in v.consequences) == 3
    row3 = next(r for r in rep.rows if r.ranks == [3])
    assert row3.state == "suspect" and row3.last_step == 14 and row3.failed_at is not None
    peers = [r for r in rep.rows if r.ranks != [3]]
    assert all(r.steps and r.dumped_at and r.failed_at and r.state == "failed" for r in peers)
    assert {f["kind"] for f in rep.findings} >= {"crash", "stall"}
    assert rep.judged_by is not None and rep.judged_by["stall.floor"] == 4.0


def test_real_loader_hang_has_step_times_and_the_suspects_log_tail(tmp_path: Path) -> None:
    rep = real_report(tmp_path, "loader_hang")
    assert rep.verdict.suspects == [2] and rep.verdict.suspect_worker is not None
    row2 = next(r for r in rep.rows if r.ranks == [2])
    assert row2.last_step == 15 and len(row2.steps) >= 10
    assert row2.dumped_at is not None and row2.dumped_at > row2.steps[-1][1]  # silent, then dumped
    assert rep.log_tail_rank == 2 and rep.log_tail and any("step=" in x for x in rep.log_tail)
    html = render_html(rep)
    assert "Rank 2's log, last lines" in html and "step times: not recorded" not in html


def test_real_barrier_is_a_mismatch(tmp_path: Path) -> None:
    rep = real_report(tmp_path, "barrier")
    assert rep.verdict.kind == "collective_mismatch" and rep.verdict.suspects == [0]
    assert [s.ranks for s in rep.verdict.mismatch] == [[0], [1, 2, 3]]


def test_findings_file_is_read_from_its_end_within_the_cap(tmp_path: Path) -> None:
    from rankwatch.report.model import read_findings

    t0 = 1_764_000_000.0
    path = tmp_path / "f.jsonl"
    old = [{"kind": "old", "rank": 0, "time": t0 - 5000, "message": "x" * 200} for _ in range(50)]
    new = [{"kind": "stall", "rank": 1, "time": t0 + 1, "message": "now"}]
    path.write_text("".join(json.dumps(d) + "\n" for d in [*old, *new]) + "not json\n")
    got = read_findings(path, "job1", t0, max_bytes=600)
    assert [d["kind"] for d in got] == ["stall"]
    (tmp_path / "latest.jsonl").symlink_to(path.name)  # beside it: followed
    assert [d["kind"] for d in read_findings(tmp_path / "latest.jsonl", "job1", t0)] == ["stall"]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f.jsonl").symlink_to(path)  # out of its folder: refused
    assert read_findings(tmp_path / "elsewhere" / "f.jsonl", "job1", t0) == []


_ESC_PROPS = settings(max_examples=fuzz_examples(300), deadline=None)


@_ESC_PROPS
@given(st.text())
def test_escaped_text_never_holds_markup_or_controls(text: str) -> None:
    out = h(text)
    assert "<" not in out and ">" not in out and '"' not in out and "'" not in out
    assert not any((ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F for c in out)
    assert not any(0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in out)
    line = md(text)
    assert "\n" not in line and "\r" not in line
    bare = line.replace("\\\\", "")  # what is left once escaped backslashes are set aside
    for ch in "`*[]<>|~&":
        assert all(bare[i - 1] == "\\" for i, c in enumerate(bare) if c == ch and i > 0)
        assert not bare.startswith(ch)
