"""Step groups without trees (GiGPO's anchor states, tg.advantage.step_group_advantages) on hand-built chains."""

from __future__ import annotations

import math

import pytest
import torch

from tg.advantage import combine_step_advantages, group_relative, observation_prefixes, step_group_advantages
from tg.agent.protocol import Step
from tg.batch import build_rows, chain_states
from tg.config import ConfigError
from tg.tree import Tree

F64 = torch.float64


def test_observation_prefixes_are_the_states_before_each_step():
    assert observation_prefixes(["a", "b"]) == [(), ("a",), ("a", "b")]
    assert observation_prefixes([]) == [()]


def test_two_chains_sharing_their_first_observation_form_a_group_at_step_2():
    """Chains 0 and 1 both saw observation "x" after step 1; chain 2 saw "y" (a singleton state)."""
    rewards = torch.tensor([1.0, 0.0, 1.0], dtype=F64)
    states = [observation_prefixes(o) for o in (["x"], ["x"], ["y"])]
    step = step_group_advantages(rewards, [0, 0, 0], states)
    # step 1: state () is shared by all three chains -> the episode group: mean 2/3, n-1 std 1/sqrt(3)
    hi, lo = (1 / 3) / (1 / math.sqrt(3) + 1e-6), (-2 / 3) / (1 / math.sqrt(3) + 1e-6)   # 0.57735, -1.15470
    # step 2: {chain 0, chain 1} from ("x",): rewards 1, 0, mean 1/2, std 1/sqrt(2); chain 2 alone -> 0
    pair = 0.5 / (1 / math.sqrt(2) + 1e-6)                                             # 0.70711
    expected = torch.tensor([[hi, pair], [lo, -pair], [hi, 0.0]], dtype=F64)
    torch.testing.assert_close(step, expected, rtol=0, atol=1e-12)
    episode = group_relative(rewards, torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(step[:, 0], episode, rtol=0, atol=0)                    # deviation 3


def test_states_group_only_within_a_prompt_and_ragged_chains_pad_with_zero():
    """State ("x",) is reached in prompt p (chain 0) and in prompt q (chain 1): two singletons, not a pair."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64)
    states = [[(), ("x",)], [(), ("x",)], [()], [(), ("y",), ("y", "z")]]
    step = step_group_advantages(rewards, ["p", "q", "p", "q"], states)
    pair = 0.5 / (1 / math.sqrt(2) + 1e-6)                # state () per prompt: rewards 1, 0 -> +-0.70711
    expected = torch.tensor([[pair, 0, 0], [-pair, 0, 0], [-pair, 0, 0], [pair, 0, 0]], dtype=F64)
    torch.testing.assert_close(step, expected, rtol=0, atol=1e-12)


def test_a_discounted_return_separates_steps_of_different_distance_to_the_end():
    """gamma < 1: from state (), chain 0 ends after 1 step (return 1), chain 1 after 2 (return 0.5)."""
    step = step_group_advantages(torch.tensor([1.0, 1.0], dtype=F64), [0, 0], [[()], [(), ("x",)]], gamma=0.5)
    d = 0.25 / (math.sqrt(0.125) + 1e-6)                  # mean 0.75, n-1 std sqrt(0.125)
    torch.testing.assert_close(step, torch.tensor([[d, 0.0], [-d, 0.0]], dtype=F64), rtol=0, atol=1e-12)


def test_combine_adds_omega_times_the_step_advantage():
    episode, step = torch.tensor([1.0, -1.0]), torch.tensor([[0.5, 2.0], [0.0, -4.0]])
    assert combine_step_advantages(episode, step, omega=0.5).tolist() == [[1.25, 2.0], [-1.0, -3.0]]
    assert torch.equal(combine_step_advantages(episode, torch.zeros(2, 2)), episode[:, None].expand(2, 2))


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="one entry per chain"):
        step_group_advantages(torch.ones(2), [0], [[()], [()]])


def test_discount_grows_with_the_distance_to_the_end_and_options_reach_the_normaliser():
    """gamma = 0.5 on 3-step chains: step k's return is 0.5^(2 - k) R, so step 1 groups returns 0.5 R;
    `unbiased` and `singleton` are passed to `group_relative`; no chains give an empty [0, 0] result."""
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    states = [[(), ("x",), ("x", "u")], [(), ("x",), ("x", "v")]]
    step = step_group_advantages(rewards, [0, 0], states, gamma=0.5)
    d1 = 0.25 / (math.sqrt(0.125) + 1e-6)                 # step 1: returns 0.5, 0 -> mean 0.25, n-1 std sqrt(0.125)
    torch.testing.assert_close(step[:, 1], torch.tensor([d1, -d1], dtype=F64), rtol=0, atol=1e-12)
    assert step[:, 2].tolist() == [0.0, 0.0]              # different last states: singletons
    biased = step_group_advantages(rewards, [0, 0], states, unbiased=False)
    assert biased[0, 0].item() == pytest.approx(0.5 / (0.5 + 1e-6))     # population std 0.5
    raw = step_group_advantages(rewards, [0, 0], states, singleton="raw")
    assert raw[0, 2].item() == pytest.approx(1 / (1 + 1e-6))             # a singleton's raw R / (1 + eps)
    assert step_group_advantages(torch.zeros(0), [], []).shape == (0, 0)


def test_combine_defaults_to_omega_one():
    episode, step = torch.tensor([1.0]), torch.tensor([[0.5]])
    assert combine_step_advantages(episode, step).tolist() == [[1.5]]


# ---- in the trainer (optim.step_groups) ----------------------------------------------------------------------

def _step(gen, obs, end=False):
    from tg.agent.protocol import Action
    return Step(gen_ids=gen, obs_ids=obs, action=Action("search" if obs else "answer", "q"), ends_episode=end)


def test_build_rows_gives_every_token_of_a_step_its_step_advantage():
    """Prompt [1, 2]; step 1 generates [3, 4] and observes [5]; step 2 generates [6] and ends."""
    tree = Tree(0, [1, 2])
    tree.add_path(0, [_step([3, 4], [5]), _step([6], [], end=True)])
    rows = build_rows([tree], torch.tensor([[0.5, -2.0]], dtype=F64), pad_id=0)
    assert rows.ids.tolist() == [[1, 2, 3, 4, 5, 6]] and rows.mask.tolist() == [[0, 0, 1, 1, 0, 1]]
    assert rows.adv.tolist() == [[0.0, 0.0, 0.5, 0.5, 0.5, -2.0]]          # observation 5 takes step 1's, masked
    assert build_rows([tree], torch.tensor([0.5], dtype=F64), pad_id=0).adv.tolist() == [0.5]


def test_chain_states_are_the_exact_observation_ids_so_far():
    tree = Tree(0, [1])
    tree.add_path(0, [_step([3], [5, 6]), _step([7], [8]), _step([9], [], end=True)])
    assert chain_states(tree) == [(), ((5, 6),), ((5, 6), (8,))]


def test_step_groups_need_chains_and_a_token_ratio(cfg):
    chains = dict(M=4, N=0, L=0)
    assert cfg.replace(tree=chains, optim=dict(step_groups=1.0)).optim.step_groups == 1.0
    with pytest.raises(ConfigError, match="optim.step_groups"):
        cfg.replace(optim=dict(step_groups=1.0))                                     # the preset's (2,2,1) trees
    with pytest.raises(ConfigError, match="optim.step_groups"):
        cfg.replace(tree=chains, optim=dict(step_groups=1.0, ratio="sequence"))
    with pytest.raises(ConfigError, match="optim.step_groups"):
        cfg.replace(tree=chains, optim=dict(step_groups=-1.0))
    assert cfg.replace(tree=chains, optim=dict(step_groups=0.0)).hash() == cfg.replace(tree=chains).hash()


def test_the_trainer_adds_each_steps_group_advantage(cfg, warm_policy_dir, make_env, train_questions, tmp_path):
    """One step of 4 chains per question with omega = 0.5: every policy token of step k carries
    A_episode + 0.5 A_step(k), recomputed here from the trees' rewards and observation ids. (Seed 1: one
    chain of one question answers right, so that question's groups have nonzero advantages.)"""
    from transformers import AutoTokenizer

    from tg.agent.finetune import trainable_policy
    from tg.trainer import Trainer

    c = cfg.replace(model=dict(finetune="lora", lora_r=4, lora_alpha=8), agent=dict(max_turns=3, max_step_tokens=40),
                    tree=dict(M=4, N=0, L=0), optim=dict(steps=1, prompts_per_step=4, mini_batch_prompts=4,
                                                          micro_batch_rows=8, lr=1e-3, step_groups=0.5, seed=1))
    tok = AutoTokenizer.from_pretrained(warm_policy_dir)
    tr = Trainer(c, trainable_policy(warm_policy_dir, c.model, torch.device("cpu")), tok, make_env(tok, 3),
                 train_questions, tmp_path)
    seen = {}
    rollout, update = tr.rollout, tr.update
    tr.rollout = lambda *a: seen.setdefault("trees", rollout(*a))
    tr.update = lambda rows: update(seen.setdefault("rows", rows))
    row = tr.step()
    flat = [t for ts in seen["trees"][0] for t in ts]
    rewards = torch.tensor([t.rewards[t.leaves()[0]] for t in flat], dtype=F64)
    episode = group_relative(rewards, torch.tensor([t.question for t in flat]))
    groups: dict = {}                                   # (question, observations so far) -> chain rewards
    for t, r in zip(flat, rewards.tolist()):
        obs = [tuple(s.obs_ids) for s in t.path(t.leaves()[0])]
        for k in range(len(obs)):
            groups.setdefault((t.question, tuple(obs[:k])), []).append(r)
    shared = 0
    for i, t in enumerate(flat):
        steps = t.path(t.leaves()[0])
        start = len(t.prompt_ids)
        for k, s in enumerate(steps):
            rs = torch.tensor(groups[(t.question, tuple(tuple(x.obs_ids) for x in steps[:k]))], dtype=F64)
            a_step = 0.0 if len(rs) == 1 else float((rewards[i] - rs.mean()) / (rs.std() + 1e-6))
            shared += k > 0 and a_step != 0.0
            got = seen["rows"].adv[i, start:start + len(s.gen_ids)]
            assert torch.allclose(got, torch.full_like(got, float(episode[i]) + 0.5 * a_step), atol=1e-6), (i, k)
            start += len(s.ids)
    assert shared > 0                 # a later step shared its state with a chain of another reward: a real step signal
    assert math.isfinite(row["loss"]) and row["grad_norm"] > 0
