"""Where a line says how far training is, in the forms frameworks print it.

The general reader (``KvParser``) pairs a step with named numbers whatever the punctuation;
this module finds the step. Each form is one a framework prints (its provenance is in
tests/test_general_reader.py):

* OpenMMLab ``Epoch(train)  [1][ 500/2931]`` (padded, mmengine/MMDet 3) and ``Epoch [3][50/1749]``
  (mmcv), ``Iter(train) [  200/10000]``: the global iteration is (epoch - 1) x per-epoch + i.
* timm ``Train: 0 [1550/2502 (62%)]``: epoch, batch index and the last index of the epoch.
* torchtune ``1|25|Loss: 1.26``: epoch and global step before the loss.
* ``Epoch e [i/n]`` / ``Epoch e/E [i/n]`` / torchvision ``Epoch: [0]  [   10/40037]``, and a
  bare ``[i/n]`` or ``i/n`` beside a metric.

A step named by a word (``step 62``, ``iter: 19``, ``Training Iteration: 2872``) is read by the
key/value pairs themselves; a form here is only taken when no such word gives the step.

Why hand-written and not a template miner (drain3): a miner finds which tokens vary between
lines, not what they mean; which number is the step and which the loss still needs these forms
and the alias table, and a record must be read from its first line (a NaN on line 1 is the
finding), before a miner has seen enough lines to form a template. Every form here is a regex
tried only when a line holds its cue word, so the per-line cost of formats that never print
them is nil (bench/bench_analyze.py).
"""

from __future__ import annotations

import re

# OpenMMLab: "Epoch(train)  [1][ 500/2931]", "Epoch [3][50/1749]", "Iter(train) [  200/10000]".
_MM = re.compile(
    r"\b(?:(?P<e>Epoch)(?:\(train\))?\s{0,4}\[\s*(?P<ep>\d{1,9})\]\[\s*(?P<i>\d{1,12})/(?P<n>\d{1,12})\]"
    r"|Iter\(train\)\s{0,4}\[\s*(?P<it>\d{1,15})/(?P<tot>\d{1,15})\])"
)
# timm train.py: "Train: 0 [1550/2502 (62%)]" (epoch, batch index / last batch index).
_TIMM = re.compile(r"\bTrain: (?P<ep>\d{1,9}) \[\s*(?P<i>\d{1,12})/(?P<last>\d{1,12}) \(\s*\d{1,3}%\)\]")
# torchtune: "1|25|Loss: 1.26" (epoch | global step | metrics).
_TUNE = re.compile(r"(?:^|\s)(?P<ep>\d{1,9})\|(?P<st>\d{1,15})\|(?=[A-Za-z])")
# "Epoch 3 [120/500]", "Epoch 3/10 [120/500]", "epoch: 3 [120/500]", torchvision's reference
# scripts (MetricLogger) "Epoch: [0]  [   10/40037]", RTM3D-style "Epoch: [127/300][ 35/464]",
# yunjey/pytorch-tutorial's "Epoch [1/5], Step [100/600], Loss: 0.2241" (the step counts batches
# of the epoch: it starts again at each one).
_EPOCH_BRACKET = re.compile(
    r"\b[Ee]poch:?\s{0,4}\[?(?P<ep>\d{1,9})\]?(?:\s{0,2}/\s{0,2}\d{1,9}\]?)?"
    r"(?:,?\s{0,4}(?:[Ss]tep|[Ii]ter(?:ation)?|[Bb]atch):?)?\s{0,4}"
    r"\[\s*(?P<i>\d{1,12})\s{0,2}/\s{0,2}(?P<n>\d{1,12})\]"
)
# Two counters opening the line, the epoch's then the batch's: pytorch/examples dcgan/main.py's
# print('[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f ...' % (epoch, niter, i, len(dataloader), ...)).
_TWO_COUNTS = re.compile(
    r"^\s*\[\s*(?P<ep>\d{1,9})\s*/\s*\d{1,9}\s*\]\s*\[\s*(?P<i>\d{1,12})\s*/\s*(?P<n>\d{1,12})\s*\]"
)
# A bare progress count: "[120/500]" or "120/500" standing alone (not a date, path or ratio).
_BARE = re.compile(
    r"(?:^|(?<=[\s\[|(]))\[?\s{0,4}(?P<i>\d{1,12})\s{0,2}/\s{0,2}(?P<n>\d{1,12})\s{0,4}\]?(?=[\s|,:)]|$)"
)


