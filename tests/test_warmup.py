"""Warm-up: demonstrations are token-exact episodes, the shared-prefix loss equals the plain one, a shortened
warm-up learns the protocol from scratch, and the pinned starting policies are checked by hash."""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
from typing import Any

import pytest
import torch

from tg.agent import warmup
from tg.agent.data import Question
from tg.agent.policy import build_tiny_policy, load_policy
from tg.agent.protocol import format_observation, prompt_ids
from tg.agent.sft import (batches, collate, demonstration, lr_factor, masked_lm_loss, name_groups,
                          pick_demonstrations, rename, renaming_tables, script, short_prompt_ids)
from tg.agent.warmup import PINNED, PINNED_DIR, PolicyError, build_warmup, machine, sha256_of, warmed_up_policy, warmup_dir
from tg.agent.world import MULTI, SINGLE, load_world
from tg.config import Config, WarmupConfig, load_config
from tg.engines.engine import HFEngine
from tg.evaluate import evaluate
from tg.pipeline import load_resources
from tg.reward import is_valid_format


def greedy_scores(model: Any, tok: Any, res: Any, cfg: Config, questions: list[Question]) -> tuple[float, float]:
    """(format-valid rate, EM) of greedy chains on `questions`, with the kit's evaluator (tg.evaluate).

    A transcript holds each search step's observation after it; `is_valid_format` accepts a step text that
    carries its observation, so splitting after each `</information>` gives it the step texts."""
    result = evaluate(HFEngine(model, tok), res.env(tok, cfg), tok, questions, batch_size=cfg.eval.batch_size,
                      max_step_tokens=cfg.agent.max_step_tokens)
    valid = [is_valid_format(re.split(r"(?<=</information>)", t)) for t in result.transcripts]
    return sum(valid) / len(valid), sum(result.scores) / len(result.scores)


# ---- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world_and_retriever(world_dir, retriever):
    """The cpu preset's world and its cached BM25 (conftest's `world_dir` and `retriever`)."""
    return load_world(world_dir), retriever


# ---- unit tests -------------------------------------------------------------------------------------

def test_script_one_search_per_hop_and_early_stop() -> None:
    q = {"relations": ["founder", "birthplace"], "hops": ["Zanto", "Aldo"], "chain": ["Aldo", "Borv"]}
    full, early = script(q), script(q, early_stop=True)
    assert [s[1] for s in full] == ["Zanto", "Aldo", None]
    assert full[1][0] == ("<think> Zanto's founder is Aldo. I need the birthplace of Aldo. </think> "
                          "<search> Aldo </search>")
    assert full[2][0] == "<think> Aldo's birthplace is Borv. </think> <answer> Borv </answer>"
    assert full[-1][0].endswith("<answer> Borv </answer>")
    assert [s[1] for s in early] == ["Zanto", None] and early[-1][0].endswith("<answer> Aldo </answer>")


def test_demonstration_is_token_exact(cfg: Config, world_and_retriever) -> None:
    world, retriever = world_and_retriever
    _, tok = build_tiny_policy(cfg.model, world)
    q = world.questions("train", MULTI)[0]
    demo = demonstration(q, tok, retriever, cfg.data.top_k)
    assert demo.prompt_ids == prompt_ids(tok, q["question"])
    assert len(demo.steps) == len(q["hops"]) + 1 and demo.reward == 1.0 and demo.tool_calls == len(q["hops"])
    for step, hop in zip(demo.steps, q["hops"]):
        assert step.action.kind == "search" and step.action.argument == hop and step.docs[0] == hop
        docs = retriever.search([hop], cfg.data.top_k)[0]
        assert step.obs_ids == tok.encode(format_observation(docs), add_special_tokens=False)
    assert demo.steps[-1].obs_ids == [] and demo.answer == q["golden_answers"][0]
    assert sum(demo.mask) == sum(len(s.gen_ids) for s in demo.steps)
    assert tok.unk_token_id not in demo.ids


def test_short_prompt_keeps_the_question_line(cfg: Config, world_and_retriever) -> None:
    world, retriever = world_and_retriever
    _, tok = build_tiny_policy(cfg.model, world)
    q = world.questions("train", SINGLE)[0]
    full, short = prompt_ids(tok, q["question"]), short_prompt_ids(tok, q["question"])
    assert len(short) < 30 < 100 < len(full) and full[-len(short) + 3:] == short[3:]  # same tail after 'user \n'
    a, b = demonstration(q, tok, retriever, 3), demonstration(q, tok, retriever, 3, instruction=False)
    assert a.response_ids == b.response_ids and a.response_mask == b.response_mask


