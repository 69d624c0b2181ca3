"""The trainer: exact resume (also from the previous checkpoint), verified checkpoints, non-finite guards,
full / LoRA / QLoRA on one path. Every test that trains starts from the pinned warmed-up policy, whose
leaves' rewards differ: advantages, gradients, optimiser moments and updates are not zero, so comparing
them after a step or a resume compares something."""

import json
import logging
import shutil

import pytest
import torch

from tg.agent.finetune import trainable_policy
from tg.store.rundir import PREVIOUS, RunDirError
from tg.trainer import NonFiniteError, Trainer

TIMING = ("rollout_s", "logprob_s", "update_s")


def _cfg(cfg, finetune="lora", **optim):
    o = dict(steps=6, prompts_per_step=2, mini_batch_prompts=2, micro_batch_rows=4, lr=1e-3, checkpoint_every=3)
    o.update(optim)
    return cfg.replace(model=dict(finetune=finetune, lora_r=4, lora_alpha=8),
                       agent=dict(max_turns=2, max_step_tokens=40), tree=dict(M=2, N=1, L=1), optim=o)


def _trainer(cfg, policy_dir, make_env, questions, run_dir):
    from transformers import AutoTokenizer
    torch.manual_seed(cfg.optim.seed)
    tok = AutoTokenizer.from_pretrained(policy_dir)
    return Trainer(cfg, trainable_policy(policy_dir, cfg.model, torch.device("cpu")), tok, make_env(tok, 2),
                   questions, run_dir)


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _trained(tr):
    return [p.detach().clone() for p in tr.policy.parameters()]


def _assert_same_state(a, b):
    """Trained weights, AdamW moments and step counts, LR schedule: bitwise equal."""
    for (k, x), y in zip(a.policy.state_dict().items(), b.policy.state_dict().values(), strict=True):
        assert torch.equal(x, y), k
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
    for i, moments in sa["state"].items():
        for k, v in moments.items():
            assert torch.equal(v, sb["state"][i][k]), (i, k)
    assert a.scheduler.state_dict() == b.scheduler.state_dict()


@pytest.fixture(scope="module")
def straight(cfg, warm_policy_dir, make_env, train_questions, tmp_path_factory):
    """Six LoRA steps in one go, checkpoints at steps 3 and 6: the run that resumed runs must equal.
    Returns the trainer, its metric rows and its trained weights before the first step."""
    tr = _trainer(_cfg(cfg), warm_policy_dir, make_env, train_questions, tmp_path_factory.mktemp("straight"))
    initial = _trained(tr)
    return tr, tr.fit(progress=False), initial


def _copy_run(tr, dest):
    shutil.copytree(tr.run_dir, dest)
    return dest


def test_training_moves_weights_moments_and_schedule(straight):
    tr, rows, initial = straight
    assert any(r["adv_std"] > 0 for r in rows) and all(r["grad_norm"] > 0 for r in rows)
    assert all(not torch.equal(a, b) for a, b in zip(initial, _trained(tr), strict=True))
    moments = tr.optimizer.state_dict()["state"].values()
    assert len(moments) == len(initial)
    assert all(m["exp_avg"].abs().sum() > 0 and m["exp_avg_sq"].sum() > 0 and m["step"] == 6 for m in moments)
    assert tr.scheduler.last_epoch == 6
    ckpt = torch.load(tr.checkpoint_path, weights_only=False)
    prev = torch.load(tr.run_dir / PREVIOUS, weights_only=False)
    assert (ckpt["step"], prev["step"]) == (6, 3)
    assert all(not torch.equal(prev["weights"][k], w) for k, w in ckpt["weights"].items())   # steps 4-6 trained


def test_resume_continues_exactly(straight, cfg, warm_policy_dir, make_env, train_questions, tmp_path):
    tr, rows, _ = straight
    c = _cfg(cfg)
    first = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path)
    first.fit(steps=3, progress=False)
    at_three = _trained(first)
    resumed = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path)
    resumed_rows = resumed.fit(resume=True, progress=False)
    assert resumed.step_done == 6 and _strip(resumed_rows) == _strip(rows)
    assert all(not torch.equal(a, b) for a, b in zip(at_three, _trained(resumed), strict=True))
    _assert_same_state(tr, resumed)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5, 6]


