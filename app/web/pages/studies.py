"""Studies page: a sweep (or any study) read back as one table, one row per grid point with the median over its
seeds (`app.studies.summary`); a heatmap for two-field grids (else a bar per point); each point's median curve; the
best point, with "Clone into the Launch form" and "Save as a preset"; what one stage 1 per V* set saved; and the
study's runs stopped, resumed or deleted together (each through the gate, as the user may)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from a2po.compute import format_flops
from app.access.gate import Refused, Services
from app.studies import comparison, summary
from app.web import charts, saved_presets
from app.web.pages.compare import study_choices, study_runs


@dataclass
class StudiesPage:
    picker: gr.Dropdown
    clone: gr.Button
    best_run: gr.State  # the run id whose spec "Clone into the Launch form" loads (the best point's first seed)


def describe(tag: Mapping[str, Any], runs: list[dict[str, Any]]) -> str:
    """The study's header: its kind, grid and seeds, and where its runs stand."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    states = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    grid = tag.get("grid") or {}
    kind = {"sweep": "Sweep", "pair": "A*-PO vs GRPO", "seeds": "Seeds"}.get(str(tag.get("kind")), "Study")
    lines = [f"**{kind} {comparison.escape_markdown(str(tag.get('name', '')))}** ({len(runs)} runs: {states})"]
    if grid:
        lines.append("Grid: " + "; ".join(f"`{k}` ∈ {{{', '.join(map(str, v))}}}" for k, v in grid.items())
                     + f", each over {tag.get('seeds', 1)} run seed(s)"
                     + (" at the last rung (the rungs before it run the first seed)." if tag.get("halving") else "."))
    if tag.get("protocol"):
        lines.append(f"Protocol: {tag['protocol']}.")
    if isinstance(tag.get("halving"), dict):
        lines.append(halving_line(tag, runs))
    return "  \n".join(lines)


def halving_line(tag: Mapping[str, Any], runs: list[dict[str, Any]]) -> str:
    """A halving sweep's rule and where it stands: each rung's share of the budget and its points."""
    from a2po.sweep import Halving

    halving = Halving(**tag["halving"])
    per_rung: dict[int, set[str]] = {}
    for run in runs:
        label = (run["config"].get("study") or {})
        per_rung.setdefault(int(label.get("rung") or 0), set()).add(repr(sorted((label.get("point") or {}).items())))
    config = runs[0]["config"].get("config") or {}
    budget = (format_flops(config["max_train_flops"]) if config.get("max_train_flops") else
              comparison.format_duration(config.get("max_train_seconds")))
    rungs = "; ".join(f"rung {r}: {len(per_rung.get(r, ()))} point(s) on {halving.share(r):.3g} of it"
                      + (f", {len(tag.get('seed_list') or [1])} seed(s) each" if r == halving.rungs - 1 else "")
                      for r in range(halving.rungs) if r in per_rung)
    return (f"Successive halving ({halving.search}): the best 1/{halving.reduction_factor} of the points go on at each "
            f"rung, by median final held-out accuracy; a budget of {budget} per run, each rung on its share of what "
            f"stage 1 leaves of it. {rungs}.")


def best_line(found: summary.StudySummary, store: Any = None) -> str:
    """The best point (and each method's, with both in the grid), and with `store` how sure: its paired bootstrap
    difference from the runner-up over their seeds and held-out prompts."""
    best = found.best
    if best is None:
        return "The best point is marked when every run of a point has finished."

    def one(row: summary.PointRow) -> str:
        return (f"{comparison.escape_markdown(row.label)} ({comparison.METHOD_LABELS.get(row.method, row.method)}): "
                f"median final held-out accuracy {summary.percent(row.final)} over {len(row.run_ids)} seed(s) "
                f"(range {summary.percent(row.final_range[0])}–{summary.percent(row.final_range[1])}), training time "
                f"{comparison.format_duration(row.training_seconds)}")

    text = f"**Best point:** {one(best)}."
    rival = found.runner_up
    if store is not None and rival is not None:
        difference = comparison.paired_difference(
            store, [store.get_run(i) for i in best.run_ids], [store.get_run(i) for i in rival.run_ids],
            labels=(comparison.escape_markdown(best.label), comparison.escape_markdown(rival.label)))
        if difference is not None:
            text += f"  \n**Against the runner-up:** {difference.text(target=None)}"
    if found.best_by_method:  # a grid over both methods: each at its own best setting
        text += "  \n**Each method at its own best:** " + "; ".join(one(r) for r in found.best_by_method.values())
    return text


def fitted_table(frame: pd.DataFrame) -> gr.Dataframe:
    """The points' table with each column as wide as its longest cell or header word, a setting's name breaking at
    its underscores (a grid's short values beside long TRL names would otherwise squeeze a name letter by letter),
    the star and the settings pinned while the figures scroll sideways."""
    headers = {name: name.replace("_", "_\u200b") for name in frame.columns}
    widths = []
    for name in frame.columns:
        words = headers[name].replace("\u200b", " ").split() or [""]
        longest = max([len(w) for w in words] + [len(str(cell)) for cell in frame[name]])
        widths.append(f"{min(max(longest, 2), 30) * 9 + 28}px")
    pinned = list(frame.columns).index("method") if "method" in frame.columns else 0  # the settings stay in view
    return gr.Dataframe(value=frame.rename(columns=headers), column_widths=widths, pinned_columns=pinned)


