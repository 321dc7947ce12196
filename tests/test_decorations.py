from __future__ import annotations

import calendar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.sources.decorations import strip

pytestmark = pytest.mark.unit

T0 = calendar.timegm((2024, 5, 1, 10, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("raw", "text", "rank", "time"),
    [
        # nothing to strip
        ("{'loss': 1.0, 'epoch': 0.1}", "{'loss': 1.0, 'epoch': 0.1}", None, None),
        ("", "", None, None),
        # ANSI colour and tqdm cursor movement
        ("\x1b[32mINFO\x1b[0m step 3", "INFO step 3", None, None),
        ("\x1b[1;33mwarn\x1b[0m", "warn", None, None),
        ("\x1b[A\x1b[A\rEpoch 1:  10%|", "\rEpoch 1:  10%|", None, None),
        # timestamps at line start
        ("2024-05-01T10:00:00.123Z {'loss': 1.0}", "{'loss': 1.0}", None, T0 + 0.123),
        ("2024-05-01 10:00:00,123 - INFO - hello", "INFO - hello", None, T0 + 0.123),
        ("[2024-05-01 10:00:00] iteration 10", "iteration 10", None, T0),
        ("[2024-05-01 10:00:00,500] [INFO] [logging.py:96:log_dist] [Rank 0] step=10", None, None, T0 + 0.5),
        ("2024-05-01T10:00:00.123456789Z stdout F hello", "hello", None, T0 + 0.123456789),
        ("2024-05-01T12:00:00+02:00 x", "x", None, T0),
        ("2024-05-01T09:30:00-0030 x", "x", None, T0),
        # srun --label, torchrun --tee/--redirects, Open MPI --tag-output
        ("3: {'loss': 1.0}", "{'loss': 1.0}", 3, None),
        ("  12: hello", "hello", 12, None),
        ("[rank3]: step 1", "step 1", 3, None),
        ("[default3]:step 1", "step 1", 3, None),
        ("[default3]:[rank11]: step 1", "step 1", 11, None),
        # torchrun --role trainer: "[${role_name}${local_rank}]:" (local_elastic_agent.py)
        ("[trainer1]:step=15 loss=nan", "step=15 loss=nan", 1, None),
        ("[epoch3]: loss 2.0", "[epoch3]: loss 2.0", None, None),  # a log's own counter, no role
        ("[1,3]<stdout>:hello", "hello", 3, None),
        ('[1,5]<stderr>:  File "x.py"', '  File "x.py"', 5, None),
        # python logging prefixes
        (
            "[INFO|trainer.py:2345] 2024-05-01 10:00:00,123 >> {'loss': 2.0}",
            "{'loss': 2.0}",
            None,
            T0 + 0.123,
        ),
        ("INFO:__main__:{'loss': 2.0}", "{'loss': 2.0}", None, None),
        # combinations, in the orders launchers nest them
        ("2024-05-01T10:00:00Z [rank3]: {'loss': 1.0}", "{'loss': 1.0}", 3, T0),
        ("2024-05-01T10:00:00.5Z stdout F [default1]:[rank9]: x", "x", 9, T0 + 0.5),
        ("0: [rank3]: x", "x", 3, None),
        ("7: 2024-05-01 10:00:00,250 step", "step", 7, T0 + 0.25),
        ("\x1b[32m2024-05-01 10:00:00\x1b[0m [rank2]: hi", "hi", 2, T0),
        (
            "[1,4]<stdout>:[rank4]: Traceback (most recent call last):",
            "Traceback (most recent call last):",
            4,
            None,
        ),
        # [host:local_rank]: tags, and OLMo's "host:local_rank" after its timestamp
        ("[gpu187:1]: iteration 5", "iteration 5", 1, None),
        ("[node-a.example:0]:x", "x", 0, None),
        (
            "2024-05-01 10:00:00.250 intern-studio-160750:0\tolmo.train:908\tINFO\t[step=1/739328,epoch=0]",
            "olmo.train:908\tINFO\t[step=1/739328,epoch=0]",
            0,
            T0 + 0.25,
        ),
        ("2024-05-01 10:00:00 gpu187:3  olmo.train:908  INFO", "olmo.train:908  INFO", 3, T0),
    ],
)
def test_strip(raw: str, text: str | None, rank: int | None, time: float | None) -> None:
    got_text, got_rank, got_time = strip(raw)
    if text is not None:
        assert got_text == text
    assert got_rank == rank
    if time is None:
        assert got_time is None
    else:
        assert got_time == pytest.approx(time, abs=1e-6)


def test_deepspeed_timestamp_keeps_the_rest_of_the_line() -> None:
    text, _, _ = strip("[2024-05-01 10:00:00,500] [INFO] [logging.py:96:log_dist] [Rank 0] step=10")
    assert text == "[INFO] [logging.py:96:log_dist] [Rank 0] step=10"


@pytest.mark.parametrize(
    "raw",
    [
        " [2024-05-01 10:00:00] iteration      100/    1000 | lm loss: 2.3E+00 |",  # Megatron's own
        "[Rank 3] step=10, skipped=0",  # DeepSpeed's own marker is content
        "[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog",
        "2024-13-01 10:00:00 not a date",
        "100%|██████████| 10/10 [00:01<00:00,  9.1it/s]",
        "node01:1234:5678 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/CUMEM/read",
        "iter 100: loss 4.1234, time 123.45ms, mfu 45.67%",
        "Epoch 3: step 1",
    ],
)
def test_content_that_looks_like_a_decoration_is_kept(raw: str) -> None:
    assert strip(raw) == (raw, None, None)


@pytest.mark.parametrize(
    "raw",
    [
        # NCCL's own "host:pid:tid [dev]" is not a process tag, nor a word before a colon
        "gpu-node01:41200:41260 [0] NCCL INFO Connected all trees",
        "2024-05-01 10:00:00 Epoch:1  loss 3.2",
        "2024-05-01 10:00:00 step:10/100  loss 3.2",
        "gpu187:1: a bare tag at the start of a line is not looked for",
    ],
)
def test_host_tags_only_where_they_are(raw: str) -> None:
    text, rank, _ = strip(raw)
    assert rank is None
    assert text.endswith(raw[-15:])


def test_two_processes_of_one_host_stay_apart() -> None:
    assert strip("[gpu187:0]: step 1")[1] == 0
    assert strip("[gpu187:1]: step 1")[1] == 1


def test_traceback_indentation_survives_prefixes() -> None:
    assert (
        strip('[rank0]:   File "/w/train.py", line 3, in <module>')[0]
        == '  File "/w/train.py", line 3, in <module>'
    )
    assert strip("2024-05-01T10:00:00Z     main()")[0] == "    main()"


def test_first_timestamp_wins() -> None:
    _, _, t = strip("2024-05-01T10:00:00Z [2024-05-01 11:00:00] x")
    assert t == T0


PREFIXES = st.sampled_from(
    [
        "",
        "3: ",
        "[rank1]: ",
        "[default2]:",
        "[1,4]<stdout>:",
        "2024-05-01T10:00:00Z ",
        "\x1b[31m",
        "\x1b[",
        "[",
    ]
)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.lists(PREFIXES, max_size=5), st.text(max_size=200))
def test_strip_never_raises(prefixes: list[str], tail: str) -> None:
    text, rank, t = strip("".join(prefixes) + tail)
    assert isinstance(text, str)
    assert rank is None or rank >= 0
    assert t is None or t > 0