def progress(text: str) -> tuple[float, float | None, float | None] | None:
    """(step, total steps or None, epoch or None) from a progress form, or None."""
    if "[" in text:
        if "Epoch" in text or "Iter(" in text:
            m = _MM.search(text)
            if m is not None:
                if m.group("e"):
                    per = int(m.group("n"))
                    ep = int(m.group("ep"))
                    return float(max(ep - 1, 0) * per + int(m.group("i"))), None, float(ep)
                return float(m.group("it")), float(m.group("tot")), None
        if "Train: " in text:
            m = _TIMM.search(text)
            if m is not None:
                per = int(m.group("last")) + 1
                ep = int(m.group("ep"))
                return float(ep * per + int(m.group("i"))), None, float(ep)
        if "poch" in text:
            m = _EPOCH_BRACKET.search(text)
            if m is not None:
                per = int(m.group("n"))
                ep = int(m.group("ep"))
                return float(ep * per + int(m.group("i"))), None, float(ep)
        elif "][" in text:
            m = _TWO_COUNTS.match(text)
            if m is not None:
                per = int(m.group("n"))
                ep = int(m.group("ep"))
                return float(ep * per + int(m.group("i"))), None, float(ep)
    if "|" in text:
        m = _TUNE.search(text)
        if m is not None:
            return float(m.group("st")), None, float(m.group("ep"))
    return None


def bare_count(text: str) -> tuple[float, float] | None:
    """``i/n`` standing alone on a line that names metrics: (i, n) when i <= n."""
    if "/" not in text:
        return None
    for m in _BARE.finditer(text):
        i, n = int(m.group("i")), int(m.group("n"))
        if n > 0 and i <= n:
            return float(i), float(n)
    return None


# ---------------------------------------------------------------- column tables

# Ultralytics YOLOv5/YOLOv8 print a header of column names, then one row of numbers per epoch
# (a tqdm bar redrawn behind it):
#       Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size
#        9/55      9.02G     0.1295      7.585      3.256         16        640: 100%|...
# Early YOLOv5 named the loss columns ``box obj cls`` (ultralytics/yolov5 train.py, v5.0:
# ``('%10s' * 7) % ('Epoch', 'gpu_mem', 'box', 'obj', 'cls', 'labels', 'img_size')``).
_HEADER_WORD = re.compile(r"[A-Za-z][\w()@.%/-]{0,40}")
_LEGACY_LOSS_COLUMNS = frozenset({"box", "obj", "cls", "giou", "l1", "total"})
_CELL = re.compile(r"-?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)(?:[GMK]i?B?|G)?", re.IGNORECASE)
_ROW_HEAD = re.compile(r"\s*(?P<e>\d{1,9})/(?P<E>\d{1,9})\s")


def table_header(text: str) -> list[str] | None:
    """Column names when ``text`` is a table header: an ``Epoch`` column then names only."""
    if "poch" not in text:
        return None
    words = text.split()
    if len(words) < 3 or words[0].lower() != "epoch" or len(words) > 24:
        return None
    if not all(_HEADER_WORD.fullmatch(w) for w in words):
        return None
    lower = [w.lower() for w in words]
    if not any("loss" in w for w in lower) and not (_LEGACY_LOSS_COLUMNS & set(lower) and "gpu_mem" in lower):
        return None
    return lower


def loss_columns(cols: list[str]) -> list[int]:
    """Indexes of the columns that are parts of the training loss."""
    legacy = "gpu_mem" in cols and not any("loss" in c for c in cols)
    return [
        i
        for i, c in enumerate(cols)
        if ("loss" in c and not c.startswith(("val", "eval", "test")))
        or (legacy and c in _LEGACY_LOSS_COLUMNS)
    ]


def table_row(text: str, ncols: int) -> tuple[int, int, list[str]] | None:
    """(epoch, epochs, cells) of a row under a header of ``ncols`` columns."""
    m = _ROW_HEAD.match(text)
    if m is None:
        return None
    head = text.split(":", 1)[0] if ":" in text else text
    cells = head.split()
    if len(cells) < ncols:
        return None
    cells = cells[:ncols]
    if not all(_CELL.fullmatch(c) for c in cells[1:]):
        return None
    return int(m.group("e")), int(m.group("E")), cells
