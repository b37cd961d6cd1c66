"""A2POTrainer end to end on a tiny real model: both stages, filtering, evaluation, rewards, saving, LoRA."""

import math
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from a2po import (
    A2POCallback,
    A2POConfig,
    A2POTrainer,
    StageInterrupted,
    load_optimal_values,
    optimal_value,
    save_optimal_values,
)
from a2po.testing import make_tiny_model
from a2po.values import prompt_id_for


def prompts(n=8, chat=True):
    rows = []
    for i in range(n):
        question = f"{i} + {i} ="
        rows.append({"prompt": [{"role": "user", "content": question}] if chat else question,
                     "ground_truth": str(2 * i), "parity": "even" if i % 2 == 0 else "odd"})
    return Dataset.from_list(rows)


def even_prompts_solved(completions, parity, **kwargs):
    """1 for every completion of an 'even' prompt, 0 otherwise: half the prompts are never solved."""
    return [1.0 if p == "even" else 0.0 for p in parity]


def coin(completions, **kwargs):
    """Binary reward that depends on the sampled text (so some samples of every prompt score 1)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(sum(map(ord, t)) % 2 == 0) for t in texts]


def config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2, num_value_samples=4,
                  max_completion_length=6, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                  learning_rate=1e-2, seed=0, disable_tqdm=True)
    values.update(overrides)
    return A2POConfig(**values)


class Recorder(A2POCallback):
    def __init__(self):
        self.events = []

    def on_values_begin(self, args, state, control, **kw):
        self.events.append(("begin", kw))

    def on_values_batch(self, args, state, control, **kw):
        self.events.append(("batch", kw))

    def on_values_end(self, args, state, control, **kw):
        self.events.append(("end", kw))

    def on_samples(self, args, state, control, **kw):
        self.events.append(("samples", kw))

    def of(self, kind):
        return [kw for k, kw in self.events if k == kind]


def test_config_defaults_match_the_documented_api():
    c = A2POConfig(output_dir="x", use_cpu=True)
    assert (c.max_prompt_length, c.max_completion_length, c.temperature, c.top_p, c.top_k) == (512, 256, 1.0, 1.0, None)
    assert (c.num_value_samples, c.beta1, c.filter_all_incorrect) == (8, 0.5, True)
    assert (c.beta2, c.reward_weights) == (1e-3, None)
    assert (c.gradient_checkpointing, c.logging_steps, c.remove_unused_columns, c.bf16) == (True, 10, False, False)
    assert (c.model_init_kwargs, c.trust_remote_code, c.learning_rate) == (None, False, 5e-5)


@pytest.mark.parametrize("field, value", [("beta1", 0.0), ("beta2", -1.0), ("num_value_samples", 0), ("top_p", 1.5)])
def test_config_rejects_impossible_values(field, value):
    with pytest.raises(ValueError, match=field):
        A2POConfig(output_dir="x", use_cpu=True, **{field: value})


def test_training_changes_every_parameter_and_fills_v_star(tmp_path, tiny_model_dir):
    recorder = Recorder()
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path), train_dataset=prompts(8),
                          callbacks=[recorder])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert sorted(changed) == sorted(before)
    table = trainer.value_tables["train"]
    assert len(table) == 8 and all(len(r) == 4 for r in table["rewards"])
    assert set(table["prompt_id"]) == {prompt_id_for(r) for r in prompts(8).to_list()}
    logged = trainer.state.log_history[0]
    for key in ("loss", "reward", "v_star", "advantage", "implicit_reward", "log_ratio", "completion_length",
                "completion_clipped_frac", "rewards/coin", "learning_rate"):
        assert key in logged, key
    samples = recorder.of("samples")[0]["samples"]
    assert len(samples) == 4 and samples[0]["step"] == 1
    assert {"prompt_text", "completion", "reward", "v_star", "advantage", "implicit_reward"} <= set(samples[0])
    batches = recorder.of("batch")
    assert sum(len(b["records"]) for b in batches) == 8 and batches[-1]["done"] == 8


def test_all_incorrect_prompts_are_filtered_and_counted(tmp_path, tiny_model_dir):
    recorder = Recorder()
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=even_prompts_solved, args=config(tmp_path),
                          train_dataset=prompts(8), callbacks=[recorder])
    table = trainer.estimate_optimal_values()
    by_parity = {row["parity"]: [] for row in prompts(8).to_list()}
    for row, record in zip(prompts(8).to_list(), table.to_list()):
        by_parity[row["parity"]].append(record)
    assert all(r["filtered"] and r["v_star"] == 0 and r["num_correct"] == 0 for r in by_parity["odd"])
    assert all(not r["filtered"] and r["v_star"] == pytest.approx(1.0) for r in by_parity["even"])
    summary = recorder.of("end")[0]["summary"]
    assert summary["num_filtered"] == 4 and summary["pass_at_1"] == 0.5 and summary["pass_at_n"] == 0.5
    trainer.train()
    seen = {s["prompt_id"] for kw in recorder.of("samples") for s in kw["samples"]}
    assert seen <= {r["prompt_id"] for r in by_parity["even"]}


def test_an_eval_steps_fraction_counts_the_steps_over_the_kept_prompts(tmp_path, tiny_model_dir):
    """"A*-PO vs GRPO" sets `eval_steps` to a fraction of the run: for A*-PO it is a fraction of the steps over the
    prompts stage 1 kept (8 of 16, 2 a step, 2 epochs: 8 steps, an evaluation every 2), not over all 16."""
    args = config(tmp_path, max_steps=-1, num_train_epochs=2.0, per_device_train_batch_size=2, eval_strategy="steps",
                  eval_steps=0.25, per_device_eval_batch_size=4)
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=even_prompts_solved, args=args,
                          train_dataset=prompts(16), eval_dataset=prompts(4))
    trainer.train()
    assert trainer.state.max_steps == 8
    assert [h["step"] for h in trainer.state.log_history if "eval_accuracy" in h] == [2, 4, 6, 8]


def test_every_prompt_filtered_is_a_clear_error(tmp_path, tiny_model_dir):
    never = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=never, args=config(tmp_path), train_dataset=prompts(4))
    with pytest.raises(ValueError, match="Every training prompt was filtered"):
        trainer.train()


def test_evaluate_without_train_estimates_v_star_for_eval_prompts(tmp_path, tiny_model_dir):
    eval_sets = {"a": prompts(3), "b": prompts(5, chat=False)}
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path), eval_dataset=eval_sets)
    metrics = trainer.evaluate()
    for name, n in (("a", 3), ("b", 5)):
        assert len(trainer.value_tables[f"eval_{name}"]) == n
        for key in ("accuracy", "reward", "loss", "v_star", "ref_pass_at_1", "ref_pass_at_n"):
            assert f"eval_{name}_{key}" in metrics
        assert 0.0 <= metrics[f"eval_{name}_accuracy"] <= 1.0


def test_greedy_accuracy_counts_correct_greedy_answers(tmp_path, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = A2POTrainer(model=model, reward_funcs=even_prompts_solved, args=config(tmp_path),
                          eval_dataset=prompts(6))
    # The reward ignores the text: greedy accuracy is exactly the share of 'even' prompts.
    assert trainer.evaluate()["eval_accuracy"] == pytest.approx(0.5)


def test_reward_functions_receive_prompts_and_every_column(tmp_path, tiny_model_dir):
    seen = {}

    def spy(prompts, completions, ground_truth, parity, prompt_id, **kwargs):
        seen.update(prompts=prompts, completions=completions, ground_truth=ground_truth, parity=parity)
        return [1.0] * len(completions)

    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=spy, args=config(tmp_path), train_dataset=prompts(4))
    trainer.train()
    assert set(seen["ground_truth"]) <= {"0", "2", "4", "6"} and set(seen["parity"]) <= {"even", "odd"}
    assert isinstance(seen["prompts"][0], list) and seen["completions"][0][0]["role"] == "assistant"


@pytest.mark.parametrize("bad, message", [
    (lambda completions, **kw: None, "returned None"),
    (lambda completions, **kw: [1.0], "returned 1 values"),
    (lambda completions, **kw: [None] * len(completions), r"returned None \(or NaN\) for 8 of 8"),  # every row
    (lambda completions, **kw: 1 / 0, "raised ZeroDivisionError"),
])
def test_broken_reward_function_is_named_in_the_error(tmp_path, tiny_model_dir, bad, message):
    bad.__name__ = "my_reward"
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=bad, args=config(tmp_path), train_dataset=prompts(2))
    with pytest.raises((ValueError, RuntimeError), match=f"my_reward.*{message}"):
        trainer.estimate_optimal_values()


def test_non_binary_rewards_warn_once(tmp_path, tiny_model_dir):
    half = lambda completions, **kw: [0.5] * len(completions)  # noqa: E731
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=[half, half], train_dataset=prompts(2),
                          args=config(tmp_path, reward_weights=[1, 0.5]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.estimate_optimal_values()
    assert sum("binary" in str(w.message) for w in caught) == 1
    with pytest.raises(ValueError, match="reward_weights has 1 values"):
        A2POTrainer(model=tiny_model_dir, reward_funcs=[half, half], args=config(tmp_path, reward_weights=[1.0]))


def test_long_prompts_are_cut_from_the_left(tmp_path, tiny_model_dir):
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path, max_prompt_length=10))
    long_prompt = [{"role": "user", "content": "x" * 50 + "END"}]
    ids, mask, texts = trainer._encode_prompts([long_prompt, "short"])
    kept = trainer.processing_class.decode(ids[0])
    assert ids.shape[1] == 10 and kept.endswith("END<|end|><|assistant|>")
    assert mask[1].tolist() == [0] * 5 + [1] * 5  # the shorter prompt is left-padded


def test_completions_stop_at_the_first_eos(tmp_path, tiny_model_dir):
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path))
    tok = trainer.processing_class
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    end = tok.convert_tokens_to_ids("<|end|>")
    texts, mask = trainer._decode(torch.tensor([[a, b, end, a, a], [a, a, a, a, a]]))
    assert texts == ["ab", "aaaaa"] and mask.tolist() == [[1, 1, 1, 0, 0], [1] * 5]


def test_duplicate_prompt_texts_with_different_answers_do_not_collide(tmp_path, tiny_model_dir):
    data = Dataset.from_list([{"prompt": "same?", "ground_truth": "1"}, {"prompt": "same?", "ground_truth": "2"}])
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path), train_dataset=data)
    table = trainer.estimate_optimal_values()
    assert len(set(table["prompt_id"])) == 2


def test_saved_values_and_v_star_column_skip_stage_one(tmp_path, tiny_model_dir):
    first = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path, save_values=False),
                        train_dataset=prompts(6))
    table = first.estimate_optimal_values()
    path = save_optimal_values(table, tmp_path / "values.parquet")
    assert load_optimal_values(path).to_list() == table.to_list()

    recorder = Recorder()
    second = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, callbacks=[recorder], train_dataset=prompts(6),
                         args=config(tmp_path / "2", values_path=str(path), beta1=0.25))
    reused = second.estimate_optimal_values()
    assert recorder.of("begin")[0]["num_pending"] == 0
    assert reused["rewards"] == table["rewards"] and reused["v_star"] != table["v_star"]  # rescored with beta1

    with_column = prompts(6).add_column("v_star", [0.5, None, 0.0, 1.0, 0.25, 0.75])
    third_recorder = Recorder()
    third = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path / "3"),
                        train_dataset=with_column, callbacks=[third_recorder])
    values = third.estimate_optimal_values()
    assert third_recorder.of("begin")[0]["num_pending"] == 1
    assert values["v_star"][0] == 0.5 and values["filtered"][2] is True


def test_stop_during_stage_one_then_resume_samples_only_the_rest(tmp_path, tiny_model_dir):
    class StopAfterFirstBatch(A2POCallback):
        def on_values_batch(self, args, state, control, **kw):
            control.should_training_stop = True
            return control

    args = config(tmp_path, value_batch_size=2)
    stopping = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=args, train_dataset=prompts(6),
                           callbacks=[StopAfterFirstBatch()])
    with pytest.raises(StageInterrupted, match="2 of 6"):
        stopping.estimate_optimal_values()
    recorder = Recorder()
    resumed = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=args, train_dataset=prompts(6),
                          callbacks=[recorder])
    table = resumed.estimate_optimal_values()
    assert recorder.of("begin")[0]["num_pending"] == 4 and len(table) == 6


def test_save_and_reload(tmp_path, tiny_model_dir):
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path), train_dataset=prompts(4))
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    for (name, p), q in zip(trainer.model.named_parameters(), reloaded.parameters()):
        assert torch.equal(p.detach(), q), name


def test_lora_trains_adapters_and_holds_no_second_copy(tmp_path, tiny_model_dir):
    from peft import LoraConfig

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base_params = {n: p.detach().clone() for n, p in base.named_parameters()}
    trainer = A2POTrainer(model=base, reward_funcs=coin, args=config(tmp_path), train_dataset=prompts(4),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    assert trainer.ref_model is None
    all_params = [p for m in trainer.callback_handler.model.modules() for p in m.parameters(recurse=False)]
    base_numel = sum(p.numel() for p in base_params.values())
    assert sum(p.numel() for p in all_params) < 1.5 * base_numel  # one copy of the weights plus small adapters
    trainer.train()
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    # The reference policy is the base with adapters disabled: identical to the untouched base weights.
    ids, mask, _ = trainer._encode_prompts(["1 + 1 ="])
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad(), trainer._reference_policy() as reference:
        assert torch.allclose(reference(input_ids=ids, attention_mask=mask).logits,
                              fresh(input_ids=ids, attention_mask=mask).logits, atol=1e-5)


def test_gradient_accumulation_gives_the_same_update_as_one_batch(tmp_path, tiny_model_dir):
    def trained(batch, accumulation, where):
        # top_k=1 makes sampling deterministic, so both runs see the same completions.
        args = config(tmp_path / where, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                      max_steps=1, top_k=1, optim="sgd", learning_rate=0.5, max_grad_norm=1e9,
                      gradient_checkpointing=False, lr_scheduler_type="constant", filter_all_incorrect=False)
        # Given V* values make the advantage non-zero although every sample of a prompt is the same.
        data = prompts(8).add_column("v_star", [0.3, 0.6] * 4)
        trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=args, train_dataset=data)
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    one_batch, accumulated = trained(4, 1, "a"), trained(2, 2, "b")
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert any(not torch.allclose(one_batch[n], initial[n].detach()) for n in one_batch)
    for name in one_batch:
        assert torch.allclose(one_batch[name], accumulated[name], atol=1e-5), name


def test_qwen2_architecture_trains(tmp_path):
    model, tokenizer = make_tiny_model(arch="qwen2")
    trainer = A2POTrainer(model=model, processing_class=tokenizer, reward_funcs=coin, train_dataset=prompts(4),
                          args=config(tmp_path, max_steps=1))
    assert trainer.train().global_step == 1


def test_set_optimal_values_reuses_rows_with_their_rewards(tmp_path, tiny_model_dir):
    first = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path / "1"), train_dataset=prompts(4))
    rows = [{k: v for k, v in r.items() if k != "prompt"} for r in first.estimate_optimal_values().to_list()[:3]]
    recorder = Recorder()
    second = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path / "2", beta1=1.0),
                         train_dataset=prompts(4), callbacks=[recorder])
    second.set_optimal_values(rows)
    table = second.estimate_optimal_values()
    assert recorder.of("begin")[0]["num_pending"] == 1
    assert table["rewards"][:3] == [r["rewards"] for r in rows]
    assert table["v_star"][0] == pytest.approx(float(optimal_value(torch.tensor([rows[0]["rewards"]]), 1.0)[0]))
    assert recorder.of("end")[0]["summary"]["num_prompts"] == 4 and "pass_at_n" in recorder.of("end")[0]["summary"]


def test_long_lived_objects_skip_the_gc_during_training_only(tmp_path, tiny_model_dir):
    import gc

    class FreezeProbe(A2POCallback):
        seen = []

        def on_values_batch(self, args, state, control, **kw):
            self.seen.append(gc.get_freeze_count())

        def on_step_end(self, args, state, control, **kw):
            self.seen.append(gc.get_freeze_count())

    probe = FreezeProbe()
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path), train_dataset=prompts(4),
                          callbacks=[probe])
    assert gc.get_freeze_count() == 0
    trainer.train()
    assert len(probe.seen) >= 3 and all(count > 0 for count in probe.seen)
    assert gc.get_freeze_count() == 0
    trainer.estimate_optimal_values(prompts(6), split="other")
    assert gc.get_freeze_count() == 0


def test_train_dataset_holds_the_kept_prompts_after_stage_one(tmp_path, tiny_model_dir):
    """As in TRL: after stage 1 `trainer.train_dataset` is the kept prompts, and stays so; training again (or
    resuming from a checkpoint) samples no V* again and trains on the same rows."""
    recorder = Recorder()
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=even_prompts_solved, train_dataset=prompts(8),
                          args=config(tmp_path, save_strategy="steps", save_steps=2), callbacks=[recorder])
    trainer.train()
    kept = [r["prompt_id"] for r in trainer.value_tables["train"].to_list() if not r["filtered"]]
    assert len(kept) == 4 and len(trainer.train_dataset) == len(kept)
    assert sorted(trainer.train_dataset["prompt_id"]) == sorted(kept)
    assert set(trainer.train_dataset["parity"]) == {"even"}  # the other columns stay for the reward functions

    trainer.args.max_steps = 3
    assert trainer.train(resume_from_checkpoint=True).global_step == 3
    trainer.args.max_steps = 4
    assert trainer.train().global_step == 4
    assert len(recorder.of("begin")) == 1  # stage 1 ran once
    assert sorted(trainer.train_dataset["prompt_id"]) == sorted(kept)
    seen = {s["prompt_id"] for kw in recorder.of("samples") for s in kw["samples"]}
    assert seen <= set(kept)


def test_stage_one_samples_depend_on_the_seed_and_prompt_only(tmp_path, tiny_model_dir):
    """A prompt's N reference samples are a function of (seed, prompt id, sample index): any batching, any subset
    of pending prompts (a resumed or chunked stage 1) and anything sampled before give the same table."""
    data = prompts(8)

    def table(batch_size, subset=None, seed=0, warm_up=False):
        trainer = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path, value_batch_size=batch_size, seed=seed,
                                                                save_values=False), train_dataset=data)
        if warm_up:  # the global random stream moved: it must not matter
            torch.rand(1000)
        if subset is not None:  # as after an interruption: some rows known, the rest sampled now
            known = trainer.estimate_optimal_values(data.select(subset)).to_list()
            trainer.set_optimal_values(known)
        return {r["prompt_id"]: (r["completions"], r["rewards"]) for r in trainer.estimate_optimal_values().to_list()}

    whole = table(batch_size=8)
    assert table(batch_size=1) == whole and table(batch_size=3, warm_up=True) == whole
    assert table(batch_size=2, subset=[1, 4, 6]) == whole
    assert table(batch_size=8, seed=1) != whole


def test_stage_two_starts_from_the_run_seed_whether_stage_one_sampled_or_not(tmp_path, tiny_model_dir):
    def losses(known_values):
        trainer = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path, max_steps=3, save_values=False),
                              train_dataset=prompts(8))
        if known_values is not None:
            trainer.set_optimal_values(known_values)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer.value_tables["train"]

    sampled, table = losses(None)
    reused, _ = losses(table.to_list())
    assert sampled == reused


def test_evaluation_decodes_greedy_and_sampled_answers_together_as_separate_decodes_would(tmp_path,
                                                                                           tiny_model_dir):
    """One decode gives each prompt's greedy answer (accuracy) and its sampled completion (loss): the greedy tokens
    are `sample_completions(do_sample=False)`'s, and the loss at step 0 (where log pi/pi_ref = 0 needs no forward)
    equals the loss computed with both forward passes."""
    from a2po.rollout import sample_completions

    recorder = Recorder()
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path, max_completion_length=8,
                                                                                per_device_eval_batch_size=3),
                          eval_dataset=prompts(5), callbacks=[recorder])
    metrics = trainer.evaluate()
    greedy_texts = [s["completion"] for s in recorder.of("samples")[-1]["samples"]]
    rows = trainer.eval_dataset.to_list()
    ids, mask, _ = trainer._encode_prompts([row["prompt"] for row in rows])
    separate = sample_completions(trainer.model, ids, mask, max_new_tokens=8, eos_token_ids=trainer.eos_token_ids,
                                  pad_token_id=trainer.pad_token_id, do_sample=False)
    assert greedy_texts == trainer._decode(separate)[0]

    trainer._policy_is_reference = lambda: False  # the general path: both forwards, log ratios of ~0
    with_forwards = trainer.evaluate()
    assert with_forwards["eval_accuracy"] == metrics["eval_accuracy"]
    assert with_forwards["eval_loss"] == pytest.approx(metrics["eval_loss"], abs=1e-6)
    assert metrics["eval_loss"] > 0  # rewards are a coin: r - V* is not 0 for every prompt


def test_evaluation_after_a_step_regresses_the_trained_policy(tmp_path, tiny_model_dir):
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=coin, args=config(tmp_path, max_steps=1),
                          train_dataset=prompts(8), eval_dataset=prompts(4))
    trainer.train()
    assert not trainer._policy_is_reference()
    calls = []
    regression = trainer._regression
    trainer._regression = lambda *a, **k: calls.append(1) or regression(*a, **k)
    assert "eval_loss" in trainer.evaluate()
    assert calls  # after an update the log ratio is not 0: both forwards run


# ----------------------------------------------------------------------------------------------------------------
# The metrics both trainers log, and fixes of issue 18 (each of these failed before them)

class StopAt(A2POCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_shared_metrics_are_logged_and_the_token_count_survives_a_resume(tmp_path, tiny_model_dir):
    """The names GRPOTrainer logs too (`kl` is A*-PO's mean log-ratio), the stage-1 token count, and
    `completion_tokens`, which a run resumed from a checkpoint continues."""
    class Logs(Recorder):
        def on_log(self, args, state, control, logs=None, **kw):
            self.events.append(("log", logs))

    recorder = Logs()
    settings = dict(max_steps=4, filter_all_incorrect=False, save_strategy="steps", save_steps=2)
    whole = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path / "whole", **settings), train_dataset=prompts(8),
                        callbacks=[recorder])
    whole.train()
    logged = [h for h in whole.state.log_history if "loss" in h]
    for key in ("kl", "log_ratio", "completion_tokens", "peak_memory_gb", "frac_nonfinite_loss", "reward_std",
                "accuracy", "completion_length", "completion_clipped_frac", "rewards/coin"):
        assert key in logged[0], key
    assert logged[0]["kl"] == logged[0]["log_ratio"] and logged[0]["frac_nonfinite_loss"] == 0.0
    assert 0 < logged[0]["completion_tokens"] <= 4 * 6 < logged[-1]["completion_tokens"]
    assert 0.01 < logged[0]["peak_memory_gb"] < 64
    stage1 = next(logs for logs in recorder.of("log") if "values/train/completion_tokens" in logs)
    assert 8 * 4 <= stage1["values/train/completion_tokens"] <= 8 * 4 * 6 and "values/train/runtime" in stage1
    assert {s["sample_index"] for kw in recorder.of("samples") for s in kw["samples"]} == {0}

    first = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path / "part", **settings), train_dataset=prompts(8),
                        callbacks=[StopAt(2)])
    first.train()
    resumed = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path / "part", **settings), train_dataset=prompts(8))
    resumed.train(resume_from_checkpoint=str(tmp_path / "part" / "out" / "checkpoint-2"))
    last = [h for h in resumed.state.log_history if "loss" in h][-1]
    assert last["step"] == 4 and last["completion_tokens"] == logged[-1]["completion_tokens"]
    assert last["loss"] == pytest.approx(logged[-1]["loss"], abs=1e-6)


def test_evaluate_on_another_dataset_gets_its_own_v_star_table(tmp_path, tiny_model_dir):
    """`evaluate(eval_dataset=other)` raised KeyError (V* tables were cached by split name alone). Another dataset
    gets a table of its own; the trainer's own eval set keeps its cached one (no stage 1 again)."""
    recorder = Recorder()
    trainer = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path), eval_dataset=prompts(3), callbacks=[recorder])
    own = trainer.evaluate()
    other = trainer.evaluate(eval_dataset=prompts(5, chat=False))
    [other_table] = [name for name in trainer.value_tables if name != "eval"]
    assert other_table.startswith("eval-") and len(trainer.value_tables[other_table]) == 5
    assert len(trainer.value_tables["eval"]) == 3 and 0.0 <= other["eval_accuracy"] <= 1.0
    again = trainer.evaluate()
    subset = trainer.evaluate(eval_dataset=prompts(3).select([0, 2]))  # covered by the own table
    assert len(recorder.of("begin")) == 2  # stage 1 ran once for each dataset, never again
    assert (again["eval_accuracy"], again["eval_loss"]) == (own["eval_accuracy"], own["eval_loss"])
    assert subset["eval_v_star"] == pytest.approx(
        (trainer.value_tables["eval"]["v_star"][0] + trainer.value_tables["eval"]["v_star"][2]) / 2)


