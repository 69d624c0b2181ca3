"""What an environment and a reward are (paper §3.1; the reward's form is Eq. 13, App. B.1), and the search tool:
the default environment.

Tree-GRPO needs two things from a task, and they are all `tg` asks of one:

- an `Environment`: the prompt of a question, and for each generated step the `Step` record: the
  observation ids the tool appends and whether the episode ends there;
- a `Reward`: one float per finished trajectory, from its step texts and the question's gold answers.

The trainer, the rollout and the evaluation see nothing else, so a new tool is a class with these two
methods and a new reward a function (docs/environments.md; `tg.agent.calculator` is the worked example).
What they return is checked where it enters (`tg.agent.contract`); a breach is one `PluginError` line.
The defaults are `SearchEnv` below and `tg.reward.reward` (Eq. 13 over EM); `tg.agent.tasks` builds the
config's pair.

The search environment:
- a search gets `<information>` with the top-k documents (Search-R1 format), truncated to
  `max_obs_tokens` tokens;
- an unparseable action, or a step cut by the per-step cap, gets the invalid-action message;
- an answer, an end-of-sequence, or the forced final step (turn == max_turns, search disabled)
  ends the episode with no observation (`episode_ends`).
Every step counts one turn, as in the official code, so a branch from depth d has max_turns - d left.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from tg.agent.protocol import INVALID_ACTION, Action, Step, cut_after_stop, format_observation, parse_action, prompt_ids
from tg.engines.engine import GenOut


class PluginError(ValueError):
    """An `Environment` or a `Reward` broke its contract (docs/environments.md#what-the-trainer-checks): one line
    naming the class, the question and what was wrong, raised before anything is trained on it."""


class Environment(Protocol):
    """A tool the agent calls between its steps. What `observe` returns keeps, for every step:

    1. `gen_ids` = `GenOut.ids` exactly as sampled (never decoded and re-encoded), `finish` = `GenOut.finish`,
       `text` = their decoded text (what the reward reads), `action` = the parsed action: kind 'search' for
       a tool call (counted as one), 'answer', or 'invalid'.
    2. `obs_ids`: the tool's output as token ids. The rollout appends them to the context as they are and
       the loss masks them out (`Step.mask`). A step that ends the episode has none; one that does not end
       has some (the tool's output or an error message), so the policy sees why it goes on.
    3. `ends_episode`: on an answer, an end-of-sequence, at `turns[i] >= max_turns` (`episode_ends`), or by
       the environment's own rule. The rollout also ends a row whose context reaches agent.max_context_tokens.
    4. A step ends where the engine stops it: at `tg.agent.protocol.STOP_STRINGS` ('</search>', '</answer>'),
       EOS or the per-step cap. The engines hold these stop strings, so a tool call closes with '</search>'
       and an answer with '</answer>', whatever the tool.
    5. Checked where it enters (`tg.agent.contract.CheckedEnv`): exactly one `Step` per generated step, `gen_ids`
       as sampled, at most agent.max_obs_tokens observation ids, every id (prompt and observation) in the
       tokenizer's vocabulary.
    """

    def prompt_ids(self, question: str) -> list[int]:
        """The token ids the policy continues for `question` (the instruction and the question)."""
        ...

    def observe(self, outs: Sequence[GenOut], turns: Sequence[int]) -> list[Step]:
        """One `Step` per generated step; `turns[i]` = steps already taken before `outs[i]`."""
        ...


class Reward(Protocol):
    """The outcome reward of one finished trajectory (the paper's is Eq. 13 of App. B.1: a score, less a format
    penalty).

    step_texts:     the policy's step texts in order (`Step.text`; observations not included).
    golden_answers: the question's gold answers (`Question.golden_answers`).
    Returns one real number (a float in [-format_penalty, 1] for the kit's rewards), finite, with |r| <= 1e6
    (`tg.agent.contract.checked_reward`); advantages are normalised per group (Eq. 5-7), so any range within
    that trains, but the logged `reward` metric is this value.
    """

    def __call__(self, step_texts: Sequence[str], golden_answers: Sequence[str]) -> float: ...


def episode_ends(action: Action, out: GenOut, turn: int, max_turns: int) -> bool:
    """Whether a step is a leaf: an answer, an end-of-sequence, or the forced final step (turn >= max_turns)."""
    return action.kind == "answer" or out.finish == "eos" or turn >= max_turns


def step_text(tokenizer: Any, out: GenOut) -> str:
    """A generated step's text for parsing, scoring and display: its ids decoded, cut after the stop string."""
    return cut_after_stop(tokenizer.decode(out.ids, skip_special_tokens=False))


def generated_step(out: GenOut, text: str, action: Action, obs_ids: Sequence[int], ends_episode: bool,
                   docs: Sequence[str] = ()) -> Step:
    """The `Step` of one generated step: what the engine reported (ids exactly as sampled, finish, log-probs,
    entropies) with the environment's decoded text, parsed action, observation ids and episode end."""
    return Step(gen_ids=list(out.ids), obs_ids=list(obs_ids), action=action, ends_episode=ends_episode,
                finish=out.finish, text=text, logprobs=list(out.logprobs), docs=list(docs),
                entropies=list(out.entropies))


def encode_observation(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    """An observation's ids: `text` encoded without special tokens, its first `max_tokens` kept."""
    return list(tokenizer.encode(text, add_special_tokens=False))[:max_tokens]


class SearchEnv:
    """Stateless search tool + observation formatting. `retriever.search(queries, k)` is any `Retriever`."""

    def __init__(self, tokenizer: Any, retriever: Any, *, top_k: int = 3, max_obs_tokens: int = 500,
                 max_turns: int = 3) -> None:
        self.tokenizer, self.retriever = tokenizer, retriever
        self.top_k, self.max_obs_tokens, self.max_turns = top_k, max_obs_tokens, max_turns
        self._invalid_ids = encode_observation(tokenizer, INVALID_ACTION, max_obs_tokens)

    def prompt_ids(self, question: str) -> list[int]:
        """App. B.1's prompt through the chat template (`tg.agent.protocol.prompt_ids`)."""
        return prompt_ids(self.tokenizer, question)

    def observe(self, outs: Sequence[GenOut], turns: Sequence[int]) -> list[Step]:
        """One `Step` per generated step; `turns[i]` = steps already taken before this one."""
        texts = [step_text(self.tokenizer, o) for o in outs]
        actions = [parse_action(t) for t in texts]
        ends = [episode_ends(a, o, t, self.max_turns) for a, o, t in zip(actions, outs, turns)]
        search = [i for i, (a, e) in enumerate(zip(actions, ends)) if a.kind == "search" and not e]
        docs = self.retriever.search([actions[i].argument for i in search], self.top_k) if search else []
        found = dict(zip(search, docs))
        steps = []
        for i, (o, a, text, end) in enumerate(zip(outs, actions, texts, ends)):
            if end:
                obs: list[int] = []
            elif i in found:
                obs = encode_observation(self.tokenizer, format_observation(found[i]), self.max_obs_tokens)
            else:
                obs, a = self._invalid_ids, Action("invalid", a.argument)
            steps.append(generated_step(o, text, a, obs, end, [d["title"] for d in found.get(i, [])]))
        return steps
