"""What the notebooks share: one set-up call and self-checking exercises.

`setup()` prints the config (the first thing every run shows), then loads what a lesson works with:
questions, retriever, environment, the starting policy and a rollout engine. It holds no paper logic:
notebooks call `tg.tree`, `tg.advantage`, `tg.loss`, ... themselves, with `Lesson.rollout_kw()` for
the sampling arguments every rollout repeats.

`exercise(key, *answers)` is the self-check's first line. A student's blank answer is `...`: the
cell stops with "not answered yet", never showing a solution. The test runner sets TG_SOLUTIONS=1
(`conftest.py`, the Makefile); then a blank is filled from `notebooks/solutions.py`, keyed by
exercise id, so CI runs every check against a worked answer while the shipped notebooks stay blank.
"""

from __future__ import annotations

import importlib.util
import os
import random
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tg.agent.data import Question, is_single_hop
from tg.agent.env import Environment
from tg.agent.policy import load_policy
from tg.agent.protocol import prompt_ids
from tg.agent.world import resolve
from tg.config import Config, load_config
from tg.engines.engine import HFEngine, Sampling
from tg.pipeline import Resources, load_resources

SOLUTIONS_FILE = "notebooks/solutions.py"
SOLUTIONS_ENV = "TG_SOLUTIONS"


@dataclass
class Lesson:
    """A notebook's config and, unless `setup(policy=False)`, its resources, policy, env and engine."""

    cfg: Config
    res: Resources | None = None
    model: Any = None
    tok: Any = None
    env: Environment | None = None
    engine: HFEngine | None = None

    @property
    def sampling(self) -> Sampling:
        """The training rollouts' sampling: agent.temperature, agent.top_p, optim.seed."""
        return Sampling(self.cfg.agent.temperature, self.cfg.agent.top_p, seed=self.cfg.optim.seed)

    def rollout_kw(self, seed: int | None = None) -> dict[str, Any]:
        """Keyword arguments of `tg.tree.sample_trees` besides the shape: sampling, a fresh node-choice
        rng (same seed, same picks), the node rule and the per-step and context token caps."""
        seed = self.cfg.optim.seed if seed is None else seed
        a = self.cfg.agent
        return dict(sampling=Sampling(a.temperature, a.top_p, seed=seed), rng=random.Random(seed),
                    node_rule=self.cfg.tree.node_rule, max_step_tokens=a.max_step_tokens,
                    max_context_tokens=a.max_context_tokens)

    def questions(self, split: str = "train", hops: str = "multi") -> list[Question]:
        """The split's single-hop ("single") or multi-hop ("multi") questions, in file order."""
        if hops not in ("single", "multi"):
            raise ValueError(f"hops must be 'single' or 'multi', got {hops!r}")
        pool = self.res.train if split == "train" else self.res.test
        return [q for q in pool if is_single_hop(q.data_source) == (hops == "single")]

    def prompts(self, questions: list[Question]) -> list[list[int]]:
        """Each question's prompt ids through the chat template (`tg.agent.protocol.prompt_ids`)."""
        return [prompt_ids(self.tok, q.question) for q in questions]


def setup(preset: str | None = None, *, policy: bool = True, threads: int | None = 1,
          verbose: bool = True) -> Lesson:
    """The config of `preset` (None: TG_PRESET, else the CPU preset), printed first when `verbose`;
    with `policy`, also the resources (world, retriever: cached on disk), the starting policy,
    the environment and an HF rollout engine.

    `threads` sets torch's intra-op threads: the tiny policy's matrices are too small to gain from
    more than one, and two threads on a busy 2-core machine ran about 10x slower.
    """
    cfg = load_config(preset)
    if verbose:
        print(cfg)
    if threads:
        torch.set_num_threads(threads)
    if not policy:
        return Lesson(cfg)
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    return Lesson(cfg, res, model, tok, res.env(tok, cfg), HFEngine(model, tok, prefix_reuse=cfg.tree.prefix_reuse))


class NotAnswered(Exception):
    """An exercise's answer is still the blank `...`."""

    def _render_traceback_(self) -> list[str]:   # IPython shows this one line instead of a traceback
        return [f"NotAnswered: {self}"]


def solution(key: str, **given: Any) -> Any:
    """The worked answer of exercise `key` from notebooks/solutions.py (a value, or a callable of `given`)."""
    spec = importlib.util.spec_from_file_location("tg_notebook_solutions", resolve(SOLUTIONS_FILE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if key not in module.SOLUTIONS:
        raise KeyError(f"{SOLUTIONS_FILE} has no solution for exercise {key!r}")
    value: Any | Callable[..., Any] = module.SOLUTIONS[key]
    return value(**given) if callable(value) else value


def exercise(key: str, *answers: Any, **given: Any) -> Any:
    """The student's answers, unchanged when none is blank (`...`); one value for one answer, else a tuple.

    A blank stops the cell (NotAnswered) unless TG_SOLUTIONS=1, which fills it from `solution(key, **given)`
    (a tuple with one entry per answer when there are several). Answers already given are kept.
    """
    if not answers:
        raise ValueError("exercise() needs the answer variables")
    if any(a is ... for a in answers):
        if os.environ.get(SOLUTIONS_ENV) != "1":
            raise NotAnswered(f"exercise {key!r} is not answered yet: replace each `...` in the cell above "
                              "with your answer, run it, then run this cell")
        worked = solution(key, **given)
        worked = worked if len(answers) > 1 else (worked,)
        if len(worked) != len(answers):
            raise ValueError(f"solution {key!r} has {len(worked)} answers, the notebook asks {len(answers)}")
        answers = tuple(w if a is ... else a for a, w in zip(answers, worked))
    return answers[0] if len(answers) == 1 else answers
