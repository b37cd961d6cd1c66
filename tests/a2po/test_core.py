"""The A*-PO math against hand-computed values."""

import math

import pytest
import torch

from a2po.core import a2po_loss, completion_mask, optimal_value, pass_at_k, token_logprobs


@pytest.mark.parametrize("num_correct, expected", [(0, 0.0), (1, 0.2935), (2, 0.4770), (4, 0.7170), (8, 1.0)])
def test_optimal_value_matches_paper_table(num_correct, expected):
    rewards = torch.tensor([[1.0] * num_correct + [0.0] * (8 - num_correct)])
    # The published table is rounded to three or four digits (2 correct is 0.47723, 4 correct 0.71689).
    assert optimal_value(rewards, beta1=0.5).item() == pytest.approx(expected, abs=3e-4)


def test_optimal_value_is_written_formula_and_stable_for_small_beta():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    by_hand = 0.5 * math.log((math.exp(2.0) + 2) / 3)
    assert optimal_value(rewards, 0.5).tolist() == pytest.approx([by_hand, 0.0])
    # exp(1 / 1e-3) overflows float64; logsumexp must not.
    assert optimal_value(torch.tensor([[1.0, 0.0]]), 1e-3).item() == pytest.approx(1 - 1e-3 * math.log(2))


def test_completion_mask_keeps_first_eos_and_drops_after():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 9, 6, 7, 8], [3, 5, 5, 5, 5]])
    mask = completion_mask(ids, eos_token_ids=[2, 3])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_token_logprobs_equals_full_log_softmax_in_any_chunking():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50, dtype=torch.float64)
    tokens = torch.randint(0, 50, (3, 7))
    expected = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    for chunk in (1, 4, 1024):
        assert torch.allclose(token_logprobs(logits, tokens, chunk_size=chunk), expected.float(), atol=1e-6)


def test_token_logprobs_gradient_matches_autograd_of_log_softmax():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 30, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 30, (2, 5))
    weights = torch.randn(2, 5, dtype=torch.float64)
    expected_logits = logits.detach().clone().requires_grad_(True)
    (expected_logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1) * weights).sum().backward()
    (token_logprobs(logits, tokens, chunk_size=3) * weights).sum().backward()
    assert torch.allclose(logits.grad, expected_logits.grad, atol=1e-6)


def test_loss_against_independent_computation():
    policy = torch.tensor([-3.0, -10.0, -1.5, -7.25])
    ref = torch.tensor([-3.5, -9.0, -1.5, -8.0])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    v_star = torch.tensor([0.2935, 0.4770, 1.0, 0.0])
    beta2 = 0.1
    by_hand = [(0.1 * 0.5 - 0.7065) ** 2, (0.1 * -1.0 + 0.4770) ** 2, (0.0 - 0.0) ** 2, (0.1 * 0.75 - 0.0) ** 2]
    loss, stats = a2po_loss(policy, ref, rewards, v_star, beta2)
    assert loss.item() == pytest.approx(sum(by_hand) / 4, rel=1e-5)
    assert stats["log_ratio"].tolist() == pytest.approx([0.5, -1.0, 0.0, 0.75])
    assert stats["advantage"].tolist() == pytest.approx([0.7065, -0.4770, 0.0, 0.0], abs=1e-6)


def test_loss_gradient_flows_only_through_policy():
    policy = torch.tensor([-2.0, -4.0], requires_grad=True)
    loss, _ = a2po_loss(policy, torch.tensor([-2.5, -3.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), 1.0)
    loss.backward()
    # d/dp mean((p - ref - adv)^2) = (p - ref - adv) for 2 rows: residuals 0.5 - 0.5 = 0 and -1 + 0.5 = -0.5
    assert policy.grad.tolist() == pytest.approx([0.0, -0.5])


def test_pass_at_k():
    assert pass_at_k(torch.tensor([0, 2, 8]), 8, 1).tolist() == pytest.approx([0.0, 0.25, 1.0])
    assert pass_at_k(torch.tensor([0, 1, 8]), 8, 8).tolist() == pytest.approx([0.0, 1.0, 1.0])
    # 1 - C(6,2)/C(8,2) = 1 - 15/28
    assert pass_at_k(torch.tensor([2]), 8, 2).item() == pytest.approx(1 - 15 / 28)
