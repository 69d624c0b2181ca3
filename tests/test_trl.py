"""Tree-GRPO in TRL's GRPOTrainer (tg.integrations.trl), on CPU with the pinned tiny policy and the synthetic world:
two steps train, the advantages are `tg.advantage`'s on the same leaves, and TRL's loss under
`grpo_config_kwargs` is `tg.loss.grpo_loss` (Eq. 8); the rollout runs inside TRL's parameter gathering, and two
gloo processes train two steps on a model sharded with FSDP2."""

import datetime
import json
import math
import multiprocessing
import os
import socket
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="trl is not installed: pip install -e '.[bench]'")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL

from trl import GRPOConfig  # noqa: E402

import tg.integrations.trl as tgtrl  # noqa: E402
from tg.advantage import tree_grpo_parts  # noqa: E402
from tg.agent.policy import load_policy  # noqa: E402
from tg.agent.tasks import make_reward  # noqa: E402
from tg.batch import leaf_rewards  # noqa: E402
from tg.config import ConfigError, load_config  # noqa: E402
from tg.gpu.doctor import PACKAGES, read_matrix  # noqa: E402
from tg.integrations.trl import (TreeGRPOTrainer, TreeRollout, check_args, distinct_prompts,  # noqa: E402
                                 grpo_config_kwargs, questions_dataset, tree_reward)
from tg.loss import grpo_loss, token_logprobs  # noqa: E402
from tg.pipeline import load_resources  # noqa: E402
from tg.tree import sample_trees  # noqa: E402

from tg.agent.world import REPO_ROOT  # noqa: E402

PROMPTS = 2  # questions per step: with (M, N, L) = (2, 1, 1), 4 leaves each, 8 TRL completions
TRAIN, SCORED = [13, 42, 17, 0], [42, 13, 23, 20]
"""Training questions (in order) and the scored batch's: ones the warmed-up policy answers right some of the time, so
leaves' rewards differ within trees and prompts (the first 48 probed, 8 leaves each)."""


@pytest.fixture(scope="module")
def setup(cfg, tmp_path_factory):
    """A TreeGRPOTrainer on the warmed-up tiny policy after two training steps, and the policy it started from."""
    cfg = cfg.replace(tree=dict(M=2, N=1, L=1))
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    rollout = TreeRollout.from_config(cfg, res.env(tok, cfg))
    args = GRPOConfig(str(tmp_path_factory.mktemp("trl")), **grpo_config_kwargs(cfg) | dict(max_steps=2),
                      per_device_train_batch_size=PROMPTS * rollout.leaves_per_prompt, shuffle_dataset=False, use_cpu=True,
                      report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = TreeGRPOTrainer(model, [tree_reward(make_reward(cfg))], args, rollout_func=rollout,
                              train_dataset=questions_dataset([res.train_set(cfg)[i] for i in TRAIN]), processing_class=tok)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer.train()
    initial, _ = load_policy(res.policy_path)
    return cfg, res, trainer, start, initial


@pytest.fixture(scope="module")
def scored(setup):
    """One scored generation batch of the trained trainer (4 questions) and the `tg` trees behind it."""
    cfg, res, trainer, _, _ = setup
    questions = [res.train_set(cfg)[i] for i in SCORED]
    k = trainer.args.num_generations
    inputs = [{"prompt": q.question, "golden_answers": list(q.golden_answers)} for q in questions for _ in range(k)]
    grown = []
    trainer.model.train()
    with pytest.MonkeyPatch.context() as mp:  # record the trees the rollout grows
        mp.setattr(tgtrl, "sample_trees", lambda *a, **kw: _record(grown, *a, **kw))
        out = trainer._generate_and_score_completions(inputs)
    (trees,) = grown
    return cfg, trainer, out, trees, [q.golden_answers for q in questions]


def _record(grown, *a, **kw):
    trees, stats = sample_trees(*a, **kw)
    grown.append([t for ts in trees for t in ts])
    return trees, stats


def test_two_steps_train_the_weights(setup):
    _, _, trainer, start, _ = setup
    steps = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2]
    moved = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, start[k])]
    assert moved, "no weight changed in two training steps"
    assert all("tg/adv_intra_std" in row and "tg/adv_inter_std" in row for row in steps)


