"""Generation engines: the interface every engine implements, and the transformers (HF) engine.

An engine turns contexts (token ids) into *rows* and generates one agent step per row at a time:

    batch = engine.open(contexts, counts, sampling)   # row r of context c for each of counts[c]
    outs  = batch.generate(rows, max_new_tokens)       # one step per listed row, stop at STOP_STRINGS
    batch.append(rows, observation_ids)                # the environment's tokens, fed to the live state
    batch.release(rows)                                # finished rows free their state

Token ids are returned exactly as sampled. `batch.stats` counts prefill tokens actually computed
and prefill tokens saved by reuse (a context shared by k rows is prefilled once: k-1 saved).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class Sampling:
    """Sampling controls for one batch. temperature 0 = greedy (evaluation)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class GenOut:
    """One generated step of one row."""

    ids: list[int]
    """Sampled token ids, exactly as sampled (the stop string's tokens included)."""
    logprobs: list[float]
    """Log-probs of `ids` under the model's unmodified distribution (temperature 1, no top-p)."""
    finish: str
    """'stop' (a stop string closed), 'eos' (an end-of-sequence token), 'length' (per-step cap)."""


@dataclass
class PrefillStats:
    """Prefill accounting of one batch (the budget ledger reads it)."""

    computed: int = 0
    """Context tokens run through the model before decoding (prompts, expansion contexts, observations)."""
    saved: int = 0
    """Context tokens not recomputed thanks to prefix reuse."""
    generated: int = 0
    """Tokens sampled."""


class EngineBatch(Protocol):
    stats: PrefillStats

    def generate(self, rows: Sequence[int], max_new_tokens: Sequence[int]) -> list[GenOut]: ...

    def append(self, rows: Sequence[int], ids: Sequence[Sequence[int]]) -> None: ...

    def release(self, rows: Sequence[int]) -> None: ...


class Engine(Protocol):
    def open(self, contexts: Sequence[Sequence[int]], counts: Sequence[int], sampling: Sampling) -> EngineBatch: ...
