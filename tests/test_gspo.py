"""GSPO's sequence-level ratio (tg.loss.gspo_policy_loss, optim.ratio=sequence) against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from tg.config import ADDED_FIELDS, load_config
from tg.config_values import ConfigError
from tg.loss import grpo_loss, gspo_policy_loss, policy_loss

F64 = torch.float64


def hand_batch():
    """Four rows, old log-probs 0, so log pi_theta - log pi_old = logp. Row 3 has no policy token."""
    logp = torch.tensor([[0.0, 0.2, -0.1, 5.0],     # mask 0110: mean log-ratio 0.05; the padded 5.0 is ignored
                         [0.0, 0.3, 0.3, 0.3],      # mask 0111: mean 0.3
                         [0.0, 0.1, -0.3, -7.0],    # mask 0110: mean -0.1
                         [1.0, 2.0, 3.0, 4.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0]], dtype=F64)
    adv = torch.tensor([1.0, 2.0, -0.5, 3.0], dtype=F64)
    return logp, torch.zeros(4, 4, dtype=F64), adv, mask


# Per row, eps = 0.2:
#   s_0 = e^0.05 = 1.0512710963760241, unclipped:  loss_0 = -1 * s_0             = -1.0512710963760241
#   s_1 = e^0.3  = 1.3498588075760032 > 1.2, clipped: loss_1 = -2 * 1.2           = -2.4
#   s_2 = e^-0.1 = 0.9048374180359595, unclipped:  loss_2 = +0.5 * s_2           =  0.45241870901797976
#   row 3 has no policy token:                       loss_3 = 0 (and counts in 1/B)
SEQ_MEAN = -0.7497130968395111      # (loss_0 + loss_1 + loss_2 + 0) / 4
TOKEN_MEAN = -1.199672110673727     # (2 loss_0 + 3 loss_1 + 2 loss_2) / 7


def test_gspo_loss_matches_the_hand_computation():
    logp, old, adv, mask = hand_batch()
    loss, stats = gspo_policy_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(SEQ_MEAN, abs=1e-12)
    assert gspo_policy_loss(logp, old, adv, mask, agg="token-mean")[0].item() == pytest.approx(TOKEN_MEAN, abs=1e-12)
    assert stats["clip_frac"] == pytest.approx(3 / 7)                  # row 1's three tokens
    assert stats["ratio_mean"] == pytest.approx((2 * math.exp(0.05) + 3 * math.exp(0.3) + 2 * math.exp(-0.1)) / 7)
    assert stats["approx_kl"] == pytest.approx(-(0.2 - 0.1 + 0.9 + 0.1 - 0.3) / 7)


def test_gspo_gradient_is_minus_a_s_over_b_len_on_every_policy_token():
    """d loss / d logp_it = -A_i s_i / (B |y_i|) on row i's policy tokens (unclipped rows), 0 elsewhere."""
    logp, old, adv, mask = hand_batch()
    gspo_policy_loss(logp, old, adv, mask)[0].backward()
    g0, g2 = -1.0 * 1.0512710963760241 / 8, 0.5 * 0.9048374180359595 / 8   # -0.1314..., +0.0565...
    expected = torch.tensor([[0, g0, g0, 0], [0, 0, 0, 0], [0, g2, g2, 0], [0, 0, 0, 0]], dtype=F64)
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-15)
    assert (logp.grad[0, 1:3] < 0).all() and (logp.grad[2, 1:3] > 0).all()  # descent raises A > 0, lowers A < 0


def test_masked_and_padded_tokens_change_nothing():
    logp, old, adv, mask = hand_batch()
    moved = logp.detach().clone()
    moved[mask == 0] += torch.randn(int((mask == 0).sum()), dtype=F64) * 9
    a, b = gspo_policy_loss(logp.detach(), old, adv, mask)[0], gspo_policy_loss(moved, old, adv, mask)[0]
    assert a.item() == b.item()


def test_one_token_sequences_give_the_token_ratio_loss():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(6, 3, generator=g, dtype=F64) * 0.3, torch.zeros(6, 3, dtype=F64)
    adv, mask = torch.randn(6, generator=g, dtype=F64), torch.tensor([[0, 1, 0]] * 6, dtype=F64)
    for kw in ({}, {"dual_clip": 3.0}, {"agg": "token-mean"}):
        assert gspo_policy_loss(logp, old, adv, mask, **kw)[0].item() == pytest.approx(
            policy_loss(logp, old, adv, mask, **kw)[0].item(), abs=1e-14)


