"""The GRPO math (`a2po.core.group_advantages`, `a2po.core.decoupled_advantages`, `a2po.core.grpo_loss` with each
of its loss types and switches, `a2po.core.high_entropy_mask`, `a2po.core.vllm_importance_weights`) against
hand-computed values."""

import math

import pytest
import torch

from a2po import core
from a2po.core import (
    GRPOLossSettings,
    decoupled_advantages,
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    vllm_importance_weights,
)
from a2po.settings import GRPO_LOSS_TYPES

# Two prompts, G = 4: one group with 2 of 4 correct, one whose rewards are all equal.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])


def test_group_advantages_for_each_scaling():
    group_std = math.sqrt(4 * 0.5**2 / 3)  # sample std (Bessel) of 1, 0, 0, 1
    advantages, std = group_advantages(REWARDS, 4, "group")
    assert advantages.tolist() == pytest.approx([x * 0.5 / (group_std + 1e-4) for x in (1, -1, -1, 1)] + [0.0] * 4)
    assert std.tolist() == pytest.approx([group_std] * 4 + [0.0] * 4)

    advantages, _ = group_advantages(REWARDS, 4, "none")
    assert advantages.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])

    batch_std = math.sqrt((6 * 0.25**2 + 2 * 0.75**2) / 7)  # mean 0.75 over all 8 rewards
    advantages, std = group_advantages(REWARDS, 4, "batch")
    assert advantages.tolist() == pytest.approx([x * 0.5 / (batch_std + 1e-4) for x in (1, -1, -1, 1)] + [0.0] * 4)
    assert std.tolist() == pytest.approx([batch_std] * 8)


def test_a_group_of_equal_rewards_has_zero_advantage_under_every_scaling():
    for scale in ("group", "batch", "none"):
        advantages, _ = group_advantages(torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 3, scale)
        assert advantages.tolist() == [0.0] * 6, scale


# Two completions, three token positions; the last token of row 0 is padding (mask 0). Log-ratios to pi_old:
# row 0: 0, 0.5; row 1: -0.5, 0.1, 0. Advantages 1 and -0.5; clipping to [0.8, 1.28].
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
OLD = torch.tensor([[-1.0, -2.0, -3.0], [-1.5, -0.5, -2.0]])
LOG_RATIO = torch.tensor([[0.0, 0.5, 0.7], [-0.5, 0.1, 0.0]])
ADVANTAGES = torch.tensor([1.0, -0.5])
# Per token -min(ratio * A, clip(ratio) * A):
#   row 0, A = 1:    ratio 1 -> -1;  ratio e^0.5 = 1.6487 > 1.28 -> clipped: -1.28
#   row 1, A = -0.5: ratio e^-0.5 = 0.6065 < 0.8 -> clipped: -(0.8 * -0.5) = 0.4;  e^0.1 -> 0.5 * e^0.1;  1 -> 0.5
ROW0 = [-1.0, -1.28]
ROW1 = [0.4, 0.5 * math.exp(0.1), 0.5]


def loss(loss_type, logps=None, num_items=None, **settings):
    logps = OLD + LOG_RATIO if logps is None else logps
    return grpo_loss(logps, OLD, None, ADVANTAGES, MASK,
                     GRPOLossSettings(loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, **settings),
                     num_items=num_items)


def test_the_loss_table_holds_exactly_the_offered_loss_types():
    """`a2po.settings` names the loss types without torch; the table in `a2po.core` computes them."""
    assert tuple(core.LOSS_TYPES) == GRPO_LOSS_TYPES