def test_resume_falls_back_to_the_previous_checkpoint(straight, cfg, warm_policy_dir, make_env, train_questions,
                                                       tmp_path, caplog):
    tr, rows, _ = straight
    run = _copy_run(tr, tmp_path / "run")
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[:len(data) // 2])                      # truncated, as by a full disk
    resumed = _trainer(_cfg(cfg), warm_policy_dir, make_env, train_questions, run)
    with caplog.at_level(logging.WARNING, logger="tg.trainer"):
        resumed_rows = resumed.fit(resume=True, progress=False)
    assert f"{run / 'checkpoint.pt'} is unreadable" in caplog.text
    assert f"previous checkpoint {run / PREVIOUS} (step 3)" in caplog.text
    assert _strip(resumed_rows) == _strip(rows)
    _assert_same_state(tr, resumed)
    assert torch.load(run / PREVIOUS, weights_only=False)["step"] == 3   # the corrupt file was not kept as previous


def test_resume_under_a_config_that_trains_differently_is_refused(straight, cfg, warm_policy_dir, make_env,
                                                                 train_questions, tmp_path):
    """Trainer.fit(resume=True), the path of every resume (`tg train`, `tg mini run`, `tg mini rerun`), checks the
    config the checkpoint carries, whatever tg_config.json says."""
    run = _copy_run(straight[0], tmp_path / "run")
    other = _cfg(cfg, lr=0.5)
    other.save(run)
    tr = _trainer(other, warm_policy_dir, make_env, train_questions, run)
    with pytest.raises(RunDirError, match=r"optim.lr: 0.001 -> 0.5"):
        tr.fit(resume=True, progress=False)
    assert tr.step_done == 0


def test_a_prompt_that_fills_the_context_is_a_warning(cfg, warm_policy_dir, make_env, train_questions, caplog):
    """A question whose prompt fills agent.max_context_tokens samples nothing and trains on nothing: said, not silent."""
    from transformers import AutoTokenizer

    from tg.engines.engine import HFEngine
    from tg.trainer import sample_batch
    tok = AutoTokenizer.from_pretrained(warm_policy_dir)
    policy = trainable_policy(warm_policy_dir, cfg.model, torch.device("cpu"))
    env = make_env(tok, 1)
    short = len(env.prompt_ids(train_questions[0].question))
    tight = cfg.replace(agent=dict(max_context_tokens=short, max_step_tokens=8), tree=dict(M=1, N=0, L=0))
    with caplog.at_level(logging.WARNING, logger="tg.trainer"):
        trees, _ = sample_batch(HFEngine(policy.model, tok), env, train_questions[:1], tight, 0)
    assert f"1 of 1 questions have prompts of {short}+ tokens, filling agent.max_context_tokens = {short}" in caplog.text
    assert trees[0][0].trajectory(trees[0][0].leaves()[0]).policy_tokens == 0            # nothing to train on


@pytest.mark.parametrize("damage", ["both truncated", "garbage, no previous", "empty, no previous"])
def test_unreadable_checkpoint_names_its_path(straight, cfg, warm_policy_dir, make_env, train_questions, tmp_path,
                                              damage):
    run = _copy_run(straight[0], tmp_path / "run")
    if damage == "both truncated":
        for name in ("checkpoint.pt", PREVIOUS):
            (run / name).write_bytes((run / name).read_bytes()[:1000])
    else:
        (run / PREVIOUS).unlink()
        (run / "checkpoint.pt").write_bytes(b"" if damage.startswith("empty") else b"not a checkpoint" * 10)
    tr = _trainer(_cfg(cfg), warm_policy_dir, make_env, train_questions, run)
    with pytest.raises(RunDirError) as err:
        tr.load_checkpoint()
    message = str(err.value)
    assert f"checkpoint {run / 'checkpoint.pt'} is unreadable" in message and "\n" not in message
    assert (f"checkpoint {run / PREVIOUS} is unreadable" if damage == "both truncated" else f"no {run / PREVIOUS}") \
        in message


def test_interrupted_or_bad_checkpoint_write_keeps_the_previous_one(straight, cfg, warm_policy_dir, make_env,
                                                                   train_questions, tmp_path, monkeypatch):
    run = _copy_run(straight[0], tmp_path / "run")
    tr = _trainer(_cfg(cfg), warm_policy_dir, make_env, train_questions, run)
    assert tr.load_checkpoint() == 6
    before = {n: (run / n).read_bytes() for n in ("checkpoint.pt", PREVIOUS)}

    def killed(obj, f, *a, **k):
        f.write(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        tr.save_checkpoint()
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: f.write(b"written, but not a checkpoint"))
    with pytest.raises(RunDirError, match="checkpoint.pt.tmp is unreadable"):
        tr.save_checkpoint()
    monkeypatch.undo()
    assert {n: (run / n).read_bytes() for n in before} == before
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint.prev.pt", "checkpoint.pt"]
    assert _trainer(_cfg(cfg), warm_policy_dir, make_env, train_questions, run).load_checkpoint() == 6


def test_non_finite_rollout_or_loss_stop_without_checkpoint(cfg, warm_policy_dir, make_env, train_questions, tmp_path,
                                                            monkeypatch):
    tr = _trainer(_cfg(cfg, finetune="full"), warm_policy_dir, make_env, train_questions, tmp_path / "w")
    with torch.no_grad():
        next(iter(tr.policy.model.parameters())).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="step 1: rollout"):
        tr.fit(steps=2, progress=False)
    assert not tr.checkpoint_path.exists()
    tr = _trainer(_cfg(cfg), warm_policy_dir, make_env, train_questions, tmp_path / "l")
    tr.fit(steps=1, progress=False)
    saved = tr.checkpoint_path.read_bytes()
    import tg.trainer
    real = tg.trainer.grpo_loss
    monkeypatch.setattr(tg.trainer, "grpo_loss", lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]))
    with pytest.raises(NonFiniteError, match="step 2: loss is nan"):
        tr.fit(steps=2, progress=False)
    assert tr.checkpoint_path.read_bytes() == saved


