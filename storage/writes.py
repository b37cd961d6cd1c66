"""Every write a run's worker makes, in one table (`WRITES`), each with one signature (`RunWriter`).

`storage.Store` makes them in the database; `app.runtime.journal.ChunkLedger` records them in a chunk's journal,
which `Store.apply_journal` replays through the same functions (`replay`). Each write is a function of an open
write transaction, then the arguments of the `RunWriter` method of its name, then `at`: when it happened (a journal
is applied after the fact), default now. docs/architecture.md follows a run through them.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from a2po.names import ACTIONS, STAGES
from storage import dialects, lifecycle, models
from storage.dialects import greatest, insert
from storage.secrets import scrub_secrets

# Run columns kept by `set_run_values` alone (they count the run's `run_values` rows).
RUN_VALUE_FIELDS = frozenset({"value_counts", "values_revision"})
# Columns a caller may change with `update_run` (id and created_at are fixed once the run exists).
RUN_FIELDS = frozenset(c.key for c in models.Run.__table__.columns) - {"id", "created_at"}
RUN_OWN = ("v_star", "num_correct", "filtered")  # what a run's row says of a prompt, over the shared row's values
# The lifecycle events a chunk may record; the parent applies every other one itself (`app.runtime.chunks`).
JOURNAL_EVENTS = {lifecycle.REQUEST_STOP.name: lifecycle.REQUEST_STOP}


@runtime_checkable
class RunWriter(Protocol):
    """Every write a run's worker makes (the keys of `WRITES`), as `Store` and `ChunkLedger` both take them."""

    def update_run(self, run_id: int, **fields: Any) -> bool:
        """Set columns of a run (e.g. `progress=0.5`), never its status or counters (`apply` changes those).
        Returns False if the run is gone."""

    def heartbeat(self, run_id: int, **fields: Any) -> None:
        """Mark the run's worker alive now (optionally updating other columns, e.g. progress, in the same write)."""

    def record_progress(self, run_id: int, **fields: Any) -> None:
        """Real progress (a stage-1 batch, a training step, a checkpoint): alive, progressing, and no longer
        counting automatic restarts in a row (`lifecycle`: auto_resumes)."""

    def apply(self, run_id: int, event: lifecycle.Event, *, seconds: float | None = None, **fields: Any) -> bool:
        """Change the run's status by `event` (`storage.lifecycle`), atomically and only while the run is in one of
        the event's source statuses; `fields` sets other columns in the same write (a pid, an error, ...) and
        `seconds` is a chunk's duration (events that end a chunk). True if it happened. Committed durably."""

    def add_values(self, value_set_id: int, split: str, records: Iterable[Mapping[str, Any]],
                   seconds: float = 0.0, tokens: int = 0, flops: float = 0.0) -> int:
        """Store stage-1 records (as delivered by `on_values_batch`), which cost `seconds`, `tokens` and `flops` to
        sample.

        Re-adding a stored prompt_id keeps the stored row (unless its V* was missing), so nothing is duplicated.
        The set's `cost` of the split grows by the share of the new prompts. Returns how many prompts were new to
        this value set and split.
        """

    def set_run_values(self, run_id: int, split: str, rows: Iterable[Mapping[str, Any]],
                       replace: bool = False) -> int:
        """Record what run `run_id` trained with for prompts of one split: each row's `prompt_id`, `v_star`,
        `num_correct`, `filtered` (a stage-1 record, recomputed with the run's beta1), over the shared rows of the
        run's value set (rows without one, e.g. a V* given by the dataset, are left out). `replace`: `rows` is the
        split's whole table, so the run's rows not in it go. Returns how many rows were added or changed."""

    def mark_value_set_complete(self, value_set_id: int, summary: dict[str, Any] | None = None) -> None:
        """Every prompt of the set has its V*; `summary` replaces the stored one."""

    def update_value_set_summary(self, value_set_id: int, summary: dict[str, Any]) -> None:
        """Merge `summary` into the stored summary (e.g. one split's stats) without marking the set complete."""

    def add_metrics(self, run_id: int, step: int, metrics: Mapping[str, Any]) -> int:
        """Upsert one value per metric name at `step`; non-numeric values are skipped. Returns how many were kept."""

    def add_samples(self, run_id: int, samples: Iterable[Mapping[str, Any]]) -> int:
        """Store stage-2 samples (as delivered by `on_samples`); one row per (split, step, prompt_id, sample_index),
        latest wins (A*-PO's samples are index 0; GRPO's G completions of a prompt 0..G-1). A sample's `rewards`
        (each reward function's value) and `extra` (its `log_extra` columns) are kept together, in that order, as
        the row's `extra`."""

    def add_evaluation(self, run_id: int, step: int, metrics: Mapping[str, Any], split: str = "eval") -> None:
        """Store one evaluation (one row per step and split) and keep the run's `best_eval_accuracy` up to date."""

    def add_checkpoint(self, run_id: int, step: int, path: str | os.PathLike[str]) -> None:
        """Record a checkpoint folder the Trainer saved (committed durably: a resume starts from it)."""

    def remove_checkpoint(self, run_id: int, path: str | os.PathLike[str]) -> bool:
        """Forget a checkpoint (its folder was removed)."""

    def add_log(self, run_id: int, message: str, level: str = "INFO") -> None:
        """Append one line to the run's log."""

    def add_logs(self, run_id: int, lines: Iterable[tuple[str, str]]) -> None:
        """Append several `(level, message)` lines in one transaction."""


