"""tg.integrations.verl against tg and against verl 0.9.1 itself (run in .venv-verl: `make test-verl`).

In .venv (no verl) the whole file skips. What runs here on CPU: the estimator through verl's registry and
verl's own `compute_advantage` dispatch; the tree index; `grow_tree`; `TreeAgentLoop.run` on a scripted
rollout server with the kit's tokenizer and calculator; the worker hook's storage with TransferQueue's put
replaced by a recorder. verl's Ray cluster, rollout servers and trainer need GPUs and do not run here.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch

verl_mod = pytest.importorskip("tg.integrations.verl", exc_type=ImportError)
from omegaconf import OmegaConf  # noqa: E402  (verl's dependency: present once the import above succeeded)
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn  # noqa: E402

from tg.advantage import tree_grpo  # noqa: E402
from tg.agent.calculator import CALCULATOR_INVALID, CALCULATOR_PROMPT  # noqa: E402
from tg.agent.protocol import Action, Step  # noqa: E402
from tg.agent.policy import build_tokenizer  # noqa: E402
from tg.config_values import ConfigError  # noqa: E402

V = verl_mod
T = 7  # response length of the token-level tensors


def _forest(rng: random.Random, n_prompts: int, M: int, leaves: list[int]):
    """Shuffled leaves of M trees per prompt (tree sizes drawn from `leaves`), rewards with ties."""
    rows = [(f"uid-{p}", t, rng.choice([0.0, 0.2, 1.0, rng.random()]))
            for p in range(n_prompts) for t in range(M) for _ in range(rng.choice(leaves))]
    rng.shuffle(rows)
    return rows


def _token_level(rows, rng: random.Random):
    """verl's layout: the reward on the last valid response token, the mask 1 up to a random length."""
    lengths = [rng.randint(1, T) for _ in rows]
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    rewards = torch.zeros(len(rows), T)
    for i, ((_, _, r), n) in enumerate(zip(rows, lengths)):
        rewards[i, n - 1] = r
    return rewards, mask


@pytest.mark.parametrize("mode", V.MODES)
@pytest.mark.parametrize("seed", range(5))
def test_estimator_equals_tg_advantage_on_random_forests(mode, seed):
    rng = random.Random(seed)
    rows = _forest(rng, n_prompts=rng.randint(1, 4), M=rng.randint(1, 3), leaves=[1, 2, 3, 5])
    rewards, mask = _token_level(rows, rng)
    index = np.array([V.tree_index(p, t) for p, t, _ in rows], dtype=object)
    fn = get_adv_estimator_fn("tree_grpo")
    adv, ret = fn(token_level_rewards=rewards, response_mask=mask, index=index,
                  config=OmegaConf.create({"tree_grpo": {"mode": mode}}))
    prompts = {p: i for i, p in enumerate(dict.fromkeys(p for p, _, _ in rows))}
    expected = tree_grpo(torch.tensor([r for _, _, r in rows]), torch.tensor([t for _, t, _ in rows]),
                         torch.tensor([prompts[p] for p, _, _ in rows]), mode)
    assert torch.equal(adv, expected[:, None] * mask) and torch.equal(ret, adv)


@pytest.mark.parametrize("mode", ["inter", "intra+inter"])
@pytest.mark.parametrize("seed", range(5))
def test_estimator_equals_verl_grpo_on_chains(mode, seed):
    """Chains are one-leaf trees: the intra-tree term is 0 (singleton 'zero') and the rest is verl's grpo."""
    rng = random.Random(seed)
    rows = _forest(rng, n_prompts=3, M=rng.randint(2, 5), leaves=[1])
    rewards, mask = _token_level(rows, rng)
    ours, _ = V.compute_tree_grpo_advantage(rewards, mask, np.array([V.tree_index(p, t) for p, t, _ in rows]),
                                            config={"tree_grpo": {"mode": mode}})
    theirs, _ = compute_grpo_outcome_advantage(rewards, mask, np.array([p for p, _, _ in rows], dtype=object))
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)
    assert ours.abs().sum() > 0 or all(r == rows[0][2] for _, _, r in rows)