def test_non_finite_weights_are_never_saved(cfg, warm_policy_dir, make_env, train_questions, tmp_path):
    """An infinite learning rate (optim.lr=Infinity) leaves a finite loss and gradient but NaN weights."""
    tr = _trainer(_cfg(cfg, finetune="full"), warm_policy_dir, make_env, train_questions, tmp_path)
    tr.fit(steps=1, progress=False)
    saved = tr.checkpoint_path.read_bytes()
    for group in tr.optimizer.param_groups:
        group["lr"] = float("inf")
    with pytest.raises(NonFiniteError, match=r"step 2: \d+ of \d+ weight tensors are not finite"):
        tr.fit(steps=2, progress=False)
    assert tr.checkpoint_path.read_bytes() == saved and not (tmp_path / PREVIOUS).exists()


@pytest.mark.parametrize("finetune", ["full", "lora", "qlora"])
def test_one_step_per_finetune_mode_changes_the_trained_weights(cfg, warm_policy_dir, make_env, train_questions,
                                                               tmp_path, finetune):
    tr = _trainer(_cfg(cfg, finetune=finetune, prompts_per_step=4, mini_batch_prompts=2), warm_policy_dir, make_env,
                  train_questions, tmp_path)
    before = _trained(tr)
    row = tr.step()
    assert row["trajectories"] == 4 and 0 <= row["format_valid"] <= 1
    assert row["adv_std"] > 0 and row["grad_norm"] > 0
    changed = [not torch.equal(a, b) for a, b in zip(before, _trained(tr), strict=True)]
    assert all(changed)       # two mini-batches: LoRA's A moves in the second, once the first has moved B off zero
    moments = tr.optimizer.state_dict()["state"].values()
    assert all(m["step"] == 2 for m in moments) and any(m["exp_avg_sq"].sum() > 0 for m in moments)
    assert tr.scheduler.last_epoch == 1
    # the engine samples from LoRA folded into a full-precision base; full weights and a 4-bit base as they are
    assert tr.engine.model is (tr.engine.folded if finetune == "lora" else tr.policy.model)
    assert (tr.engine.folded is None) == (finetune != "lora")


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_packed_trees_train_like_rows(cfg, warm_policy_dir, make_env, train_questions, tmp_path, finetune):
    """optim.pack_trees: the same step (rollout, advantages, loss with an entropy bonus, update) up to float
    summation order, which AdamW's per-element normalisation magnifies to a small share of the step size."""
    runs = {}
    for pack in (False, True):
        c = _cfg(cfg, finetune=finetune, prompts_per_step=4, mini_batch_prompts=2, micro_batch_rows=5, pack_trees=pack,
                 entropy_coef=0.01)
        tr = _trainer(c.replace(tree=dict(M=2, N=2, L=1)), warm_policy_dir, make_env, train_questions,
                      tmp_path / str(pack))
        before = _trained(tr)
        runs[pack] = (tr.step(), {k: v.clone() for k, v in tr.policy.state_dict().items()})
    (row, weights), (packed_row, packed_weights) = runs[False], runs[True]
    assert row["trajectories"] == packed_row["trajectories"] == 6 and row["adv_std"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, _trained(tr), strict=True))    # the step did train
    for k in ("loss", "pg_loss", "kl", "clip_frac", "entropy"):
        assert packed_row[k] == pytest.approx(row[k], rel=1e-4, abs=1e-6), k
    # AdamW normalises each gradient element, so float-order noise in near-zero ones moves a weight by a small
    # share of the step size (measured: 3e-5 of full fine-tuning's 2e-3 over two updates at lr 1e-3)
    for k, w in weights.items():
        assert packed_weights[k].float() == pytest.approx(w.float(), abs=0.1 * 1e-3), k


