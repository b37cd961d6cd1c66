"""Launch page: pick a preset, a model, a dataset and rewards, set hyper-parameters, validate, and start a run.

It opens on the teaching-demo preset, which works offline: one press of "Train" starts a run. A preset fills the
form; the form still shows every value. Every problem is shown right under the field it concerns, with the
studio's limits next to the fields they bound. The form goes through the same allow-list as the API
(`app.access.allowlist.check_spec`, via `Services.launch_run`).

The layout is a few sections (`sections`) that fill one `LaunchForm` (`form`: the page's components, the form's
values and their mapping); `page` lays them out once and binds each event to a module-level handler of `actions` (the
buttons, presets, YAML and what follows a pick) or `plans` (what a pair, a sweep or a step would be). A handler is a
function of the form and of an event's values, returning {component: update} (one output: its value), so tests call
them without a browser (tests/web/test_launch_page.py).
"""
