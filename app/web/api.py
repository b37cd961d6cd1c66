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
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr

from app.access import allowlist
from app.access.gate import Refused, Services, store_upload
from app.studies.protocols import StudyError, budget_seconds
from app.web import forms, live
from app.web.common import clock_from_metrics, estimate_remaining, stage1_seconds, training_seconds
from storage.lifecycle import UNFINISHED
from storage.secrets import scrub_text

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


def _run(services: Services, run_id: int) -> dict[str, Any]:
    run = services.store.get_run(int(run_id))
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
    """Check a run spec (see docs/api.md; missing keys take the teaching demo's values, `preset` picks another
    preset) and queue it. Returns {"run_id", "name", "command"}; every problem is named at once. `seeds` (e.g.
    [0, 1, 2]): one run per run seed, launched together as one study (all or nothing); then also "run_ids" and
    "study"."""
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
                seeds: list | str | None = None, request: gr.Request = None) -> dict:
    """"A*-PO vs GRPO": queue the A*-PO run `spec` describes (as /launch reads it; an A*-PO spec) and a GRPO run
    matched to it (same model, prompts, held-out set, learning rate and schedule, completion length; G = N >= 2;
    GRPO's batch = G x A*-PO's, so the same prompts per step) under `protocol`: "paper" (the default: both over
    every prompt, A*-PO's filter off, the same number of steps), "trl" (TRL's defaults: A*-PO's filter on) or
    "time" (both stop after `budget_minutes` of training time, A*-PO's stage 1 included). `seeds` (e.g. [0, 1,
    2]): one pair per run seed, as one study. Every run passes the same checks and limits, or none is queued.
    Returns {"a2po": {"run_id", "name"}, "grpo": {...}} (the first seed's), "pairs" (one per seed) and
    "study"; compare them on the Compare page."""
    store, user = services.store, services.auth.identify(request=request)
    with _refusals_as_errors():
        budget = budget_seconds(budget_minutes)
        pairs = services.launch_pair(spec, user, protocol=protocol, budget_seconds=budget, seeds=seeds)
    described = [{method: {"run_id": run_id, "name": store.get_run(run_id)["name"]}
                  for method, run_id in zip(("a2po", "grpo"), pair, strict=True)} for pair in pairs]
    study = store.get_run(pairs[0][0])["config"]["study"]
    return {**described[0], "pairs": described, "study": study["id"], "protocol": protocol}


def launch_study(services: Services, spec: dict, grid: dict | None = None, seeds: list | str | None = None,
                 request: gr.Request = None) -> dict:
    """A sweep: the run `spec` describes (as /launch reads it) at every point of `grid`, a mapping of config
    settings to values (e.g. {"beta2": [0.001, 0.01], "learning_rate": [1e-5, 2e-5]}; "method": ["a2po",
    "grpo"] adds GRPO runs matched to each A*-PO point under the paper's protocol), once per run seed in `seeds`,
    as one study: every run passes the checks and limits, or none is queued. A*-PO runs whose stage-1 settings
    match share one V* set, sampled once. Returns {"study", "runs": [{"run_id", "name", "point", "seed",
    "method"}], "stage1": {"value_sets", "a2po_runs", "saved_runs"}}; read it on the Studies page."""
    from app.studies.sweeps import shared_stage_one

    with _refusals_as_errors():
        ids = services.launch_sweep(spec, services.auth.identify(request=request), grid, seeds)
    runs = [services.store.get_run(i) for i in ids]
    return {"study": runs[0]["config"]["study"]["id"],
            "runs": [{"run_id": r["id"], "name": r["name"], "point": r["config"]["study"]["point"],
                      "seed": r["config"]["study"]["seed"], "method": r["config"].get("method", "a2po")}
                     for r in runs],
            "stage1": shared_stage_one([r["config"] for r in runs])}


def stop(services: Services, run_id: int, request: gr.Request) -> dict:
    """Ask a queued or running run to stop (it saves a checkpoint first). Returns the run's status."""
    with _refusals_as_errors():
        services.act("stop", run_id, services.auth.identify(request=request))
    return run_summary(_run(services, run_id), services.public_text)


def resume(services: Services, run_id: int, request: gr.Request) -> dict:
    """Queue a stopped, interrupted or failed run again; it continues from its last checkpoint and stored V*.
    `warnings`: its registered rewards that changed since it started (it goes on with the current ones)."""
    from a2po.reward_registry import reward_changes

    with _refusals_as_errors():
        services.act("resume", run_id, services.auth.identify(request=request))
    run = _run(services, run_id)
    return {**run_summary(run, services.public_text),
            "warnings": reward_changes((run.get("config") or {}).get("rewards"), what="the resumed run")}


def delete(services: Services, run_id: int, request: gr.Request) -> dict:
    """Delete a run with its metrics, samples and files (its worker is killed if it runs)."""
    with _refusals_as_errors():
        services.act("delete", run_id, services.auth.identify(request=request))
    return {"deleted": int(run_id)}


