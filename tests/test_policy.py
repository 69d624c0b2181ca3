"""The tiny policy: Qwen2 class, word-level tokenizer round trip, and a hub-like save/load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

from tg.agent.policy import build_tiny_policy, load_policy, resolve_dtype, save_policy
from tg.agent.protocol import INVALID_ACTION, PROTOCOL_TAGS, build_prompt, format_observation, parse_action, prompt_ids
from tg.agent.world import World, build_world
from tg.config import DataConfig, ModelConfig


@pytest.fixture(scope="module")
def world() -> World:
    return build_world(DataConfig())


@pytest.fixture(scope="module")
def policy(world: World):
    return build_tiny_policy(ModelConfig(), world)


def test_model_is_qwen2_with_toy_sizes(policy) -> None:
    model, tok = policy
    assert isinstance(model, Qwen2ForCausalLM) and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok) < 600
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6


def test_tags_and_markers_are_single_tokens(policy) -> None:
    _, tok = policy
    for t in (*PROTOCOL_TAGS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    assert tok.decode(tok.encode("<think> a </think>"), skip_special_tokens=True).split() == ["<think>", "a", "</think>"]
    assert tok.pad_token_id != tok.unk_token_id and tok.eos_token == "<|im_end|>"


def test_round_trip_on_world_texts(policy, world: World) -> None:
    _, tok = policy
    name = world.entities[0].name
    texts = world.texts() + [build_prompt(f"Who founded {name}?"), INVALID_ACTION,
                             format_observation([{"title": d["title"], "contents": d["contents"]} for d in world.corpus[:3]]),
                             "Doc 12(Title: 1987) 3,5 ; x!"]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.unk_token_id not in ids or text.endswith("x!"), text
        assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids, text
    assert tok.encode("\n\n", add_special_tokens=False) == [tok.convert_tokens_to_ids("\n")] * 2
    assert tok.convert_ids_to_tokens(tok.encode("1987", add_special_tokens=False)) == ["1", "9", "8", "7"]


def test_chat_prompt_is_qwen_style(policy, world: World) -> None:
    _, tok = policy
    name = world.entities[0].name
    ids = prompt_ids(tok, f"Who founded {name}")
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens[:3] == ["<|im_start|>", "user", "\n"]
    assert tokens[-5:] == ["<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]
    assert tok.decode(ids).count("?") == 1
    step = tok.decode(tok.encode(f"<think> x </think> <search> {name} </search>"))
    assert parse_action(step).argument == name


def test_save_load_identical_logits(policy, world: World, tmp_path: Path) -> None:
    model, tok = policy
    name = world.entities[0].name
    save_policy(model, tok, tmp_path)
    loaded, tok2 = load_policy(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)  # a hub-like directory: AutoTokenizer keeps the word level
    text = f"<think> I need the founder of {name}. </think> <search> {name} </search>\n"
    assert tok2.encode(text) == auto.encode(text) == tok.encode(text)
    assert tok2.chat_template == tok.chat_template
    ids = torch.tensor([prompt_ids(tok2, f"Who founded {name}?")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.generation_config.eos_token_id == model.generation_config.eos_token_id


def test_seeded_init_and_dtype() -> None:
    small = build_world(DataConfig(n_people=20, n_companies=8, n_cities=6, n_countries=3, n_test_single=5,
                                   n_test_multi=5))
    a, _ = build_tiny_policy(ModelConfig(), small, seed=1)
    b, _ = build_tiny_policy(ModelConfig(), small, seed=1)
    c, _ = build_tiny_policy(ModelConfig(), small, seed=2)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("auto", "cuda") == torch.bfloat16
