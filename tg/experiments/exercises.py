"""The notebooks' exercise checks: a student's answer against `tg`, with a hint that names the likely mistake.

A build-it-yourself check draws random inputs (chains and empty shapes among them: one-leaf trees, N = 0,
L = 0), tries them from the smallest up, runs the student's function beside `tg` and, at the first case where
the two differ, recomputes the typical wrong answers (population std, intra-tree only, no clipping, the KL's
sign, ...) and names the one the student's output matches (`tg.experiments.lesson.diagnose`), with "you gave X,
tg gives Y" on that case. A float32 answer, or a scalar as shape [1], passes when its values are right. Each
check returns one line for the notebook to print, or raises `NotYet` with the hint.

- `check_f1`              01: precision, recall and F1 of one prediction, by hand (SQuAD F1);
- `check_tree_shape`      02: leaves per tree, trajectories per prompt, budget M (1 + L N / 2) (Eq. 4);
- `check_tree_advantages` 03: A_tree = A_intra + A_inter over a flat batch of leaves (Eq. 6-7);
- `check_grpo_loss`       03: the clipped token-level loss with the K3 KL and the policy-token mask (Eq. 8).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from tg.advantage import group_relative, tree_grpo_parts
from tg.budget import chain_equivalent_budget
from tg.config import TreeConfig
from tg.experiments.lesson import NotYet, diagnose, near
from tg.loss import grpo_loss, k3_kl, masked_aggregate, policy_loss
from tg.reward import f1, normalize_answer


def _fail(key: str, hint: str | None, otherwise: str, example: str = "") -> None:
    if hint is not None:
        raise NotYet(f"exercise {key!r}: not yet: {hint or otherwise}" + (f" ({example})" if example else ""))


def check_f1(prediction: str, gold: str, precision: float, recall: float, f1_value: float) -> str:
    """01: P, R and F1 of `prediction` against one `gold` answer; answers rounded to two decimals pass."""
    words, gold_words = normalize_answer(prediction).split(), normalize_answer(gold).split()
    shared = sum(min(words.count(w), gold_words.count(w)) for w in set(words))
    p, r = shared / max(len(words), 1), shared / max(len(gold_words), 1)   # nothing left after normalising: 0
    raw = prediction.split()
    _fail("01-f1", diagnose(precision, p, {"P divides the shared words by the prediction's words *after* "
                                          "normalising (lowercase, no punctuation, no a/an/the)": 1 / max(len(raw), 1),
                                          "that is R: P divides by the prediction's words": r}, near),
          "P = shared words / the prediction's words, both after normalising")
    _fail("01-f1", diagnose(recall, r, {"that is P: R divides by the gold answer's words": p}, near),
          "R = shared words / the gold answer's words")
    _fail("01-f1", diagnose(f1_value, f1(prediction, [gold]), {"F1 is 2 P R / (P + R), not their mean": (p + r) / 2,
                                                               "F1 is 2 P R / (P + R), not P R": p * r}, near),
          "F1 = 2 P R / (P + R)")
    return f"P = {precision:.4g}, R = {recall:.4g}, F1 = {f1_value:.4g}: correct"


def random_shapes(trials: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """`trials` random (M, N, L), M in 1..8 and N, L in 0..8 (N = 0 or L = 0: a chain), smallest M + N + L first."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(int(m) + 1, int(n), int(l)) for m, n, l in torch.randint(0, 9, (trials, 3), generator=g)]
    return sorted(shapes, key=sum)


