"""Run page: one run, live while it works.

Its modules: `page` (the layout, laid out once, and its events), `views` (`VIEWS`, each view declared once),
`builders` (what each view shows), `header` (the title line and progress bars), `frame` (one draw's inputs),
`poller` (the groups the browser's poller redraws) and `session` (a session's own draws, `refresh`).

What the page shows is a list of views (`VIEWS`): each declares its tab, the poller's group that redraws it, the
components it fills, what moves it and how it is built; the page's outputs, its tabs and the poller's groups are
derived from that list, so a new view is one declaration there (and its component in the layout).

A `gr.Timer` ticks every `POLL_SECONDS` while the run is active (queued, running, stopping) and is switched off
(`gr.Timer(active=False)`) once it is not: a finished, failed, stopped or interrupted run costs nothing while its
page stays open. Picking an active run, or resuming this one, switches it on again.

A tick is cheap, on both sides. Its event runs in the browser only (the poller, `app/web/static/run_poller.js`,
given `POLLER_CONFIG`): a Gradio event, even one that changes nothing, makes the page walk every component of the
app twice (their loading status), which is costly on this page; so the tick only asks `run_version` for a short
string per group saying what the run could show, read from a snapshot shared by every session (`live.snapshot`,
read at most once a second). When one moved, the poller clicks that group's hidden Redraw button (at most every
`LIVE_REDRAW_SECONDS`, at once when the status changed), and that Gradio event (`draw_group`) sends only that
group's outputs. A session's own events (`refresh`: a tab opened, a filter changed, a run picked) send only the
views on screen whose version moved. Each session keeps in a `gr.State` only the run id, the selected tab and one
version per view. What a view shows is computed once per version for all sessions (`live.SHARED`).
"""