@pytest.mark.parametrize("loss_type, expected", [
    ("grpo", (sum(ROW0) / 2 + sum(ROW1) / 3) / 2),        # each completion's token mean, then the mean
    ("bnpo", (sum(ROW0) + sum(ROW1)) / 5),                # over the 5 tokens of the micro-batch
    ("dr_grpo", (sum(ROW0) + sum(ROW1)) / (2 * 4)),       # over rows * max_completion_length
    ("dapo", (sum(ROW0) + sum(ROW1)) / 10),               # over the step's 10 tokens (other micro-batches too)
])
def test_loss_types_aggregate_the_clipped_surrogate_as_written(loss_type, expected):
    value, stats = loss(loss_type, max_completion_length=4, num_items=10.0)
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert stats["low_clipped"].tolist() == [[False] * 3, [True, False, False]]
    assert stats["high_clipped"].tolist() == [[False, True, True], [False] * 3]  # row 0's padding too: masked later
    assert "kl" not in stats


def test_clipped_tokens_have_no_gradient():
    logps = (OLD + LOG_RATIO).requires_grad_(True)
    loss("grpo", logps=logps)[0].backward()
    # d/d logp of -ratio * A / length / rows where not clipped; 0 where clipped or masked.
    expected = [[-1.0 * 1 / 2 / 2, 0.0, 0.0], [0.0, 0.5 * math.exp(0.1) / 3 / 2, 0.5 / 3 / 2]]
    assert logps.grad.tolist()[0] == pytest.approx(expected[0], abs=1e-7)
    assert logps.grad.tolist()[1] == pytest.approx(expected[1], abs=1e-7)


def test_kl_term_is_the_k3_estimate_times_the_ratio():
    logps = OLD + LOG_RATIO
    ref = logps + torch.tensor([[0.0, -0.2, 0.0], [0.3, 0.0, 0.1]])  # log pi_ref - log pi
    beta = 0.04
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    kl = [[0.0, k3(-0.2) * math.exp(0.5)], [k3(0.3) * math.exp(-0.5), 0.0, k3(0.1)]]
    value, stats = grpo_loss(logps, OLD, ref, ADVANTAGES, MASK,
                             GRPOLossSettings(loss_type="bnpo", beta=beta, epsilon_low=0.2, epsilon_high=0.28))
    expected = (sum(ROW0) + sum(ROW1) + beta * (sum(kl[0]) + sum(kl[1]))) / 5
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert (stats["kl"] * MASK)[1].tolist() == pytest.approx(kl[1], rel=1e-5)
    without, _ = grpo_loss(logps, OLD, ref, ADVANTAGES, MASK,
                           GRPOLossSettings(loss_type="bnpo", beta=beta, epsilon_low=0.2, epsilon_high=0.28,
                                            use_bias_correction_kl=False))
    plain = [[0.0, k3(-0.2)], [k3(0.3), 0.0, k3(0.1)]]
    assert without.item() == pytest.approx((sum(ROW0) + sum(ROW1) + beta * (sum(plain[0]) + sum(plain[1]))) / 5,
                                           rel=1e-6)


def test_one_iteration_takes_the_ratio_to_the_policy_itself():
    """num_iterations = 1: pi_old is pi detached, so the ratio is 1 and the gradient is -A per token."""
    logps = (OLD + LOG_RATIO).requires_grad_(True)
    value, _ = grpo_loss(logps, None, None, ADVANTAGES, MASK, GRPOLossSettings(loss_type="bnpo"))
    assert value.item() == pytest.approx((-1.0 * 2 + 0.5 * 3) / 5)
    value.backward()
    assert logps.grad.flatten().tolist() == pytest.approx([-0.2, -0.2, 0.0, 0.1, 0.1, 0.1])


