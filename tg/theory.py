"""Proposition 3.1 of arXiv 2509.21240, checked exactly: intra-tree GRPO = step-level DPO x p(win).

Assumptions of the derivation (paper §3.3, App. C; docs/paper.md#proposition-31), all built into the functions below:
1. Binary outcome (Assumption 3.1): at the branching node (x, H_<t) the continuations fall into
   two classes, H^win_>=t with reward 1 and H^loss_>=t with reward 0. One sequence of steps
   stands for each class here.
2. Pair normalisation: p(win) = sigma(log p(win | x, H_<t) - log p(loss | x, H_<t)) and
   p(loss) = 1 - p(win), where log p(c | .) = sum over the continuation's steps of log pi_theta.
3. Intra-tree GRPO in expectation over the two continuations drawn with p(win), p(loss); the
   baseline is the probability-weighted mean reward 1 p(win) + 0 p(loss) = p(win); the std
   normalisation is ignored (an option shows it only rescales the weight by 1/sqrt(p(win) p(loss))).
4. Step-level DPO with beta = 1: J_DPO = log sigma(Delta), Delta = log p(win|.) - log p(loss|.).
   A fixed reference policy only shifts Delta by a constant, so it drops out of the gradient.

Then, with g = grad log p(win) - grad log p(loss),
    grad J_DPO = p(loss) g,    grad J_intra = p(win) p(loss) g  =  p(win) grad J_DPO.

The toy policy is log-linear: pi_theta(a | s) = softmax_a(features[s] @ theta), with theta [d] and
features [S, K, d] (S states = tree nodes, K actions = steps), in float64. Shared parameters make
grad log p(win) and grad log p(loss) overlap, so the identity is not trivially true per coordinate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

Step = tuple[int, int]
"""(state, action): the policy in state `state` takes step `action`."""


@dataclass(frozen=True)
class ToyTree:
    """A tree with one branching node: root -> prefix steps -> branch -> win / loss continuations."""

    features: Tensor
    """[S, K, d] float64: features of action k in state s."""
    prefix: tuple[Step, ...]
    """H_<t: the steps from the root to the branching node, shared by both leaves."""
    win: tuple[Step, ...]
    """H^win_>=t (reward 1); its first step is taken in the branching state."""
    loss: tuple[Step, ...]
    """H^loss_>=t (reward 0); same first state as `win`, a different first action."""


def toy_tree(prefix_steps: int = 2, continuation_steps: int = 3, n_actions: int = 3, dim: int = 4,
             seed: int = 0) -> ToyTree:
    """A random ToyTree: states 0..P-1 on the prefix, P = the branching state, then each branch's own."""
    if continuation_steps < 1 or n_actions < 2:
        raise ValueError("need continuation_steps >= 1 and n_actions >= 2")
    gen = torch.Generator().manual_seed(seed)
    n_states = prefix_steps + 1 + 2 * (continuation_steps - 1)
    features = torch.randn(n_states, n_actions, dim, generator=gen, dtype=torch.float64)
    actions = torch.randint(n_actions, (n_states,), generator=gen).tolist()     # the step taken in each state
    prefix = tuple((s, actions[s]) for s in range(prefix_steps))
    branch = prefix_steps
    first_win, first_loss = actions[branch], (actions[branch] + 1) % n_actions   # they must differ
    win_states = list(range(branch + 1, branch + continuation_steps))
    loss_states = list(range(branch + continuation_steps, n_states))
    win = ((branch, first_win),) + tuple((s, actions[s]) for s in win_states)
    loss = ((branch, first_loss),) + tuple((s, actions[s]) for s in loss_states)
    return ToyTree(features=features, prefix=prefix, win=win, loss=loss)


def init_theta(tree: ToyTree, seed: int = 0, scale: float = 1.0) -> Tensor:
    """Random policy parameters theta [d] (float64) for `tree`."""
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(tree.features.shape[-1], generator=gen, dtype=torch.float64)


def sequence_logprob(theta: Tensor, features: Tensor, steps: tuple[Step, ...]) -> Tensor:
    """log p_theta(steps) = sum over steps of log pi_theta(a | s); a scalar (differentiable in theta)."""
    logpi = torch.log_softmax(features @ theta, dim=-1)                  # [S, K]
    if not steps:
        return logpi.new_zeros(())
    s, a = zip(*steps)
    return logpi[list(s), list(a)].sum()