def test_grpo_loss_dispatches_on_ratio():
    logp, old, adv, mask = hand_batch()
    assert grpo_loss(logp, old, adv, mask, kl_beta=0.0, ratio="sequence")[0].item() == pytest.approx(SEQ_MEAN)
    assert grpo_loss(logp, old, adv, mask, kl_beta=0.0)[0].item() == policy_loss(logp, old, adv, mask)[0].item()
    with pytest.raises(ValueError, match="ratio must be one of"):
        grpo_loss(logp, old, adv, mask, kl_beta=0.0, ratio="seq")
    with pytest.raises(ValueError, match="one advantage per row"):
        gspo_policy_loss(logp, old, adv[:, None].expand(4, 4), mask)


def test_optim_ratio_is_checked_and_hash_neutral_at_its_default():
    c = load_config("cpu")
    assert c.optim.ratio == "token" and c.replace(optim=dict(ratio="token")).hash() == c.hash()
    assert load_config("cpu", "optim.ratio=sequence").hash() != c.hash()
    assert ADDED_FIELDS["optim", "ratio"] == "token"          # so Config.hash leaves it out at "token"
    with pytest.raises(ConfigError, match="optim.ratio"):
        load_config("cpu", "optim.ratio=seq")


def test_only_the_log_ratio_counts_and_extreme_ratios_are_clamped():
    """Shifting new and old log-probs together changes nothing; a mean log-ratio of +-30 is clamped to +-20
    before exp (deviation 1), in the loss and in approx_kl's token log-ratios."""
    logp, old, adv, mask = hand_batch()
    shifted = gspo_policy_loss(logp.detach() - 0.7, old - 0.7, adv, mask)[0].item()
    assert shifted == pytest.approx(SEQ_MEAN, abs=1e-12)
    big = torch.full((2, 2), 30.0, dtype=F64)
    ones, zeros = torch.ones(2, 2, dtype=F64), torch.zeros(2, 2, dtype=F64)
    loss, stats = gspo_policy_loss(big * torch.tensor([[1.0], [-1.0]], dtype=F64), zeros,
                                   torch.tensor([-1.0, 1.0], dtype=F64), ones, clip_low=0.2, clip_high=0.2)
    # row 0: s = e^20, A = -1: max(e^20, 1.2) = e^20; row 1: s = e^-20, A = 1: max(-e^-20, -0.8) = -e^-20
    assert loss.item() == pytest.approx((math.exp(20) - math.exp(-20)) / 2, rel=1e-12)
    assert stats["ratio_mean"] == pytest.approx((math.exp(20) + math.exp(-20)) / 2, rel=1e-12)
    assert stats["approx_kl"] == 0.0                        # token log-ratios +-30 clamped to +-20, summing to 0
    low = gspo_policy_loss(big[:1] * -1, zeros[:1], torch.tensor([1.0], dtype=F64), ones[:1])[1]["ratio_mean"]
    assert low == pytest.approx(math.exp(-20), rel=1e-12)   # not e^-30


def test_dual_clip_bounds_a_negative_advantage_sequence_and_counts_it():
    """dual_clip c = 3: row 0 (A = -2, s = e^2) has loss 2 e^2 > 3 |A|, bounded to 6; row 1 (A = +1) is untouched."""
    logp = torch.tensor([[2.0, 2.0], [0.1, 0.1]], dtype=F64)
    ones = torch.ones(2, 2, dtype=F64)
    loss, stats = gspo_policy_loss(logp, torch.zeros(2, 2, dtype=F64), torch.tensor([-2.0, 1.0], dtype=F64), ones,
                                   dual_clip=3.0)
    assert loss.item() == pytest.approx((6.0 - math.exp(0.1)) / 2, abs=1e-12)
    assert stats["dual_clip_frac"] == pytest.approx(0.5)
    assert gspo_policy_loss(logp, torch.zeros(2, 2, dtype=F64), torch.tensor([-2.0, 1.0], dtype=F64),
                            ones)[1]["dual_clip_frac"] == 0.0


def test_stats_over_a_single_policy_token_are_that_tokens_values():
    logp = torch.tensor([[0.0, 0.5]], dtype=F64)
    stats = gspo_policy_loss(logp, torch.zeros(1, 2, dtype=F64), torch.tensor([1.0], dtype=F64),
                             torch.tensor([[0.0, 1.0]], dtype=F64))[1]
    assert stats["ratio_mean"] == pytest.approx(math.exp(0.5)) and stats["clip_frac"] == 1.0
    assert stats["approx_kl"] == pytest.approx(-0.5)
