"""Outcome reward of a search episode: answer extraction, format check, EM / F1 (Eq. 13, docs/paper.md#reward).

Two training rewards and one evaluation score, all from the policy's own step texts:

- `reward(..., mode="paper")`: Eq. 13 of arXiv 2509.21240 (App. B.1):
  r = score - lambda_f if the format is wrong, else score (lambda_f = `format_penalty`, 0.2).
- `reward(..., mode="official")`: the official code's tiers (Search-R1's format reward):
  1.0 / 0.8 / 0.2 / 0.1 / 0 for EM, F1 / F1 - 0.2 / 0.2 / 0 / 0 for F1 (docs/paper.md#official-code, item 7).
- `answer_score(...)`: evaluation, pure EM or F1 of the last answer (format ignored).

Every reward lies in [-format_penalty, 1] and nothing here raises on malformed text.

Departures from the official code, numbered:
1. The format check runs over the policy's steps (a list of step texts), not over the decoded
   full sequence after the Qwen marker `<|im_start|>assistant`, so it works with any chat
   template (the official check reports "invalid" for every Llama-3 response, docs/paper.md#official-code, item 8).
2. `extract_answer` reads only the response, so one `<answer>` span suffices (the official code
   needs two because its text still contains the prompt's example `<answer> Beijing </answer>`).
3. A nested `<answer> a <answer> b </answer>` yields "b" (the innermost span that closes last);
   the official regex yields "a <answer> b".
4. A blank search query or blank answer makes the format invalid (as `parse_action` calls such
   an action invalid); the official check only looks at the tag order.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Callable, Sequence

OFFICIAL_FINAL_FORMAT_SCORE = 0.1
"""Official code's `final_format_score`: wrong answer, invalid format, but an answer present (EM)."""

_TAG_RE = re.compile(r"(</?(?:think|search|answer|information)>)")
_ANSWER_RE = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)

# The tag state machine of one step: state -> {tag: next state}. Text that is not whitespace is
# allowed only inside think / search / answer / information; any tag not listed is a violation.
_NEXT: dict[str, dict[str, str]] = {
    "start": {"<think>": "think"},
    "think": {"</think>": "thought"},
    "thought": {"<search>": "search", "<answer>": "answer"},
    "search": {"</search>": "searched"},
    "searched": {"<information>": "information"},
    "information": {"</information>": "observed"},
    "answer": {"</answer>": "answered"},
}
_TEXT_STATES = frozenset({"think", "search", "answer", "information"})
_STEP_KIND = {"searched": "search", "observed": "search", "answered": "answer"}


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, strip punctuation, drop a/an/the, collapse whitespace.

    >>> normalize_answer("  The  Eiffel-Tower! ")
    'eiffeltower'
    >>> normalize_answer("An apple a day")
    'apple day'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def _golds(golden_answers: str | Sequence[str]) -> list[str]:
    """A single gold string is one answer, not a sequence of characters."""
    return [golden_answers] if isinstance(golden_answers, str) else [str(g) for g in golden_answers]


