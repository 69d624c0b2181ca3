"""Shared fixtures: the synthetic world, a random-init tiny policy (the paper model's class), the pinned
warmed-up policy (for tests that train), the env."""

from unittest import mock

import pytest
import torch

from tg.agent.data import load_split
from tg.agent.env import SearchEnv
from tg.agent.policy import build_tiny_policy
from tg.agent.retrieval import CachedRetriever, bm25_for
from tg.agent.warmup import warmed_up_policy
from tg.agent.world import ensure_world, load_world
from tg.config import load_config


@pytest.fixture(scope="session")
def cfg():
    return load_config("cpu")


@pytest.fixture(scope="session")
def world_dir(cfg):
    return ensure_world(cfg.data, cfg.cache_dir)


@pytest.fixture(scope="session")
def random_policy(cfg, world_dir):
    """A random-init tiny Qwen2 and the world's tokenizer: protocol-blind, but every code path runs. It never
    writes a valid format, so every leaf scores the same and every advantage is 0: tests that train use
    `warm_policy_dir`, whose rewards differ."""
    torch.manual_seed(0)
    model, tok = build_tiny_policy(cfg.model, load_world(world_dir))
    return model.eval(), tok


@pytest.fixture(scope="session")
def warm_policy_dir(cfg):
    """The pinned warmed-up policy of the cpu preset (model + tokenizer directory): it follows the protocol
    and answers some questions right, so its leaves' rewards differ and training moves the weights."""
    return warmed_up_policy(cfg)


@pytest.fixture(scope="session")
def retriever(world_dir):
    return CachedRetriever(bm25_for(world_dir / "corpus.jsonl"))


@pytest.fixture(scope="session")
def make_env(retriever):
    def make(tokenizer, max_turns=3, max_obs_tokens=500):
        return SearchEnv(tokenizer, retriever, top_k=3, max_obs_tokens=max_obs_tokens, max_turns=max_turns)
    return make


@pytest.fixture(scope="session")
def train_questions(world_dir):
    return load_split(world_dir, "train")


@pytest.fixture(scope="module")
def no_gc_collect():
    """gc.collect() as a no-op for a module's tests: statsmodels' Holm (`multipletests`, tg.experiments.verdict)
    calls it on every call, about 0.5 s in a test worker's heap, and it is no part of the arithmetic."""
    with mock.patch("gc.collect"):
        yield