def test_vllm_importance_weights_truncate_or_mask_per_token_or_per_sequence():
    """pi_old / pi_vllm per token: 2, 1, then a token outside the mask (no correction) and one vLLM gave no
    log-prob for (NaN: no correction); the sequence's ratio is their product, 2."""
    old = torch.tensor([[0.5, 0.5, 0.5, 0.5]]).log()
    sampling = torch.tensor([[0.25, 0.5, 0.1, math.nan]]).log()
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])

    def weights(mode, low=None, high=None):
        return vllm_importance_weights(old, sampling, mask, mode, low, high)

    assert torch.allclose(weights("token_truncate", high=1.5), torch.tensor([[1.5, 1.0, 1.0, 1.0]]))
    assert torch.allclose(weights("token_mask", high=1.5), torch.tensor([[0.0, 1.0, 1.0, 1.0]]))
    assert torch.allclose(weights("token_mask", low=1.5), torch.tensor([[2.0, 0.0, 0.0, 0.0]]))
    assert torch.allclose(weights("sequence_truncate", high=1.5), torch.tensor([[1.5]]))
    assert torch.allclose(weights("sequence_truncate", low=3.0), torch.tensor([[3.0]]))
    assert torch.allclose(weights("sequence_mask", high=3.0), torch.tensor([[2.0]]))
    assert torch.allclose(weights("sequence_mask", high=1.5), torch.tensor([[0.0]]))
    with pytest.raises(ValueError, match="Unknown vllm_importance_sampling_mode 'tokens'"):
        weights("tokens")


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_sapo_replaces_the_clip_by_a_temperature_gate():
    """-sigmoid(tau (w - 1)) 4 / tau A per token, tau 1.0 for A > 0 and 1.05 for A <= 0; aggregated as grpo."""
    value, stats = loss("sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)
    row0 = [-sigmoid(math.exp(r) - 1) * 4 for r in (0.0, 0.5)]
    row1 = [sigmoid(1.05 * (math.exp(r) - 1)) * 4 / 1.05 * 0.5 for r in (-0.5, 0.1, 0.0)]
    assert value.item() == pytest.approx((sum(row0) / 2 + sum(row1) / 3) / 2, rel=1e-6)
    assert "low_clipped" not in stats  # no clip, so no clip ratios (as TRL logs none)


def test_cispo_weights_log_pi_by_the_capped_ratio_without_its_gradient():
    """-sg(min(w, epsilon_high)) A log pi per token: the gradient is -min(w, epsilon_high) A / num_items."""
    logps = (OLD + LOG_RATIO).requires_grad_(True)
    value, stats = grpo_loss(logps, OLD, None, ADVANTAGES, MASK, GRPOLossSettings(loss_type="cispo", epsilon_high=1.2),
                             num_items=5.0)
    value.backward()
    expected = [[-1 / 5, -1.2 / 5, 0.0], [math.exp(-0.5) * 0.5 / 5, math.exp(0.1) * 0.5 / 5, 0.5 / 5]]
    assert logps.grad.tolist()[0] == pytest.approx(expected[0], abs=1e-7)
    assert logps.grad.tolist()[1] == pytest.approx(expected[1], abs=1e-7)
    assert stats["cispo_clipped"].tolist() == [[False, True, True], [False] * 3]  # padding too: masked later


def test_gspo_takes_one_ratio_per_completion_and_luspo_weighs_it_by_length():
    """Sequence level: w = exp(mean of the completion's log-ratios): row 0 e^0.25 > 1.28 (clipped, A > 0), row 1
    e^(-0.4 / 3) inside the range (A < 0)."""
    w1 = math.exp(-0.4 / 3)
    value, stats = loss("grpo", importance_sampling_level="sequence")
    assert value.item() == pytest.approx((-1.28 + 0.5 * w1) / 2, rel=1e-6)
    assert stats["high_clipped"].tolist() == [[True], [False]]
    luspo, _ = loss("luspo", importance_sampling_level="sequence")
    assert luspo.item() == pytest.approx((-1.28 * 2 + 0.5 * w1 * 3) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="Unknown importance_sampling_level 'sequence_token'"):
        loss("grpo", importance_sampling_level="sequence_token")


def test_two_sided_clipping_caps_the_ratio_of_a_negative_advantage():
    """A < 0 and w = 2 > 1 + epsilon_high: the clipped surrogate keeps |A| w = 2; delta = 1.5 caps it at 1.5."""
    logps, old = torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1)
    args = dict(loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.28)
    assert grpo_loss(logps, old, None, torch.tensor([-1.0]), torch.ones(1, 1),
                     GRPOLossSettings(**args))[0].item() == pytest.approx(2.0)
    capped, _ = grpo_loss(logps, old, None, torch.tensor([-1.0]), torch.ones(1, 1),
                          GRPOLossSettings(delta=1.5, **args))
    assert capped.item() == pytest.approx(1.5)


