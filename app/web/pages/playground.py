"""Playground page: the reference policy and a run's trained policy answer one prompt side by side (a greedy
completion and a few samples each), scored by the run's reward.

Models run in the playground's own process (`app.runtime.playground`: its cache, its share of the machine and its
limits); this module checks who asks and what, picks the weights, shows the answer, and says what "Try the reward"
found (`reward_verdict`). The `/playground` and `/try_reward` endpoints (`app.web.api`) go through it too.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from a2po.answers import CORRECT_THRESHOLD, prompt_question
from app.access import allowlist
from app.access.auth import User
from app.access.gate import Refused, Services, offline
from app.runtime.checkpoints import trained_weights
from app.runtime.playground.client import (
    KINDS,
    MAX_PROMPT_CHARS,
    MAX_SAMPLES,
    PlaygroundClient,
    PlaygroundError,
    build_request,
    build_try_request,
    check_request,
    choose_gpu,
)
from app.web.common import model_choices, run_choices, short
from storage.lifecycle import LIVE

PROMPTS_PER_SPLIT = 100  # prompts of each split offered in the picker
COLUMNS = ["completion #", "reward", "completion"]
WIDTHS = ["18%", "12%", "70%"]
DEFAULT_SAMPLES = 4

_clients: dict[Path, PlaygroundClient] = {}
_clients_lock = threading.Lock()


def client_for(services: Services) -> PlaygroundClient:
    """The studio's one playground process (started on first use), shared by the page and the API."""
    with _clients_lock:
        client = _clients.get(services.data_dir)
        if client is None:
            client = PlaygroundClient(services.data_dir, env=services.policy.worker_environment(),
                                      gpu=lambda: playground_gpu(services))
            _clients[services.data_dir] = client
        return client


def playground_gpu(services: Services) -> str | None:
    """The GPU for a new playground process: one no active run uses, else the first (shared); None on a CPU
    machine or a studio told to use no GPU (then it sees what the studio's workers see)."""
    gpus = tuple(getattr(getattr(services.scheduler, "devices", None), "gpus", ()) or ())
    if not gpus:
        return None
    busy = {d for run in services.store.list_runs(status=LIVE) for d in (run.get("devices") or "").split(",") if d}
    return choose_gpu(gpus, busy)


def no_weights_message(run: dict[str, Any]) -> str:
    if run.get("action") != "train":
        return (f"Run #{run['id']} is a '{run.get('action')}' run: it trains nothing, so only the reference policy "
                "answers.")
    return (f"Run #{run['id']} has no trained weights yet (it saves a checkpoint every few minutes of training and its "
            "final model at the end): only the reference policy answers for now.")


def play(services: Services, user: User | None, *, run_id: Any = None, model: str = "", prompt: str = "",
         num_samples: Any = DEFAULT_SAMPLES, answer: str = "") -> dict[str, Any]:
    """Answer one playground request for `user` (a login where launching needs one; `Refused` otherwise, or for a
    bad request): `{"reference": [...], "trained": [...], ...}`, items `{"completion", "reward", "greedy"}`;
    `scored` false comes with `unscored_reason` (a column the run's reward needs, no expected answer, ...)."""
    problem = services.auth.can_launch(user)
    if problem:
        raise Refused(problem.replace("Launching runs", "The playground (it runs models)"))
    try:
        prompt, num_samples, answer = check_request(prompt, num_samples, answer)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    model = model.strip() if isinstance(model, str) else ""
    run = None
    if run_id not in (None, ""):
        if model:
            raise Refused("Give a run or a model, not both (a run brings its own model).")
        try:
            run = services.store.get_run(int(run_id))
        except (TypeError, ValueError):
            run = None
        if run is None:
            raise Refused(f"No run #{run_id}.")
    elif model:
        problem = allowlist.check_model(model, services.policy, offline=offline())
        if problem:
            raise Refused(problem)
    else:
        raise Refused("Pick a run (its base model against its trained weights) or a model.")

    client = client_for(services)
    started = time.monotonic()
    for attempt in (1, 2):
        weights = trained_weights(services.store, run, services.data_dir) if run is not None else None
        request = build_request(prompt=prompt, num_samples=num_samples, answer=answer, limits=services.policy.limits,
                                run=run, model=model or None, weights=weights)
        try:
            result = client.ask(request)
            break
        except PlaygroundError as exc:
            # A running run's checkpoint rotation may remove the folder just picked: pick again, once.
            if attempt == 1 and weights is not None and not weights[0].is_dir():
                continue
            raise Refused(str(exc)) from None
    message = None
    if run is not None and weights is None:
        message = no_weights_message(run)
    return {"reference": result["reference"], "trained": result["trained"],
            "trained_from": weights[1] if weights else None, "message": message,
            "seconds": round(time.monotonic() - started, 3), "cached": result["cached"],
            "load_seconds": result["load_seconds"], "generate_seconds": result["generate_seconds"],
            "matched": result["matched"], "scored": result["scored"],
            "unscored_reason": result.get("unscored_reason")}


