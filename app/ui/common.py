"""What every page shares: the services it talks to and small formatting helpers."""

from __future__ import annotations

import hashlib
import html
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.auth import Auth, User
from app.policy import Policy
from storage import Admission, LimitReached, Store
from storage.lifecycle import UNFINISHED

ZEROGPU_LORA = {"r": 16, "lora_alpha": 32}
STATUS_COLORS = {"queued": "#888", "running": "#2563eb", "stopping": "#d97706", "stopped": "#6b7280",
                 "interrupted": "#9333ea", "finished": "#16a34a", "failed": "#dc2626", "paused": "#0891b2"}


class Refused(ValueError):
    """A request the studio will not carry out: a bad spec, a limit, or a missing permission (message says which)."""


@dataclass
class Services:
    """The store the pages read, the job manager they act through, the data folder, the operator's policy and
    users. Every page and every API endpoint launches, stops, resumes and deletes through these methods, so the
    allow-list, the limits and the permissions are checked in one place."""

    store: Store
    jobs: Any  # app.jobs.JobManager
    data_dir: Path
    policy: Policy | None = None
    auth: Auth | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.policy is None:
            self.policy = Policy(self.data_dir)
        if self.auth is None:
            self.auth = Auth()

    @property
    def exports_dir(self) -> Path:
        path = self.data_dir / "exports"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def check(self, spec: Any) -> dict[str, Any]:
        """The clean spec, or `Refused` naming every problem (the API's and the form's allow-list)."""
        return self.checked(spec)[0]

    def checked(self, spec: Any) -> tuple[dict[str, Any], list[str]]:
        """The clean spec and its warnings (a registered reward changed since the spec recorded it), or `Refused`
        naming every problem."""
        from app import forms

        if self.policy.zerogpu and isinstance(spec, dict) and "peft" not in spec:
            spec = {**spec, "peft": dict(ZEROGPU_LORA)}  # chunks restore and save an adapter in ~2 s, a model in ~16
        result = forms.check_spec(spec, self.policy, offline=offline())
        if not result.ok:
            raise Refused(result.message())
        return result.spec, result.warnings

    def launch(self, spec: Any, user: User | None) -> int:
        """Queue a run for `user` after the permission, the allow-list and the studio's limits (disk quota, queue
        size, runs per user); returns its id. No run is stored when it is refused."""
        return self.launch_run(spec, user)[0]

    def launch_run(self, spec: Any, user: User | None) -> tuple[int, list[str]]:
        """`launch`, returning the run's id and the warnings the check gave (also written to the run's log)."""
        problem = self.auth.can_launch(user)
        if problem:
            raise Refused(problem)
        clean, warnings = self.checked(spec)
        problem = self.policy.disk_problem()
        if problem:
            raise Refused(problem)
        clean["dataset"] = self._keep_upload(clean["dataset"])
        limits, owner = self.policy.limits, self.auth.owner_of(user)
        # Counted by the store in the transaction that inserts the run: launches arriving together (the form's
        # buttons and the API are separate Gradio events) cannot pass a limit together.
        admission = Admission(queue_size=limits.queue_size, per_owner=limits.queued_per_user, owner_statuses=UNFINISHED)
        try:
            run_id = self.jobs.submit(clean, owner=owner, admission=admission)
        except LimitReached as full:
            if full.what == "queue":
                raise Refused(f"The queue is full: {full.count} runs wait, the limit is {full.limit} runs in the "
                              "queue. Try again when some have started.") from None
            raise Refused(f"You have {full.count} runs queued or running; the limit is {full.limit} queued or running "
                          "runs per user. Stop one, or wait for one to end.") from None
        for warning in warnings:
            self.store.add_log(run_id, warning, level="WARNING")
        return run_id, warnings

    def _keep_upload(self, dataset: dict[str, Any]) -> dict[str, Any]:
        """A file picked in the form lives in Gradio's upload cache; a run (and its resumes) reads a copy in
        `<data-dir>/datasets/uploads/` instead, named by its content."""
        if dataset.get("source") != "file":
            return dataset
        path = Path(dataset["path"])
        if self.policy.inside(path, self.policy.dataset_roots()) is not None:
            return dataset  # else `check_spec` accepted it as a file Gradio received
        return {**dataset, "path": str(store_upload(self.policy, path))}

    def act(self, action: str, run_id: int, user: User | None) -> dict[str, Any]:
        """Stop, resume or delete a run if `user` may (their own runs, or any as admin); returns the run as it was."""
        run = self.store.get_run(int(run_id))
        if run is None:
            raise Refused(f"No run #{run_id}.")
        problem = self.auth.can_manage(user, run)
        if problem:
            raise Refused(problem)
        try:
            getattr(self.jobs, action)(int(run_id))
        except (ValueError, RuntimeError) as exc:
            raise Refused(str(exc)) from exc
        return run


def offline() -> bool:
    """True when the hub may not be reached (HF_HUB_OFFLINE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def store_upload(policy: Policy, source: Path, name: str | None = None) -> Path:
    """Copy an uploaded data file into `<data-dir>/datasets/uploads/<content hash>-<name>` (checked: a data file
    type, within the upload limit); returns the stored path."""
    from app.forms import DATA_SUFFIXES

    suffix = source.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise Refused(f"Unsupported file type {suffix!r}: upload a {', '.join(DATA_SUFFIXES)} file.")
    size = source.stat().st_size
    limit = policy.limits.upload_mb
    if limit is not None and size > limit * 1e6:
        raise Refused(f"The file has {size / 1e6:.1f} MB; the limit is {limit:g} MB per upload.")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    stem = re.sub(r"[^\w.-]", "_", Path(name or source.name).stem)[:60] or "data"
    target = policy.datasets_dir / "uploads" / f"{digest}-{stem}{suffix}"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copyfile(source, target)
    return target


def run_label(run: dict[str, Any]) -> str:
    """How a run appears in pickers: `#12 name (status)`."""
    return f"#{run['id']} {run['name']} ({run['status']})"


def run_choices(store: Store) -> list[tuple[str, int]]:
    return [(run_label(r), r["id"]) for r in store.list_runs()]


def format_duration(seconds: float | None) -> str:
    """`1h 02m`, `3m 05s`, `42s`; an en dash when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds}s"


def elapsed_and_remaining(run: dict[str, Any], now: float | None = None) -> tuple[float | None, float | None]:
    """Seconds the run has worked and, from its progress, an estimate of the seconds it still needs."""
    now = time.time() if now is None else now
    start = run.get("started_at")
    if not start:
        return None, None
    end = run.get("finished_at") if run.get("status") not in UNFINISHED else None
    elapsed = (end or now) - start
    if run.get("status") not in UNFINISHED:
        return elapsed, 0.0 if run.get("status") == "finished" else None
    progress = run.get("progress") or 0.0
    if progress <= 0.01:
        return elapsed, None
    return elapsed, elapsed * (1 - progress) / progress


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
