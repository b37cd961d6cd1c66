"""Export page: CSV files of the tables and metrics, the run's completion tables as TRL writes them (parquet files,
zipped), the trained model (or LoRA adapter) as a zip, and a snippet that loads it with transformers.

CSV files are streamed: rows go from the store (`Store.iter_*`, a batch per read) to the file as they come, so an
export of a million samples needs the memory of one batch, not of the table. Cells are spreadsheet-safe (see
`storage.export`)."""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gradio as gr

from a2po.completions import completions_file, write_completions
from app.access.gate import Services
from app.web.common import run_choices
from storage import export_csv
from storage.export import completion_table

TABLES = ["runs", "metrics", "samples", "values", "evaluations", "logs"]
MODEL_FILES = ("config.json", "adapter_config.json")
SKIP_FILES = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"}


def table_rows(services: Services, table: str, run: dict[str, Any] | None) -> Iterable[dict[str, Any]]:
    """The rows of one exportable table (`runs` needs no run), streamed for the tables that grow with a run."""
    store = services.store
    if table == "runs":
        return store.list_runs()
    if run is None:
        raise ValueError("Pick a run first.")
    if table == "metrics":
        return store.iter_metrics(run["id"])
    if table == "samples":
        return store.iter_samples(run["id"])
    if table == "values":
        return store.iter_values(run["id"], split=None)  # the V* and filter this run trained with
    if table == "evaluations":
        return store.get_evaluations(run["id"])
    if table == "logs":
        return store.iter_logs(run["id"])
    raise ValueError(f"Unknown table {table!r}.")


def write_csv(services: Services, table: str, run_id: int | None) -> Path:
    """Write one table to the exports folder, row by row (into a temporary name first, so a download never sees
    a half-written file)."""
    run = services.store.get_run(run_id) if run_id is not None else None
    rows = table_rows(services, table, run)
    name = table if table == "runs" else f"run-{run_id}-{table}"
    path = services.exports_dir / f"{name}.csv"
    partial = path.with_name(f".{path.name}.partial")
    export_csv(rows, partial)
    partial.replace(path)
    return path


def zip_completions(services: Services, run_id: int | None) -> Path:
    """The run's training samples as TRL's completion tables, one parquet file per step in TRL's layout
    (`completions/completions_{step:05d}.parquet`, `a2po.completions`), zipped; read one step at a time."""
    if run_id is None or services.store.get_run(run_id) is None:
        raise ValueError("Pick a run first.")
    steps = services.store.sample_steps(run_id, "train")
    if not steps:
        raise ValueError("This run has no training samples yet.")
    target = services.exports_dir / f"run-{run_id}-completions.zip"
    partial = target.with_name(f".{target.name}.partial")
    with tempfile.TemporaryDirectory(dir=services.exports_dir) as folder, \
            zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for step in steps:
            rows = completion_table(services.store.get_samples(run_id, step=step, split="train", limit=None))
            path = write_completions(completions_file(folder, step), rows)
            archive.write(path, path.relative_to(folder).as_posix())
            path.unlink()
    partial.replace(target)
    return target


def model_dir(services: Services, run: dict[str, Any]) -> Path | None:
    """The folder with the run's trained weights: its output folder, else its newest checkpoint."""
    candidates = []
    if run.get("output_dir"):
        out = Path(run["output_dir"])
        candidates += [out, out / "final", out / "model"]
    checkpoint = services.store.latest_checkpoint(run["id"])
    if checkpoint:
        candidates.append(Path(checkpoint["path"]))
    return next((p for p in candidates if any((p / f).is_file() for f in MODEL_FILES)), None)


def zip_model(services: Services, run_id: int) -> Path:
    run = services.store.get_run(run_id)
    folder = model_dir(services, run) if run else None
    if folder is None:
        raise ValueError("This run has no saved model yet (train runs save one when they finish).")
    target = services.exports_dir / f"run-{run_id}-model.zip"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(folder.iterdir()):
            if file.is_file() and file.name not in SKIP_FILES:
                archive.write(file, f"run-{run_id}-model/{file.name}")
    return target


def load_snippet(folder: Path | None, run_id: int | None = None) -> str:
    """Python that loads the exported model (or adapter) with transformers and answers one prompt."""
    where = str(folder) if folder else f"run-{run_id}-model  # the unzipped folder"
    is_adapter = folder is not None and (folder / "adapter_config.json").is_file()
    model_class = "AutoPeftModelForCausalLM" if is_adapter else "AutoModelForCausalLM"
    imports = ("from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer" if is_adapter
               else "from transformers import AutoModelForCausalLM, AutoTokenizer")
    return f'''{imports}

model = {model_class}.from_pretrained("{where}")
tokenizer = AutoTokenizer.from_pretrained("{where}")
messages = [{{"role": "user", "content": "What is 12 + 30?"}}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
output = model.generate(**inputs, max_new_tokens=32)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
'''


def build_export_page(services: Services) -> gr.Dropdown:
    """Lay out the page; returns its run picker."""
    gr.Markdown("## Export\nDownload any table as CSV, the completion tables as TRL writes them, the trained model "
                "as a zip, and code to load it.")
    picker = gr.Dropdown(choices=run_choices(services.store), label="Run", elem_id="export-run")
    with gr.Row():
        buttons = {t: gr.Button(f"{t.capitalize()} CSV", size="sm", elem_id=f"export-{t}") for t in TABLES}
    completions_btn = gr.Button("Completion tables (TRL parquet, .zip)", size="sm", elem_id="export-completions")
    model_btn = gr.Button("Trained model (.zip)", variant="primary", elem_id="export-model")
    message = gr.Markdown(elem_id="export-message")
    files = gr.File(label="Files", file_count="multiple", interactive=False, elem_id="export-files")
    snippet = gr.Code(load_snippet(None), language="python", label="Load it with transformers",
                      elem_id="export-snippet")

    def add(existing: list[str] | None, path: Path) -> list[str]:
        kept = [p for p in existing or [] if Path(p).name != path.name]
        return [*kept, str(path)]

    def export_table(table: str):
        def handler(run_id: int | None, existing: list[str] | None):
            try:
                path = write_csv(services, table, run_id)
            except ValueError as exc:
                return f"❌ {exc}", gr.skip()
            return f"✅ Wrote {path.name}.", add(existing, path)
        return handler

    for table, button in buttons.items():
        button.click(export_table(table), [picker, files], [message, files], api_visibility="private")

    def export_completions(run_id: int | None, existing: list[str] | None):
        try:
            path = zip_completions(services, run_id)
        except ValueError as exc:
            return f"❌ {exc}", gr.skip()
        return f"✅ Wrote {path.name}: completions/completions_<step>.parquet, as TRL's log_completions.", \
            add(existing, path)

    completions_btn.click(export_completions, [picker, files], [message, files], api_visibility="private")

    def export_model(run_id: int | None, existing: list[str] | None):
        if run_id is None:
            return "❌ Pick a run first.", gr.skip(), gr.skip()
        try:
            path = zip_model(services, run_id)
        except ValueError as exc:
            return f"❌ {exc}", gr.skip(), gr.skip()
        folder = model_dir(services, services.store.get_run(run_id))
        return f"✅ Zipped {folder}.", add(existing, path), load_snippet(folder, run_id)

    model_btn.click(export_model, [picker, files], [message, files, snippet], api_visibility="private")

    def pick(run_id: int | None):
        run = services.store.get_run(run_id) if run_id is not None else None
        return load_snippet(model_dir(services, run) if run else None, run_id)

    picker.change(pick, picker, snippet, api_visibility="private")
    return picker