@pytest.mark.parametrize("pack", [False, True])
def test_update_equals_one_plain_masked_step(cfg, warm_policy_dir, make_env, train_questions, tmp_path, pack):
    """The update's speed-ups (the rows' common start run once, trees ordered longest first into micro-batches,
    packed trees) against the plain step they replace: every row in one forward with its padding mask, in
    rollout order, the loss, one backward, clip, AdamW. Equal up to float summation order."""
    from tg.loss import grpo_loss, token_logprobs
    c = _cfg(cfg, finetune="full", prompts_per_step=4, mini_batch_prompts=4, micro_batch_rows=5, pack_trees=pack)
    c = c.replace(tree=dict(M=2, N=2, L=1))
    tr = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path / "fast")
    plain = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path / "plain")
    seen = []
    update = tr.update
    tr.update = lambda rows: seen.append(rows) or update(rows)
    row = tr.step()
    rows = seen[0]
    micros = tr.micro_batches(rows)[0]
    assert len(set(rows.attn.sum(1).tolist())) > 1 and len(micros) > 1  # padding, micro-batches
    assert all(mb.shared > 0 for mb in micros)  # the prompt's instructions once per micro-batch
    assert any(mb.packed.ids.shape[0] < len(mb.idx) for mb in micros) == pack  # several rows of a tree packed
    o, model = c.optim, plain.policy.model
    with torch.no_grad(), plain.policy.reference_context():
        ref = token_logprobs(plain.policy.reference_model(input_ids=rows.ids, attention_mask=rows.attn).logits, rows.ids)
    model.train()
    logp = token_logprobs(model(input_ids=rows.ids, attention_mask=rows.attn).logits, rows.ids)
    loss, stats = grpo_loss(logp, logp.detach(), rows.adv, rows.mask.float(), ref_logp=ref, clip_low=o.clip_low,
                            clip_high=o.clip_high, agg=o.loss_agg, kl_beta=o.kl_beta)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(plain.policy.parameters(), o.grad_clip)
    plain.optimizer.step()
    assert row["loss"] == pytest.approx(float(loss.detach()), rel=1e-4, abs=1e-6)
    assert row["kl"] == pytest.approx(stats["kl"], rel=1e-4, abs=1e-7)
    moved = 0.0
    for (k, w), before in zip(tr.policy.state_dict().items(), _trainer(c, warm_policy_dir, make_env, train_questions,
                                                                       tmp_path / "start").policy.state_dict().values()):
        moved = max(moved, float((w - before).abs().max()))
        # AdamW's per-element normalisation turns float-order noise in near-zero gradient elements into a
        # small share of the step size lr (as in test_packed_trees_train_like_rows)
        assert w == pytest.approx(plain.policy.state_dict()[k], abs=0.1 * o.lr), k
    assert moved > 0.5 * o.lr                                                   # the step did train


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_logprobs_at_policy_tokens_train_like_whole_rows(cfg, warm_policy_dir, make_env, train_questions, tmp_path,
                                                        pack, entropy_coef):
    """The update takes log-probs and entropies at policy tokens only. Against the same forward's whole rows
    (every position's log-softmax, then the mask), micro-batch by micro-batch: the reference log-probs, the loss and
    every gradient are equal to the last bit with the paper's loss; with an entropy bonus the gradient's terms add
    in another order, so they agree to float rounding."""
    from tg.loss import entropy, grpo_loss, token_logprobs
    from tg.packing import packed_logits
    c = _cfg(cfg, finetune="full", prompts_per_step=4, mini_batch_prompts=4, micro_batch_rows=5, pack_trees=pack,
             entropy_coef=entropy_coef).replace(tree=dict(M=2, N=2, L=1))
    tr = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path)
    seen = []
    update = tr.update
    tr.update = lambda rows: seen.append(rows) or update(rows)
    tr.step()
    rows, o, model = seen[0], c.optim, tr.policy.model
    micros = tr.micro_batches(rows)[0]
    by_tree = [mb.packed is not None and mb.packed.ids.shape[0] < len(mb.idx) for mb in micros]
    assert any(by_tree) == pack and len(micros) > 1 and all(mb.shared > 0 for mb in micros)

    def whole_rows(m, mb, tree_packed):
        """[B, width, V] logits of the micro-batch's rows from the forward the trainer runs (its shared prefix
        once): positions before the shared prefix's end, prompt tokens the mask leaves out, take any logits."""
        P, s = mb.packed.ids.shape[1], mb.shared
        where = mb.packed.where // P * (P - s) + (mb.packed.where % P - s).clamp(min=0)
        trees = [rows.tree[int(r)] for r in mb.idx]     # packed rows go by tree, in order (tg.batch.micro_inputs)
        order = sorted(range(len(trees)), key=trees.__getitem__) if tree_packed else range(len(trees))
        return packed_logits(m, mb.packed, s)[where][torch.tensor(order).argsort()]

    grads = []
    model.train()
    for mb, tree_packed in zip(micros, by_tree):
        (ref,) = tr._frozen_logprobs([mb], reference=True)
        with torch.no_grad(), tr.policy.reference_context():
            whole_ref = token_logprobs(whole_rows(tr.policy.reference_model, mb, tree_packed), mb.ids)
        assert torch.equal(ref[mb.policy], whole_ref[mb.policy])
        mask = rows.mask[mb.idx, :mb.ids.shape[1]].float()
        assert int(mask.sum()) == len(mb.at) > 0 and not mask[:, 0].any()
        runs = []
        for fast in (True, False):
            model.zero_grad(set_to_none=True)
            if fast:
                stats = tr._micro_loss(rows, mb, None, ref, weight=1.0)
            else:
                logits = whole_rows(model, mb, tree_packed)
                logp = token_logprobs(logits, mb.ids)
                loss, stats = grpo_loss(logp, logp.detach(), rows.adv[mb.idx], mask, ref_logp=whole_ref,
                                        entropy=torch.nn.functional.pad(entropy(logits[:, :-1]), (1, 0)),
                                        clip_low=o.clip_low,
                                        clip_high=o.clip_high, agg=o.loss_agg, kl_beta=o.kl_beta,
                                        entropy_coef=o.entropy_coef)
                loss.backward()
                stats["loss"] = float(loss.detach())
            runs.append((stats, [p.grad.clone() for p in model.parameters()]))
        (fast_stats, fast_grads), (slow_stats, slow_grads) = runs
        for k in ("loss", "pg_loss", "kl", "entropy", "clip_frac"):
            assert fast_stats[k] == slow_stats[k], k
        grads.append((fast_grads, slow_grads))
    for fast_grads, slow_grads in grads:
        assert any(g.abs().max() > 0 for g in fast_grads)                          # a real gradient
        for a, b in zip(fast_grads, slow_grads, strict=True):
            if entropy_coef == 0:
                assert torch.equal(a, b)
            else:  # float rounding of the sum: far below the gradient's own scale
                assert (a - b).abs().max() <= 1e-4 * b.abs().max()


