"""The trainer: exact resume, atomic checkpoints, non-finite guards, full / LoRA / QLoRA on one path."""

import json

import pytest
import torch

from tg.finetune import trainable_policy
from tg.policy import save_policy
from tg.trainer import NonFiniteError, Trainer

TIMING = ("rollout_s", "logprob_s", "update_s")


@pytest.fixture(scope="module")
def policy_dir(random_policy, tmp_path_factory):
    model, tok = random_policy
    return save_policy(model, tok, tmp_path_factory.mktemp("policy"))


def _cfg(cfg, finetune="lora", **optim):
    o = dict(steps=6, prompts_per_step=2, mini_batch_prompts=2, micro_batch_rows=4, lr=1e-3, checkpoint_every=3)
    o.update(optim)
    return cfg.replace(model=dict(finetune=finetune, lora_r=4, lora_alpha=8),
                       agent=dict(max_turns=2, max_step_tokens=12), tree=dict(M=2, N=1, L=1), optim=o)


def _trainer(cfg, policy_dir, make_env, questions, run_dir):
    from transformers import AutoTokenizer
    torch.manual_seed(cfg.optim.seed)
    tok = AutoTokenizer.from_pretrained(policy_dir)
    return Trainer(cfg, trainable_policy(policy_dir, cfg.model, torch.device("cpu")), tok, make_env(tok, 2),
                   questions, run_dir)


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_resume_continues_exactly(cfg, policy_dir, make_env, train_questions, tmp_path):
    c = _cfg(cfg)
    straight = _trainer(c, policy_dir, make_env, train_questions, tmp_path / "a")
    rows_a = straight.fit()
    first = _trainer(c, policy_dir, make_env, train_questions, tmp_path / "b")
    first.fit(steps=3)
    resumed = _trainer(c, policy_dir, make_env, train_questions, tmp_path / "b")
    rows_b = resumed.fit(resume=True)
    assert resumed.step_done == 6 and len(rows_b) == 6
    assert _strip(rows_a) == _strip(rows_b)
    for (k, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), k
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5, 6]


def test_interrupted_checkpoint_write_keeps_the_previous_one(cfg, policy_dir, make_env, train_questions, tmp_path,
                                                            monkeypatch):
    tr = _trainer(_cfg(cfg), policy_dir, make_env, train_questions, tmp_path)
    tr.fit(steps=3)
    before = tr.checkpoint_path.read_bytes()

    def killed(obj, f, *a, **k):
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", killed)
    tr.step()
    with pytest.raises(KeyboardInterrupt):
        tr.save_checkpoint()
    assert tr.checkpoint_path.read_bytes() == before
    monkeypatch.undo()
    again = _trainer(_cfg(cfg), policy_dir, make_env, train_questions, tmp_path)
    assert again.load_checkpoint() == 3


def test_non_finite_weights_or_loss_stop_without_checkpoint(cfg, policy_dir, make_env, train_questions, tmp_path,
                                                            monkeypatch):
    tr = _trainer(_cfg(cfg, finetune="full"), policy_dir, make_env, train_questions, tmp_path / "w")
    with torch.no_grad():
        next(iter(tr.policy.model.parameters())).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="step 1: rollout"):
        tr.fit(steps=2)
    assert not tr.checkpoint_path.exists()
    tr = _trainer(_cfg(cfg), policy_dir, make_env, train_questions, tmp_path / "l")
    tr.fit(steps=1)
    saved = tr.checkpoint_path.read_bytes()
    import tg.trainer
    real = tg.trainer.grpo_loss
    monkeypatch.setattr(tg.trainer, "grpo_loss", lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]))
    with pytest.raises(NonFiniteError, match="step 2: loss is nan"):
        tr.fit(steps=2)
    assert tr.checkpoint_path.read_bytes() == saved


@pytest.mark.parametrize("finetune", ["full", "lora", "qlora"])
def test_one_step_per_finetune_mode_changes_the_trained_weights(cfg, policy_dir, make_env, train_questions, tmp_path,
                                                               finetune):
    tr = _trainer(_cfg(cfg, finetune=finetune, prompts_per_step=4, mini_batch_prompts=2), policy_dir, make_env,
                  train_questions, tmp_path)
    before = {k: v.clone().float() for k, v in tr.policy.state_dict().items()}
    row = tr.step()
    after = tr.policy.state_dict()
    assert row["trajectories"] == 4 and 0 <= row["format_valid"] <= 1
    if row["adv_std"] > 0:
        assert any(not torch.equal(before[k], after[k].float()) for k in before)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_packed_trees_train_like_rows(cfg, policy_dir, make_env, train_questions, tmp_path, finetune):
    """optim.pack_trees: the same step (rollout, advantages, loss, update) up to float summation order. The
    entropy bonus moves the weights even when every leaf of the random policy scores 0."""
    runs = {}
    for pack in (False, True):
        c = _cfg(cfg, finetune=finetune, prompts_per_step=4, mini_batch_prompts=2, micro_batch_rows=5, pack_trees=pack,
                 entropy_coef=0.01)
        tr = _trainer(c.replace(tree=dict(M=2, N=2, L=1)), policy_dir, make_env, train_questions, tmp_path / str(pack))
        before = {k: v.clone().float() for k, v in tr.policy.state_dict().items()}
        runs[pack] = (tr.step(), {k: v.clone() for k, v in tr.policy.state_dict().items()})
    (row, weights), (packed_row, packed_weights) = runs[False], runs[True]
    assert row["trajectories"] == packed_row["trajectories"] == 6
    assert any(not torch.equal(before[k], w.float()) for k, w in weights.items())    # the step did train
    for k in ("loss", "pg_loss", "kl", "clip_frac", "entropy"):
        if k in row:
            assert packed_row[k] == pytest.approx(row[k], rel=1e-4, abs=1e-6), k
    for k, w in weights.items():
        assert packed_weights[k].float() == pytest.approx(w.float(), abs=1e-5), k


def test_qlora_in_bf16_keeps_activations_in_bf16(cfg, policy_dir):
    """QLoRA under bf16 (the GPU path): the base's non-4-bit weights stay bf16 and so do the activations.
    peft's prepare_model_for_kbit_training would cast them to fp32; on an H200 that ran attention
    unfused and the tiny policy's longest micro-batch out of 140 GiB (bench/README.md, "On a GPU")."""
    c = cfg.replace(model=dict(finetune="qlora", dtype="bfloat16", lora_r=4, lora_alpha=8, gradient_checkpointing=True))
    model = trainable_policy(policy_dir, c.model, torch.device("cpu")).model
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert frozen == {torch.uint8, torch.bfloat16}                  # NF4 weights, everything else bf16
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}   # LoRA: peft's fp32
    seen = []
    layer = model.base_model.model.model.layers[0].self_attn
    layer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["hidden_states"].dtype), with_kwargs=True)
    model.train()
    model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.float().sum().backward()
    assert seen == [torch.bfloat16] * len(seen) and seen
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
