"""The devices runs may use: the GPUs the studio sees, or the CPU as one device."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Devices:
    """The GPUs runs may use (ids as CUDA numbers them), or none: then the machine is one device, and a run of
    several processes (gloo, on the CPU) takes it whole, with at most `cpu_processes` processes."""

    gpus: tuple[str, ...] = ()
    cpu_processes: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))

    @classmethod
    def detect(cls) -> Devices:
        """`CUDA_VISIBLE_DEVICES` when set, else the NVIDIA device files (no torch import, no CUDA context)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return cls(tuple(d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"))
        found = sorted(int(m.group(1)) for p in Path("/dev").glob("nvidia*") if (m := re.fullmatch(r"nvidia(\d+)",
                                                                                                     p.name)))
        return cls(tuple(str(i) for i in found))

    @classmethod
    def parse(cls, text: str | int | None) -> Devices:
        """From the `--gpus` option: a count ("2"), a list ("0,2"), "none"/"0", or None (detect)."""
        if text is None or text == "":
            return cls.detect()
        text = str(text).strip()
        if text.lower() in ("none", "cpu", "0"):
            return cls()
        if text.isdigit():
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