def check_tree_shape(fn: Callable[[int, int, int], tuple[int, int, float]], trials: int = 200, seed: int = 0) -> str:
    """02: fn(M, N, L) -> (leaves per tree, trajectories per prompt, budget in chains) on random shapes."""
    for M, N, L in random_shapes(trials, seed):
        t = TreeConfig(M=M, N=N, L=L)
        want = (t.leaves_per_tree, t.group_size, chain_equivalent_budget(M, N, L))
        got = tuple(float(x) for x in fn(M, N, L))
        example = f"(M, N, L) = ({M}, {N}, {L}): you gave {got}, tg gives {tuple(float(x) for x in want)}"
        close = lambda a, b: abs(a - b) < 1e-9
        _fail("02-tree-shape", diagnose(got[0], want[0], {
            "each of the L rounds adds N leaves to a tree: 1 + L N, not 1 + N": 1 + N,
            "the seed chain is a leaf too: 1 + L N": L * N}, close), "a tree has 1 + L N leaves", example)
        _fail("02-tree-shape", diagnose(got[1], want[1], {
            "a prompt gets the leaves of all M trees: M (1 + L N)": 1 + L * N}, close),
              "a prompt has M (1 + L N) trajectories", example)
        _fail("02-tree-shape", diagnose(got[2], want[2], {
            "the printed Eq. 4, M + L N / 2, drops a factor M: every tree has its own L N expansions":
                M + L * N / 2,
            "an expansion starts half-way down a chain on average, so it costs half a chain: M (1 + L N / 2)":
                M * (1 + L * N),
            "each tree also samples its seed chain, a whole chain: M (1 + L N / 2)": M * L * N / 2}, close),
              "the budget is M (1 + L N / 2) chains", example)
    return f"your tree shape matches tg on {trials} random shapes (M in 1..8, N and L in 0..8)"