def test_completions_are_the_leaves_with_their_observation_mask(scored):
    _, trainer, out, trees, _ = scored
    trajs = [t.trajectory(leaf) for t in trees for leaf in t.leaves()]
    assert len(trajs) == out["completion_ids"].shape[0] == 4 * trainer.args.num_generations
    for i, x in enumerate(trajs):
        n = len(x.response_ids)
        assert out["completion_ids"][i, :n].tolist() == x.response_ids          # token in, token out
        assert out["completion_mask"][i, n:].sum() == 0
        assert out["tool_mask"][i, :n].tolist() == x.response_mask              # tool output is not trained
    assert any(0 in x.response_mask for x in trajs), "no leaf searched: the mask check saw no observation"


def test_advantages_are_tgs_on_the_same_leaves(scored):
    cfg, trainer, out, trees, golds = scored
    sc = leaf_rewards(trees, golds, make_reward(cfg))
    held = trainer._rewards_per_func[:, 0]                                       # the rewards TRL scored, float32
    assert torch.equal(held, torch.tensor(sc["reward"], dtype=torch.float32))
    tree, prompt = torch.tensor(sc["tree"]), torch.tensor(sc["prompt"])
    mine = tree_grpo_parts(held.double(), tree, prompt, mode="intra+inter")
    assert torch.equal(out["advantages"], mine.total.float())                   # exactly, bit for bit
    ref = tree_grpo_parts(torch.tensor(sc["reward"], dtype=torch.float64), tree, prompt, mode="intra+inter")
    assert torch.allclose(out["advantages"].double(), ref.total, atol=1e-6)     # tg's float64 rewards: float32 off
    assert mine.intra.abs().sum() > 0 and mine.inter.abs().sum() > 0, "pick questions whose leaves' rewards differ"
    assert not torch.allclose(mine.total, mine.inter)                           # TRL's own group advantage is inter


