"""The studio-wide banner, above every page: what every visitor must know whatever page they are on. The scheduler
lost its lock on the database (`Scheduler.lock_problem`), or the Ray cluster it sends runs to does not answer
(`Scheduler.cluster_problem`), or its data folder is past its disk quota (`Scheduler.queue_held`), and it starts no
run until that is over. Its wording is fixed: the full reason, which names hosts and addresses, is in the studio's
log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gradio as gr

BANNER_SECONDS = 10.0  # how often an open page asks again
LOCK_LOST = ("**This studio is not scheduling.** It lost its lock on the database (the database server restarted, "
             "or another studio took the lock) and starts no run until it has it back; runs already going on "
             "continue. The studio's log says more.")

CLUSTER_DOWN = ("**This studio is not starting runs.** The Ray cluster it sends runs to does not answer; queued runs "
                "wait, and runs it lost are resumed from their checkpoints once it answers again. The studio's log "
                "says more.")


QUEUE_HELD = ("**This studio is not starting runs.** Its data folder is past its disk quota, or its disk is nearly "
              "full: queued runs wait until runs (and their checkpoints) are deleted; runs already going on continue.")


def studio_problem(services: Any) -> str | None:
    """The banner's text, or None when all is well."""
    if getattr(services.scheduler, "lock_problem", None):
        return LOCK_LOST
    if getattr(services.scheduler, "cluster_problem", None):
        return CLUSTER_DOWN
    return QUEUE_HELD if getattr(services.scheduler, "queue_held", None) else None


def build_banner(demo: gr.Blocks, services: Any) -> gr.Markdown:
    """A hidden banner, shown with the problem while there is one: on page load and every `BANNER_SECONDS`."""
    import gradio as gr  # here: `studio_problem` is read without loading Gradio

    banner = gr.Markdown(visible=False, elem_id="studio-banner")
    timer = gr.Timer(BANNER_SECONDS)

    def show() -> Any:
        problem = studio_problem(services)
        return gr.Markdown(value=problem or "", visible=problem is not None)

    demo.load(show, None, banner, api_visibility="private")
    timer.tick(show, None, banner, api_visibility="private")
    return banner
