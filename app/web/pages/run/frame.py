"""One draw of the Run page: the run as the shared snapshot holds it and one session's inputs (`Frame`), the
Training tab's chart options, and what the run's row says of its V* rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.access.gate import Services
from app.web.pages import completions, values
from storage import Store

X_AXES = ("step", "time", "compute")  # the Training tab's x axes


@dataclass(frozen=True)
class ChartOptions:
    """How the Training tab draws its curves: EMA smoothing, x by "step", "time" or "compute", log-scale y."""

    smoothing: float = 0.6
    x_axis: str = "step"
    log_y: bool = False

    @classmethod
    def of(cls, smoothing: float | None, x_axis: str | None, log_y: bool | None) -> ChartOptions:
        return cls(float(smoothing if smoothing is not None else 0.6), x_axis if x_axis in X_AXES else "step",
                   bool(log_y))


@dataclass(frozen=True)
class Frame:
    """One draw of the run in `snap` (`live.snapshot`) for one session's inputs: what every view is built from."""

    services: Services
    snap: dict[str, Any]
    chart: ChartOptions
    split: str
    order: str
    search: str | None
    correct: str
    text: str | None
    step: float | None
    sort: str = "prompt"
    latest: bool = True
    sample_split: str = "train"

    @classmethod
    def of(cls, services: Services, snap: dict[str, Any], chart: ChartOptions, split: str, order: str,
           search: str | None, correct: str, text: str | None, step: float | str | None, sort: str | None = None,
           latest: bool | None = True, sample_split: str | None = None) -> Frame:
        """The session's inputs as a draw reads them: the train split, stage-1 order and no search by default;
        the Samples tab on the latest step (its slider's value then read as none), sorted by prompt."""
        latest = latest is not False
        return cls(services, snap, chart, split or "train", order if order in values.ORDERS else "stage-1 order",
                   (search or "").strip() or None, correct, text, None if latest or step == "" else step,
                   sort if sort in completions.SORTS else "prompt", latest, sample_split or "train")

    @property
    def store(self) -> Store:
        return self.services.store

    @property
    def run(self) -> dict[str, Any]:
        return self.snap["run"]


def value_count(run: dict[str, Any] | None, split: str) -> int:
    """The run's own V* rows of one split (`Store.set_run_values` keeps the count on the run's row)."""
    return int(((run or {}).get("value_counts") or {}).get(split, 0))


def value_splits(run: dict[str, Any] | None) -> list[str]:
    """The splits the run has V* rows of."""
    return sorted(s for s, n in ((run or {}).get("value_counts") or {}).items() if n)


def expected_prompts(run: dict[str, Any]) -> int | None:
    """The training prompts stage 1 samples, where the spec says it (a built-in arithmetic dataset)."""
    dataset = (run.get("config") or {}).get("dataset") or {}
    if dataset.get("source") == "arithmetic" and dataset.get("num_prompts"):
        return int(dataset["num_prompts"])  # train prompts; the eval prompts come on top
    return None
