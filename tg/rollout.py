"""The multi-turn step loop shared by chains, tree initialisation and tree expansion.

`run_episodes` continues each start (a context: the prompt, or the prompt plus a tree path) with
the agent's step loop until its episode ends, batching every row of every start together:

    generate one step per live row -> environment observes -> finished rows leave the batch,
    the others get their observation appended to their live state -> repeat.

What the environment returns is checked before it is appended (`tg.agent.contract.CheckedEnv`): every
environment must return one `Step` per generated step; the trainer's `CheckedEnv` also checks observation
lengths and token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tg.agent.contract import CheckedEnv
from tg.agent.env import Environment
from tg.agent.protocol import Step
from tg.engines.engine import Engine, PrefillStats, Sampling
from tg.engines.kvcache import PrefixStore


@dataclass(frozen=True)
class Start:
    """Continue `context` (token ids) `count` times; `turns` steps were already taken on it."""

    context: list[int]
    count: int
    turns: int = 0


@dataclass
class Episode:
    """The steps one row added after its start, and the engine's accounting for that row."""

    start: int
    """Index of the `Start` this row continues."""
    steps: list[Step]
    prefill: PrefillStats = field(default_factory=PrefillStats)


def run_episodes(engine: Engine, env: Environment, starts: Sequence[Start], sampling: Sampling, *,
                 max_step_tokens: int, max_context_tokens: int, prefixes: PrefixStore | None = None) -> list[Episode]:
    """Run every row of every start to the end of its episode; rows in start order, count copies each.

    A row whose context reaches `max_context_tokens` ends there (its last step is then a leaf with
    whatever it holds, like a forced final step). With `prefixes`, a start continues the cache of a row
    kept there (HF engine), and finished rows are kept there for later calls. A step that breaks the
    environment's contract raises `tg.agent.env.PluginError` before anything of it is appended.
    """
    checked = env if isinstance(env, CheckedEnv) else CheckedEnv(env)
    batch = engine.open([s.context for s in starts], [s.count for s in starts], sampling, prefixes)
    episodes = [Episode(i, []) for i, s in enumerate(starts) for _ in range(s.count)]
    length = [len(starts[e.start].context) for e in episodes]
    turns = [starts[e.start].turns for e in episodes]
    live = list(range(len(episodes)))
    while live:
        caps = [min(max_step_tokens, max_context_tokens - length[r]) for r in live]
        outs = batch.generate(live, caps)
        steps = checked.observe(outs, [turns[r] for r in live], [starts[episodes[r].start].context for r in live])
        done, cont = [], []
        for r, step in zip(live, steps):
            length[r] += len(step.ids)
            turns[r] += 1
            if not step.ends_episode and length[r] >= max_context_tokens:
                step.ends_episode = True
            episodes[r].steps.append(step)
            (done if step.ends_episode else cont).append(r)
        batch.release(done)
        batch.append(cont, [episodes[r].steps[-1].obs_ids for r in cont])
        live = cont
    for r, e in enumerate(episodes):
        e.prefill = batch.row_stats[r]
    return episodes
