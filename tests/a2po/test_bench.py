"""`python -m benchmarks.training`: a fast smoke run (tiny model, ours only, one repeat) and the table helpers."""

import json

import pytest

from benchmarks import training as bench


@pytest.mark.slow
def test_smoke_run_reports_positive_numbers_per_stage(tmp_path, capsys):
    out = tmp_path / "results.json"
    report = bench.main(["--size", "tiny", "--impl", "ours", "--repeats", "1", "--wait", "0", "--retries", "0",
                         "--threads", "1", "--out", str(out), "--workdir", str(tmp_path / "work")])
    printed = capsys.readouterr().out
    assert json.loads(out.read_text())["summary"].keys() == report["summary"].keys() == {"ours"}

    ours = report["summary"]["ours"]
    for key in ("wall_s", "stage1_s", "stage2_s", "peak_rss_gib", "peak_memory_gib"):
        assert ours[key] > 0, key
    assert ours["stage1_s"] + ours["stage2_s"] == pytest.approx(ours["wall_s"])
    assert ours["stage1_s"] >= ours["phases"]["values"]["seconds"]  # decoding is part of stage 1
    for phase in ("values", "train"):  # stage-1 and stage-2 rollouts
        stats = ours["phases"][phase]
        assert stats["ms_per_step"] > 0 and stats["tokens_per_s"] > 0 and stats["decode_steps"] > 0, phase
    # Stage 1: 16 prompts x 8 samples; stage 2: one sample per prompt left after filtering.
    assert ours["phases"]["values"]["sequences"] == 16 * 8
    assert 0 < ours["phases"]["train"]["sequences"] <= 16
    run = report["runs"]["ours"][0]
    assert run["threads"] == 1 and run["num_prompts"] == 16 and run["steps"] >= 1
    assert 0 < run["rss_after_import_gib"] <= run["peak_rss_gib"]

    assert "ours" in printed and "stage 1 s" in printed and "S1 decode ms/step" in printed
    row = next(line for line in printed.splitlines() if line.startswith("ours"))
    assert float(row.split()[1]) > 0  # epoch seconds in the table
    assert not list((tmp_path / "work").glob("run*/optimal_values-*"))  # run directories are cleaned up


def test_missing_trl_is_skipped_with_a_note(monkeypatch):
    real = bench.importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    with pytest.raises(SystemExit, match="trl is not installed"):
        bench.main(["--size", "tiny", "--impl", "trl-a2po", "trl-grpo", "--wait", "0"])


def test_ratios_and_tables():
    def summary(wall, stage1, memory):
        return {"wall_s": wall, "stage1_s": stage1, "stage2_s": None if stage1 is None else wall - stage1,
                "peak_memory_gib": memory, "peak_gpu_gib": None,
                "phases": {"train": {"ms_per_step": 10.0, "tokens_per_s": 100.0}}}

    summaries = {"ours": summary(2.0, 1.0, 0.5), "trl-a2po": summary(8.0, 4.0, 0.5),
                 "trl-grpo": summary(4.0, None, 1.0)}
    rel = bench.ratios(summaries)
    assert rel["trl-a2po"]["wall_s"] == 0.25 and rel["trl-a2po"]["stage1_s"] == 0.25
    assert rel["trl-grpo"]["wall_s"] == 0.5 and rel["trl-grpo"]["stage1_s"] is None
    assert rel["trl-grpo"]["peak_memory_gib"] == 0.5
    text = bench.comparison_table(summaries)
    assert "0.25" in text and text.splitlines()[0].startswith("implementation")
    markdown = bench.comparison_table(summaries, markdown=True)
    assert markdown.splitlines()[1].startswith("| ---") and markdown.count("\n") == 4
    assert bench.summarize_runs([{"wall_s": 1.0, "phases": {}}, {"wall_s": 3.0, "phases": {}},
                                 {"wall_s": 2.0, "phases": {}}])["wall_s"] == 2.0


def test_prompts_match_the_anchor_harness():
    # The peers' harness: rng = Random(0); N prompts of PROMPT_WORDS words "t<id>" with ids in [3, VOCAB).
    small = bench.make_prompts("small")
    assert len(small) == 32 and all(len(p.split()) == 48 for p in small)
    assert bench.make_prompts("small", 64)[:32] == small
    assert bench.binary_reward(["a", "b"]) == bench.binary_reward(["a", "b"])


def test_scaling_varies_one_factor_at_a_time():
    jobs = []

    def job(impl, **settings):
        jobs.append((impl, settings))
        return settings

    def measure(settings, label):  # fake: wall time proportional to the decoded tokens
        wall = settings["num_value_samples"] * settings["max_completion_length"] * settings["num_prompts"] / 1e4
        return {"wall_s": wall, "phases": {}, "load_average": 0.0, "foreign_cpu": 0.0}

    points = bench.run_scaling("small", job, measure, repeats=2)
    assert len(jobs) == 2 * sum(len(values) for values in bench.SCALING.values())
    assert {impl for impl, _ in jobs} == {"ours"}
    by_key = {(p["factor"], p["value"]): p for p in points}
    assert by_key[("num_value_samples", 16)]["relative"] == 8.0  # vs N=2, other factors at the base
    assert by_key[("max_completion_length", 64)]["relative"] == 4.0
    assert by_key[("num_prompts", 16)]["settings"] == {"num_value_samples": 8, "max_completion_length": 48,
                                                       "num_prompts": 16}
    assert "epoch / smallest" in bench.scaling_table(points)