@runtime_checkable
class WorkerStore(RunWriter, Protocol):
    """What a worker uses of the store: every write (`RunWriter`) and these reads, which a chunk's ledger answers
    from the chunk's input and its own writes."""

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        """The run's row, or None."""

    def get_or_create_value_set(self, fingerprint: str, meta: dict[str, Any]) -> int:
        """The id of the value set with this fingerprint, created (incomplete, empty) if there is none."""

    def get_values(self, value_set_id: int, split: str | None = "train") -> list[dict[str, Any]]:
        """Stored prompt values of one split (all splits with `split=None`), in insertion order."""

    def value_set_cost(self, value_set_id: int) -> dict[str, dict[str, float]]:
        """What sampling the set's stored prompts cost, per split: `seconds`, `tokens`, `flops` and the `prompts` they
        sampled ({} when not known: see `storage.models.ValueSet.cost`)."""

    def latest_metrics(self, run_id: int) -> dict[str, dict[str, Any]]:
        """`{name: {"step", "value"}}`: each metric's value at its highest step."""

    def get_evaluations(self, run_id: int) -> list[dict[str, Any]]:
        """The run's evaluations, by step."""

    def list_checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        """The run's checkpoints, by step."""


# ------------------------------------------------------------------------------------------- values as stored


def _now() -> float:
    return time.time()


def _float(value: Any) -> float | None:
    """A finite float, or None for missing / NaN values (SQLite stores NaN as NULL anyway)."""
    if value is None or isinstance(value, str):
        return None
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _is_number(value: Any) -> bool:
    """True for ints, floats and one-element numpy / torch values; bools and strings are not metrics."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError, RuntimeError):
            return False
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _prompt_text(prompt: Any) -> str:
    """Readable text of a prompt given either as a string or as a list of chat messages."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, Mapping) else str(m) for m in prompt)
    return "" if prompt is None else str(prompt)


