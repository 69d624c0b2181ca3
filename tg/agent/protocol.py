"""The Search-R1 / Tree-GRPO agent protocol (paper §3.1, App. B.1) and its typed records.

A *step* is one (think, action, observation) triple: the policy's sampled ids up to and including
`</search>` or `</answer>` (or EOS / the per-step cap), then the observation ids the environment
appended. A tree node later is exactly one `Step`. A `Trajectory` is a prompt plus steps; its ids
and observation mask are built from the stored ids, never by decoding and re-tokenising.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

PROMPT_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)
"""App. B.1 of the paper, identical to Search-R1 (typo 'as your want' included)."""

INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
"""Search-R1's observation for an unparseable action."""

STOP_STRINGS = ("</search>", "</answer>")
"""A step ends when the policy closes one of these (or at EOS / the per-step token cap)."""


def cut_after_stop(text: str) -> str:
    """A step's decoded text up to the end of its first stop string (all of it without one).

    A BPE token can run past a stop string (SmolLM2 samples `</answer>.` as `</`, `answer`, `>.`): the step's
    ids keep that whole token, as sampled, while the text that is parsed and scored ends at the tag, as vLLM's
    stop strings cut the text they return. Without the cut the '.' after the tag fails the format check.

    >>> cut_after_stop("<answer> Borv </answer>.")
    '<answer> Borv </answer>'
    >>> cut_after_stop("no tag yet")
    'no tag yet'
    """
    ends = [text.index(s) + len(s) for s in STOP_STRINGS if s in text]
    return text[:min(ends)] if ends else text


PROTOCOL_TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
                 "<information>", "</information>")

_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def build_prompt(question: str) -> str:
    """The user message: the template with the question (a '?' appended if missing, as the code does)."""
    q = question.strip()
    if not q.endswith("?"):
        q += "?"
    return PROMPT_TEMPLATE.format(question=q)


def prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """Token ids of the prompt through the tokenizer's chat template (a plain encode if it has none)."""
    return user_turn_ids(tokenizer, build_prompt(question))


def user_turn_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` as one user turn through the chat template, ready for the assistant (plain encode without one)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        return list(ids)
    return list(tokenizer.encode(text, add_special_tokens=False))


@dataclass(frozen=True)
class Action:
    """The parsed action of a step: kind 'search' | 'answer' | 'invalid', with its argument."""

    kind: str
    argument: str = ""


def parse_action(text: str) -> Action:
    """The first complete <search>..</search> or <answer>..</answer> pair in a step's text.

    >>> parse_action("<think> x </think> <search> Borv </search>")
    Action(kind='search', argument='Borv')
    >>> parse_action("<answer> Kalden </answer>")
    Action(kind='answer', argument='Kalden')
    >>> parse_action("<search>   </search>").kind
    'invalid'
    >>> parse_action("no tags at all").kind
    'invalid'
    """
    m = _ACTION_RE.search(text)
    if m is None or not m.group(2).strip():
        return Action("invalid")
    return Action(m.group(1), " ".join(m.group(2).split()))


def format_documents(docs: Sequence[dict[str, str]]) -> str:
    """Search-R1's passage format: 'Doc i(Title: t) text' per line."""
    lines = []
    for i, d in enumerate(docs, 1):
        title = d.get("title") or d["contents"].split("\n", 1)[0]
        body = d["contents"].split("\n", 1)[1] if "\n" in d["contents"] and not d.get("title") else d["contents"]
        lines.append(f"Doc {i}(Title: {title}) {body}")
    return "\n".join(lines) + "\n"


def format_observation(docs: Sequence[dict[str, str]]) -> str:
    """The observation text appended after a search (Search-R1: blank lines around the tags)."""
    return f"\n\n<information>{format_documents(docs).strip()}</information>\n\n"


@dataclass
class Step:
    """One (think, action, observation) agent step: a tree node.

    gen_ids:   the ids the policy sampled, exactly (stop string included).
    obs_ids:   the ids appended by the environment (empty when the episode ends here).
    logprobs:  the engine's log-probs of gen_ids (diagnostics; training recomputes them).
    entropies: the entropy (nats) of the distribution each of gen_ids was drawn from, as the engine
               reported it (`GenOut.entropies`); None or empty when it reported none.
    """

    gen_ids: list[int]
    obs_ids: list[int]
    action: Action
    ends_episode: bool
    finish: str = "stop"
    """'stop' (closed a tag), 'eos', or 'length' (per-step cap hit)."""
    text: str = ""
    """The decoded step text (display and parsing only; never re-tokenised)."""
    logprobs: list[float] | None = None
    docs: list[str] = field(default_factory=list)
    """Titles of the retrieved documents, for display."""
    entropies: list[float] | None = None

    @property
    def mean_entropy(self) -> float:
        """Mean entropy in nats over the step's sampled tokens, sum(entropies) / len(gen_ids) (0 for no tokens)."""
        if self.entropies is None or len(self.entropies) != len(self.gen_ids):
            raise ValueError("this step carries no per-token entropies: its engine did not report them "
                             "(the vLLM engine reports them with VLLMEngine(entropies=True))")
        return sum(self.entropies) / max(len(self.gen_ids), 1)

    @property
    def ids(self) -> list[int]:
        return self.gen_ids + self.obs_ids

    @property
    def mask(self) -> list[int]:
        """1 on policy tokens, 0 on observation tokens."""
        return [1] * len(self.gen_ids) + [0] * len(self.obs_ids)

    @property
    def is_search(self) -> bool:
        return self.action.kind == "search" and bool(self.obs_ids)


@dataclass
class Trajectory:
    """A prompt and the steps of one episode; a chain, or a root-to-leaf path of a tree."""

    prompt_ids: list[int]
    steps: list[Step]
    reward: float = 0.0
    answer: str | None = None

    @property
    def response_ids(self) -> list[int]:
        return [t for s in self.steps for t in s.ids]

    @property
    def response_mask(self) -> list[int]:
        return [m for s in self.steps for m in s.mask]

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def mask(self) -> list[int]:
        """0 on prompt and observation tokens, 1 on the policy's own tokens."""
        return [0] * len(self.prompt_ids) + self.response_mask

    @property
    def tool_calls(self) -> int:
        return sum(s.is_search for s in self.steps)

    @property
    def policy_tokens(self) -> int:
        return sum(len(s.gen_ids) for s in self.steps)