def test_renaming_is_a_consistent_relabelling_within_types(cfg: Config, world_and_retriever) -> None:
    world, retriever = world_and_retriever
    _, tok = build_tiny_policy(cfg.model, world)
    groups = name_groups(world, tok)
    assert sorted(len(g) for g in groups) == sorted([cfg.data.n_countries, cfg.data.n_cities, cfg.data.n_companies,
                                                     cfg.data.n_people])
    tables = renaming_tables(groups, len(tok), 4, torch.Generator().manual_seed(0))
    for g in groups:  # a permutation of each type's ids, different per row
        assert all(sorted(t[g].tolist()) == sorted(g.tolist()) for t in tables)
        assert len({tuple(t[g].tolist()) for t in tables}) == 4
    others = torch.ones(len(tok), dtype=torch.bool)
    others[torch.cat(list(groups))] = False
    assert (tables[:, others] == torch.arange(len(tok))[others]).all()
    demos = [demonstration(q, tok, retriever, 3) for q in world.questions("train", MULTI)[:4]]
    batch = collate(demos, tok.pad_token_id)
    renamed = rename(batch, tables)
    assert ((renamed.labels == -100) == (batch.labels == -100)).all()
    names = {tok.convert_ids_to_tokens(i): tok.convert_ids_to_tokens(int(tables[0, i])) for g in groups for i in g.tolist()}
    words = [names.get(w, w) for w in tok.convert_ids_to_tokens(demos[0].ids)]  # the episode, renamed word by word
    assert renamed.ids[0, :len(demos[0].ids)].tolist() == tok.convert_tokens_to_ids(words)
    assert renamed.prefix <= batch.prefix and (renamed.ids[:, :renamed.prefix] == renamed.ids[:1, :renamed.prefix]).all()


def test_demonstration_mix_follows_knobs(cfg: Config, world_and_retriever) -> None:
    world, _ = world_and_retriever
    knobs = WarmupConfig(n_demos=200, multi_hop_share=0.25, early_stop_share=0.4)
    picked = pick_demonstrations(world, knobs)
    multi = [early for q, early in picked if q["data_source"] == MULTI]
    assert len(picked) == 200 and len(multi) == 50 and sum(multi) == 20
    assert all(q["id"].startswith("train-") for q, _ in picked)
    assert picked == pick_demonstrations(world, knobs)


def test_shared_prefix_loss_equals_plain_loss(cfg: Config, world_and_retriever) -> None:
    world, retriever = world_and_retriever
    model, tok = build_tiny_policy(cfg.model, world)
    demos = [demonstration(q, tok, retriever, 3, e) for q, e in pick_demonstrations(world, cfg.warmup)[:6]]
    batch = collate(demos, tok.pad_token_id)
    assert batch.prefix > 50  # the instruction before 'Question :'
    shared = masked_lm_loss(model, batch)
    plain = masked_lm_loss(model, dataclasses.replace(batch, prefix=0))
    assert torch.allclose(shared, plain, atol=1e-5)
    g_shared = torch.autograd.grad(shared, list(model.parameters()))
    g_plain = torch.autograd.grad(plain, list(model.parameters()))
    assert max((a - b).abs().max().item() for a, b in zip(g_shared, g_plain)) < 1e-5


def test_batches_cover_epochs_and_group_lengths() -> None:
    lengths = list(range(100))
    out = batches(lengths, 10, 20, random.Random(0), pool=10)  # a pool = one epoch here
    assert len(out) == 20 and all(len(b) == 10 for b in out)
    assert sorted(i for b in out[:10] for i in b) == list(range(100))  # first epoch: each row once
    assert sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in out) < 20 * 50
    assert [lr_factor(s, 100) for s in (0, 4, 50, 80, 99)] == [0.2, 1.0, 1.0, 1.0, 0.05]  # trapezoid


# ---- a shortened warm-up learns ---------------------------------------------------------------------

SHORT_WARMUP = ("warmup.multi_hop_share=0", "data.top_k=1", "warmup.n_demos=300", "warmup.batch_size=8",
                "warmup.steps=800", "agent.max_step_tokens=64")
"""The cpu preset's warm-up, shortened to about a minute of one core (the full one takes 9-13): one-hop
demonstrations only and one document per search (shorter episodes), 8 demonstrations per step (the
transition to copying names out of documents comes after a number of steps more than of tokens: 800 steps
of 8 reach it where 400 of 16 do not), and a 64-token step cap for the evaluation (a demonstration's longest
step has about 30 tokens; an untrained policy would otherwise babble 500 per step). The model, world, lr,
renaming, observation loss and curriculum are the preset's."""