def test_qlora_in_bf16_keeps_activations_in_bf16(cfg, warm_policy_dir):
    """QLoRA under bf16 (the GPU path): the base's non-4-bit weights stay bf16 and so do the activations.
    peft's prepare_model_for_kbit_training would cast them to fp32; on an H200 that ran attention
    unfused and the tiny policy's longest micro-batch out of 140 GiB (bench/README.md, "On a GPU")."""
    c = cfg.replace(model=dict(finetune="qlora", dtype="bfloat16", lora_r=4, lora_alpha=8, gradient_checkpointing=True))
    model = trainable_policy(warm_policy_dir, c.model, torch.device("cpu")).model
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


def test_a_step_with_the_entropy_node_rule(cfg, warm_policy_dir, make_env, train_questions, tmp_path, monkeypatch):
    """tree.node_rule=entropy end to end: the trainer's rollout picks every tree's nodes with `entropy_nodes`, on the
    entropies the HF engine reported (a step without them would raise), and trains on M (1 + L N) rows per prompt."""
    import tg.tree
    calls = []
    spy = lambda tree, n, rng: calls.append(n) or tg.tree.entropy_nodes(tree, n, rng)  # noqa: E731
    monkeypatch.setitem(tg.tree.NODE_RULES, "entropy", spy)
    c = _cfg(cfg, steps=1).replace(tree=dict(node_rule="entropy"))
    (row,) = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path).fit(progress=False)
    assert calls == [c.tree.N] * c.tree.M * c.optim.prompts_per_step
    assert row["trajectories"] == c.tree.group_size == 4


