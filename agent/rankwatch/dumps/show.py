"""Render py-spy JSON stacks for humans.

One renderer serves both the plain ``rank-<r>.txt`` written at capture time and the
highlighted ``rankwatch dumps show`` view, so both read the same way as py-spy's own
``dump`` output that engineers already know.

Every name in a dump (the command line, thread and function names, file names, locals) is
the job's text: each goes through ``rankwatch.sanitize`` before it reaches a terminal, so
an escape sequence in a thread name is shown (``␛]52;...``), never obeyed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rankwatch.sanitize import visible, visible_lines

_LIBRARY_RE = re.compile(r"[/\\](site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python\d+(\.\d+)?t?[/\\]")
IDLE_FILES = frozenset({"threading.py", "queue.py", "selectors.py"})
BOLD = "\x1b[1m"
RESET = "\x1b[0m"
SEPARATOR = "-" * 80


def basename(filename: str | None) -> str:
    return os.path.basename(filename or "") or "?"


def is_training_frame(frame: dict[str, Any], prefixes: Sequence[str] = ()) -> bool:
    """Training code is what the user wrote; with explicit prefixes those alone decide.

    Without prefixes, any ``.py`` outside an installed-library location counts, which is
    right for the usual ``/workspace/train.py`` layout without configuration.
    """
    filename = str(frame.get("filename") or "")
    if prefixes:
        return filename.startswith(tuple(prefixes))
    if not filename.endswith(".py") or filename.startswith("<"):
        return False
    return not _LIBRARY_RE.search(filename)


def frame_label(frame: dict[str, Any]) -> str:
    """``func (file.py:12)`` like py-spy, with the short filename py-spy computed."""
    name = visible(frame.get("name") or "?")
    short = visible(frame.get("short_filename") or basename(frame.get("filename")))
    line = frame.get("line")
    return f"{name} ({short}:{visible(line)})" if line else f"{name} ({short})"


def thread_status(thread: dict[str, Any]) -> str:
    if not thread.get("active"):
        return "idle"
    return "active+gil" if thread.get("owns_gil") else "active"


def thread_header(thread: dict[str, Any]) -> str:
    tid = thread.get("os_thread_id")
    ident = str(tid) if tid is not None else f"{int(thread.get('thread_id') or 0):#X}"
    head = f"Thread {visible(ident)} ({thread_status(thread)})"
    name = thread.get("thread_name")
    return f'{head}: "{visible(name)}"' if name else head


def is_main_thread(thread: dict[str, Any]) -> bool:
    name = thread.get("thread_name")
    if name:
        return bool(name == "MainThread")
    return bool(thread.get("os_thread_id") is not None and thread.get("os_thread_id") == thread.get("pid"))


def is_idle_thread(thread: dict[str, Any], prefixes: Sequence[str] = ()) -> bool:
    """A helper thread parked in a library wait: noise when reading a hang.

    The main thread and any thread running training code are never idle, so a user
    thread blocked on an Event stays visible.
    """
    if thread.get("active") or thread.get("owns_gil") or is_main_thread(thread):
        return False
    frames = thread.get("frames") or []
    if any(is_training_frame(f, prefixes) for f in frames):
        return False
    return not frames or basename(frames[0].get("filename")) in IDLE_FILES


def _locals_lines(frame: dict[str, Any]) -> list[str]:
    out: list[str] = []
    shown_args = shown_locals = False
    for local in frame.get("locals") or []:
        if local.get("arg") and not shown_args:
            out.append("        Arguments:")
            shown_args = True
        elif not local.get("arg") and not shown_locals:
            out.append("        Locals:")
            shown_locals = True
        out.append(f"            {visible(local.get('name'))}: {visible(local.get('repr') or '?')}")
    return out


def render_thread(
    thread: dict[str, Any], *, highlight: bool = False, color: bool = False, prefixes: Sequence[str] = ()
) -> list[str]:
    lines = [thread_header(thread)]
    for frame in thread.get("frames") or []:
        label = frame_label(frame)
        if highlight and is_training_frame(frame, prefixes):
            lines.append(f"  > {BOLD}{label}{RESET}" if color else f"  > {label}")
        else:
            lines.append(f"    {label}")
        lines.extend(_locals_lines(frame))
    return lines


def group_by_process(threads: Iterable[dict[str, Any]], default_pid: int) -> dict[int, list[dict[str, Any]]]:
    """Threads keyed by the pid py-spy recorded, in first-seen order."""
    out: dict[int, list[dict[str, Any]]] = {}
    for thread in threads:
        pid = thread.get("pid")
        out.setdefault(int(pid) if isinstance(pid, int) else default_pid, []).append(thread)
    return out


def render_threads(
    threads: Sequence[dict[str, Any]],
    *,
    pid: int,
    processes: Sequence[dict[str, Any]] = (),
    highlight: bool = False,
    color: bool = False,
    fold_idle: bool = False,
    prefixes: Sequence[str] = (),
) -> str:
    """py-spy-like text for one dump, one section per process when children were dumped."""
    info = {int(p["pid"]): p for p in processes if isinstance(p.get("pid"), int)}
    sections: list[str] = []
    for proc_pid, proc_threads in group_by_process(threads, pid).items():
        proc = info.get(proc_pid, {})
        lines = [f"Process {proc_pid}: {visible(proc.get('cmdline') or '?')}"]
        ppid = proc.get("ppid")
        parent = info.get(ppid) if proc_pid != pid and isinstance(ppid, int) else None
        if parent is not None:
            lines.append(f"Parent Process {parent['pid']}: {visible(parent.get('cmdline') or '?')}")
        lines.append("")
        idle: list[str] = []
        for thread in proc_threads:
            if fold_idle and is_idle_thread(thread, prefixes):
                name = thread.get("thread_name")
                idle.append(visible(name) if name else thread_header(thread))
                continue
            lines.extend(render_thread(thread, highlight=highlight, color=color, prefixes=prefixes))
        if idle:
            noun = "thread" if len(idle) == 1 else "threads"
            lines.append(f"+ {len(idle)} idle {noun} ({', '.join(idle)})")
        sections.append("\n".join(lines))
    return f"\n\n{SEPARATOR}\n".join(sections) + "\n"


def format_rank(
    dump: dict[str, Any],
    *,
    highlight_prefixes: Sequence[str] = (),
    fold_idle: bool = True,
    color: bool | None = None,
) -> str:
    """A stored rank dump as the on-call engineer wants it: their frames marked, idle threads folded.

    ``highlight_prefixes``, when given, are the path prefixes of training code and replace
    the site-packages heuristic. ``color`` defaults to whether stdout is a terminal.
    """
    if color is None:
        color = sys.stdout.isatty()
    rank = dump.get("rank")
    pid = dump.get("pid")
    head = f"== rank {visible(rank)} (pid {visible(pid)}) captured {visible(dump.get('captured_at') or '?')}"
    duration = dump.get("duration_s")
    if isinstance(duration, (int, float)):
        head += f" in {duration:.2f}s"
    lines = [head]
    for note in dump.get("notes") or []:
        lines.append(f"note: {visible(note)}")
    threads = dump.get("threads") or []
    if not dump.get("ok") or not threads:
        lines.append(f"no stacks: {visible(dump.get('error') or 'dump failed')}")
        if dump.get("text"):
            lines.append(visible_lines(str(dump["text"]).rstrip()))
        return "\n".join(lines) + "\n"
    body = render_threads(
        threads,
        pid=int(pid) if isinstance(pid, int) else 0,
        processes=dump.get("processes") or (),
        highlight=True,
        color=color,
        fold_idle=fold_idle,
        prefixes=highlight_prefixes,
    )
    return "\n".join(lines) + "\n" + body