def json_safe(value: Any) -> Any:
    """Recursively turn floats that JSON cannot hold (NaN, inf) into None and scalars into plain Python."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def check_run_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The run columns `fields` sets, as stored; a clear error for a column no write may set directly."""
    unknown = set(fields) - RUN_FIELDS
    if unknown:
        raise ValueError(f"Unknown run field(s) {sorted(unknown)}: use {sorted(RUN_FIELDS)}.")
    managed = set(fields) & ({"status", "journal_offset"} | set(lifecycle.COUNTERS))
    if managed:
        raise ValueError(f"{sorted(managed)} change only through the run state machine: "
                         "Store.apply(run_id, lifecycle.<EVENT>) (storage/lifecycle.py).")
    if set(fields) & RUN_VALUE_FIELDS:
        raise ValueError(f"{sorted(set(fields) & RUN_VALUE_FIELDS)} count the run's V* rows: they change only "
                         "through Store.set_run_values.")
    if fields.get("stage") is not None and fields["stage"] not in STAGES:
        raise ValueError(f"Unknown run stage {fields['stage']!r}: use one of {', '.join(STAGES)} or None.")
    if "action" in fields and fields["action"] not in ACTIONS:
        raise ValueError(f"Unknown run action {fields['action']!r}: use one of {', '.join(ACTIONS)}.")
    if fields.get("stop_reason") is not None and fields["stop_reason"] not in lifecycle.STOP_REASONS:
        raise ValueError(f"Unknown stop reason {fields['stop_reason']!r}: use one of "
                         f"{', '.join(lifecycle.STOP_REASONS)}.")
    return {k: json_safe(scrub_secrets(v)) if k == "config" else v for k, v in fields.items()}


# ------------------------------------------------------------------------------------------------ the writes


def update_run(s: Session, run_id: int, *, at: float | None = None, **fields: Any) -> bool:
    values = check_run_fields(fields)
    if not values:
        return s.scalar(select(models.Run.id).where(models.Run.id == run_id)) is not None
    return s.execute(update(models.Run).where(models.Run.id == run_id).values(**values)).rowcount == 1


def heartbeat(s: Session, run_id: int, *, at: float | None = None, **fields: Any) -> None:
    update_run(s, run_id, heartbeat_at=_now() if at is None else float(at), **fields)


def record_progress(s: Session, run_id: int, *, at: float | None = None, **fields: Any) -> None:
    now = _now() if at is None else float(at)
    s.execute(update(models.Run).where(models.Run.id == run_id).values(
        heartbeat_at=now, progress_at=now, auto_resumes=0, **check_run_fields(fields)))


def apply(s: Session, run_id: int, event: lifecycle.Event, *, seconds: float | None = None, at: float | None = None,
          **fields: Any) -> bool:
    """The compare-and-set of one `lifecycle` event."""
    values = check_run_fields(fields)
    if not isinstance(event, lifecycle.Event):
        raise TypeError(f"{event!r} is not a storage.lifecycle event (e.g. lifecycle.CLAIM).")
    now = _now() if at is None else float(at)
    values = dict(values, status=event.target)
    for name in event.stamps:
        values.setdefault(name, now)
    for name in event.clears:
        values.setdefault(name, None)
    for name in event.resets:
        values[name] = 0
    for name in event.increments:
        values[name] = getattr(models.Run, name) + 1
    if event.ends_stretch:
        stretch = now - func.coalesce(models.Run.started_at, now)
        values["limit_seconds"] = models.Run.limit_seconds + greatest(0.0, stretch)
    if seconds is not None:  # the event ends a chunk
        values["chunks_done"] = models.Run.chunks_done + 1
        values["chunk_seconds"] = models.Run.chunk_seconds + max(0.0, float(seconds or 0.0))
    stmt = update(models.Run).where(models.Run.id == run_id, models.Run.status.in_(event.sources)).values(**values)
    return s.execute(stmt).rowcount == 1


def mark_value_set_complete(s: Session, value_set_id: int, summary: dict[str, Any] | None = None, *,
                            at: float | None = None) -> None:
    s.execute(update(models.ValueSet).where(models.ValueSet.id == value_set_id)
              .values(complete=True, summary=json_safe(summary or {})))


def update_value_set_summary(s: Session, value_set_id: int, summary: dict[str, Any], *,
                             at: float | None = None) -> None:
    this_set = models.ValueSet.id == value_set_id
    current = s.scalar(select(models.ValueSet.summary).where(this_set).with_for_update()) or {}
    s.execute(update(models.ValueSet).where(this_set).values(summary={**current, **json_safe(summary)}))


