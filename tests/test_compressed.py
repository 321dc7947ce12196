"""Compressed logs (gzip, bzip2, xz) read as the text they hold; a cut or corrupt stream
gives what it held, with a warning; one that cannot be read is exit 2, named."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import lzma
import random
from pathlib import Path

import pytest

from faultlib import cut_reader
from rankwatch import analyze as analyze_mod
from rankwatch.analyze import analyze
from rankwatch.cli import main
from rankwatch.config.schema import Config
from rankwatch.sources import prefetch
from rankwatch.sources.compressed import UnreadableCompression, compression_of, open_decompressed
from rankwatch.sources.lines import NOISE, read_lines
from rankwatch.sources.prefetch import prefetched_lines

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def _noisy_log(n: int = 400) -> bytes:
    """Steps among NCCL noise, a tqdm-style \\r line, a NaN at step 300; values that vary as
    a real run's do (so the text compresses as a real log does, not a thousandfold)."""
    rng = random.Random(n)
    out = []
    for i in range(1, n + 1):
        loss = "nan" if i == 300 else f"{3.0 - i * 1e-4 + rng.gauss(0, 0.02):.6f}"
        out.append(
            f" iteration {i:>8}/ {n:>7} | lm loss: {loss} | grad norm: {0.45 + rng.gauss(0, 0.03):.4f} |"
        )
        out.append(
            f"node:1:2 [0] NCCL INFO AllReduce opCount {rng.getrandbits(32):x} count {rng.randrange(10**9)}"
        )
        if i % 50 == 0:
            out.append("bar 10%\rbar 20%\r")
    return ("\n".join(out) + "\n").encode()


def _without_paths(doc: dict) -> str:
    for r in doc["ranks"]:
        r.pop("path")
    for f in [f for r in doc["ranks"] for f in r["findings"]] + doc["findings"]:
        f.pop("path")
    return json.dumps(doc, sort_keys=True, default=str)


@pytest.mark.unit
@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_a_compressed_log_reads_as_its_text(tmp_path: Path, suffix: str) -> None:
    cfg = Config()
    plain = sorted((EXAMPLES / "megatron-nan").glob("rank-*.log"))
    packed = []
    for p in plain:
        q = tmp_path / (p.name + suffix)
        q.write_bytes(COMPRESS[suffix](p.read_bytes()))
        packed.append(str(q))
    assert compression_of(packed[0]) == {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}[suffix]
    want = analyze([str(p) for p in plain], cfg, jobs=1).to_json()
    got = analyze(packed, cfg, jobs=1).to_json()
    assert got["ranks"][0]["path"].endswith(suffix)
    assert got["findings"] and _without_paths(got) == _without_paths(want)


@pytest.mark.unit
def test_a_compressed_stream_cut_short_gives_what_it_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = _noisy_log(8000)
    p = tmp_path / "rank-0.log.gz"
    whole = gzip.compress(text)
    p.write_bytes(whole[: len(whole) * 3 // 4])
    with caplog.at_level(logging.WARNING, "rankwatch.compressed"):
        got = list(read_lines(open_decompressed(p, "gzip"), drop=NOISE, label=str(p)))
    assert f"{p}: the gzip stream ends early after" in caplog.text
    plain = tmp_path / "plain.log"
    plain.write_bytes(text)
    want = list(read_lines(plain, drop=NOISE))
    # Every line but the last (cut mid-line perhaps) is the text's own, in order.
    assert len(got) > len(want) // 2
    assert [(x.text, x.lineno) for x in got[:-1]] == [(x.text, x.lineno) for x in want[: len(got) - 1]]


@pytest.mark.unit
def test_a_compressed_stream_corrupt_midway_ends_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = tmp_path / "rank-0.log.xz"
    data = bytearray(lzma.compress(_noisy_log(8000)))
    data[len(data) // 2 : len(data) // 2 + 64] = b"\x00" * 64
    p.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "rankwatch.compressed"):
        res = analyze([str(p)], Config(), jobs=1)
    assert "the xz stream is corrupt" in caplog.text and str(p) in caplog.text
    assert res.ranks[0].steps > 0


@pytest.mark.unit
def test_zstd_is_named_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "rank-0.log.zst"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 32)
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}: zstd-compressed, which rankwatch cannot read" in err and f"zstd -d {p}" in err
    with pytest.raises(UnreadableCompression, match="zstd"):
        open_decompressed(p, "zstd")


@pytest.mark.unit
def test_a_folder_of_compressed_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for p in sorted((EXAMPLES / "megatron-nan").glob("rank-*.log")):
        (tmp_path / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes()))
    (tmp_path / "model.bin.gz").write_bytes(gzip.compress(b"\x00" * 10))
    (tmp_path / "rank-9.log.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    assert main(["analyze", "--json", str(tmp_path)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [Path(r["path"]).name for r in doc["ranks"]] == [f"rank-{r}.log.gz" for r in range(4)]


@pytest.mark.process
def test_the_reading_process_decompresses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A big compressed file on a spare core: the child reads and decompresses all of it."""
    text = _noisy_log(12000)
    plain = tmp_path / "plain.log"
    plain.write_bytes(text)
    p = tmp_path / "rank-0.log.bz2"
    p.write_bytes(bz2.compress(text))
    want = [(x.text, x.lineno, x.cut) for x in read_lines(plain, drop=NOISE)]
    got = list(prefetched_lines(str(p), max_line_bytes=1 << 20, compression="bzip2"))
    assert [(x.text, x.lineno, x.cut) for x in got] == want
    cfg = Config()
    alone = analyze([str(p)], cfg, jobs=1)
    monkeypatch.setattr(analyze_mod, "PREFETCH_MIN_BYTES", 0)
    monkeypatch.setattr(analyze_mod, "_cores", lambda: 2)
    both = analyze([str(p)], cfg)
    assert json.dumps(both.to_json(), default=str) == json.dumps(alone.to_json(), default=str)
    assert any(f.kind == "nan_loss" for f in both.findings)


@pytest.mark.process
def test_a_reading_process_that_dies_on_a_compressed_file_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    text = _noisy_log(12000)
    plain = tmp_path / "plain.log"
    plain.write_bytes(text)
    p = tmp_path / "rank-0.log.gz"
    p.write_bytes(gzip.compress(text))

    monkeypatch.setattr(prefetch, "_start", cut_reader(20000))
    want = [(x.text, x.lineno, x.cut) for x in read_lines(plain, drop=NOISE)]
    with caplog.at_level(logging.WARNING, "rankwatch.prefetch"):
        got = list(prefetched_lines(str(p), max_line_bytes=1 << 20, compression="gzip"))
    assert "reading the rest here" in caplog.text
    assert [(x.text, x.lineno, x.cut) for x in got] == want
