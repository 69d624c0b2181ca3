"""tg.advantage against hand-computed numbers, a per-group loop, and properties (Eq. 5-7)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tg.advantage import group_relative, leaves, node_advantages, tree_grpo, tree_grpo_parts

F64 = torch.float64
S3 = math.sqrt(3.0)


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def loop_reference(rewards, group_ids, eps=1e-6, unbiased=True, singleton="zero"):
    """The obvious per-group loop with torch.mean / torch.std."""
    out = torch.zeros_like(rewards)
    for g in group_ids.unique():
        idx = (group_ids == g).nonzero().squeeze(1)
        r = rewards[idx]
        if len(r) == 1:
            out[idx] = r / (1 + eps) if singleton == "raw" else 0.0
        elif bool((r == r[0]).all()):
            out[idx] = 0.0
        else:
            out[idx] = (r - r.mean()) / (r.std(unbiased=unbiased) + eps)
    return out


# One prompt, two trees of three leaves each (the default M=2, N=2, L=1):
#   tree 0: root -> a, b;  a -> l1, l2;  b -> l3        rewards l1=1, l2=0, l3=1
#   tree 1: root -> c, d;  c -> l4;  d -> l5, l6        rewards l4=0, l5=0, l6=1
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
TREES = [0, 0, 0, 1, 1, 1]
PROMPTS = [7, 7, 7, 7, 7, 7]
# intra, tree 0: mean 2/3, deviations (1/3, -2/3, 1/3), unbiased var (1/9+4/9+1/9)/2 = 1/3, std 1/sqrt3
#   -> (1/sqrt3, -2/sqrt3, 1/sqrt3) = (0.5774, -1.1547, 0.5774)
# intra, tree 1: mean 1/3 -> (-1/sqrt3, -1/sqrt3, 2/sqrt3)
INTRA = [1 / S3, -2 / S3, 1 / S3, -1 / S3, -1 / S3, 2 / S3]
# inter, all six: mean 1/2, deviations +-1/2, unbiased var 6 (1/4) / 5 = 0.3, std 0.5477 -> +-0.9129
I = 0.5 / math.sqrt(0.3)
INTER = [I, -I, I, -I, -I, I]


def test_hand_numbers_unbiased():
    parts = tree_grpo_parts(t(REWARDS), t(TREES, torch.long), t(PROMPTS, torch.long), eps=0.0)
    torch.testing.assert_close(parts.intra, t(INTRA), rtol=0, atol=1e-12)
    torch.testing.assert_close(parts.inter, t(INTER), rtol=0, atol=1e-12)
    # total, tree 0: l1 = 0.5774 + 0.9129 = 1.4902, l2 = -1.1547 - 0.9129 = -2.0676
    torch.testing.assert_close(parts.total, t([1.4902, -2.0676, 1.4902, -1.4902, -1.4902, 2.0676]),
                               rtol=0, atol=1e-4)
    torch.testing.assert_close(parts.total, parts.intra + parts.inter)


def test_hand_numbers_biased():
    # tree 0 with the population std: var (6/9)/3 = 2/9, std sqrt2/3 -> (1/sqrt2, -sqrt2, 1/sqrt2)
    a = group_relative(t([1.0, 0.0, 1.0]), t([0, 0, 0], torch.long), eps=0.0, unbiased=False)
    torch.testing.assert_close(a, t([1 / math.sqrt(2), -math.sqrt(2), 1 / math.sqrt(2)]), rtol=0, atol=1e-12)


def test_eps_is_added_to_std():
    a = group_relative(t([1.0, 0.0]), t([0, 0], torch.long), eps=0.5)
    # mean 0.5, unbiased std sqrt(0.5) = 0.7071 -> 0.5 / 1.2071
    torch.testing.assert_close(a, t([0.5, -0.5]) / (math.sqrt(0.5) + 0.5))


def test_node_advantages_on_hand_drawn_tree():
    # tree 0 above as a parent array: 0 root, 1 a, 2 b, 3 l1, 4 l2, 5 l3
    parents = [-1, 0, 0, 1, 1, 2]
    assert leaves(parents) == [3, 4, 5]
    eff = node_advantages(parents, {3: INTRA[0], 4: INTRA[1], 5: INTRA[2]})
    # a = l1 + l2 = 1/sqrt3 - 2/sqrt3 = -1/sqrt3 = 2 (mean_S - mean_tree) / std = 2 (1/2 - 2/3) sqrt3;
    # b = l3 = 1/sqrt3; root = 0: the prefix shared by all leaves gets a net-zero intra push.
    expected = [0.0, -1 / S3, 1 / S3, 1 / S3, -2 / S3, 1 / S3]
    assert eff == pytest.approx(expected, abs=1e-12)
    # With the total advantage the root keeps the inter part: 0.9129 - 0.9129 + 0.9129 = 0.9129.
    eff_total = node_advantages(parents, torch.tensor([INTRA[k] + INTER[k] for k in range(3)], dtype=F64))
    assert eff_total[0] == pytest.approx(I, abs=1e-12)
    assert eff_total[1] == pytest.approx(-1 / S3, abs=1e-12)   # inter parts of l1, l2 cancel


def test_node_advantages_rejects_bad_input():
    with pytest.raises(ValueError):
        node_advantages([-1, 0, 0], {1: 1.0})          # leaf 2 missing
    with pytest.raises(ValueError):
        node_advantages([1, 0], {})                    # no root
    with pytest.raises(ValueError):
        node_advantages([-1, 2, 1], {})                # a cycle beside the root
    with pytest.raises(ValueError):
        node_advantages([-1, 5], {1: 1.0})             # parent out of range


def test_inter_equals_chain_when_trees_are_single_leaves():
    # N = L = 0: every tree is one chain, so the intra term of a group of one is 0 ("zero")
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=g, dtype=F64)
    prompts = torch.arange(24) // 4
    trees = torch.arange(24)
    chain = tree_grpo(rewards, trees, prompts, mode="chain")
    torch.testing.assert_close(tree_grpo(rewards, trees, prompts, mode="inter"), chain)
    torch.testing.assert_close(tree_grpo(rewards, trees, prompts, mode="intra+inter"), chain)
    assert bool((tree_grpo(rewards, trees, prompts, mode="intra") == 0).all())


def test_modes_select_parts():
    r, tr, pr = t(REWARDS), t(TREES, torch.long), t(PROMPTS, torch.long)
    both = tree_grpo_parts(r, tr, pr)
    intra = tree_grpo_parts(r, tr, pr, mode="intra")
    inter = tree_grpo_parts(r, tr, pr, mode="inter")
    torch.testing.assert_close(intra.total, both.intra)
    torch.testing.assert_close(inter.total, both.inter)
    assert bool((intra.inter == 0).all()) and bool((inter.intra == 0).all())
    with pytest.raises(ValueError):
        tree_grpo(r, tr, pr, mode="tree")


def test_tree_ids_may_be_global_or_per_prompt():
    # the same tree id 0 under two prompts must be two different intra-tree groups
    r = t([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    per_prompt = tree_grpo_parts(r, t([0, 0, 0, 0, 0, 0], torch.long), t([0, 0, 0, 1, 1, 1], torch.long))
    global_ids = tree_grpo_parts(r, t([5, 5, 5, 9, 9, 9], torch.long), t([0, 0, 0, 1, 1, 1], torch.long))
    torch.testing.assert_close(per_prompt.intra, global_ids.intra)


def test_all_equal_group_is_exactly_zero():
    a = group_relative(t([0.1, 0.1, 0.1, 0.7, 0.2]), t([3, 3, 3, 4, 4], torch.long))
    assert a[:3].tolist() == [0.0, 0.0, 0.0]
    assert a[3] > 0 > a[4]


def test_singleton_options():
    r, ids = t([0.8, 1.0, 0.0]), t([0, 1, 1], torch.long)
    assert group_relative(r, ids, singleton="zero")[0].item() == 0.0
    assert group_relative(r, ids, singleton="raw")[0].item() == pytest.approx(0.8 / (1 + 1e-6), abs=1e-15)
    # the other group is unaffected by the option
    torch.testing.assert_close(group_relative(r, ids, singleton="raw")[1:], group_relative(r, ids)[1:])
    with pytest.raises(ValueError):
        group_relative(r, ids, singleton="one")


def test_intra_sums_to_zero_per_tree_and_permutation_invariance():
    g = torch.Generator().manual_seed(1)
    prompts = torch.arange(48) // 12                 # 4 prompts, 2 trees of 6 leaves each
    trees = torch.arange(48) // 6
    rewards = torch.randint(0, 3, (48,), generator=g).to(F64) / 2
    parts = tree_grpo_parts(rewards, trees, prompts)
    sums = torch.zeros(8, dtype=F64).index_add(0, trees, parts.intra)
    torch.testing.assert_close(sums, torch.zeros(8, dtype=F64), rtol=0, atol=1e-12)
    perm = torch.randperm(48, generator=g)
    shuffled = tree_grpo(rewards[perm], trees[perm], prompts[perm])
    torch.testing.assert_close(shuffled, parts.total[perm], rtol=0, atol=1e-12)


def test_empty_and_float32():
    assert group_relative(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    a = group_relative(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert a.dtype == torch.float32


groups = st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.1, 0.2, 0.8, 1.0])) | st.tuples(
    st.integers(0, 5), st.integers(-500, 500).map(lambda k: k / 100)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(groups, st.booleans(), st.sampled_from(["zero", "raw"]))
def test_matches_loop_reference(rows, unbiased, singleton):
    ids = torch.tensor([i for i, _ in rows])
    rewards = torch.tensor([r for _, r in rows], dtype=F64)
    got = group_relative(rewards, ids, unbiased=unbiased, singleton=singleton)
    want = loop_reference(rewards, ids, unbiased=unbiased, singleton=singleton)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(groups)
def test_group_properties(rows):
    ids = torch.tensor([i for i, _ in rows])
    rewards = torch.tensor([r for _, r in rows], dtype=F64)
    adv = group_relative(rewards, ids, eps=0.0)
    for g in ids.unique():
        a, r = adv[ids == g], rewards[ids == g]
        assert abs(a.sum().item()) < 1e-9 * max(1.0, a.abs().max().item())        # centred
        if len(r) > 1 and not bool((r == r[0]).all()):
            # unbiased standardisation: sum of squares = n - 1 (round-off can make tiny spreads inexact)
            assert a.pow(2).sum().item() == pytest.approx(len(r) - 1, rel=1e-6)
        # monotone: a higher reward never gets a lower advantage within a group
        order = torch.argsort(r)
        assert bool((a[order].diff() >= -1e-12).all())


def test_tree_grpo_passes_the_std_and_singleton_options_to_both_parts():
    # population std: tree 0 -> (1/sqrt2, -sqrt2, 1/sqrt2) as above; inter: deviations +-1/2, std 1/2 -> +-1
    r, tr, pr = t(REWARDS), t(TREES, torch.long), t(PROMPTS, torch.long)
    parts = tree_grpo_parts(r, tr, pr, eps=0.0, unbiased=False)
    h = 1 / math.sqrt(2)
    torch.testing.assert_close(parts.intra, t([h, -2 * h, h, -h, -h, 2 * h]), rtol=0, atol=1e-12)
    torch.testing.assert_close(parts.inter, t([1.0, -1.0, 1.0, -1.0, -1.0, 1.0]), rtol=0, atol=1e-12)
    torch.testing.assert_close(tree_grpo(r, tr, pr, eps=0.0, unbiased=False), parts.total, rtol=0, atol=0)
    # one leaf per tree and per prompt: "raw" keeps each reward (eps 0) in both parts, "zero" gives 0
    r1, ids = t([0.3, 0.9]), t([0, 1], torch.long)
    raw = tree_grpo_parts(r1, ids, ids, eps=0.0, singleton="raw")
    torch.testing.assert_close((raw.intra, raw.inter), (r1, r1), rtol=0, atol=0)
    torch.testing.assert_close(tree_grpo(r1, ids, ids, eps=0.0, singleton="raw"), 2 * r1, rtol=0, atol=0)
    assert tree_grpo(r1, ids, ids).tolist() == [0.0, 0.0]


def test_bad_arguments_name_what_is_wrong():
    r, ids = t([1.0, 0.0, 1.0]), t([0, 0], torch.long)
    with pytest.raises(ValueError, match=r"must both be \[G\], got \(3,\) and \(2,\)"):
        group_relative(r, ids)                                     # both 1-D, different lengths
    with pytest.raises(ValueError, match=r"got \(1, 3\) and \(1, 3\)"):
        group_relative(r[None], t([[0, 0, 1]], torch.long))        # same shape, not 1-D
    with pytest.raises(ValueError, match="singleton must be one of"):
        group_relative(r, t([0, 0, 0], torch.long), singleton="one")
    with pytest.raises(ValueError, match="mode must be one of"):
        tree_grpo_parts(r, t([0, 0, 0], torch.long), t([0, 0, 0], torch.long), mode="tree")


def test_node_advantages_sums_down_a_deep_chain_and_a_wide_root():
    # a chain of five nodes: every node carries the single leaf's advantage
    assert node_advantages([-1, 0, 1, 2, 3], {4: 0.25}) == [0.25] * 5
    # a root with four leaf children: the root gets their sum
    assert node_advantages([-1, 0, 0, 0, 0], t([1.0, -2.0, 0.5, 0.25])) == [-0.25, 1.0, -2.0, 0.5, 0.25]


@pytest.mark.parametrize("parents, message", [
    ([-1, -2], "one root"),                    # -2 is no node and not the root marker
    ([-1, 2], "one root"),                     # index == n: out of range
    ([-1, 0, 1, 1, -1], "one root"),           # two roots
    ([-1, 1], "one root"),                     # its own parent
    ([-1, 2, 1], "cycle through node 1"),      # 1 -> 2 -> 1 never reaches the root
])
def test_node_advantages_rejects_what_is_not_one_tree(parents, message):
    with pytest.raises(ValueError, match=message):
        node_advantages(parents, {})


def test_node_advantages_names_a_leaf_mismatch():
    with pytest.raises(ValueError, match=r"tensor must be \[n_leaves\] = \[2\]"):
        node_advantages([-1, 0, 0], t([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"keys \[1\] are not the leaves \[1, 2\]"):
        node_advantages([-1, 0, 0], {1: 1.0})