def test_a_nonfinite_loss_is_counted_in_the_logs(tmp_path, tiny_model_dir):
    """transformers' `logging_nan_inf_filter` turns a NaN loss into a finite number in `loss`:
    `frac_nonfinite_loss` says what happened (0.0 for a healthy step, 1.0 when its loss was NaN or inf)."""
    calls = []

    def nan_on_second_step(completions, **kw):
        calls.append(1)
        # inf, not NaN: a NaN reward means "not scored", as in TRL (tests/a2po/test_reward_calls.py)
        return [math.inf if len(calls) == 2 else 1.0] * len(completions)

    data = prompts(8).add_column("v_star", [0.5] * 8)  # no stage 1: the reward's calls are the steps
    trainer = A2POTrainer(tiny_model_dir, nan_on_second_step, args=config(tmp_path, max_steps=3), train_dataset=data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["frac_nonfinite_loss"] for h in logged][:2] == [0.0, 1.0]
    assert math.isfinite(logged[1]["loss"])


def test_max_completion_length_none_falls_back_as_generate_does(tmp_path, tiny_model_dir):
    """`max_completion_length=None` was accepted, then stage 1 raised TypeError. As with `generate()` (and so TRL):
    the model's generation config's `max_new_tokens`, else 20 new tokens."""
    trainer = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path, max_completion_length=None),
                          train_dataset=prompts(4))
    assert len(trainer.estimate_optimal_values()) == 4
    assert trainer.rollout_stats["values"]["decode_steps"] <= 20 and trainer.max_completion_length == 20
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.generation_config.max_new_tokens = 5
    trainer = A2POTrainer(model, coin, args=config(tmp_path, max_completion_length=None), train_dataset=prompts(4))
    trainer.estimate_optimal_values()
    assert trainer.rollout_stats["values"]["decode_steps"] <= 5 and trainer.max_completion_length == 5


