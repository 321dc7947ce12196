"""Stack dumps of hung ranks: py-spy capture, the incident folder layout, and cross-rank diff.

The ``capture`` function is not re-exported here: it would shadow the ``capture``
submodule; import it as ``from rankwatch.dumps.capture import capture``.
"""

from rankwatch.dumps.capture import DumpResult
from rankwatch.dumps.diff import DiffResult, diff_incident, format_diff
from rankwatch.dumps.show import format_rank
from rankwatch.dumps.store import DumpStore, IncidentInfo, incident_name

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
