"""Initialize-then-expand trees: shapes, exact token ids, node choice, turn caps and the ledger."""

import random

import pytest
import torch

import tg.config_groups
import tg.tree
from tg.agent.policy import load_policy
from tg.agent.protocol import Action, Step, prompt_ids
from tg.agent.warmup import warmed_up_policy
from tg.budget import Ledger, chain_equivalent_budget, ledgers, matched_chain_group, measured_equivalent, recount
from tg.engines.engine import HFEngine, PrefillStats, Sampling
from tg.engines.kvcache import PrefixStore
from tg.loss import token_logprobs
from tg.rollout import Episode, Start
from tg.tree import Node, Tree, choose_nodes, expansion_candidates, sample_trees


def _trees(random_policy, make_env, questions, M, N, L, *, reuse=True, seed=0, rule="paper", max_turns=3):
    model, tok = random_policy
    env = make_env(tok, max_turns=max_turns)
    prompts = [prompt_ids(tok, q.question) for q in questions]
    return sample_trees(HFEngine(model, tok, prefix_reuse=reuse), env, prompts, M=M, N=N, L=L, node_rule=rule,
                        sampling=Sampling(1.0, 0.95, seed), rng=random.Random(seed), max_step_tokens=24)


@pytest.mark.parametrize("shape", [(2, 2, 1), (1, 2, 1), (2, 1, 2), (3, 0, 0)])
def test_leaves_per_tree_and_trajectories_per_question(random_policy, make_env, train_questions, shape):
    M, N, L = shape
    trees, _ = _trees(random_policy, make_env, train_questions[:3], M, N, L)
    assert [len(ts) for ts in trees] == [M] * 3
    assert all(len(t.leaves()) == 1 + L * N for ts in trees for t in ts)
    assert sum(len(t.leaves()) for t in trees[0]) == M * (1 + L * N)


def test_trajectories_are_the_sampled_ids_with_policy_mask(random_policy, make_env, train_questions):
    """A full forward over each stored trajectory reproduces every step's sampled log-probs: the ids
    are exactly the sampled ids, in exactly the context they were sampled in, and the mask marks
    exactly the policy's tokens (observations and prompt are 0)."""
    model, _ = random_policy
    trees, _ = _trees(random_policy, make_env, train_questions[:2], 2, 2, 1)
    for tree in (t for ts in trees for t in ts):
        for leaf in tree.leaves():
            traj = tree.trajectory(leaf)
            ids = torch.tensor([traj.ids])
            with torch.no_grad():
                logp = token_logprobs(model(ids).logits, ids)[0]
            mask = torch.tensor(traj.mask).bool()
            sampled = torch.tensor([lp for s in traj.steps for lp in s.logprobs])
            assert mask.sum() == len(sampled) == traj.policy_tokens
            assert torch.allclose(logp[mask], sampled, atol=1e-4)
            obs = sum(len(s.obs_ids) for s in traj.steps)
            assert (~mask).sum() == len(traj.prompt_ids) + obs


def test_siblings_share_their_parent_prefix(random_policy, make_env, train_questions):
    trees, _ = _trees(random_policy, make_env, train_questions[:2], 2, 2, 1)
    for tree in (t for ts in trees for t in ts):
        for node in tree.nodes:
            kids = node.children
            for a in kids:
                assert tree.context(a)[: len(tree.context(node.id))] == tree.context(node.id)


def test_turn_cap_counts_the_shared_prefix(random_policy, make_env, train_questions):
    trees, _ = _trees(random_policy, make_env, train_questions[:4], 2, 3, 1, max_turns=2)
    for tree in (t for ts in trees for t in ts):
        for leaf in tree.leaves():
            traj = tree.trajectory(leaf)
            assert len(traj.steps) <= 3 and traj.tool_calls <= 2


def test_node_choice_rules_and_reproducibility():
    from tg.agent.protocol import Action, Step
    tree = Tree(0, [1, 2])

    def step(end):
        return Step([5], [] if end else [6], Action("answer" if end else "search", "x"), end)
    a = tree.add_path(0, [step(False), step(False), step(True)])
    tree.add_path(1, [step(True)])
    assert expansion_candidates(tree, "paper") == [1, 2]
    assert expansion_candidates(tree, "official") == [0, 1, 2]
    assert a in tree.leaves() and 0 not in expansion_candidates(tree, "paper")
    picks = [choose_nodes(tree, 2, "paper", random.Random(s)) for s in range(5)]
    assert picks == [choose_nodes(tree, 2, "paper", random.Random(s)) for s in range(5)]
    assert all(sorted(set(p)) == [1, 2] for p in picks)  # distinct when enough candidates
    official = [n for s in range(50) for n in choose_nodes(tree, 2, "official", random.Random(s))]
    assert 0 in official and set(official) <= {0, 1, 2}


