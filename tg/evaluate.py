"""Evaluation: one greedy chain per question, pure EM (or F1) of the last answer (docs/paper.md#evaluation).

Results are rows in the shape of the paper's Table 1 (one column per data_source, plus averages)
with provenance (preset, config hash, git sha, date, seed), appended to a CSV that figures read.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tg.agent.data import Question
from tg.agent.env import Environment
from tg.config import Config
from tg.engines.engine import Engine, Sampling
from tg.progress import tqdm
from tg.reward import answer_score
from tg.store.files import provenance
from tg.tree import sample_trees


@dataclass
class EvalResult:
    """Per-question scores and the per-source means."""

    scores: list[float]
    tool_calls: list[int]
    sources: list[str]
    transcripts: list[str]

    @classmethod
    def concat(cls, parts: Sequence["EvalResult"]) -> "EvalResult":
        """Several results (the ranks' shares of one test set) as one, in order."""
        return cls(*([x for p in parts for x in getattr(p, f)] for f in ("scores", "tool_calls", "sources",
                                                                            "transcripts")))

    def by_source(self) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for s, x in zip(self.sources, self.scores):
            out.setdefault(s, []).append(x)
        return {s: float(np.mean(v)) for s, v in sorted(out.items())}

    def calls_by_source(self) -> dict[str, float]:
        out: dict[str, list[int]] = {}
        for s, x in zip(self.sources, self.tool_calls):
            out.setdefault(s, []).append(x)
        return {s: float(np.mean(v)) for s, v in sorted(out.items())}


def evaluate(engine: Engine, env: Environment, tokenizer: Any, questions: Sequence[Question], *, batch_size: int = 64,
             max_step_tokens: int = 500, max_context_tokens: int = 4096, metric: str = "em",
             progress: bool = False) -> EvalResult:
    """Greedy single-chain rollouts (M = 1, N = L = 0, temperature 0) scored by pure EM / F1."""
    res = EvalResult([], [], [], [])
    for s in tqdm(range(0, len(questions), batch_size), desc="eval", disable=not progress):
        qs = questions[s:s + batch_size]
        trees, _ = sample_trees(engine, env, [env.prompt_ids(q.question) for q in qs], M=1, N=0, L=0,
                                sampling=Sampling(temperature=0.0), rng=random.Random(0),
                                max_step_tokens=max_step_tokens, max_context_tokens=max_context_tokens)
        for q, (tree,) in zip(qs, trees):
            traj = tree.trajectory(tree.leaves()[0])
            text = "".join(st.text for st in traj.steps)
            res.scores.append(answer_score(text, q.golden_answers, metric))
            res.tool_calls.append(traj.tool_calls)
            res.sources.append(q.data_source)
            res.transcripts.append(tokenizer.decode(traj.response_ids, skip_special_tokens=False))
    return res


def result_row(result: EvalResult, cfg: Config, *, method: str, model: str, seed: int, step: int) -> dict:
    """A Table-1-shaped row: one column per data_source, tool calls, and provenance."""
    row: dict[str, Any] = {"model": model, "method": method, "step": step}
    row.update({k: round(100 * v, 2) for k, v in result.by_source().items()})
    row.update({f"calls_{k}": round(v, 3) for k, v in result.calls_by_source().items()})
    row.update(**provenance(cfg, seed), n=len(result.scores))
    return row
