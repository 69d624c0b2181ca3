"""Proposition 3.1 (arXiv 2509.21240, App. C) checked numerically to ~1e-12 on toy trees."""

from __future__ import annotations

import pytest
import torch

from tg.theory import (init_theta, intra_tree_grpo_gradient, pair_probabilities, proposition_3_1,
                       sequence_logprob, step_dpo_gradient, toy_tree)

CASES = [dict(seed=s, prefix_steps=p, continuation_steps=c, scale=sc)
         for s, p, c, sc in [(0, 2, 3, 1.0), (1, 0, 1, 0.3), (2, 3, 4, 2.0), (3, 1, 2, 0.0)]]


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_proposition_3_1(case):
    tree = toy_tree(prefix_steps=case["prefix_steps"], continuation_steps=case["continuation_steps"],
                    seed=case["seed"])
    theta = init_theta(tree, seed=case["seed"], scale=case["scale"])
    out = proposition_3_1(theta, tree)
    g = out["grad_log_ratio"]
    assert out["grad_intra"].dtype == torch.float64 and g.abs().max() > 1e-3      # not trivially zero
    close(out["p_win"] + out["p_loss"], torch.tensor(1.0, dtype=torch.float64))
    close(out["grad_dpo"], out["p_loss"] * g)                                     # grad J_DPO = p(loss) g
    close(out["grad_intra"], out["p_win"] * out["p_loss"] * g)                    # grad J_intra = p(w) p(l) g
    close(out["grad_intra"], out["p_win"] * out["grad_dpo"])                      # = p(win) grad J_DPO
    close(out["weight_intra"], out["p_win"] * out["p_loss"])
    # std normalisation only rescales: weight sqrt(p(win) p(loss)), same direction
    close(out["grad_intra_std"], torch.sqrt(out["p_win"] * out["p_loss"]) * g)


def test_pair_probabilities_are_a_sigmoid_of_the_log_ratio():
    tree = toy_tree(seed=5)
    theta = init_theta(tree, seed=5)
    lw = sequence_logprob(theta, tree.features, tree.win)
    ll = sequence_logprob(theta, tree.features, tree.loss)
    p_win, p_loss = pair_probabilities(theta, tree)
    close(p_win, lw.exp() / (lw.exp() + ll.exp()))
    close(p_loss, ll.exp() / (lw.exp() + ll.exp()))


def test_shared_prefix_gets_no_net_intra_push():
    # The same tree with and without a prefix: the intra gradient is unchanged, since
    # p(win) A_win + p(loss) A_loss = 0 multiplies grad log p(prefix).
    tree = toy_tree(prefix_steps=3, seed=6)
    bare = type(tree)(features=tree.features, prefix=(), win=tree.win, loss=tree.loss)
    theta = init_theta(tree, seed=6)
    close(intra_tree_grpo_gradient(theta, tree), intra_tree_grpo_gradient(theta, bare))


def test_dpo_beta_scales_as_expected():
    # grad log sigma(beta Delta) = beta sigma(-beta Delta) grad Delta
    tree = toy_tree(seed=7)
    theta = init_theta(tree, seed=7)
    delta = (sequence_logprob(theta, tree.features, tree.win)
             - sequence_logprob(theta, tree.features, tree.loss))
    g = proposition_3_1(theta, tree)["grad_log_ratio"]
    close(step_dpo_gradient(theta, tree, beta=0.5), 0.5 * torch.sigmoid(-0.5 * delta) * g)


def test_toy_tree_shape():
    tree = toy_tree(prefix_steps=2, continuation_steps=3, n_actions=3, dim=4)
    assert tree.features.shape == (2 + 1 + 2 * 2, 3, 4)
    assert tree.win[0][0] == tree.loss[0][0] == 2 and tree.win[0][1] != tree.loss[0][1]
    assert [s for s, _ in tree.prefix] == [0, 1]
    with pytest.raises(ValueError):
        toy_tree(n_actions=1)