def test_ledger_matches_recount_and_reuse_saves_prefill(random_policy, make_env, train_questions):
    qs = train_questions[:3]
    on, st_on = _trees(random_policy, make_env, qs, 2, 2, 1, reuse=True)
    off, st_off = _trees(random_policy, make_env, qs, 2, 2, 1, reuse=False)
    assert [recount(t).generated for t in on] == st_on.generated  # engine count == node-by-node recount
    assert [[n.step and n.step.gen_ids for n in t.nodes] for ts in on for t in ts] == \
           [[n.step and n.step.gen_ids for n in t.nodes] for ts in off for t in ts]  # same trees either way
    for q in range(3):
        assert st_off.prefill_saved[q] == 0 and st_on.prefill_saved[q] > 0
        assert st_on.prefill_computed[q] + st_on.prefill_saved[q] == st_off.prefill_computed[q]
    led = ledgers(on, st_on)
    assert [x.trajectories for x in led] == [6, 6, 6]


def test_paper_budget_formula():
    assert chain_equivalent_budget(2, 2, 1) == 4 and matched_chain_group(2, 2, 1) == 4
    assert chain_equivalent_budget(8, 2, 1) == 16 and chain_equivalent_budget(2, 6, 1) == 8


def test_tree_221_buys_six_trajectories_for_about_four_chains(cfg, make_env, train_questions):
    """The paper's equal-budget pair, measured with the warmed-up policy (docs/paper.md#budget): a (2,2,1) tree
    gives 6 trajectories per question and costs about 4 chains (generated + observation tokens).
    Branches restart mid-episode, so the measured cost is below the formula's 4 (3.53 measured)."""
    policy = load_policy(warmed_up_policy(cfg))
    qs = [q for q in train_questions if q.data_source.endswith("multi")][:16]
    tree, st_tree = _trees(policy, make_env, qs, 2, 2, 1)
    chain, st_chain = _trees(policy, make_env, qs, 4, 0, 0)
    per_q = [measured_equivalent(t, Ledger.total(ledgers(chain, st_chain))) for t in ledgers(tree, st_tree)]
    assert [x.trajectories for x in ledgers(tree, st_tree)] == [6] * len(qs)
    assert chain_equivalent_budget(2, 2, 1) == 4
    assert 2.5 < sum(per_q) / len(per_q) < 4.5, per_q


# Unit tests without a policy: hand-built trees, and `sample_trees` driven by a scripted step loop.

def _step(gen: list[int], end: bool) -> Step:
    """A search step (gen ids, then one observation id) or, with `end`, a final answer step."""
    return Step(list(gen), [] if end else [90], Action("answer" if end else "search", "x"), end)


def test_a_fresh_tree_is_its_root():
    tree = Tree(3, [1, 2])
    assert tree.nodes == [Node(0, -1, None, 0)] and tree.parents() == [-1]
    assert tree.leaves() == [] and tree.path(0) == [] and tree.context(0) == [1, 2]
    assert not tree.nodes[0].is_leaf


def test_add_path_links_depths_contexts_and_trajectories():
    tree = Tree(0, [1, 2])
    s1, s2, s3, s4 = _step([10], False), _step([11, 12], False), _step([13], True), _step([20], True)
    assert tree.add_path(0, [s1, s2, s3]) == 3
    assert tree.add_path(1, [s4]) == 4                      # a branch under node 1
    assert tree.parents() == [-1, 0, 1, 2, 1]
    assert [n.depth for n in tree.nodes] == [0, 1, 2, 3, 2]
    assert [n.children for n in tree.nodes] == [[1], [2, 4], [3], [], []]
    assert tree.leaves() == [3, 4]
    assert tree.path(3) == [s1, s2, s3] and tree.path(4) == [s1, s4]
    assert tree.context(2) == [1, 2, 10, 90, 11, 12, 90]    # prompt, then each step's generated + observation ids
    assert tree.context(4) == [1, 2, 10, 90, 20]
    tree.rewards[4] = 0.5
    assert tree.trajectory(4).ids == [1, 2, 10, 90, 20] and tree.trajectory(4).reward == 0.5
    assert tree.trajectory(3).steps == [s1, s2, s3] and tree.trajectory(3).reward == 0.0  # unscored: 0


