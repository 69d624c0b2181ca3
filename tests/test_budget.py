"""The budget ledger (tg.budget) on hand-built trees: recounts, per-question ledgers, chain equivalents."""

from __future__ import annotations

import doctest

import pytest

import tg.budget
from tg.agent.protocol import Action, Step
from tg.budget import Ledger, chain_equivalent_budget, ledgers, matched_chain_group, measured_equivalent, recount
from tg.tree import RolloutStats, Tree


def _search(gen: int, obs: int) -> Step:
    return Step([7] * gen, [8] * obs, Action("search", "q"), False)


def _answer(gen: int) -> Step:
    return Step([7] * gen, [], Action("answer", "a"), True)


def _tree() -> Tree:
    """Seed chain search(3 gen, 5 obs) -> search(2, 4) -> answer(1); a branch at node 1: answer(6).
    Leaves 2; generated 3 + 2 + 1 + 6 = 12 (the shared first step once); observation 9; searches 2."""
    tree = Tree(0, [1, 2, 3])
    tree.add_path(0, [_search(3, 5), _search(2, 4), _answer(1)])
    tree.add_path(1, [_answer(6)])
    return tree


def test_doctests_pass() -> None:
    result = doctest.testmod(tg.budget)
    assert result.attempted >= 2 and result.failed == 0


def test_recount_counts_each_node_once() -> None:
    assert recount([_tree()]) == Ledger(trajectories=2, generated=12, observation=9, tool_calls=2)
    assert recount([_tree(), _tree()]) == Ledger(trajectories=4, generated=24, observation=18, tool_calls=4)
    assert recount([Tree(0, [1])]) == Ledger()


def test_a_search_without_observation_is_not_a_tool_call() -> None:
    tree = Tree(0, [1])
    tree.add_path(0, [Step([7], [], Action("search", "q"), True)])   # cut off by the context cap
    assert recount([tree]).tool_calls == 0


def test_ledgers_take_the_engine_prefill_per_question_and_split_the_time() -> None:
    trees = [[_tree()], [_tree(), _tree()]]
    stats = RolloutStats(prefill_computed=[40, 70], prefill_saved=[5, 9], generated=[12, 24], seconds=3.0)
    first, second = ledgers(trees, stats)
    assert first == Ledger(2, 12, 9, 2, prefill_computed=40, prefill_saved=5, seconds=1.5)
    assert second == Ledger(4, 24, 18, 4, prefill_computed=70, prefill_saved=9, seconds=1.5)
    assert ledgers([], RolloutStats([], [], [], 0.0)) == []
    (only,) = ledgers([[_tree()]], RolloutStats([40], [5], [12], 3.0))
    assert only.seconds == 3.0                                  # one question takes the whole batch's time


def test_ledger_total_and_per() -> None:
    a = Ledger(1, 2, 3, 4, 5, 6, 0.5)
    b = Ledger(10, 20, 30, 40, 50, 60, 1.5)
    assert Ledger.total([a, b]) == Ledger(11, 22, 33, 44, 55, 66, 2.0)
    assert Ledger.total([]) == Ledger()
    assert b.per(10) == dict(trajectories=1.0, generated=2.0, observation=3.0, tool_calls=4.0, prefill_computed=5.0,
                             prefill_saved=6.0, seconds=0.15)


def test_chain_equivalent_budget_is_m_times_one_plus_half_ln() -> None:
    assert chain_equivalent_budget(4, 0, 0) == 4.0                  # chains cost themselves
    assert chain_equivalent_budget(2, 2, 1) == 4.0                  # two chains + two half-chain branches
    assert chain_equivalent_budget(1, 3, 2) == 4.0
    assert chain_equivalent_budget(8, 2, 1) == 16.0 and chain_equivalent_budget(2, 6, 1) == 8.0


@pytest.mark.parametrize("shape, group", [
    ((1, 1, 1), 2),          # budget 1.5: below the smallest group
    ((2, 1, 1), 4),          # budget 3: 4/3 off beats 2 (3/2 off): nearest by ratio, not by difference
    ((2, 4, 1), 8),          # budget 6: |8 - 6| / 8 = 0.25 beats |4 - 6| / 4 = 0.5
    ((4, 2, 2), 16),         # budget 12: 0.25 from 16 beats 0.5 from 8
    ((16, 2, 1), 16),        # budget 32: beyond the largest group
])
def test_matched_chain_group_is_the_nearest_group_by_relative_distance(shape, group) -> None:
    assert matched_chain_group(*shape) == group


def test_measured_equivalent_divides_by_the_mean_chain() -> None:
    chain = Ledger(trajectories=4, generated=100, observation=20)     # 30 tokens a chain
    tree = Ledger(trajectories=6, generated=80, observation=25)       # 105 tokens
    assert measured_equivalent(tree, chain) == pytest.approx(3.5)
    assert measured_equivalent(tree, Ledger(trajectories=1, generated=30)) == pytest.approx(3.5)
    assert measured_equivalent(tree, Ledger(trajectories=2, generated=1)) == pytest.approx(210.0)  # 0.5 a chain
    assert measured_equivalent(Ledger(), Ledger()) == 0.0                                           # nothing spent
