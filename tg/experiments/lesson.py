"""What the notebooks share: one set-up call, self-checking exercises and predictions.

`setup()` prints a summary of at most six lines (preset and config hash, model, world, starting policy,
engine and device); `print(lab.cfg)` prints the whole config. It then loads what a lesson works with:
questions, retriever, environment, the starting policy and a rollout engine. It holds no paper logic:
notebooks call `tg.tree`, `tg.advantage`, `tg.loss`, ... themselves, with `Lesson.rollout_kw()` for
the sampling arguments every rollout repeats.

`exercise(key, *answers)` is the self-check's first line. A student's blank answer is `...`, or a
function whose body is only `...` (a build-it-yourself exercise, e.g. `my_tree_advantages`): the cell
stops with "not answered yet", never showing a solution. The test runner sets TG_SOLUTIONS=1
(`conftest.py`, the Makefile); then a blank is filled from `notebooks/solutions.py`, keyed by
exercise id, so CI runs every check against a worked answer while the shipped notebooks stay blank.
A wrong answer stops with `NotYet` and a hint; `diagnose` picks the hint by matching the answer against
the typical mistakes (`tg.experiments.exercises` holds the checks). `versus` compares a one-line
prediction with what a cell then measures.
"""

from __future__ import annotations

import contextlib
import dis
import importlib.util
import logging
import math
import os
import random
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

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


def em_by_hops(result: Any) -> dict[str, float]:
    """An evaluation's (`tg.evaluate.EvalResult`) EM averaged over its single-hop and over its multi-hop sources,
    {"single": ..., "multi": ...}, picked by name (`tg.agent.data.is_single_hop`), never by column position."""
    by = result.by_source()
    return {hops: float(sum(v for k, v in by.items() if is_single_hop(k) == (hops == "single"))
                        / max(1, sum(is_single_hop(k) == (hops == "single") for k in by)))
            for hops in ("single", "multi")}


def summary(cfg: Config, res: Resources | None = None, model: Any = None) -> str:
    """At most six lines: preset and config hash, model, world, starting policy (with `res`), engine and device."""
    m, d, a = cfg.model, cfg.data, cfg.agent
    n_fields = sum(len(fields(g)) if hasattr(g, "__dataclass_fields__") else 1
                   for g in (getattr(cfg, f.name) for f in fields(cfg)))
    name = (f"tiny Qwen2 ({m.num_layers} layers, hidden {m.hidden_size})" if m.name_or_path == "tiny"
            else m.name_or_path)
    lines = [f"preset {cfg.preset!r}, config {cfg.hash()}  (print(lab.cfg) shows all {n_fields} fields)",
             f"model   {name}, {m.finetune} fine-tuning",
             f"world   {d.source} {d.setting}, {d.retriever} retriever, top {d.top_k}"
             + (f": {len(res.train)} train / {len(res.test)} test questions" if res else "")]
    if res is not None:
        lines.append(f"policy  {_policy_name(res.policy_path)}")
    device = next(model.parameters()).device if model is not None else "not loaded"
    lines.append(f"engine  {a.engine} (prefix reuse {'on' if cfg.tree.prefix_reuse else 'off'}); "
                 f"device {device}, {torch.get_num_threads()} torch thread(s)")
    return "\n".join(lines)


