"""Stack dumps of hung ranks: py-spy capture, the incident folder layout, and cross-rank diff.

The ``capture`` function is not re-exported here: it would shadow the ``capture``
submodule; import it as ``from rankwatch.dumps.capture import capture``.

The names below are looked up on first use: a live agent imports ``capture`` and
``store`` when it captures, and never loads the ``dumps diff`` code it does not run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwatch.dumps.capture import DumpResult
    from rankwatch.dumps.diff import DiffResult, diff_incident, format_diff
    from rankwatch.dumps.show import format_rank
    from rankwatch.dumps.store import DumpStore, IncidentInfo, incident_name

_WHERE = {
    "DumpResult": "capture",
    "DiffResult": "diff",
    "diff_incident": "diff",
    "format_diff": "diff",
    "format_rank": "show",
    "DumpStore": "store",
    "IncidentInfo": "store",
    "incident_name": "store",
}
__all__ = [
    "DiffResult",
    "DumpResult",
    "DumpStore",
    "IncidentInfo",
    "diff_incident",
    "format_diff",
    "format_rank",
    "incident_name",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{where}"), name)