def test_expansion_falls_back_to_the_root_when_the_seed_chain_answered_at_once():
    tree = Tree(0, [1])
    tree.add_path(0, [_step([5], True)])
    assert expansion_candidates(tree, "paper") == [0] and expansion_candidates(tree, "official") == [0]
    assert choose_nodes(tree, 3, "paper", random.Random(0)) == [0, 0, 0]


def test_choose_nodes_returns_n_picks_with_replacement_when_candidates_run_short():
    tree = Tree(0, [1])
    tree.add_path(0, [_step([5], False), _step([6], True)])          # one inner node: 1
    for seed in range(5):
        assert choose_nodes(tree, 3, "paper", random.Random(seed)) == [1, 1, 1]
        official = choose_nodes(tree, 4, "official", random.Random(seed))
        assert len(official) == 4 and set(official) <= {0, 1}


class _ScriptedLoop:
    """Stands in for `tg.rollout.run_episodes`: a row started after `turns` steps takes the remaining
    3 - turns steps (searches, then an answer), each with 2 fresh generated ids and, unless final, 1
    observation id. Engine accounting per row: computed = its context length, saved = 1, generated =
    its generated ids. Records each call's arguments, and the store's `keep` flag at call time."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.next_id = 100

    def __call__(self, engine, env, starts, sampling, *, max_step_tokens, max_context_tokens, prefixes=None):
        self.calls.append(dict(engine=engine, env=env, starts=list(starts), sampling=sampling, prefixes=prefixes,
                               keep=None if prefixes is None else prefixes.keep,
                               caps=(max_step_tokens, max_context_tokens)))
        episodes = []
        for i, start in enumerate(starts):
            for _ in range(start.count):
                steps = [_step([self.next_id + 2 * k, self.next_id + 2 * k + 1], k == 2) for k in range(start.turns, 3)]
                self.next_id += 10
                gen = sum(len(s.gen_ids) for s in steps)
                episodes.append(Episode(i, steps, PrefillStats(len(start.context), 1, gen)))
        return episodes


def _sample(monkeypatch, prompts, M, N, L, rng=None, **kw):
    loop = _ScriptedLoop()
    monkeypatch.setattr(tg.tree, "run_episodes", loop)
    trees, stats = sample_trees("engine", "env", prompts, M=M, N=N, L=L, sampling="sampling",
                                rng=rng or random.Random(0), **kw)
    return trees, stats, loop


def test_sample_trees_221_by_hand(monkeypatch):
    """(2,2,1) with three-step seed chains: the paper rule has exactly two inner nodes to pick, so each
    tree gains a two-step branch at node 1 and a one-step branch at node 2: 7 nodes, 3 leaves."""
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9]]
    trees, stats, loop = _sample(monkeypatch, prompts, 2, 2, 1, max_step_tokens=7, max_context_tokens=99)
    assert [[(t.question, t.prompt_ids) for t in ts] for ts in trees] == [[(0, prompts[0])] * 2, [(1, prompts[1])] * 2]
    init, expand = loop.calls
    assert init["starts"] == [Start(prompts[0], 2), Start(prompts[1], 2)]
    for call in loop.calls:
        assert (call["engine"], call["env"], call["sampling"], call["caps"]) == ("engine", "env", "sampling", (7, 99))
        assert isinstance(call["prefixes"], PrefixStore) and call["prefixes"] is init["prefixes"]
    assert expand["keep"] is False                       # the last round's rows are not kept
    flat = [t for ts in trees for t in ts]
    assert expand["starts"] == [Start(t.context(n), 1, n) for t in flat for n in (1, 2)]
    for tree in flat:
        assert tree.parents() == [-1, 0, 1, 2, 1, 4, 2]
        assert tree.leaves() == [3, 5, 6] and [len(tree.path(x)) for x in tree.leaves()] == [3, 3, 3]
    # per question: computed = 2 prompts + contexts of nodes 1 and 2 in both trees; 6 rows; 2 ids a step
    assert stats.prefill_computed == [2 * 4 + 2 * (7 + 10), 2 * 5 + 2 * (8 + 11)]
    assert stats.prefill_saved == [6, 6] and stats.generated == [24, 24]
    assert stats.generated == [recount(ts).generated for ts in trees]
    assert 0.0 <= stats.seconds < 60.0


def test_sample_trees_chains_use_one_call_and_no_prefix_store(monkeypatch):
    trees, stats, loop = _sample(monkeypatch, [[1, 2]], 3, 0, 0)
    assert len(loop.calls) == 1 and loop.calls[0]["prefixes"] is None
    assert loop.calls[0]["caps"] == (500, 4096)          # the default caps: 500 tokens a step, 4096 in all
    assert [len(t.leaves()) for t in trees[0]] == [1, 1, 1] and stats.prefill_saved == [3]


def test_sample_trees_keeps_rows_for_every_round_but_the_last(monkeypatch):
    trees, _, loop = _sample(monkeypatch, [[1, 2]], 1, 1, 3)
    assert [c["keep"] for c in loop.calls] == [True, True, True, False]
    assert len(trees[0][0].leaves()) == 1 + 3 * 1


class _Picks(random.Random):
    """An rng whose `choices` returns a fixed list of picks (the official rule draws with choices)."""

    def __init__(self, picks: list[int]) -> None:
        super().__init__(0)
        self.picks = picks

    def choices(self, population, weights=None, *, cum_weights=None, k=1):
        assert len(self.picks) == k and set(self.picks) <= set(population)
        return list(self.picks)


def test_a_node_picked_k_times_is_one_start_with_count_k(monkeypatch):
    trees, _, loop = _sample(monkeypatch, [[1, 2]], 1, 4, 1, rng=_Picks([2, 0, 2, 2]), node_rule="official")
    tree = trees[0][0]
    assert loop.calls[1]["starts"] == [Start([1, 2], 1, 0), Start(tree.context(2), 3, 2)]
    assert len(tree.nodes[0].children) == 2 and len(tree.nodes[2].children) == 4
    assert len(tree.leaves()) == 5


# Node-selection strategies (NODE_RULES): one interface, three rules.

def _scored(gen: int, entropy: float, end: bool = False) -> Step:
    """A step of `gen` sampled ids whose per-token entropies average `entropy` (nats)."""
    spread = [entropy - 0.1, entropy + 0.1] * (gen // 2) + [entropy] * (gen % 2)
    return Step([5] * gen, [] if end else [90], Action("answer" if end else "search", "x"), end, entropies=spread)


def _chain_tree() -> Tree:
    """Seed chain of inner nodes 1-4 (mean entropies 0.5, 2.0, 2.0, 1.0), a leaf 5 of entropy 9 and a branch
    under node 2 (leaf 6)."""
    tree = Tree(0, [1, 2])
    tree.add_path(0, [_scored(2, 0.5), _scored(3, 2.0), _scored(2, 2.0), _scored(1, 1.0), _scored(4, 9.0, True)])
    tree.add_path(2, [_scored(1, 3.0, True)])
    return tree


def test_node_rules_are_one_registry_with_the_config_names():
    assert list(tg.tree.NODE_RULES) == ["paper", "official", "entropy"] == list(tg.config_groups.NODE_RULE_NAMES)
    assert tg.tree.NODE_RULES["entropy"] is tg.tree.entropy_nodes
    with pytest.raises(ValueError, match="'paper', 'official', 'entropy'; got 'deepest'"):
        choose_nodes(_chain_tree(), 2, "deepest", random.Random(0))
    with pytest.raises(ValueError, match="got 'PAPER'"):
        expansion_candidates(_chain_tree(), "PAPER")


@pytest.mark.parametrize("rule, n, expected", [
    ("paper", 2, [[2, 4], 0.0404844, [2, 3], 0.8474337, [1, 4], 0.0848720, [2, 3], 0.5442292]),
    ("paper", 5, [[4, 4, 2, 2, 3], 0.4049341, [1, 4, 4, 2, 2], 0.4494911, [4, 4, 1, 1, 4], 0.7359700,
                  [1, 3, 2, 3, 3], 0.0655289]),
    ("official", 2, [[4, 3], 0.4205716, [0, 4], 0.7637746, [4, 4], 0.0565514, [1, 2], 0.3699552]),
    ("official", 5, [[4, 3, 2, 1, 2], 0.4049341, [0, 4, 3, 1, 2], 0.4494911, [4, 4, 0, 0, 4], 0.7359700,
                     [1, 2, 1, 3, 3], 0.0655289]),
])
def test_paper_and_official_picks_and_rng_use_are_pinned(rule, n, expected):
    """The picks of four seeds and the rng's next draw after them, as the rules drew before they became
    strategies: the sampled tokens of a seeded run depend on both."""
    tree = Tree(0, [1, 2])
    tree.add_path(0, [_step([5], False)] * 4 + [_step([5], True)])
    tree.add_path(2, [_step([5], True)])
    got = []
    for seed in range(4):
        rng = random.Random(seed)
        got += [choose_nodes(tree, n, rule, rng), pytest.approx(rng.random(), abs=1e-7)]
    assert got == expected


def test_entropy_rule_picks_the_top_mean_entropy_inner_nodes_without_the_rng():
    tree = _chain_tree()
    assert [round(tree.nodes[i].step.mean_entropy, 6) for i in (1, 2, 3, 4)] == [0.5, 2.0, 2.0, 1.0]
    rng = random.Random(7)
    state = rng.getstate()
    assert choose_nodes(tree, 2, "entropy", rng) == [2, 3]          # leaves (entropy 9 and 3) never
    assert choose_nodes(tree, 1, "entropy", rng) == [2]             # a tie goes to the earlier node
    assert choose_nodes(tree, 3, "entropy", rng) == [2, 3, 4]       # sorted, like 'paper'
    assert choose_nodes(tree, 4, "entropy", rng) == [1, 2, 3, 4]
    assert rng.getstate() == state                                  # enough candidates: no draw


def test_entropy_rule_falls_back_to_the_paper_rule_when_candidates_run_short():
    tree = Tree(0, [1])
    tree.add_path(0, [_scored(2, 1.0), _scored(1, 0.2, True)])       # one inner node
    answered = Tree(0, [1])
    answered.add_path(0, [_scored(3, 1.0, True)])                    # none: the root
    for t, n in [(tree, 3), (answered, 2), (answered, 1)]:
        a, b = random.Random(3), random.Random(3)
        assert choose_nodes(t, n, "entropy", a) == choose_nodes(t, n, "paper", b)
        assert a.getstate() == b.getstate()


def test_entropy_rule_needs_the_engine_entropies():
    tree = Tree(0, [1])
    tree.add_path(0, [_step([5, 6], False), _step([7], False), _step([8], True)])   # no entropies reported
    with pytest.raises(ValueError, match="no per-token entropies"):
        choose_nodes(tree, 2, "entropy", random.Random(0))
    assert choose_nodes(tree, 2, "paper", random.Random(0)) == [1, 2]


def test_branch_points_are_the_picked_nodes(monkeypatch):
    trees, _, loop = _sample(monkeypatch, [[1, 2]], 1, 4, 1, rng=_Picks([2, 0, 2, 2]), node_rule="official")
    assert trees[0][0].branch_points() == [0, 2, 2, 2]
    trees, _, _ = _sample(monkeypatch, [[1, 2], [3]], 2, 2, 2)
    assert all(len(t.branch_points()) == 2 * 2 for ts in trees for t in ts)


def test_node_rules_spend_the_same_expansions_from_the_same_seed_chains(cfg, make_env, train_questions):
    """The three rules at (M, N, L) = (2, 2, 1) with the warmed-up policy and one seed: the same seed chains,
    M (1 + L N) trajectories per question and L N branches per tree under every rule (the ledger's trajectory
    count is equal); 'paper' and 'entropy' start their branches at distinct inner nodes, 'entropy' at the two
    of highest mean entropy. Generated tokens differ with the depth of the picks (bench/node_rules.py measures
    them over seeds; docs/paper.md#node-selection-strategies has the numbers)."""
    policy = load_policy(warmed_up_policy(cfg))
    qs = [q for q in train_questions if q.data_source.endswith("multi")][:8]
    grown = {rule: _trees(policy, make_env, qs, 2, 2, 1, rule=rule) for rule in tg.tree.NODE_RULES}
    seed_chains = {rule: [[s.gen_ids for s in t.path(t.leaves()[0])] for ts in trees for t in ts]
                   for rule, (trees, _) in grown.items()}
    assert seed_chains["paper"] == seed_chains["official"] == seed_chains["entropy"]
    ranked = 0
    for rule, (trees, stats) in grown.items():
        assert [x.trajectories for x in ledgers(trees, stats)] == [6] * len(qs)
        assert [recount(ts).generated for ts in trees] == stats.generated
        for tree in (t for ts in trees for t in ts):
            starts = tree.branch_points()
            inner = [n.id for n in tree.nodes[1:len(tree.path(tree.leaves()[0])) + 1] if not n.is_leaf]
            assert len(starts) == 2 and all(not tree.nodes[b].is_leaf for b in starts)
            if rule != "official" and len(inner) >= 2:
                assert len(set(starts)) == 2 and 0 not in starts
            if rule == "entropy" and len(inner) >= 2:
                assert starts == sorted(sorted(inner, key=lambda i: -tree.nodes[i].step.mean_entropy)[:2])
                ranked += 1
    assert ranked >= 4, "too few seed chains with two inner nodes to rank"
