"""Named API endpoints, so a script can drive the dashboard with `gradio_client` (documented in docs/api.md).

    from gradio_client import Client, handle_file
    client = Client("http://127.0.0.1:7860/")
    run = client.predict(spec={"config": {"max_steps": 20}}, api_name="/launch")   # {} is the teaching demo
    client.predict(run_id=run["run_id"], api_name="/status")

On a studio with logins, get a token from `/login` and send it in a header:
`Client(url, headers={"x-a2po-token": token})`. Reading (status, lists, metrics, limits) needs no login.
Every endpoint goes through `Services`, like the pages: the same allow-list, limits and permissions. Each is a
function of this module whose first argument is the studio's `Services` (`ENDPOINTS` lists them; `register_api`
gives them the services and names them after themselves): to add one, write it here and add it to that list.

`python -m app --mcp` serves the same endpoints as MCP tools (docs/api.md, "Agents (MCP)"): Gradio reads each
tool's description from the docstring's first paragraph, its arguments from the `Args:` lines (one line each) and
their types from the type hints, so keep those readable by a model.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr

from a2po.shown import shown
from app.access import allowlist
from app.access.gate import Refused, Services, store_upload
from app.studies.protocols import StudyError, budget_seconds
from app.studies.protocols import budget_flops as budget_flops_of
from app.web import forms, live
from app.web.remaining import clock_from_metrics, estimate_remaining, stage1_seconds, training_seconds
from storage.lifecycle import UNFINISHED
from storage.secrets import scrub_text

logger = logging.getLogger("app.web.api")

RUN_KEYS = ("id", "name", "action", "status", "stage", "progress", "model", "dataset", "created_at", "started_at",
            "finished_at", "heartbeat_at", "error", "best_eval_accuracy", "value_set_id", "output_dir", "owner",
            "stop_reason", "chunks_done", "chunk_seconds")


# The API's names for columns renamed since it was published: clients keep reading `kind`.
API_NAMES = {"action": "kind"}


def run_summary(run: dict[str, Any], public: Callable[[str | None], str] = scrub_text) -> dict[str, Any]:
    """The public fields of a run row (no process id) plus whether it is still active; its error as `public`
    shows it (`Services.public_text`: a dead worker's log tail names the database)."""
    summary = {**{API_NAMES.get(k, k): run.get(k) for k in RUN_KEYS}, "active": run["status"] in UNFINISHED}
    if summary["error"]:
        summary["error"] = public(summary["error"])
    return summary


def clock_summary(run: dict[str, Any], clock: dict[str, float] | None, evaluations: int | None = None
                  ) -> dict[str, float | None]:
    """The run's clock in seconds (docs/api.md, "Run fields"): null where nothing was measured."""
    clock = clock or {}
    return {"stage1_seconds": stage1_seconds(clock), "train_seconds": clock.get("train_seconds"),
            "eval_seconds": clock.get("eval_seconds"), "training_seconds": training_seconds(clock),
            "remaining_seconds": estimate_remaining(run, clock, evaluations).seconds}


def public_spec(spec: dict[str, Any], datasets_dir) -> dict[str, Any]:
    """A stored spec as the API shows it (and accepts it back): a file dataset names its file under "file",
    relative to the studio's datasets folder when it lies there, since gradio_client would try to download any
    object with a "path" key."""
    dataset = dict(spec.get("dataset") or {})
    if dataset.get("source") == "file" and "path" in dataset:
        path = Path(dataset.pop("path"))
        dataset["file"] = str(path.relative_to(datasets_dir)) if path.is_relative_to(datasets_dir) else str(path)
    return {**spec, "dataset": dataset}


def runs_go_to(services: Services, user: Any) -> dict[str, Any]:
    """Where runs go, for /limits. A Ray cluster's address only for a signed-in admin: its Jobs API runs any code it
    is sent (a studio without logins has no admin to tell apart: its operator reads it at the console)."""
    admin = services.auth.required and user is not None and user.admin
    return services.scheduler.where(address=admin)


MAX_WHOLE = 2**63 - 1  # ids, steps and row ids are 64-bit integers in the store


def whole(name: str, value: Any, low: int = 0, high: int = MAX_WHOLE) -> int:
    """An integer argument, or the error a client reads naming it (a bool, text or a number past the store's
    integers is not one)."""
    number = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not low <= number <= high:
        raise gr.Error(f"{name} must be a whole number from {low} to {high:,} (got {shown(value)}).")
    return number


def _run(services: Services, run_id: int) -> dict[str, Any]:
    run = services.store.get_run(whole("run_id", run_id))
    if run is None:
        raise gr.Error(f"No run #{run_id}.")
    return run


@contextmanager
def _refusals_as_errors() -> Iterator[None]:
    """A refusal of the gate or of a study's inputs, as the error a client reads."""
    try:
        yield
    except (Refused, StudyError) as exc:
        raise gr.Error(str(exc)) from None


# ------------------------------------------------------------------ endpoints


def launch(services: Services, spec: dict, seeds: list | str | None = None, request: gr.Request = None) -> dict:
    """Check a run spec and queue the run, as the Launch form does (docs/api.md, "The run spec"). Missing keys take
    the teaching demo's values; `preset` picks another preset, `config` overrides its settings.

    Args:
        spec: the run, e.g. {"preset": "quick-look", "config": {"max_steps": 20}}; {} is the teaching demo.
        seeds: run seeds, e.g. [0, 1, 2]: one run per seed, launched together as one study (all or nothing).

    Returns:
        {"run_id", "name", "command", "warnings"}; with seeds also "run_ids" and "study"
        a refused spec is an error naming every problem at once.
    """
    store, user = services.store, services.auth.identify(request=request)
    if seeds:
        with _refusals_as_errors():
            ids = services.launch_seeds(spec, user, seeds)
        runs = [store.get_run(i) for i in ids]
        return {"run_id": ids[0], "name": runs[0]["name"], "command": forms.command_line(runs[0]["config"]),
                "warnings": [], "run_ids": ids, "study": runs[0]["config"]["study"]["id"]}
    with _refusals_as_errors():
        run_id, warnings = services.launch_run(spec, user)
    run = store.get_run(run_id)
    return {"run_id": run_id, "name": run["name"], "command": forms.command_line(run["config"]), "warnings": warnings}


def launch_pair(services: Services, spec: dict, protocol: str = "paper", budget_minutes: float = 0.0,
                seeds: list | str | None = None, grpo_recipe: str = "", grpo_settings: dict | None = None,
                budget_flops: float = 0.0, request: gr.Request = None) -> dict:
    """"A*-PO vs GRPO": queue the A*-PO run `spec` describes and a GRPO run matched to it (same model, prompts,
    held-out set, learning rate, schedule and completion length; G = N >= 2; GRPO's batch = G x A*-PO's, so the
    same prompts per step). Every run passes the same checks and limits, or none is queued. Read the answer with
    `study` (its verdict) once the runs have finished.

    Args:
        spec: the A*-PO run, as `launch` reads it, e.g. {"preset": "quick-look", "config": {"max_steps": 20}}.
        protocol: "paper" (both over every prompt, same steps), "trl" (A*-PO's filter on), "time" (equal time) or
            "compute" (equal compute: FLOPs counted from tokens, the same on any machine).
        budget_minutes: protocol "time" only: the training time of each run in minutes, A*-PO's stage 1 included.
        budget_flops: protocol "compute" only: the compute of each run in FLOPs, A*-PO's stage 1 included, e.g.
            2e15 (docs/compute.md).
        seeds: run seeds, e.g. [0, 1, 2]: one pair per seed, all in one study.
        grpo_recipe: the GRPO side's named recipe ("dapo", "dr-grpo", "gspo", ...; see `limits`); "" for plain GRPO.
        grpo_settings: protocols "time" and "compute" only: the GRPO side's own learning_rate and
            per_device_train_batch_size (completions per step), e.g. {"learning_rate": 3e-5}; none: matched to the
            A*-PO run.

    Returns:
        {"a2po": {"run_id", "name"}, "grpo": {"run_id", "name"}}: the first seed's pair
        "pairs" (one per seed), "study" (its id, for `study`) and "protocol".
    """
    store, user = services.store, services.auth.identify(request=request)
    with _refusals_as_errors():
        budget = budget_seconds(budget_minutes)
        pairs = services.launch_pair(spec, user, protocol=protocol, budget_seconds=budget, seeds=seeds,
                                     grpo_recipe=grpo_recipe or None, grpo_settings=grpo_settings or None,
                                     budget_flops=budget_flops_of(budget_flops))
    described = [{method: {"run_id": run_id, "name": store.get_run(run_id)["name"]}
                  for method, run_id in zip(("a2po", "grpo"), pair, strict=True)} for pair in pairs]
    study = store.get_run(pairs[0][0])["config"]["study"]
    return {**described[0], "pairs": described, "study": study["id"], "protocol": protocol}


def launch_study(services: Services, spec: dict, grid: dict | None = None, seeds: list | str | None = None,
                 halving: dict | bool | None = None, request: gr.Request = None) -> dict:
    """A sweep: the run `spec` describes at every point of `grid`, once per run seed, as one study; every run passes
    the checks and limits, or none is queued. A*-PO runs whose stage-1 settings match share one V* set, sampled
    once. Read the best point with `study` once the runs have finished.

    Args:
        spec: the base run, as `launch` reads it.
        grid: config settings to lists of values, e.g. {"beta2": [0.001, 0.01]}; "method": ["a2po", "grpo"] adds GRPO.
        seeds: run seeds, e.g. [0, 1, 2]: every grid point once per seed.
        halving: stop weak points early (successive halving), e.g. {"reduction_factor": 3, "rungs": 3}, or true for
            those; {"search": "random", "trials": 12} trains 12 points drawn from the grid. The spec needs a budget
            (max_train_flops or max_train_seconds); rung 0 trains every point with the first seed on 1/9 of the
            budget's training part, the best third go on, the last rung runs every seed. Only rung 0 is launched
            now; the studio launches each later rung when the one before has ended.

    Returns:
        {"study", "runs": [{"run_id", "name", "point", "seed", "method"}]}
        "stage1": {"value_sets", "a2po_runs", "saved_runs"}: what sharing stage 1 saves.
    """
    from app.studies.sweeps import shared_stage_one

    with _refusals_as_errors():
        ids = services.launch_sweep(spec, services.auth.identify(request=request), grid, seeds, halving=halving)
    runs = [services.store.get_run(i) for i in ids]
    return {"study": runs[0]["config"]["study"]["id"],
            "runs": [{"run_id": r["id"], "name": r["name"], "point": r["config"]["study"]["point"],
                      "seed": r["config"]["study"]["seed"], "method": r["config"].get("method", "a2po")}
                     for r in runs],
            "stage1": shared_stage_one([r["config"] for r in runs])}


def stop(services: Services, run_id: int, request: gr.Request) -> dict:
    """Ask a queued or running run to stop: it saves a checkpoint first, and `resume` continues it.

    Args:
        run_id: the run's id (from `list_runs` or a launch).

    Returns:
        The run's fields, as `list_runs` shows them.
    """
    with _refusals_as_errors():
        services.act("stop", run_id, services.auth.identify(request=request))
    return run_summary(_run(services, run_id), services.public_text)


def resume(services: Services, run_id: int, request: gr.Request) -> dict:
    """Queue a stopped, interrupted or failed run again; it continues from its last checkpoint and stored V*.

    Args:
        run_id: the run's id.

    Returns:
        The run's fields and "warnings": its registered rewards that changed since it started.
    """
    from a2po.reward_registry import reward_changes

    with _refusals_as_errors():
        services.act("resume", run_id, services.auth.identify(request=request))
    run = _run(services, run_id)
    return {**run_summary(run, services.public_text),
            "warnings": reward_changes((run.get("config") or {}).get("rewards"), what="the resumed run")}


def delete(services: Services, run_id: int, request: gr.Request) -> dict:
    """Delete a run with its metrics, samples and files (its worker is killed if it runs). It cannot be undone.

    Args:
        run_id: the run's id.

    Returns:
        {"deleted": run_id}.
    """
    with _refusals_as_errors():
        services.act("delete", run_id, services.auth.identify(request=request))
    return {"deleted": int(run_id)}


def status(services: Services, run_id: int) -> dict:
    """A run's status and figures: status, stage, progress, error, best held-out accuracy, its clock (training time,
    the remaining estimate), its spec, the latest value of each metric and its V* summary. Poll it until "active" is
    false.

    Args:
        run_id: the run's id.

    Returns:
        The run's fields, "active", "clock", "spec", "latest_metrics" ({name: {"step", "value"}}) and "values".
    """
    store, run = services.store, _run(services, run_id)
    value_set = store.get_value_set(run["value_set_id"]) if run.get("value_set_id") else None
    values = None
    if value_set:
        # The run's own figures (its beta1 and filter), computed once per change of its rows.
        version = (tuple(sorted((run.get("value_counts") or {}).items())), run.get("values_revision"))
        summary = live.SHARED.get(("value-summary", run["id"]), version,
                                  lambda _prev: store.value_summary(run["id"]))
        values = {"num_prompts": sum((run.get("value_counts") or {}).values()),
                  "complete": bool(value_set["complete"]), "summary": summary}
    latest = store.latest_metrics(run["id"])
    evaluations = len({e["step"] for e in store.get_evaluations(run["id"])}) or None
    return {**run_summary(run, services.public_text),
            "clock": clock_summary(run, clock_from_metrics(latest), evaluations),
            "spec": public_spec(run.get("config") or {}, services.policy.datasets_dir),
            "latest_metrics": latest, "values": values}


def list_runs(services: Services) -> list:
    """Every run of the studio, newest first: id, name, status, stage, progress, model, owner, best held-out
    accuracy and clock (`status` adds the metrics and the spec).

    Returns:
        A list of runs; "active" is true while a run is queued, running, stopping or paused.
    """
    runs = services.store.list_runs()
    clocks = services.store.run_clocks(r["id"] for r in runs)
    return [{**run_summary(r, services.public_text), "clock": clock_summary(r, clocks.get(r["id"]))} for r in runs]


def metrics(services: Services, run_id: int, after_id: int = 0) -> list:
    """A run's metric rows (loss, reward, eval_accuracy, ...), oldest first: poll with the largest id seen.

    Args:
        run_id: the run's id.
        after_id: only rows with a larger id (0: from the start).

    Returns:
        A list of {"id", "step", "name", "value"}; "eval_accuracy" at step 0 is the accuracy before training.
    """
    after_id = whole("after_id", after_id)
    _run(services, run_id)
    return [{k: r[k] for k in ("id", "step", "name", "value")}
            for r in services.store.get_metrics(int(run_id), after_id=after_id)]


def limits(services: Services, request: gr.Request = None) -> dict:
    """What this studio accepts: its limits (None: no limit), whether launching needs a login, the presets, the
    named GRPO recipes, the config settings a spec may set, the rewards it may name, and where runs go.

    Returns:
        {"limits", "public", "login_required", "presets", "grpo_recipes", "settable", "rewards", "runs_go_to", ...}.
    """
    from a2po.presets import PRESET_DESCRIPTIONS
    from a2po.recipes import RECIPES
    from a2po.reward_registry import read_registry
    from app.web.pages.launch.form import reward_choices

    policy, auth = services.policy, services.auth
    registry = read_registry()
    return {"limits": policy.limits.describe(), "public": policy.public, "login_required": auth.required,
            "presets": dict(PRESET_DESCRIPTIONS),
            "grpo_recipes": {name: recipe.describe() for name, recipe in RECIPES.items()},
            "allow_remote_code": policy.allow_remote_code, "allow_hub_push": policy.allow_hub_push,
            "allow_hub": policy.allow_hub, "settable": [p.key for p in allowlist.PARAMS],
            "runs_go_to": runs_go_to(services, auth.identify(request=request)),
            "rewards": [{"name": n, "doc": d, "registered": n in registry.rewards}
                        for n, d in reward_choices().items()]}


def _plain(markdown: str) -> str:
    """The studio's Markdown verdicts as plain text for a client ("A\\*-PO" is "A*-PO")."""
    return re.sub(r"\\([\\`*_\[\]])", r"\1", markdown.replace("**", "")).strip()


def _verdict(services: Services, runs: list[dict[str, Any]], timelines: list[Any]) -> dict[str, Any]:
    """What Compare shows for `runs`: each run's figures, the medians over seeds, the protocol and the verdict."""
    from app.runtime.reward_versions import versions_note
    from app.studies import comparison

    view = comparison.study_view(runs, timelines)
    pair = view.pair()
    verdict = comparison.verdict(*pair) if pair else "Give an A*-PO run and a GRPO run for the verdict."
    difference = comparison.method_difference(services.store, runs) if pair else None
    found = {"points": round(difference.points, 2), "interval": [round(difference.low, 2), round(difference.high, 2)],
             "seeds": difference.seeds, "prompts": difference.prompts,
             "within_noise": difference.within_noise} if difference else None
    return {"verdict": _plain(verdict + versions_note(services.store, runs)), "protocol": view.protocol,
            "figures": view.rows, "active": [r["id"] for r in runs if r["status"] in UNFINISHED],
            "difference": found, "difference_text": _plain(difference.text()) if difference else None}


def compare(services: Services, run_ids: list[int]) -> dict:
    """Compare runs as the Compare page does: each run's held-out accuracy, training time (A*-PO's stage 1
    included) and tokens, medians over seeds, and the verdict: how long A*-PO took to reach GRPO's final held-out
    accuracy, and GRPO's time to get there. An unfinished run's latest point stands in for its end, and says so.

    Args:
        run_ids: the runs' ids, e.g. [3, 4]: an A*-PO run and a GRPO run (or several seeds of each) for a verdict.

    Returns:
        {"run_ids", "verdict" (one paragraph), "protocol"}
        "figures": a row per run and per method's median over seeds
        "active": the ids still queued or running (the verdict may change).
    """
    runs = [_run(services, run_id) for run_id in run_ids or []]
    if not runs:
        raise gr.Error("Give the ids of the runs to compare, e.g. run_ids=[3, 4].")
    from app.studies.comparison import store_timeline

    timelines = [store_timeline(services.store, r) for r in runs]
    return {"run_ids": [r["id"] for r in runs], **_verdict(services, runs, timelines)}


def study(services: Services, study_id: str = "") -> dict:
    """Read a study back: an "A*-PO vs GRPO" pair's verdict over its seeds, or a sweep's best grid point. Without a
    study_id, the list of studies.

    Args:
        study_id: the study's id (`launch_pair`, `launch_study` or a seeded `launch` return it); "" lists them.

    Returns:
        {"study", "kind", "name", "runs": [{"run_id", "name", "method", "seed", "point", "status"}], "active"}
        "verdict" and "figures" (a pair), "best" and "points" (a sweep)
        without a study_id: {"studies": [{"id", "label"}]}.
    """
    from app.studies import summary
    from app.studies.comparison import store_timeline
    from app.web.pages.compare import study_choices, study_members
    from app.web.pages.studies import best_line

    store = services.store
    if not str(study_id or "").strip():
        return {"studies": [{"id": sid, "label": label} for label, sid in study_choices(store)]}
    runs = study_members(store).get(str(study_id).strip())
    if not runs:
        raise gr.Error(f"No study {study_id!r}: call `study` without an id to list them.")
    tag = runs[0]["config"]["study"]
    timelines = [store_timeline(store, r) for r in runs]
    found = summary.summarize(runs, timelines)
    methods = {r["config"].get("method", "a2po") for r in runs}
    read = _verdict(services, runs, timelines)
    return {"study": tag["id"], "kind": tag.get("kind"), "name": tag.get("name"),
            "runs": [{"run_id": r["id"], "name": r["name"], "method": r["config"].get("method", "a2po"),
                      "seed": (r["config"].get("study") or {}).get("seed"),
                      "point": (r["config"].get("study") or {}).get("point"), "status": r["status"]} for r in runs],
            "active": read["active"], "protocol": read["protocol"],
            "verdict": read["verdict"] if methods == {"a2po", "grpo"} else None, "figures": read["figures"],
            "best": _plain(best_line(found)) if tag.get("kind") == "sweep" else None,
            "points": found.table() if tag.get("kind") == "sweep" else None}


# "extra": each reward function's value and the rewards' `log_extra` columns, where the run logged them.
COMPLETION_KEYS = ("step", "split", "prompt_id", "sample_index", "prompt_text", "completion", "reward", "v_star",
                   "advantage", "completion_length", "extra")


def completions(services: Services, run_id: int, step: int | None = None, limit: int = 20,
                correct: bool | None = None, text: str = "") -> dict:
    """Read what a run's policy wrote: its logged completions with their prompt, reward, V* and advantage (A*-PO's
    one per prompt and step, GRPO's group of G), newest step first.

    Args:
        run_id: the run's id.
        step: only this training step (None: the newest completions, whatever their step).
        limit: at most this many rows, 1 to 200.
        correct: true keeps rewarded completions, false the others, None both.
        text: only completions whose prompt or text contains this (case-insensitive).

    Returns:
        {"run_id", "steps" (the steps with completions), "rows"}
        rows: {"step", "split", "prompt_id", "sample_index", "prompt_text", "completion", "reward", "v_star"}
        and "advantage", "completion_length", "extra" (each reward's value, the rewards' log_extra columns).
    """
    limit = whole("limit", limit, 1, 200)
    step = None if step is None else whole("step", step)
    if not isinstance(text, str):
        raise gr.Error(f"text must be text (got {shown(text)}).")
    _run(services, run_id)
    rows = services.store.get_samples(int(run_id), step=step, correct=correct, text=text or None, limit=limit,
                                      newest_first=True)
    return {"run_id": int(run_id), "steps": services.store.sample_steps(int(run_id)),
            "rows": [{k: r.get(k) for k in COMPLETION_KEYS} for r in rows]}


def login(services: Services, username: str, password: str) -> dict:
    """A token for a studio user with a password: send it as the `x-a2po-token` header (or `Authorization: Bearer`).

    Args:
        username: the user's name.
        password: the user's password.

    Returns:
        {"token", "user"}; wrong credentials are an error.
    """
    auth = services.auth
    token = auth.login(str(username), str(password)) if auth.passwords else None
    if token is None:
        raise gr.Error("Wrong user name or password." if auth.passwords else "This studio has no password users.")
    return {"token": token, "user": username}


def playground(services: Services, run_id: int | None = None, model: str = "", prompt: str = "",
               num_samples: int = 4, answer: str = "", request: gr.Request = None) -> dict:
    """A run's reference and trained policies (or one model's) answer `prompt`: a greedy completion and samples
    each, scored by the run's reward. Needs a login where launching does.

    Args:
        run_id: the run whose policies answer (or give `model` instead).
        model: a model to ask alone, when no run_id is given.
        prompt: the prompt, at most 2000 characters.
        num_samples: samples per policy besides the greedy completion, 1 to 8.
        answer: the expected answer of a typed prompt, to score it.

    Returns:
        {"reference": [...], "trained": [...], "trained_from", "message", ...}
        items: {"completion", "reward", "greedy"}.
    """
    from app.web.pages.playground import play

    user = services.auth.identify(request=request)
    with _refusals_as_errors():
        return play(services, user, run_id=run_id, model=model, prompt=prompt, num_samples=num_samples,
                    answer=answer)


def try_reward(services: Services, spec: dict, sample_model: bool = True, request: gr.Request = None) -> dict:
    """Score a few of a spec's dataset prompts with its rewards before launching: each row's answer column (should
    score 1), a wrong answer (should score 0) and one model sample. Needs a login where launching does.

    Args:
        spec: a run spec, as `launch` reads it; only its dataset, rewards, model and sampling settings count.
        sample_model: also score one sample of the model (a model of at most 1B parameters).

    Returns:
        {"rows": [{"prompt", "kind", "completion", "reward"}], "verdict", "error", "note"}.
    """
    from app.web.pages.playground import try_reward as score

    user = services.auth.identify(request=request)
    with _refusals_as_errors():
        return score(services, user, spec, sample_model=bool(sample_model))


def upload_dataset(services: Services, file: str | None, request: gr.Request) -> dict:
    """Store a data file (.jsonl, .json, .csv, .parquet) for runs. Needs a login where launching does.

    Args:
        file: the file to store.

    Returns:
        {"file"}, to use as {"source": "file", "file": ...} in a spec's dataset.
    """
    problem = services.auth.can_launch(services.auth.identify(request=request))
    if problem:
        raise gr.Error(problem.replace("Launching runs", "Uploading data"))
    if not file:
        raise gr.Error("Send a file (gradio_client.handle_file(path)).")
    with _refusals_as_errors():
        stored = store_upload(services.policy, Path(file))
    return {"file": str(stored.relative_to(services.policy.datasets_dir))}


# ------------------------------------------------------------------ registration

READS = {"concurrency_limit": None}  # reads run side by side
WRITES = {"concurrency_limit": 1}  # one at a time per endpoint
PLAYGROUND = {"concurrency_limit": 1, "concurrency_id": "playground"}  # one queue for the playground's process
# Every endpoint but /upload_dataset (a file endpoint, `register_api`), named after its function.
ENDPOINTS: tuple[tuple[Callable[..., Any], dict[str, Any]], ...] = (
    (launch, WRITES), (launch_pair, WRITES), (launch_study, WRITES), (stop, WRITES), (resume, WRITES),
    (delete, WRITES), (status, READS), (list_runs, READS), (metrics, READS), (limits, READS), (login, WRITES),
    (playground, PLAYGROUND), (try_reward, PLAYGROUND), (compare, READS), (study, READS), (completions, READS),
)


def with_services(endpoint: Callable[..., Any], services: Services) -> Callable[..., Any]:
    """`endpoint` with its first argument given and its errors answered as a visitor may read them
    (`public_error`): what Gradio calls, for the API and the MCP tools alike. It keeps the endpoint's name,
    docstring and typed parameters (less `services`), from which Gradio documents the API."""
    @functools.wraps(endpoint)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return endpoint(services, *args, **kwargs)
        except gr.Error:
            raise
        except Exception as error:  # noqa: BLE001 - the one boundary between the studio's errors and a caller
            raise public_error(endpoint.__name__, error) from None

    signature = inspect.signature(endpoint)
    call.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    return call


def public_error(endpoint: str, error: Exception) -> gr.Error:
    """What a caller reads of an error inside endpoint `endpoint`: a refusal's or a bad argument's own sentence (our
    `Refused`, `StudyError` and `ValueError`s name the argument and the fix); for anything else (a database that
    does not answer, a bug) a plain sentence, the driver's text and the traceback going to the studio's log for its
    operator only: they can name the database server, its socket or the SQL."""
    if isinstance(error, (Refused, StudyError, ValueError)) and type(error).__module__.split(".")[0] in (
            "app", "a2po", "storage", "builtins"):
        return gr.Error(str(error)[:2000])
    logger.error("/%s failed (the caller read a plain message)", endpoint, exc_info=error)
    if type(error).__module__.split(".")[0] in ("sqlalchemy", "psycopg", "sqlite3"):
        return gr.Error(f"/{endpoint}: the studio's database did not answer (it may be restarting); try again in a "
                        "moment.")
    return gr.Error(f"/{endpoint} could not answer: an error inside the studio, written to its log for the "
                    "operator.")


def register_api(services: Services) -> None:
    """Add the named endpoints (inside gr.Blocks): `ENDPOINTS` and /upload_dataset."""
    for endpoint, options in ENDPOINTS:
        gr.api(with_services(endpoint, services), api_name=endpoint.__name__, **options)
    # A file endpoint needs a file component: an invisible one, used only by API clients.
    upload_in = gr.File(visible=False, file_types=list(allowlist.DATA_SUFFIXES))
    upload_button = gr.Button(visible=False)
    upload_button.click(with_services(upload_dataset, services), upload_in, gr.JSON(visible=False),
                        api_name="upload_dataset", concurrency_limit=2)


def json_tool_results() -> None:
    """Make `launch(mcp_server=True)` answer tool calls in JSON: Gradio's MCP server writes a tool's dict or list as
    `str(value)`, Python's repr (None, True, single quotes), which an agent's JSON parser cannot read. Call it before
    the launch, which builds the server from `gradio.mcp.GradioMCPServer`."""
    import gradio.mcp

    if getattr(gradio.mcp.GradioMCPServer, "answers_in_json", False):
        return

    class JSONAnswers(gradio.mcp.GradioMCPServer):
        answers_in_json = True

        def postprocess_output_data(self, data: Any, root_url: str) -> list[Any]:
            parts = []
            for value in data:
                if isinstance(value, (dict, list)):
                    parts.append(self.types.TextContent(type="text", text=json.dumps(value, default=str)))
                else:
                    parts.extend(super().postprocess_output_data([value], root_url))
            return parts

    gradio.mcp.GradioMCPServer = JSONAnswers
