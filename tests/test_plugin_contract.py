"""The plug-in contract (docs/environments.md#what-the-trainer-checks): what a user's `Environment` or `Reward`
returns is checked where it enters the trainer. Each breach below stops `Trainer.fit` with one `PluginError` line
naming the class, the question and the fault, before anything is trained on it: no metrics row, no checkpoint.
The environments wrap the search tool with the pinned warmed-up policy, which searches, so steps carry
observations; a breach is injected into every step (or one leaf's reward) so the run meets it on its first step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from tg.agent.env import PluginError
from tg.agent.finetune import trainable_policy
from tg.reward import reward
from tg.trainer import Trainer

CAP = 40
"""agent.max_obs_tokens of these runs."""


def _cfg(cfg):
    return cfg.replace(model=dict(finetune="lora", lora_r=4, lora_alpha=8),
                       agent=dict(max_turns=2, max_step_tokens=30, max_obs_tokens=CAP), tree=dict(M=2, N=1, L=1),
                       optim=dict(steps=1, prompts_per_step=2, mini_batch_prompts=2, micro_batch_rows=8,
                                  checkpoint_every=1))


class Wrapped:
    """The search environment, passed through; subclasses break one rule of the contract."""

    def __init__(self, inner, tok) -> None:
        self.inner, self.tok = inner, tok

    def prompt_ids(self, question: str) -> list[int]:
        return self.inner.prompt_ids(question)

    def observe(self, outs, turns):
        return self.inner.observe(outs, turns)


class LongObservations(Wrapped):
    """Every step observes one token more than agent.max_obs_tokens."""

    def observe(self, outs, turns):
        steps = super().observe(outs, turns)
        for s in steps:
            s.obs_ids = [self.tok.convert_tokens_to_ids("Rumen")] * (CAP + 1)
        return steps


class OneStepFewer(Wrapped):
    """Drops the last step of every batch of two or more."""

    def observe(self, outs, turns):
        steps = super().observe(outs, turns)
        return steps[:-1] if len(steps) > 1 else steps


class OutOfVocabulary(Wrapped):
    """Every observation ends with the id one past the tokenizer's last."""

    def observe(self, outs, turns):
        steps = super().observe(outs, turns)
        for s in steps:
            s.obs_ids = s.obs_ids[:CAP - 1] + [len(self.tok)]
        return steps


class BadOnOne:
    """The search reward, except on the leaves of one question (found by its gold answers): `value`, or raise."""

    def __init__(self, golds, value) -> None:
        self.golds, self.value = tuple(golds), value

    def __call__(self, step_texts, golden_answers):
        if tuple(golden_answers) != self.golds:
            return reward(step_texts, golden_answers)
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


@pytest.fixture(scope="module")
def tok(warm_policy_dir):
    return AutoTokenizer.from_pretrained(warm_policy_dir)


@pytest.fixture
def trainer(cfg, warm_policy_dir, tok, make_env, train_questions, tmp_path):
    def make(env_class=Wrapped, reward_fn=None):
        c = _cfg(cfg)
        torch.manual_seed(c.optim.seed)
        env = env_class(make_env(tok, max_turns=2, max_obs_tokens=CAP), tok)
        return Trainer(c, trainable_policy(warm_policy_dir, c.model, torch.device("cpu")), tok, env,
                       train_questions, tmp_path / "run", reward_fn=reward_fn)
    return make


def _stopped(tr, *expected: str) -> str:
    """Fit one step; it must stop with one PluginError line holding `expected`, leaving no row and no checkpoint."""
    with pytest.raises(PluginError) as info:
        tr.fit(progress=False)
    msg = str(info.value)
    assert "\n" not in msg and all(e in msg for e in expected), msg
    metrics = tr.run_dir / "metrics.jsonl"
    assert not (metrics.exists() and metrics.read_text().strip()), "a metrics row was written"
    assert not tr.checkpoint_path.exists()
    return msg


def test_an_observation_longer_than_max_obs_tokens_stops_the_run(trainer):
    tr = trainer(LongObservations)
    q = tr.batch_questions(0)[0].question
    _stopped(tr, "LongObservations.observe", q[:30], f"{CAP + 1} observation tokens", f"agent.max_obs_tokens={CAP}")


def test_one_step_fewer_than_generated_stops_the_run(trainer):
    tr = trainer(OneStepFewer)
    _stopped(tr, "OneStepFewer.observe", tr.batch_questions(0)[0].question[:30], "returned 3 steps for 4")


