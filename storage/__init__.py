"""SQLite storage of the studio: runs, V* sets, metrics, samples, evaluations, checkpoints and logs.

`Store(path)` is the only entry point; it returns plain dicts and lists. No other package knows SQL.
"""

from storage import lifecycle
from storage.export import export_csv
from storage.lifecycle import STATUSES as RUN_STATUSES
from storage.store import Admission, LimitReached, Store

__all__ = ["lifecycle", "RUN_STATUSES", "Admission", "LimitReached",
           "Store", "export_csv"]