def test_evaluation_batches_are_announced_and_a_stop_interrupts_evaluation(tmp_path, tiny_model_dir):
    """`on_evaluate_batch` after each evaluation batch (for chunked runs); a stop asked there ends evaluation with
    StageInterrupted, and a stop already pending when evaluation starts (the end of training) is kept for after."""
    class Watcher(A2POCallback):
        def __init__(self):
            self.seen, self.stop = [], False

        def on_evaluate_batch(self, args, state, control, *, split, done, total, **kw):
            self.seen.append((split, done, total))
            if self.stop:
                control.should_training_stop = True

    watcher = Watcher()
    trainer = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path, per_device_eval_batch_size=2),
                          eval_dataset=prompts(5), callbacks=[watcher])
    trainer.evaluate()
    assert watcher.seen == [("eval", 2, 5), ("eval", 4, 5), ("eval", 5, 5)]
    watcher.stop = True
    with pytest.raises(StageInterrupted, match="2 of 5"):
        trainer.evaluate()
    watcher.stop = False
    trainer.control.should_training_stop = True
    assert "eval_accuracy" in trainer.evaluate() and trainer.control.should_training_stop


def test_remove_unused_columns_keeps_what_training_reads(tmp_path, tiny_model_dir):
    """`remove_unused_columns=True` made the Trainer drop every column (none is a model input): training failed."""
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns)
        return [1.0] * len(completions)

    data = prompts(4).add_column("v_star", [0.5] * 4)  # no stage 1: the reward sees stage 2's columns only
    trainer = A2POTrainer(tiny_model_dir, spy, args=config(tmp_path, remove_unused_columns=True, max_steps=1),
                          train_dataset=data)
    assert trainer.train().global_step == 1
    assert "parity" not in seen and set(trainer.train_dataset.column_names) == {"prompt", "prompt_id", "v_star"}


