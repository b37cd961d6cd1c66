"""The one gate: every launch, stop, resume and delete, from a page or the API, goes through `Services`.

It checks, in this order, the user's permission (`app.access.auth`), the spec against the allow-list
(`app.access.allowlist`), and the operator's limits (`app.access.policy`: disk, queue size, runs per user, counted
by the store in the transaction that inserts the run); only then does it hand the run to the scheduler.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from app.access.allowlist import DATA_SUFFIXES, SpecResult, check_spec
from app.access.auth import Auth, User
from app.access.policy import Policy
from app.studies.protocols import DEFAULT_PROTOCOL
from storage import Admission, LimitReached, Store
from storage.lifecycle import UNFINISHED
from storage.secrets import scrub_text

if TYPE_CHECKING:
    from a2po.runspec import RunSpec

ZEROGPU_LORA = {"r": 16, "lora_alpha": 32}


class Refused(ValueError):
    """A request the studio will not carry out: a bad spec, a limit, or a missing permission (message says which)."""


class Scheduling(Protocol):
    """What the gate asks of the scheduler (`app.runtime.scheduler.Scheduler`, which this room does not import)."""

    def submit(self, spec: RunSpec, owner: str | None = None, admission: Any = None) -> int: ...
    def stop(self, run_id: int, reason: str = "user") -> bool: ...
    def resume(self, run_id: int) -> int: ...
    def delete(self, run_id: int, kill_timeout: float = 10.0) -> bool: ...
    def public_text(self, text: str | None) -> str: ...


@dataclass
class Services:
    """The store the pages read, the scheduler they act through, the data folder, the operator's policy and
    users. Every page and every API endpoint launches, stops, resumes and deletes through these methods, so the
    allow-list, the limits and the permissions are checked in one place."""

    store: Store
    scheduler: Scheduling | None
    data_dir: Path
    policy: Policy | None = None
    auth: Auth | None = None

    def __post_init__(self) -> None:
        # `advance_studies`: the unfinished runs it last saw, and whether a rung it could not launch waits.
        self._watched: frozenset[int] | None = None
        self._retry_advance = False
        self._waiting: dict[str, str] = {}
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

    def check(self, spec: Any) -> SpecResult:
        """The allow-list's verdict on `spec` for this studio (`app.access.allowlist.check_spec`; on a ZeroGPU Space
        a spec that says nothing of LoRA trains with it): the checked run and its warnings (a registered reward
        changed since the spec recorded it), or every problem. `launch_run` takes an accepted verdict as it is."""
        if self.policy.zerogpu and isinstance(spec, dict) and "peft" not in spec:
            spec = {**spec, "peft": dict(ZEROGPU_LORA)}  # each chunk restores and saves it; an adapter is quicker
        return check_spec(spec, self.policy, offline=offline())

    def checked(self, spec: Any) -> SpecResult:
        """`check`'s accepted verdict, or `Refused` naming every problem."""
        result = self.check(spec)
        if not result.ok:
            raise Refused(result.message())
        return result

    def launch_run(self, spec: Any, user: User | None) -> tuple[int, list[str]]:
        """Queue a run for `user` after the permission, the allow-list and the studio's limits (disk quota, queue
        size, runs per user); returns its id and the warnings the check gave (also written to the run's log). No run
        is stored when it is refused. `spec`: a run spec, or the gate's verdict on one (`check`), which is taken as
        it is. A `study` label in `spec` is left out, with a warning: only `launch_study` labels runs."""
        return self._queue(spec, user, study=None)

    def _queue(self, spec: Any, user: User | None, study: dict[str, Any] | None) -> tuple[int, list[str]]:
        """`launch_run` of a run of `study` (None: a run of its own)."""
        problem = self.auth.can_launch(user)
        if problem:
            raise Refused(problem)
        result = spec if isinstance(spec, SpecResult) else self.checked(spec)
        if not result.ok:
            raise Refused(result.message())
        problem = self.policy.disk_problem()
        if problem:
            raise Refused(problem)
        run = replace(result.run, study=study, dataset=self._keep_upload(result.run.dataset))
        limits, owner = self.policy.limits, self.auth.owner_of(user)
        # Counted by the store in the transaction that inserts the run: launches arriving together (the form's
        # buttons and the API are separate Gradio events) cannot pass a limit together.
        admission = Admission(queue_size=limits.queue_size, per_owner=limits.queued_per_user, owner_statuses=UNFINISHED)
        try:
            run_id = self.scheduler.submit(run, owner=owner, admission=admission)
        except LimitReached as full:
            if full.what == "queue":
                raise Refused(f"The queue is full: {full.count} runs wait, the limit is {full.limit} runs in the "
                              "queue. Try again when some have started.") from None
            raise Refused(f"You have {full.count} runs queued or running; the limit is {full.limit} queued or running "
                          "runs per user. Stop one, or wait for one to end.") from None
        for warning in result.warnings:
            self.store.add_log(run_id, warning, level="WARNING")
        return run_id, result.warnings

    def launch_study(self, specs: list[dict[str, Any]], user: User | None) -> list[int]:
        """Queue every run of a study (`app.studies`), all or nothing: each spec passes the checks of `launch_run`,
        and the limits are counted for all of them together, before any is queued; a run refused while queueing (a
        launch arriving at the same moment took the room) deletes those already queued. Returns their ids in order.

        `specs` are the studio's own (`study_specs`, `sweep_specs`, from a pair, seeds or a sweep): the only specs
        whose `study` label is kept, since a study is nothing but the runs that carry its label."""
        problem = self.auth.can_launch(user)
        if problem:
            raise Refused(problem)
        checked = [self.checked(_unlabelled(spec)) for spec in specs]
        limits, owner = self.policy.limits, self.auth.owner_of(user)
        admission = Admission(queue_size=limits.queue_size, per_owner=limits.queued_per_user, owner_statuses=UNFINISHED)
        try:
            self.store.check_admission(admission, owner, len(specs))
        except LimitReached as full:
            room = max(0, full.limit - full.count)
            where = ("the queue holds" if full.what == "queue" else "you may have")
            raise Refused(f"This study asks for {len(specs)} runs, and {where} {room} more "
                          f"({full.count} of the limit of {full.limit} "
                          f"{'queued runs' if full.what == 'queue' else 'queued or running runs per user'}). "
                          "Launch fewer runs (seeds or grid points), or wait for runs to end; none was started."
                          ) from None
        ids: list[int] = []
        try:
            for spec, result in zip(specs, checked, strict=True):
                ids.append(self._queue(result, user, study=spec.get("study"))[0])
        except Refused as refused:
            for run_id in ids:
                self.scheduler.delete(run_id)
            raise Refused(f"{refused} (the study's {len(specs)} runs start together or not at all; none was "
                          "started.)") from None
        return ids

    def launch_pair(self, spec: Any, user: User | None, protocol: str = DEFAULT_PROTOCOL,
                    budget_seconds: float | None = None, seeds: Any = None,
                    grpo_recipe: str | None = None, grpo_settings: Any = None,
                    budget_flops: float | None = None) -> list[tuple[int, int]]:
        """"A*-PO vs GRPO": the A*-PO run `spec` describes and a GRPO run matched to it under `protocol`
        (`app.studies.protocols`; `grpo_recipe`: the GRPO side's named recipe, `a2po.recipes`; `grpo_settings`: its
        own learning rate and batch under equal time or compute), once per run seed,
        as one study: every run checked (permission, allow-list, limits) before any is queued. Returns (A*-PO's id,
        GRPO's id) per seed."""
        from app.studies.protocols import StudyError, parse_seeds, require_a2po, study_specs

        problem = self.auth.can_launch(user)
        if problem:
            raise Refused(problem)
        try:
            require_a2po(spec)  # before the allow-list, whose GRPO checks would name other fields first
            a2po = self.checked(spec).spec
            specs = study_specs(a2po, parse_seeds(seeds), pair=True, protocol=protocol, budget_seconds=budget_seconds,
                                grpo_recipe=grpo_recipe, grpo_settings=grpo_settings, budget_flops=budget_flops)
        except StudyError as error:
            raise Refused(str(error)) from None
        ids = self.launch_study(specs, user)
        pairs = list(zip(ids[0::2], ids[1::2], strict=True))
        for a2po_id, grpo_id in pairs:
            self.store.add_log(a2po_id, f"A*-PO vs GRPO ({protocol} protocol): matched with GRPO run #{grpo_id}.")
            self.store.add_log(grpo_id, f"A*-PO vs GRPO ({protocol} protocol): matched with A*-PO run #{a2po_id}.")
        return pairs

    def launch_seeds(self, spec: Any, user: User | None, seeds: Any) -> list[int]:
        """One run of `spec` per run seed, as one study (all or nothing); returns their ids."""
        from app.studies.protocols import StudyError, parse_seeds, study_specs

        try:
            chosen = parse_seeds(seeds)
        except StudyError as error:
            raise Refused(str(error)) from None
        if not isinstance(spec, dict):
            self.checked(spec)  # names the problem
        return self.launch_study(study_specs(dict(spec), chosen, pair=False), user)

    def launch_sweep(self, spec: Any, user: User | None, grid: Any, seeds: Any = None,
                     halving: Any = None) -> list[int]:
        """A sweep (`app.studies.sweeps`): one run per grid point and run seed, as one study, every run checked
        (permission, allow-list, limits) before any is queued. Returns their ids, point by point. With `halving`
        (`a2po.sweep.Halving`), the runs of its first rung; `advance_studies` launches the later ones."""
        from app.studies.protocols import StudyError, parse_seeds
        from app.studies.sweeps import parse_halving, sweep_specs

        problem = self.auth.can_launch(user)
        if problem:
            raise Refused(problem)
        try:
            chosen = parse_seeds(seeds)
            base = self.checked(spec).spec
            specs = sweep_specs(base, grid, chosen, halving=parse_halving(halving))
        except StudyError as error:
            raise Refused(str(error)) from None
        ids = self.launch_study(specs, user)
        for run_id, one in zip(ids, specs, strict=True):
            self._log_sweep_run(run_id, one, len(ids))
        return ids

    def _log_sweep_run(self, run_id: int, spec: dict[str, Any], count: int) -> None:
        label = spec["study"]
        point = ", ".join(f"{k}={v}" for k, v in label["point"].items()) or "the base spec"
        rung = f", rung {label['rung']} of its halving" if "rung" in label else ""
        self.store.add_log(run_id, f"Sweep {label['name']!r} ({count} runs{' at this rung' if rung else ''}): this "
                                   f"run is {point}, run seed {label['seed']}{rung}.")

    def advance_studies(self) -> list[int]:
        """Launch the next rung of every halving sweep whose top rung has ended (`app.studies.sweeps.next_rung`), for
        the sweep's owner, through the same checks and limits as a launch; a rung the limits refuse now is tried
        again at a later pass. Derived from the stored runs alone, so a restarted studio neither launches a rung
        twice nor brings back a pruned point. Returns the runs launched. The scheduler calls it after each pass
        (`Scheduler.after_pass`); it reads the store only when a run has ended since it last looked."""
        from app.studies.comparison import store_timeline
        from app.studies.sweeps import halving_of, next_rung

        unfinished = frozenset(r["id"] for r in self.store.list_runs(status=UNFINISHED))
        if unfinished == self._watched and not self._retry_advance:
            return []
        self._watched, self._retry_advance = unfinished, False
        studies: dict[str, list[dict[str, Any]]] = {}
        for run in self.store.list_runs():
            if halving_of(run) is not None:
                studies.setdefault(run["config"]["study"]["id"], []).append(run)
        launched: list[int] = []
        for runs in studies.values():
            finals = {}
            for run in runs:
                if run["status"] == "finished":
                    line = store_timeline(self.store, run)
                    finals[run["id"]] = (line.final_accuracy, [p.accuracy for p in line.points[1:]] or
                                         [p.accuracy for p in line.points])
            specs = next_rung(runs, finals)
            if specs:
                launched += self._launch_rung(runs, specs)
        return launched

    def _launch_rung(self, runs: list[dict[str, Any]], specs: list[dict[str, Any]]) -> list[int]:
        """Queue a halving sweep's next rung for its owner (all or nothing, as `launch_study`)."""
        owner = runs[0].get("owner")
        limits = self.policy.limits
        admission = Admission(queue_size=limits.queue_size, per_owner=limits.queued_per_user, owner_statuses=UNFINISHED)
        ids: list[int] = []
        try:
            self.store.check_admission(admission, owner, len(specs))
            for spec in specs:
                run = replace(self.checked(_unlabelled(spec)).run, study=spec["study"])
                ids.append(self.scheduler.submit(run, owner=owner, admission=admission))
        except (Refused, LimitReached, ValueError) as refused:
            for run_id in ids:
                self.scheduler.delete(run_id)
            self._retry_advance = True
            tag = specs[0]["study"]
            message = f"Sweep {tag['name']!r}: rung {tag['rung']} waits to be launched: {refused}"
            if self._waiting.get(tag["id"]) != message:  # said once, not at every pass it waits
                self._waiting[tag["id"]] = message
                self.store.add_log(max(r["id"] for r in runs), message, level="WARNING")
            return []
        for run_id, spec in zip(ids, specs, strict=True):
            self._log_sweep_run(run_id, spec, len(ids))
        return ids

    def _keep_upload(self, dataset: dict[str, Any]) -> dict[str, Any]:
        """A file picked in the form lives in Gradio's upload cache; a run (and its resumes) reads a copy in
        `<data-dir>/datasets/uploads/` instead, named by its content."""
        if dataset.get("source") != "file":
            return dataset
        path = Path(dataset["path"])
        if self.policy.inside(path, self.policy.dataset_roots()) is not None:
            return dataset  # else `check_spec` accepted it as a file Gradio received
        return {**dataset, "path": str(store_upload(self.policy, path))}

    def public_text(self, text: str | None) -> str:
        """A text a process wrote (a run's error, its log lines) as any visitor may read it: through the one
        scrubber, `storage.secrets.scrub_text`, with the scheduler's knowledge of the Ray cluster's address."""
        public = getattr(self.scheduler, "public_text", None)
        return public(text) if public is not None else scrub_text(text, self.data_dir)

    def act(self, action: str, run_id: int, user: User | None) -> dict[str, Any]:
        """Stop, resume or delete a run if `user` may (their own runs, or any as admin); returns the run as it was."""
        run = self.store.get_run(int(run_id))
        if run is None:
            raise Refused(f"No run #{run_id}.")
        problem = self.auth.can_manage(user, run)
        if problem:
            raise Refused(problem)
        try:
            getattr(self.scheduler, action)(int(run_id))
        except (ValueError, RuntimeError) as exc:
            raise Refused(str(exc)) from exc
        return run


def _unlabelled(spec: Any) -> Any:
    """`spec` without its study label (which `check_spec` would warn about: a study's runs get theirs back)."""
    return {k: v for k, v in spec.items() if k != "study"} if isinstance(spec, dict) else spec


def offline() -> bool:
    """True when the hub may not be reached (HF_HUB_OFFLINE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def store_upload(policy: Policy, source: Path, name: str | None = None) -> Path:
    """Copy an uploaded data file into `<data-dir>/datasets/uploads/<content hash>-<name>` (checked: a data file
    type, within the upload limit); returns the stored path."""
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