def _tg_rows(trees):
    """The leaves as `tg` trains them: right-padded ids [B, T], policy mask [B, T], each row's prompt length."""
    trajs = [t.trajectory(leaf) for t in trees for leaf in t.leaves()]
    ids = torch.zeros(len(trajs), max(len(x.ids) for x in trajs), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(trajs):
        ids[i, :len(x.ids)], mask[i, :len(x.ids)] = torch.tensor(x.ids), torch.tensor(x.mask)
    return ids, mask, [len(x.prompt_ids) for x in trajs]


def test_trl_loss_is_eq8_of_tg_loss(setup, scored):
    """TRL's loss under `grpo_config_kwargs` against `tg.loss.grpo_loss` on tg's own rows and forwards (reference
    = the starting policy, old log-probs moved off the current ones so the clip acts), both in float32."""
    cfg, trainer, out, trees, _ = scored
    initial, model, o = setup[4], trainer.model, cfg.optim
    B, C = out["completion_ids"].shape
    noise = 0.3 * torch.sin(torch.arange(B)[:, None] * 7.0 + torch.arange(C)[None, :])    # [B, C], TRL's grid
    inputs = dict(out, old_per_token_logps=out["ref_per_token_logps"] + noise)
    ids, mask, starts = _tg_rows(trees)
    on_rows = torch.zeros(ids.shape)                                                  # the noise on tg's rows
    for i, s in enumerate(starts):
        n = int(out["completion_mask"][i].sum())
        on_rows[i, s:s + n] = noise[i, :n]
    with torch.no_grad():
        ref = token_logprobs(initial(input_ids=ids).logits, ids)
    params = [p for p in model.parameters() if p.requires_grad]
    trl_loss = trainer._compute_loss(model, inputs)
    trl_grad = torch.autograd.grad(trl_loss, params)
    logp = token_logprobs(model(input_ids=ids).logits, ids)
    tg_loss, stats = grpo_loss(logp, ref + on_rows, out["advantages"], mask, ref_logp=ref, clip_low=o.clip_low,
                               clip_high=o.clip_high, agg=o.loss_agg, kl_beta=o.kl_beta)
    tg_grad = torch.autograd.grad(tg_loss, params)
    assert stats["clip_frac"] > 0 and stats["kl"] > 0                         # both Eq. 8 terms are exercised
    assert math.isclose(float(trl_loss.detach()), float(tg_loss.detach()), rel_tol=1e-5, abs_tol=1e-7)
    assert _close(trl_grad, tg_grad)                                          # the same gradient, too
    trainer.args.use_bias_correction_kl = True                                # TRL's default: the KL times the ratio
    try:
        assert not _close(torch.autograd.grad(trainer._compute_loss(model, inputs), params), tg_grad)
    finally:
        trainer.args.use_bias_correction_kl = False


def _close(a, b, rel=1e-4):
    """Gradients equal to float tolerance: the largest difference against the largest entry."""
    scale = max(float(x.abs().max()) for x in b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) <= rel * scale


def test_the_rollout_runs_inside_trls_parameter_gathering(setup, monkeypatch):
    """TRL's `unwrap_model_for_generation` (ZeRO-3: parameters gathered) is open while the trees grow, on the
    model it yields."""
    cfg, res, trainer, _, _ = setup
    events = []
    unwrap = tgtrl.unwrap_model_for_generation

    def spy_unwrap(*args, **kwargs):
        events.append("enter")
        return unwrap(*args, **kwargs)

    def spy_trees(engine, *args, **kwargs):
        events.append(("trees", engine.model is trainer.accelerator.unwrap_model(trainer.model)))
        return sample_trees(engine, *args, **kwargs)

    monkeypatch.setattr(tgtrl, "unwrap_model_for_generation", spy_unwrap)
    monkeypatch.setattr(tgtrl, "sample_trees", spy_trees)
    question = res.train_set(cfg)[SCORED[0]].question
    out = trainer.rollout_func([question] * trainer.args.num_generations, trainer)
    assert events == ["enter", ("trees", True)] and len(out["completion_ids"]) == trainer.args.num_generations


def test_the_completions_table_keeps_one_advantage_per_completion(setup):
    """In evaluation (a batch smaller than the table), the logged advantages are the trained ones, one per prompt
    row of the table: TRL's own are replaced, not followed."""
    cfg, res, trainer, _, _ = setup
    for column in ("prompt", "completion", "advantages"):
        trainer._logs[column].clear()
    q = res.train_set(cfg)[SCORED[0]]
    k = trainer.args.num_generations
    trainer.model.eval()
    try:
        trainer._generate_and_score_completions([{"prompt": q.question, "golden_answers": list(q.golden_answers)}] * k)
    finally:
        trainer.model.train()
    assert len(trainer._logs["advantages"]) == len(trainer._logs["prompt"]) == k
    assert list(trainer._logs["advantages"]) == trainer.last_tree_advantage.total.tolist()


def test_config_maps_eq8_and_refuses_what_trl_lacks(cfg):
    kw = grpo_config_kwargs(cfg)
    t = cfg.tree
    assert kw["num_generations"] == t.M * (1 + t.L * t.N)
    assert (kw["loss_type"], kw["beta"], kw["epsilon"], kw["epsilon_high"]) == ("grpo", 0.001, 0.2, 0.2)
    assert kw["importance_sampling_level"] == "token" and kw["use_bias_correction_kl"] is False
    assert grpo_config_kwargs(cfg.replace(optim=dict(loss_agg="token-mean")))["loss_type"] == "bnpo"
    with pytest.raises(ConfigError, match="optim.dual_clip"):
        grpo_config_kwargs(cfg.replace(optim=dict(dual_clip=3.0)))


@pytest.mark.parametrize("change, field", [
    (dict(num_generations=3), "num_generations"), (dict(mask_truncated_completions=True), "mask_truncated"),
    (dict(scale_rewards="batch"), "scale_rewards"), (dict(per_device_train_batch_size=9), "multiple of 6"),
    (dict(use_vllm=True, vllm_mode="colocate"), "use_vllm must be False")])
def test_trainer_refuses_settings_that_break_the_tree(tmp_path, change, field):
    rollout = TreeRollout(env=None, M=2, N=1, L=2)                            # K = 6 leaves per prompt
    args = GRPOConfig(str(tmp_path), num_generations=6, per_device_train_batch_size=6, use_cpu=True, report_to="none")
    check_args(args, rollout, "intra+inter")                                  # the unchanged settings pass
    for name, value in change.items():  # set after construction: per process, past GRPOConfig's global checks
        setattr(args, name, value)
    with pytest.raises(ConfigError, match=field):
        check_args(args, rollout, "intra+inter")
    with pytest.raises(ConfigError, match="TreeRollout"):
        check_args(args, lambda prompts, trainer: {}, "intra+inter")


def test_prompt_groups_must_be_whole_runs():
    assert distinct_prompts(["a", "a", "b", "b"], 2) == ["a", "b"]
    with pytest.raises(ConfigError, match="whole groups"):
        distinct_prompts(["a", "a", "b"], 2)
    with pytest.raises(ConfigError, match="runs of one prompt"):
        distinct_prompts(["a", "b"], 2)
    with pytest.raises(ConfigError, match="question text"):
        distinct_prompts([[{"role": "user", "content": "a"}]] * 2, 2)


def test_doctor_reports_trl():
    assert "trl" in PACKAGES
    assert read_matrix(REPO_ROOT).ranges["trl"] == "==1.16.0"


def _sharded_rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: the tiny policy sharded with FSDP2 over both (`tg.gpu.fsdp.fully_shard_model`),
    two TRL steps with the tree rollout, each rank its own seed (so its own trees and forward count)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from tg.config import load_config
    from tg.gpu.fsdp import fully_shard_model
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                         timeout=datetime.timedelta(seconds=60))
    cfg = load_config("cpu").replace(tree=dict(M=2, N=1, L=1))
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    fully_shard_model(model, init_device_mesh("cpu", (2,)))
    rollout = TreeRollout.from_config(cfg, res.env(tok, cfg))
    args = GRPOConfig(str(Path(out, str(rank))), **grpo_config_kwargs(cfg) | dict(max_steps=2, seed=rank),
                      per_device_train_batch_size=rollout.leaves_per_prompt, shuffle_dataset=False, use_cpu=True,
                      report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = TreeGRPOTrainer(model, [tree_reward(make_reward(cfg))], args, rollout_func=rollout,
                              train_dataset=questions_dataset([res.train_set(cfg)[i] for i in TRAIN]),
                              processing_class=tok)
    trainer.train()
    steps = [row for row in trainer.state.log_history if "loss" in row]
    sharded = all(type(p).__name__ == "DTensor" for p in trainer.model.parameters())
    Path(out, f"rank{rank}.json").write_text(json.dumps({"steps": steps, "sharded": sharded}))
    torch.distributed.destroy_process_group()


def test_two_gloo_ranks_train_two_steps_on_a_sharded_model(tmp_path):
    """accelerate shards with FSDP only on accelerators, so on CPU the ranks shard the model themselves and each
    rank's TRL runs as one process: what is tested is the tree rollout on FSDP2 weights whose ranks decode
    different numbers of tokens (a gather at each forward would wait or cross between ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_sharded_rank, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0, 0], f"rank exit codes {codes}"
    ranks = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["sharded"] and [row["step"] for row in r["steps"]] == [1, 2] for r in ranks)
    assert all(math.isfinite(row["loss"]) for r in ranks for row in r["steps"])
    assert ranks[0]["steps"][0]["num_tokens"] != ranks[1]["steps"][0]["num_tokens"]   # different trees per rank


def test_the_tree_rollout_on_a_real_bpe_tokenizer_and_chat_template(tmp_path):
    """TRL's scoring of one tree batch on the smol preset's SmolLM2-135M start: prompts through its ChatML template,
    completions its sampled BPE ids with their multi-token tags (as sampled: tests/test_smol.py checks the
    log-probs), observations masked."""
    cfg = load_config("smol", "tree.M=2", "tree.N=1", "tree.L=1", "agent.max_step_tokens=48")
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    rollout = TreeRollout.from_config(cfg, res.env(tok, cfg))
    k = rollout.leaves_per_prompt
    args = GRPOConfig(str(tmp_path), **grpo_config_kwargs(cfg) | dict(max_steps=1), per_device_train_batch_size=k,
                      use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = TreeGRPOTrainer(model, [tree_reward(make_reward(cfg))], args, rollout_func=rollout,
                              train_dataset=questions_dataset(res.train_set(cfg)[:1]), processing_class=tok)
    question = res.train_set(cfg)[0]
    grown = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tgtrl, "sample_trees", lambda *a, **kw: _record(grown, *a, **kw))
        out = trainer._generate_and_score_completions(
            [{"prompt": question.question, "golden_answers": list(question.golden_answers)}] * k)
    (trees,) = grown
    trajs = [t.trajectory(leaf) for t in trees for leaf in t.leaves()]
    close = tok.encode("</search>", add_special_tokens=False)
    assert len(close) == 3 and tok.decode(out["prompt_ids"][0][out["prompt_mask"][0].bool()]).startswith(
        "<|im_start|>system\n")
    for i, x in enumerate(trajs):
        n = len(x.response_ids)
        assert out["completion_ids"][i, :n].tolist() == x.response_ids
        assert out["tool_mask"][i, :n].tolist() == x.response_mask and out["completion_mask"][i, n:].sum() == 0
    texts = [tok.decode(x.response_ids) for x in trajs]
    assert any("</search>" in t for t in texts) and any("</answer>" in t for t in texts)
    assert not {tok.decode([i]).strip() for x in trajs for i in x.response_ids} & {"</search>", "</answer>"}