def random_forest(g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Leaves of 1-3 prompts x 1-4 trees x 1-5 leaves in shuffled order (a quarter of the forests are chains: every
    tree one leaf): rewards [G] float64 from Eq. 13's values {1, 0, 0.8, -0.2} (some trees all equal), tree_ids [G]
    long numbered within each prompt, prompt_ids [G] long."""
    rows = []
    chains = bool(torch.rand(1, generator=g) < 0.25)
    for p in range(int(torch.randint(1, 4, (1,), generator=g))):
        for t in range(int(torch.randint(1, 5, (1,), generator=g))):
            n = 1 if chains else int(torch.randint(1, 6, (1,), generator=g))
            values = torch.tensor([1.0, 0.0, 0.8, -0.2], dtype=torch.float64)
            if torch.rand(1, generator=g) < 0.3:     # a flat tree: every leaf the same
                r = values[torch.randint(4, (1,), generator=g)].repeat(n)
            else:
                r = values[torch.randint(4, (n,), generator=g)]
            rows += [(float(x), t, p) for x in r]
    order = torch.randperm(len(rows), generator=g)
    rewards, trees, prompts = zip(*[rows[i] for i in order])
    return torch.tensor(rewards, dtype=torch.float64), torch.tensor(trees), torch.tensor(prompts)


def _allclose(a: Any, b: Tensor) -> bool:
    """Values equal to 1e-4, in any float dtype; a scalar may come as shape [] or [1]."""
    a = torch.as_tensor(a).detach().to(torch.float64)
    if a.numel() == b.numel() == 1:
        a = a.reshape(b.shape)
    return a.shape == b.shape and bool(torch.allclose(a, b.to(torch.float64), rtol=1e-4, atol=1e-4))


def _short(x: Any) -> str:
    return str([round(v, 3) for v in torch.as_tensor(x).detach().to(torch.float64).flatten().tolist()])


def _advantage_nan_hint(fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> str:
    """Why `fn` gives nan: on one tree of two equal rewards (no eps), else on a tree of one leaf."""
    two = torch.tensor([0.8, 0.8], dtype=torch.float64)
    if torch.isnan(torch.as_tensor(fn(two, torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)))).any():
        return "nan where a tree's leaves all have the same reward (std 0): add eps to the std, so such a group gets 0"
    return ("nan on a tree of one leaf (a chain: tg trains chains as trees of one leaf): with n - 1 the std of one "
            "value is nan; give a group of one leaf advantage 0, as tg does")


def check_tree_advantages(fn: Callable[[Tensor, Tensor, Tensor], Tensor], trials: int = 200, seed: int = 0) -> str:
    """03: fn(rewards, tree_ids, prompt_ids) -> A_tree [G] against `tg.advantage.tree_grpo_parts` (n-1 std,
    eps 1e-6, all-equal groups and groups of one 0) on random forests, chains among them, smallest first."""
    g = torch.Generator().manual_seed(seed)
    failures: list[tuple[str, Any, list[str]]] = []
    for rewards, tree_ids, prompt_ids in sorted((random_forest(g) for _ in range(trials)), key=lambda f: len(f[0])):
        got = fn(rewards.clone(), tree_ids.clone(), prompt_ids.clone())
        parts = tree_grpo_parts(rewards, tree_ids, prompt_ids)
        example = (f"rewards {rewards.tolist()}, tree_ids {tree_ids.tolist()}, prompt_ids {prompt_ids.tolist()}: "
                   f"you gave {_short(got)}, tg gives {_short(parts.total)}")
        if torch.as_tensor(got).shape != rewards.shape:
            _fail("03-tree-advantages", f"one advantage per leaf: shape [{len(rewards)}], you gave shape "
                  f"{list(torch.as_tensor(got).shape)}", "", example)
        if torch.isnan(torch.as_tensor(got, dtype=torch.float64)).any():
            _fail("03-tree-advantages", _advantage_nan_hint(fn), "", example)
        by_tree = group_relative(rewards, tree_ids) + parts.inter
        if not _allclose(got, parts.total):
            failures.append((example, got, [hint for hint, wrong in {
                "that is the intra-tree part alone; Eq. 7 adds the inter-tree part (over all leaves of the prompt)":
                    parts.intra,
                "that is the inter-tree part alone; Eq. 7 adds the intra-tree part (over the leaves of one tree)":
                    parts.inter,
                "population std (divide by n); tg, like torch.std and the official code, divides by n - 1":
                    tree_grpo_parts(rewards, tree_ids, prompt_ids, unbiased=False).total,
                "tree ids are numbered within each prompt: group the intra-tree part by (prompt, tree)": by_tree,
            }.items() if _allclose(got, wrong)]))
    if failures:   # the smallest failing case, and the mistake that fits every failing case
        example, got, hints = failures[0]
        common = [hint for hint in hints if all(hint in f[2] for f in failures)]
        _fail("03-tree-advantages", common[0] if common else "", "A_tree = (R - mean) / (std + eps) within the tree "
              "+ the same within the prompt" + (" (in float32 an all-equal group's std is rounding noise, not 0: "
                                                "compute in the rewards' float64, or give such a group 0)"
                                                if torch.as_tensor(got).dtype == torch.float32 else ""), example)
    return f"my_tree_advantages matches tg.advantage.tree_grpo on {trials} random forests (chains among them)"


def random_tokens(g: torch.Generator) -> dict[str, Tensor]:
    """A random batch for the loss: logp, old_logp, ref_logp [B, T] float64 (ratios far enough from 1 to clip),
    advantages [B] of both signs, mask [B, T] with 1-T policy tokens per row."""
    B, T = (int(x) for x in torch.randint(2, 7, (2,), generator=g))
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.6).double()
    mask[torch.arange(B), torch.randint(T, (B,), generator=g)] = 1.0           # every row has a policy token
    return dict(logp=logp, old_logp=old, ref_logp=ref, advantages=torch.randn(B, generator=g, dtype=torch.float64),
                mask=mask)


def _loss_mistakes(x: dict[str, Tensor], clip: float, beta: float) -> dict[str, Tensor]:
    """Typical wrong losses, each from tg pieces with one thing changed."""
    lp, old, ref, adv, mask = x["logp"], x["old_logp"], x["ref_logp"], x["advantages"], x["mask"]
    pg = policy_loss(lp, old, adv, mask, clip_low=clip, clip_high=clip)[0]
    kl = masked_aggregate(k3_kl(lp, ref), mask)
    ratio = torch.exp(lp - old)
    a = adv[:, None]
    return {
        "no clipping: Eq. 8 takes min(r A, clip(r, 1 - eps, 1 + eps) A) per token":
            policy_loss(lp, old, adv, mask, clip_low=1e9, clip_high=1e9)[0] + beta * kl,
        "the min is of the objective: loss = -min(r A, clip(r) A), not min(-r A, -clip(r) A)":
            masked_aggregate(torch.minimum(-ratio * a, -ratio.clamp(1 - clip, 1 + clip) * a), mask) + beta * kl,
        "the KL term is a penalty: the loss adds + beta KL": pg - beta * kl,
        "K3 of KL(pi_theta || pi_ref) is exp(ref - logp) - (ref - logp) - 1 (you swapped logp and ref)":
            pg + beta * masked_aggregate(k3_kl(ref, lp), mask),
        "that is the K1 estimator (logp - ref); Eq. 8 uses K3: exp(ref - logp) - (ref - logp) - 1":
            pg + beta * masked_aggregate(lp - ref, mask),
        "the KL term is missing: add beta times the K3 estimator": pg,
        "aggregation: Eq. 8 averages each trajectory's policy tokens first, then the trajectories (1/G sum 1/|H_i|)":
            policy_loss(lp, old, adv, mask, clip_low=clip, clip_high=clip, agg="token-mean")[0]
            + beta * masked_aggregate(k3_kl(lp, ref), mask, "token-mean"),
        "the mask: only policy tokens (mask 1) count, in the sums and in |H_i|":
            policy_loss(lp, old, adv, torch.ones_like(mask), clip_low=clip, clip_high=clip)[0]
            + beta * masked_aggregate(k3_kl(lp, ref), torch.ones_like(mask)),
    }


def check_grpo_loss(fn: Callable[..., Tensor], trials: int = 100, seed: int = 0) -> str:
    """03: fn(logp, old_logp, ref_logp, advantages, mask, clip, beta) -> scalar loss = -J of Eq. 8 (seq-mean),
    value and gradient in logp, against `tg.loss.grpo_loss` on random tensors, the smallest batches first."""
    g = torch.Generator().manual_seed(seed)
    cases = [(random_tokens(g), 0.1 + 0.2 * float(torch.rand(1, generator=g)),
              0.05 + 0.5 * float(torch.rand(1, generator=g))) for _ in range(trials)]
    for x, clip, beta in sorted(cases, key=lambda c: c[0]["logp"].numel()):
        want, _ = grpo_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"], ref_logp=x["ref_logp"],
                            clip_low=clip, clip_high=clip, kl_beta=beta)
        logp = x["logp"].clone().requires_grad_(True)
        got = fn(logp, x["old_logp"].clone(), x["ref_logp"].clone(), x["advantages"].clone(), x["mask"].clone(),
                 clip=clip, beta=beta)
        example = (f"B, T = {tuple(logp.shape)}, clip {clip:.3f}, beta {beta:.3f}: you gave {_short(got)}, "
                   f"tg gives {float(want):.5f}")
        _fail("03-grpo-loss", diagnose(got, want, _loss_mistakes(x, clip, beta), _allclose),
              "loss = seq-mean over policy tokens of -min(r A, clip(r) A) + beta K3", example)
        if not torch.is_tensor(got) or got.grad_fn is None:
            _fail("03-grpo-loss", "the value is right but carries no gradient: keep logp in the graph "
                  "(no .item(), .detach() or numpy)", "")
        grad, = torch.autograd.grad(got.sum(), logp)
        tracked = x["logp"].clone().requires_grad_(True)
        tg_grad, = torch.autograd.grad(grpo_loss(tracked, x["old_logp"], x["advantages"], x["mask"],
                                                 ref_logp=x["ref_logp"], clip_low=clip, clip_high=clip,
                                                 kl_beta=beta)[0], tracked)
        if not _allclose(grad, tg_grad):
            _fail("03-grpo-loss", "the value is right but not its gradient in logp: the ratio and the KL must both "
                  "be computed from logp (old_logp and ref_logp are constants)", "", example)
    return f"my_grpo_loss matches tg.loss.grpo_loss (value and gradient) on {trials} random batches"