def pair_probabilities(theta: Tensor, tree: ToyTree) -> tuple[Tensor, Tensor]:
    """(p(win), p(loss)) normalised within the pair (assumption 2); scalars."""
    delta = sequence_logprob(theta, tree.features, tree.win) - sequence_logprob(theta, tree.features, tree.loss)
    return torch.sigmoid(delta), torch.sigmoid(-delta)


def _grad(objective_of_theta: Callable[[Tensor], Tensor], theta: Tensor) -> Tensor:
    """d objective / d theta at `theta`, by autograd on a fresh leaf copy; [d]."""
    t = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(objective_of_theta(t), t)
    return g


def intra_tree_grpo_gradient(theta: Tensor, tree: ToyTree, normalise_std: bool = False) -> Tensor:
    """grad J_intra = sum_c p(c) A_c grad log p_theta(prefix + c), c in {win, loss}; [d] (assumption 3).

    A_c = R_c - p(win) (baseline = probability-weighted mean); with `normalise_std`, divided by the
    std sqrt(p(win) p(loss)) of the binary reward. Each leaf is a whole root-to-leaf row, so the
    shared prefix is in both log-probs; its net push, (sum_c p(c) A_c) grad log p(prefix), is 0.
    """
    p_win, p_loss = (p.detach() for p in pair_probabilities(theta, tree))
    adv_win, adv_loss = 1.0 - p_win, 0.0 - p_win
    if normalise_std:
        std = torch.sqrt(p_win * p_loss)
        adv_win, adv_loss = adv_win / std, adv_loss / std

    def surrogate(t: Tensor) -> Tensor:  # weights are constants: the score-function gradient
        lp_prefix = sequence_logprob(t, tree.features, tree.prefix)
        lp_win = lp_prefix + sequence_logprob(t, tree.features, tree.win)
        lp_loss = lp_prefix + sequence_logprob(t, tree.features, tree.loss)
        return p_win * adv_win * lp_win + p_loss * adv_loss * lp_loss

    return _grad(surrogate, theta)


def step_dpo_gradient(theta: Tensor, tree: ToyTree, beta: float = 1.0) -> Tensor:
    """grad J_DPO with J_DPO = log sigma(beta Delta), Delta = log p(win|.) - log p(loss|.); [d]."""
    def objective(t: Tensor) -> Tensor:
        delta = sequence_logprob(t, tree.features, tree.win) - sequence_logprob(t, tree.features, tree.loss)
        return torch.nn.functional.logsigmoid(beta * delta)

    return _grad(objective, theta)


def proposition_3_1(theta: Tensor, tree: ToyTree) -> dict[str, Tensor]:
    """Both gradients of Proposition 3.1 and the closed forms they should equal.

    Returns a dict of float64 tensors:
        p_win, p_loss: pair-normalised probabilities (scalars);
        grad_log_ratio: g = grad log p(win) - grad log p(loss), [d];
        grad_intra, grad_dpo: autograd gradients of intra-tree GRPO and step-level DPO (beta = 1), [d];
        weight_intra = p(win) p(loss), weight_dpo = p(loss): Prop. 3.1 says grad = weight * g;
        grad_intra_std: intra-tree gradient with std normalisation, = sqrt(p(win) p(loss)) g.
    """
    p_win, p_loss = (p.detach() for p in pair_probabilities(theta, tree))
    g_win = _grad(lambda t: sequence_logprob(t, tree.features, tree.win), theta)
    g_loss = _grad(lambda t: sequence_logprob(t, tree.features, tree.loss), theta)
    return {"p_win": p_win, "p_loss": p_loss, "grad_log_ratio": g_win - g_loss,
            "grad_intra": intra_tree_grpo_gradient(theta, tree),
            "grad_dpo": step_dpo_gradient(theta, tree, beta=1.0),
            "weight_intra": p_win * p_loss, "weight_dpo": p_loss,
            "grad_intra_std": intra_tree_grpo_gradient(theta, tree, normalise_std=True)}