def test_a_shortened_warm_up_learns_the_protocol(tmp_path) -> None:
    """Trained through `build_warmup` from a random start and scored greedily on the 150 held-out one-hop test
    questions. Measured (one core, warm-up seeds 0 / 1 / 2, 56-58 s CPU each): format-valid 0.0 -> 1.0 / 1.0 /
    1.0; EM 0.0 -> 0.45 / 0.033 / 0.04. Only seed 0 learnt to copy the answer out of the retrieved document
    within this budget; the other two answer a name of the right kind (about type-aware guessing). So the EM
    threshold checks that the policy answers with names, not that it reads: the copying crossing is stochastic
    (tg/warmup.py) and needs more steps than two minutes allow at every seed measured. Thresholds below the
    weakest seed, so they hold on CPU kinds whose floats differ."""
    cfg = load_config("cpu", *SHORT_WARMUP)
    path = build_warmup(cfg, tmp_path / "warmup", progress=False)
    run_cfg = cfg.replace(model=dict(name_or_path=str(path)))
    res = load_resources(run_cfg)
    single, _ = res.test_sets(run_cfg)
    untrained = build_tiny_policy(cfg.model, load_world(res.data_dir), seed=cfg.warmup.seed)
    start_valid, start_em = greedy_scores(*untrained, res, run_cfg, single)
    valid, em = greedy_scores(*load_policy(path), res, run_cfg, single)
    assert len(single) == 150 and start_valid == 0.0 and start_em == 0.0
    assert valid >= 0.9, f"format-valid {valid:.3f} after a shortened warm-up (measured 1.0 at seeds 0-2)"
    assert em >= 0.02, f"held-out one-hop EM {em:.3f} after a shortened warm-up (measured 0.033-0.45 at seeds 0-2)"


# ---- the pinned starting policies ------------------------------------------------------------------

def test_the_default_start_is_the_pinned_policy_checked_by_hash(cfg: Config, tmp_path, monkeypatch) -> None:
    path = warmed_up_policy(cfg)
    assert path == PINNED_DIR / warmup_dir(cfg).name and warmup_dir(cfg).name in PINNED
    assert sha256_of(path / "model.safetensors") == PINNED[path.name]
    damaged = tmp_path / path.name
    shutil.copytree(path, damaged)
    data = bytearray((damaged / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (damaged / "model.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(warmup, "PINNED_DIR", tmp_path)
    with pytest.raises(PolicyError, match=r"model\.safetensors: sha256 .* expected 00f7348b7b12"):
        warmed_up_policy(cfg)


def test_nothing_rebuilds_a_warm_up_unless_asked(cfg: Config, tmp_path) -> None:
    other = cfg.replace(warmup=dict(steps=5), cache_dir=str(tmp_path))
    with pytest.raises(PolicyError, match=r"tg warmup --rebuild"):
        warmed_up_policy(other)
    assert not any(tmp_path.iterdir())


def test_how_rl_uses_the_policy_keys_no_separate_warm_up():
    from tg.pipeline import warmup_config
    base = warmup_dir(warmup_config(load_config("cpu")))
    for extra in (["model.finetune=qlora", "model.dtype=bfloat16"], ["model.finetune=lora", "data.setting=single-hop"]):
        assert warmup_dir(warmup_config(load_config("cpu", *extra))) == base   # gpu_smoke.sh reuses the CPU cache
    assert warmup_dir(warmup_config(load_config("cpu", "model.hidden_size=64", "model.num_heads=2"))) != base


def test_where_rl_retrieves_keys_no_separate_warm_up():
    """The warm-up searches the world in-process: pointing RL at a retrieval server keeps both pinned starts."""
    from tg.experiments.cells import REGIMES
    from tg.pipeline import warmup_config
    pinned = {"moderate": "warmup-fb4da30d3995-722e49", "hard": "warmup-2f9bf1528d85-722e49"}
    for regime, name in pinned.items():
        for extra in ([], ["data.retriever=http", "data.retriever_url=http://127.0.0.1:8123/retrieve"]):
            assert warmup_dir(warmup_config(load_config("cpu", *REGIMES[regime], *extra))).name == name
    assert warmup_dir(warmup_config(load_config("cpu", "data.top_k=2"))).name != pinned["moderate"]  # demos show k


def test_machine_names_the_cpu_and_torchs_isa() -> None:
    """Recorded in a rebuilt warm-up's warmup.json: its floats depend on the CPU's kernels."""
    name = machine()
    assert name.endswith(f" (torch's ISA {torch.backends.cpu.get_cpu_capability()})")
    assert not name.startswith(" (")
