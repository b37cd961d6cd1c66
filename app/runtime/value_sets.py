"""A run's V* value set in the store: which set a run uses (one per V* settings, shared by the runs that have
them), the set's summary, and what a run that reuses stored rows is given and charged for them. The worker's stage 1
and a chunk's parent use it (docs/runtime.md, "The worker").

The scheduler's process imports this module (through `app.runtime.chunks`) and never imports torch, so the
library's V* helpers (`a2po.values`, which needs torch) and the recorder are imported where they are used.
"""

from __future__ import annotations

from typing import Any

from a2po.compute import format_flops
from a2po.settings import samples_stage_one
from storage import Store


def uses_values(spec: Any) -> bool:
    """Whether a run has a stage 1 and a V* value set (`a2po.settings.samples_stage_one`)."""
    return samples_stage_one(getattr(spec, "method", "a2po"), spec.config or {}, spec.action)


def ensure_value_set(store: Any, run: dict[str, Any], spec: Any) -> int:
    """The run's value set: the one it has, else the one for its V* settings (shared by every run with the same
    sampling settings; created if new), recorded with the run. A worker and a chunk's parent both call it after
    claiming the run."""
    if run.get("value_set_id"):
        return int(run["value_set_id"])
    value_set_id = store.get_or_create_value_set(spec.value_fingerprint(), value_set_meta(spec))
    store.update_run(run["id"], value_set_id=value_set_id)
    return value_set_id


def value_set_meta(spec: Any) -> dict[str, Any]:
    """What a value set was sampled with, for people reading the value-set table (the spec's settings, else
    A2POConfig's defaults: what `RunSpec.value_fingerprint` identifies)."""
    from a2po.config import A2POConfig
    from a2po.runspec import SAMPLING_FIELDS

    defaults = getattr(spec, "config_class", A2POConfig).__dataclass_fields__

    def setting(name: str) -> Any:
        return spec.config.get(name, defaults[name].default)

    own = spec.config.get("values_seed")  # the seed the samples are drawn with: a sweep's runs share one set
    return {"model": spec.model, "dataset": spec.dataset, "rewards": spec.rewards,
            "seed": setting("seed") if own is None else int(own), "sampling": {k: setting(k) for k in SAMPLING_FIELDS}}


def update_value_set(store: Store, value_set_id: int, splits: dict[str, Any], num_value_samples: int) -> None:
    """Refresh per-split summaries from the stored rows; mark the set complete once every split has every prompt."""
    from a2po.values import prompt_id_for, summarize

    summary, complete = {}, True
    for split, dataset in splits.items():
        rows = store.get_values(value_set_id, split)
        done = {row["prompt_id"] for row in rows if row["v_star"] is not None}
        complete &= {prompt_id_for(row) for row in dataset.to_list()} <= done
        if rows:
            summary[split] = summarize([r for r in rows if r["v_star"] is not None], num_value_samples)
    if complete:
        store.mark_value_set_complete(value_set_id, summary)
    elif summary:
        store.update_value_set_summary(value_set_id, summary)


def record_reused_values(store: Store, run: dict[str, Any], splits: dict[str, Any],
                         known: dict[str, list[dict[str, Any]]], rules: tuple[float, bool]) -> None:
    """Give the run its own V* rows for the prompts stage 1 reuses from the shared set, before stage 1 starts (its
    end writes the whole table again), so the run's pages show them while the rest is sampled: V* and the filter
    recomputed from the stored rewards with the run's beta1, as the trainer does (`a2po.values.rescore`). Once per
    run: a resumed run that has them already skips it."""
    from a2po.values import prompt_id_for, rescore
    from app.runtime.recorder import run_value_rows

    have = run.get("value_counts") or {}
    for name, rows in known.items():
        if not rows or int(have.get(name) or 0) >= len(rows):
            continue
        # Only the prompts the trainer takes from the shared set: in the split, without a V* of their own.
        reused = {prompt_id_for(row) for row in splits[name].to_list() if row.get("v_star") is None}
        mine = [rescore(row, *rules) for row in rows if row["prompt_id"] in reused]
        store.set_run_values(run["id"], name, run_value_rows(mine))


def charge_reused_values(store: Store, run: dict[str, Any], value_set_id: int, splits: dict[str, Any],
                         known: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[float, int, float]]:
    """What the run is charged for the stored V* rows of its value set that it reuses, per split: (seconds, completion
    tokens, FLOPs), their share of what sampling the set cost (`Store.value_set_cost`), recorded as its stage-1 cost
    (the `values/<split>/...` metrics, which its clock and a time budget count, as a run that sampled them counts
    them). `known`: the stored rows of the splits whose stage 1 this run has not started before (a later start
    reads its charge back with what it sampled, `stage_one_spent`)."""
    from a2po.values import prompt_id_for

    cost = store.value_set_cost(value_set_id) if known else {}
    charges: dict[str, tuple[float, int, float]] = {}
    for name, rows in known.items():
        stored = {row["prompt_id"] for row in rows}
        reused = len(stored & {prompt_id_for(row) for row in splits[name].to_list() if row.get("v_star") is None}) \
            if stored else 0
        if not reused:
            continue
        paid = cost.get(name) or {}
        prompts = int(paid.get("prompts") or 0)
        if prompts <= 0:
            store.add_log(run["id"], f"Stage 1 ({name}): {reused} prompts reused from V* set {value_set_id}, whose "
                                     "sampling cost was never recorded (sampled by a studio of before that, by runs "
                                     "since deleted): this run's clock does not count them. Delete the V* set to "
                                     "have it sampled again on the clock.", level="WARNING")
            continue
        charges[name] = (float(paid.get("seconds") or 0.0) * reused / prompts,
                         round(int(paid.get("tokens") or 0) * reused / prompts),
                         float(paid.get("flops") or 0.0) * reused / prompts)
        store.add_log(run["id"], f"Stage 1 ({name}): {reused} prompts reused from V* set {value_set_id}, sampled "
                                 f"earlier: their share of its sampling cost, {charges[name][0]:.2f} s, "
                                 f"{charges[name][1]} tokens and {format_flops(charges[name][2])}, counts on this "
                                 "run's clock and compute.")
    if charges:
        # Also kept apart as `reused_*`, so a study can tell the run that sampled the set from those charged for it.
        store.add_metrics(run["id"], 0, {f"values/{name}/{prefix}{key}": value
                                         for name, (seconds, tokens, flops) in charges.items()
                                         for prefix in ("", "reused_")
                                         for key, value in (("runtime", seconds), ("completion_tokens", tokens),
                                                            ("flops", flops))})
    return charges


def stage_one_spent(store: Store, run_id: int) -> dict[str, tuple[float, int, float]]:
    """What a run's stage 1 has cost so far, per split: (seconds, completion tokens, FLOPs), from its stored
    metrics."""
    latest = store.latest_metrics(run_id)
    spent: dict[str, tuple[float, int, float]] = {}
    for name, row in latest.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "values" and parts[2] == "runtime" and row["value"] is not None:
            tokens = (latest.get(f"values/{parts[1]}/completion_tokens") or {}).get("value") or 0
            flops = (latest.get(f"values/{parts[1]}/flops") or {}).get("value") or 0.0
            spent[parts[1]] = (float(row["value"]), int(tokens), float(flops))
    return spent
