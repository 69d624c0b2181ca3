"""A calculator task: the worked example of an environment and a reward of one's own (docs/environments.md).

The agent answers 'What is 12 - 3 * 4?'. Its tool call is `<search> 12 - 3 * 4 </search>`; the calculator
returns the value, `<information>0</information>`; the answer is `<answer> 0 </answer>`. Questions are
generated here (no network, seeded), the environment is `CalculatorEnv`, the reward `calculator_reward`;
`agent.env = 'calculator'` trains on them (tg.agent.tasks).

Not in the paper, which only searches. Its design, numbered:
1. The tool call keeps the protocol's `<search>` tag: the engines stop a step at `STOP_STRINGS`
   ('</search>', '</answer>'), so a tool call must close with one of them (`tg.agent.env.Environment`, 4).
2. Expressions are integers with + - * and parentheses, read by `ast` (never `eval`); whitespace is
   ignored, so the tiny word-level tokenizer's '1 2 - 7' (digits are single tokens) reads as 12 - 7.
3. The reward is Eq. 13 with the answer compared by integer value (' 0 12 ' equals 12), not EM.
4. The tiny policy's vocabulary comes from the synthetic world: it has the digits and '-' but not '+' or '*'
   ([UNK] there), and it was warmed up on search, not on arithmetic.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any, Callable, Sequence

from tg.agent.data import Question
from tg.agent.env import encode_observation, episode_ends, generated_step, step_text
from tg.agent.protocol import Action, Step, parse_action, user_turn_ids
from tg.engines.engine import GenOut
from tg.reward import extract_answer, is_valid_format

CALCULATOR_PROMPT = (
    "Answer the given arithmetic question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, you can call a calculator by <search> expression </search> "
    "and it will return its value between <information> and </information>. If you need no further calculation, "
    "you can directly provide the answer inside <answer> and </answer>, for example <answer> 42 </answer>. "
    "Question: {question}\n"
)
"""The instruction, in the shape of App. B.1's search prompt."""

CALCULATOR_INVALID = (
    "\nMy previous action is invalid. If I want to calculate, I should put the expression between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
"""The observation of a step with no complete tool call or answer."""

SOURCE = "calculator"
"""The questions' data_source."""
MAX_EXPRESSION_CHARS = 200
"""Longer expressions are not evaluated (their value would be read as an error)."""
MAX_ABS_VALUE = 10**12
"""Intermediate values beyond this are an error (no number grows without bound)."""
_OPS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_INTEGER = re.compile(r"[+-]?\d+")


def _value(node: ast.AST) -> int | None:
    """The value of an expression tree of integers, + - * and unary signs; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _value(node.left), _value(node.right)
        if a is None or b is None:
            return None
        v = _OPS[type(node.op)](a, b)
        return v if abs(v) <= MAX_ABS_VALUE else None
    return None


def evaluate_expression(text: str) -> int | None:
    """The integer value of an arithmetic expression, or None if it is not one (whitespace ignored).

    >>> evaluate_expression("12 - 3 * 4"), evaluate_expression("1 2 - 7"), evaluate_expression("-(2 + 3)")
    (0, 5, -5)
    >>> [evaluate_expression(t) for t in ("2 ** 8", "Rumen", "1 / 2")]
    [None, None, None]
    """
    compact = "".join(text.split())
    if not compact or len(compact) > MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(compact, mode="eval")
    except (SyntaxError, ValueError):
        return None
    return _value(tree.body)


def calculator_observation(expression: str) -> str:
    """The text appended after a tool call: the value, or 'error' when the argument is not an expression."""
    value = evaluate_expression(expression)
    return f"\n\n<information>{'error' if value is None else value}</information>\n\n"


def integer_answer(text: str | None) -> int | None:
    """An answer's integer value, whitespace ignored ('1 2' is 12), or None if it is not an integer."""
    compact = "".join((text or "").split())
    return int(compact) if _INTEGER.fullmatch(compact) else None


def calculator_reward(step_texts: Sequence[str], golden_answers: Sequence[str], format_penalty: float = 0.2) -> float:
    """Eq. 13 of arXiv 2509.21240 with a numeric score: r = score - format_penalty if the format is invalid,
    else score; score = 1 if the last answer's integer value equals a gold answer's, else 0. In [-format_penalty, 1].

    The format check is the search task's (`tg.reward.is_valid_format`): the calculator uses the same tags.

    >>> steps = ["<think> a </think><search> 2 - 7 </search>", "<think> b </think><answer> -5 </answer>"]
    >>> calculator_reward(steps, ["-5"]), calculator_reward(steps, ["5"])
    (1.0, 0.0)
    >>> calculator_reward(["<answer> - 5 </answer>"], ["-5"]), calculator_reward(["no tags"], ["-5"])
    (0.8, -0.2)
    """
    value = integer_answer(extract_answer("".join(step_texts)))
    score = float(value is not None and value in {integer_answer(g) for g in golden_answers})
    return score if is_valid_format(step_texts) else score - format_penalty


def calculator_splits(n_train: int, n_test: int, seed: int) -> tuple[list[Question], list[Question]]:
    """(train, test): distinct questions 'What is a op b [op c]?' (operands 0-20, op in + - *), gold = the value.

    One seeded stream of distinct expressions: its first `n_test` are the test split, the next `n_train` the
    train split, so the two never share an expression."""
    rng = random.Random(seed)
    drawn: dict[str, None] = {}  # distinct expressions, in the order drawn
    while len(drawn) < n_train + n_test:
        terms = [str(rng.randint(0, 20)) for _ in range(rng.choice((2, 3)))]
        drawn[terms[0] + "".join(f" {rng.choice('+-*')} {t}" for t in terms[1:])] = None
    exprs = list(drawn)

    def split(name: str, part: list[str]) -> list[Question]:
        return [Question(f"{SOURCE}-{name}_{i}", f"What is {e}?", (str(evaluate_expression(e)),), SOURCE)
                for i, e in enumerate(part)]
    return split("train", exprs[n_test:]), split("test", exprs[:n_test])


class CalculatorEnv:
    """The calculator as an `Environment`: a tool call gets the value of its expression, anything else
    that neither calls nor answers gets `CALCULATOR_INVALID`; episodes end as in `episode_ends`."""

    def __init__(self, tokenizer: Any, *, max_obs_tokens: int = 500, max_turns: int = 3) -> None:
        self.tokenizer, self.max_obs_tokens, self.max_turns = tokenizer, max_obs_tokens, max_turns
        self._invalid_ids = encode_observation(tokenizer, CALCULATOR_INVALID, max_obs_tokens)

    def prompt_ids(self, question: str) -> list[int]:
        """`CALCULATOR_PROMPT` with the question, as one user turn through the chat template."""
        return user_turn_ids(self.tokenizer, CALCULATOR_PROMPT.format(question=question.strip()))

    def observe(self, outs: Sequence[GenOut], turns: Sequence[int]) -> list[Step]:
        """One `Step` per generated step; `turns[i]` = steps already taken before this one."""
        steps = []
        for o, turn in zip(outs, turns):
            text = step_text(self.tokenizer, o)
            action = parse_action(text)
            end = episode_ends(action, o, turn, self.max_turns)
            if end:
                obs: list[int] = []
            elif action.kind == "search":
                obs = encode_observation(self.tokenizer, calculator_observation(action.argument), self.max_obs_tokens)
            else:
                obs, action = self._invalid_ids, Action("invalid", action.argument)
            steps.append(generated_step(o, text, action, obs, end))
        return steps
