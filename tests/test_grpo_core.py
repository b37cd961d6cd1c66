"""The GRPO math (`a2po.core.group_advantages`, `a2po.core.grpo_loss`, `a2po.core.vllm_importance_weights`) against
hand-computed values."""

import math

import pytest
import torch

from a2po.core import group_advantages, grpo_loss, vllm_importance_weights

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


def loss(loss_type, logps=None, **kwargs):
    logps = OLD + LOG_RATIO if logps is None else logps
    return grpo_loss(logps, OLD, None, ADVANTAGES, MASK, loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28,
                     **kwargs)


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
    value, stats = grpo_loss(logps, OLD, ref, ADVANTAGES, MASK, loss_type="bnpo", beta=beta, epsilon_low=0.2,
                             epsilon_high=0.28)
    expected = (sum(ROW0) + sum(ROW1) + beta * (sum(kl[0]) + sum(kl[1]))) / 5
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert (stats["kl"] * MASK)[1].tolist() == pytest.approx(kl[1], rel=1e-5)
    without, _ = grpo_loss(logps, OLD, ref, ADVANTAGES, MASK, loss_type="bnpo", beta=beta, epsilon_low=0.2,
                           epsilon_high=0.28, bias_correction_kl=False)
    plain = [[0.0, k3(-0.2)], [k3(0.3), 0.0, k3(0.1)]]
    assert without.item() == pytest.approx((sum(ROW0) + sum(ROW1) + beta * (sum(plain[0]) + sum(plain[1]))) / 5,
                                           rel=1e-6)


def test_one_iteration_takes_the_ratio_to_the_policy_itself():
    """num_iterations = 1: pi_old is pi detached, so the ratio is 1 and the gradient is -A per token."""
    logps = (OLD + LOG_RATIO).requires_grad_(True)
    value, _ = grpo_loss(logps, None, None, ADVANTAGES, MASK, loss_type="bnpo")
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