def test_off_policy_mask_drops_negative_advantages_that_drifted():
    """Row 1 (A < 0) has mean log pi_old - log pi = 0.4 / 3: above a 0.1 threshold it leaves the loss; row 0 (A > 0)
    stays whatever its drift."""
    value, _ = loss("bnpo", off_policy_mask_threshold=0.1)
    assert value.item() == pytest.approx(sum(ROW0) / 5, rel=1e-6)
    assert loss("bnpo", off_policy_mask_threshold=0.2)[0].item() == pytest.approx((sum(ROW0) + sum(ROW1)) / 5)


def test_vespo_gamma_weight_is_one_on_policy_and_fades_off_policy():
    """phi(W) = exp(lambda + k log W - lambda W): 1 at W = 1 (on-policy the loss is -A log pi per token); row 0
    (A >= 0, k 2, lambda 3) has log W = 0.5, row 1 (A < 0, k 3, lambda 2) log W = -0.4."""
    logps = OLD + LOG_RATIO
    on_policy, stats = grpo_loss(logps, None, None, ADVANTAGES, MASK, GRPOLossSettings(loss_type="vespo"),
                                 num_items=5.0)
    assert stats["phi"].flatten().tolist() == pytest.approx([1.0, 1.0])
    assert on_policy.item() == pytest.approx(-((logps * MASK).sum(-1) * ADVANTAGES).sum().item() / 5, rel=1e-6)
    _, stats = loss("vespo", num_items=5.0)
    phi = [math.exp(3 + 2 * 0.5 - 3 * math.exp(0.5)), math.exp(2 + 3 * -0.4 - 2 * math.exp(-0.4))]
    assert stats["phi"].flatten().tolist() == pytest.approx(phi, rel=1e-5)


def test_high_entropy_mask_keeps_the_top_quantile_of_the_counted_tokens():
    entropies = torch.tensor([[1.0, 3.0, 9.0], [2.0, 4.0, 5.0]])  # 9 is padding (MASK 0): never counted
    # the 0.6 quantile of 1, 2, 3, 4, 5 is 3.4
    assert high_entropy_mask(entropies, MASK, 0.4).tolist() == [[False] * 3, [False, True, True]]
    assert high_entropy_mask(entropies, MASK, 0.0).tolist() == [[False] * 3, [False, False, True]]
    assert high_entropy_mask(entropies, MASK, 1.0).tolist() == MASK.bool().tolist()


def test_gdpo_normalizes_each_reward_in_its_group_before_the_sum():
    """Two prompts, G = 2, two functions weighted 1 and 0.5; the second function skips the last completion."""
    per_func = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [1.0, math.nan]], dtype=torch.float64)
    z0 = 0.5 / (math.sqrt(0.5) + 1e-4)  # |r - mean| / (std + 1e-4) in group 0, function 0 (std of 1, 0)
    z1 = 1.0 / (math.sqrt(2.0) + 1e-4)  # function 1 (std of 0, 2)
    summed = [z0 - 0.5 * z1, -z0 + 0.5 * z1, 0.0, 0.0]  # group 1: equal rewards; the skipped function has no std
    mean = sum(summed) / 4
    std = math.sqrt(sum((s - mean) ** 2 for s in summed) / 3)
    advantages, stds = decoupled_advantages(per_func, torch.tensor([1.0, 0.5]), 2)
    assert advantages.tolist() == pytest.approx([(s - mean) / (std + 1e-4) for s in summed], rel=1e-6)
    assert stds.tolist() == pytest.approx([std] * 4)
    unscored = per_func.clone()
    unscored[3] = math.nan
    assert decoupled_advantages(unscored, torch.tensor([1.0, 0.5]), 2)[0][3].item() == 0.0
