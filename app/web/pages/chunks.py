"""The chunk panel of the Run page: for a chunked run (`app.runtime.chunks`), how many chunks ran, the seconds they took
(on a ZeroGPU Space: the GPU time charged), and what is left; in ZeroGPU mode it also runs the chunks.

In ZeroGPU mode (`app.runtime.zerogpu`) the panel's timer calls the next chunk of the run on screen while the page is
open, in the visitor's own request, so their GPU quota pays: one chunk per tick, the tick blocking for the chunk
(`trigger_mode="once"`: ticks that come meanwhile are dropped). Closing the page stops the ticks: the run waits
in the queue and the scheduler pauses it; opening its page again goes on. Elsewhere the scheduler runs the chunks
and the panel only shows them. Its timer is on only while the run on screen is a chunked run that is not over.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from app.access.gate import Services
from app.runtime.zerogpu import ChunkDriver
from app.web.common import format_duration

TICK_SECONDS = 3.0
DONE = ("finished", "failed", "stopped", "interrupted")
# At most this many chunks run at once from pages (each holds a GPU on ZeroGPU, and this machine's CPU for the
# host side); more wait in Gradio's queue.
CONCURRENT_CHUNKS = 4


def render(info: dict[str, Any] | None) -> str:
    """The panel's HTML for `ChunkDriver.status` (empty for no run or a run that is not chunked)."""
    if not info or not info.get("chunked"):
        return ""
    zerogpu = info["zerogpu"]
    seconds = info["chunk_seconds"]
    parts = [f"<b>Chunked run</b> · status <b>{html.escape(info['status'])}</b>",
             f"<b>{info['chunks_done']}</b> chunk{'s' if info['chunks_done'] != 1 else ''} done",
             f"<b>{seconds:.1f} s</b> of {'GPU' if zerogpu else 'compute'} used"]
    left = []
    if info.get("prompts_total") and info["prompts_done"] < info["prompts_total"]:
        left.append(f"{info['prompts_total'] - info['prompts_done']} of {info['prompts_total']} prompts to sample")
    if info.get("max_steps"):
        left.append(f"{max(0, info['max_steps'] - info['step'])} of {info['max_steps']} steps to train")
    if left:
        parts.append("left: " + ", ".join(left))
    progress = info.get("progress") or 0.0
    if info["status"] not in DONE and info.get("stage") == "train" and progress > 0.02 and seconds > 0:
        parts.append(f"≈ {format_duration(seconds * (1 - progress) / progress)} more")
    if zerogpu and info["status"] not in DONE:
        parts.append(f"each chunk asks for {info['gpu_duration']} s of GPU from your quota; this page runs them "
                     "while it is open (closed, the run pauses)")
    if info.get("held") and info["status"] not in DONE:
        parts.append(f"waiting: {html.escape(str(info['held']))}")
    if info.get("last_error"):
        parts.append(f"last GPU call failed: {html.escape(str(info['last_error'])[:300])}")
    attrs = " ".join(f'data-{k}="{html.escape(str(info.get(v)))}"' for k, v in (
        ("status", "status"), ("chunks", "chunks_done"), ("seconds", "chunk_seconds"), ("step", "step"),
        ("prompts", "prompts_done"), ("driving", "driving")))
    return f'<div id="chunk-info" {attrs}>' + " · ".join(parts) + "</div>"


def build_chunk_panel(services: Services, picker: gr.Dropdown, token: Any) -> ChunkDriver:
    """The panel under the Run page's header (see the module docstring); `token` is the login's browser state."""
    driver = ChunkDriver(services)
    panel = gr.HTML(elem_id="run-chunks")
    timer = gr.Timer(TICK_SECONDS, active=False)

    def timer_for(info: dict[str, Any] | None) -> Any:
        return gr.Timer(TICK_SECONDS, active=bool(info and info.get("chunked") and info["status"] not in DONE))

    def show(run_id: int | None):
        info = driver.status(run_id) if run_id is not None else None
        return render(info), timer_for(info)

    def tick(run_id: int | None, token_value: str | None, request: gr.Request):
        if run_id is None:
            return "", gr.Timer(active=False)
        user = services.auth.identify(token=token_value, request=request) if services.auth else None
        info = driver.drive(run_id, user)
        return render(info), timer_for(info)

    private = {"api_visibility": "private", "show_progress": "hidden"}
    picker.change(show, picker, [panel, timer], **private)
    timer.tick(tick, [picker, token], [panel, timer], concurrency_limit=CONCURRENT_CHUNKS,
               concurrency_id="run-chunks", **private)
    return driver
