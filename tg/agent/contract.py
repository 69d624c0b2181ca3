"""The plug-in contract: what an `Environment` and a `Reward` return, checked where it enters the rollout and the
trainer (docs/environments.md#what-the-trainer-checks).

`CheckedEnv` holds an environment to its contract where the rollout reads it; `checked_reward` holds one leaf's
reward to its contract where the trainer scores the leaf. A breach raises `tg.agent.env.PluginError`: one line
naming the class, the question and the fault, before anything is appended to a context or trained on.

Choices, numbered:
1. An observation longer than agent.max_obs_tokens is refused, not truncated. A cut the environment does not see
   falls anywhere (through a closing `</information>`, say), and the policy would train on ids the environment
   never returned (token in, token out); the environment knows the cap, and `encode_observation` applies it.
2. A reward is a finite real with |r| <= `MAX_ABS_REWARD` (1e6). Advantages divide by a group's standard
   deviation (Eq. 5-7, in float64): from about |r| = 1e154 on, the squares overflow, the deviation is inf and
   every advantage is 0, so nothing is learnt and nothing says so. The kit's rewards lie in [-0.2, 1]; 1e6 leaves
   six orders of magnitude for other scales, and since advantages are normalised per group, rescaling a reward
   does not change what is learnt.
"""

from __future__ import annotations

import math
import numbers
import sys
from functools import partial
from typing import Any, Sequence

import torch

from tg.agent.env import Environment, PluginError, Reward
from tg.agent.protocol import Step
from tg.engines.engine import GenOut

MAX_ABS_REWARD = 1e6
"""The largest |reward| the trainer accepts (choice 2 above)."""


def question_label(question: str, width: int = 60) -> str:
    """`question` for an error line: whitespace collapsed, cut to `width` characters."""
    text = " ".join(question.split())
    return f"question {text if len(text) <= width else text[:width - 3] + '...'!r}"


def plugin_name(obj: Any) -> str:
    """The name of an environment or reward in an error line: a function's, else its class's."""
    while isinstance(obj, partial):
        obj = obj.func
    return getattr(obj, "__name__", None) or type(obj).__name__


