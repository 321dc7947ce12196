"""The golden corpus: logs printed by the real frameworks, made on the CPU, cached.

Each case is one run of a generator (``gen_hf.py``, ``gen_lightning.py``, ``gen_ddp.py``)
with its stdout and stderr in one file, as ``cmd > log 2>&1`` leaves them, and the JSON
truth the generator wrote from the trainer's own state. Runs are unbuffered
(``PYTHONUNBUFFERED=1``), as under ``rankwatch run`` or ``python -u``.

A case is cached under ``RANKWATCH_GOLDEN_CACHE`` (default ``tests/.golden-cache``) by a
hash of its generator's source, this file, and the versions of Python and the frameworks,
so a repeated run reuses it and a new framework version makes it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("RANKWATCH_GOLDEN_CACHE") or HERE.parent / ".golden-cache")
TIMEOUT_S = 300

# case -> generator script, and the packages whose version the log depends on.
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    **{
        c: ("gen_hf.py", ("torch", "transformers", "accelerate", "tqdm"))
        for c in (
            "hf_ls1_eval",
            "hf_ls1_nan40",
            "hf_ls10_accum_nan40",
            "hf_ls10_eval",
            "hf_notqdm_ls1",
            "hf_notqdm_ls5_nan40",
            "hf_lr5",
        )
    },
    **{
        c: ("gen_lightning.py", ("torch", "lightning", "tqdm", "rich"))
        for c in ("lightning_tqdm", "lightning_tqdm_nan30", "lightning_rich")
    },
    **{c: ("gen_ddp.py", ("torch",)) for c in ("nanogpt_ddp", "nanogpt_ddp_nan40")},
}


@dataclass(frozen=True)
class Case:
    name: str
    log: Path
    truth: dict[str, Any]

    @property
    def extra(self) -> list[Path]:
        """Other files the run left (Lightning's metrics.csv)."""
        return sorted(p for p in self.log.parent.glob(f"{self.name}.*") if p.suffix not in (".log", ".json"))


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "-"


def missing(name: str) -> list[str]:
    """Packages the case's generator needs that are not installed."""
    need = {"gen_hf.py": ("torch", "transformers", "accelerate"), "gen_lightning.py": ("torch", "lightning")}
    return [p for p in need.get(CASES[name][0], ("torch",)) if _version(p) == "-"]


def key(name: str) -> str:
    script, pkgs = CASES[name]
    h = hashlib.sha256()
    for part in ((HERE / script).read_bytes(), Path(__file__).read_bytes(), sys.version.encode()):
        h.update(part)
    for p in pkgs:
        h.update(f"{p}={_version(p)}".encode())
    return h.hexdigest()[:16]


def generate(name: str) -> Case:
    """The case, from the cache or made now (seconds: tiny models on the CPU)."""
    script = CASES[name][0]
    folder = CACHE / f"{name}-{key(name)}"
    truth = folder / f"{name}.json"
    if not truth.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "WANDB_DISABLED": "true",
        }
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        with open(tmp / f"{name}.log", "wb") as out:
            proc = subprocess.run(
                [sys.executable, str(HERE / script), name, str(tmp)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp,
                timeout=TIMEOUT_S,
            )
        if proc.returncode != 0 or not (tmp / f"{name}.json").exists():
            tail = (tmp / f"{name}.log").read_text(errors="replace")[-3000:]
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"generator {script} {name} failed ({proc.returncode}):\n{tail}")
        for junk in tmp.glob(f"{name}.out"):  # the Trainer's output_dir: no part of the case
            shutil.rmtree(junk, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:  # made meanwhile by another process: use that one
            shutil.rmtree(tmp, ignore_errors=True)
        for old in CACHE.glob(f"{name}-*"):  # made by an older generator or framework
            if old != folder and old.name[len(name) + 1 :].isalnum():
                shutil.rmtree(old, ignore_errors=True)
    return Case(name, folder / f"{name}.log", json.loads(truth.read_text()))


def generate_all(names: list[str], jobs: int = 2) -> dict[str, Case]:
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(zip(names, pool.map(generate, names), strict=True))


if __name__ == "__main__":
    for case in generate_all(sys.argv[1:] or list(CASES)).values():
        print(case.name, case.log)
