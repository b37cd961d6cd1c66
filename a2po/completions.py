"""Completion tables as TRL 1.16's GRPOTrainer writes them (`log_completions`; docs/completions.md).

At each logging step a table of the latest generation's completions goes to
`output_dir/completions/completions_{step:05d}.parquet` with TRL's columns: `step`, `prompt`, `completion`, one
column per reward function, the `log_extra` columns, `advantage`; A*-PO adds `v_star` and `implicit_reward`. Its
`advantage` is r - V*, the target the implicit reward beta2 * log(pi / pi_ref) is regressed onto. pandas, datasets
and TRL's own readers load the files. `num_completions_to_print` rows are printed: a `rich` table as TRL's where
rich is installed, plain text otherwise.

pyarrow (a dependency of `datasets`) writes the files; it is imported only when a table is written.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

FIRST_COLUMNS = ("step", "prompt", "completion")  # then the rewards, the `log_extra` columns, `advantage`, ...


def completions_file(output_dir: str | os.PathLike[str], step: int) -> Path:
    """Where TRL writes the table of logging step `step`."""
    return Path(output_dir) / "completions" / f"completions_{step:05d}.parquet"


def table_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """`rows` (one dict per completion, keys in column order) as columns: every key any row has, in first-seen
    order; None where a row lacks one (a `log_extra` column logged at one step but not another)."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return {name: [row.get(name) for row in rows] for name in names}


def write_completions(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write `rows` as one parquet file (under a temporary name first, so a reader never sees half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = {}
    for name, values in table_columns(rows).items():
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # values of mixed types (a `log_extra` column): as text
            arrays[name] = pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
                                     for v in values])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    pq.write_table(pa.table(arrays), partial)
    os.replace(partial, path)
    return path


def unique_prompts(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The first row of each prompt (`log_unique_prompts`; prompts compared by their text, as TRL)."""
    seen: set[str] = set()
    kept = []
    for row in rows:
        key = str(row.get("prompt"))
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return kept


def print_completions(rows: Sequence[Mapping[str, Any]], step: int, reward_names: Sequence[str],
                      num_to_print: int | None = None, *, seed: int = 0, file: IO[str] | None = None) -> None:
    """Print `num_to_print` rows picked at random (None: all), as TRL's `print_prompt_completions_sample`: prompt,
    completion, the rewards, the advantage, then the other columns. The pick is seeded by `seed` and `step`, so it
    leaves the global random state (and so training) alone."""
    if num_to_print is not None and num_to_print <= 0:
        return
    rows = list(rows)
    if num_to_print is not None and num_to_print < len(rows):
        picked = sorted(random.Random(f"{seed}/{step}").sample(range(len(rows)), num_to_print))
        rows = [rows[i] for i in picked]
    names = dict.fromkeys(table_columns(rows))
    rewards = [n for n in reward_names if n in names]
    order = ["prompt", "completion", *rewards, "advantage"]
    columns = [n for n in order if n in names] + [n for n in names if n not in order and n != "step"]
    headers = [n.capitalize() if n in ("prompt", "completion", "advantage") else n for n in columns]
    cells = [[_cell(row.get(n)) for n in columns] for row in rows]
    try:
        from rich.console import Console
        from rich.panel import Panel
        from rich.table import Table
    except ImportError:
        _print_plain(step, headers, cells, file or sys.stdout)
        return
    table = Table(show_header=True, header_style="bold white", expand=True)
    for name, header in zip(columns, headers):
        numeric = name == "advantage" or name in rewards
        table.add_column(header, justify="right" if numeric else "left")
    for row in cells:
        table.add_row(*row)
        table.add_section()
    Console(file=file).print(Panel(table, expand=False, title=f"Step {step}", border_style="bold white"))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.2f}"  # 2 decimals, as TRL
    if isinstance(value, list) and all(isinstance(m, Mapping) for m in value):  # a conversation
        return "\n\n".join(f"{str(m.get('role', '')).upper()}\n{m.get('content', '')}" for m in value)
    return "" if value is None else str(value)


def _print_plain(step: int, headers: list[str], cells: list[list[str]], file: IO[str]) -> None:
    print(f"--- Step {step} ---", file=file)
    for row in cells:
        for header, cell in zip(headers, row):
            print(f"{header}: {cell}", file=file)
        print(file=file)
