"""What a studio allows: bounds on a run, where it may read models and data, and what reaches outside a run.

The operator decides with flags of `python -m app` (see `docs/security.md`); this module only holds the answer,
so the launch form, the named API, YAML configs and "clone this run" all check a spec against the same `Policy`
(`app.access.allowlist.check_spec`). Three deployments, three defaults:

- one person on 127.0.0.1: `Limits()`, sanity bounds only (no run may ask for 10**12 prompts or hang its worker);
- a classroom server: the same, plus `--auth` for who may launch, and whatever limits the teacher sets;
- a public Space: `--public` (the Docker image's default) turns on `PUBLIC_LIMITS`: a wall-clock limit per run,
  upload size, queue size and queued runs per user, a disk quota, and no hub downloads unless allowed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Names of environment variables that carry credentials: a worker never sees them (unless hub pushes are allowed,
# then only the Hugging Face token).
SECRET_ENV = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE_KEY)", re.IGNORECASE)
HUB_TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what one run may ask for, and on what the studio accepts overall (None: no limit)."""

    max_prompts: int = 100_000
    max_eval_size: int = 10_000
    max_value_samples: int = 256
    max_completion_length: int = 16_384
    max_prompt_length: int = 16_384
    max_steps: int = 1_000_000
    max_epochs: float = 1_000.0
    max_batch_size: int = 4_096
    max_lora_rank: int = 1_024
    max_name_length: int = 200
    run_minutes: float | None = None  # wall-clock per run: past it the run checkpoints and stops
    upload_mb: float | None = 1_024.0
    queue_size: int | None = 1_000  # runs waiting in the queue, all users together
    queued_per_user: int | None = None  # runs a user may have queued or running at once
    disk_quota_gb: float | None = None  # the data folder's size past which no run starts
    max_model_params: float | None = None  # parameters of a model (counted from its config); ZeroGPU: 0.6e9
    max_full_finetune_params: float | None = None  # the same, for a run without LoRA; ZeroGPU: see below

    LABELS = {"max_prompts": "prompts per run", "max_eval_size": "held-out prompts", "max_value_samples": "N",
              "max_completion_length": "completion tokens", "max_prompt_length": "prompt tokens",
              "max_steps": "training steps", "max_epochs": "epochs", "max_batch_size": "batch size",
              "max_lora_rank": "LoRA rank", "max_name_length": "characters in a run name",
              "run_minutes": "minutes of wall-clock time per run", "upload_mb": "MB per upload",
              "queue_size": "runs in the queue", "queued_per_user": "queued or running runs per user",
              "disk_quota_gb": "GB of disk for the data folder", "max_model_params": "parameters per model",
              "max_full_finetune_params": "parameters per model trained without LoRA"}

    def describe(self) -> dict[str, Any]:
        """Every limit by name (`max_prompts`: 100000, ...), None where there is none: for the API and the form."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def text(self) -> str:
        """One line a person can read: "at most 2000 prompts per run, 16 N, ..."."""
        return ", ".join(f"{_number(getattr(self, k))} {label}" for k, label in self.LABELS.items()
                         if getattr(self, k) is not None)


PUBLIC_LIMITS = Limits(max_prompts=2_000, max_eval_size=256, max_value_samples=16, max_completion_length=512,
                       max_prompt_length=1_024, max_steps=2_000, max_epochs=20.0, max_batch_size=64,
                       max_lora_rank=64, run_minutes=60.0, upload_mb=10.0, queue_size=20, queued_per_user=2,
                       disk_quota_gb=30.0)


# On a ZeroGPU Space every chunk restores and saves the run: small models (and LoRA, see `Services.checked`) keep
# that overhead a small share of a visitor's few minutes of GPU a day (docs/spaces.md).
ZEROGPU_MAX_MODEL_PARAMS = 0.6e9
# Above this, a ZeroGPU run trains LoRA: a full fine-tune's chunk restores and saves the weights and AdamW's two
# moments (12 bytes a parameter in fp32), which for a 0.5B model takes longer than the GPU call's margin for it
# (`app.runtime.chunks.CHUNK_MARGIN`; docs/spaces.md, "What a chunk costs").
ZEROGPU_MAX_FULL_FINETUNE_PARAMS = 0.2e9


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass
class Policy:
    """The operator's choices for one studio process."""

    data_dir: Path
    limits: Limits = field(default_factory=Limits)
    public: bool = False
    allow_remote_code: bool = False  # trust_remote_code / model_init_kwargs: a model repo's Python runs in a worker
    allow_hub_push: bool = False  # push_to_hub and hub_*: runs may write to the hub with the server's token
    allow_hub: bool = True  # hub models and datasets (downloads); off by default with --public
    model_roots: tuple[Path, ...] = ()  # folders local models may come from, besides <data-dir>/models
    zerogpu: bool = False  # a ZeroGPU Space: runs train a LoRA adapter unless their spec says otherwise
    # The files Gradio's upload route received (`gr.Blocks.upload_file_set`, shared once the dashboard is built).
    received_uploads: Collection[str] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        self.model_roots = tuple(Path(p).expanduser().resolve() for p in self.model_roots)

    @property
    def datasets_dir(self) -> Path:
        """Where dataset files live: files put there by the operator, and API uploads (`uploads/`)."""
        return self.data_dir / "datasets"

    def local_model_roots(self) -> list[Path]:
        """Folders a local model may be read from: `<data-dir>/models`, the operator's `--model-root`s, and the
        cache holding the converted default model."""
        from a2po.models import default_cache_dir

        return [self.data_dir / "models", *self.model_roots, default_cache_dir().expanduser().resolve()]

    def dataset_roots(self) -> list[Path]:
        return [self.datasets_dir.resolve()]

    def received_upload(self, path: str | os.PathLike[str]) -> Path | None:
        """`path` resolved if Gradio received it as an upload in this process (a file picked in the launch form),
        else None. Gradio's folder (`GRADIO_TEMP_DIR`) may hold anything else the operator keeps there, and other
        apps' uploads: only the files its upload route wrote count."""
        path = Path(path).expanduser()
        if not path.is_absolute() or os.path.abspath(path) not in self.received_uploads:
            return None
        return path.resolve()

    @staticmethod
    def inside(path: str | os.PathLike[str], roots: list[Path]) -> Path | None:
        """`path` resolved (symlinks and `..` followed) if it lies in one of `roots`, else None. A relative path
        is taken relative to the first root."""
        path = Path(path).expanduser()
        if not path.is_absolute() and roots:
            path = roots[0] / path
        resolved = path.resolve()
        return resolved if any(resolved.is_relative_to(root.resolve()) for root in roots) else None

    def operator_fields(self) -> dict[str, str]:
        """Config fields that reach outside a run and are allowed only by a flag: field -> the flag."""
        remote = {"trust_remote_code": "--allow-remote-code", "model_init_kwargs": "--allow-remote-code"}
        push = {k: "--allow-hub-push" for k in ("push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo",
                                                "hub_revision", "hub_always_push")}
        return {**remote, **push}

    def allowed_operator_fields(self) -> set[str]:
        flags = {"--allow-remote-code": self.allow_remote_code, "--allow-hub-push": self.allow_hub_push}
        return {k for k, flag in self.operator_fields().items() if flags[flag]}

    def worker_environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a worker: this one without credentials (a run executes user-chosen models, data and
        settings), except the hub token when hub pushes are allowed."""
        return without_secrets(os.environ if base is None else base, keep_hub_token=self.allow_hub_push)

    # ------------------------------------------------------------------ disk

    _disk_cache: tuple[float, int] = field(default=(0.0, 0), init=False, repr=False, compare=False)

    def disk_usage_bytes(self, max_age: float = 30.0) -> int:
        """Bytes under the data folder (cached for `max_age` seconds: walking it is not free)."""
        checked, size = self._disk_cache
        if time.monotonic() - checked < max_age:
            return size
        size = 0
        for root, _dirs, files in os.walk(self.data_dir):
            for name in files:
                try:
                    size += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        self._disk_cache = (time.monotonic(), size)
        return size

    def disk_problem(self) -> str | None:
        """Why no run may start for lack of disk, or None."""
        quota = self.limits.disk_quota_gb
        if quota is not None:
            used = self.disk_usage_bytes() / 1e9
            if used >= quota:
                return (f"The studio's data folder uses {used:.1f} GB, over its disk quota of {quota:g} GB: delete "
                        "runs (and their checkpoints) before launching another.")
        free = shutil.disk_usage(self.data_dir).free / 1e9
        if free < 1.0:
            return f"Only {free:.2f} GB of disk is free under {self.data_dir}: free some before launching a run."
        return None


def without_secrets(env: Mapping[str, str], keep_hub_token: bool = False) -> dict[str, str]:
    """`env` without credentials (names matching `SECRET_ENV`), keeping the hub token when `keep_hub_token`."""
    return {name: value for name, value in env.items()
            if not SECRET_ENV.search(name) or (keep_hub_token and name in HUB_TOKEN_ENV)}