def status(services: Services, run_id: int) -> dict:
    """A run's status, stage, progress, error and best eval accuracy, its clock (training time and the
    remaining estimate), plus its latest value of each metric."""
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
    """Every run, newest first (the fields of /status without metrics, with its clock)."""
    runs = services.store.list_runs()
    clocks = services.store.run_clocks(r["id"] for r in runs)
    return [{**run_summary(r, services.public_text), "clock": clock_summary(r, clocks.get(r["id"]))} for r in runs]


def metrics(services: Services, run_id: int, after_id: int = 0) -> list:
    """Metric rows {id, step, name, value} of a run with id > after_id (poll with the largest id seen)."""
    _run(services, run_id)
    return [{k: r[k] for k in ("id", "step", "name", "value")}
            for r in services.store.get_metrics(int(run_id), after_id=int(after_id))]


def limits(services: Services, request: gr.Request = None) -> dict:
    """This studio's limits (None: no limit), whether launching needs a login, what the operator allowed, and
    where runs go (`runs_go_to`: this machine, or the Ray cluster; its address for a signed-in admin only)."""
    from a2po.reward_registry import read_registry
    from app.web.pages.launch import reward_choices

    policy, auth = services.policy, services.auth
    registry = read_registry()
    return {"limits": policy.limits.describe(), "public": policy.public, "login_required": auth.required,
            "allow_remote_code": policy.allow_remote_code, "allow_hub_push": policy.allow_hub_push,
            "allow_hub": policy.allow_hub, "settable": [p.key for p in allowlist.PARAMS],
            "runs_go_to": runs_go_to(services, auth.identify(request=request)),
            "rewards": [{"name": n, "doc": d, "registered": n in registry.rewards}
                        for n, d in reward_choices().items()]}


def login(services: Services, username: str, password: str) -> dict:
    """A token for a studio user: send it as the `x-a2po-token` header. Wrong credentials are an error."""
    auth = services.auth
    token = auth.login(str(username), str(password)) if auth.passwords else None
    if token is None:
        raise gr.Error("Wrong user name or password." if auth.passwords else "This studio has no password users.")
    return {"token": token, "user": username}


def playground(services: Services, run_id: int | None = None, model: str = "", prompt: str = "",
               num_samples: int = 4, answer: str = "", request: gr.Request = None) -> dict:
    """A run's reference and trained policies (or one model's) answer `prompt`: a greedy completion and
    `num_samples` (1-8) samples each, scored by the run's reward (`answer`: the expected answer of a typed
    prompt). Returns {"reference": [...], "trained": [...], ...}, items {"completion", "reward", "greedy"}.
    Needs a login where launching does."""
    from app.web.pages.playground import play

    user = services.auth.identify(request=request)
    with _refusals_as_errors():
        return play(services, user, run_id=run_id, model=model, prompt=prompt, num_samples=num_samples,
                    answer=answer)


def try_reward(services: Services, spec: dict, sample_model: bool = True, request: gr.Request = None) -> dict:
    """Score a few of a spec's dataset prompts with its rewards before launching: each row's answer column
    (should score 1), a wrong answer (should score 0) and, with `sample_model` and a small model, one sample.
    Returns {"rows": [{"prompt", "kind", "completion", "reward"}], "verdict", "error", "note"}. Needs a login
    where launching does; runs in the playground's process."""
    from app.web.pages.playground import try_reward as score

    user = services.auth.identify(request=request)
    with _refusals_as_errors():
        return score(services, user, spec, sample_model=bool(sample_model))


def upload_dataset(services: Services, file: str | None, request: gr.Request) -> dict:
    """Store a data file (.jsonl, .json, .csv, .parquet) for runs: returns {"file"} to use as
    `{"source": "file", "file": ...}` in a spec. Needs a login where launching does."""
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
    (playground, PLAYGROUND), (try_reward, PLAYGROUND),
)


def with_services(endpoint: Callable[..., Any], services: Services) -> Callable[..., Any]:
    """`endpoint` with its first argument given: what Gradio calls. It keeps the endpoint's name, docstring and
    typed parameters (less `services`), from which Gradio documents the API."""
    @functools.wraps(endpoint)
    def call(*args: Any, **kwargs: Any) -> Any:
        return endpoint(services, *args, **kwargs)

    signature = inspect.signature(endpoint)
    call.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    return call


def register_api(services: Services) -> None:
    """Add the named endpoints (inside gr.Blocks): `ENDPOINTS` and /upload_dataset."""
    for endpoint, options in ENDPOINTS:
        gr.api(with_services(endpoint, services), api_name=endpoint.__name__, **options)
    # A file endpoint needs a file component: an invisible one, used only by API clients.
    upload_in = gr.File(visible=False, file_types=list(allowlist.DATA_SUFFIXES))
    upload_button = gr.Button(visible=False)
    upload_button.click(with_services(upload_dataset, services), upload_in, gr.JSON(visible=False),
                        api_name="upload_dataset", concurrency_limit=2)
