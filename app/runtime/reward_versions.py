"""Which version of each registered reward scored a run, against the one stamped at launch.

The studio stamps each registered reward's source (file, sha256) into a run's spec at launch
(`a2po.reward_registry.stamp_sources`), but a worker or a chunk imports whatever the file holds when it starts. So
each start logs one line per registered reward (`loaded`): INFO when it scores with the stamped version, WARNING
when the file changed since (the Run page's Logs tab shows both). Each line ends with the full sha256, from which
`scored_by` reads back every version that scored a run, and `versions_note` tells Compare when the runs it compares
were scored by different versions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SCORED = re.compile(r"^Reward (?P<name>\S+?):? .*scored by sha256 (?P<sha>[0-9a-f]{64})\.$", re.DOTALL)


def loaded(rewards: Sequence[Mapping[str, Any]], funcs: Iterable[Any], part: str) -> list[tuple[int, str]]:
    """(logging level, message) for each registered reward of a run's spec (`rewards`, stamped at launch) among the
    trainer's `funcs` (`a2po.reward_registry.RegisteredRewardFunction`): which version scores `part` of the run."""
    by_name = {f.reward.name: f for f in funcs if hasattr(f, "loaded_sha256")}
    lines = []
    for reward in rewards:
        func = by_name.get(reward.get("name"))
        if func is None:
            continue
        source = reward.get("source") if isinstance(reward.get("source"), Mapping) else {}
        stamped, sha, name, file = source.get("sha256"), func.loaded_sha256, func.reward.name, func.reward.file
        scored = f"scored by sha256 {sha}." if sha else "scored by a version that could not be hashed."
        if stamped is None or sha == stamped:
            lines.append((logging.INFO, f"Reward {name}: {part} scores with {file} as stamped at launch; {scored}"))
        else:
            lines.append((logging.WARNING, f"Reward {name} changed since launch: {part} scores with {file} as it "
                                           f"is now (sha256 {str(sha)[:12]}…), not the version stamped at launch "
                                           f"({str(stamped)[:12]}…), so its rewards may differ from the earlier "
                                           f"parts' and from other runs'; {scored}"))
    return lines


def scored_by(store: Any, run: Mapping[str, Any]) -> dict[str, set[str]]:
    """Every version (sha256) of each registered reward that scored the run, from its log; the stamp of a reward
    that no start logged (a run from before these lines, or one that never started)."""
    versions: dict[str, set[str]] = {}
    for line in store.get_logs(run["id"], limit=None):
        match = SCORED.match(line["message"])
        if match:
            versions.setdefault(match["name"], set()).add(match["sha"])
    for reward in (run.get("config") or {}).get("rewards") or []:
        source = reward.get("source") if isinstance(reward, Mapping) else None
        if isinstance(source, Mapping) and source.get("sha256") and reward.get("name") not in versions:
            versions[reward["name"]] = {source["sha256"]}
    return versions


def versions_note(store: Any, runs: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown paragraph (with a leading blank line) naming each registered reward that scored the compared
    `runs` with more than one version, or "" when each was scored by one version throughout."""
    by_run = {run["id"]: scored_by(store, run) for run in runs}
    notes = []
    for name in sorted({n for versions in by_run.values() for n in versions}):
        used = {run_id: versions[name] for run_id, versions in by_run.items() if name in versions}
        if len(set().union(*used.values())) > 1:
            each = "; ".join(f"#{run_id}: " + ", ".join(sorted(s[:12] + "…" for s in shas))
                             for run_id, shas in sorted(used.items()))
            notes.append(f"`{name}` was scored by different versions of its file ({each}, sha256)")
    if not notes:
        return ""
    return ("\n\n**Rewards differ:** " + "; ".join(notes) + ". The runs' rewards are not the same function: "
            "rerun them with one version before comparing.")


def warn_changes(store: Any, run: dict[str, Any]) -> list[str]:
    """Log a warning for each registered reward of a run being resumed that changed (or went) since its spec
    recorded it: the resumed run scores with what is registered now. Reads the files; imports nothing."""
    from a2po.reward_registry import reward_changes

    try:
        warnings = reward_changes((run.get("config") or {}).get("rewards"), what="the resumed run")
    except Exception as error:  # noqa: BLE001 - a warning that cannot be computed must not block a resume
        warnings = [f"Could not check whether the run's registered rewards changed: {error}"]
    for warning in warnings:
        store.add_log(run["id"], warning, level="WARNING")
    return warnings
