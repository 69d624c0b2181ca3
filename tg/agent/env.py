"""The search environment: turns a generated step into a `Step` with its observation ids (paper §3.1).

- a search gets `<information>` with the top-k documents (Search-R1 format), truncated to
  `max_obs_tokens` tokens;
- an unparseable action, or a step cut by the per-step cap, gets the invalid-action message;
- an answer, an end-of-sequence, or the forced final step (turn == max_turns, search disabled)
  ends the episode with no observation.
Every step counts one turn, as in the official code, so a branch from depth d has max_turns - d left.
"""

from __future__ import annotations

from typing import Any, Sequence

from tg.agent.protocol import INVALID_ACTION, Action, Step, format_observation, parse_action
from tg.engines.engine import GenOut


class SearchEnv:
    """Stateless search tool + observation formatting. `retriever.search(queries, k)` is any `Retriever`."""

    def __init__(self, tokenizer: Any, retriever: Any, *, top_k: int = 3, max_obs_tokens: int = 500,
                 max_turns: int = 3) -> None:
        self.tokenizer, self.retriever = tokenizer, retriever
        self.top_k, self.max_obs_tokens, self.max_turns = top_k, max_obs_tokens, max_turns
        self._invalid_ids = self._encode(INVALID_ACTION)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))[: self.max_obs_tokens]

    def observe(self, outs: Sequence[GenOut], turns: Sequence[int]) -> list[Step]:
        """One `Step` per generated step; `turns[i]` = steps already taken before this one."""
        texts = [self.tokenizer.decode(o.ids, skip_special_tokens=False) for o in outs]
        actions = [parse_action(t) for t in texts]
        ends = [a.kind == "answer" or o.finish == "eos" or t >= self.max_turns
                for a, o, t in zip(actions, outs, turns)]
        search = [i for i, (a, e) in enumerate(zip(actions, ends)) if a.kind == "search" and not e]
        docs = self.retriever.search([actions[i].argument for i in search], self.top_k) if search else []
        found = dict(zip(search, docs))
        steps = []
        for i, (o, a, text, end) in enumerate(zip(outs, actions, texts, ends)):
            if end:
                obs: list[int] = []
            elif i in found:
                obs = self._encode(format_observation(found[i]))
            else:
                obs, a = self._invalid_ids, Action("invalid", a.argument)
            steps.append(Step(gen_ids=list(o.ids), obs_ids=list(obs), action=a, ends_episode=end, finish=o.finish,
                              text=text, logprobs=list(o.logprobs), docs=[d["title"] for d in found.get(i, [])],
                              entropies=list(o.entropies)))
        return steps