def test_an_out_of_vocabulary_id_stops_the_run(trainer, tok):
    tr = trainer(OutOfVocabulary)
    _stopped(tr, "OutOfVocabulary.observe", tr.batch_questions(0)[0].question[:30], f"token id {len(tok)}",
             f"vocabulary of {len(tok)}")


@pytest.mark.parametrize("value, fault", [
    (float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan"), (1e200, "1e+200"), (-1e200, "-1e+200"),
    (None, "None"), ("1.0", "str"), (torch.tensor([1.0, 0.0]), "2 values"), (ValueError("judge\nfailed"), "ValueError"),
])
def test_a_bad_reward_stops_the_run(trainer, train_questions, value, fault):
    tr = trainer()
    q = tr.batch_questions(0)[1]
    tr.reward_fn = BadOnOne(q.golden_answers, value)
    msg = _stopped(tr, "BadOnOne", q.question[:30], fault)
    if isinstance(value, Exception):
        assert "judge failed" in msg


def test_rewards_of_every_accepted_kind_train(trainer):
    """int, bool, numpy and 0-d / 1-element tensors are real scalars: one clean step, their values logged."""
    kinds = iter([1, True, np.float32(0.5), torch.tensor(0.25), torch.tensor([-0.5]), 0, 1e6] * 10)
    seen: list[float] = []

    def mixed(step_texts, golden_answers):
        value = next(kinds)
        seen.append(float(value))
        return value
    tr = trainer(reward_fn=mixed)
    [row] = tr.fit(progress=False)
    assert row["reward"] == pytest.approx(float(np.mean(seen))) and tr.checkpoint_path.exists()


def test_the_cli_prints_a_plugin_error_as_one_line(monkeypatch, capsys):
    from tg import commands
    from tg.cli import main

    def fail(cfg: object) -> None:
        raise PluginError("MyReward, question 'x': the reward is nan, not finite")
    monkeypatch.setattr(commands, "world", fail)
    assert main(["world"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "tg: MyReward, question 'x': the reward is nan, not finite (--debug shows the traceback)"]


class Scripted:
    """An environment that returns what the test sets: a prompt, and a function of the generated steps."""

    def __init__(self, prompt, steps) -> None:
        self.prompt, self.steps = prompt, steps

    def prompt_ids(self, question: str) -> list[int]:
        return self.prompt

    def observe(self, outs, turns):
        return self.steps(outs)


def _step(out, obs=(4,), gen_ids=None):
    from tg.agent.protocol import Action, Step
    return Step(list(out.ids) if gen_ids is None else gen_ids, list(obs), Action("search", "x"), False)


@pytest.mark.parametrize("prompt, steps, fault", [
    ([3, 99], None, "Scripted.prompt_ids, question 'What is x?': token id 99 is outside the tokenizer's vocabulary of 10"),
    ([], None, "Scripted.prompt_ids, question 'What is x?': the prompt is empty"),
    ([3, 4], lambda outs: [_step(o, gen_ids=[1]) for o in outs], "gen_ids are not the sampled ids"),
    ([3, 4], lambda outs: [_step(o, obs=[2.0]) for o in outs], "observation token id 2.0 is a float"),
    ([3, 4], lambda outs: [_step(o, obs=[-1]) for o in outs], "observation token id -1 is outside"),
    ([3, 4], lambda outs: [{"obs_ids": [4]} for o in outs], "returned a dict, not a tg.agent.protocol.Step"),
    ([3, 4], lambda outs: None, "Scripted.observe returned a NoneType for 2 generated steps (question 'What is x?')"),
])
def test_prompts_and_steps_are_checked_before_the_rollout_uses_them(prompt, steps, fault):
    """Checked without a model: a prompt and steps of a 10-id vocabulary; the error names the row's question."""
    from tg.agent.contract import CheckedEnv
    from tg.engines.engine import GenOut
    env = CheckedEnv(Scripted(prompt, steps), vocab_size=10, max_obs_tokens=CAP)
    with pytest.raises(PluginError) as info:
        ids = env.prompt_ids("What is x?")
        outs = [GenOut([5, 6], [0.0, 0.0], "stop")] * 2
        env.observe(outs, [0, 0], [ids + [5, 6, 4], ids])
    assert fault in str(info.value) and "question 'What is x?'" in str(info.value), str(info.value)