def test_parquet_values_keep_text_prompts_that_look_like_json(tmp_path):
    from a2po.values import value_record

    messages = [{"role": "user", "content": "2 + 2?"}]
    rows = [value_record("a", "[1, 2] + [3] = ?", "[1, 2] + [3] = ?", [1.0, 0.0], ["x", "y"], 0.5, True),
            value_record("b", messages, "user: 2 + 2?", [0.0, 0.0], ["x", "y"], 0.5, True)]
    for i, row in enumerate(rows):  # a Dataset holds one prompt type per table
        assert load_optimal_values(save_optimal_values([row], tmp_path / f"{i}.parquet")).to_list() == [row]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-weights"])
def test_policy_and_reference_agree_before_the_first_update_in_every_precision(tmp_path, tiny_model_dir, precision,
                                                                                lora):
    """log pi/pi_ref of every step-1 completion is exactly 0: the reference computes in the policy's precision (with
    bf16, bf16 autocast on the CPU here, its linear layers stored in bf16; with bf16 weights, a bf16 copy)."""
    from peft import LoraConfig

    recorder = Recorder()
    precise = {"fp32": {}, "bf16": {"bf16": True},
               "bf16-weights": {"bf16": True, "model_init_kwargs": {"dtype": torch.bfloat16}}}[precision]
    trainer = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path, beta2=1.0, max_steps=1, max_completion_length=16,
                                                            filter_all_incorrect=False, **precise),
                          train_dataset=prompts(4), callbacks=[recorder],
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear") if lora else None)
    trainer.train()
    log_ratios = [s["implicit_reward"] for kw in recorder.of("samples") for s in kw["samples"] if s["split"] == "train"]
    assert len(log_ratios) == 4 and all(r == 0.0 for r in log_ratios)  # implicit reward = beta2 * log_ratio