def add_values(s: Session, value_set_id: int, split: str, records: Iterable[Mapping[str, Any]],
               seconds: float = 0.0, tokens: int = 0, flops: float = 0.0, *, at: float | None = None) -> int:
    rows = []
    for r in records:
        if r.get("prompt_id") is None:
            raise ValueError("A value record has no 'prompt_id': every stage-1 record needs one.")
        prompt = r.get("prompt")
        rows.append({
            "value_set_id": value_set_id, "split": split, "prompt_id": str(r["prompt_id"]),
            "prompt": json_safe(prompt), "prompt_text": r.get("prompt_text") or _prompt_text(prompt),
            "v_star": _float(r.get("v_star")), "rewards": json_safe(list(r.get("rewards") or [])),
            "completions": [str(c) for c in r.get("completions") or []],
            "num_correct": None if r.get("num_correct") is None else int(r["num_correct"]),  # None: V* was given
            "filtered": bool(r.get("filtered", False)),
        })
    if not rows:
        return 0
    if dialects.dialect_of(s) == dialects.POSTGRESQL:  # SQLite's write lock already covers the transaction
        # The stored ids and the counts below are read, then written: one writer of a value set at a time.
        s.execute(select(models.ValueSet.id).where(models.ValueSet.id == value_set_id).with_for_update())
    stmt = insert(s, models.PromptValue)
    keep = ("prompt", "prompt_text", "v_star", "rewards", "completions", "num_correct", "filtered")
    # A stored estimate is never overwritten (same fingerprint = same settings, so it is as good as a new one);
    # only a row whose V* is still missing takes the new values.
    stmt = stmt.on_conflict_do_update(index_elements=["value_set_id", "split", "prompt_id"],
                                      set_={k: stmt.excluded[k] for k in keep},
                                      where=models.PromptValue.v_star.is_(None))
    ids = list(dict.fromkeys(row["prompt_id"] for row in rows))
    stored = set()
    for start in range(0, len(ids), 500):  # SQLite caps the number of bound parameters
        stored.update(s.scalars(select(models.PromptValue.prompt_id).where(
            models.PromptValue.value_set_id == value_set_id, models.PromptValue.split == split,
            models.PromptValue.prompt_id.in_(ids[start:start + 500]))))
    s.execute(stmt, rows)
    added = len(ids) - len(stored)
    if added:
        counts, cost = s.execute(select(models.ValueSet.counts, models.ValueSet.cost)
                                 .where(models.ValueSet.id == value_set_id)).one()
        counts = counts or {}
        fields: dict[str, Any] = {"counts": {**counts, split: int(counts.get(split, 0)) + added}}
        if seconds or tokens:
            # Prompts another run stored meanwhile were paid by that run: only the new ones' share is added.
            share, paid = added / len(ids), (cost or {}).get(split) or {}
            fields["cost"] = {**(cost or {}), split: {
                "seconds": float(paid.get("seconds") or 0.0) + float(seconds) * share,
                "tokens": int(paid.get("tokens") or 0) + round(int(tokens) * share),
                "flops": float(paid.get("flops") or 0.0) + float(flops) * share,
                "prompts": int(paid.get("prompts") or 0) + added}}
        s.execute(update(models.ValueSet).where(models.ValueSet.id == value_set_id).values(**fields))
    return added