def try_reward(services: Services, user: User | None, spec: Any, *, sample_model: bool = True) -> dict[str, Any]:
    """"Try the reward" for `user` (a login where launching needs one): the spec's rewards score a few of its
    dataset's prompts, with each row's answer column (should score 1), a wrong answer (should score 0) and, when
    `sample_model` and the model is small, one sample of the model each, in the playground's process (a registered
    reward's module is imported there, never here). Missing keys take the teaching demo's values, as in `/launch`;
    only the dataset, the rewards and the sampling settings must be valid. Returns {"rows": [{"prompt", "kind",
    "completion", "reward"}], "verdict", "error", "note", "seconds"}."""
    from a2po.runspec import SAMPLING_FIELDS

    problem = services.auth.can_launch(user)
    if problem:
        raise Refused(problem.replace("Launching runs", "Trying a reward (it runs the reward and a model)"))
    if not isinstance(spec, dict):
        raise Refused("The spec must be a JSON object (see /launch).")
    partial: dict[str, Any] = {k: spec[k] for k in ("preset", "dataset", "rewards") if k in spec}
    config = spec.get("config") if isinstance(spec.get("config"), dict) else {}
    partial["config"] = {k: config[k] for k in (*SAMPLING_FIELDS, "seed") if k in config}
    partial["config"].pop("num_value_samples", None)
    result = allowlist.check_spec(partial, services.policy, offline=offline())
    if not result.ok:
        raise Refused(result.message())
    model = spec.get("model") if isinstance(spec.get("model"), str) and spec["model"].strip() else \
        result.spec["model"]
    note = None
    if sample_model:
        problem = allowlist.check_model(model, services.policy, offline=offline())
        if problem:
            model, note = None, f"The model was not sampled: {problem}"
    request = build_try_request(dataset=result.spec["dataset"], rewards=result.spec["rewards"],
                                model=model if sample_model else None, config=result.spec["config"],
                                limits=services.policy.limits)
    started = time.monotonic()
    try:
        answer = client_for(services).ask(request)
    except PlaygroundError as exc:
        raise Refused(str(exc)) from None
    answer["note"] = " ".join(n for n in (note, answer.get("note")) if n) or None
    return {"rows": answer["rows"], "verdict": reward_verdict(answer), "error": answer.get("error"),
            "note": answer["note"], "seconds": round(time.monotonic() - started, 3)}


