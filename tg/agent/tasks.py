"""The tasks a config names (`agent.env`): each one's environment, reward and questions, in one place.

    agent.env     environment      reward                                   questions
    'search'      SearchEnv        tg.reward.reward (agent.reward: Eq. 13)   data.* (the world or prepared files)
    'calculator'  CalculatorEnv    calculator_reward (Eq. 13, numeric)       calculator_splits (generated)

A tool of one's own needs no entry here: pass its environment and reward to `tg.trainer.Trainer`
(docs/environments.md).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from tg.agent.calculator import CalculatorEnv, calculator_reward, calculator_splits
from tg.agent.data import Question, load_split
from tg.agent.env import Environment, Reward, SearchEnv
from tg.config import Config
from tg.reward import reward

CALCULATOR_TRAIN, CALCULATOR_TEST = 2000, 100
"""Calculator questions per split (seeded by data.world_seed)."""


def make_env(cfg: Config, tokenizer: Any, retriever: Any) -> Environment:
    """The config's environment on `tokenizer`; `retriever` serves the search task (None for the calculator)."""
    a = cfg.agent
    if a.env == "calculator":
        return CalculatorEnv(tokenizer, max_obs_tokens=a.max_obs_tokens, max_turns=a.max_turns)
    return SearchEnv(tokenizer, retriever, top_k=cfg.data.top_k, max_obs_tokens=a.max_obs_tokens,
                     max_turns=a.max_turns)


def make_reward(cfg: Config) -> Reward:
    """The config's reward: step texts and gold answers -> float in [-agent.format_penalty, 1]."""
    a = cfg.agent
    if a.env == "calculator":
        return partial(calculator_reward, format_penalty=a.format_penalty)
    return partial(reward, mode=a.reward, format_penalty=a.format_penalty)


def task_questions(cfg: Config, data_dir: Path) -> tuple[list[Question], list[Question]]:
    """(train, test) questions of the config's task: the files in `data_dir`, or the generated calculator ones."""
    if cfg.agent.env == "calculator":
        return calculator_splits(CALCULATOR_TRAIN, CALCULATOR_TEST, cfg.data.world_seed)
    return load_split(data_dir, "train"), load_split(data_dir, "test")
