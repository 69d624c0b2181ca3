"""tg.loss against an obvious per-token Python loop, plus gradient and alignment checks (Eq. 8)."""

from __future__ import annotations

import math

import pytest
import torch

from tg.loss import (entropy, grpo_loss, gspo_policy_loss, k3_kl, logprobs_at, masked_aggregate, policy_loss,
                     token_logprobs)

F64 = torch.float64


def random_batch(seed: int, B: int = 5, T: int = 9, spread: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    logp = old + spread * torch.randn(B, T, generator=g, dtype=F64)    # ratios both inside and outside the clip
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    mask = (torch.rand(B, T, generator=g) < 0.7).to(F64)
    mask[:, 0] = 0.0
    mask[0, 3] = 1.0                                                   # every row has a policy token
    mask[1:, 4] = 1.0
    entropy = torch.rand(B, T, generator=g, dtype=F64) * 2
    return logp, old, ref, adv, mask, entropy


def loop_loss(logp, old, ref, adv, mask, entropy, clip_low, clip_high, dual_clip, agg, beta, ent_coef):
    """One token at a time, straight from Eq. 8 and the docstrings."""
    rows = []                                  # per row: list of per-token loss values
    for i in range(logp.shape[0]):
        toks = []
        for t in range(logp.shape[1]):
            if mask[i, t] == 0:
                continue
            lr = min(max(float(logp[i, t] - old[i, t]), -20.0), 20.0)
            r, a = math.exp(lr), float(adv[i])
            obj = min(r * a, min(max(r, 1 - clip_low), 1 + clip_high) * a)
            if dual_clip > 0 and a < 0:
                obj = max(obj, dual_clip * a)
            d = float(ref[i, t] - logp[i, t])
            kl = min(max(math.exp(d) - d - 1, -10.0), 10.0)
            toks.append(-obj + beta * kl - ent_coef * float(entropy[i, t]))
        rows.append(toks)
    if agg == "seq-mean":
        return sum(sum(tk) / max(len(tk), 1) for tk in rows) / len(rows)
    n = sum(len(tk) for tk in rows)
    return sum(sum(tk) for tk in rows) / max(n, 1)


@pytest.mark.parametrize("agg", ["seq-mean", "token-mean"])
@pytest.mark.parametrize("dual_clip", [0.0, 1.5])
@pytest.mark.parametrize("beta,ent_coef", [(0.0, 0.0), (0.001, 0.0), (0.5, 0.01)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_equals_loop(agg, dual_clip, beta, ent_coef, seed):
    logp, old, ref, adv, mask, ent = random_batch(seed, spread=0.6)
    got, stats = grpo_loss(logp, old, adv, mask, ref_logp=ref, entropy=ent, clip_low=0.2, clip_high=0.28,
                           dual_clip=dual_clip, agg=agg, kl_beta=beta, entropy_coef=ent_coef)
    want = loop_loss(logp, old, ref, adv, mask, ent, 0.2, 0.28, dual_clip, agg, beta, ent_coef)
    assert got.item() == pytest.approx(want, abs=1e-10)
    assert 0.0 < stats["clip_frac"] < 1.0
    if dual_clip > 0:
        assert stats["dual_clip_frac"] > 0.0   # the spread makes some ratios exceed 1.5 with A < 0


def test_dual_clip_bounds_negative_advantage_loss():
    # A = -1, ratio e^2 = 7.39: clipped PPO loss is max(7.39, 0.8) = 7.39; dual clip c = 3 caps it at 3
    logp, old, mask = torch.tensor([[2.0]], dtype=F64), torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    plain, _ = policy_loss(logp, old, torch.tensor([-1.0], dtype=F64), mask)
    capped, stats = policy_loss(logp, old, torch.tensor([-1.0], dtype=F64), mask, dual_clip=3.0)
    assert plain.item() == pytest.approx(math.exp(2.0)) and capped.item() == pytest.approx(3.0)
    assert stats["dual_clip_frac"] == 1.0
    # positive advantage: untouched (clipped at 1 + eps_high)
    pos, _ = policy_loss(logp, old, torch.tensor([1.0], dtype=F64), mask, dual_clip=3.0)
    assert pos.item() == pytest.approx(-1.2)


@pytest.mark.parametrize("loss_fn", [policy_loss, gspo_policy_loss])
def test_dual_clip_counts_a_ratio_past_the_bound_not_at_it(loss_fn):
    """dual_clip_frac counts where the loss exceeds c |A| strictly (the official code's `torch.gt`): with A = -1 and
    c = e^1 (the ratio's own float), row 0's ratio sits exactly on the bound and row 1's lies past it."""
    logp = torch.tensor([[1.0], [1.5]], dtype=F64)
    c = torch.exp(logp[0, 0]).item()
    loss, stats = loss_fn(logp, torch.zeros(2, 1, dtype=F64), torch.tensor([-1.0, -1.0], dtype=F64),
                          torch.ones(2, 1, dtype=F64), dual_clip=c)
    assert loss.item() == c and stats["dual_clip_frac"] == 0.5


def test_token_level_advantages_broadcast():
    logp, old, _, adv, mask, _ = random_batch(3)
    a, _ = policy_loss(logp, old, adv, mask)
    b, _ = policy_loss(logp, old, adv[:, None].expand(-1, logp.shape[1]), mask)
    assert a.item() == pytest.approx(b.item(), abs=1e-14)


def test_gradient_at_ratio_one():
    # With logp == old_logp (r = 1), d loss / d logp_it = -A_i / (B |H_i|) for seq-mean (Eq. 8's 1/G),
    # i.e. B * grad = -A_i / |H_i| on each policy token and 0 elsewhere.
    _, old, _, adv, mask, _ = random_batch(4)
    B = old.shape[0]
    for agg, denom in (("seq-mean", B * mask.sum(1, keepdim=True)), ("token-mean", mask.sum())):
        logp = old.clone().requires_grad_(True)
        loss, stats = policy_loss(logp, old, adv, mask, agg=agg)
        (grad,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(grad, -adv[:, None] * mask / denom, rtol=0, atol=1e-12)
        assert stats["ratio_mean"] == pytest.approx(1.0) and stats["approx_kl"] == 0.0
        assert stats["clip_frac"] == 0.0


def test_masked_tokens_get_no_gradient_and_huge_log_ratio_is_finite():
    logp, old, ref, adv, mask, _ = random_batch(5)
    logp = logp.clone()
    logp[mask == 0] = 80.0                      # garbage at masked positions must not matter
    logp.requires_grad_(True)
    loss, _ = grpo_loss(logp, old, adv, mask, ref_logp=ref, dual_clip=3.0)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and bool((grad[mask == 0] == 0).all())


def test_k3_kl_values():
    logp = torch.tensor([[-1.0, -2.0, -30.0]], dtype=F64)
    ref = torch.tensor([[-1.0, -1.5, 0.0]], dtype=F64)
    d = 0.5
    torch.testing.assert_close(k3_kl(logp, ref), torch.tensor([[0.0, math.exp(d) - d - 1, 10.0]], dtype=F64))
    assert bool((k3_kl(ref, logp) >= 0).all())


def test_aggregations_differ_by_weighting():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert masked_aggregate(x, mask, "seq-mean").item() == pytest.approx((1 + 4) / 2)
    assert masked_aggregate(x, mask, "token-mean").item() == pytest.approx((4 + 4) / 5)
    with pytest.raises(ValueError):
        masked_aggregate(x, mask, "sum")


def test_missing_inputs_raise():
    logp, old, _, adv, mask, _ = random_batch(6)
    with pytest.raises(ValueError):
        grpo_loss(logp, old, adv, mask, kl_beta=0.001)
    with pytest.raises(ValueError):
        grpo_loss(logp, old, adv, mask, kl_beta=0.0, entropy_coef=0.001)


def test_token_logprobs_alignment_and_the_values_at_picked_positions():
    g = torch.Generator().manual_seed(7)
    B, T, V = 2, 6, 11
    logits = torch.randn(B, T, V, generator=g, dtype=F64)
    ids = torch.randint(V, (B, T), generator=g)
    lp, ent = token_logprobs(logits, ids), entropy(logits[:, :-1])
    assert lp.shape == (B, T) and bool((lp[:, 0] == 0).all()) and ent.shape == (B, T - 1)
    for b in range(B):
        for t in range(1, T):                   # logits[:, t-1] produced ids[:, t]
            dist = torch.log_softmax(logits[b, t - 1], -1)
            assert lp[b, t].item() == pytest.approx(dist[ids[b, t]].item(), abs=1e-12)
            assert ent[b, t - 1].item() == pytest.approx(-(dist.exp() * dist).sum().item(), abs=1e-12)
            picked = logits[b, t - 1][None]     # the trainer's way: the predicting logits, picked
            assert logprobs_at(picked, ids[b, t][None]).item() == pytest.approx(lp[b, t].item(), abs=1e-12)


def test_bfloat16_logits_are_upcast():
    logits = torch.randn(1, 4, 7).to(torch.bfloat16)
    ids = torch.randint(7, (1, 4))
    assert token_logprobs(logits, ids).dtype == torch.float32
    assert logprobs_at(logits[0], ids[0]).dtype == entropy(logits).dtype == torch.float32


def _two_tokens():
    """One row, three tokens, the first masked (a prompt token with a ratio that would count if unmasked).
    A = -1. Token 1: r = 2, loss max(2, 1.2) = 2, above c = 1.5 -> dual-clipped to 1.5.
    Token 2: r = 1/4, loss max(0.25, 0.8) = 0.8 (the clipped branch). seq-mean loss (1.5 + 0.8) / 2 = 1.15."""
    old = torch.tensor([[-1.0, -2.0, -1.0]], dtype=F64)
    logp = old + torch.tensor([[5.0, math.log(2.0), math.log(0.25)]], dtype=F64)
    return logp, old, torch.tensor([-1.0], dtype=F64), torch.tensor([[0, 1, 1]])


def test_policy_loss_stats_by_hand():
    logp, old, adv, mask = _two_tokens()
    loss, stats = policy_loss(logp, old, adv, mask, dual_clip=1.5)
    assert loss.item() == pytest.approx(1.15, abs=1e-12)
    assert stats == pytest.approx({"clip_frac": 0.5, "dual_clip_frac": 0.5,
                                   "approx_kl": -(math.log(2.0) + math.log(0.25)) / 2,  # = ln2 / 2
                                   "ratio_mean": (2.0 + 0.25) / 2}, abs=1e-12)


def test_grpo_loss_adds_kl_and_entropy_and_reports_each_term():
    logp, old, adv, mask = _two_tokens()
    ref = logp + torch.tensor([[3.0, 0.0, math.log(2.0)]], dtype=F64)     # K3 on tokens 1, 2: 0 and 1 - ln2
    entropy = torch.tensor([[9.0, 1.0, 2.0]], dtype=F64)
    kl = (1.0 - math.log(2.0)) / 2
    total, stats = grpo_loss(logp, old, adv, mask, ref_logp=ref, entropy=entropy, dual_clip=1.5, kl_beta=0.5,
                             entropy_coef=0.1)
    assert total.item() == pytest.approx(1.15 + 0.5 * kl - 0.1 * 1.5, abs=1e-12)
    assert (stats["pg_loss"], stats["kl"], stats["entropy"]) == pytest.approx((1.15, kl, 1.5), abs=1e-12)
    # with zero coefficients the terms are still reported, but do not enter the loss
    total, stats = grpo_loss(logp, old, adv, mask, ref_logp=ref, entropy=entropy, dual_clip=1.5, kl_beta=0.0)
    assert total.item() == pytest.approx(1.15) and stats["kl"] == pytest.approx(kl) and stats["entropy"] == 1.5
    # clip_low reaches the policy term: token 2 becomes max(0.25, 0.5) = 0.5
    total, _ = grpo_loss(logp, old, adv, mask, clip_low=0.5, dual_clip=1.5, kl_beta=0.0)
    assert total.item() == pytest.approx((1.5 + 0.5) / 2)


def test_defaults_are_the_paper_settings():
    """clip 0.2 both ways, no dual clip, seq-mean (Eq. 8), beta 0.001, no entropy bonus."""
    logp, old, ref, adv, mask, ent = random_batch(0, spread=0.8)   # negative advantages too: a dual clip would act
    got, _ = grpo_loss(logp, old, adv, mask, ref_logp=ref, entropy=ent)
    want, _ = grpo_loss(logp, old, adv, mask, ref_logp=ref, entropy=ent, clip_low=0.2, clip_high=0.2, dual_clip=0.0,
                        agg="seq-mean", kl_beta=0.001, entropy_coef=0.0)
    assert got.item() == want.item()
    assert policy_loss(logp, old, adv, mask)[0].item() == policy_loss(logp, old, adv, mask, clip_low=0.2,
                                                                      clip_high=0.2, agg="seq-mean")[0].item()
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]], dtype=F64)
    m = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert masked_aggregate(x, m).item() == masked_aggregate(x, m, "seq-mean").item()


def test_kl_beta_zero_needs_no_reference_and_errors_say_what_is_missing():
    logp, old, _, adv, mask, _ = random_batch(6)
    _, stats = grpo_loss(logp, old, adv, mask, kl_beta=0.0)
    assert stats["kl"] == 0.0 and stats["entropy"] == 0.0
    with pytest.raises(ValueError, match=r"^kl_beta > 0 needs ref_logp$"):
        grpo_loss(logp, old, adv, mask, kl_beta=0.001)
    with pytest.raises(ValueError, match=r"^entropy_coef > 0 needs entropy$"):
        grpo_loss(logp, old, adv, mask, kl_beta=0.0, entropy_coef=0.001)
    with pytest.raises(ValueError, match="agg must be one of"):
        masked_aggregate(logp, mask, "sum")


def test_token_mean_of_a_single_policy_token_is_its_value():
    x = torch.tensor([[0.0, 3.0, 9.0]], dtype=F64)
    assert masked_aggregate(x, torch.tensor([[0, 1, 0]]), "token-mean").item() == 3.0
    assert masked_aggregate(x, torch.tensor([[0, 0, 0]]), "token-mean").item() == 0.0


def test_results_keep_the_log_prob_dtype():
    """float64 advantages or masks do not upcast a float32 loss."""
    logp, old, _, adv, mask, _ = random_batch(8)
    loss, _ = policy_loss(logp.float(), old.float(), adv, mask)
    assert loss.dtype == torch.float32
    assert masked_aggregate(logp.float(), mask.to(F64)).dtype == torch.float32


def test_log_ratio_clamp_bounds_the_loss_and_the_kl_stat():
    """Deviation 5: log-ratios are clamped to [-20, 20] before exp, for the loss and for approx_kl."""
    old, mask = torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    loss, _ = policy_loss(torch.full((1, 1), 30.0, dtype=F64), old, torch.tensor([-1.0], dtype=F64), mask)
    assert loss.item() == pytest.approx(math.exp(20.0))
    _, stats = policy_loss(torch.full((1, 1), -100.0, dtype=F64), old, torch.tensor([1.0], dtype=F64), mask)
    assert stats["approx_kl"] == 20.0 and stats["ratio_mean"] == pytest.approx(math.exp(-20.0))


def test_k3_kl_is_capped_when_the_policy_gives_a_sampled_token_probability_zero():
    out = k3_kl(torch.tensor([[-math.inf, 0.0]], dtype=F64), torch.tensor([[0.0, -math.inf]], dtype=F64))
    assert out.tolist() == [[10.0, 10.0]]
