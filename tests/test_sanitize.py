"""One sanitizer for every text face (issue 26 item 9): log text, argv, thread names, frame
names and locals reach a terminal, a page or a chat shown, never obeyed.

The hostile text holds what was used against on-call readers: ESC c (terminal reset),
ESC ( 0 (line drawing), DECALN (ESC # 8), OSC 52 (writes the reader's clipboard), an 8-bit
CSI, C1 NEL, bidi overrides and isolates (U+202E, U+2066) and a line separator. The
terminal faces are driven through the real CLI (``analyze``, ``run``, ``dumps show``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import free_port
from rankwatch.dumps.capture import DumpResult
from rankwatch.dumps.show import format_rank
from rankwatch.dumps.store import DumpStore, incident_name
from rankwatch.sanitize import deep, visible, visible_lines

HOSTILE = (
    "\x1bc\x1b(0\x1b#8\x1b]52;c;cm0gLXJmIC9kYXRh\x07\x9b2J\x85 \u202eatad/ fr- mr\u202c "
    "\u2066iso\u2069 \u2028sep\r\x7f"
)
_RAW = set(map(chr, [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]))
_RAW |= set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029\u200e\u200f\u061c\ufeff")


def raw(text: str) -> list[str]:
    """Every control, escape or bidi character in ``text`` (newlines and tabs are text)."""
    return [c for c in text if c in _RAW]


def readable(text: str) -> bool:
    """The hostile text is still there to read: each escape shown where it was."""
    return (
        "\u241bc\u241b(0\u241b#8" in text
        and "\u241b]52;c;cm0gLXJmIC9kYXRh\u2407" in text
        and "\\u202eatad/ fr- mr\\u202c" in text
    )


# --- the module -------------------------------------------------------------------------------
@pytest.mark.unit
def test_every_control_escape_and_bidi_character_is_shown() -> None:
    out = visible(HOSTILE)
    assert raw(out) == [] and readable(out)
    assert "\\x9b2J" in out and "\\x85" in out and "\\u2066iso\\u2069" in out and "\\u2028sep" in out
    assert out.endswith("\u240d\u2421")  # CR and DEL as their control pictures
    assert visible("a\nb") == "a\u2424b" and visible_lines("a\nb\tc") == "a\nb\tc"
    # Lone surrogates (undecodable bytes kept by surrogateescape) and zero widths too.
    assert raw(visible("x\udcff\u200b\ufeffy")) == [] and visible("x\u200by") == "x\\u200by"


@pytest.mark.unit
def test_plain_text_passes_unchanged() -> None:
    for text in ("step=1 loss=2.5", "Grüße, 東京, emoji 🙂", "tab\tkept", "<module> & [rank0]:"):
        assert visible(text) == text
    assert visible(42) == "42"
    doc = {"a\x1b": ["x\u202e", 1, None, {"b": "\x9b"}], "n": 2.5}
    assert deep(doc) == {"a\u241b": ["x\\u202e", 1, None, {"b": "\\x9b"}], "n": 2.5}


# --- console findings through the real CLI ----------------------------------------------------
def _hostile_log(path: Path) -> Path:
    path.write_text(
        "step=1 loss=2.5\n"
        "Traceback (most recent call last):\n"
        f'  File "/w/train.py", line 3, in step{HOSTILE}\n'
        f"RuntimeError: CUDA error: an illegal memory access was encountered {HOSTILE}\n"
        "step=2 loss=2.4\n"
    )
    return path


@pytest.mark.process
def test_analyze_prints_log_text_shown(tmp_path: Path) -> None:
    log = _hostile_log(tmp_path / "rank-0.log")
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "analyze", str(log)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, out.stderr
    assert "cuda_error" in out.stdout and "illegal memory access" in out.stdout
    assert raw(out.stdout) == [] and raw(out.stderr) == [], out.stdout
    assert "\u241bc\u241b(0\u241b#8" in out.stdout and "\\u202eatad/ fr- mr" in out.stdout


CHILD = r"""
import sys
h = sys.argv[1]
print("step=1 loss=2.5", flush=True)
print(f"RuntimeError: CUDA error: an illegal memory access was encountered {h}", flush=True)
sys.exit(1)
"""


@pytest.mark.process
def test_run_console_findings_show_log_text(tmp_path: Path) -> None:
    """``rankwatch run``'s console findings (stderr) quote the crash's log line shown."""
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: sanitize, rank: 0}}\nlogs: {{format: kv, poll_interval: 100ms}}\n"
        f"process: {{sample_interval: 100ms}}\ndumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}}}\nserver: {{listen: '127.0.0.1:{free_port()}'}}\n"
        f"gpu: {{enabled: false}}\nalerts: {{spool_dir: {tmp_path / 'spool'}}}\n"
    )
    (tmp_path / "child.py").write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NO_COLOR")}
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--",
         sys.executable, str(tmp_path / "child.py"), HOSTILE],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120, env=env,
    )  # fmt: skip
    console = [x for x in out.stderr.splitlines() if x.startswith("rankwatch: [")]
    assert any("CRITICAL" in x and "illegal memory access" in x for x in console), out.stderr[-3000:]
    assert raw(out.stderr) == [], out.stderr[-3000:]
    # The parser strips complete OSC and CSI sequences from what it reads; what is left shows.
    assert any("\u241bc\u241b(0\u241b#8\\x9b2J" in x and "\\u202eatad/ fr- mr" in x for x in console), console


# --- dumps show on a planted dump ---------------------------------------------------------------
def _planted(root: Path) -> str:
    """A dump whose argv, thread name, frame names, file names and locals are hostile."""
    frames = [
        {
            "name": f"forward{HOSTILE}",
            "filename": f"/w/model{HOSTILE}.py",
            "short_filename": f"model{HOSTILE}.py",
            "line": 12,
            "locals": [
                {"name": "batch", "repr": f"'{HOSTILE}'", "arg": True},
                {"name": f"x{HOSTILE}", "repr": "1", "arg": False},
            ],
        }
    ]
    threads = [
        {"pid": 100, "thread_id": 1, "os_thread_id": 100, "thread_name": "MainThread", "active": True,
         "owns_gil": False, "frames": frames},
        {"pid": 100, "thread_id": 2, "os_thread_id": 101, "thread_name": f"worker{HOSTILE}", "active": False,
         "owns_gil": False, "frames": [{"name": "wait", "filename": "/usr/lib/python3.11/threading.py",
                                        "line": 3, "locals": None}]},
    ]  # fmt: skip
    result = DumpResult(
        pid=100,
        ok=True,
        threads=threads,
        text="",
        error=None,
        duration_s=0.1,
        command=["py-spy", "dump"],
        processes=[{"pid": 100, "ppid": 1, "cmdline": f"python train.py --tag {HOSTILE}"}],
        notes=[f"note {HOSTILE}"],
    )
    incident = incident_name("stall", datetime(2026, 11, 28, 3, 0, 0, tzinfo=timezone.utc))
    DumpStore(root).write_rank("r1", incident, 0, result, {})
    failed = DumpResult(
        pid=101, ok=False, threads=[], text=f"py-spy said {HOSTILE}\nline two", error=f"ptrace {HOSTILE}",
        duration_s=0.1, command=["py-spy"],
    )  # fmt: skip
    DumpStore(root).write_rank("r1", incident, 1, failed, {})
    return incident


@pytest.mark.process
def test_dumps_show_prints_argv_threads_frames_and_locals_shown(tmp_path: Path) -> None:
    root = tmp_path / "dumps"
    incident = _planted(root)
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "dumps", "show", incident, "--all-threads", "--dir", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert raw(text) == [], text
    for where in ("--tag ", "forward", "model", "batch: '", "    x", 'Thread 101 (idle): "worker', "note ",
                  "no stacks: ptrace ", "py-spy said "):  # fmt: skip
        line = next((x for x in text.splitlines() if where in x), None)
        assert line is not None and readable(line), (where, text)
    assert "\nline two" in text  # a multi-line dump text keeps its lines
    for argv in (["dumps", "diff", incident], ["dumps", "list"]):
        out = subprocess.run(
            [sys.executable, "-m", "rankwatch", *argv, "--dir", str(root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 and raw(out.stdout + out.stderr) == [], out.stdout + out.stderr
    # The text files written at capture are read with cat: shown too.
    for txt in (root / "r1" / incident).glob("rank-*.txt"):
        assert raw(txt.read_text()) == [], txt.read_text()


@pytest.mark.unit
def test_dumps_show_renderer_keeps_its_own_colour_only(tmp_path: Path) -> None:
    root = tmp_path / "dumps"
    incident = _planted(root)
    doc = DumpStore(root).load_rank(DumpStore(root).find(incident), 0)  # type: ignore[arg-type]
    shown = format_rank(doc, color=True, fold_idle=False)
    assert shown.count("\x1b") == shown.count("\x1b[1m") + shown.count("\x1b[0m") > 0
    assert raw(shown.replace("\x1b[1m", "").replace("\x1b[0m", "")) == []


@pytest.mark.unit
def test_the_api_serves_a_dump_text_file_shown(tmp_path: Path) -> None:
    """``/api/dumps/<incident>/<rank>?format=text`` (the page's dump link) serves the text
    file as people read it, even one written raw (by an older agent, or by hand)."""
    from rankwatch.server.routes import load_dump

    root = tmp_path / "dumps"
    incident = _planted(root)
    (root / "r1" / incident / "rank-0.txt").write_text(f"Thread 1: {HOSTILE}\nline two\n")
    status, text = load_dump(DumpStore(root), incident, 0, True)
    assert status == 200 and raw(text) == [] and readable(text) and "\nline two" in text