def reward_verdict(result: dict[str, Any]) -> str:
    """One line on what "Try the reward" found: whether the reward tells the answer column (it should score 1)
    from a wrong answer (0), what the model's samples score, and rewards that failed or are not binary."""
    if result.get("error"):
        return f"❌ The reward failed: {result['error']}"
    rows = result.get("rows") or []
    scores = {kind: [r["reward"] for r in rows if r["kind"] == label] for kind, label in KINDS.items()}
    answers, wrongs, samples = scores["answer"], scores["wrong"], scores["sample"]
    if not answers:
        return "⚠ The dataset has no answer column (ground_truth): only the model's samples could be scored."
    n = len(answers)
    right = sum(r >= CORRECT_THRESHOLD for r in answers)
    fooled = sum(r >= CORRECT_THRESHOLD for r in wrongs)
    if right == 0:
        line = (f"⚠ This reward gives 0 to the dataset's own answers ({n} of {n} prompts): training would see 0 "
                "everywhere and learn nothing. Check the answer column, and the format the function expects.")
    elif fooled == len(wrongs):
        line = (f"⚠ This reward gives 1 to wrong answers too ({fooled} of {len(wrongs)} prompts): it cannot tell "
                "right from wrong.")
    elif right == n and fooled == 0:
        line = (f"✅ The reward tells right from wrong: the answer column scores 1 on {right} of {n} prompts, a wrong "
                f"answer 0 on {len(wrongs)} of {len(wrongs)}.")
    else:
        line = (f"⚠ Mixed: the answer column scores 1 on {right} of {n} prompts, a wrong answer 1 on {fooled} of "
                f"{len(wrongs)}.")
    if samples:
        line += f" The model's samples score 1 on {sum(r >= CORRECT_THRESHOLD for r in samples)} of {len(samples)}."
    odd = next((r for r in answers + wrongs + samples if r not in (0.0, 1.0)), None)
    if odd is not None:
        line += f" Some rewards are outside {{0, 1}} (e.g. {odd:g}): A*-PO counts only 1 as correct."
    if result.get("note"):
        line += f" {result['note']}"
    return line


