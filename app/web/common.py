"""Small formatting helpers every page shares."""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

from app.studies.comparison import format_duration  # noqa: F401 - the pages import it from here
from storage import Store
from storage.lifecycle import UNFINISHED

if TYPE_CHECKING:
    from app.access.gate import Services

STATUS_COLORS = {"queued": "#888", "running": "#2563eb", "stopping": "#d97706", "stopped": "#6b7280",
                 "interrupted": "#9333ea", "finished": "#16a34a", "failed": "#dc2626", "paused": "#0891b2"}


def model_choices(services: Services) -> list[str]:
    """The built-in model, folders in `<data-dir>/models`, then models used by earlier runs (most recent first)."""
    from a2po.models import DEFAULT_MODEL

    seen = dict.fromkeys([DEFAULT_MODEL])
    models = services.data_dir / "models"
    if models.is_dir():
        seen.update(dict.fromkeys(str(p) for p in sorted(models.iterdir()) if (p / "config.json").is_file()))
    for run in services.store.list_runs():
        if run.get("model"):
            seen.setdefault(run["model"])
    return list(seen)


def method_label(run: dict[str, Any]) -> str:
    """The run's method as people write it: "A*-PO" or "GRPO" (a spec names it; none: A*-PO)."""
    return {"grpo": "GRPO"}.get((run.get("config") or {}).get("method", "a2po"), "A*-PO")


def run_label(run: dict[str, Any]) -> str:
    """How a run appears in pickers: `#12 name (GRPO, status)`, the method named when it is not A*-PO."""
    method = method_label(run)
    return f"#{run['id']} {run['name']} ({'' if method == 'A*-PO' else method + ', '}{run['status']})"


def run_choices(store: Store) -> list[tuple[str, int]]:
    return [(run_label(r), r["id"]) for r in store.list_runs()]


def elapsed_seconds(run: dict[str, Any], now: float | None = None) -> float | None:
    """Wall-clock seconds since the run (last) started: loading, queueing behind a stop and evaluations included."""
    start = run.get("started_at")
    if not start:
        return None
    end = run.get("finished_at") if run.get("status") not in UNFINISHED else None
    return (end or (time.time() if now is None else now)) - start


def format_time(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "–"


def status_badge(status: str) -> str:
    color = STATUS_COLORS.get(status, "#888")
    return (f'<span class="status-badge" data-status="{html.escape(status)}" style="background:{color}">'
            f"{html.escape(status)}</span>")


def progress_bar(label: str, fraction: float | None, detail: str = "", elem: str = "") -> str:
    """An HTML progress bar; `fraction` None draws an empty, greyed bar (stage not started or skipped)."""
    pct = 0.0 if fraction is None else max(0.0, min(1.0, fraction)) * 100
    shown = "–" if fraction is None else f"{pct:.0f}%"
    return (f'<div class="stage-progress" id="{elem}" data-fraction="{pct / 100:.3f}">'
            f'<div class="stage-label"><b>{html.escape(label)}</b> <span>{shown}</span> '
            f'<small>{html.escape(detail)}</small></div>'
            f'<div class="bar"><div class="fill" style="width:{pct:.1f}%"></div></div></div>')


def short(text: str | None, limit: int = 120) -> str:
    """One line of at most `limit` characters."""
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


CSS = """
.field-error { color: #dc2626; font-size: 0.85em; margin-top: -6px; }
.field-error p { margin: 0; }
.status-badge { color: white; padding: 2px 8px; border-radius: 10px; font-size: 0.85em; }
.stage-progress { margin: 4px 0 8px 0; }
.stage-progress .bar { background: #e5e7eb; border-radius: 4px; height: 10px; overflow: hidden; }
.stage-progress .fill { background: #2563eb; height: 10px; transition: width 0.5s; }
.stage-label small { color: #6b7280; margin-left: 6px; }
#run-error textarea { color: #dc2626; font-family: monospace; }
"""


def code_block(text: str | None, info: str = "text") -> str:
    """`text` as a Markdown code block that it cannot close: its fence is longer than any run of backticks in it
    (CommonMark closes a fence only with one as long), so a prompt or completion never becomes markup (an image, a
    form, an overlay) on a page that shows it. A line of backticks in `text` stays text."""
    text = text or ""
    longest, run = 0, 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"
