"""TRL 1.16's GRPO variants on our trainer: the config refuses bad values with a message naming the field and warns
of the combinations TRL warns of; each new loss type trains the tiny model with finite losses and its metrics, and
splits an optimizer step into micro-batches as one batch; the other switches train together. (Their parity with
TRL's loss on the same tensors: tests/a2po/test_grpo_parity.py.)"""

import math
import warnings

import pytest
import torch

from a2po import GRPOTrainer
from a2po.config import ConfigError
from tests.a2po.test_grpo_trainer import config
from tests.a2po.test_trainer import Recorder, coin, prompts

NEW_LOSS_TYPES = ["cispo", "sapo", "luspo", "vespo"]
LOSS_METRICS = {"cispo": "cispo_clip_ratio", "sapo": None, "luspo": "clip_ratio/region_mean",
                "vespo": "vespo/phi_seq_mean"}


def logged(trainer):
    return [h for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("field, value, message", [
    ("loss_type", "gspo", "loss_type must be one of .*'cispo', 'sapo', 'luspo', 'vespo'"),
    ("importance_sampling_level", "sequence_token", "importance_sampling_level must be one of"),
    ("multi_objective_aggregation", "sum", "multi_objective_aggregation must be one of"),
    ("top_entropy_quantile", 1.5, "top_entropy_quantile must be between 0.0 and 1.0"),
    ("top_entropy_quantile", -0.1, "top_entropy_quantile must be between 0.0 and 1.0"),
    ("delta", 0.9, "delta must be > 1 or None"),
    ("sapo_temperature_pos", 0.0, "sapo_temperature_pos must be > 0"),
    ("sapo_temperature_neg", -1.0, "sapo_temperature_neg must be > 0"),
    ("vespo_lambda_pos", 0.0, "vespo_lambda_pos must be > 0"),
    ("vespo_k_neg", -1.0, "vespo_k_neg must be >= 0"),
    ("off_policy_mask_threshold", -0.5, "off_policy_mask_threshold must be >= 0 or None"),
])
def test_config_refuses_bad_values_naming_the_field(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message) as error:
        config(tmp_path, **{field: value})
    assert set(error.value.problems) == {field}


@pytest.mark.parametrize("settings, warning", [
    (dict(loss_type="luspo"), "set importance_sampling_level='sequence'"),
    (dict(loss_type="vespo", importance_sampling_level="sequence"), "should be 'token'"),
    (dict(loss_type="dapo", importance_sampling_level="sequence"), "weights each completion by its length"),
])
def test_config_warns_of_the_combinations_trl_warns_of(tmp_path, settings, warning):
    with pytest.warns(UserWarning, match=warning):
        config(tmp_path, **settings)


def test_the_papers_setups_give_no_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config(tmp_path, loss_type="luspo", importance_sampling_level="sequence")
        config(tmp_path, loss_type="grpo", importance_sampling_level="sequence")
        config(tmp_path, loss_type="cispo", epsilon_high=5.0)


@pytest.mark.parametrize("loss_type", NEW_LOSS_TYPES)
def test_each_new_loss_type_trains_with_finite_loss(tmp_path, tiny_model_dir, loss_type):
    """Two optimizer steps on one generation (num_iterations 2: the second is off-policy, where the variants act):
    finite losses, every parameter moved, and the loss type's own metrics as TRL names them."""
    level = "sequence" if loss_type == "luspo" else "token"
    args = config(tmp_path, loss_type=loss_type, importance_sampling_level=level, num_iterations=2, beta=0.04,
                  epsilon_high=5.0 if loss_type == "cispo" else None)
    trainer = GRPOTrainer(tiny_model_dir, coin, args=args, train_dataset=prompts(8))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert [n for n, p in trainer.model.named_parameters() if torch.equal(before[n], p)] == []
    history = logged(trainer)
    assert len(history) == 2 and all(math.isfinite(h["loss"]) and math.isfinite(h["kl"]) for h in history)
    if LOSS_METRICS[loss_type]:
        assert all(math.isfinite(h[LOSS_METRICS[loss_type]]) for h in history)
    clipped_family = loss_type == "luspo"
    assert all(("clip_ratio/region_mean" in h) == clipped_family for h in history)


def long_answers(completions, **kwargs):
    """A second objective on another scale: the completion's length in characters."""
    return [float(len(c[0]["content"] if isinstance(c, list) else c)) for c in completions]


@pytest.mark.filterwarnings("ignore:Rewards outside")  # the lengths: GDPO's point is rewards on other scales
def test_the_other_switches_train_together(tmp_path, tiny_model_dir):
    """GSPO's ratio, two-sided clipping, the off-policy mask, high-entropy tokens and GDPO in one run: finite losses,
    the entropy logged (computed because top_entropy_quantile < 1), and GDPO's advantages in the samples."""
    args = config(tmp_path, loss_type="grpo", importance_sampling_level="sequence", delta=2.0,
                  off_policy_mask_threshold=0.1, top_entropy_quantile=0.5, num_iterations=2,
                  multi_objective_aggregation="normalize_then_sum", reward_weights=[1.0, 0.5])
    recorder = Recorder()
    trainer = GRPOTrainer(tiny_model_dir, [coin, long_answers], args=args, train_dataset=prompts(8),
                          callbacks=[recorder])
    trainer.train()
    history = logged(trainer)
    assert len(history) == 2 and all(math.isfinite(h["loss"]) and h["entropy"] > 0 for h in history)
    samples = recorder.of("samples")[0]["samples"]
    # GDPO normalizes the summed rewards over the batch: the advantages of a generation have mean 0 and std 1
    advantages = torch.tensor([s["advantage"] for s in samples])
    assert advantages.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert advantages.std().item() == pytest.approx(1.0, abs=1e-2)


def test_entropies_are_computed_only_below_quantile_one(tmp_path, tiny_model_dir):
    """The default top_entropy_quantile (1.0) keeps every token: no entropy pass, no entropy metric."""
    trainer = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path, max_steps=1), train_dataset=prompts(8))
    trainer.train()
    assert "entropy" not in logged(trainer)[0]