def set_run_values(s: Session, run_id: int, split: str, rows: Iterable[Mapping[str, Any]], replace: bool = False,
                   *, at: float | None = None) -> int:
    """Only rows that are new or differ are written; the run's counts move with them, and its revision with any
    write that changed or removed a row or added one before the last."""
    # The run's rows and counts are read, then written: one writer of a run's rows at a time.
    value_set_id = s.scalar(select(models.Run.value_set_id).where(models.Run.id == run_id).with_for_update())
    if value_set_id is None:
        return 0
    wanted: dict[str, tuple[float | None, int | None, bool]] = {}
    for r in rows:
        if r.get("prompt_id") is None:
            raise ValueError("A run value row has no 'prompt_id': every stage-1 record needs one.")
        wanted[str(r["prompt_id"])] = (_float(r.get("v_star")),
                                       None if r.get("num_correct") is None else int(r["num_correct"]),
                                       bool(r.get("filtered", False)))
    rv, pv = models.RunValue, models.PromptValue
    mine = (rv.run_id == run_id, rv.split == split)
    own = select(rv.prompt_id, rv.v_star, rv.num_correct, rv.filtered).where(*mine)
    stored: dict[str, tuple[float | None, int | None, bool]] = {}
    if replace:
        stored = {pid: (v, k, bool(f)) for pid, v, k, f in s.execute(own)}
    else:
        ids = list(wanted)
        for start in range(0, len(ids), 500):  # SQLite caps the number of bound parameters
            stored.update((pid, (v, k, bool(f))) for pid, v, k, f in s.execute(
                own.where(rv.prompt_id.in_(ids[start:start + 500]))))
    # Only the rows that differ need their shared row's id (a resumed run's whole table usually has none).
    differ = [pid for pid, values in wanted.items() if stored.get(pid) != values]
    value_ids: dict[str, int] = {}
    for start in range(0, len(differ), 500):
        value_ids.update(s.execute(select(pv.prompt_id, pv.id).where(
            pv.value_set_id == value_set_id, pv.split == split, pv.prompt_id.in_(differ[start:start + 500]))).all())
    changed = [{"run_id": run_id, "value_id": value_ids[pid], "split": split, "prompt_id": pid,
                **dict(zip(RUN_OWN, wanted[pid], strict=True))} for pid in differ if pid in value_ids]
    last = s.scalar(select(func.max(rv.value_id)).where(*mine)) or 0
    if changed:
        stmt = insert(s, models.RunValue)
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "split", "prompt_id"],
                                          set_={k: stmt.excluded[k] for k in ("value_id", *RUN_OWN)})
        s.execute(stmt, changed)
    removed = [pid for pid in stored if pid not in wanted] if replace else []
    for start in range(0, len(removed), 500):
        s.execute(delete(models.RunValue).where(*mine, rv.prompt_id.in_(removed[start:start + 500])))
    if changed or removed:
        added = [row for row in changed if row["prompt_id"] not in stored]
        # Rows only added after the last one (stage 1 going on) leave the revision: a page follows them by id.
        rewritten = len(added) < len(changed) or removed or any(row["value_id"] < last for row in added)
        counts = s.scalar(select(models.Run.value_counts).where(models.Run.id == run_id)) or {}
        rows_now = len(stored) + len(added) - len(removed) if replace else int(counts.get(split, 0)) + len(added)
        s.execute(update(models.Run).where(models.Run.id == run_id).values(
            value_counts={**counts, split: rows_now},
            values_revision=models.Run.values_revision + (1 if rewritten else 0)))
    return len(changed)


def add_metrics(s: Session, run_id: int, step: int, metrics: Mapping[str, Any], *, at: float | None = None) -> int:
    now = _now() if at is None else float(at)
    rows = [{"run_id": run_id, "step": int(step), "name": str(name), "value": _float(value), "created_at": now}
            for name, value in metrics.items() if _is_number(value)]
    if not rows:
        return 0
    stmt = insert(s, models.Metric)
    stmt = stmt.on_conflict_do_update(index_elements=["run_id", "step", "name"], set_={"value": stmt.excluded.value})
    s.execute(stmt, rows)
    ids = dict(s.execute(select(models.Metric.name, models.Metric.id).where(
        models.Metric.run_id == run_id, models.Metric.step == int(step),
        models.Metric.name.in_([r["name"] for r in rows]))).all())
    latest = insert(s, models.LatestMetric)
    latest = latest.on_conflict_do_update(
        index_elements=["run_id", "name"], set_={k: latest.excluded[k] for k in ("step", "value", "metric_id")},
        where=models.LatestMetric.step <= latest.excluded.step)  # a late write of an older step stays behind
    s.execute(latest, [{"run_id": run_id, "name": r["name"], "step": r["step"], "value": r["value"],
                        "metric_id": ids[r["name"]]} for r in rows])
    return len(rows)