def test_under_bf16_autocast_the_reference_stores_its_matmuls_in_bf16_and_samples_as_before(tmp_path, monkeypatch):
    """The fp32 reference's linear layers in bf16 (a tied output layer and the embeddings, norms stay fp32): stage 1
    samples exactly what it sampled with the fp32 copy, and the copy holds about half the bytes."""
    import a2po.base_trainer as base_trainer

    make_tiny_model(tmp_path / "untied", tie_word_embeddings=False)
    make_tiny_model(tmp_path / "tied")

    def stage_one(model, cast):
        if not cast:
            monkeypatch.setattr(base_trainer, "cast_reference_matmuls", lambda reference, dtype: 0)
        trainer = A2POTrainer(str(tmp_path / model), coin, train_dataset=prompts(4),
                              args=config(tmp_path / model / str(cast), bf16=True, max_completion_length=8))
        monkeypatch.undo()
        table = trainer.estimate_optimal_values()
        return trainer, [c for row in table.to_list() for c in row["completions"]]

    for model in ("untied", "tied"):
        cast, samples = stage_one(model, cast=True)
        _, fp32_samples = stage_one(model, cast=False)
        assert samples == fp32_samples
        ref = cast.accelerator.unwrap_model(cast.ref_model)
        dtypes = {name: p.dtype for name, p in ref.named_parameters(remove_duplicate=False)}
        assert dtypes["model.layers.0.self_attn.q_proj.weight"] == torch.bfloat16
        assert dtypes["model.embed_tokens.weight"] == dtypes["model.norm.weight"] == torch.float32
        assert dtypes["lm_head.weight"] == (torch.bfloat16 if model == "untied" else torch.float32)
        held = sum(p.numel() * p.element_size() for p in ref.parameters())
        assert cast.reference_bytes_saved == sum(p.numel() * 2 for p in ref.parameters() if p.dtype == torch.bfloat16)
        assert held + cast.reference_bytes_saved == 4 * sum(p.numel() for p in ref.parameters())
        assert all(p.dtype == torch.float32 for p in cast.model.parameters())  # the policy keeps fp32 weights


