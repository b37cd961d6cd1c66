"""CSV export of rows returned by `Store` (metrics, samples, values, ...), for the dashboard's download buttons, and
a run's samples as the rows of TRL's completion tables (`completion_table`; the files: `a2po.completions`).

Spreadsheet-safe: a text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is read by Excel,
LibreOffice and Google Sheets as a formula, so a prompt or a model completion could run `=HYPERLINK(...)` or worse
on the machine of whoever opens the file (CSV / formula injection). Such cells get a leading `'`, which
spreadsheets show as text. Numbers stay numbers (a reward of -0.5 is written as -0.5).

Big tables stream: `export_csv(store.iter_samples(run_id), path)` writes row by row, so memory stays that of one
batch of rows however long the run.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
from collections.abc import Iterable, Mapping
from typing import IO, Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
FORMULA_CHARS = frozenset(FORMULA_START)


def export_csv(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str] | IO[str] | None = None,
               columns: list[str] | None = None) -> str | int:
    """Write `rows` as CSV with one column per key; lists and dicts as JSON, and text a spreadsheet would run as a
    formula (starting with one of `FORMULA_START`) quoted with a leading `'`.

    Without `path`: returns the CSV text, with every key seen in any row as a column (in first-seen order).
    With `path` (a file name, or a text file open for writing): writes rows as they come, never holding them all,
    and returns how many it wrote. The columns are then `columns`, else the first row's keys; a later row with a
    key not among them is an error (rather than a silently dropped value).
    """
    if path is None:
        rows = list(rows)
        found: dict[str, None] = dict.fromkeys(columns or [])
        for row in rows:
            found.update(dict.fromkeys(row))
        out = io.StringIO()
        _write(rows, out, list(found))
        return out.getvalue()
    if hasattr(path, "write"):
        return _write(rows, path, columns)
    with open(path, "w", newline="", encoding="utf-8") as file:
        return _write(rows, file, columns)


def _write(rows: Iterable[Mapping[str, Any]], file: IO[str], columns: list[str] | None) -> int:
    iterator = iter(rows)
    first = next(iterator, None)
    names = list(columns) if columns is not None else list(first or [])
    expected = set(names)
    # Text quoted, numbers not: also keeps a carriage return inside a completion from ending the row (the csv
    # module quotes only the characters of its own line terminator).
    writer = csv.writer(file, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    writer.writerow(names)
    count = 0
    for row in itertools.chain([first] if first is not None else [], iterator):
        if row.keys() != expected:
            extra = set(row) - expected
            if extra:
                raise ValueError(f"A row has columns {sorted(extra)} that the CSV header {names} lacks.")
        writer.writerow([("'" + v if v[:1] in FORMULA_CHARS else v) if type(v) is str  # the cells' rule, inlined:
                         else json.dumps(v) if type(v) in (list, dict) else v  # the export's hottest line
                         for v in map(row.get, names, itertools.repeat(""))])
        count += 1
    return count


def completion_table(samples: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Stored samples (`Store.get_samples`) as rows of TRL's completion table, in TRL's column order: `step`,
    `prompt` (the question as the studio shows it), `completion`, each reward function's value and the `log_extra`
    columns (the sample's `extra`; none for samples stored before it was kept), `advantage`, and A*-PO's `v_star`
    and `implicit_reward` where the sample has them."""
    rows = []
    for sample in samples:
        row = {"step": sample["step"], "prompt": sample["prompt_text"], "completion": sample["completion"],
               **(sample.get("extra") or {}), "advantage": sample["advantage"]}
        row.update({k: sample[k] for k in ("v_star", "implicit_reward") if sample.get(k) is not None})
        rows.append(row)
    return rows
