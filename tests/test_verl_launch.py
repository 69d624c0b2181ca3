"""docs/verl.md's launch commands as verl itself reads them (run in .venv-verl: `make test-verl`): each fenced block
is composed by verl's own Hydra config, checked by verl's `validate_config` (what `verl.trainer.main_ppo` runs
before it starts Ray), and every tree name in it resolves. In .venv (no verl) the whole file skips."""

from __future__ import annotations

import os
import pathlib
import re
import shlex

import pytest

V = pytest.importorskip("tg.integrations.verl", exc_type=ImportError)
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402


DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "verl.md"


def _fenced(section: str, lang: str = "bash") -> str:
    """The first fenced block under docs/verl.md's heading `section`."""
    text = DOCS.read_text()
    body = text[text.index(f"# {section}\n"):]
    return re.search(rf"```{lang}\n(.*?)```", body, re.S).group(1)


def _overrides(block: str) -> list[str]:
    """A shell block's Hydra overrides: line continuations joined, the launcher dropped, $VARS expanded."""
    args = shlex.split(block.replace("\\\n", " "))
    if "verl.trainer.main_ppo" in args:
        args = args[args.index("verl.trainer.main_ppo") + 1:]
    return [os.path.expandvars(a) for a in args]


def _compose(overrides: list[str]):
    """verl's own `ppo_trainer` config with `overrides`, as `python -m verl.trainer.main_ppo` composes it."""
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(pathlib.Path(verl.__file__).parent / "trainer" / "config"),
                               version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def _validate(config) -> None:
    """What `verl.trainer.main_ppo.main` checks before it starts Ray, then what the tree pieces check."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    opts = V.tree_options(config.algorithm)
    V.check_engine(config.actor_rollout_ref.rollout.name)
    assert get_adv_estimator_fn(config.algorithm.adv_estimator) is V.compute_tree_grpo_advantage
    assert get_trainer_cls(config.trainer.v1.trainer_mode) is V.TreeTrainer
    hook = config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook
    module, name = hook.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is V.setup_worker
    manager = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert manager == f"{V.__name__}.TreeAgentLoopManager"
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == V.AGENT_LOOP
    assert config.data.max_response_length == V.response_budget(opts)       # no leaf is cut (rule 3)


def test_documented_command_passes_verl_validate_config():
    config = _compose(_overrides(_fenced("One node, 8 GPUs")))
    _validate(config)
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (1, 8)


def test_documented_multi_node_command_passes_verl_validate_config():
    config = _compose(_overrides(_fenced("One node, 8 GPUs")) + _overrides(_fenced("Several nodes")))
    _validate(config)
    assert config.trainer.nnodes == 2
    assert "RETRIEVER_HOST" in config.algorithm.tree_grpo.retriever_url


def test_documented_short_snippet_composes():
    snippet = [line.split("#")[0].strip() for line in _fenced("Tree-GRPO in verl", lang="").splitlines()]
    config = _compose([line for line in snippet if line])
    assert config.algorithm.adv_estimator == V.ESTIMATOR and config.trainer.v1.trainer_mode == V.TRAINER


def test_documented_gpu_install_brings_what_the_kit_imports():
    """The GPU install line names verl's extra and every package the integration imports beyond verl."""
    line = next(x for x in _fenced("Install").splitlines() if x.startswith("pip install 'verl["))
    assert "vllm" in line and "bm25s" in line.split() and "--no-deps" in _fenced("Install")


def test_documented_flash_attention_fallback_passes_verl_validate_config():
    text = DOCS.read_text()
    install = text[text.index("## Install\n"):text.index("## The paper's Table 5")]
    fallback = re.search(r"`(\+actor_rollout_ref\.model\.override_config\.attn_implementation=sdpa[^`]*)`", install)
    config = _compose(_overrides(_fenced("One node, 8 GPUs")) + fallback.group(1).split())
    _validate(config)
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert config.actor_rollout_ref.model.use_remove_padding is False
