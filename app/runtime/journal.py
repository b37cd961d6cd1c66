"""A chunk's journal: how a chunk process (`app.runtime.chunks`) records a run without ever touching the database.

A chunk runs in a forked copy of the studio's process (forked mode, and every `@spaces.GPU` call on ZeroGPU). A
fork copies SQLite's process-wide locks and bookkeeping, and any mutex another thread held at that moment, so a
forked process must never open the database, even with a connection of its own. Instead:

- **Before the chunk**, the parent (the scheduler, or the page driving a ZeroGPU run) claims the run and writes the
  chunk's input, `journals/run-<id>.input.json`: the run's row, its value set id, stored V* rows and their
  sampling cost, its checkpoints and evaluations (`write_input`).
- **The chunk** reads that input and records everything a worker would write to the database (stage-1 rows, the
  run's own V* rows, metrics, samples, evaluations, checkpoints, progress, heartbeats, log lines) as JSON lines
  appended to `journals/run-<id>.jsonl`, one write per line, as it goes (`ChunkLedger`: what a worker uses of the
  store, `storage.writes.WorkerStore`, as `storage.Store` offers it, so the worker's code runs unchanged). Its last
  line says how it ended.
- **The parent** applies new complete lines to the database while the chunk runs and once more after it returns or
  dies (`read_new`, then `Store.apply_journal`, which stores the position reached in the same transaction: every
  line is applied once, whatever is killed when). A killed chunk loses nothing it had written.
- **A stop** reaches a chunk through `journals/run-<id>.stop` (created by the parent), which the chunk's recorder
  reads as the run's status "stopping", in forked and in ZeroGPU mode alike.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from storage import lifecycle, writes

END = "end"  # the journal line that says how a chunk ended


def journal_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "journals"


def journal_path(data_dir: str | os.PathLike[str], run_id: int) -> Path:
    return journal_dir(data_dir) / f"run-{int(run_id)}.jsonl"


def input_path(data_dir: str | os.PathLike[str], run_id: int) -> Path:
    return journal_dir(data_dir) / f"run-{int(run_id)}.input.json"


def stop_path(data_dir: str | os.PathLike[str], run_id: int) -> Path:
    return journal_dir(data_dir) / f"run-{int(run_id)}.stop"


def _plain(value: Any) -> Any:
    """JSON for what a worker writes: numpy and torch scalars as numbers; anything else as text."""
    if hasattr(value, "item"):
        try:
            return value.item()
        except (ValueError, TypeError, RuntimeError):
            pass
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _encode(entry: dict[str, Any]) -> bytes:
    return (json.dumps(entry, ensure_ascii=False, default=_plain) + "\n").encode()


# ------------------------------------------------------------------------------------------------- parent side


def write_input(store, data_dir: str | os.PathLike[str], run: dict[str, Any]) -> Path:
    """Write what the next chunk of `run` needs to know from the database (see the module docstring); atomically,
    so a chunk never reads half a file. Returns its path."""
    value_set_id = run.get("value_set_id")
    values: dict[str, list[dict[str, Any]]] = {}
    if value_set_id:
        for split in store.value_splits(value_set_id):
            values[split] = store.get_values(value_set_id, split)
    data = {"run": run, "value_set_id": value_set_id, "values": values,
            "value_set_cost": store.value_set_cost(value_set_id) if value_set_id else {},
            "checkpoints": store.list_checkpoints(run["id"]), "evaluations": store.get_evaluations(run["id"]),
            "latest_metrics": store.latest_metrics(run["id"])}
    path = input_path(data_dir, run["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_encode(data))
    os.replace(tmp, path)
    return path


def read_new(path: str | os.PathLike[str], offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of a journal after byte `offset` and the offset after the last of them. A torn last line
    (its writer was killed mid-write) is left for later, or for `clear`. An offset past the end (the journal was
    emptied after its position was stored) reads from the start."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if offset > size:
                offset = 0
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    entries = []
    for line in data[:end].splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue  # a fragment left by a killed writer, followed by a later chunk's line
    return entries, offset + end


def clear(data_dir: str | os.PathLike[str], run_id: int) -> None:
    """Remove a settled chunk's journal, input and stop request."""
    for path in (journal_path(data_dir, run_id), input_path(data_dir, run_id), stop_path(data_dir, run_id)):
        path.unlink(missing_ok=True)


