"""What the dashboard reads of a run, paged, aggregated in SQL and streamed: the V* tab's histogram and pages, the
training curves downsampled, the exports in batches. `Store` has these methods (`DashboardReads` is one of its
bases); they are here to keep the store's module about the run's own records. The module's SQL helpers are the
store's too."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import Integer, cast, func, literal, or_, select
from sqlalchemy.orm import Session

from a2po.answers import prompt_question
from storage import dialects
from storage.dialects import truncate
from storage.models import LatestMetric, LogLine, Metric, PromptValue, Run, RunValue, Sample
from storage.writes import RUN_OWN


class DashboardReads:
    """`Store`'s reads for the pages (needs the store's `_read`, `_rows` and `dialect`)."""

    # ------------------------------------------------------------------ dashboard reads: paged, aggregated, streamed
    # A run can hold 100k prompts with N completions each, a million samples and hundreds of thousands of metric
    # rows. The dashboard reads it through these methods: aggregates are computed in SQL (from covering indexes
    # where they exist), tables come a page at a time without their wide columns, and exports stream in id order,
    # one short read per batch (a read transaction held open for a whole export would stop the WAL from being
    # checkpointed while a worker writes).

    def value_stats(self, run_id: int, split: str = "train", bins: int = 30) -> dict[str, Any]:
        """What the V* tab draws for one split of a run (the V* and filter the run trained with), computed in SQL
        from the covering index `ix_run_values_stats` alone (no wide row is read, whatever the size of the split):

        `count`, `filtered`, `with_v_star`, `mean_v_star`, `min_v_star`, `max_v_star`; `sampled` (prompts with
        reference samples), `num_samples` (N), `pass_at_1` and `pass_at_n` (the reference policy's, from the
        correct counts), `correct` (prompts with k correct samples, k = 0..N), and `histogram`: `start`, `width`
        and the per-bin counts of `kept` and `filtered` prompts (about `bins` bins of a round width).
        """
        rv = RunValue
        where = (rv.run_id == run_id, rv.split == split)
        with self._read() as s:
            # Two index seeks (min and max read one entry each), then one pass over the index: grouped by its own
            # columns, so SQLite streams it without sorting. Binary rewards give 2 (N + 1) groups at most; a split
            # with more distinct V* values than `STATS_GROUPS` is binned in SQL instead (a sort of index entries).
            lo = s.scalar(select(func.min(rv.v_star)).where(*where))
            hi = s.scalar(select(func.max(rv.v_star)).where(*where))
            start, width, nbins = _histogram_bins(lo, hi, bins)
            keys = (rv.v_star, rv.num_correct, rv.filtered)
            groups = s.execute(select(*keys, func.count(), func.sum(rv.v_star)).where(*where).group_by(*keys)
                               .limit(STATS_GROUPS + 1)).all()
            if len(groups) > STATS_GROUPS:
                keys = (truncate((rv.v_star - start) / width), rv.num_correct, rv.filtered)
                groups = s.execute(select(*keys, func.count(), func.sum(rv.v_star)).where(*where)
                                   .group_by(*keys)).all()
            else:
                groups = [(None if v is None else int((v - start) / width), *rest) for v, *rest in groups]
            n = self._num_samples(s, run_id, split)
        count = filtered = with_v = sampled = correct_sum = any_correct = 0
        v_sum = 0.0
        kept_bins, filtered_bins, correct = [0] * nbins, [0] * nbins, {}
        for b, k, is_filtered, c, v in groups:
            count += c
            filtered += c if is_filtered else 0
            if b is not None:
                (filtered_bins if is_filtered else kept_bins)[min(max(int(b), 0), nbins - 1)] += c
                with_v += c
                v_sum += v
            if k is not None:
                sampled += c
                correct[k] = correct.get(k, 0) + c
                correct_sum += k * c
                any_correct += c if k > 0 else 0
        n = max(int(n), max(correct, default=0))
        return {"count": count, "filtered": filtered, "with_v_star": with_v,
                "mean_v_star": v_sum / with_v if with_v else None, "min_v_star": lo, "max_v_star": hi,
                "sampled": sampled, "num_samples": n,
                "pass_at_1": correct_sum / (sampled * n) if sampled and n else None,
                "pass_at_n": any_correct / sampled if sampled else None,
                "correct": [correct.get(k, 0) for k in range(n + 1)] if sampled else [],
                "histogram": {"start": start, "width": width, "kept": kept_bins, "filtered": filtered_bins}}

    @staticmethod
    def _num_samples(s: Session, run_id: int, split: str) -> int:
        """N, the reference samples per prompt, from one shared row of the split (0 when none was sampled)."""
        rv, pv = RunValue, PromptValue
        return s.scalar(select(func.json_array_length(pv.rewards)).select_from(rv).join(pv, pv.id == rv.value_id)
                        .where(rv.run_id == run_id, rv.split == split, rv.num_correct.is_not(None)).limit(1)) or 0

    def value_summary(self, run_id: int) -> dict[str, dict[str, Any]]:
        """Per split of the run, what stage 1 gave it (`a2po.values.summarize`'s figures, from the run's own rows):
        `num_prompts`, `num_filtered`, `mean_v_star`, `num_value_samples` (N), `pass_at_1`, `pass_at_n`. One pass
        over the covering index per split."""
        rv = RunValue
        out: dict[str, dict[str, Any]] = {}
        with self._read() as s:
            counts = s.scalar(select(Run.value_counts).where(Run.id == run_id)) or {}
            for split in sorted(name for name, rows in counts.items() if rows):
                count, filtered, mean, sampled, correct_sum, any_correct = s.execute(
                    select(func.count(), func.coalesce(func.sum(cast(rv.filtered, Integer)), 0), func.avg(rv.v_star),
                           func.count(rv.num_correct), func.coalesce(func.sum(rv.num_correct), 0),
                           func.coalesce(func.sum(cast(rv.num_correct > 0, Integer)), 0))
                    .where(rv.run_id == run_id, rv.split == split)).one()
                n = self._num_samples(s, run_id, split)
                out[split] = {"num_prompts": count, "num_filtered": int(filtered), "mean_v_star": mean,
                              "num_value_samples": n,
                              "pass_at_1": correct_sum / (sampled * n) if sampled and n else None,
                              "pass_at_n": any_correct / sampled if sampled else None}
        return out

    def values_page(self, run_id: int, split: str = "train", *, text: str | None = None,
                    filtered: bool | None = None, sort: str = "id", descending: bool = False, offset: int = 0,
                    limit: int = 200, text_chars: int = 300) -> list[dict[str, Any]]:
        """One page of a run's prompts of one split for a table: `id` (the shared row's), `prompt_id`, the first
        `text_chars` characters of `prompt_text` (the templated text the model saw), `question` (what the user
        asked: the last user message), and the run's own `v_star`, `num_correct`, `filtered` (never the
        completions or rewards).

        `sort` is one of `VALUE_SORTS` ("id" is the order stage 1 stored them in), ties broken by id; `text` keeps
        prompts whose text or id contains it (case-insensitive for ASCII); `filtered` keeps only the filtered
        (True) or the kept (False) prompts. Without `text` the page is chosen from the run's indexes (sorting
        100k index entries, not 100k rows with their completions) and only its rows are read.
        """
        if sort not in VALUE_SORTS:
            raise ValueError(f"Unknown sort {sort!r}: use one of {', '.join(VALUE_SORTS)}.")
        rv, pv = RunValue, PromptValue
        key = rv.value_id if sort == "id" else getattr(rv, sort)
        order = [key.desc(), rv.value_id.desc()] if descending else [key.asc(), rv.value_id.asc()]
        where = [rv.run_id == run_id, rv.split == split]
        if filtered is not None:
            where.append(rv.filtered == bool(filtered))
        page = select(rv.value_id)
        if text:
            pattern = _like_pattern(text)
            page = page.join(pv, pv.id == rv.value_id)
            # SQLite's LIKE ignores ASCII case; PostgreSQL's does not, its ILIKE does.
            like = "ilike" if self.dialect == dialects.POSTGRESQL else "like"
            where.append(or_(getattr(pv.prompt_text, like)(pattern, escape="\\"),
                             getattr(rv.prompt_id, like)(pattern, escape="\\")))
        page = page.where(*where).order_by(*order).offset(max(0, offset)).limit(max(0, limit))
        with self._read() as s:
            ids = list(s.scalars(page))
            # Then the page's rows by their ids, put in the page's order here: ordered in SQL, the planner would
            # walk the whole split in the sort's index to find them.
            stmt = (select(*_page_columns(text_chars)).select_from(rv).join(pv, pv.id == rv.value_id)
                    .where(rv.run_id == run_id, rv.split == split, rv.value_id.in_(ids)))
            rows = {row["id"]: row for row in self._rows(s, stmt)} if ids else {}
        return _with_questions([rows[i] for i in ids if i in rows])

    def get_value(self, run_id: int, split: str, prompt_id: str) -> dict[str, Any] | None:
        """One prompt of a run: the shared row, with its rewards and completions, and the run's own `v_star`,
        `num_correct`, `filtered` (two index lookups), or None."""
        rv, pv = RunValue, PromptValue
        stmt = (select(*_VALUE_ROW).select_from(rv).join(pv, pv.id == rv.value_id)
                .where(rv.run_id == run_id, rv.split == split, rv.prompt_id == str(prompt_id)))
        with self._read() as s:
            rows = self._rows(s, stmt)
        return rows[0] if rows else None

    def values_after(self, run_id: int, split: str | None = "train", after_id: int = 0,
                     limit: int | None = None) -> list[dict[str, Any]]:
        """A run's prompt rows whose shared row's id is > `after_id`, oldest first, without their wide columns (as
        `values_page`): what stage 1 gave the run since a poller last looked. Cost follows the rows after
        `after_id`, not the split's size."""
        rv, pv = RunValue, PromptValue
        stmt = (select(*_page_columns(300)).select_from(rv).join(pv, pv.id == rv.value_id)
                .where(rv.run_id == run_id, rv.value_id > after_id).order_by(rv.value_id))
        if split is not None:
            stmt = stmt.where(rv.split == split)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as s:
            return _with_questions(self._rows(s, stmt))

    def metric_series(self, run_id: int, names: Iterable[str] | None = None,
                      max_points: int = 1000) -> dict[str, dict[str, list[Any]]]:
        """Per metric name, its curve downsampled in SQL to at most about `max_points` points:
        `{name: {"step", "value", "count", "min", "max"}}`, one list entry per point.

        Short runs come back whole (`count` 1, `min` = `max` = `value`). Longer ones are cut into about
        `max_points / 2` step buckets of the same width: `step` is a bucket's last step, `value` its mean,
        `count` how many rows it holds, `min` / `max` its extremes (a chart draws the extremes, so a spike is never
        averaged away, and smooths the means weighted by `count`). Missing (NaN) values are None.
        """
        with self._read() as s:
            known = select(LatestMetric.name, LatestMetric.step).where(LatestMetric.run_id == run_id)
            if names is not None:
                known = known.where(LatestMetric.name.in_(list(names)))
            last = dict(s.execute(known).all())
            if not last:
                return {}
            width = max(1, math.ceil((max(last.values()) + 1) / max(1, max_points // 2)))
            m = Metric
            where = (m.run_id == run_id, m.name.in_(list(last)))
            if width == 1:
                rows = s.execute(select(m.name, m.step, literal(1), m.value, m.value, m.value).where(*where)
                                 .order_by(m.name, m.step)).all()
            else:
                bucket = m.step // width
                rows = s.execute(select(m.name, func.max(m.step), func.count(), func.avg(m.value),
                                        func.min(m.value), func.max(m.value))
                                 .where(*where).group_by(m.name, bucket).order_by(m.name, bucket)).all()
        out: dict[str, dict[str, list[Any]]] = {}
        for name, step, count, value, lo, hi in rows:
            series = out.setdefault(name, {"step": [], "value": [], "count": [], "min": [], "max": []})
            for key, item in zip(("step", "value", "count", "min", "max"), (step, value, count, lo, hi), strict=True):
                series[key].append(item)
        return out

    def step_times(self, run_id: int, name: str = "loss", max_points: int = 2000) -> list[tuple[int, float]]:
        """(step, unix time the step was logged) for a chart's time axis: from the `name` metric (one row per
        logged step), every k-th row when there are more than `max_points`; [] before the first."""
        m = Metric
        where = (m.run_id == run_id, m.name == name)
        with self._read() as s:
            count = s.execute(select(func.count()).select_from(m).where(*where)).scalar_one()
            stride = max(1, math.ceil(count / max_points))
            rows = s.execute(select(m.step, m.created_at).where(*where).order_by(m.step)).all()
        picked = rows[::stride]
        if rows and picked[-1] != rows[-1]:
            picked.append(rows[-1])
        return [(int(step), float(at)) for step, at in picked]

    def iter_values(self, run_id: int, split: str | None = None, batch: int = 2000) -> Iterator[dict[str, Any]]:
        """Every prompt row of a run (one split, or all, each in stage-1 order): the shared row's columns with the
        run's own `v_star`, `num_correct`, `filtered`, `batch` rows per read: the memory of one batch whatever the
        size of the set."""
        rv, pv = RunValue, PromptValue
        if split is None:
            first = func.min(rv.value_id)
            with self._read() as s:
                splits = list(s.scalars(select(rv.split).where(rv.run_id == run_id).group_by(rv.split)
                                        .order_by(first)))
        else:
            splits = [split]
        for name in splits:
            yield from self._iterate(select(*_VALUE_ROW).select_from(rv).join(pv, pv.id == rv.value_id),
                                     rv.value_id, [rv.run_id == run_id, rv.split == name], batch)

    def iter_samples(self, run_id: int, batch: int = 5000) -> Iterator[dict[str, Any]]:
        """Every sample row of a run, in id order, `batch` rows per read."""
        yield from self._iterate(select(Sample.__table__), Sample.id, [Sample.run_id == run_id], batch)

    def iter_metrics(self, run_id: int, batch: int = 20000) -> Iterator[dict[str, Any]]:
        """Every metric row of a run (id, step, name, value, created_at), in id order, `batch` rows per read."""
        yield from self._iterate(select(Metric.id, Metric.step, Metric.name, Metric.value, Metric.created_at),
                                 Metric.id, [Metric.run_id == run_id], batch)

    def iter_logs(self, run_id: int, batch: int = 5000) -> Iterator[dict[str, Any]]:
        """Every log line of a run, in id order, `batch` rows per read."""
        yield from self._iterate(select(LogLine.__table__), LogLine.id, [LogLine.run_id == run_id], batch)

    def _iterate(self, query: Any, key: Any, where: list[Any], batch: int) -> Iterator[dict[str, Any]]:
        """The rows of `query` matching `where` in the order of `key` (their "id"), one short read of `batch` rows at
        a time (keyset paging: each read starts after the last id seen, so no read costs more than its batch)."""
        last = 0
        while True:
            stmt = query.where(*where, key > last).order_by(key).limit(batch)
            with self._read() as s:
                rows = self._rows(s, stmt)
            yield from rows
            if len(rows) < batch:
                return
            last = rows[-1]["id"]


def _with_questions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        prompt = row.pop("prompt", None)
        row["question"] = row["prompt_text"] if prompt is None else prompt_question(prompt)
    return rows


VALUE_SORTS = ("id", "prompt_id", "v_star", "num_correct")
STATS_GROUPS = 4096
# A run's prompt row: the shared row's columns, in their order, with the run's own values in place of its.
_VALUE_ROW = tuple(getattr(RunValue, c.key) if c.key in RUN_OWN else c for c in PromptValue.__table__.columns)


def _page_columns(text_chars: int) -> tuple[Any, ...]:
    """A table's columns of a run's prompt row: no completions or rewards, the start of the prompt text only."""
    pv, rv = PromptValue, RunValue
    return (pv.id, rv.prompt_id, func.substr(pv.prompt_text, 1, text_chars).label("prompt_text"), pv.prompt,
            rv.v_star, rv.num_correct, rv.filtered)


def _distinct_in_index(column: Any, where: list[Any]) -> Any:
    """A query of the distinct values of `column` among the rows matching `where`, in order, by a loose index scan:
    each value is one seek for the smallest one above the last, on an index that leads with `where`'s columns and
    then `column` (a plain DISTINCT would read every matching row)."""
    found = select(func.min(column).label("value")).where(*where).cte("found", recursive=True)
    following = select(func.min(column)).where(*where, column > found.c.value).scalar_subquery()
    found = found.union_all(select(following).where(found.c.value.is_not(None)))
    return select(found.c.value).where(found.c.value.is_not(None)).order_by(found.c.value)


MAX_SEARCH_CHARS = 500  # a search box's text: SQLite refuses LIKE patterns past 50,000 bytes, and nobody types more


def _like_pattern(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, with LIKE's wildcards in `text` taken literally; ValueError naming
    the limit for a text longer than `MAX_SEARCH_CHARS`."""
    if len(text) > MAX_SEARCH_CHARS:
        raise ValueError(f"The search text has {len(text):,} characters; search for at most {MAX_SEARCH_CHARS}.")
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _histogram_bins(lo: float | None, hi: float | None, bins: int) -> tuple[float, float, int]:
    """(start, width, count) of about `bins` bins with a round width (1, 2, 2.5 or 5 times a power of ten) that
    cover [lo, hi]; bin i holds start + i * width <= v < start + (i + 1) * width."""
    if lo is None or hi is None:
        return 0.0, 1.0, 0
    span = hi - lo
    raw = (span if span > 0 else max(abs(lo), 1.0)) / max(1, bins)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    width = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if raw <= m * magnitude * (1 + 1e-9))
    start = math.floor(lo / width) * width
    return start, width, int((hi - start) / width) + 1