def add_samples(s: Session, run_id: int, samples: Iterable[Mapping[str, Any]], *, at: float | None = None) -> int:
    now = _now() if at is None else float(at)
    rows = [{
        "run_id": run_id, "step": int(x.get("step") or 0), "split": str(x.get("split") or "train"),
        "prompt_id": str(x.get("prompt_id", "")), "sample_index": int(x.get("sample_index") or 0),
        "prompt_text": str(x.get("prompt_text") or ""),
        "completion": str(x.get("completion") or ""), "reward": _float(x.get("reward")),
        "v_star": _float(x.get("v_star")), "advantage": _float(x.get("advantage")),
        "implicit_reward": _float(x.get("implicit_reward")),
        "completion_length": _float(x.get("completion_length")), "created_at": now,
        "extra": _sample_extra(x),
    } for x in samples]
    if not rows:
        return 0
    stmt = insert(s, models.Sample)
    keep = ("prompt_text", "completion", "reward", "v_star", "advantage", "implicit_reward", "completion_length",
            "extra")
    stmt = stmt.on_conflict_do_update(index_elements=["run_id", "split", "step", "prompt_id", "sample_index"],
                                      set_={k: stmt.excluded[k] for k in keep})
    s.execute(stmt, rows)
    return len(rows)


def _sample_extra(sample: Mapping[str, Any]) -> dict[str, Any] | None:
    """The columns of TRL's completion table between a sample's completion and its advantage, as TRL orders them:
    each reward function's value, then the `log_extra` columns (a value JSON cannot hold is kept as its text)."""
    extra = json_safe({**(sample.get("rewards") or {}), **(sample.get("extra") or {})})
    return {k: v if v is None or isinstance(v, (bool, int, float, str, list, dict)) else str(v)
            for k, v in extra.items()} or None


def add_evaluation(s: Session, run_id: int, step: int, metrics: Mapping[str, Any], split: str = "eval", *,
                   at: float | None = None) -> None:
    clean = json_safe(dict(metrics))
    stmt = insert(s, models.Evaluation).values(run_id=run_id, step=int(step), split=split, metrics=clean,
                                     created_at=_now() if at is None else float(at))
    stmt = stmt.on_conflict_do_update(index_elements=["run_id", "step", "split"],
                                      set_={"metrics": stmt.excluded.metrics})
    accuracy = _float(clean.get(f"{split}_accuracy", clean.get("accuracy")))
    s.execute(stmt)
    if accuracy is not None:
        best = greatest(func.coalesce(models.Run.best_eval_accuracy, accuracy), accuracy)
        s.execute(update(models.Run).where(models.Run.id == run_id).values(best_eval_accuracy=best))


def add_checkpoint(s: Session, run_id: int, step: int, path: str | os.PathLike[str], *,
                   at: float | None = None) -> None:
    stmt = insert(s, models.Checkpoint).values(run_id=run_id, step=int(step), path=str(path),
                                     created_at=_now() if at is None else float(at))
    stmt = stmt.on_conflict_do_update(index_elements=["run_id", "path"],
                                      set_={"step": stmt.excluded.step, "created_at": stmt.excluded.created_at})
    s.execute(stmt)


def remove_checkpoint(s: Session, run_id: int, path: str | os.PathLike[str], *, at: float | None = None) -> bool:
    return s.execute(delete(models.Checkpoint).where(models.Checkpoint.run_id == run_id,
                                                     models.Checkpoint.path == str(path))).rowcount == 1