def test_gradient_checkpointing_runs_the_shared_start_per_row_and_trains_alike(cfg, warm_policy_dir, make_env,
                                                                             train_questions, tmp_path):
    """Gradient checkpointing's recomputation (transformers) drops a layer's cache, so under it the rows' common
    start runs in every row (`shared` 0); the step is the shared-prefix step's up to float summation order."""
    runs = {}
    for ckpt in (False, True):
        c = _cfg(cfg, finetune="full", prompts_per_step=4, mini_batch_prompts=4, micro_batch_rows=5)
        c = c.replace(tree=dict(M=2, N=2, L=1), model=dict(gradient_checkpointing=ckpt))
        tr = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path / str(ckpt))
        seen = []
        update = tr.update
        tr.update = lambda rows, update=update: seen.append(rows) or update(rows)
        row = tr.step()
        runs[ckpt] = row, tr.policy.state_dict(), [mb.shared for mb in tr.micro_batches(seen[0])[0]]
    (row, weights, shared), (ckpt_row, ckpt_weights, ckpt_shared) = runs[False], runs[True]
    assert min(shared) > 0 and ckpt_shared == [0] * len(shared)
    for k in ("loss", "pg_loss", "kl", "entropy"):
        assert ckpt_row[k] == pytest.approx(row[k], rel=1e-4, abs=1e-6), k
    for k, w in weights.items():  # AdamW magnifies float-order noise to a small share of lr (as above)
        assert ckpt_weights[k] == pytest.approx(w, abs=0.1 * 1e-3), k


@pytest.mark.parametrize("shape", [dict(M=2, N=1, L=1), dict(M=3, N=0, L=0)])
def test_the_worked_advantage_and_loss_plugged_in_train_like_tg(cfg, warm_policy_dir, make_env, train_questions,
                                                               tmp_path, shape):
    """Notebook 05's seams: notebooks/solutions.py's Eq. 7 and Eq. 8 as the trainer's advantage_fn and loss_fn give
    tg's own run, step for step (a tree, and chains: trees of one leaf), and are called on every step."""
    from tg.experiments.lesson import solution
    c = _cfg(cfg, steps=3, checkpoint_every=0).replace(tree=shape)
    tg_run = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path / "tg")
    mine = _trainer(c, warm_policy_dir, make_env, train_questions, tmp_path / "mine")
    calls = {"advantage": 0, "loss": 0}

    def counted(key, fn):
        def call(*a, **k):
            calls[key] += 1
            return fn(*a, **k)
        return call
    mine.advantage_fn = counted("advantage", solution("03-tree-advantages"))
    mine.loss_fn = counted("loss", solution("03-grpo-loss"))
    want, got = _strip(tg_run.fit(progress=False)), _strip(mine.fit(progress=False))
    assert calls["advantage"] == 3 and calls["loss"] >= 3
    assert [r["reward"] for r in got] == [r["reward"] for r in want] and want[-1]["grad_norm"] > 0
    for a, b in zip(want, got, strict=True):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6)
    for x, y in zip(_trained(tg_run), _trained(mine), strict=True):
        assert torch.allclose(x, y, atol=1e-6)


def test_a_replaced_loss_needs_the_paper_loss_in_the_config(cfg, warm_policy_dir, make_env, train_questions, tmp_path):
    from tg.config import ConfigError
    tr = _trainer(_cfg(cfg, steps=1, checkpoint_every=0, loss_agg="token-mean"), warm_policy_dir, make_env,
                  train_questions, tmp_path)
    tr.loss_fn = lambda *a, **k: torch.zeros(())
    with pytest.raises(ConfigError, match="optim.loss_agg"):
        tr.step()
