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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.access.auth import Auth, User
from app.access.policy import Policy
from storage import Admission, LimitReached, Store
from storage.lifecycle import UNFINISHED

ZEROGPU_LORA = {"r": 16, "lora_alpha": 32}


class Refused(ValueError):
    """A request the studio will not carry out: a bad spec, a limit, or a missing permission (message says which)."""


@dataclass
class Services:
    """The store the pages read, the job manager they act through, the data folder, the operator's policy and
    users. Every page and every API endpoint launches, stops, resumes and deletes through these methods, so the
    allow-list, the limits and the permissions are checked in one place."""

    store: Store
    jobs: Any  # app.runtime.scheduler.JobManager
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
        from app.access import allowlist

        if self.policy.zerogpu and isinstance(spec, dict) and "peft" not in spec:
            spec = {**spec, "peft": dict(ZEROGPU_LORA)}  # each chunk restores and saves it; an adapter is quicker
        result = allowlist.check_spec(spec, self.policy, offline=offline())
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

    def launch_pair(self, spec: Any, user: User | None) -> tuple[int, int]:
        """"A*-PO vs GRPO": the A*-PO run `spec` describes and a GRPO run matched to it (`pair_specs`), both checked
        (permission, allow-list, limits) before either is queued; returns their ids (A*-PO's, GRPO's). When the
        second is refused (a queue or per-user limit), the first is deleted again: a pair runs whole or not at all."""
        problem = self.auth.can_launch(user)
        if problem:
            raise Refused(problem)
        a2po, _ = self.checked(spec)
        if a2po.get("action") != "train":
            raise Refused("A*-PO vs GRPO compares two training runs: set the action to \"train\".")
        first, second = pair_specs(a2po)
        for one in (first, second):
            self.checked(one)  # both refused before either is queued
        a2po_id = self.launch(first, user)
        try:
            grpo_id = self.launch(second, user)
        except Refused as refused:
            self.jobs.delete(a2po_id)
            raise Refused(f"{refused} (A*-PO vs GRPO needs room for both runs; none was started.)") from None
        self.store.add_log(a2po_id, f"A*-PO vs GRPO: matched with GRPO run #{grpo_id}.")
        self.store.add_log(grpo_id, f"A*-PO vs GRPO: matched with A*-PO run #{a2po_id}.")
        return a2po_id, grpo_id

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


# Settings both methods have, copied from the A*-PO run to its GRPO match (same names in A2POConfig and GRPOConfig).
SHARED_SETTINGS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "max_steps",
                   "num_train_epochs", "max_completion_length", "max_prompt_length", "temperature", "top_p", "top_k",
                   "seed", "per_device_eval_batch_size", "logging_steps", "eval_steps", "save_steps",
                   "save_every_seconds", "gradient_accumulation_steps", "gradient_checkpointing", "use_cpu")
EVAL_POINTS = 5  # held-out evaluations in a run, "after" included, when the spec sets no eval_steps


def pair_specs(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An A*-PO spec (checked, every setting stated) and the GRPO spec matched to it, as "A*-PO vs GRPO" launches.

    Matched: the same model, dataset (prompts and held-out set), rewards, LoRA, processes and every setting both
    methods have (learning rate and schedule, epochs or max steps, completion and prompt lengths, sampling, seed);
    GRPO's G = A*-PO's N; the same prompts per optimizer step: GRPO's per_device_train_batch_size, which counts
    completions, is G × A*-PO's (which counts prompts), so both take the same number of steps per pass over the data
    and the same passes. (A*-PO's stage 1 drops the prompts no reference sample solved when filter_all_incorrect is
    on; its passes go over the prompts it kept.) GRPO's own settings (beta, loss_type, epsilon, ...) keep TRL's
    defaults. When the spec sets no `eval_steps`, each run evaluates every 1/`EVAL_POINTS` of its own steps (an
    `eval_steps` fraction, as the Trainer reads one): A*-PO's step count is known only once stage 1 has kept its
    prompts, and a count planned from all of them would leave its shorter run no point between "before" and "after".
    """
    import copy

    a2po = copy.deepcopy(spec)
    config = a2po["config"]
    if not config.get("eval_steps") and (a2po.get("dataset") or {}).get("eval_size"):
        config["eval_steps"] = 1 / EVAL_POINTS
    n = int(config.get("num_value_samples") or 8)
    base = str(a2po.get("name") or "pair")[:80]
    a2po["name"] = f"{base}-a2po"
    grpo = {k: copy.deepcopy(v) for k, v in a2po.items() if k != "config"}
    grpo.update(name=f"{base}-grpo", method="grpo")
    grpo["config"] = {k: config[k] for k in SHARED_SETTINGS if k in config}
    grpo["config"].update(num_generations=n, per_device_train_batch_size=n * int(config["per_device_train_batch_size"]))
    return a2po, grpo


def offline() -> bool:
    """True when the hub may not be reached (HF_HUB_OFFLINE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def store_upload(policy: Policy, source: Path, name: str | None = None) -> Path:
    """Copy an uploaded data file into `<data-dir>/datasets/uploads/<content hash>-<name>` (checked: a data file
    type, within the upload limit); returns the stored path."""
    from app.access.allowlist import DATA_SUFFIXES

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


