"""An environment and a reward of one's own, through the same code as the search task: the calculator's tool
(hand-built steps -> exact observation ids and episode ends), its reward (hand-built trajectories -> values),
its questions, the config seam (`agent.env`), a few Tree-GRPO steps through `Trainer`, and the documented
command (docs/environments.md) run for one step."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tg.agent.calculator import (CALCULATOR_INVALID, CalculatorEnv, calculator_observation, calculator_reward,
                                 calculator_splits, evaluate_expression, integer_answer)
from tg.agent.env import SearchEnv
from tg.agent.tasks import make_env, make_reward, task_questions
from tg.config import ConfigError, load_config
from tg.engines.engine import GenOut
from tg.reward import reward

REPO = Path(__file__).resolve().parents[1]
VALID = ["<think> a </think><search> 2 - 7 </search>", "<think> b </think><answer> -5 </answer>"]
PIECES = [*"0123456789 -+*x", "<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>"]
"""What fuzzed step texts are made of."""


@pytest.fixture(scope="module")
def tok(random_policy):
    return random_policy[1]


def _out(tok, text: str, finish: str = "stop") -> GenOut:
    ids = tok.encode(text, add_special_tokens=False)
    return GenOut(ids, [-1.0] * len(ids), finish, [0.5 + 0.1 * k for k in range(len(ids))])


def _ids(tok, tokens: list[str]) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


@pytest.mark.parametrize("text, value", [
    ("12 - 3 * 4", 0), ("(12 - 3) * 4", 36), ("1 2 - 7", 5), ("-(2 + 3)", -5), ("+4", 4), ("007", None),
    ("20 * 20 * 20", 8000), ("999999 * 999999", 999998000001), ("9999999 * 9999999", None), ("2 ** 8", None),
    ("1 / 2", None), ("1.5 + 1", None), ("True + 1", None), ("x + 1", None), ("().__class__", None),
    ("print(1)", None), ("", None), ("1 +", None), ("1\x00", None), ("(" * 150 + "1" + ")" * 150, None),
])
def test_expressions_are_integers_with_plus_minus_times(text, value):
    assert evaluate_expression(text) == value


def test_a_tool_call_observes_its_value_exactly_and_the_episode_goes_on(tok):
    env = CalculatorEnv(tok, max_turns=2)
    out = _out(tok, "<think> x </think> <search> 1 2 - 7 </search>")
    [step] = env.observe([out], [0])
    assert step.gen_ids == out.ids and step.finish == "stop" and step.logprobs == out.logprobs
    assert step.entropies == out.entropies and step.mean_entropy > 0.5     # the entropy rule can read it
    assert step.obs_ids == _ids(tok, ["\n", "\n", "<information>", "5", "</information>", "\n", "\n"])
    assert step.action.kind == "search" and step.action.argument == "1 2 - 7" and step.is_search
    assert not step.ends_episode and step.mask == [1] * len(out.ids) + [0] * 7


def test_a_call_that_is_no_expression_observes_an_error(tok):
    [step] = CalculatorEnv(tok).observe([_out(tok, "<think> x </think> <search> Rumen </search>")], [0])
    assert calculator_observation("Rumen") == "\n\n<information>error</information>\n\n"
    assert step.obs_ids == _ids(tok, ["\n", "\n", "<information>", "[UNK]", "</information>", "\n", "\n"])  # 'error' is
    # not in the tiny vocabulary
    assert step.action.kind == "search" and not step.ends_episode


@pytest.mark.parametrize("text, finish, turn, ends, kind", [
    ("<think> x </think> <answer> 5 </answer>", "stop", 0, True, "answer"),
    ("<think> x </think> <search> 2 - 1 </search>", "stop", 2, True, "search"),   # the forced final step
    ("<think> x </think> <search> 2 - 1 </search>", "eos", 0, True, "search"),
    ("<think> 2 - 1", "length", 0, False, "invalid"),
    ("<think> x </think> <search>  </search>", "stop", 1, False, "invalid"),
])
def test_episode_ends_and_invalid_steps(tok, text, finish, turn, ends, kind):
    env = CalculatorEnv(tok, max_turns=2, max_obs_tokens=12)
    [step] = env.observe([_out(tok, text, finish)], [turn])
    assert (step.ends_episode, step.action.kind) == (ends, kind)
    if ends:
        assert step.obs_ids == []
    else:
        assert step.obs_ids == tok.encode(CALCULATOR_INVALID, add_special_tokens=False)[:12] and len(step.obs_ids) == 12


def test_rows_of_a_batch_are_observed_independently(tok):
    env = CalculatorEnv(tok, max_turns=3)
    texts = ["<think> x </think> <search> 3 - 1 </search>", "<answer> 2 </answer>",
             "<think> x </think> <search> 9 </search>"]
    steps = env.observe([_out(tok, t) for t in texts], [0, 0, 1])
    assert [s.ends_episode for s in steps] == [False, True, False]
    assert [tok.decode(s.obs_ids).split()[1:-1] for s in (steps[0], steps[2])] == [["2"], ["9"]]


def test_the_prompt_is_the_calculator_instruction_in_the_chat_template(tok):
    ids = CalculatorEnv(tok).prompt_ids("What is 3 - 1?")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|> user") and text.endswith("<|im_start|> assistant \n")
    assert "Question : What is 3 - 1 ?" in text
    assert ids != SearchEnv(tok, retriever=None).prompt_ids("What is 3 - 1?")


@pytest.mark.parametrize("steps, gold, value", [
    (VALID, "-5", 1.0),                                              # correct, valid format
    (VALID, "5", 0.0),                                               # wrong, valid
    (["<answer> - 5 </answer>"], "-5", 0.8),                         # correct, no think: invalid format
    (["<think> a </think><answer> 1 2 </answer>"], "12", 1.0),       # the tiny tokenizer's digits
    (["<think> a </think><answer> 12.0 </answer>"], "12", 0.0),      # not an integer
    (["<think> a </think><answer> 3 - 1 </answer>"], "2", 0.0),      # an expression is not an answer
    (["<think> a </think><answer> 1 </answer> <answer> 2 </answer>"], "2", 0.8),   # last answer; repeated: invalid
    (["<think> a </think><search> 2 - 7 </search>"], "-5", -0.2),    # no answer
    (["no tags"], "-5", -0.2),
])
def test_reward_values_on_hand_built_trajectories(steps, gold, value):
    assert calculator_reward(steps, [gold]) == pytest.approx(value)


@settings(max_examples=80, deadline=None)
@given(texts=st.lists(st.lists(st.sampled_from(PIECES), max_size=12).map("".join), max_size=4),
       penalty=st.floats(0.0, 1.0))
def test_the_reward_lies_in_its_range(texts, penalty):
    assert -penalty <= calculator_reward(texts, ["7"], format_penalty=penalty) <= 1.0


def test_integer_answers():
    assert [integer_answer(t) for t in (" 1 2 ", "-3", "+ 4", "4 5x", "", None)] == [12, -3, 4, None, None, None]


def test_questions_are_seeded_disjoint_and_answered_by_the_tool():
    train, test = calculator_splits(300, 50, seed=0)
    assert (len(train), len(test)) == (300, 50) and calculator_splits(300, 50, seed=0) == (train, test)
    assert not {q.question for q in train} & {q.question for q in test}
    assert calculator_splits(300, 50, seed=1)[1] != test
    for q in train + test:
        expr = q.question.removeprefix("What is ").removesuffix("?")
        assert q.golden_answers == (str(evaluate_expression(expr)),) and q.data_source == "calculator"


def test_agent_env_picks_environment_reward_and_questions(cfg, tok):
    calc = cfg.with_overrides("agent.env=calculator", "agent.max_turns=2", "agent.format_penalty=0.5")
    env = make_env(calc, tok, retriever=None)
    assert isinstance(env, CalculatorEnv) and env.max_turns == 2
    assert isinstance(make_env(cfg, tok, retriever=None), SearchEnv)
    assert make_reward(calc)(["<answer> - 5 </answer>"], ["-5"]) == 0.5   # 1 less agent.format_penalty
    assert make_reward(cfg)(["<answer> x </answer>"], ["x"]) == reward(["<answer> x </answer>"], ["x"]) == 0.8
    assert make_reward(cfg.with_overrides("agent.reward=official"))(["<answer> x </answer>"], ["y"]) == 0.1
    train, test = task_questions(calc, Path("unused"))
    assert {q.data_source for q in train + test} == {"calculator"}
    assert calc.hash() != cfg.hash()
    with pytest.raises(ConfigError, match="agent.env"):
        load_config("cpu", "agent.env=shell")


def _calculator_trainer(cfg, policy_dir, run_dir, steps, prompts, lr, reward_fn=None):
    """A `Trainer` of the pinned policy on calculator questions: full fine-tuning, Tree-GRPO (2, 1, 1), 2 turns."""
    from transformers import AutoTokenizer

    from tg.agent.finetune import trainable_policy
    from tg.trainer import Trainer
    c = cfg.with_overrides("agent.env=calculator").replace(
        model=dict(finetune="full"), agent=dict(max_turns=2, max_step_tokens=30), tree=dict(M=2, N=1, L=1),
        optim=dict(steps=steps, prompts_per_step=prompts, mini_batch_prompts=prompts, micro_batch_rows=32, lr=lr,
                   checkpoint_every=0))
    tok = AutoTokenizer.from_pretrained(policy_dir)
    torch.manual_seed(c.optim.seed)
    return Trainer(c, trainable_policy(policy_dir, c.model, torch.device("cpu")), tok, make_env(c, tok, None),
                   task_questions(c, Path("unused"))[0], run_dir, reward_fn=reward_fn)


def test_tree_grpo_trains_on_the_calculator_through_the_trainer(cfg, warm_policy_dir, tmp_path):
    """Three Tree-GRPO (2, 1, 1) steps of the pinned policy on calculator questions, through `Trainer` with the
    calculator and a recording reward: what the policy saw, what the loss masked and what it was rewarded are
    the calculator's, and the weights moved."""
    scored: list[tuple[list[str], list[str], float]] = []

    def recorded(step_texts, golden_answers):
        r = calculator_reward(step_texts, golden_answers)
        scored.append((list(step_texts), list(golden_answers), r))
        return r

    tr = _calculator_trainer(cfg, warm_policy_dir, tmp_path, steps=3, prompts=4, lr=1e-3, reward_fn=recorded)
    tok, env = tr.tokenizer, tr.env
    seen: dict[str, list] = {"trees": [], "rows": []}
    rollout, update = tr.rollout, tr.update

    def rollout_seen(questions, step):
        trees, leds = rollout(questions, step)
        seen["trees"].append(trees)
        return trees, leds

    def update_seen(rows):
        seen["rows"].append(rows)
        return update(rows)
    tr.rollout, tr.update = rollout_seen, update_seen
    before = [p.detach().clone() for p in tr.policy.parameters()]
    metrics = tr.fit(progress=False)

    assert len(metrics) == 3 and all(torch.isfinite(torch.tensor(list(m.values()), dtype=torch.float64)).all()
                                     for m in metrics)
    assert all(not torch.equal(a, b) for a, b in zip(before, tr.policy.parameters(), strict=True))
    calls = searches = 0
    for step, (trees, rows, m) in enumerate(zip(seen["trees"], seen["rows"], metrics)):
        questions = tr.batch_questions(step)
        flat = [t for ts in trees for t in ts]
        leaves = [(t, leaf) for t in flat for leaf in t.leaves()]
        step_scores = scored[calls:calls + len(leaves)]
        calls += len(leaves)
        assert m["reward"] == pytest.approx(sum(r for *_, r in step_scores) / len(leaves))
        for i, (t, leaf) in enumerate(leaves):
            path, gold = t.path(leaf), questions[t.question].golden_answers
            assert step_scores[i] == ([s.text for s in path], list(gold), t.rewards[leaf])   # what it was called with
            assert t.rewards[leaf] == calculator_reward([s.text for s in path], gold)
            n = len(t.trajectory(leaf).ids)
            assert rows.ids[i, :n].tolist() == t.trajectory(leaf).ids and rows.mask[i, n:].sum() == 0
            assert rows.ids[i, :len(t.prompt_ids)].tolist() == env.prompt_ids(questions[t.question].question)
            at = len(t.prompt_ids)
            for s in path:   # the sampled ids trained, the calculator's ids appended as they are and masked out
                assert rows.mask[i, at:at + len(s.gen_ids)].tolist() == [1] * len(s.gen_ids)
                at += len(s.gen_ids)
                assert rows.ids[i, at:at + len(s.obs_ids)].tolist() == s.obs_ids
                assert rows.mask[i, at:at + len(s.obs_ids)].sum() == 0
                at += len(s.obs_ids)
                if s.is_search:
                    searches += 1
                    value = evaluate_expression(s.action.argument)
                    assert tok.decode(s.obs_ids).split()[1:-1] == (["[UNK]"] if value is None else list(str(value)))
        assert float(rows.adv.double().std()) == pytest.approx(m["adv_std"], abs=1e-6)
    assert calls == len(scored) and searches > 0
    assert any(m["adv_std"] > 0 for m in metrics)