def _id_fault(ids: Any, vocab_size: int | None) -> str | None:
    """What is wrong with a list of token ids (None when nothing): not a sequence, a non-integer, or outside
    [0, vocab_size)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        return f"token ids are a {type(ids).__name__}, not a list of int"
    for t in ids:
        if not isinstance(t, numbers.Integral):
            return f"token id {t!r} is a {type(t).__name__}, not an int"
        if t < 0 and vocab_size is None:
            return f"token id {t} is negative"
        if vocab_size is not None and not 0 <= t < vocab_size:
            return f"token id {t} is outside the tokenizer's vocabulary of {vocab_size} (ids 0 to {vocab_size - 1})"
    return None


class CheckedEnv:
    """`env` held to its contract (itself an `Environment`). With `vocab_size` and `max_obs_tokens` (the trainer's)
    ids and observations are checked against them; without, the rollout still checks that every generated step
    gets exactly one well-formed `Step`."""

    def __init__(self, env: Environment, vocab_size: int | None = None, max_obs_tokens: int | None = None) -> None:
        self.env, self.vocab_size, self.max_obs_tokens = env, vocab_size, max_obs_tokens
        self.name = plugin_name(env)
        self._asked: dict[tuple[int, ...], str] = {}
        """Prompt ids -> question, for naming the question of a row in an error."""

    def prompt_ids(self, question: str) -> list[int]:
        """`env.prompt_ids(question)`, checked: a non-empty list of ids of the vocabulary."""
        ids = self.env.prompt_ids(question)
        fault = _id_fault(ids, self.vocab_size) or (None if len(ids) else "the prompt is empty")
        if fault:
            raise PluginError(f"{self.name}.prompt_ids, {question_label(question)}: {fault}")
        self._asked[tuple(ids)] = question
        return list(ids)

    def which(self, contexts: Sequence[Sequence[int]] | None, row: int) -> str:
        """The question of row `row`: the one whose prompt (asked through `prompt_ids`) starts the row's context,
        else the row's index."""
        if contexts is not None and row < len(contexts):
            for n in {len(p) for p in self._asked}:
                if (q := self._asked.get(tuple(contexts[row][:n]))) is not None:
                    return question_label(q)
        return f"row {row} of the batch"

    def observe(self, outs: Sequence[GenOut], turns: Sequence[int],
                contexts: Sequence[Sequence[int]] | None = None) -> list[Step]:
        """`env.observe(outs, turns)`, checked: exactly one `Step` per generated step, in order, keeping the sampled
        ids; each observation at most `max_obs_tokens` ids of the vocabulary. `contexts[i]`, the context row i
        started from, names its question in an error."""
        steps = self.env.observe(outs, turns)
        if not isinstance(steps, (list, tuple)) or len(steps) != len(outs):
            got = f"{len(steps)} steps" if isinstance(steps, (list, tuple)) else f"a {type(steps).__name__}"
            raise PluginError(f"{self.name}.observe returned {got} for {len(outs)} generated steps "
                              f"({self.which(contexts, 0)}); return one Step per GenOut, in order")
        for i, (out, step) in enumerate(zip(outs, steps)):
            fault = self._step_fault(out, step)
            if fault:
                raise PluginError(f"{self.name}.observe, {self.which(contexts, i)}: {fault}")
        return list(steps)

    def _step_fault(self, out: GenOut, step: Any) -> str | None:
        if not isinstance(step, Step):
            return f"returned a {type(step).__name__}, not a tg.agent.protocol.Step"
        if not isinstance(step.gen_ids, (list, tuple)) or list(step.gen_ids) != list(out.ids):
            return "gen_ids are not the sampled ids; keep GenOut.ids as they are (tg.agent.env.generated_step)"
        fault = _id_fault(step.obs_ids, self.vocab_size)
        if fault:
            return f"observation {fault}"
        if self.max_obs_tokens is not None and len(step.obs_ids) > self.max_obs_tokens:
            return (f"{len(step.obs_ids)} observation tokens exceed agent.max_obs_tokens={self.max_obs_tokens}; "
                    "encode the observation with tg.agent.env.encode_observation(tokenizer, text, max_obs_tokens)")
        return None


def _real(value: Any) -> float | None:
    """`value` as a float if it is one real number (bool, int, float, a numpy scalar, a tensor of one value)."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 and not value.is_complex() else None
    if not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past the float range: the largest float of its sign, which the bound refuses
        return sys.float_info.max if value > 0 else -sys.float_info.max


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of {value.numel()} values" if value.numel() != 1 else f"a {value.dtype} tensor"
    return "None" if value is None else f"a {type(value).__name__} ({str(value)[:20]!r})"


def checked_reward(reward_fn: Reward, step_texts: Sequence[str], golden_answers: Sequence[str],
                   question: str) -> float:
    """One leaf's reward from `reward_fn`, as a float: one real number (bool, int, float, a numpy scalar, a tensor of
    one value), finite, with |r| <= MAX_ABS_REWARD. Anything else, or an exception, is a `PluginError` naming the
    reward and `question`."""
    where = f"{plugin_name(reward_fn)}, {question_label(question)}"
    try:
        value = reward_fn(step_texts, golden_answers)
    except Exception as err:  # noqa: BLE001 (any failure of user code, re-raised as one line)
        raise PluginError(f"{where}: the reward raised {type(err).__name__}: {' '.join(str(err).split())}") from err
    r = _real(value)
    if r is None:
        raise PluginError(f"{where}: the reward returned {_describe(value)}, not one real number")
    if not math.isfinite(r):
        raise PluginError(f"{where}: the reward is {r}, not finite")
    if abs(r) > MAX_ABS_REWARD:
        raise PluginError(f"{where}: the reward {r:g} is outside [-1e6, 1e6] (tg.agent.contract.MAX_ABS_REWARD); "
                          "rescale it: advantages are normalised per group, so the scale changes nothing learnt")
    return r