def build_studies_page(services: Services, token: gr.BrowserState | None = None) -> StudiesPage:
    """Lay out the page; returns its picker and the clone button (wired to the Launch form by `app.web`)."""
    store = services.store
    gr.Markdown("## Studies\nA study's runs read together: a sweep's grid points with the median over their seeds, "
                "an \"A*-PO vs GRPO\" pair's seeds. Launch a sweep from the Launch page (Sweep) or `/launch_study`.")
    with gr.Row():
        picker = gr.Dropdown(choices=study_choices(store), value=None, label="Study", scale=4,
                             elem_id="study-picker")
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=100, elem_id="study-refresh")
    header = gr.Markdown("Pick a study.", elem_id="study-header")
    table = gr.Dataframe(interactive=False, wrap=True, elem_id="study-table",
                         label="One row per grid point (★: the best)")
    with gr.Row():
        grid_plot = gr.Plot(label="Final accuracy over the grid", elem_id="study-heatmap")
        curves = gr.Plot(label="Median curves", elem_id="study-curves")
    best = gr.Markdown("", elem_id="study-best")
    saved = gr.Markdown("", elem_id="study-stage-one")
    with gr.Row():
        clone = gr.Button("Clone the best point into the Launch form", size="sm", elem_id="study-clone-best")
        stop = gr.Button("Stop the study", size="sm", variant="stop", elem_id="study-stop")
        resume = gr.Button("Resume the study", size="sm", elem_id="study-resume")
        delete = gr.Button("Delete the study", size="sm", variant="stop", elem_id="study-delete")
    with gr.Row():
        preset_name = gr.Textbox(label="Preset name", placeholder="e.g. demo-best", scale=3,
                                 elem_id="study-preset-name")
        save_preset = gr.Button("Save the best point as a preset", size="sm", scale=1, elem_id="study-save-preset")
    message = gr.Markdown("", elem_id="study-message")
    best_run = gr.State(None)
    token = token if token is not None else gr.State(None)

    def draw(study_id: str | None):
        runs = [store.get_run(i) for i in study_runs(store, study_id)] if study_id else []
        runs = [r for r in runs if r is not None]
        if not runs:
            empty = charts.empty_figure("Pick a study")
            return "Pick a study.", None, empty, empty, "", "", None
        timelines = [comparison.store_timeline(store, r) for r in runs]
        found = summary.summarize(runs, timelines)
        tag = runs[0]["config"].get("study") or {}
        plot = (charts.study_heatmap(found.heatmap) if found.heatmap is not None
                else charts.study_bars(found.rows, found.best))
        pick = found.best.run_ids[0] if found.best else None
        points = pd.DataFrame(found.table())
        return (describe(tag, runs), fitted_table(points), plot, charts.study_curves(found.rows, found.best),
                best_line(found, store), summary.savings_line(found), pick)

    outputs = [header, table, grid_plot, curves, best, saved, best_run]
    picker.change(draw, picker, outputs, api_visibility="private")
    refresh.click(lambda: gr.update(choices=study_choices(store)), None, picker, api_visibility="private").then(
        draw, picker, outputs, api_visibility="private")

    def act(action: str):
        def handler(study_id: str | None, user_token: str | None, request: gr.Request) -> str:
            if not study_id:
                return "Pick a study first."
            user = services.auth.identify(token=user_token, request=request)
            done, refused = [], []
            for run_id in study_runs(store, study_id):
                run = store.get_run(run_id)
                if run is None or not _applies(action, run["status"]):
                    continue
                try:
                    services.act(action, run_id, user)
                    done.append(run_id)
                except Refused as exc:
                    refused.append(f"#{run_id}: {exc}")
            verb = {"stop": "Stopping", "resume": "Resumed", "delete": "Deleted"}[action]
            text = f"{verb} {len(done)} run(s)" + (": " + ", ".join(f"#{i}" for i in done) if done else "") + "."
            return text + ("  \nNot done: " + "; ".join(refused) if refused else "")
        return handler

    def keep_preset(run_id: int | None, name: str, user_token: str | None, request: gr.Request) -> str:
        """The best point's spec (its first seed's run) as a preset of this studio, listed on the Launch page."""
        user = services.auth.identify(token=user_token, request=request)
        if services.auth.required and not (user is not None and user.admin):
            return "❌ Presets are shared by everyone on this studio: only an admin saves one (sign in as one)."
        run = store.get_run(int(run_id)) if run_id is not None else None
        if run is None:
            return "❌ No best point yet: it is marked when every run of a point has finished."
        try:
            saved_presets.save(services.data_dir, name, run["config"])
        except saved_presets.PresetError as exc:
            return f"❌ {exc}"
        return (f"✅ Saved as preset {name.strip()!r}: the Launch page lists it as \"Saved: {name.strip()}\" "
                f"(run #{run_id}'s settings).")

    save_preset.click(keep_preset, [best_run, preset_name, token], message, api_visibility="private")

    for button, action in ((stop, "stop"), (resume, "resume"), (delete, "delete")):
        event = button.click(act(action), [picker, token], message, api_visibility="private")
        event.then(draw, picker, outputs, api_visibility="private")
    return StudiesPage(picker=picker, clone=clone, best_run=best_run)


def _applies(action: str, status: str) -> bool:
    """Whether a study-wide `action` concerns a run in `status` (stop the unfinished, resume the stopped or
    interrupted or failed, delete every one)."""
    from storage.lifecycle import UNFINISHED

    if action == "stop":
        return status in UNFINISHED
    if action == "resume":
        return status in ("stopped", "interrupted", "failed")
    return True