def test_a_checkpoint_stored_in_bf16_trains_fp32_master_weights(tmp_path):
    """transformers 5 loads a checkpoint in its stored dtype; the trainer loads it in fp32 unless told otherwise, so
    one step at the GPU preset's learning rate (1e-6) with bf16 compute changes the weights of a bf16 checkpoint as
    it does those of an fp32 one (bf16 master weights rounded most of the updates away)."""
    from a2po.presets import PRESETS

    changed = {}
    for stored in (torch.float32, torch.bfloat16):
        path = tmp_path / str(stored)
        model, tokenizer = make_tiny_model()
        model.to(stored).save_pretrained(path)
        tokenizer.save_pretrained(path)
        trainer = A2POTrainer(str(path), coin, train_dataset=prompts(4),
                              args=config(tmp_path, bf16=True, max_steps=1, filter_all_incorrect=False,
                                          learning_rate=PRESETS["step-by-step-gpu"]["config"]["learning_rate"]))
        assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        after = dict(trainer.model.named_parameters())
        changed[stored] = (sum(int((before[n] != after[n]).sum()) for n in before)
                           / sum(p.numel() for p in before.values()))
    assert changed[torch.float32] > 0.9 and changed[torch.bfloat16] > 0.9
    # The user's dtype is kept; a half-precision model object is trained as given, with a warning.
    explicit = A2POTrainer(str(path), coin, args=config(tmp_path, model_init_kwargs={"dtype": "bfloat16"}))
    assert next(explicit.model.parameters()).dtype == torch.bfloat16
    with pytest.warns(UserWarning, match="trainable weights are torch.bfloat16"):
        A2POTrainer(make_tiny_model()[0].to(torch.bfloat16), coin, args=config(tmp_path),
                    processing_class=make_tiny_model()[1])