def test_verl_compute_advantage_dispatches_to_tree_grpo():
    """verl's own dispatch (ray_trainer.compute_advantage with the algorithm config) reaches the estimator."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rows = [("a", 0, 1.0), ("a", 0, 0.0), ("a", 1, 1.0), ("a", 1, 1.0)]
    rewards, mask = _token_level(rows, random.Random(0))
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.array([V.tree_index(p, t) for p, t, _ in rows], dtype=object)})
    algo = OmegaConf.create({"adv_estimator": "tree_grpo", "norm_adv_by_std_in_grpo": True,
                             "tree_grpo": {"mode": "intra"}})
    out = compute_advantage(data, adv_estimator="tree_grpo", config=algo)
    first = out.batch["advantages"][:, 0]
    assert first[2] == first[3] == 0 and first[0] > 0 > first[1]   # tree 1 all-equal; tree 0 split


def test_parse_tree_index_codes_and_errors():
    p, t = V.parse_tree_index(["x|y|0", "x|y|1", "z|0", "x|y|0"])
    assert p.tolist() == [0, 0, 1, 0] and t.tolist() == [0, 1, 2, 0]    # split at the last '|'
    with pytest.raises(ValueError, match="'plain-uid' is not 'prompt_uid|tree_id'"):
        V.parse_tree_index(["plain-uid"])


@pytest.mark.parametrize("config, field", [({"tree_grpo": {"mode": "both"}}, "mode"),
                                           ({"tree_grpo": {"M": 2}}, "unknown keys"),
                                           ({"norm_adv_by_std_in_grpo": False}, "norm_adv_by_std_in_grpo"),
                                           ({"tree_grpo": {"node_rule": "best"}}, "node_rule"),
                                           ({"tree_grpo": {"env": "web"}}, "env")])
def test_tree_options_refuse_bad_config(config, field):
    with pytest.raises(ConfigError, match=field):
        V.tree_options(config)


def _step(ids, end, obs=()):
    return Step(gen_ids=list(ids), obs_ids=list(obs), action=Action("answer" if end else "search"), ends_episode=end)


def test_grow_tree_initializes_then_expands():
    """A seed chain of 3 steps, then L=2 rounds of N=2: 1 + L N leaves; each branch continues its node's exact
    context with the node's depth as turns already taken."""
    calls = []

    async def step(context, turns):
        calls.append((tuple(context), turns))
        return _step([100 + len(calls)], end=turns >= 2, obs=[7])

    tree = asyncio.run(V.grow_tree(step, [1, 2], N=2, L=2, rng=random.Random(0)))
    assert len(tree.leaves()) == 1 + 2 * 2
    assert calls[:3] == [((1, 2), 0), ((1, 2, 101, 7), 1), ((1, 2, 101, 7, 102, 7), 2)]
    for context, turns in calls[3:]:
        node = next(n for n in tree.nodes if tree.context(n.id) == list(context))
        assert turns == node.depth and not node.is_leaf
    order = V.leaf_order(tree)
    assert order[-1] == 3 and sorted(order) == tree.leaves()   # the seed chain's leaf last


class ScriptedServer:
    """A verl rollout server stand-in: `generate` answers from a script by the number of tool results so far."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, script, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        turn = self.tokenizer.decode(prompt_ids).count("</information>")
        return TokenOutput(token_ids=self.tokenizer.encode(self.script[turn], add_special_tokens=False))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([CALCULATOR_PROMPT, CALCULATOR_INVALID, "user assistant 1 2 + 3 5 6 error ok"])


def test_tree_agent_loop_runs_on_a_scripted_server(tokenizer):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 256, "response_length": 128}},
                               "algorithm": {"tree_grpo": {"env": "calculator", "N": 2, "L": 1, "max_turns": 3}}})
    server = ScriptedServer(tokenizer, ["<search> 2 + 3 </search>", "<search> 5 + 1 </search>",
                                        "<answer> 6 </answer>"])

    async def run():  # the agent loop keeps the event loop it is made in, as in verl's worker
        loop = V.TreeAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                               processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})))
        return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "2 + 3 ok"}])

    outs = asyncio.run(run())
    assert len(outs) == 1 + 2 * 1 and len({c[0] for c in server.calls}) == 1     # one sticky id per tree
    assert all(c[2]["stop"] == ["</search>", "</answer>"] for c in server.calls)
    for out in outs:
        text = tokenizer.decode(out.response_ids)
        assert text.rstrip().endswith("</answer>") and out.extra_fields["tree_leaf"] > 0
        obs = [m == 0 for m in out.response_mask]
        assert any(obs) and "<information>" in tokenizer.decode([i for i, o in zip(out.response_ids, obs) if o])
        assert "<information>" not in tokenizer.decode([i for i, o in zip(out.response_ids, obs) if not o])
    assert outs[-1].extra_fields["tree_leaf"] == min(o.extra_fields["tree_leaf"] for o in outs)   # seed last


@pytest.mark.parametrize("validate", [False, True])
def test_worker_hook_stores_each_leaf_with_its_tree_index(monkeypatch, validate):
    """Each leaf its own session '{uid}_{tree*K+j}_0' (so verl scores it alone), then its uid -> 'uid|tree'."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    stored, puts = [], []

    async def base_postprocess(self, output, validate, **kwargs):
        stored.append((output, kwargs["uid"], kwargs["session_id"]))

    async def put(keys, fields, partition_id):
        puts.append((keys, list(fields["uid"]), partition_id))

    monkeypatch.setattr(V.AgentLoopWorkerTQ.__ray_actor_class__, "_agent_loop_postprocess", base_postprocess)
    monkeypatch.setattr(V.tq, "async_kv_batch_put", put)
    leaves = [AgentLoopOutput(prompt_ids=[1], response_ids=[2], response_mask=[1], metrics=AgentLoopMetrics(),
                              extra_fields={"tree_leaf": j}) for j in (5, 7, 3)]
    worker = object.__new__(V.TreeAgentLoopWorker)
    asyncio.run(worker._agent_loop_postprocess(leaves, validate, uid="u", session_id=1))
    if validate:
        assert [(o.extra_fields["tree_leaf"], s) for o, _, s in stored] == [(3, 3)]
        assert puts == [(["u_3_0"], ["u|1"], "val")]
    else:
        assert [s for _, _, s in stored] == [3, 4, 5] and {u for _, u, _ in stored} == {"u"}
        assert puts == [(["u_3_0", "u_4_0", "u_5_0"], ["u|1"] * 3, "train")]


def test_doctor_reports_verl():
    import verl

    from tg.gpu.doctor import installed_versions

    assert installed_versions()["verl"] == verl.__version__ == "0.9.1"
