"""``rankwatch top``: the rank in trouble first, from real agents (their API with the token
the agents made) and from a real Prometheus; NO_COLOR, a narrow terminal, no raw escapes."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import free_port, wait_for
from rankwatch.top import Frame, Row, render, rows_from_samples, rows_from_status, use_colour

ROOT = Path(__file__).resolve().parent.parent
ESC = "\x1b"
PORT = re.compile(r"serving metrics and API on [^\s]+:(\d+)")


def _rows() -> list[Row]:
    return [
        Row(
            "r",
            0,
            "n1",
            step=100,
            steps_per_s=2.0,
            loss=2.1,
            gpu_util=0.97,
            gpu_mem_used=70e9,
            gpu_mem_total=80e9,
        ),
        Row("r", 1, "n1", step=80, since_progress=400, stall_timeout=300, stalled=True),
        Row("r", 2, "n2", step=100, loss=math_nan(), findings=[("critical", "nan_loss")]),
        Row(
            "r",
            3,
            "n2",
            step=99,
            findings=[("warning", "throughput_drop")],
            since_progress=10,
            stall_timeout=300,
        ),
        Row("r", 4, "n2", step=100, since_progress=250, stall_timeout=300),
    ]


def math_nan() -> float:
    return float("nan")


@pytest.mark.unit
def test_the_rank_in_trouble_comes_first() -> None:
    order = [r.rank for r in sorted(_rows(), key=Row.trouble)]
    # critical, then stalled, then warning, then the one nearest its stall timeout
    assert order == [2, 1, 3, 4, 0]


@pytest.mark.unit
def test_frame_columns_colour_and_no_colour() -> None:
    rows = sorted(_rows(), key=Row.trouble)
    plain = render(Frame(rows, [], 1, time.time()), width=120, colour=False)
    assert ESC not in plain
    lines = plain.splitlines()
    assert lines[1].split()[:3] == ["RANK", "NODE", "STEP"]
    assert lines[2].split()[0] == "2" and "nan_loss" in lines[2] and "NaN" in lines[2]
    assert "STALLED" in lines[3] and "7m" in lines[3]
    assert re.search(r"\b97\b", lines[-1]) and "65.2G/74.5G" in lines[-1]  # rank 0: GPU%, memory
    coloured = render(Frame(rows, [], 1, time.time()), width=120, colour=True)
    assert "\x1b[1;31m" in coloured.splitlines()[2] and "\x1b[33m" in coloured.splitlines()[4]


@pytest.mark.unit
def test_no_color_and_a_pipe_turn_colour_off() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert use_colour(Tty(), {"TERM": "xterm"})
    assert not use_colour(Tty(), {"TERM": "xterm", "NO_COLOR": "1"})
    assert not use_colour(Tty(), {"TERM": "dumb"})
    assert not use_colour(io.StringIO(), {"TERM": "xterm"})


@pytest.mark.unit
def test_a_narrow_terminal_drops_columns_and_cuts_findings() -> None:
    rows = sorted(_rows(), key=Row.trouble)
    for width in (40, 60, 80):
        text = render(Frame(rows, ["http://x: HTTP 401"], 1, time.time()), width=width)
        assert all(len(ln) <= width for ln in text.splitlines()), (width, text)
        assert "FINDINGS" in text.splitlines()[1]
    narrow = render(Frame(rows, [], 1, time.time()), width=40).splitlines()
    assert "NODE" not in narrow[1] and narrow[2].split()[0] == "2"


@pytest.mark.unit
def test_log_derived_text_cannot_drive_the_terminal() -> None:
    evil = f"nan{ESC}]52;c;cm0gLXJmIC8=\x07{ESC}c\u202egnp.exe"
    row = Row(f"run{ESC}[2J", 0, f"node{ESC}(0", findings=[("critical", evil)])
    text = render(Frame([row], [f"http://h: {ESC}[31mboom"], 1, time.time()), width=200, colour=False)
    assert ESC not in text and "\u202e" not in text and "\x07" not in text
    assert "\u241b]52" in text and "\\u202e" in text  # shown: ␛ for ESC (rankwatch.sanitize)


@pytest.mark.unit
def test_rows_from_the_api_and_from_prometheus_samples_agree() -> None:
    doc = {
        "run": "j",
        "node": "n1",
        "ranks": [
            {
                "run": "j",
                "rank": 3,
                "node": "n1",
                "step": 40,
                "loss": 1.5,
                "rates": {"steps_per_s": None, "step_time_s": 0.5},
                "seconds_since_progress": 2.0,
                "stall_timeout_s": 60.0,
                "stalled": False,
                "active_findings": [{"kind": "loss_spike", "severity": "warning"}],
            }
        ],
    }
    api = rows_from_status(doc)
    labels = {"run": "j", "rank": "3", "node": "n1"}
    samples = [
        ("rankwatch_step", labels, 40.0),
        ("rankwatch_loss", labels, 1.5),
        ("rankwatch_step_duration_seconds", labels, 0.5),
        ("rankwatch_seconds_since_progress", labels, 2.0),
        ("rankwatch_stall_timeout_seconds", labels, 60.0),
        ("rankwatch_active_findings", {**labels, "kind": "loss_spike", "severity": "warning"}, 1.0),
        ("rankwatch_active_findings", {**labels, "kind": "nan_loss", "severity": "critical"}, 0.0),
        ("rankwatch_gpu_utilization_ratio", {**labels, "gpu": "0"}, 0.5),
        ("rankwatch_gpu_utilization_ratio", {**labels, "gpu": "1"}, 1.0),
    ]
    prom = rows_from_samples(samples)
    assert len(api) == len(prom) == 1
    a, p = api[0], prom[0]
    assert (a.run, a.rank, a.step, a.loss, a.steps_per_s, a.findings) == (
        p.run, p.rank, p.step, p.loss, p.steps_per_s, p.findings,
    )  # fmt: skip
    assert p.gpu_util == 0.75 and a.gpu_util is None
    assert rows_from_samples(samples, api)[0].gpu_util == 0.75  # an agent's /metrics adds the GPUs


# --- real agents -----------------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "SLURM_", "RANK"))}
    env.update(PYTHONPATH=str(ROOT / "agent"), PYTHONUNBUFFERED="1", **extra)
    return env


def _start_agents(tmp_path: Path, n: int) -> tuple[list[subprocess.Popen[bytes]], list[str], list[Path]]:
    procs, urls, logs = [], [], []
    for r in range(n):
        log = tmp_path / f"rank-{r}.log"
        log.write_text("")
        cfg = tmp_path / f"a{r}.yaml"
        cfg.write_text(
            f"run: {{name: toprun, node: node{r}, world_size: {n}, rank: {r}}}\n"
            f"dumps: {{dir: {tmp_path / 'dumps'}}}\n"
            "server: {listen: '127.0.0.1:0'}\ngpu: {enabled: false}\n"
        )
        err = tmp_path / f"agent{r}.err"
        with open(err, "wb") as fh:
            cmd = [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg), "--log", str(log)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, env=_env()))
        port = wait_for(lambda e=err: PORT.search(e.read_text(errors="replace")), 30, f"agent {r}'s port")
        urls.append(f"http://127.0.0.1:{port.group(1)}")
        logs.append(log)
    return procs, urls, logs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _top(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankwatch", "top", "--once", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(**env),
    )


def _write_steps(logs: list[Path], nan_rank: int) -> None:
    for r, log in enumerate(logs):
        with log.open("a") as fh:
            for i in range(1, 31):
                loss = "nan" if (r == nan_rank and i == 30) else f"{2.5 - i / 100:.3f}"
                fh.write(f"step={i} loss={loss} step_time=0.5\n")


@pytest.mark.process
def test_top_against_two_real_agents_with_the_token_they_made(tmp_path: Path) -> None:
    procs, urls, logs = _start_agents(tmp_path, 2)
    try:
        _write_steps(logs, nan_rank=1)

        def settled() -> str | None:
            out = _top(*urls, COLUMNS="120", NO_COLOR="1")
            return (
                out.stdout
                if out.returncode == 0 and "nan_loss" in out.stdout and " 30 " in out.stdout
                else None
            )

        text = wait_for(settled, 30, "both agents' ranks in top", interval=0.3)
        lines = text.splitlines()
        assert "run toprun" in lines[0] and "2 rank(s)" in lines[0] and "1 in trouble" in lines[0]
        first, second = lines[2].split(), lines[3].split()
        assert first[:3] == ["1", "node1", "30"] and "nan_loss" in lines[2] and "NaN" in lines[2]
        assert second[:3] == ["0", "node0", "30"] and lines[3].rstrip().endswith("ok")
        assert "2.2" in lines[3]  # the last loss, 2.5 - 0.30
        assert ESC not in text  # NO_COLOR (and a pipe)

        narrow = _top(*urls, COLUMNS="44", NO_COLOR="1")
        assert narrow.returncode == 0 and all(len(ln) <= 44 for ln in narrow.stdout.splitlines())
        assert narrow.stdout.splitlines()[2].split()[0] == "1"

        # a wrong token: the agents answer 401 and top says so (exit 1: no source answered)
        wrong = _top(*urls, "--token", "not-the-token")
        assert wrong.returncode == 1 and wrong.stdout.count("HTTP 401") == 2, wrong.stdout
        # the token file's token never goes to another host's URL
        other = _top(urls[0].replace("127.0.0.1", "localhost.invalid"))
        assert other.returncode == 1 and "HTTP 401" not in other.stdout
    finally:
        _stop(procs)


@pytest.mark.tool
def test_top_from_a_real_prometheus_scraping_the_agents(tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (Debian package prometheus)")
    procs, urls, logs = _start_agents(tmp_path, 2)
    try:
        _write_steps(logs, nan_rank=0)
        prom_port = free_port()
        targets = [u.removeprefix("http://") for u in urls]
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": [{"job_name": "rankwatch", "static_configs": [{"targets": targets}]}],
                }
            )
        )
        with open(tmp_path / "prometheus.log", "wb") as fh:
            procs.append(
                subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                    ],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                )
            )
        prom = f"http://127.0.0.1:{prom_port}"

        def settled() -> str | None:
            out = _top("--prometheus", prom, "--run", "toprun", COLUMNS="100", NO_COLOR="1")
            ok = out.returncode == 0 and "nan_loss" in out.stdout and out.stdout.count(" 30 ") == 2
            return out.stdout if ok else None

        text = wait_for(settled, 40, "both ranks in top from Prometheus", interval=0.5)
        lines = text.splitlines()
        assert (
            "2 rank(s)" in lines[0]
            and lines[2].split()[:3] == ["0", "node0", "30"]
            and "nan_loss" in lines[2]
        )
        assert lines[3].split()[:3] == ["1", "node1", "30"] and lines[3].rstrip().endswith("ok")
        assert "2" in lines[3].split()[3]  # steps/s = 1 / 0.5 s
        none = _top("--prometheus", prom, "--run", "no-such-run")
        assert none.returncode == 0 and "0 rank(s)" in none.stdout
    finally:
        _stop(procs)


@pytest.mark.unit
def test_a_launchers_own_pipeline_is_shown_but_not_counted_as_a_rank() -> None:
    """Two node agents of a 4-rank torchrun job each have a rank-less pipeline (torchrun's own
    lines): the header counts the job's 4 ranks, not 6 rows (the s39 tester's k15)."""
    rows = [Row("j", r, "n", step=10) for r in range(4)] + [Row("j", None, "n"), Row("j", None, "n2")]
    head = render(Frame(rows, [], 2, time.time()), width=120, colour=False).splitlines()[0]
    assert "4 rank(s)" in head, head
