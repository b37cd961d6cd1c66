"""The devices runs may use: the GPUs the studio sees, or the CPU as one device.

GPUs are numbered as CUDA numbers them in the studio's own process, never by their `/dev/nvidiaN` files: in a
container given GPU 3 of a host the node is `/dev/nvidia3`, yet CUDA (and NVML, and `nvidia-smi`) call that GPU 0.
The count comes from NVML or `nvidia-smi -L`, which list GPUs in PCI bus order; workers then get
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, since CUDA's own default order (fastest first) may differ. None of this imports
torch or opens a CUDA context: the studio forks chunked runs, and a fork cannot use CUDA once its parent did."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PCI_ORDER = "PCI_BUS_ID"  # the order NVML and nvidia-smi number GPUs in
_CUDA_ENTRY = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+")  # an index, or a (prefix of a) GPU or MIG UUID


def visible_gpus(value: str | None) -> tuple[str, ...] | None:
    """The GPUs a `CUDA_VISIBLE_DEVICES` value leaves visible, as CUDA reads it, or None when it is unset. CUDA stops
    at the first entry that names no device, so "", "-1" and "0,-1,1" show none, none and GPU 0."""
    if value is None:
        return None
    found: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not _CUDA_ENTRY.fullmatch(entry) or entry in found:
            break
        found.append(entry)
    return tuple(found)


def _nvml_count() -> int | None:
    """How many GPUs NVML lists, or None without pynvml or a working driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_count() -> int | None:
    """How many GPUs `nvidia-smi -L` lists ("GPU 0: ... (UUID: GPU-...)", MIG devices indented under theirs), or
    None without nvidia-smi or when it fails (no driver, or a driver that does not answer)."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return None
    try:
        done = subprocess.run([program, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return sum(1 for line in done.stdout.splitlines() if re.match(r"GPU \d+:", line))


@dataclass(frozen=True)
class Devices:
    """The GPUs runs may use (ids as CUDA numbers them), or none: then the machine is one device, and a run of
    several processes (gloo, on the CPU) takes it whole, with at most `cpu_processes` processes. `order`: the
    `CUDA_DEVICE_ORDER` those ids assume (None: the environment's own)."""

    gpus: tuple[str, ...] = ()
    cpu_processes: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    order: str | None = None

    @classmethod
    def detect(cls, dev: Path | None = None) -> Devices:
        """The GPUs this process sees: `CUDA_VISIBLE_DEVICES`'s when set (ids kept as given, which is what a worker
        of the same machine must be given too), else as many as NVML, `nvidia-smi -L` or, without either, the
        `nvidiaN` files under `dev` (default /dev) count, numbered from 0 in PCI bus order."""
        visible = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
        if visible is not None:
            return cls(visible)
        count = _nvml_count()
        if count is None:
            count = _nvidia_smi_count()
        if count is None:  # the files say how many, never which number CUDA gives each
            count = sum(1 for p in (dev or Path("/dev")).glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))
        return cls(tuple(str(i) for i in range(count)), order=PCI_ORDER if count else None)

    @classmethod
    def parse(cls, text: str | int | None) -> Devices:
        """From the `--gpus` option: a count ("2": the first that many `detect` finds), a list ("0,2": ids as the
        environment's `CUDA_DEVICE_ORDER` numbers them), "none"/"0", or None (detect)."""
        if text is None or text == "":
            return cls.detect()
        text = str(text).strip()
        if text.lower() in ("none", "cpu", "0"):
            return cls()
        if text.isdigit():
            found = cls.detect()
            if len(found.gpus) >= int(text):  # under CUDA_VISIBLE_DEVICES=2,3, "2" means those two
                return cls(found.gpus[:int(text)], order=found.order)
            return cls(tuple(str(i) for i in range(int(text))))
        return cls(tuple(d.strip() for d in text.split(",") if d.strip()))

    def describe(self) -> str:
        return f"{len(self.gpus)} GPU(s) ({','.join(self.gpus)})" if self.gpus else "CPU only (one run at a time)"

    def check(self, wanted: int, fsdp: bool = False) -> str | None:
        """Why a run of `wanted` processes (one per GPU; on the CPU, gloo processes) can never start here, or None."""
        if wanted < 1:
            return f"A run needs at least one process (got {wanted})."
        if self.gpus and wanted > len(self.gpus):
            return (f"This machine has {len(self.gpus)} GPU(s); the run asks for {wanted} processes, one per GPU "
                    f"(use at most {len(self.gpus)}).")
        if not self.gpus and fsdp:
            return "FSDP shards the model across GPUs, and this machine has none: use DDP (fsdp null)."
        if not self.gpus and wanted > self.cpu_processes:
            return (f"This machine has no GPU; a run of {wanted} processes would run them on its "
                    f"{self.cpu_processes} CPU core(s): use at most {self.cpu_processes}.")
        return None

    def allocate(self, wanted: int, busy: set[str]) -> list[str] | None:
        """Free devices for a run, or None while they are taken. Without GPUs a run takes the machine ("cpu")."""
        if not self.gpus:
            return None if busy else ["cpu"]
        if "*" in busy:  # a run whose devices are unknown (started by an older studio) may use any
            return None
        free = [g for g in self.gpus if g not in busy]
        return free[:wanted] if len(free) >= wanted else None

    def environment(self, devices: list[str]) -> dict[str, str]:
        """The variables that give a worker process `devices` (GPU ids of `gpus`), numbered as this studio numbers
        them."""
        env = {"CUDA_VISIBLE_DEVICES": ",".join(devices)}
        if self.order:
            env["CUDA_DEVICE_ORDER"] = self.order
        return env
