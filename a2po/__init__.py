"""A*-PO (optimal advantage regression) for language models: `from a2po import A2POConfig, A2POTrainer`; GRPO on
the same engine, for comparison: `from a2po import GRPOConfig, GRPOTrainer`.

The names below are imported on first use (PEP 562), so `import a2po._faults` or `a2po.runspec`'s light helpers
do not pay for torch and transformers: a worker that fails before its job (or a test of one) starts without them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {"A2POCallback": "a2po.callbacks", "StageInterrupted": "a2po.callbacks", "A2POConfig": "a2po.config",
            "GRPOConfig": "a2po.config", "a2po_loss": "a2po.core", "optimal_value": "a2po.core",
            "group_advantages": "a2po.core", "grpo_loss": "a2po.core", "A2POTrainer": "a2po.trainer",
            "GRPOTrainer": "a2po.grpo_trainer", "VALUE_COLUMNS": "a2po.values",
            "load_optimal_values": "a2po.values", "save_optimal_values": "a2po.values"}
__all__ = ["A2POCallback", "A2POConfig", "A2POTrainer", "GRPOConfig", "GRPOTrainer", "StageInterrupted",
           "VALUE_COLUMNS", "a2po_loss", "group_advantages", "grpo_loss", "load_optimal_values", "optimal_value",
           "save_optimal_values"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from a2po.callbacks import A2POCallback, StageInterrupted
    from a2po.config import A2POConfig, GRPOConfig
    from a2po.core import a2po_loss, group_advantages, grpo_loss, optimal_value
    from a2po.grpo_trainer import GRPOTrainer
    from a2po.trainer import A2POTrainer
    from a2po.values import VALUE_COLUMNS, load_optimal_values, save_optimal_values


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'a2po' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