def test_autocast_dtype_is_the_policys_mixed_precision():
    from types import SimpleNamespace

    from a2po.device import autocast_dtype

    def accelerator(native_amp, mixed_precision):
        return SimpleNamespace(native_amp=native_amp, mixed_precision=mixed_precision)

    assert autocast_dtype(accelerator(True, "fp16")) is torch.float16
    assert autocast_dtype(accelerator(True, "bf16")) is torch.bfloat16
    assert autocast_dtype(accelerator(False, "fp16")) is None  # fp16 on a CPU: accelerate leaves the forward in fp32
    assert autocast_dtype(accelerator(False, "no")) is None


def test_sampling_runs_in_the_training_precision_fp16_included(tmp_path, tiny_model_dir, monkeypatch):
    """An fp16 run samples (stage 1 from the reference, stage 2 and evaluation from the policy) under fp16 autocast,
    as its policy's forward computes; it sampled in fp32. On a CPU accelerate does not autocast fp16, so the test
    gives the trainer the accelerator state of an fp16 GPU run."""
    import a2po.base_trainer

    trainer = A2POTrainer(tiny_model_dir, coin, args=config(tmp_path), train_dataset=prompts(4))
    monkeypatch.setattr(trainer.accelerator, "native_amp", True)
    monkeypatch.setattr(type(trainer.accelerator), "mixed_precision", property(lambda self: "fp16"))
    seen = []
    sample = a2po.base_trainer.sample_completions

    def spy(*args, **kwargs):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return sample(*args, **kwargs)

    monkeypatch.setattr(a2po.base_trainer, "sample_completions", spy)
    ids, mask, _ = trainer._encode_prompts(["1 + 1 ="])
    with trainer._reference_policy() as reference:
        out = trainer._sample(reference, ids, mask, num_samples=2, phase="values", row_keys=[("k", 0), ("k", 1)])
    assert seen == [torch.float16] and out.shape[0] == 2
