"""CSV export of rows returned by `Store` (metrics, samples, values, ...), for the dashboard's download buttons."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from typing import Any


def export_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    """CSV text with one column per key (in first-seen order); lists and dicts are written as JSON."""
    rows = list(rows)
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})
    return out.getvalue()