def test_the_format_term_is_learnt_in_ten_steps(cfg, warm_policy_dir, tmp_path):
    """A learning signal, cheap: the calculator's format term. Under the calculator prompt the pinned policy (warmed
    up on search) writes a valid think / tool call / answer format in a minority of its leaves; ten Tree-GRPO steps
    of 8 questions (lr 3e-4, about 10 s) remove most of the penalty. Arithmetic is not learnt (EM stays 0).
    Measured with optim.seed 0 / 1 / 2 (the test runs 0; all three pass it): format_valid 0.12 / 0.25 / 0.41 at
    step 1, at least 0.94 / 0.94 / 0.81 over steps 6-10; reward -0.18 / -0.15 / -0.12 at step 1, -0.04 or more
    over steps 6-10."""
    metrics = _calculator_trainer(cfg, warm_policy_dir, tmp_path, steps=10, prompts=8, lr=3e-4).fit(progress=False)
    first, last = metrics[0], metrics[5:]
    assert first["format_valid"] < 0.5 and min(m["format_valid"] for m in last) > 0.75, metrics
    assert max(m["reward"] for m in last) > first["reward"] + 0.1, metrics


def test_the_documented_command_trains_one_step(monkeypatch, tmp_path, capsys):
    """The `tg train` line of docs/environments.md, cut to one small step (later flags win), runs and evaluates."""
    from tg import commands
    from tg.cli import main
    doc = (REPO / "docs" / "environments.md").read_text()
    [line] = [x.strip() for x in doc.splitlines() if x.strip().startswith("tg train") and "agent.env=calculator" in x]
    argv = shlex.split(line)[1:] + ["--steps", "1", "--run-dir", str(tmp_path / "run"),
                                    "--set", "optim.prompts_per_step=2", "--set", "optim.mini_batch_prompts=2",
                                    "--set", "agent.max_step_tokens=30", "--set", "eval.n_multi=8"]
    monkeypatch.setattr(commands, "RESULTS", str(tmp_path / "results"))
    assert main(argv) == 0
    saved = json.loads((tmp_path / "run" / "tg_config.json").read_text())
    assert saved["agent"]["env"] == "calculator"
    [row] = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and -0.2 - 1e-9 <= row["reward"] <= 1.0
    out = capsys.readouterr().out
    assert '"calculator"' in out and (tmp_path / "results" / "runs.csv").exists()


def test_the_documented_python_snippet_trains(monkeypatch, tmp_path):
    """The Python block of docs/environments.md, run as written (in a temporary directory): three steps through
    `Trainer` with the calculator and its reward passed in, the config saved beside the metrics."""
    doc = (REPO / "docs" / "environments.md").read_text()
    [snippet] = [b.split("\n", 1)[1] for b in doc.split("```")[1::2] if b.startswith("python") and ".fit()" in b]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet, "docs/environments.md", "exec"), scope)
    assert [m["step"] for m in scope["metrics"]] == [1, 2, 3]
    assert all(-0.2 - 1e-9 <= m["reward"] <= 1.0 for m in scope["metrics"])
    assert (tmp_path / "runs" / "my-task" / "tg_config.json").exists()
    assert len((tmp_path / "runs" / "my-task" / "metrics.jsonl").read_text().splitlines()) == 3
