"""Hugging Face Trainer step time from tqdm's elapsed clock, evaluations and early bars.

The logs are written the way a Trainer run with ``logging_steps=1`` and periodic
evaluation leaves them in one file: tqdm's bar redrawn with ``\\r`` (its rate an
exponential moving average, smoothing 0.3), ``tqdm.write`` clearing the bar for each log
dict, and the evaluation bar (``leave=False``) drawn between training steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.records import StepRecord
from rankwatch.sources.logparser import LogParser
from rankwatch.sources.parsers._bars import BarClock, elapsed_s

pytestmark = pytest.mark.unit


def _interval(t: float) -> str:
    mins, s = divmod(int(t), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class _Tqdm:
    """What tqdm writes for one bar on a non-tty stream (format_meter, default format)."""

    def __init__(self, total: int, start: float) -> None:
        self.total, self.start, self.n = total, start, 0
        self.last_t, self.last_n = start, 0
        self.dn = self.dt = 0.0
        self.calls = 0

    def update(self, now: float) -> str:
        self.n += 1
        dn, dt = self.n - self.last_n, now - self.last_t
        self.dn, self.dt = 0.3 * dn + 0.7 * self.dn, 0.3 * dt + 0.7 * self.dt
        self.calls += 1
        self.last_t, self.last_n = now, self.n
        return self.draw(now)

    def draw(self, now: float) -> str:
        frac = self.n / self.total
        cells = int(frac * 10)
        bar = "█" * cells + " " * (10 - cells)
        head = f"\r{frac * 100:3.0f}%|{bar}| {self.n}/{self.total} [{_interval(now - self.start)}<"
        if not self.calls:
            return head + "?, ?it/s]"
        rate = self.dn / self.dt  # tqdm's EMA of dn over its EMA of dt (the bias terms cancel)
        speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
        return head + f"{_interval((self.total - self.n) / rate)}, {speed}]"


def hf_log(
    path: Path, *, steps: int = 1200, eval_every: int = 200, eval_s: float = 60.0, slow_from: int = 0
) -> None:
    rnd = random.Random(7)
    now = 0.0
    train = _Tqdm(steps, now)
    out = [train.draw(now)]
    for step in range(1, steps + 1):
        dt = 0.65 * rnd.uniform(0.95, 1.05) * (3.0 if slow_from and step >= slow_from else 1.0)
        now += dt
        bar = train.update(now)
        loss = 1.6 - step / steps * 0.6 + rnd.uniform(-0.05, 0.05)
        record = (
            f"{{'loss': '{loss:.4g}', 'grad_norm': '{rnd.uniform(0.5, 1.0):.4g}', "
            f"'learning_rate': '{2e-5:.4g}', 'epoch': '{step / 400:.4g}'}}"
        )
        out.append(bar + "\r" + " " * len(bar) + "\r" + record + "\n" + bar)
        if eval_every and step % eval_every == 0:
            ev = _Tqdm(63, now)
            parts = [ev.draw(now)]
            for _ in range(63):
                now += eval_s / 63
                parts.append(ev.update(now))
            parts.append("\r" + " " * 60 + "\r")
            out.append("".join(parts))
            out.append(
                f"{{'eval_loss': '{1.05 + rnd.uniform(-0.02, 0.02):.4g}', 'eval_runtime': '{eval_s:.1f}', "
                f"'eval_samples_per_second': '8.4', 'eval_steps_per_second': '1.05', "
                f"'epoch': '{step / 400:.4g}'}}\n" + train.draw(now)
            )
    out.append("\n")
    path.write_text("".join(out))


def analyze_json(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict]:
    code = main(["analyze", "--json", str(path)])
    return code, json.loads(capsys.readouterr().out)


def test_healthy_run_with_evaluations_is_silent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tqdm's smoothed rate needs ~9 updates to forget a 60 s evaluation: read as a
    # throughput drop, that was one false warning after every evaluation.
    log = tmp_path / "train.log"
    hf_log(log)
    code, doc = analyze_json(capsys, log)
    assert doc["findings"] == [] and code == 0
    assert doc["ranks"][0]["format"] == "hf" and doc["ranks"][0]["steps"] == 1200


def test_a_real_slowdown_is_still_seen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    hf_log(log, slow_from=700)
    code, doc = analyze_json(capsys, log)
    assert code == 1
    (drop,) = [f for f in doc["findings"] if f["kind"] == "throughput_drop"]
    assert 700 <= drop["step"] <= 740


def test_step_time_excludes_the_evaluation(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    hf_log(log, steps=400)
    parser = LogParser(default_rank=0)
    recs: list[StepRecord] = []
    for lineno, line in enumerate(log.read_text().split("\n"), 1):
        for seg in line.split("\r"):
            recs.extend(r for r in parser.feed(seg, lineno) if isinstance(r, StepRecord))
    times = [r.step_time_s for r in recs if r.step is not None and r.step > 20]
    assert all(t is not None and 0.55 <= t <= 0.75 for t in times), times


@pytest.mark.parametrize(
    ("info", "seconds"),
    [
        ("00:25<08:00,  1.98it/s", 25),
        ("1:02:03<2:00:00,  4.00s/it", 3723),
        ("12:00, 3.61it/s", 720),
        ("00:00<?, ?it/s", 0),
        ("?, ?it/s", None),
        ("3.61it/s", None),
    ],
)
def test_elapsed_field(info: str, seconds: int | None) -> None:
    assert elapsed_s(info) == seconds


def test_bar_clock_window_and_pause() -> None:
    clock = BarClock()
    clock.update(0, "00:00<?, ?it/s")
    for n in range(1, 31):  # 0.5 s a step, the clock in whole seconds
        clock.update(n, f"00:{n // 2:02d}<05:00,  1.98it/s")
    assert clock.step_time == pytest.approx(0.5, rel=0.1)
    clock.pause()
    clock.update(31, "01:16<05:00, 12.00s/it")  # a minute of evaluation before this step
    assert clock.step_time == pytest.approx(0.5, rel=0.1), "the evaluation is not a slow step"
    for n in range(32, 62):
        clock.update(n, f"{_interval(76 + (n - 31) * 0.5)}<05:00, 3.00s/it")
    assert clock.step_time == pytest.approx(0.5, rel=0.1)


def test_bar_clock_without_elapsed_uses_the_rate() -> None:
    clock = BarClock()
    clock.update(5, "2.00it/s")
    assert (clock.n, clock.step_time) == (5, 0.5)


def feed_lines(text: str) -> list[StepRecord]:
    parser = LogParser(default_rank=0)
    out: list[StepRecord] = []
    for lineno, line in enumerate(text.split("\n"), 1):
        for seg in line.split("\r"):
            out.extend(r for r in parser.feed(seg, lineno) if isinstance(r, StepRecord))
    return out


def test_bars_before_the_format_is_known_give_the_first_step() -> None:
    # The bar for steps 1..10 comes before the first dict, which is what reveals the format.
    bars = "".join(f"\r  {n // 6}%|          | {n}/600 [00:{n // 4:02d}<02:24,  4.15it/s]" for n in range(11))
    text = (
        "***** Running training *****\n  Total optimization steps = 600\n"
        + bars
        + "\n{'loss': '3.455', 'grad_norm': '12.58', 'learning_rate': '1e-05', 'epoch': '0.05'}\n"
        + "\r  3%|          | 20/600 [00:05<02:20,  4.15it/s]\n"
        + "{'loss': '3.371', 'grad_norm': '9.53', 'learning_rate': '2e-05', 'epoch': '0.1'}\n"
    )
    recs = feed_lines(text)
    assert [(r.step, r.step_inferred, r.total_steps) for r in recs] == [(10, False, 600), (20, False, 600)]


def test_without_bars_dicts_are_counted_and_marked_inferred() -> None:
    text = "\n".join(
        f"{{'loss': '{2 - i / 10}', 'grad_norm': '0.5', 'learning_rate': '1e-05', 'epoch': '{i / 10}'}}"
        for i in range(1, 4)
    )
    recs = feed_lines("  Total optimization steps = 30\n" + text)
    # The parser cannot know the step (logging_steps is unknown): it says so, the state counts.
    assert [(r.step, r.step_inferred, r.total_steps) for r in recs] == [
        (None, True, 30),
        (None, True, 30),
        (None, True, 30),
    ]


# Printed by a real Transformers 5.23 Trainer (tests/golden/gen_hf.py hf_ls10_accum_nan40:
# logging_steps=10, 80 steps per epoch, tqdm 4.70, stdout and stderr in one file). tqdm
# redraws at most every 0.1 s: the bar before each dict lags (9, 20, 30, 40 shown before the
# dicts of steps 10, 20, 30, 40); tqdm.write clears the bar, prints the dict, redraws it.
REAL_HF_LS10 = (
    "\r  0%|          | 0/240 [00:00<?, ?it/s][transformers] `loss_type=None` was set in the config but "
    "it is unrecognized. Using the default loss: `ForCausalLMLoss`.\n"
    "\r  1%|          | 2/240 [00:00<00:20, 11.71it/s]\r  4%|▍         | 9/240 [00:00<00:12, 18.97it/s]"
    "\r                                               \r"
    "{'loss': '3.903', 'grad_norm': '0.7665', 'learning_rate': '0.0009', 'epoch': '0.125'}\n"
    "\r  4%|▍         | 10/240 [00:00<00:12, 18.97it/s]\r  8%|▊         | 18/240 [00:00<00:11, 19.47it/s]"
    "\r  8%|▊         | 20/240 [00:01<00:11, 18.49it/s]\r                                                \r"
    "{'loss': '3.904', 'grad_norm': '0.8208', 'learning_rate': '0.0009609', 'epoch': '0.25'}\n"
    "\r  8%|▊         | 20/240 [00:01<00:11, 18.49it/s]\r 12%|█▎        | 30/240 [00:01<00:12, 17.19it/s]"
    "\r                                                \r"
    "{'loss': '3.905', 'grad_norm': '0.7705', 'learning_rate': '0.0009174', 'epoch': '0.375'}\n"
    "\r 12%|█▎        | 30/240 [00:01<00:12, 17.19it/s]\r 16%|█▌        | 38/240 [00:02<00:12, 15.93it/s]"
    "\r                                                \r"
    "{'loss': '4.246', 'grad_norm': 'nan', 'learning_rate': '0.0008739', 'epoch': '0.5'}\n"
    "\r 17%|█▋        | 40/240 [00:02<00:12, 16.03it/s]"
)


def feed_to_end(text: str) -> list[StepRecord]:
    parser = LogParser(default_rank=0)
    out: list[StepRecord] = []
    for lineno, line in enumerate(text.split("\n"), 1):
        for seg in line.split("\r"):
            if seg:
                out.extend(r for r in parser.feed(seg, lineno) if isinstance(r, StepRecord))
    out.extend(r for r in parser.finish() if isinstance(r, StepRecord))
    return out


def test_real_trainer_dicts_take_the_step_tqdm_redraws_after_them() -> None:
    recs = feed_to_end(REAL_HF_LS10)
    assert [(r.step, r.step_inferred) for r in recs] == [(10, False), (20, False), (30, False), (40, False)]
    assert recs[-1].grad_norm != recs[-1].grad_norm  # the NaN, at its true global step 40


def test_without_the_redraw_the_epoch_gives_the_step() -> None:
    # The stream ends after a dict (no redraw follows): epoch 0.625 x the 80 steps per epoch
    # learnt from the dicts the bar named.
    tail = "\r                                                \r" + (
        "{'loss': '3.9', 'grad_norm': '0.8', 'learning_rate': '0.0008', 'epoch': '0.625'}\n"
    )
    recs = feed_to_end(REAL_HF_LS10 + tail)
    assert [r.step for r in recs] == [10, 20, 30, 40, 50]


def test_a_step_never_passes_the_total_nor_goes_back() -> None:
    tail = (
        "\r100%|██████████| 240/240 [00:09<00:00, 25.00it/s]\r          \r"
        "{'loss': '3.9', 'grad_norm': '0.8', 'learning_rate': '0', 'epoch': '3'}\n"
        "\r100%|██████████| 240/240 [00:09<00:00, 25.00it/s]\r          \r"
        "{'loss': '3.9', 'grad_norm': '0.8', 'learning_rate': '0', 'epoch': '3'}\n"
        "\r100%|██████████| 240/240 [00:09<00:00, 25.00it/s]\n"
    )
    steps = [r.step for r in feed_to_end(REAL_HF_LS10 + "\n" + tail)]
    assert steps[:5] == [10, 20, 30, 40, 240] and steps[5] is None  # a repeat is not step 241


def test_a_trainer_that_printed_no_loss_dict_gives_the_steps_its_bar_showed() -> None:
    # A real Transformers 5.23 Trainer with logging_strategy="no": its bar and, at the end,
    # its summary dict (which shows the log is the Trainer's).
    log = (
        "\r  0%|          | 0/30 [00:00<?, ?it/s]\n"
        "\r  3%|▎         | 1/30 [00:00<00:03,  9.07it/s]\r 20%|██        | 6/30 [00:00<00:00, 31.43it/s]"
        "\r 53%|█████▎    | 16/30 [00:00<00:00, 60.97it/s]\r 87%|████████▋ | 26/30 [00:00<00:00, 74.32it/s]"
        "\r                                               \r{'train_runtime': '0.4682', "
        "'train_samples_per_second': '128.2', 'train_steps_per_second': '64.08', 'train_loss': '3.902', "
        "'epoch': '1'}\n\r100%|██████████| 30/30 [00:00<00:00, 74.32it/s]"
        "\r100%|██████████| 30/30 [00:00<00:00, 65.04it/s]\n"
    )
    assert [(r.step, r.total_steps) for r in feed_to_end(log)] == [
        (1, 30),
        (6, 30),
        (16, 30),
        (26, 30),
        (30, 30),
    ]
    # Bars alone, with nothing that shows a Trainer printed them: no steps are made up.
    assert feed_to_end(log.split("\r                                               \r")[0]) == []