def exact_match(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0 (None: 0.0).

    >>> exact_match("the Eiffel Tower.", ["Eiffel Tower", "Tour Eiffel"])
    1.0
    >>> exact_match("Eiffel", ["Eiffel Tower"])
    0.0
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golden_answers)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    """SQuAD token F1 of the normalised strings, the maximum over gold answers (None: 0.0).

    >>> f1("Eiffel Tower, Paris", ["Eiffel Tower"])
    0.8
    >>> f1("Louvre", ["Eiffel Tower"])
    0.0
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    return max((_token_f1(pred, normalize_answer(g).split()) for g in _golds(golden_answers)), default=0.0)


def extract_answer(response_text: str) -> str | None:
    """The stripped text of the LAST `<answer>..</answer>` span of the policy's response, or None.

    Pass only the response (the policy's steps), never the prompt: the prompt's example answer
    would otherwise count (departure 2). Nested opens keep the innermost span (departure 3).

    >>> extract_answer("<think> hm </think> <answer> Paris </answer>")
    'Paris'
    >>> extract_answer("<answer> a </answer> later <answer> b </answer>")
    'b'
    >>> extract_answer("<answer> unclosed") is None
    True
    """
    spans = _ANSWER_RE.findall(response_text)
    return spans[-1].strip() if spans else None


def _step_kind(text: str) -> str:
    """'search', 'answer' or 'invalid': one step's text run through the tag state machine."""
    state, content = "start", ""
    for piece in _TAG_RE.split(text):
        if _TAG_RE.fullmatch(piece):
            nxt = _NEXT.get(state, {}).get(piece)
            if nxt is None or (state in ("search", "answer") and not content.strip()):
                return "invalid"
            state, content = nxt, ""
        elif piece.strip() and state not in _TEXT_STATES:
            return "invalid"
        else:
            content += piece
    return _STEP_KIND.get(state, "invalid")


def is_valid_format(step_texts: Sequence[str]) -> bool:
    """Tag order think -> search -> information -> ... -> answer, checked step by step.

    Each non-final step must be `<think>..</think><search>q</search>`, the final step
    `<think>..</think><answer>a</answer>`; an empty step list is invalid.
    - Whitespace: any amount (or none) is allowed before, between and after tags; other text
      outside think / search / answer is invalid. The query and answer must not be blank.
    - Observation: a step's text is what the policy generated. A search step may also carry its
      observation `<information>..</information>` after `</search>` (the engine may pass either);
      it is skipped, not required. An `<information>` anywhere else is invalid.
    - Nested, repeated, unclosed or unknown-order tags are invalid. Tags are case-sensitive.

    >>> is_valid_format(["<think> a </think><search> q </search>", "<think> b </think> <answer> x </answer>"])
    True
    >>> is_valid_format(["<think> a </think><search> q </search>\\n\\n<information>Doc 1</information>\\n\\n",
    ...                  "<think> b </think><answer> x </answer>"])
    True
    >>> is_valid_format(["<answer> x </answer>"])
    False
    >>> is_valid_format(["<think> a </think><search> q </search>"])
    False
    """
    if not step_texts:
        return False
    kinds = [_step_kind(t) for t in step_texts]
    return all(k == "search" for k in kinds[:-1]) and kinds[-1] == "answer"


def answer_score(response_text: str, golden_answers: str | Sequence[str], metric: str = "em") -> float:
    """Evaluation score: pure EM or F1 of the last answer, format ignored (docs/paper.md#evaluation).

    >>> answer_score("<think> x </think><answer> Paris </answer>", ["paris"])
    1.0
    """
    return _metric(metric)(extract_answer(response_text), golden_answers)


def _metric(metric: str) -> Callable[[str | None, str | Sequence[str]], float]:
    """exact_match for 'em', f1 for 'f1'."""
    if metric not in ("em", "f1"):
        raise ValueError(f"metric must be 'em' or 'f1', got {metric!r}")
    return exact_match if metric == "em" else f1


def _official(score: float, valid: bool, has_answer: bool, metric: str, penalty: float) -> float:
    """The official code's tiers (docs/paper.md#official-code, item 7), with structure_format_score = penalty."""
    if score > 0:
        return score if valid else score - penalty
    if valid:
        return penalty
    return OFFICIAL_FINAL_FORMAT_SCORE if (metric == "em" and has_answer) else 0.0


def reward(step_texts: Sequence[str], golden_answers: str | Sequence[str], mode: str = "paper",
           format_penalty: float = 0.2, metric: str = "em") -> float:
    """Training reward of one episode, in [-format_penalty, 1].

    mode='paper': Eq. 13 of arXiv 2509.21240, r = score - format_penalty if the format is wrong,
    else score; score = EM (QA) or F1 (web) of the last answer.
    mode='official': 1.0 correct+valid, 1 - penalty correct+invalid, penalty wrong+valid,
    0.1 wrong+invalid with an answer (EM only), 0 otherwise; with F1, 'correct' means F1 > 0.

    step_texts: the policy's step texts in order (see `is_valid_format` for what they hold).

    >>> steps = ["<think> a </think><search> q </search>", "<think> b </think><answer> Paris </answer>"]
    >>> reward(steps, ["Paris"]), reward(steps, ["Rome"])
    (1.0, 0.0)
    >>> reward(["<answer> Paris </answer>"], ["Paris"]), reward(["no tags"], ["Paris"])
    (0.8, -0.2)
    >>> reward(steps, ["Rome"], mode="official"), reward(["<answer> Paris </answer>"], ["Rome"], mode="official")
    (0.2, 0.1)
    """
    if mode not in ("paper", "official"):
        raise ValueError(f"mode must be 'paper' or 'official', got {mode!r}")
    if not 0.0 <= format_penalty <= 1.0:
        raise ValueError(f"format_penalty must be in [0, 1], got {format_penalty!r}")
    answer = extract_answer("".join(step_texts))
    score = _metric(metric)(answer, golden_answers)
    valid = is_valid_format(step_texts)
    if mode == "paper":
        return score if valid else score - format_penalty
    return _official(score, valid, answer is not None, metric, format_penalty)