def request_stop(data_dir: str | os.PathLike[str], run_id: int) -> None:
    path = stop_path(data_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


# -------------------------------------------------------------------------------------------------- chunk side


class ChunkLedger:
    """`storage.writes.WorkerStore` for a chunk process: reads answer from the chunk's input (and what the chunk
    itself wrote since), writes are appended to the journal, which `Store.apply_journal` replays through the same
    signatures. Safe to share between the chunk's threads (the trainer, the heartbeat, the log handler)."""

    def __init__(self, data_dir: str | os.PathLike[str], run_id: int) -> None:
        self.run_id = int(run_id)
        self.path = journal_path(data_dir, run_id)
        self._stop = stop_path(data_dir, run_id)
        data = json.loads(input_path(data_dir, run_id).read_text())
        self._run = data["run"]
        self._value_set_id = data["value_set_id"]
        self._values = {split: {row["prompt_id"]: row for row in rows} for split, rows in data["values"].items()}
        self._value_set_cost = dict(data.get("value_set_cost") or {})
        self._checkpoints = {row["path"]: row for row in data["checkpoints"]}
        self._evaluations = list(data["evaluations"])
        self._latest_metrics = dict(data.get("latest_metrics") or {})
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __repr__(self) -> str:
        return f"ChunkLedger({str(self.path)!r})"

    def _write(self, name: str, **arguments: Any) -> None:
        """Append one write: `name` and the arguments of `RunWriter.<name>` (checked here, so a journal never holds a
        line its replay refuses)."""
        try:
            writes.signature(name).bind(**arguments)
        except TypeError as error:
            raise TypeError(f"A chunk's {name!r} does not fit {writes.describe(name)}: {error}.") from None
        if arguments.get("run_id", self.run_id) != self.run_id:
            raise ValueError(f"The journal of run {self.run_id} takes no write of run {arguments['run_id']}.")
        line = _encode({"op": name, "at": time.time(), **arguments})
        with self._lock:
            os.write(self._fd, line)

    def end(self, outcome: str, error: str | None, seconds: float) -> None:
        """The journal's last line: how the chunk ended ("continues", "finished", "stopped", "failed", "disk_full")."""
        line = _encode({END: {"outcome": outcome, "error": error, "seconds": seconds}, "at": time.time()})
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # -- the writes (`storage.writes.RunWriter`), each journaled under its own name with its own arguments

    def update_run(self, run_id: int, **fields: Any) -> bool:
        self._run.update(fields)
        self._write("update_run", run_id=run_id, **fields)
        return True

    def heartbeat(self, run_id: int, **fields: Any) -> None:
        self._write("heartbeat", run_id=run_id, **fields)

    def record_progress(self, run_id: int, **fields: Any) -> None:
        self._write("record_progress", run_id=run_id, **fields)

    def apply(self, run_id: int, event: lifecycle.Event, *, seconds: float | None = None, **fields: Any) -> bool:
        if event.name not in writes.JOURNAL_EVENTS:
            raise ValueError(f"A chunk records only the events {', '.join(writes.JOURNAL_EVENTS)}; the parent "
                             f"settles '{event}'.")
        self._write("apply", run_id=run_id, event=event.name, seconds=seconds, **fields)
        return True

    def add_values(self, value_set_id: int, split: str, records: Iterable[Mapping[str, Any]],
                   seconds: float = 0.0, tokens: int = 0, flops: float = 0.0) -> int:
        records = [dict(r) for r in records]
        self._write("add_values", value_set_id=value_set_id, split=split, records=records, seconds=float(seconds),
                    tokens=int(tokens), flops=float(flops))
        added = 0
        with self._lock:
            rows = self._values.setdefault(split, {})
            for record in records:
                known = rows.get(str(record["prompt_id"]))
                if known is None or known.get("v_star") is None:  # as the store: a stored estimate is kept
                    added += known is None
                    rows[str(record["prompt_id"])] = {**record, "prompt_id": str(record["prompt_id"])}
        return added

    def set_run_values(self, run_id: int, split: str, rows: Iterable[Mapping[str, Any]],
                       replace: bool = False) -> int:
        rows = [dict(r) for r in rows]
        self._write("set_run_values", run_id=run_id, split=split, rows=rows, replace=replace)
        return len(rows)

    def mark_value_set_complete(self, value_set_id: int, summary: dict[str, Any] | None = None) -> None:
        self._write("mark_value_set_complete", value_set_id=value_set_id, summary=summary)

    def update_value_set_summary(self, value_set_id: int, summary: dict[str, Any]) -> None:
        self._write("update_value_set_summary", value_set_id=value_set_id, summary=summary)

    def add_metrics(self, run_id: int, step: int, metrics: Mapping[str, Any]) -> int:
        scalars = {k: v.item() if hasattr(v, "item") and getattr(v, "ndim", 0) == 0 else v for k, v in metrics.items()}
        kept = {k: v for k, v in scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._write("add_metrics", run_id=run_id, step=int(step), metrics=kept)
        with self._lock:
            for name, value in kept.items():
                known = self._latest_metrics.get(name)
                if known is None or known["step"] <= int(step):  # as the store: a late older step stays behind
                    self._latest_metrics[name] = {"step": int(step), "value": value}
        return len(kept)

    def add_samples(self, run_id: int, samples: Iterable[Mapping[str, Any]]) -> int:
        samples = list(samples)
        self._write("add_samples", run_id=run_id, samples=samples)
        return len(samples)

    def add_evaluation(self, run_id: int, step: int, metrics: Mapping[str, Any], split: str = "eval") -> None:
        self._write("add_evaluation", run_id=run_id, step=int(step), metrics=dict(metrics), split=split)
        with self._lock:
            self._evaluations.append({"run_id": run_id, "step": int(step), "split": split, "metrics": metrics})

    def add_checkpoint(self, run_id: int, step: int, path: str | os.PathLike[str]) -> None:
        self._write("add_checkpoint", run_id=run_id, step=int(step), path=str(path))
        with self._lock:
            self._checkpoints[str(path)] = {"run_id": run_id, "step": int(step), "path": str(path),
                                            "id": len(self._checkpoints) + 10**9}

    def remove_checkpoint(self, run_id: int, path: str | os.PathLike[str]) -> bool:
        self._write("remove_checkpoint", run_id=run_id, path=str(path))
        with self._lock:
            return self._checkpoints.pop(str(path), None) is not None

    def add_log(self, run_id: int, message: str, level: str = "INFO") -> None:
        self._write("add_log", run_id=run_id, message=str(message), level=str(level))

    def add_logs(self, run_id: int, lines: Iterable[tuple[str, str]]) -> None:
        lines = [[str(level), str(message)] for level, message in lines]
        if lines:
            self._write("add_logs", run_id=run_id, lines=lines)

    # -- the reads (`storage.writes.WorkerStore`): the chunk's input, and what the chunk wrote since

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        """The run as the chunk started it: running, or "stopping" once a stop was requested."""
        status = lifecycle.STOPPING if self._stop.exists() else lifecycle.RUNNING
        return {**self._run, "status": status}

    def get_or_create_value_set(self, fingerprint: str, meta: dict[str, Any]) -> int:
        if not self._value_set_id:
            raise RuntimeError("The chunk's input names no value set: the parent creates it before the chunk.")
        return self._value_set_id

    def get_values(self, value_set_id: int, split: str | None = "train") -> list[dict[str, Any]]:
        with self._lock:
            if split is None:
                return [row for rows in self._values.values() for row in rows.values()]
            return list(self._values.get(split, {}).values())

    def value_set_cost(self, value_set_id: int) -> dict[str, dict[str, float]]:
        """The set's sampling cost as the chunk started (what other runs paid for the rows it reuses)."""
        with self._lock:
            return {split: dict(cost) for split, cost in self._value_set_cost.items()}

    def latest_metrics(self, run_id: int) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: dict(row) for name, row in self._latest_metrics.items()}

    def get_evaluations(self, run_id: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._evaluations)

    def list_checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self._checkpoints.values(), key=lambda r: (r["step"], r.get("id") or 0))
