"""Checkpoint watching: is there a checkpoint the run can resume from, and is it clean?

A checkpoint is judged once it is complete (its files stopped changing and the
framework's completion marker exists), verified cheaply without loading tensors, and
compared with the checkpoints before it. Heavy modules load lazily so importing the
config section costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankwatch.config.schema import CheckpointConfig

if TYPE_CHECKING:
    from rankwatch.checkpoints.catalog import Catalog, Entry
    from rankwatch.checkpoints.layouts import records_from_trainer_state
    from rankwatch.checkpoints.watcher import CheckpointWatcher


_LAZY = {
    "Catalog": "rankwatch.checkpoints.catalog",
    "Entry": "rankwatch.checkpoints.catalog",
    "CheckpointWatcher": "rankwatch.checkpoints.watcher",
    "records_from_trainer_state": "rankwatch.checkpoints.layouts",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rankwatch.checkpoints' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["Catalog", "CheckpointConfig", "CheckpointWatcher", "Entry", "records_from_trainer_state"]
