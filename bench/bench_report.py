"""``rankwatch report`` at 4,096 ranks: build time, peak memory and page size.

A real incident (tests/data/report_incidents/loader_hang: a 4-rank gloo DDP job whose rank 2's
DataLoader worker hung) is replicated to WORLD ranks in a temporary folder: rank 2 keeps its
own dump, every other rank gets the dump of the real rank with its parity (0/1/3), renumbered,
so the page has the shape of a real hang at scale (one suspect, thousands of waiting ranks in
two collectives). Then the report is built and rendered as the CLI does, in this process, and
the wall time, the process's peak RSS and the HTML's size are printed against the targets.

    python bench/bench_report.py            # 4,096 ranks
    python bench/bench_report.py --quick    # 512 ranks
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "agent"))

from rankwatch.dumps.store import DumpStore  # noqa: E402
from rankwatch.report import build_report, render_html, render_markdown  # noqa: E402

SOURCE = ROOT / "tests" / "data" / "report_incidents" / "loader_hang"
TARGET_S = 10.0
TARGET_RSS_MIB = 300.0
TARGET_HTML_BYTES = 2_000_000


def replicate(dest: Path, world: int, distinct: bool = False) -> tuple[DumpStore, object]:
    (run_dir,) = [p for p in (SOURCE / "dumps").iterdir() if p.is_dir()]
    (inc,) = [p for p in run_dir.iterdir() if p.is_dir()]
    folder = dest / run_dir.name / inc.name
    folder.mkdir(parents=True)
    docs = {r: json.loads((inc / f"rank-{r}.json").read_text()) for r in range(4)}
    for r in range(world):
        src = docs[2] if r == 2 else docs[1 if r % 2 else (0 if r % 4 == 0 else 3)]
        doc = {**src, "rank": r, "meta": {**(src.get("meta") or {}), "world_size": world}}
        if distinct:  # every rank stopped on a line of its own: as many leaves as ranks
            doc = json.loads(json.dumps(doc))
            for t in doc["threads"]:
                for f in t["frames"]:
                    if str(f.get("filename", "")).endswith("ddp_train.py"):
                        f["line"] = 1000 + r
        (folder / f"rank-{r}.json").write_text(json.dumps(doc))
    shutil.copytree(run_dir / ".ranks", dest / run_dir.name / ".ranks", dirs_exist_ok=True) if (
        run_dir / ".ranks"
    ).exists() else None
    store = DumpStore(dest)
    (info,) = store.list_incidents()
    return store, info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="512 ranks")
    ap.add_argument("--distinct", action="store_true", help="every rank's stack ends on a line of its own")
    args = ap.parse_args()
    world = 512 if args.quick else args.world
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        store, info = replicate(Path(tmp), world, args.distinct)
        written = time.perf_counter() - t
        size_on_disk = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t = time.perf_counter()
        rep = build_report(store, info)  # type: ignore[arg-type]
        built = time.perf_counter() - t
        t = time.perf_counter()
        html = render_html(rep)
        rendered = time.perf_counter() - t
        md = render_markdown(rep)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = built + rendered
    size = len(html.encode())
    print(f"ranks: {world:,} (dumps {size_on_disk / 2**20:.1f} MiB on disk, written in {written:.1f} s)")
    print(
        f"verdict: {rep.verdict.headline}; rows {len(rep.rows)}; tree nodes shown from {rep.tree.count:,} ranks"
    )
    print(f"build {built:.2f} s + render {rendered:.2f} s = {total:.2f} s (target < {TARGET_S:.0f} s): "
          f"{'PASS' if total < TARGET_S else 'MISS'}")  # fmt: skip
    print(f"peak RSS {peak:.0f} MiB (before building: {rss_before:.0f} MiB; target < {TARGET_RSS_MIB:.0f} MiB): "
          f"{'PASS' if peak < TARGET_RSS_MIB else 'MISS'}")  # fmt: skip
    print(f"HTML {size / 1e6:.2f} MB (target < 2 MB): {'PASS' if size < TARGET_HTML_BYTES else 'MISS'}; "
          f"Markdown {len(md.splitlines())} lines, {len(md)} bytes")  # fmt: skip
    return 0 if total < TARGET_S and peak < TARGET_RSS_MIB and size < TARGET_HTML_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
