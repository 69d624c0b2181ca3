"""The clipped token-level GRPO loss with K3 KL and an entropy bonus (Eq. 8 of arXiv 2509.21240).

    J = E[ (1/G) sum_i (1/|H_i|) sum_t min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i)
           - beta D_KL(pi_theta || pi_ref) ],        r_it = pi_theta(y_it) / pi_old(y_it)     (Eq. 8)

and the loss minimised is -J (`gspo_policy_loss` replaces r_it by GSPO's sequence ratio, optim.ratio).
H_i counts only the trajectory's *policy* tokens: `mask` [B, T] is 1 on tokens the policy sampled
and 0 on prompt, observation (`<information>...`) and padding tokens
(docs/paper.md#objective); masked tokens stay in the forward context but get no loss.

Alignment (token in, token out). `token_logprobs(logits, ids)` takes the causal LM's logits [B, T, V]
computed on `ids` [B, T] (logits[:, t] predicts ids[:, t+1]) and returns a [B, T] tensor *aligned with
ids*: position t holds the value for the distribution that produced ids[:, t], i.e. logits[:, t-1].
Position 0 has no predictor and holds 0; it is a prompt token, so the mask over ids is 0 there. All
[B, T] tensors here share this alignment and one mask. The trainer fills them at policy tokens only:
`logprobs_at` and `entropy` on the logits that predict those tokens, 0 elsewhere (tg.trainer).

Aggregation (`agg`, optim.loss_agg) of a per-token quantity x [B, T] under `mask`:
- "seq-mean"   = Eq. 8: mean over each trajectory's policy tokens, then mean over the B rows;
- "token-mean" = the official code: sum over all policy tokens / their number.
Both are means over one call's rows; averaging across micro-batches is the trainer's job.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS = ("seq-mean", "token-mean")
RATIOS = ("token", "sequence")
LOG_RATIO_CLAMP = 20.0
"""The official code clamps log-ratios to [-20, 20] before exp (deviation 5 of `grpo_loss`)."""
KL_CLAMP = 10.0
"""The official `low_var_kl` clamps the K3 value to [-10, 10]."""


def _full_precision(logits: Tensor) -> Tensor:
    """float32 for half / bfloat16 logits (log-softmax in bf16 loses ~2 digits); else unchanged."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def _shift_right(x: Tensor) -> Tensor:
    """[B, T-1] values of logits[:, :-1] -> [B, T] aligned with ids (0 at position 0)."""
    return torch.cat([x.new_zeros(x.shape[0], 1), x], dim=1)


def token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """log pi(ids[:, t] | ids[:, :t]) for each token, aligned with ids (see module docstring).

    Args:
        logits: [B, T, V] causal LM logits computed on `ids` (logits[:, t] predicts ids[:, t+1]).
        ids: [B, T] long, the exact token ids that were sampled / fed.
    Returns:
        [B, T] float log-probs; [:, 0] = 0 (no prediction for the first token).
    """
    return _shift_right(logprobs_at(logits[:, :-1], ids[:, 1:]))        # [B, T-1] -> [B, T]


