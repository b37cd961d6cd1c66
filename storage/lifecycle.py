"""The run state machine: every status a run can have, every legal change of status, and what each counter means.

This module is the contract of the README's "Durable runs" section. Every change of a run's status goes through one
of the `EVENTS` below (`Store.apply(run_id, EVENT, ...)`: an atomic compare-and-set on the run's row that only
happens while the run is in one of the event's source statuses); `Store.update_run` refuses `status` and the
counters, so no other path can change them.

Statuses:

    queued       waits for a process (a worker, or the next chunk of a chunked run)
    running      a process works on it
    stopping     a process works on it and was asked to stop (checkpoint, then end)
    paused       a chunked run on a ZeroGPU Space that no open page drives; its page resumes it
    stopped      ended by a stop (a user's, the watchdog's, a limit's); Resume continues it
    interrupted  ended by the deployment's shutdown, or its process vanished while no studio watched; resumed
                 automatically at the next start (at most `MAX_AUTO_RESUMES` times in a row)
    finished     done; its final model is saved
    failed       ended by an error (the reason is in `error`); Resume continues it from its last checkpoint

Events (each below, `EVENTS`): claim (queued -> running), request_stop (running -> stopping), cancel (queued,
paused -> stopped), finish / stop / interrupt / fail (running, stopping -> an end), launch_retry (queued -> queued)
and fail_launch (queued -> failed) for workers that exit before claiming, yield (running -> queued: a chunk spent
its budget), chunk_lost (running, stopping -> queued, or paused on ZeroGPU), release (running -> paused: no GPU
could be had for a ZeroGPU chunk), pause and unpause (queued <-> paused),
resume (stopped, interrupted, failed, paused -> queued: a user's), auto_resume (interrupted -> queued).

Counters (columns of `runs`):

    auto_resumes     automatic restarts in a row: `auto_resume` (after an interruption) and `chunk_lost` (a chunk's
                     process died) add one; real progress after the restart (a stage-1 batch, a training step or a
                     checkpoint, `Store.record_progress`) and a user's `resume` reset it. Past `MAX_AUTO_RESUMES` a
                     run is no longer restarted by itself.
    launch_failures  worker starts in a row that ended before the worker claimed the run: `launch_retry` and
                     `fail_launch` add one; `claim` and `resume` reset it.
    chunks_done      chunks a chunked run has run, in its whole life (`yield`, and the ends of a chunk).
    chunk_seconds    the seconds those chunks took (on ZeroGPU: GPU time charged), in its whole life.
    limit_seconds    seconds worked since the run was launched or a user resumed it: each stretch from `claim` to
                     the end of that process's work adds its length. The studio's per-run time limit compares it,
                     plus the stretch under way, with `run_minutes`.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUED, RUNNING, STOPPING, PAUSED = "queued", "running", "stopping", "paused"
STOPPED, INTERRUPTED, FINISHED, FAILED = "stopped", "interrupted", "finished", "failed"
STATUSES = (QUEUED, RUNNING, STOPPING, STOPPED, INTERRUPTED, FINISHED, FAILED, PAUSED)

LIVE = (RUNNING, STOPPING)  # a process works on the run
WAITING = (QUEUED, PAUSED)  # no process yet: a stop ends it at once
UNFINISHED = (*WAITING, *LIVE)  # what the queue limits count, and what the pages call active
ENDED = (STOPPED, INTERRUPTED, FINISHED, FAILED)  # no process, nothing waits
RESUMABLE = (STOPPED, INTERRUPTED, FAILED, PAUSED)  # a user's Resume queues it again

# Why a run stopped: asked by a user, by the deployment shutting down (resumable, resumed on the next start), by the
# watchdog (no progress), by a limit of the studio (e.g. a wall-clock limit), or lost: its process was stopped from
# outside the studio, or the Ray cluster that ran it lost it (interrupted, and resumed by the studio).
STOP_REASONS = ("user", "shutdown", "watchdog", "limit", "lost")
MAX_AUTO_RESUMES = 3
COUNTERS = ("auto_resumes", "launch_failures", "chunks_done", "chunk_seconds", "limit_seconds")


@dataclass(frozen=True)
class Event:
    """One legal change: from any of `sources` to `target`, with what it does to the run's other columns.

    `stamps`: columns set to the time of the change; `clears`: columns set to None; `resets`: counters set to 0;
    `increments`: counters plus one; `ends_stretch`: a process stopped working on the run, so the time since
    its claim counts in `limit_seconds`. An event that ends a chunk is applied with the chunk's seconds
    (`Store.apply(..., seconds=)`): `chunks_done` + 1 and the seconds in `chunk_seconds`.
    """

    name: str
    sources: tuple[str, ...]
    target: str
    doc: str
    stamps: tuple[str, ...] = ()
    clears: tuple[str, ...] = ()
    resets: tuple[str, ...] = ()
    increments: tuple[str, ...] = ()
    ends_stretch: bool = False

    def __str__(self) -> str:
        return self.name


_END = dict(stamps=("finished_at",), clears=("pid", "devices"), ends_stretch=True)

CLAIM = Event("claim", (QUEUED,), RUNNING, "a process starts working on the run",
              stamps=("started_at", "heartbeat_at", "progress_at"), clears=("finished_at", "error", "stop_reason"),
              resets=("launch_failures",))
REQUEST_STOP = Event("request_stop", (RUNNING,), STOPPING, "its process is asked to checkpoint and stop")
CANCEL = Event("cancel", WAITING, STOPPED, "stopped before any process took it", stamps=("finished_at",),
               clears=("pid", "devices"))
FINISH = Event("finish", LIVE, FINISHED, "done", **_END)
STOP = Event("stop", LIVE, STOPPED, "ended by a stop", **_END)
INTERRUPT = Event("interrupt", LIVE, INTERRUPTED, "ended by the deployment's shutdown, by a stop from outside the "
                  "studio, by a full disk, or its process vanished while no studio watched or with the Ray "
                  "cluster", **_END)
FAIL = Event("fail", LIVE, FAILED, "ended by an error", **_END)
LAUNCH_RETRY = Event("launch_retry", (QUEUED,), QUEUED, "a worker exited before claiming it; it is started again",
                     clears=("pid", "devices"), increments=("launch_failures",))
FAIL_LAUNCH = Event("fail_launch", (QUEUED,), FAILED, "workers kept exiting before claiming it",
                    stamps=("finished_at",), clears=("pid", "devices"), increments=("launch_failures",))
YIELD = Event("yield", (RUNNING,), QUEUED, "a chunk spent its budget; the next chunk goes on (its place in the "
              "queue kept)", stamps=("heartbeat_at",), clears=("pid", "devices"), ends_stretch=True)
CHUNK_LOST = Event("chunk_lost", LIVE, QUEUED, "a chunk's process died without an end; the next chunk goes on from "
                   "what it committed", stamps=("heartbeat_at",), clears=("pid", "devices"),
                   increments=("auto_resumes",), ends_stretch=True)
CHUNK_LOST_PAUSED = Event("chunk_lost_paused", LIVE, PAUSED, "as chunk_lost, on ZeroGPU: its page goes on with it",
                          stamps=("heartbeat_at",), clears=("pid", "devices"), increments=("auto_resumes",),
                          ends_stretch=True)
RELEASE = Event("release", (RUNNING,), PAUSED, "ZeroGPU: no GPU could be had for the claimed chunk, which never "
                "started; its page tries again", stamps=("heartbeat_at",), clears=("pid", "devices"),
                ends_stretch=True)
PAUSE = Event("pause", (QUEUED,), PAUSED, "ZeroGPU: no open page drives its chunks")
UNPAUSE = Event("unpause", (PAUSED,), QUEUED, "ZeroGPU: its page is open again", stamps=("heartbeat_at",))
RESUME = Event("resume", RESUMABLE, QUEUED, "a user queues it again (at the end of the queue)",
               stamps=("queued_at",), clears=("pid", "devices", "error", "finished_at", "stop_reason"),
               resets=("auto_resumes", "launch_failures", "limit_seconds"))
AUTO_RESUME = Event("auto_resume", (INTERRUPTED,), QUEUED, "queued again at its old place after an interruption",
                    clears=("pid", "devices", "error", "finished_at", "stop_reason"), increments=("auto_resumes",))

EVENTS = {e.name: e for e in (CLAIM, REQUEST_STOP, CANCEL, FINISH, STOP, INTERRUPT, FAIL, LAUNCH_RETRY, FAIL_LAUNCH,
                              YIELD, CHUNK_LOST, CHUNK_LOST_PAUSED, RELEASE, PAUSE, UNPAUSE, RESUME, AUTO_RESUME)}


def end_event(outcome: str, stop_reason: str | None = None) -> Event:
    """How a process that ends its work records it: "finished", "stopped" or "failed". A stop asked by the
    deployment's shutdown ends "interrupted", to be resumed at the next start; so does a stop nobody in the studio
    asked for (no `stop_reason`: a SIGTERM from outside, e.g. its Ray job stopped or its node drained), which the
    studio resumes."""
    if outcome == FINISHED:
        return FINISH
    if outcome == STOPPED:
        return INTERRUPT if stop_reason in ("shutdown", None) else STOP
    if outcome == FAILED:
        return FAIL
    raise ValueError(f"Unknown outcome {outcome!r}: use finished, stopped or failed.")


def may_auto_resume(run: dict) -> bool:
    """Whether an interrupted run (or one whose chunk died) may be restarted without a user."""
    return int(run.get("auto_resumes") or 0) < MAX_AUTO_RESUMES


def path(to: str, start: str = QUEUED) -> list[Event]:
    """The shortest sequence of events that takes a run from `start` to `to` (benchmarks and tests that need a run
    in some status get it the way runs get there)."""
    routes: dict[str, list[Event]] = {start: []}
    frontier = [start]
    while frontier and to not in routes:
        status = frontier.pop(0)
        for event in EVENTS.values():
            if status in event.sources and event.target not in routes:
                routes[event.target] = [*routes[status], event]
                frontier.append(event.target)
    if to not in routes:
        raise ValueError(f"No events lead from {start!r} to {to!r}.")
    return routes[to]


def check_graph() -> None:
    """Every status is reachable from "queued", and from every status that is not an end some end is reachable: a
    run can never be stuck by design."""
    def reachable(start: str) -> set[str]:
        seen, frontier = {start}, [start]
        while frontier:
            status = frontier.pop()
            for event in EVENTS.values():
                if status in event.sources and event.target not in seen:
                    seen.add(event.target)
                    frontier.append(event.target)
        return seen

    assert reachable(QUEUED) == set(STATUSES), f"unreachable: {set(STATUSES) - reachable(QUEUED)}"
    for status in UNFINISHED:
        assert reachable(status) & set(ENDED), f"{status} can never end"


check_graph()
