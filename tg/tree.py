"""Tree rollouts: initialize-then-expand sampling (Algorithm 1 of arXiv 2509.21240).

A tree node is one whole agent step (think, action, observation); the root holds the prompt.
For each prompt: M independent chains seed M trees (initialisation); then L rounds, each picking N
nodes per tree (the node-selection strategy `NODE_RULES[node_rule]`: 'paper', 'official' or 'entropy')
and continuing each from its full root-to-node context with the same step loop until the episode
ends; each continuation becomes a new branch under the picked node. Leaves per tree =
1 + L N; trajectories per prompt = M (1 + L N). Chains are the case N = L = 0: the same code path.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tg.agent.env import Environment
from tg.agent.protocol import Step, Trajectory
from tg.engines.engine import Engine, Sampling
from tg.engines.kvcache import PrefixStore
from tg.rollout import Start, run_episodes


@dataclass
class Node:
    """A step node. `step` is None for the root (the prompt)."""

    id: int
    parent: int
    """Parent node id; -1 for the root."""
    step: Step | None
    depth: int
    """Steps from the root to this node (root 0); a branch from here has max_turns - depth turns left."""
    children: list[int] = field(default_factory=list)

    @property
    def is_leaf(self) -> bool:
        return self.step is not None and self.step.ends_episode


@dataclass
class Tree:
    """One tree of one prompt. Nodes are stored in creation order (the root is node 0)."""

    question: int
    """Index of the question in the batch."""
    prompt_ids: list[int]
    nodes: list[Node] = field(default_factory=list)
    rewards: dict[int, float] = field(default_factory=dict)
    """Leaf id -> outcome reward (filled by the caller's scorer)."""

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes.append(Node(0, -1, None, 0))

    def add_path(self, parent: int, steps: Sequence[Step]) -> int:
        """Insert `steps` as a new branch under `parent`; returns the new leaf's id."""
        for step in steps:
            node = Node(len(self.nodes), parent, step, self.nodes[parent].depth + 1)
            self.nodes[parent].children.append(node.id)
            self.nodes.append(node)
            parent = node.id
        return parent

    def path(self, node: int) -> list[Step]:
        """The steps from the root to `node`, in order."""
        steps = []
        while node > 0:
            steps.append(self.nodes[node].step)
            node = self.nodes[node].parent
        return steps[::-1]

    def context(self, node: int) -> list[int]:
        """Exact token ids of the prompt plus every step up to and including `node`."""
        return self.prompt_ids + [t for s in self.path(node) for t in s.ids]

    def leaves(self) -> list[int]:
        return [n.id for n in self.nodes if n.is_leaf]

    def trajectory(self, leaf: int) -> Trajectory:
        return Trajectory(self.prompt_ids, self.path(leaf), reward=self.rewards.get(leaf, 0.0))

    def branch_points(self) -> list[int]:
        """The node each expansion started from, one entry per branch (a node picked k times k times), in node
        order: every child after a node's first hangs off an expansion. A grown tree has L N of them."""
        return [n.id for n in self.nodes for _ in n.children[1:]]

    def parents(self) -> list[int]:
        """The parent array (root -1), as `tg.advantage.node_advantages` takes it."""
        return [n.parent for n in self.nodes]


NodeRule = Callable[[Tree, int, random.Random], list[int]]
"""A node-selection strategy: (tree, N, rng) -> the N nodes (ids; a repeat means several branches) one
expansion round of that tree continues. A pure function of the tree and the rng's state."""


def inner_nodes(tree: Tree) -> list[int]:
    """The tree's non-leaf step nodes (the root excluded), in creation order."""
    return [n.id for n in tree.nodes[1:] if not n.is_leaf]


def expansion_candidates(tree: Tree, rule: str) -> list[int]:
    """Nodes an expansion may start from under `rule`.

    'paper', 'entropy': the tree's non-leaf step nodes (the root excluded). If there are none (the seed
                        chain answered in its first step), the root: a deviation, as the paper leaves it open.
    'official'        : the root plus every non-leaf step node, as the official code's get_expand_node.
    """
    _check_rule(rule)
    inner = inner_nodes(tree)
    if rule == "official":
        return [0] + inner
    return inner or [0]


def paper_nodes(tree: Tree, n: int, rng: random.Random) -> list[int]:
    """The paper's rule (§3.1, Algorithm 1): N distinct non-leaf step nodes uniformly at random, sorted.

    Deviations, where the paper leaves the case open:
    1. With fewer than N candidates (a seed chain with a single search step) it draws N with replacement
       (`rng.choices`).
    2. With no non-leaf step node (the seed chain answered in its first step) it branches from the root.
    """
    cands = expansion_candidates(tree, "paper")
    if len(cands) >= n:
        return sorted(rng.sample(cands, n))
    return rng.choices(cands, k=n)


def official_nodes(tree: Tree, n: int, rng: random.Random) -> list[int]:
    """The official code's rule (get_expand_node): N draws with replacement over the root and every non-leaf
    node (`rng.choices`). A fresh chain from the root and repeated picks are possible, and the mean start depth
    is lower: for a T-step chain an expansion costs about (T+1)/(2T) of a chain instead of the paper's 1/2."""
    return rng.choices(expansion_candidates(tree, "official"), k=n)


def entropy_nodes(tree: Tree, n: int, rng: random.Random) -> list[int]:
    """The N non-leaf step nodes whose step the policy sampled with the highest mean token entropy, sorted.

    Entropy-guided branching spends the expansions where the policy was least certain: ARPO (arXiv
    2507.19849) branches after tool calls when token entropy rises, AEPO (arXiv 2510.14545) balances
    that branching, TreeRL (arXiv 2506.11902) forks at the highest-entropy tokens. Here the score of a
    node is `Step.mean_entropy`, which the engine reported while sampling the step (`GenOut.entropies`):
    no extra forward, and each tree still makes N expansions a round, as under 'paper'.
    Ties go to the earlier node (lower id), so the picks are a function of the tree alone.

    Deviations from those methods (they are not Tree-GRPO rules):
    1. The unit is a step node, not a token: a branch starts after the node's observation, at a step boundary.
    2. The score is the mean over the node's own step; the step a branch replaces (the node's child on the
       seed chain) is not what is scored.
    3. With fewer than N non-leaf nodes it falls back to `paper_nodes`, drawing from `rng`; otherwise `rng`
       is not consumed.
    """
    inner = inner_nodes(tree)
    if len(inner) < n:
        return paper_nodes(tree, n, rng)
    return sorted(sorted(inner, key=lambda i: (-tree.nodes[i].step.mean_entropy, i))[:n])


NODE_RULES: dict[str, NodeRule] = {"paper": paper_nodes, "official": official_nodes, "entropy": entropy_nodes}
"""`tree.node_rule` -> its strategy."""


def _check_rule(rule: str) -> None:
    if rule not in NODE_RULES:
        raise ValueError(f"node_rule must be one of {', '.join(map(repr, NODE_RULES))}; got {rule!r}")


def choose_nodes(tree: Tree, n: int, rule: str, rng: random.Random) -> list[int]:
    """Pick N expansion nodes of one tree with strategy `NODE_RULES[rule]`, reproducibly from `rng`."""
    _check_rule(rule)
    return NODE_RULES[rule](tree, n, rng)


@dataclass
class RolloutStats:
    """Engine accounting per question (the ledger adds counts recounted from the trees)."""

    prefill_computed: list[int]
    prefill_saved: list[int]
    generated: list[int]
    """Tokens the engine sampled per question (the ledger's recount from the trees must match)."""
    seconds: float


def sample_trees(engine: Engine, env: Environment, prompts: Sequence[list[int]], *, M: int, N: int, L: int,
                 sampling: Sampling, rng: random.Random, node_rule: str = "paper", max_step_tokens: int = 500,
                 max_context_tokens: int = 4096) -> tuple[list[list[Tree]], RolloutStats]:
    """Initialize-then-expand for a batch of prompts; returns M trees per prompt and engine accounting.

    `node_rule` names the node-selection strategy (`NODE_RULES`); `rng` is consumed only by it, so the
    seed chains do not depend on the rule. Every round batches all trees of all prompts into one
    `run_episodes` call. A node picked k times is one start with count k, so its context is prefilled
    once (prefix reuse) and k branches decode; and a branch starts from the kept cache of the chain it
    branches from (`PrefixStore`), so only its last context token is prefilled.
    """
    t0 = time.perf_counter()
    trees = [[Tree(q, list(p)) for _ in range(M)] for q, p in enumerate(prompts)]
    computed, saved, generated = [0] * len(prompts), [0] * len(prompts), [0] * len(prompts)
    kw = dict(max_step_tokens=max_step_tokens, max_context_tokens=max_context_tokens)
    store = PrefixStore() if L else None  # this rollout's finished rows; dropped with it (new weights next)

    def run(starts: list[Start], targets: list[list[tuple[Tree, int]]]) -> None:
        eps = run_episodes(engine, env, starts, sampling, prefixes=store, **kw)
        slots = [slot for t in targets for slot in t]
        for ep, (tree, parent) in zip(eps, slots):
            tree.add_path(parent, ep.steps)
            computed[tree.question] += ep.prefill.computed
            saved[tree.question] += ep.prefill.saved
            generated[tree.question] += ep.prefill.generated

    run([Start(list(p), M) for p in prompts], [[(t, 0) for t in ts] for ts in trees])
    for round_ in range(L):
        store.keep = round_ < L - 1
        starts, targets = [], []
        for tree in (t for ts in trees for t in ts):
            picks = choose_nodes(tree, N, node_rule, rng)
            for node in sorted(set(picks)):
                k = picks.count(node)
                starts.append(Start(tree.context(node), k, tree.nodes[node].depth))
                targets.append([(tree, node)] * k)
        run(starts, targets)
    return trees, RolloutStats(computed, saved, generated, time.perf_counter() - t0)
