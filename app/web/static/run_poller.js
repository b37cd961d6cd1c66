/* The Run page's poller: the event of its timer, run in the browser only (app/web/pages/run/, "the poller").
   It asks `run_version` what the run could show, group by group, and clicks the hidden Redraw button of each group
   on screen whose version moved: at most every `config.redraw_ms` unless the run's status changed. `config` is the
   page's one object (`POLLER_CONFIG`): `active_statuses`, `group_tabs` (a group's tab, null: above the tabs),
   `groups_with_head` (groups that redraw the header too), `head` (the header's own group) and `first_page_groups`
   (groups whose first page in stage-1 order stops changing once full: their version is `<group>_first` then). */
async (config) => {
  const live = document.getElementById("run-live");
  if (!live) return [];
  const run = Number(live.dataset.run), now = Date.now();
  const root = ((window.gradio_config && window.gradio_config.root) || location.origin).replace(/\/$/, "");
  // One session for all of this page's polls: without one, each poll makes the server build a new session (CPU,
  // and memory kept per poll).
  window.__runPollSession = window.__runPollSession || "run-poll-" + Math.random().toString(36).slice(2);
  let versions = null;
  try {
    const post = await fetch(`${root}/gradio_api/call/run_version`, {method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({data: [run], session_hash: window.__runPollSession})});
    const event = (await post.json()).event_id;
    const answer = await (await fetch(`${root}/gradio_api/call/run_version/${event}`)).text();
    const data = answer.split("\n").find((line) => line.startsWith("data:"));
    versions = data ? JSON.parse(data.slice(5))[0] : null;
  } catch (error) {
    console.debug("run poll:", error);
  }
  if (!versions || !versions.status) return [];
  const seenBefore = window.__runLive;
  if (seenBefore && seenBefore.run === run && versions.status === seenBefore.versions.status
      && !config.active_statuses.includes(versions.status)) {
    // This end was drawn at an earlier poll (from a snapshot at least as new): polling can stop.
    document.getElementById("run-draw-idle")?.click();
    return [];
  }
  const order = document.querySelector("#values-order input");
  const search = document.querySelector("#values-search textarea, #values-search input");
  const first = order && order.value === "stage-1 order" && !(search && search.value.trim());
  for (const group of config.first_page_groups) {
    versions[group] = first ? versions[group + "_first"] : versions[group];
  }
  const seen = window.__runLive;
  if (!seen || seen.run !== run) {
    window.__runLive = {run: run, versions: versions, at: now};  // a run just picked: drawn then
    return [];
  }
  if (versions.status === seen.versions.status && now - seen.at < config.redraw_ms) return [];
  const due = [];
  for (const [group, tab] of Object.entries(config.group_tabs)) {
    if (versions[group] === seen.versions[group]) continue;
    const panel = tab && document.getElementById("tab-" + tab);
    if (!tab || (panel && panel.offsetParent !== null)) due.push(group);
    seen.versions[group] = versions[group];  // a hidden tab is drawn when it is opened
  }
  const withHead = due.some((group) => config.groups_with_head.includes(group));
  for (const group of due) {
    if (group !== config.head || !withHead) document.getElementById("run-draw-" + group)?.click();
  }
  seen.versions.status = versions.status;
  seen.at = now;
  return [];
}
