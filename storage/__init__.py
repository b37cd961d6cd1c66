"""Storage of the studio: runs, V* sets, metrics, samples, evaluations, checkpoints and logs, in a SQLite file (the
default) or a PostgreSQL database (docs/cluster.md).

`Store(path_or_url)` is the only entry point; it returns plain dicts and lists. No other package knows SQL.
`python -m storage.move` carries a studio's database into another one.
"""

from storage import lifecycle
from storage.export import export_csv
from storage.lifecycle import STATUSES as RUN_STATUSES
from storage.store import Admission, LimitReached, Store

__all__ = ["lifecycle", "RUN_STATUSES", "Admission", "LimitReached",
           "Store", "export_csv"]
