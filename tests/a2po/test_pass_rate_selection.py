"""Selection by reference pass rate (`pass_rate_band`): the band keeps exactly its prompts, for A*-PO and for GRPO
(whose stage 1 runs only for it, on the run's clock, on A*-PO's V* set), and the V* tab shows what it kept."""

import pytest
from datasets import Dataset

from a2po import A2POConfig, A2POTrainer, GRPOConfig, GRPOTrainer
from a2po.callbacks import A2POCallback
from a2po.config import ConfigError, in_pass_rate_band
from a2po.values import prompt_id_for

NUM_SAMPLES = 4
BAND = [0.25, 0.75]


def prompts(n=12):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i} + {i} ="}], "ground_truth": str(2 * i)}
                              for i in range(n)])


def coin(completions, **kwargs):
    """A binary reward of the sampled text: prompts get pass rates spread over 0..1."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(sum(map(ord, t)) % 2 == 0) for t in texts]


COMMON = dict(per_device_train_batch_size=4, max_steps=1, num_value_samples=NUM_SAMPLES, max_completion_length=6,
              use_cpu=True, logging_steps=1, report_to="none", save_strategy="no", learning_rate=1e-2, seed=0,
              disable_tqdm=True, temperature=1.0, top_p=1.0)


def a2po_config(tmp_path, **overrides):
    return A2POConfig(output_dir=str(tmp_path / "a2po"), **{**COMMON, "filter_all_incorrect": False, **overrides})


def grpo_config(tmp_path, **overrides):
    # A*-PO's sampling settings (GRPO's own defaults differ: top_k 0 for None, no prompt cut), so both share a V* set.
    return GRPOConfig(output_dir=str(tmp_path / "grpo"), **{**COMMON, "num_generations": 2, "top_k": 0,
                                                             "max_prompt_length": 512, **overrides})


def expected_ids(table, band):
    return {row["prompt_id"] for row in table.to_list()
            if band[0] <= row["num_correct"] / len(row["rewards"]) <= band[1]}


class Stage1Events(A2POCallback):
    def __init__(self):
        self.pending = []

    def on_values_begin(self, args, state, control, *, split, num_pending, **kwargs):
        self.pending.append((split, num_pending))


def test_band_is_checked_before_anything_runs(tmp_path):
    for bad in ([0.8, 0.2], [0.5], [-0.1, 0.5], "0.2,0.8"):
        with pytest.raises(ConfigError, match="pass_rate_band must be None or \\[low, high\\]"):
            a2po_config(tmp_path, pass_rate_band=bad)
        with pytest.raises(ConfigError, match="pass_rate_band"):
            grpo_config(tmp_path, pass_rate_band=bad)
    assert a2po_config(tmp_path, pass_rate_band=(0.5, 0.5)).pass_rate_band == (0.5, 0.5)
    assert in_pass_rate_band(3, 10, [0.3, 0.3])  # 3 / 10 is not exactly 0.3 in floating point
    assert not in_pass_rate_band(0, 8, [0.125, 1.0]) and in_pass_rate_band(1, 8, [0.125, 1.0])


def test_a2po_band_keeps_exactly_the_prompts_in_it(tmp_path, tiny_model_dir):
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=a2po_config(tmp_path, pass_rate_band=BAND),
                          train_dataset=prompts())
    trainer.train()
    table = trainer.value_tables["train"]
    kept = set(trainer.train_dataset["prompt_id"])
    assert kept == expected_ids(table, BAND)
    # The tiny model's pass rates straddle the band, so the test says something: some kept, some dropped.
    assert 0 < len(kept) < len(table)
    # filter_all_incorrect stays TRL's: off here, nothing is marked filtered, the band alone selected.
    assert not any(table["filtered"])


def test_grpo_band_selects_on_stage_one_and_counts_it_on_its_clock(tmp_path, tiny_model_dir):
    events = Stage1Events()
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=coin, args=grpo_config(tmp_path, pass_rate_band=BAND),
                          train_dataset=prompts(), callbacks=[events])
    trainer.train()
    table = trainer.value_tables["train"]
    assert set(trainer.train_dataset["prompt_id"]) == expected_ids(table, BAND)
    assert 0 < len(trainer.train_dataset) < len(table)
    assert "v_star" not in trainer.train_dataset.column_names  # reward functions see the dataset's own columns
    assert events.pending == [("train", len(table))]  # stage 1 ran once, on the train split only
    counters = trainer.run_counters
    assert counters.values_seconds["train"] > 0 and counters.values_tokens["train"] > 0
    assert counters.clock == pytest.approx(counters.values_seconds["train"] + counters.train_seconds)


def test_grpo_without_band_has_no_stage_one(tmp_path, tiny_model_dir):
    events = Stage1Events()
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=coin, args=grpo_config(tmp_path), train_dataset=prompts(),
                          callbacks=[events])
    trainer.train()
    assert events.pending == [] and trainer.run_counters.values_seconds == {}
    assert len(trainer.train_dataset) == 12


def test_grpo_reuses_the_a2po_v_star_set(tmp_path, tiny_model_dir):
    """The same sampling settings give one fingerprint: a GRPO run that selects samples nothing A*-PO sampled."""
    a2po = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=a2po_config(tmp_path), train_dataset=prompts())
    table = a2po.estimate_optimal_values()
    events = Stage1Events()
    grpo = GRPOTrainer(model=tiny_model_dir, reward_funcs=coin, args=grpo_config(tmp_path, pass_rate_band=BAND),
                       train_dataset=prompts(), callbacks=[events])
    assert grpo.value_fingerprint() == a2po.value_fingerprint()
    grpo.set_optimal_values(table, "train")
    selected = grpo.stage_one.select(grpo.train_dataset)
    assert events.pending == [("train", 0)]
    assert {prompt_id_for(row) for row in selected.to_list()} == expected_ids(table, BAND)


# ---------------------------------------------------------------------------------------------------------------
# The studio: a GRPO run that selects shares the A*-PO run's V* set, and its V* tab shows the band and what it kept


def studio_spec(model, name, method, **config):
    settings = {"num_value_samples": 2, "max_completion_length": 8, "max_prompt_length": 512, "max_steps": 1,
                "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "use_cpu": True,
                "report_to": "none", "save_strategy": "no", "logging_steps": 1, "gradient_checkpointing": False,
                "seed": 0, **config}
    spec = {"name": name, "action": "train", "model": model,
            "dataset": {"source": "arithmetic", "num_prompts": 8, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 4},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": settings, "peft": None}
    return {**spec, "method": method} if method != "a2po" else spec


@pytest.mark.slow
def test_a_studio_grpo_run_selects_on_the_shared_v_star_set(tmp_path, tiny_model_dir):
    import json

    from app.runtime.scheduler import Scheduler
    from app.web.pages.run.builders import values_view
    from storage import Store
    from tests import helpers

    store = Store(tmp_path / "studio.db")
    scheduler = Scheduler(store, tmp_path / "data", poll_interval=0.2)
    try:
        first = scheduler.submit(studio_spec(tiny_model_dir, "a2po", "a2po", filter_all_incorrect=False))
        # A random model solves nothing: every pass rate is 0, so the band [0, 0.5] keeps all 8 prompts.
        second = scheduler.submit(studio_spec(tiny_model_dir, "grpo", "grpo", num_generations=2,
                                              pass_rate_band=[0.0, 0.5]))
        scheduler.start()
        a2po = helpers.wait_status(store, first, ("finished", "failed"), 300)
        grpo = helpers.wait_status(store, second, ("finished", "failed"), 300)
    finally:
        scheduler.close()
    assert a2po["status"] == "finished", a2po["error"]
    assert grpo["status"] == "finished", grpo["error"]
    assert grpo["value_set_id"] == a2po["value_set_id"]  # one V* set, sampled once
    assert grpo["value_counts"] == {"train": 8}  # GRPO needs the train split's pass rates only
    names = set(store.metric_names(second))
    assert "values/train/runtime" in names  # the shared set's cost, charged to the run's clock
    view = values_view(store, grpo, store.get_value_set(grpo["value_set_id"]), "train")
    assert "pass-rate band [0, 0.5]: **8 of 8 prompts kept** for training" in view["summary"]
    figure = json.loads(view["correct_bar"].plot)
    assert figure["layout"]["shapes"][0]["type"] == "rect" and "band [0, 0.5]" in figure["layout"]["title"]["text"]


def test_the_v_star_tab_counts_what_a_band_keeps():
    from app.web.pages import values

    # 10 prompts with k of 4 correct: k = 0 (3, of which 2 dropped by filter_all_incorrect), 1 (2), 2 (4), 4 (1).
    stats = {"count": 10, "filtered": 2, "num_samples": 4, "mean_v_star": 0.3, "correct": [3, 2, 4, 0, 1],
             "histogram": {"start": 0.0, "width": 0.1, "kept": [8], "filtered": [2]}}
    assert values.band_selection(stats, [0.25, 0.5]) == {"in_band": 6, "kept": 6, "sampled": 10}
    assert values.band_selection(stats, [0.0, 0.25]) == {"in_band": 5, "kept": 3, "sampled": 10}
    view = values.render(stats, ["train"], "train", None, None, band=[0.25, 0.5])
    assert "pass-rate band [0.25, 0.5]: **6 of 10 prompts kept**" in view["summary"]
    bars = view["correct_bar"]["data"][0]
    assert bars["x"] == [0.0, 0.25, 0.5, 0.75, 1.0] and bars["y"] == [3, 2, 4, 0, 1]
    assert [c != "#bbbbbb" for c in bars["marker"]["color"]] == [False, True, True, False, False]
    assert "band" not in values.render(stats, ["train"], "train", None, None)["summary"]
    assert values.band_of({"config": {"config": {"pass_rate_band": [0.1, 0.9]}}}) == [0.1, 0.9]
    assert values.band_of({"config": {"config": {}}}) is None