def add_logs(s: Session, run_id: int, lines: Iterable[tuple[str, str]], *, at: float | None = None) -> None:
    now = _now() if at is None else float(at)
    rows = [{"run_id": run_id, "created_at": now, "level": str(level).upper(), "message": str(message)}
            for level, message in lines]
    if rows:
        s.execute(insert(s, models.LogLine), rows)


def add_log(s: Session, run_id: int, message: str, level: str = "INFO", *, at: float | None = None) -> None:
    add_logs(s, run_id, [(level, message)], at=at)


@dataclass(frozen=True)
class Write:
    """One entry of `WRITES`: its function of a write transaction, and whether it commits durably (with
    `synchronous=FULL` on SQLite: run state that must not go back in time, see `storage.store`)."""

    function: Callable[..., Any]
    durable: bool = False


WRITES: dict[str, Write] = {
    "update_run": Write(update_run),
    "heartbeat": Write(heartbeat),
    "record_progress": Write(record_progress),
    "apply": Write(apply, durable=True),
    "add_values": Write(add_values),
    "set_run_values": Write(set_run_values),
    "mark_value_set_complete": Write(mark_value_set_complete),
    "update_value_set_summary": Write(update_value_set_summary),
    "add_metrics": Write(add_metrics),
    "add_samples": Write(add_samples),
    "add_evaluation": Write(add_evaluation),
    "add_checkpoint": Write(add_checkpoint, durable=True),
    "remove_checkpoint": Write(remove_checkpoint, durable=True),
    "add_log": Write(add_log),
    "add_logs": Write(add_logs),
}


@functools.cache
def signature(name: str) -> inspect.Signature:
    """The signature of write `name`, as `RunWriter` declares it (without `self`)."""
    declared = inspect.signature(getattr(RunWriter, name))
    return declared.replace(parameters=list(declared.parameters.values())[1:])


def describe(name: str) -> str:
    """`RunWriter.<name>(its parameters)`, for an error message."""
    plain = [p.replace(annotation=inspect.Parameter.empty) for p in signature(name).parameters.values()]
    return f"RunWriter.{name}{inspect.Signature(plain)}"


def replay(s: Session, run_id: int, name: str, arguments: Mapping[str, Any]) -> Any:
    """Make, inside `s`, one write a chunk of run `run_id` recorded in its journal: `name` and `arguments` as the
    `RunWriter` method of that name takes them (an event by its name), with `at`, when the chunk made it."""
    arguments = dict(arguments)
    if name == "request_stop":  # a journal a chunk wrote before this contract, ingested by an upgraded studio
        name, arguments = "apply", {"event": lifecycle.REQUEST_STOP.name, **arguments}
    if name not in WRITES:
        raise ValueError(f"Unknown journal write {name!r}: use one of {', '.join(WRITES)}.")
    if "run_id" in signature(name).parameters:
        arguments.setdefault("run_id", run_id)  # older journals did not repeat the run's id on every line
    at = arguments.pop("at", None)
    try:
        bound = signature(name).bind(**arguments)
    except TypeError as error:
        raise ValueError(f"A journal's {name!r} does not fit {describe(name)}: {error}.") from None
    if bound.arguments.get("run_id", run_id) != run_id:
        raise ValueError(f"A journal of run {run_id} holds a write of run {bound.arguments['run_id']}.")
    if name == "apply":
        if bound.arguments["event"] not in JOURNAL_EVENTS:
            raise ValueError(f"A chunk records only the events {', '.join(JOURNAL_EVENTS)}, not "
                             f"{bound.arguments['event']!r}: the parent settles the others.")
        bound.arguments["event"] = JOURNAL_EVENTS[bound.arguments["event"]]
    return WRITES[name].function(s, *bound.args, at=at, **bound.kwargs)


def durable(names: Iterable[str]) -> bool:
    """Whether a transaction making the writes `names` must commit durably."""
    return any(WRITES[name].durable for name in names if name in WRITES)