def logprobs_at(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] for each predicting position: `token_logprobs` without the alignment, for
    logits already picked at the positions that count (the trainer takes them at policy tokens only).

    Args:
        logits: [..., V] logits, each row the distribution that produced its target (half precision is
            computed in float32).
        targets: [...] long, the token ids drawn from those distributions.
    Returns:
        [...] float log-probs.
    """
    x = _full_precision(logits)
    return x.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(x, dim=-1)


def entropy(logits: Tensor) -> Tensor:
    """Entropy in nats of softmax(logits) over the last dimension: H = logsumexp(z) - sum softmax(z) z.

    Args:
        logits: [..., V] (any leading shape; half precision is computed in float32).
    Returns:
        [...] entropies.
    """
    x = _full_precision(logits)
    return torch.logsumexp(x, dim=-1) - (torch.softmax(x, dim=-1) * x).sum(-1)


def masked_aggregate(x: Tensor, mask: Tensor, agg: str = "seq-mean") -> Tensor:
    """Scalar "seq-mean" (Eq. 8) or "token-mean" (official) of x [B, T] over mask [B, T] (1 = keep).

    A row with no policy tokens contributes 0 to "seq-mean" and still counts in its 1/B.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    m = mask.to(x.dtype)
    if agg == "token-mean":
        return (x * m).sum() / m.sum().clamp(min=1)
    per_row = (x * m).sum(-1) / m.sum(-1).clamp(min=1)                    # [B] (1/|H_i|) sum_t
    return per_row.mean()


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """The K3 estimator of KL(pi_theta || pi_ref) per token, as the official `low_var_kl`; [B, T].

    k3 = exp(ref - logp) - (ref - logp) - 1 >= 0, unbiased for the KL under samples from pi_theta.
    The log-ratio is clamped to [-20, 20] and the result to [-10, 10], as in the official code.
    Args: logp, ref_logp: [B, T] log-probs of the sampled tokens under the policy and the reference.
    """
    d = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1.0).clamp(-KL_CLAMP, KL_CLAMP)


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
                clip_high: float = 0.2, dual_clip: float = 0.0,
                agg: str = "seq-mean") -> tuple[Tensor, dict[str, float]]:
    """The clipped surrogate -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), aggregated (Eq. 8).

    Dual clip (c = `dual_clip` > 1; 0 = off): for A < 0 the objective is bounded below by c A,
    i.e. objective = max(min(r A, clip(r) A), c A), so the per-token loss is at most c |A|. This
    stops a token whose ratio r has grown past c from receiving an unbounded push down. For
    A >= 0 nothing changes.

    Args:
        logp: [B, T] log pi_theta of the sampled tokens (carries the gradient).
        old_logp: [B, T] log pi_old of the same tokens (no gradient needed).
        advantages: [B] (one per trajectory, broadcast over tokens) or [B, T].
        mask: [B, T], 1 = policy token.
        clip_low, clip_high: eps_low, eps_high of the ratio clip.
        agg: "seq-mean" (Eq. 8) or "token-mean" (official code).
    Returns:
        (loss scalar, stats) with stats over policy tokens: "clip_frac" (share where the clipped
        branch is active), "dual_clip_frac", "approx_kl" (mean of log pi_old - log pi_theta,
        the official `ppo_kl`), "ratio_mean".
    """
    adv = advantages.to(logp.dtype)                             # e.g. float64 advantages, float32 log-probs
    adv = adv[:, None].expand_as(logp) if adv.dim() == 1 else adv                         # [B, T]
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)                                                          # [B, T]
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)          # = -min(r A, clip(r) A)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip > 0.0:
        dual = (adv < 0) & (loss > -dual_clip * adv)
        loss = torch.where(dual, -dual_clip * adv, loss)        # loss <= c |A| for A < 0
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    with torch.no_grad():
        stats = {"clip_frac": float(((loss_clipped > loss_unclipped).to(m.dtype) * m).sum() / n),
                 "dual_clip_frac": float((dual.to(m.dtype) * m).sum() / n),
                 "approx_kl": float((-log_ratio * m).sum() / n),
                 "ratio_mean": float((ratio * m).sum() / n)}
    return masked_aggregate(loss, mask, agg), stats


def _per_token_mean(x: Tensor, m: Tensor) -> float:
    """Mean over policy tokens of a per-row value x [B] (bool or float), each row counted |y_i| times."""
    return float((x.to(m.dtype)[:, None] * m).sum() / m.sum().clamp(min=1))


def gspo_policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
                     clip_high: float = 0.2, dual_clip: float = 0.0,
                     agg: str = "seq-mean") -> tuple[Tensor, dict[str, float]]:
    """GSPO's sequence-level clipped surrogate (Zheng et al. 2025, arXiv 2507.18071; Table 1's GSPO rows).

        s_i = exp( (1/|y_i|) sum_t (log pi_theta(y_it) - log pi_old(y_it)) )   (length-normalised ratio)
        loss = -(1/B) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    |y_i| counts the row's policy tokens (`mask`); prompt, observation and padding tokens enter neither
    the ratio nor the loss. The gradient on each policy token of row i is -A_i s_i / (B |y_i|) where the
    unclipped branch is active and 0 where the clipped one is: every token of a sequence gets the same
    weight, unlike the token ratio of `policy_loss`. For |y_i| = 1 the two losses coincide.

    Clip range: this takes optim.clip_low / clip_high unchanged (default 0.2 / 0.2), so switching the
    ratio changes one thing. A sequence ratio is a geometric mean of token ratios and stays far closer
    to 1, so 0.2 rarely clips; the GSPO paper uses eps_low = 3e-4, eps_high = 4e-4 (set them with
    `--set optim.clip_low=3e-4 optim.clip_high=4e-4` to run its setting).

    Deviations from GSPO (numbered):
    1. The mean log-ratio is clamped to [-20, 20] before exp, as `policy_loss` (deviation 5 of `grpo_loss`).
    2. `dual_clip` (off by default; GSPO has none) bounds a negative-advantage sequence's loss by c |A_i|.
    3. `agg`: "seq-mean" is GSPO's 1/B mean over sequences; "token-mean" weights each sequence's loss
       by its |y_i| (the per-sequence loss broadcast to its tokens, then the official masked mean).
    4. The sequence-level variant only; GSPO-token (per-token advantages) is not implemented.

    Args:
        logp, old_logp, mask: [B, T] as in `policy_loss`.
        advantages: [B], one per sequence.
        clip_low, clip_high, dual_clip, agg: as in `policy_loss`, applied to s_i.
    Returns:
        (loss scalar, stats) with `policy_loss`'s keys and meanings, each sequence's s_i and clip
        state counted on each of its policy tokens ("approx_kl" stays the token-level mean).
    """
    if advantages.dim() != 1:
        raise ValueError(f"the sequence ratio needs one advantage per row [B], got {tuple(advantages.shape)}")
    m = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)                                                       # [B]
    log_ratio = logp - old_logp                                                           # [B, T]
    seq_log_ratio = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)                      # [B]
    s = torch.exp(seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))                 # [B]
    loss_unclipped = -adv * s
    loss_clipped = -adv * s.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)                                    # [B]
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip > 0.0:
        dual = (adv < 0) & (loss > -dual_clip * adv)
        loss = torch.where(dual, -dual_clip * adv, loss)
    with torch.no_grad():
        stats = {"clip_frac": _per_token_mean(loss_clipped > loss_unclipped, m),
                 "dual_clip_frac": _per_token_mean(dual, m), "ratio_mean": _per_token_mean(s, m),
                 "approx_kl": float((-log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * m).sum()
                                    / m.sum().clamp(min=1))}
    return masked_aggregate(loss[:, None].expand_as(logp), mask, agg), stats


def grpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
              ref_logp: Tensor | None = None, entropy: Tensor | None = None, clip_low: float = 0.2,
              clip_high: float = 0.2, dual_clip: float = 0.0, agg: str = "seq-mean", kl_beta: float = 0.001,
              entropy_coef: float = 0.0, ratio: str = "token") -> tuple[Tensor, dict[str, float]]:
    """Policy loss + kl_beta * K3 KL - entropy_coef * entropy, all with one mask and aggregation.

    Arguments map to OptimConfig: clip_low, clip_high, dual_clip, agg = loss_agg, kl_beta,
    entropy_coef, ratio. `ratio` = "token" is Eq. 8's per-token ratio (`policy_loss`); "sequence" is
    GSPO's length-normalised sequence ratio (`gspo_policy_loss`, the paper's GSPO baseline, Table 1).
    Shapes: logp, old_logp, mask, ref_logp, entropy [B, T]; advantages [B] or [B, T] ([B] for "sequence").
    `ref_logp` is needed when kl_beta > 0, `entropy` (per token, aligned like `ref_logp`, with gradient)
    when entropy_coef > 0; when given with a zero coefficient they are only reported in stats.

    Deviations from Eq. 8 (numbered; defaults follow the paper unless said):
    1. Aggregation: "seq-mean" is Eq. 8 (default); "token-mean" is the official code's masked
       mean over all tokens of a micro-batch, which weights long trajectories more.
    2. Dual clip: off by default (the paper has none); the official code uses c = 3.0.
    3. KL estimator: K3 ("low_var_kl"), clamped to [-10, 10], as App. B.1 and the official code;
       aggregated with the same mask and aggregation as the policy term.
    4. Entropy bonus: off by default (the paper mentions none); the official yaml uses 0.001.
    5. Log-ratio clamp to [-20, 20] before exp (official code; not in the paper). Also eps_low
       and eps_high may differ (the paper has one eps; the code uses 0.2 for both).
    Returns:
        (loss scalar, stats): policy_loss's stats plus "pg_loss", "kl", "entropy" (0 when not given).
    """
    if ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {RATIOS}, got {ratio!r}")
    surrogate = policy_loss if ratio == "token" else gspo_policy_loss
    pg, stats = surrogate(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                          dual_clip=dual_clip, agg=agg)
    total, kl_term, ent_term = pg, pg.new_zeros(()), pg.new_zeros(())
    if kl_beta > 0.0 and ref_logp is None:
        raise ValueError("kl_beta > 0 needs ref_logp")
    if entropy_coef > 0.0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy")
    if ref_logp is not None:  # also computed (for the stats) when kl_beta = 0
        kl_term = masked_aggregate(k3_kl(logp, ref_logp), mask, agg)
        total = total + kl_beta * kl_term
    if entropy is not None:   # monitoring entropy matters even without a bonus (docs/paper.md#official-code)
        ent_term = masked_aggregate(entropy, mask, agg)
        total = total - entropy_coef * ent_term
    stats.update(pg_loss=float(pg.detach()), kl=float(kl_term.detach()), entropy=float(ent_term.detach()))
    return total, stats