def run_prompts(services: Services, run: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, question) of the run's prompts from its stored V* rows, `PROMPTS_PER_SPLIT` per split: the
    question, not the chat template around it."""
    if run is None:
        return []
    store, seen, out = services.store, set(), []
    for split in sorted(s for s, n in (run.get("value_counts") or {}).items() if n):
        for row in islice(store.iter_values(run["id"], split, batch=PROMPTS_PER_SPLIT), PROMPTS_PER_SPLIT):
            question = prompt_question(row.get("prompt") if row.get("prompt") is not None else row["prompt_text"])
            if question and question not in seen and len(question) <= MAX_PROMPT_CHARS:
                seen.add(question)
                out.append((f"[{split}] {short(question, 110)}", question))
    return out


def completions_frame(items: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"completion #": "greedy" if item["greedy"] else f"sample {i}",
             "reward": "–" if item["reward"] is None else f"{item['reward']:g}", "completion": item["completion"]}
            for i, item in enumerate(items)]
    return pd.DataFrame(rows, columns=COLUMNS)


def trained_title(label: str | None) -> str:
    return f"### Trained policy ({label})" if label else "### Trained policy"


def describe(result: dict[str, Any]) -> str:
    """The status line: latency, where the models came from, how the completions were scored."""
    models = "models cached" if result["cached"] else f"models loaded in {result['load_seconds']:.1f} s"
    timing = f"Answered in {result['seconds']:.1f} s ({models}; decoding {result['generate_seconds']:.1f} s)."
    if result["scored"]:
        scoring = ("Scored with the run's reward and this prompt's row of the run's data." if result["matched"]
                   else "Scored against the expected answer.")
    else:
        scoring = f"⚠ Rewards – : {result.get('unscored_reason') or 'Nothing was scored.'}"
    parts = [f"✅ {timing}", scoring]
    if result.get("message"):
        parts.append(f"⚠ {result['message']}")
    return " ".join(parts)


@dataclass
class PlaygroundPage:
    picker: gr.Dropdown
    model: gr.Dropdown
    services: Services
    token: Any

    def refresh_on(self, tab: gr.Tab) -> None:
        """Opening `tab` (the one holding this page) refreshes its pickers and, for a user who may use it, starts
        the playground process in the background (its imports overlap with picking a run and a prompt)."""
        services = self.services

        def opened(token: str | None, request: gr.Request):
            user = services.auth.identify(token=token, request=request)
            if services.auth.can_launch(user) is None:
                client_for(services).warm()
            return gr.Dropdown(choices=run_choices(services.store)), gr.Dropdown(choices=model_choices(services))

        tab.select(opened, self.token, [self.picker, self.model], api_visibility="private")


def build_playground_page(services: Services, token: gr.BrowserState | None = None) -> PlaygroundPage:
    """Lay out the page; returns its run picker and model box (`PlaygroundPage.refresh_on` refreshes them)."""
    gr.Markdown("## Playground\nPick a run to compare its reference policy (the base model) with its trained policy "
                "(the final model, or the newest checkpoint of a run still training), or pick just a model. Each "
                "answers with a greedy completion and a few samples, scored by the run's reward. Models run in a "
                "process of their own, at a low priority beside any training run.")
    with gr.Row():
        picker = gr.Dropdown(choices=run_choices(services.store), value=None, label="Run", scale=2,
                             elem_id="playground-run")
        model = gr.Dropdown(choices=model_choices(services), value=None, allow_custom_value=True, scale=2,
                            label="…or a model (no run: the reference policy only)", elem_id="playground-model")
    with gr.Row():
        prompts = gr.Dropdown(choices=[], value=None, label="A prompt of the run's data", scale=3,
                              elem_id="playground-pick")
        samples = gr.Slider(1, MAX_SAMPLES, value=DEFAULT_SAMPLES, step=1, label="Samples (besides greedy)", scale=1,
                            elem_id="playground-samples")
    with gr.Row():
        prompt = gr.Textbox(label=f"Prompt (at most {MAX_PROMPT_CHARS} characters)", lines=2, scale=3,
                            max_length=MAX_PROMPT_CHARS, elem_id="playground-prompt")
        answer = gr.Textbox(label="Expected answer (scores a typed prompt; optional)", scale=1,
                            elem_id="playground-answer")
    button = gr.Button("Generate", variant="primary", elem_id="playground-go")
    status = gr.Markdown(elem_id="playground-status")
    with gr.Row(equal_height=False):
        with gr.Column():
            gr.Markdown("### Reference policy")
            reference_table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, column_widths=WIDTHS,
                                           elem_id="playground-reference")
        with gr.Column():
            title = gr.Markdown(trained_title(None), elem_id="playground-trained-title")
            trained_table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, column_widths=WIDTHS,
                                         elem_id="playground-trained")

    private = {"api_visibility": "private"}

    def pick_run(run_id: int | None):
        run = services.store.get_run(int(run_id)) if run_id is not None else None
        if run is None:
            return gr.Dropdown(choices=[], value=None), trained_title(None), ""
        weights = trained_weights(services.store, run, services.data_dir)
        note = "" if weights else f"⚠ {no_weights_message(run)}"
        return (gr.Dropdown(choices=run_prompts(services, run), value=None),
                trained_title(weights[1] if weights else "no trained weights yet"), note)

    picker.change(pick_run, picker, [prompts, title, status], **private)
    picker.input(lambda: None, None, model, **private)  # a run brings its own model
    model.input(lambda: (None, gr.Dropdown(choices=[], value=None)), None, [picker, prompts], **private)
    prompts.input(lambda question: (question or gr.skip(), ""), prompts, [prompt, answer], **private)

    token = token if token is not None else gr.State(None)

    def generate(data: dict, request: gr.Request):
        user = services.auth.identify(token=data[token], request=request)
        try:
            result = play(services, user, run_id=data[picker], model=data[model] or "", prompt=data[prompt] or "",
                          num_samples=int(data[samples]), answer=data[answer] or "")
        except Refused as exc:
            return f"❌ {exc}", gr.skip(), gr.skip(), gr.skip()
        label = result["trained_from"] or ("no trained weights yet" if data[picker] is not None else None)
        return (describe(result), completions_frame(result["reference"]), trained_title(label),
                completions_frame(result["trained"]))

    button.click(generate, {token, picker, model, prompt, answer, samples},
                 [status, reference_table, title, trained_table], concurrency_limit=1, concurrency_id="playground",
                 **private)
    return PlaygroundPage(picker=picker, model=model, services=services, token=token)
