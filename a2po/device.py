"""Where a run trains: an NVIDIA GPU that torch cannot use is said at once, and a run says its device and precision;
the process's memory (its peak, and the garbage collector kept off the objects that live all run).

A torch without CUDA (a CPU build, or a CUDA build whose driver is missing or too old) on a machine with an NVIDIA
GPU trains on the CPU, many times slower, and says nothing; the studio's worker refuses such a run
(`app.runtime.worker.gpu_problem`), the library and the CLI warn (`unused_gpu_warning`). The GPU is found without
CUDA: the driver's `/proc/driver/nvidia/gpus` entries, else the `/dev/nvidiaN` device files.
"""

from __future__ import annotations

import functools
import gc
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Where the NVIDIA driver lists its GPUs, and where their device files are: tests point these elsewhere.
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
DEVICE_FILES = Path("/dev")


def nvidia_gpus() -> list[str]:
    """The NVIDIA GPUs this machine shows without CUDA: the driver's PCI entries, else the `/dev/nvidiaN` files."""
    try:
        found = sorted(entry.name for entry in PROC_GPUS.iterdir())
    except OSError:
        found = []
    if not found:
        try:
            found = sorted(entry.name for entry in DEVICE_FILES.glob("nvidia[0-9]*"))
        except OSError:
            found = []
    return found


def cuda_unusable(cannot: str = "cannot use it") -> str | None:
    """Why torch cannot use a GPU here (a CPU build, or a CUDA build without a driver it can use), or None when it
    can. `cannot` words the second case ("cannot use it", "finds none of them")."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"the installed torch {torch.__version__} is a CPU build"
    return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) {cannot}: no NVIDIA driver loaded, or a driver "
            "older than that CUDA needs")


def unused_gpu_warning(use_cpu: bool) -> str | None:
    """Why this run trains on the CPU beside an NVIDIA GPU it cannot use, or None (it asked for the CPU, torch has
    CUDA, or there is no NVIDIA GPU)."""
    why = None if use_cpu else cuda_unusable()
    gpus = nvidia_gpus() if why else []
    if not gpus:
        return None
    return (f"This machine has an NVIDIA GPU ({', '.join(gpus[:4])}) but {why}: training runs on the CPU, many "
            "times slower. Install a torch build for this machine's CUDA driver "
            "(https://pytorch.org/get-started/locally/), or set use_cpu=True to train on the CPU on purpose.")


def bf16_by_default(config: dict[str, Any]) -> bool:
    """What a run's `bf16` resolves to where this process would train it (`A2POConfig`: None turns bf16 on where the
    GPU supports it), told without starting CUDA, since the studio forks chunked runs: set, it is kept; else True
    when the run does not ask for the CPU or fp16, `CUDA_VISIBLE_DEVICES` hides no GPU it would get, the driver
    lists one and torch has CUDA. (A GPU without bf16, older than Ampere, is taken for one with it.)"""
    if config.get("bf16") is not None:
        return bool(config["bf16"])
    if config.get("use_cpu") or config.get("fp16") or torch.version.cuda is None:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return bool(nvidia_gpus())


_WARNED: set[str] = set()


def warn_unused_gpu(use_cpu: bool, stacklevel: int = 2) -> str | None:
    """`unused_gpu_warning` as a warning, once per process (the CLI says it first, then builds the trainer)."""
    import warnings

    message = unused_gpu_warning(use_cpu)
    if message is not None and message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=stacklevel + 1)
    return message


def autocast_dtype(accelerator: Any) -> torch.dtype | None:
    """The dtype that the Trainer's mixed precision (accelerate's autocast around the policy's forward) computes in,
    or None where the forward runs in its weights' dtype: no `bf16`/`fp16`, or `fp16` on a CPU, which accelerate
    leaves in fp32."""
    if not getattr(accelerator, "native_amp", False):
        return None
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(str(accelerator.mixed_precision))


def precision_summary(trainer: Any) -> str:
    """One line for a run's log: the device it trains on, its weights' dtype, the compute precision and the
    reference's storage, e.g. "cuda:0 (NVIDIA H200); weights float32; compute bfloat16 (autocast); reference
    linear layers bfloat16"."""
    device = trainer.accelerator.device
    where = str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    weights = sorted({str(p.dtype).removeprefix("torch.") for p in trainer.model.parameters() if p.requires_grad})
    compute = autocast_dtype(trainer.accelerator)
    computes = (f"compute {str(compute).removeprefix('torch.')} (autocast)" if compute
                else "compute in the weights' dtype")
    parts = [where, f"weights {'/'.join(weights) or '-'}", computes]
    if trainer.ref_model is not None:
        kinds = sorted({str(p.dtype).removeprefix("torch.") for p in trainer.ref_model.parameters()})
        parts.append(f"reference {'/'.join(kinds)}")
    elif getattr(trainer, "use_peft", False):
        parts.append("reference: the adapters switched off")
    return "; ".join(parts)


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process in GiB: the CUDA allocator's peak on a GPU, else the peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def frozen_gc(method: Callable) -> Callable:
    """Run `method` with the objects alive at its start exempt from Python's cyclic garbage collector.

    A process that has imported torch, transformers and datasets holds millions of objects, and each full
    collection scans them all, a noticeable pause several times an epoch (docs/benchmarks.md, "Design figures"),
    for nothing, since those objects live until the end. Objects created during the call are collected as usual.
    """
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if gc.get_freeze_count():  # already inside a frozen call
            return method(*args, **kwargs)
        gc.freeze()
        try:
            return method(*args, **kwargs)
        finally:
            gc.unfreeze()
    return wrapper
