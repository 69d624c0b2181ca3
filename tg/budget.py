"""The budget ledger: what a batch of chains or trees cost, per question (Eq. 4; docs/paper.md#budget).

Counts recounted from the trees (generated tokens, observation tokens, tool calls, trajectories)
sit beside the engine's own prefill accounting (computed and saved by reuse) and wall time.
`chain_equivalent_budget` is the paper's expected cost in whole chains, M (1 + L N / 2): the
printed Eq. 4, M B + L N B / 2, drops a factor M on the second term (docs/paper.md#budget); the budgets of
Tables 3, 4 and 7 only match with it. `measured_equivalent` is the same quantity from the ledger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Sequence

from tg.tree import RolloutStats, Tree


@dataclass
class Ledger:
    """Cost of one question's rollouts (or of a batch: `Ledger.total`)."""

    trajectories: int = 0
    """Leaves: root-to-leaf trajectories that become training rows."""
    generated: int = 0
    """Policy tokens sampled (each tree node's step counted once: shared prefixes are not re-sampled)."""
    observation: int = 0
    """Observation tokens appended by the environment."""
    tool_calls: int = 0
    """Searches executed."""
    prefill_computed: int = 0
    """Context tokens the engine actually ran through the model."""
    prefill_saved: int = 0
    """Context tokens not recomputed thanks to prefix reuse."""
    seconds: float = 0.0
    """Wall time (a batch's time split evenly over its questions)."""

    @classmethod
    def total(cls, ledgers: Sequence["Ledger"]) -> "Ledger":
        return cls(**{f.name: sum(getattr(x, f.name) for x in ledgers) for f in fields(cls)})

    def per(self, n: float) -> dict[str, float]:
        return {k: v / n for k, v in asdict(self).items()}


def recount(trees: Sequence[Tree]) -> Ledger:
    """Generated and observation tokens, tool calls and trajectories, counted node by node."""
    steps = [n.step for t in trees for n in t.nodes[1:]]
    return Ledger(trajectories=sum(len(t.leaves()) for t in trees), generated=sum(len(s.gen_ids) for s in steps),
                  observation=sum(len(s.obs_ids) for s in steps), tool_calls=sum(s.is_search for s in steps))


def ledgers(trees: Sequence[Sequence[Tree]], stats: RolloutStats) -> list[Ledger]:
    """One `Ledger` per question from its trees and the engine's accounting."""
    out = []
    for q, ts in enumerate(trees):
        led = recount(ts)
        led.prefill_computed, led.prefill_saved = stats.prefill_computed[q], stats.prefill_saved[q]
        led.seconds = stats.seconds / max(len(trees), 1)
        out.append(led)
    return out


def chain_equivalent_budget(M: int, N: int, L: int) -> float:
    """Expected cost of a (M, N, L) tree in whole chains: M (1 + L N / 2) (Eq. 4 with the factor M).

    >>> chain_equivalent_budget(2, 2, 1), chain_equivalent_budget(1, 2, 1), chain_equivalent_budget(4, 5, 1)
    (4.0, 2.0, 14.0)
    """
    return M * (1 + L * N / 2)


def matched_chain_group(M: int, N: int, L: int) -> int:
    """The chain group size the paper compares a tree with: its budget rounded to the nearest of 2, 4, 8, 16.

    >>> [matched_chain_group(*s) for s in [(1, 2, 1), (2, 2, 1), (2, 6, 1), (6, 3, 1), (4, 5, 1)]]
    [2, 4, 8, 16, 16]
    """
    b = chain_equivalent_budget(M, N, L)
    return min((2, 4, 8, 16), key=lambda g: abs(g - b) / g)


def measured_equivalent(tree: Ledger, chain: Ledger) -> float:
    """One question's tree cost in chains of the same policy: its generated + observation tokens over
    a chain's mean. `tree` is ONE question's ledger (a batch total gives the whole batch's cost);
    `chain` the ledger of any number of chains for the same question(s) (only its per-chain mean is used).
    """
    per_chain = (chain.generated + chain.observation) / max(chain.trajectories, 1)
    return (tree.generated + tree.observation) / max(per_chain, 1e-9)
