"""A*-PO (optimal advantage regression) for language models: `from a2po import A2POConfig, A2POTrainer`."""

from a2po.callbacks import A2POCallback, StageInterrupted
from a2po.config import A2POConfig
from a2po.core import a2po_loss, optimal_value
from a2po.trainer import A2POTrainer
from a2po.values import VALUE_COLUMNS, load_optimal_values, save_optimal_values

__all__ = ["A2POCallback", "A2POConfig", "A2POTrainer", "StageInterrupted", "VALUE_COLUMNS", "a2po_loss",
           "load_optimal_values", "optimal_value", "save_optimal_values"]
__version__ = "0.1.0"