def _policy_name(path: str) -> str:
    """'pinned <dir> (sha256 <12 hex>)' for a committed starting policy, else the path or hub id."""
    from tg.agent.warmup import PINNED
    name = Path(path).name
    return f"pinned {name} (sha256 {PINNED[name][:12]})" if name in PINNED else str(path)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' "Loading weights" bars off while the policy loads (notebook output stays the lesson's)."""
    from transformers.utils import logging as hf_logging
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def setup(preset: str | None = None, *, policy: bool = True, threads: int | None = 1,
          verbose: bool = True) -> Lesson:
    """The config of `preset` (None: TG_PRESET, else the CPU preset); with `policy`, also the resources
    (world, retriever: cached on disk), the starting policy, the environment and an HF rollout engine.
    When `verbose`, prints `summary` (at most six lines; `print(lab.cfg)` gives the whole config).

    `threads` sets torch's intra-op threads: the tiny policy's matrices are too small to gain from
    more than one, and two threads on a busy 2-core machine ran about 10x slower.
    """
    cfg = load_config(preset)
    if threads:
        torch.set_num_threads(threads)
    # bitsandbytes logs, on CPUs with AVX512-BF16, that an optional faster 4-bit kernel package ("kernels") is
    # absent; QLoRA runs without it on its own CPU path, so the notice is not shown in the lessons
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    if not policy:
        if verbose:
            print(summary(cfg))
        return Lesson(cfg)
    res = load_resources(cfg)
    with quiet_loading():
        model, tok = load_policy(res.policy_path)
    if verbose:
        print(summary(cfg, res, model))
    return Lesson(cfg, res, model, tok, res.env(tok, cfg), HFEngine(model, tok, prefix_reuse=cfg.tree.prefix_reuse))


class NotAnswered(Exception):
    """An exercise's answer is still the blank `...` (or a function whose body is only `...`)."""

    def _render_traceback_(self) -> list[str]:   # IPython shows this one line instead of a traceback
        return [f"NotAnswered: {self}"]


class NotYet(AssertionError):
    """An exercise's answer is wrong; the message is the hint that names the likely mistake."""

    def _render_traceback_(self) -> list[str]:
        return [f"NotYet: {self}"]


_DOES_NOTHING = {"RESUME", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "POP_TOP", "CACHE"}


def is_blank(answer: Any) -> bool:
    """`...`, or a function whose body is only `...`, `pass` or `return ...` (one that returns another constant,
    e.g. `return 0`, is an answer: a wrong one)."""
    code = getattr(answer, "__code__", None)
    return answer is ... or (code is not None and all(
        i.opname in _DOES_NOTHING and (i.opname not in ("LOAD_CONST", "RETURN_CONST") or i.argval in (None, ...))
        for i in dis.get_instructions(code)))


def diagnose(got: Any, want: Any, mistakes: Mapping[str, Any], close: Callable[[Any, Any], bool]) -> str | None:
    """None when close(got, want); else the hint (key) of the first mistake whose value `got` is close to,
    or "" when it matches none of them."""
    if close(got, want):
        return None
    return next((hint for hint, value in mistakes.items() if close(got, value)), "")


def near(mine: float, exact: float, decimals: int = 2) -> bool:
    """A hand answer rounded to `decimals` places (or better) is near the exact value: 0.33 and 0.3333 for 1/3."""
    return abs(float(mine) - exact) <= 0.5 * 10 ** -decimals + 1e-12


def versus(guess: Any, measured: float, what: str, fmt: str = ".2f") -> str:
    """One line comparing a student's prediction with the measurement (a blank `...` guess is allowed)."""
    if guess is ... or guess is None:
        return f"{what}: measured {measured:{fmt}} (no guess written: set it in the cell above, then rerun both)"
    off = float(measured) - float(guess)
    rel = f", {abs(off) / abs(float(guess)):.0%} off" if float(guess) and math.isfinite(off) else ""
    return f"{what}: you guessed {float(guess):{fmt}}, measured {measured:{fmt}} ({off:+{fmt}}{rel})"


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
    """The student's answers, unchanged when none is blank (`is_blank`); one value for one answer, else a tuple.

    A blank stops the cell (NotAnswered) unless TG_SOLUTIONS=1, which fills it from `solution(key, **given)`
    (a tuple with one entry per answer when there are several; for a function exercise, the worked
    function). Answers already given are kept.
    """
    if not answers:
        raise ValueError("exercise() needs the answer variables")
    if any(is_blank(a) for a in answers):
        if os.environ.get(SOLUTIONS_ENV) != "1":
            raise NotAnswered(f"exercise {key!r} is not answered yet: replace each `...` in the cell above "
                              "with your answer (or your code), run it, then run this cell")
        worked = solution(key, **given)
        worked = worked if len(answers) > 1 else (worked,)
        if len(worked) != len(answers):
            raise ValueError(f"solution {key!r} has {len(worked)} answers, the notebook asks {len(answers)}")
        answers = tuple(w if is_blank(a) else a for a, w in zip(answers, worked))
    return answers[0] if len(answers) == 1 else answers
