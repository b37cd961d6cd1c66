"""The Run page's poller: the groups it redraws (derived from `views.VIEWS`), its config for
`app/web/static/run_poller.js`, the versions it compares (`run_version`) and a group's redraw (`draw_group`)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import gradio as gr

from app.access.gate import Services
from app.web import live
from app.web.pages.run.frame import ChartOptions, Frame
from app.web.pages.run.views import HEADER, VIEWS, View
from storage import Store
from storage.lifecycle import UNFINISHED

POLL_SECONDS = 2.5
# How often a page on a live run redraws at most (a run writes every second or two); a change of status at once.
LIVE_REDRAW_SECONDS = 5.0


# The poller's last word once it saw an end twice (see the poller): the header and the timer (off) from one snapshot,
# so the page always ends on the end, even when an earlier header draw was dropped or read a snapshot from before it
# on a busy server (a visitor's page stuck on "running" after the owner's stop).
IDLE = "idle"


def _own_views() -> dict[str, tuple[View, ...]]:
    """Each poller group's views (those whose changes make its version), in the order of `VIEWS`."""
    groups: dict[str, tuple[View, ...]] = {}
    for view in VIEWS.values():
        groups[view.group] = (*groups.get(view.group, ()), view)
    for group, views in groups.items():
        if len({view.tab for view in views}) > 1:
            raise ValueError(f"The Run page's views {[v.name for v in views]} share the poller group {group!r} but "
                             "not a tab: give the views of each tab their own group.")
    return groups


GROUP_OWN = _own_views()
GROUP_TAB = {group: views[0].tab for group, views in GROUP_OWN.items()}
# What each group draws: each group is its own Gradio event with exactly its outputs (an output left out with
# `gr.skip()` still costs the server a component built and its config regenerated, which adds up over a page's many
# outputs), drawn when its version in `run_version` moved and its tab (None: any) is open.
GROUP_VIEWS = {**{group: (HEADER, *views) if GROUP_TAB[group] is not None and all(v.with_header for v in views)
                  else views for group, views in GROUP_OWN.items()},
               IDLE: (HEADER,)}
GROUPS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    group: (GROUP_TAB.get(group), (*dict.fromkeys(name for view in views for name in view.outputs),
                                   *(("timer",) if group == IDLE else ())))
    for group, views in GROUP_VIEWS.items()}
# The poller's one config object (see app/web/static/run_poller.js).
POLLER_CONFIG = {
    "redraw_ms": int(LIVE_REDRAW_SECONDS * 1000),
    "active_statuses": sorted(UNFINISHED),
    "group_tabs": GROUP_TAB,
    "head": HEADER.group,
    "groups_with_head": [group for group in GROUP_TAB if group != HEADER.group and HEADER in GROUP_VIEWS[group]],
    "first_page_groups": [group for group, views in GROUP_OWN.items() if any(v.first_page_changes for v in views)],
}
POLLER_SOURCE = resources.files("app.web").joinpath("static", "run_poller.js").read_text(encoding="utf-8")
POLLER_JS = f"() => ({POLLER_SOURCE.strip()})({json.dumps(POLLER_CONFIG)})"


def run_version(store: Store, run_id: int) -> dict[str, str]:
    """What a page on `run_id` could show, group by group (see `GROUPS`), as short strings from the shared snapshot:
    the page's poller compares them with the last ones and redraws only the groups that moved. A group with a view
    whose first page in stage-1 order stops changing once full also has `<group>_first`."""
    snap = live.snapshot(store, int(run_id))
    if snap is None:
        return {"status": "gone"}

    def joined(parts: list[tuple[Any, ...]]) -> str:
        return "|".join(str(x) for part in parts for x in part)

    versions = {"status": snap["run"]["status"]}
    for group, views in GROUP_OWN.items():
        versions[group] = joined([view.changes(snap) for view in views])
        if group in POLLER_CONFIG["first_page_groups"]:
            versions[f"{group}_first"] = joined([(view.first_page_changes or view.changes)(snap) for view in views])
    return versions


def draw_group(services: Services, group: str, run_id: int | None, chart: ChartOptions, split: str, order: str,
               search: str | None, correct: str, text: str | None, step: float | None, sort: str | None = None,
               latest: bool | None = True, sample_split: str | None = None) -> list[Any]:
    """One group's outputs (see `GROUPS`) for the poller: no session state is read or written (the poller decided
    what moved); each value comes from what every session shares (`live.SHARED`)."""
    snap = live.snapshot(services.store, run_id) if run_id is not None else None
    names = GROUPS[group][1]
    if snap is None:
        return [gr.skip()] * len(names)
    frame = Frame.of(services, snap, chart, split, order, search, correct, text, step, sort, latest, sample_split)
    out: dict[str, Any] = {}
    for view in GROUP_VIEWS[group]:
        built = view.build(frame)
        out.update({name: built[name] for name in view.outputs})
    if group == IDLE:
        out["timer"] = gr.Timer(POLL_SECONDS, active=frame.run["status"] in UNFINISHED)
    return [out.get(name, gr.skip()) for name in names]
