"""The scheduler's lock kept through a database server's restart: one studio per database (docs/runtime.md,
"One scheduler per database")."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("app.runtime.scheduler")


class KeptLock:
    """The store's scheduler lock (`Store.scheduler_lock`), taken back when it was lost. `problem`: why this studio
    schedules nothing now (its lock is lost and cannot be taken back), or None."""

    def __init__(self, lock: Any, refused: type[Exception]) -> None:
        self.lock = lock
        self.refused = refused  # what `lock.acquire` raises when another studio holds it
        self.owner: dict[str, Any] | None = None  # who took the lock; None: not taken (every pass runs regardless)
        self.problem: str | None = None

    def acquire(self, **owner: Any) -> None:
        self.lock.acquire(**owner)
        self.owner, self.problem = owner, None

    def release(self) -> None:
        self.owner = self.problem = None
        self.lock.release()

    def hold(self) -> bool:
        """Whether this studio still holds the lock, taking it back if it was lost (a server restart); says so in
        the log when that changes."""
        if self.owner is None or self.lock.check():
            return True
        try:
            self.lock.acquire(**self.owner)
        except self.refused as error:
            problem = str(error)
        except Exception as error:  # noqa: BLE001 - the server is down or restarting: try again next pass
            problem = f"the database does not answer ({(str(error).strip().splitlines() or [repr(error)])[0][:300]})."
        else:
            logger.warning("The scheduler lock on the database was lost (a server restart?) and is taken back: "
                           "scheduling goes on." if self.problem is None else
                           "The scheduler lock on the database is taken back: scheduling goes on.")
            self.problem = None
            return True
        problem = f"This studio lost its lock on the database and starts no run until it takes it back: {problem}"
        if problem != self.problem:
            logger.error("%s", problem)
        self.problem = problem
        return False
