"""Named API endpoints, so a script can drive the dashboard with `gradio_client` (documented in docs/api.md).

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    run = client.predict(spec={"action": "train", "model": "SmolLM2-135M-Instruct"}, api_name="/launch")
    client.predict(run_id=run["run_id"], api_name="/status")
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from app import forms
from app.ui.common import ACTIVE, Services
from app.ui.launch import offline

RUN_KEYS = ("id", "name", "kind", "status", "stage", "progress", "model", "dataset", "created_at", "started_at",
            "finished_at", "heartbeat_at", "error", "best_eval_accuracy", "value_set_id", "output_dir")


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The public fields of a run row (no process id, no spec) plus whether it is still active."""
    return {**{k: run.get(k) for k in RUN_KEYS}, "active": run["status"] in ACTIVE}


def register_api(services: Services) -> None:
    """Add the endpoints /launch, /stop, /resume, /delete, /status, /list_runs and /metrics (inside gr.Blocks)."""
    store, jobs = services.store, services.jobs

    def get(run_id: int) -> dict[str, Any]:
        run = store.get_run(int(run_id))
        if run is None:
            raise gr.Error(f"No run #{run_id}.")
        return run

    def launch(spec: dict) -> dict:
        """Validate a run spec (see docs/api.md) and queue it. Returns {"run_id", "name", "command"}."""
        problem = forms.validate_spec(spec, offline=offline())
        if problem:
            raise gr.Error(problem)
        run_id = jobs.submit(dict(spec))
        return {"run_id": run_id, "name": store.get_run(run_id)["name"], "command": forms.command_line(spec)}

    def stop(run_id: int) -> dict:
        """Ask a queued or running run to stop (it saves a checkpoint first). Returns the run's status."""
        get(run_id)
        jobs.stop(int(run_id))
        return run_summary(get(run_id))

    def resume(run_id: int) -> dict:
        """Queue a stopped or failed run again; it continues from its last checkpoint and stored V* values."""
        get(run_id)
        try:
            jobs.resume(int(run_id))
        except (ValueError, RuntimeError) as exc:
            raise gr.Error(str(exc)) from exc
        return run_summary(get(run_id))

    def delete(run_id: int) -> dict:
        """Delete a run that is not running, with its metrics, samples and files."""
        get(run_id)
        try:
            jobs.delete(int(run_id))
        except (ValueError, RuntimeError) as exc:
            raise gr.Error(str(exc)) from exc
        return {"deleted": int(run_id)}

    def status(run_id: int) -> dict:
        """A run's status, stage, progress, error and best eval accuracy, plus its latest value of each metric."""
        run = get(run_id)
        latest: dict[str, Any] = {}
        for row in store.get_metrics(run["id"]):
            latest[row["name"]] = {"step": row["step"], "value": row["value"]}
        value_set = store.get_value_set(run["value_set_id"]) if run.get("value_set_id") else None
        values = None
        if value_set:
            values = {"num_prompts": value_set["num_values"], "complete": bool(value_set["complete"]),
                      "summary": value_set.get("summary")}
        return {**run_summary(run), "spec": run.get("config"), "latest_metrics": latest, "values": values}

    def list_runs() -> list:
        """Every run, newest first (the fields of /status without metrics)."""
        return [run_summary(r) for r in store.list_runs()]

    def metrics(run_id: int, after_id: int = 0) -> list:
        """Metric rows {id, step, name, value} of a run with id > after_id (poll with the largest id seen)."""
        get(run_id)
        return [{k: r[k] for k in ("id", "step", "name", "value")}
                for r in store.get_metrics(int(run_id), after_id=int(after_id))]

    for fn in (launch, stop, resume, delete, status, list_runs, metrics):
        gr.api(fn, api_name=fn.__name__, concurrency_limit=None if fn in (status, list_runs, metrics) else 1)
