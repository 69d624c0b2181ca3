"""One frozen config per run, grouped (the groups and every field's meaning: tg.config_groups); presets and the
one switch.

`load_config()` is the only place that reads `TG_PRESET`. Variants are made with
`dataclasses.replace` (or `Config.with_overrides("tree.M=4", ...)`), never by mutation.
Invalid values raise `ConfigError` naming the field and the allowed range.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tg.config_groups import (SMOL_NAME, AgentConfig, DataConfig, EvalConfig, ModelConfig, OptimConfig, TreeConfig,
                              WarmupConfig)
from tg.config_values import ConfigError, check_types, did_you_mean, field_types, parse_value
from tg.config_values import check as _check

PRESET_ENV = "TG_PRESET"
DEFAULT_PRESET = "cpu"

ADDED_FIELDS: dict[tuple[str, str], Any] = {("optim", "pack_trees"): False, ("optim", "rollout_shards"): 1,
                                            ("optim", "parallel"): "auto", ("optim", "ratio"): "token",
                                            ("optim", "step_groups"): 0.0, ("agent", "env"): "search"}
"""(group, field) -> default of the fields added after config hashes keyed committed results (Config.hash)."""


@dataclass(frozen=True)
class Config:
    """A whole run. Print it first (`print(cfg)`), save it beside the results (`cfg.save(dir)`)."""

    preset: str = DEFAULT_PRESET
    """The preset this config came from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cache_dir: str = ".cache/tg"
    """Warm-up checkpoints, built worlds and indexes, keyed by config hash (relative to the repo root)."""

    def __post_init__(self) -> None:
        check_types("", self)
        _check(self.preset in PRESETS, "preset", ", ".join(sorted(PRESETS)), self.preset)
        _check(self.cache_dir != "", "cache_dir", "a directory", self.cache_dir)
        for name, kind in _GROUP_TYPES.items():
            group = getattr(self, name)
            _check(isinstance(group, kind), name, f"a {kind.__name__}", group)
            check_types(f"{name}.", group)
            group.validate()
        _check(self.optim.step_groups == 0 or self.tree.is_chain, "optim.step_groups",
               "0 with trees (step groups are for chains: set tree.N=0 tree.L=0, or optim.step_groups=0)",
               self.optim.step_groups)
        _check(self.optim.step_groups == 0 or self.optim.ratio == "token", "optim.step_groups",
               "0 with optim.ratio=sequence (a sequence ratio takes one advantage per trajectory)", self.optim.step_groups)

    # ---- variants, hashing, printing, saving -------------------------------------------------
    def replace(self, **groups: Any) -> "Config":
        """`cfg.replace(tree=dict(M=4), optim=dict(lr=3e-4))`: a new validated config."""
        new = {}
        for name, changes in groups.items():
            cur = getattr(self, name)
            new[name] = dataclasses.replace(cur, **changes) if dataclasses.is_dataclass(cur) else changes
        return dataclasses.replace(self, **new)

    def with_overrides(self, *assignments: str) -> "Config":
        """Apply 'group.field=value' strings (CLI --set); each value is read by its field's type
        (`tg.config_values.parse_value`), then the whole config is type- and range-checked."""
        groups: dict[str, dict[str, Any]] = {}
        for a in assignments:
            key, sep, raw = a.partition("=")
            group, dot, name = key.partition(".")
            hints = field_types(_GROUP_TYPES[group]) if group in _GROUP_TYPES else {}
            if not sep or not dot or name not in hints:
                raise ConfigError(f"override {a!r} is not 'group.field=value' with a known field"
                                  f"{did_you_mean(key, self._field_names())}; see `tg config`")
            groups.setdefault(group, {})[name] = parse_value(raw, hints[name])
        return self.replace(**groups)

    def _field_names(self) -> list[str]:
        """Every settable field as 'group.field'."""
        return [f"{g}.{name}" for g, tp in _GROUP_TYPES.items() for name in field_types(tp)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hash(self, *groups: str) -> str:
        """A short stable hash of the whole config, or of the named groups only (e.g. for caches). A field
        added after results were keyed by it (`ADDED_FIELDS`) counts only when set off its default, so
        the hashes of earlier runs, caches and committed result rows stay what they were."""
        d = self.to_dict()
        for (group, name), default in ADDED_FIELDS.items():
            if d[group][name] == default:
                del d[group][name]
        if groups:
            d = {g: d[g] for g in groups}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "tg_config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        groups = {f.name: f.type for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in d.items():
            if name not in groups:
                raise ConfigError(f"unknown config group `{name}` in saved config")
            if isinstance(value, dict):
                sub = _GROUP_TYPES[name]
                unknown = sorted(set(value) - {f.name for f in fields(sub)})
                if unknown:
                    raise ConfigError(f"unknown field(s) {', '.join(unknown)} in group `{name}` of a saved config")
                value = sub(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
            kwargs[name] = value
        return cls(**kwargs)

    def __str__(self) -> str:
        rows = [f"preset: {self.preset}   hash: {self.hash()}"]
        for g in fields(self):
            v = getattr(self, g.name)
            if not dataclasses.is_dataclass(v):
                rows.append(f"  {g.name:<28} {v}")
                continue
            rows.append(f"[{g.name}]")
            rows += [f"  {f.name:<28} {getattr(v, f.name)}" for f in fields(v)]
        return "\n".join(rows)


_GROUP_TYPES = {"model": ModelConfig, "data": DataConfig, "warmup": WarmupConfig, "agent": AgentConfig,
                "tree": TreeConfig, "optim": OptimConfig, "eval": EvalConfig}


def _paper(setting: str, model: str = "Qwen/Qwen2.5-1.5B") -> dict[str, Any]:
    """The paper's recipe (paper Table 5) for one of its Table 1 models, adapted to one GPU with QLoRA;
    departures: docs/gpu.md. `--recipe full` switches to the paper's full fine-tuning (RECIPES)."""
    return dict(
        model=ModelConfig(name_or_path=model, finetune="qlora", dtype="auto", lora_r=64,
                          lora_alpha=128, gradient_checkpointing=True),
        data=DataConfig(source="files", setting=setting, data_dir=f"data/{setting}", retriever="http"),
        warmup=WarmupConfig(enabled=False),
        agent=AgentConfig(),
        tree=TreeConfig(M=2, N=2, L=1),
        # LoRA learns with a far larger step than full fine-tuning's 1e-6 (the paper's value):
        # 1e-5 is a conservative LoRA rate for a 1.5B model (about 10x full FT, the usual LoRA ratio).
        # micro_batch_rows is memory only (accumulation gives the same gradient): 2 rows of the longest
        # sample (4,596 tokens) need ~20 GiB of activations, mostly the 151,936-wide logits (tg.gpu.estimate).
        optim=OptimConfig(steps=180, prompts_per_step=512, mini_batch_prompts=64, micro_batch_rows=2, lr=1e-5,
                          warmup_ratio=0.285, checkpoint_every=20, eval_every=60, pack_trees=False),
        eval=EvalConfig(n_single=0, n_multi=0, batch_size=256),  # every question of every test set (paper App. A)
    )


def _smol() -> dict[str, Any]:
    """The paper recipe's code path on a laptop CPU: SmolLM2-135M-Instruct (a pretrained Llama-class instruct model,
    tg.agent.smol) with its BPE tokenizer and ChatML template, the paper's prompt, LoRA, the HF engine, in the
    synthetic world. A short LoRA warm-up teaches it the protocol first (its zero-shot trajectories are never
    well-formed). Sizes are the cpu preset's cut to what a 135M model's step costs on 2 cores
    (docs/gpu.md#the-smol-preset)."""
    return dict(
        model=ModelConfig(name_or_path=SMOL_NAME, finetune="lora", lora_r=16, lora_alpha=32),
        warmup=WarmupConfig(n_demos=240, multi_hop_share=0.6, early_stop_share=0.3, steps=60, batch_size=4, lr=1e-3,
                            observation_loss=False),
        agent=AgentConfig(max_step_tokens=128),
        optim=OptimConfig(steps=6, prompts_per_step=4, mini_batch_prompts=4, micro_batch_rows=6, lr=1e-4,
                          checkpoint_every=2),
        eval=EvalConfig(n_single=50, n_multi=50, batch_size=50),
    )


TABLE1_MODELS: dict[str, str] = {"1.5b": "Qwen/Qwen2.5-1.5B", "3b": "Qwen/Qwen2.5-3B", "llama-3b": "meta-llama/Llama-3.2-3B",
                                  "7b": "Qwen/Qwen2.5-7B", "14b": "Qwen/Qwen2.5-14B"}
"""The paper's Table 1 models by preset tag (paper-TAG-single-hop / paper-TAG-multi-hop)."""

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {},
    "smol": _smol(),
    **{f"paper-{tag}-{setting}": _paper(setting, model) for tag, model in TABLE1_MODELS.items()
       for setting in ("single-hop", "multi-hop")},
}


SCHEDULES: dict[str, tuple[str, ...]] = {
    # paper Table 5: 180 steps of 512 prompts, 8 PPO updates of 64 prompts each (92,160 prompts seen).
    "paper": ("optim.steps=180", "optim.prompts_per_step=512", "optim.mini_batch_prompts=64"),
    # A few GPU-hours (docs/gpu.md#schedules for the estimate): 60 steps of 64 prompts (3,840 prompts,
    # 1/24 of the paper's), 4 updates of 16 prompts per step; warm-up ratio, LR and the tree unchanged.
    "quick": ("optim.steps=60", "optim.prompts_per_step=64", "optim.mini_batch_prompts=16"),
}
"""Named training schedules for the paper presets: override bundles, applied before the user's overrides."""

RECIPES: dict[str, tuple[str, ...]] = {
    # the paper's setting (Table 5): every weight trained in bf16 at lr 1e-6; over K GPUs FSDP2 shards it
    # (optim.parallel=auto); gradient checkpointing keeps the activations of 4,596-token rows in memory.
    "full": ("model.finetune=full", "model.dtype=bfloat16", "optim.lr=1e-6", "model.gradient_checkpointing=true"),
    "qlora": (),
}
"""Named fine-tuning recipes (`--recipe`): override bundles applied after the schedule, before the user's."""


def load_config(preset: str | None = None, *overrides: str, schedule: str | None = None,
                recipe: str | None = None) -> Config:
    """The one switch: the named preset, else $TG_PRESET, else 'cpu'; then the schedule's overrides
    (SCHEDULES, optional), the recipe's (RECIPES, optional), then 'group.field=value' overrides."""
    name = preset or os.environ.get(PRESET_ENV) or DEFAULT_PRESET
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (from {'argument' if preset else PRESET_ENV}); "
                          f"valid presets: {', '.join(sorted(PRESETS))}")
    if schedule is not None and schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; valid schedules: {', '.join(sorted(SCHEDULES))}")
    if recipe is not None and recipe not in RECIPES:
        raise ConfigError(f"unknown recipe {recipe!r}; valid recipes: {', '.join(sorted(RECIPES))}")
    return Config(preset=name, **PRESETS[name]).with_overrides(*SCHEDULES.get(schedule or "", ()),
                                                               *RECIPES.get(recipe or "", ()), *overrides)
