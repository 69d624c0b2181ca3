"""Generation engines: the interface every engine implements, and the transformers (HF) engine.

An engine turns contexts (token ids) into *rows* and generates one agent step per row at a time:

    batch = engine.open(contexts, counts, sampling)   # row r of context c for each of counts[c]
    outs  = batch.generate(rows, max_new_tokens)       # one step per listed row, stop at STOP_STRINGS
    batch.append(rows, observation_ids)                # the environment's tokens, fed to the live state
    batch.release(rows)                                # finished rows free their state

Token ids are returned exactly as sampled. `batch.stats` counts prefill tokens actually computed
and prefill tokens saved by reuse (a context shared by k rows is prefilled once: k-1 saved).

`open(..., prefixes=store)` (a `tg.engines.kvcache.PrefixStore`, scoped to one rollout) keeps the rows a batch
releases and lets a later batch start a context from the cache of a kept row it extends (tree
expansion: a branch's context is a prefix of the chain it branches from) instead of prefilling it.
The caches themselves are in `tg.engines.kvcache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from tg.agent.finetune import folded_lora
from tg.agent.protocol import STOP_STRINGS
from tg.engines.kvcache import GrowingCache, PrefixStore, grouped_attention
from tg.loss import entropy


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
    entropies: list[float] = field(default_factory=list)
    """Entropy in nats of the distribution each id was drawn from, under the same convention as `logprobs`
    (the model's unmodified distribution: temperature 1, no top-p), one per id; exact, over the whole
    vocabulary. Empty when the engine was not asked for them (`VLLMEngine(entropies=False)`)."""


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
    """Totals of the batch."""
    row_stats: list[PrefillStats]
    """Per row (the ledger splits them by question)."""

    def generate(self, rows: Sequence[int], max_new_tokens: Sequence[int]) -> list[GenOut]: ...

    def append(self, rows: Sequence[int], ids: Sequence[Sequence[int]]) -> None: ...

    def release(self, rows: Sequence[int]) -> None: ...


class Engine(Protocol):
    def open(self, contexts: Sequence[Sequence[int]], counts: Sequence[int], sampling: Sampling,
             prefixes: PrefixStore | None = None) -> EngineBatch: ...

    def sync(self, model: Any, probe_ids: Sequence[int] | None = None) -> float | None:
        """Serve the trainer's current weights (before the first rollout and after each optimiser step); with a probe,
        check that the engine's log-probs of it match the trainer's and return the max |difference|."""


# ---------------------------------------------------------------------------------------------
# Stop detection
# ---------------------------------------------------------------------------------------------
class StopChecker:
    """Detects the end of a step without cutting inside a sampled token.

    Single-token stops (the tiny tokenizer's tags) are matched by id; multi-token stop strings
    (Qwen's BPE splits `</search>` into several tokens) by decoding the tail of the step: the step
    ends at the token that completes the string, and that whole token is kept.
    """

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str] = STOP_STRINGS) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        single = [tokenizer.convert_tokens_to_ids(s) for s in stop_strings]
        unk = getattr(tokenizer, "unk_token_id", None)
        self.stop_ids = {i for i in single if isinstance(i, int) and i != unk and i >= 0}
        self.by_id = len(self.stop_ids) == len(self.stop_strings)
        eos = {getattr(tokenizer, "eos_token_id", None), tokenizer.convert_tokens_to_ids("<|im_end|>"),
               tokenizer.convert_tokens_to_ids("<|endoftext|>")}
        self.eos_ids = {i for i in eos if isinstance(i, int) and i != unk and i >= 0}
        self.window = max(len(s) for s in self.stop_strings)

    def check(self, ids: Sequence[int]) -> str | None:
        """'stop', 'eos' or None for a step's ids so far (the last id just sampled)."""
        last = ids[-1]
        if last in self.eos_ids:
            return "eos"
        if self.by_id:
            return "stop" if last in self.stop_ids else None
        tail = self.tokenizer.decode(list(ids[-self.window:]), skip_special_tokens=False)
        return "stop" if any(s in tail for s in self.stop_strings) else None


NUCLEUS_CANDIDATES = 256
"""Top-p sorts this many most likely tokens first; a row whose candidates hold less than top_p sorts them all."""


def sample_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> torch.Tensor:
    """Sample one token per row from logits [B, V] (greedy when temperature is 0); returns [B]."""
    if not torch.isfinite(logits).all():
        raise FloatingPointError("the policy produced non-finite logits while sampling (NaN/inf weights?)")
    if sampling.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        # The nucleus is the head of the descending order: sort only the top candidates (a full sort of a
        # 49k vocabulary per row per token is most of a step's sampling time), all of them if they hold < top_p.
        sorted_p, order = probs.topk(min(NUCLEUS_CANDIDATES, probs.shape[-1]), dim=-1)
        if (sorted_p.sum(-1) < sampling.top_p).any():
            sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < sampling.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# ---------------------------------------------------------------------------------------------
# The transformers engine: a ragged decode loop over one growing cache
# ---------------------------------------------------------------------------------------------
class HFEngine:
    """Batched step generation with transformers, prefix-KV reuse and live multi-turn caches.

    One `GrowingCache` holds every row. Rows are ragged: each forward feeds each row a block of
    its pending tokens (right-padded, padding masked out), with explicit position ids, so holes in
    the cache are harmless. A row always keeps >= 1 pending (uncached) token, so the cache never
    covers every input id (a forward needs an uncached token to produce the next token's logits).
    A row whose step has ended while others still decode is swapped behind the rows being fed, and a
    forward runs only up to the last fed row: a turn waits for its longest step without computing the
    finished rows (which are also the ones `release` then drops, a narrowing that copies nothing).
    Everything that touches the model or the cache runs under `torch.inference_mode`: no autograd bookkeeping on
    any of a forward's few thousand small ops (about 2% of a rollout on SmolLM2-135M, the same tokens sampled).

    prefix_reuse=True: a context shared by k rows is prefilled once and its cache rows repeated
    (`batch_select_indices` with repeated indices = copy + repeat-interleave), and with a
    `PrefixStore` a context starts from the cache of the kept row sharing its longest prefix; released
    rows are kept there (their K/V gathered to a compact copy). False: every row prefills its own copy
    and the store is ignored (to measure the saving).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 500, prefix_reuse: bool = True) -> None:
        self.model = model
        self.folded: Any | None = None
        """`sync`'s copy of a LoRA model with its adapters folded in (what the engine then samples from)."""
        self.tokenizer = tokenizer
        self.prefix_reuse = prefix_reuse
        self.stop = StopChecker(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def open(self, contexts: Sequence[Sequence[int]], counts: Sequence[int], sampling: Sampling,
             prefixes: PrefixStore | None = None) -> "HFBatch":
        return HFBatch(self, contexts, counts, sampling, prefixes if self.prefix_reuse else None)

    def sync(self, model: Any, probe_ids: Sequence[int] | None = None) -> None:
        """Serve the trainer's weights: its own model object, or for LoRA on a full-precision base a copy with the
        adapters folded in (`tg.agent.finetune.folded_lora`, refreshed in place at each sync). Nothing to check."""
        self.folded = folded_lora(model, self.folded)
        self.model = self.folded if self.folded is not None else model


class HFBatch:
    """The live state of an `HFEngine` batch; see `EngineBatch`."""

    def __init__(self, engine: HFEngine, contexts: Sequence[Sequence[int]], counts: Sequence[int],
                 sampling: Sampling, prefixes: PrefixStore | None = None) -> None:
        if len(contexts) != len(counts) or any(len(c) < 1 for c in contexts) or any(n < 0 for n in counts):
            raise ValueError("open(contexts, counts): one count >= 0 per non-empty context")
        self.engine, self.sampling, self.prefixes = engine, sampling, prefixes
        self.model = engine.model
        self.device = next(self.model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        self.stats = PrefillStats()
        self.row_stats: list[PrefillStats] = []
        self.cache = GrowingCache()
        self.attn = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [B, T_cache]
        self.pos: list[int] = []          # next position id per internal row
        self.pending: list[list[int]] = []  # tokens not yet in the cache per internal row
        self.cached: list[list[int]] = []   # tokens in the cache per internal row, in order
        self.cols: list[list[int]] = []     # the cache column of each of them
        self.index: dict[int, int] = {}   # external row id -> internal row
        self._prefill(contexts, counts)

    # ---- set-up --------------------------------------------------------------------------------
    @torch.inference_mode()
    def _prefill(self, contexts: Sequence[Sequence[int]], counts: Sequence[int]) -> None:
        reuse = self.engine.prefix_reuse
        heads = [list(c[:-1]) for c in contexts]  # the last context token stays pending
        if reuse:
            blocks, repeat = heads, list(counts)
        else:
            blocks = [h for h, n in zip(heads, counts) for _ in range(n)]
            repeat = [1] * len(blocks)
        kept = [self.prefixes.longest(b) if self.prefixes and b else (-1, 0) for b in blocks]
        todo = [i for i, (b, (_, m)) in enumerate(zip(blocks, kept)) if len(b) > m]
        rows = [i for i, n in enumerate(repeat) for _ in range(n)]
        if todo:
            self._start_from(kept)
            self._forward([blocks[i][kept[i][1]:] for i in todo], todo)
            self._select(torch.tensor(rows, dtype=torch.long))
        else:  # every context is cached already (a tree expansion): assemble the rows, repeats included
            self._start_from([kept[i] for i in rows])
        row_ctx = [i for i, n in enumerate(counts) for _ in range(n)]
        self.pending = [[contexts[c][-1]] for c in row_ctx]
        self.index = {r: r for r in range(len(row_ctx))}
        first = set()
        for c in row_ctx:
            s = PrefillStats()
            s.computed = 1  # the last context token is fed per row
            if reuse and c in first:
                s.saved = len(heads[c])
            else:
                s.saved = kept[c][1] if reuse else 0  # from a kept row
                s.computed += len(heads[c]) - s.saved
                first.add(c)
            self.row_stats.append(s)
        self.stats.computed = sum(s.computed for s in self.row_stats)
        self.stats.saved = sum(s.saved for s in self.row_stats)

    def _start_from(self, kept: Sequence[tuple[int, int]]) -> None:
        """One internal row per (kept row, length): that kept row's first `length` cached tokens,
        left-aligned, the other columns masked (length 0: an empty row)."""
        width = max((m for _, m in kept), default=0)
        self.pos = [m for _, m in kept]
        self.cached = [self.prefixes.ids[r][:m] if m else [] for r, m in kept]
        self.cols = [list(range(m)) for _, m in kept]
        self.pending = [[] for _ in kept]
        self.attn = (torch.arange(width)[None, :] < torch.tensor(self.pos, dtype=torch.long)[:, None]).long()
        self.attn = self.attn.to(self.device)
        if not width:
            return
        for layer in range(len(self.prefixes.kv[next(r for r, m in kept if m)])):
            k0 = next(self.prefixes.kv[r][layer][0] for r, m in kept if m)
            shape = (len(kept), k0.shape[0], max(64, 2 * width), k0.shape[-1])  # (B, heads, capacity, head_dim)
            keys, values = k0.new_empty(shape), k0.new_empty(shape)
            keys[:, :, :width], values[:, :, :width] = 0, 0  # masked columns, but finite
            for i, (r, m) in enumerate(kept):
                if m:
                    keys[i, :, :m], values[i, :, :m] = (t[:, :m] for t in self.prefixes.kv[r][layer])
            self.cache.adopt(layer, keys, values, width)

    def _swap(self, a: int, b: int) -> None:
        """Exchange internal rows a and b: cache, mask and per-row state (external row ids follow their rows)."""
        self.cache.swap_rows(a, b)
        self.attn[[a, b]] = self.attn[[b, a]]
        for state in (self.pos, self.pending, self.cached, self.cols):
            state[a], state[b] = state[b], state[a]
        moved = {a: b, b: a}
        self.index = {r: moved.get(i, i) for r, i in self.index.items()}

    def _to_front(self, rows: Sequence[int]) -> None:
        """Swap internal rows so that `rows` are the first len(rows) ones, so that a forward feeding them skips the rest."""
        n, fed = len(rows), set(rows)
        for a, b in zip([i for i in range(n) if i not in fed], [i for i in rows if i >= n]):
            self._swap(a, b)

    def _select(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) internal rows, in this order: cache, mask and per-row state alike."""
        if self.cache.get_seq_length():
            self.cache.batch_select_indices(rows.to(self.device))
        self.attn = self.attn[rows.to(self.device)]
        keep = rows.tolist()
        self.pos = [self.pos[i] for i in keep]
        self.pending = [list(self.pending[i]) for i in keep]
        self.cached = [list(self.cached[i]) for i in keep]
        self.cols = [list(self.cols[i]) for i in keep]

    # ---- one ragged forward ----------------------------------------------------------------------
    def rows_run(self, rows: Sequence[int]) -> int:
        """How many internal rows a forward feeding `rows` computes: up to the last fed one (all of them while the
        cache is empty, as its layers start at the batch's full size)."""
        return max(rows) + 1 if self.cache.get_seq_length() else len(self.pos)

    def _forward(self, blocks: Sequence[Sequence[int]], rows: Sequence[int]) -> torch.Tensor:
        """Feed blocks[i] to internal row rows[i] (others get masked padding; rows after the last fed one are left
        out); logits [len(rows), V] at each fed row's last real token."""
        B, n = len(self.pos), self.rows_run(rows)
        width = max(len(b) for b in blocks)
        ids = torch.full((B, width), self.engine.pad_id, dtype=torch.long)
        mask = torch.zeros(B, width, dtype=torch.long)
        at = (torch.tensor([r for b, r in zip(blocks, rows) for _ in b]),  # (row, column) of every fed token
              torch.tensor([j for b in blocks for j in range(len(b))]))
        ids[at] = torch.tensor([t for b in blocks for t in b], dtype=torch.long)
        mask[at] = 1
        posn = torch.tensor(self.pos, dtype=torch.long)[:, None] + torch.arange(width)  # padding: any position
        attn = torch.cat([self.attn, mask.to(self.device)], dim=1)
        last = [len(b) - 1 for b in blocks]
        keep = sorted(set(last))  # the head runs only at the columns some row samples from, not at every prefill token
        with grouped_attention(self.model), self.cache.narrowed(n):
            out = self.model(input_ids=ids[:n].to(self.device), attention_mask=attn[:n],
                             position_ids=posn[:n].to(self.device), past_key_values=self.cache, use_cache=True,
                             logits_to_keep=torch.tensor(keep, device=self.device))
        first_col = self.attn.shape[1]
        self.attn = attn
        for b, r in zip(blocks, rows):
            self.pos[r] += len(b)
            self.cached[r].extend(b)
            self.cols[r].extend(range(first_col, first_col + len(b)))
        at_col = torch.tensor([keep.index(j) for j in last], device=self.device)
        return out.logits[torch.tensor(rows, device=self.device), at_col].float()

    # ---- the EngineBatch API -----------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, rows: Sequence[int], max_new_tokens: Sequence[int]) -> list[GenOut]:
        outs = [GenOut([], [], "length") for _ in rows]
        live = [i for i, cap in enumerate(max_new_tokens) if cap > 0]
        while live:
            self._to_front([self.index[rows[i]] for i in live])
            fed = [self.index[rows[i]] for i in live]
            blocks = [self.pending[r] for r in fed]
            assert all(blocks), "every row keeps >= 1 uncached token (a cache covering all ids is wrong)"
            for i, b in zip(live, blocks):
                self.row_stats[rows[i]].computed += len(b) - 1  # observations; the sampled token is decode
            logits = self._forward(blocks, fed)
            tok = sample_next(logits, self.sampling, self.generator).tolist()
            logp = torch.log_softmax(logits, -1)[torch.arange(len(live)), torch.tensor(tok)].tolist()
            ent = entropy(logits).tolist()  # [len(live)], from the logits just sampled from: no extra forward
            still = []
            for j, i in enumerate(live):
                outs[i].ids.append(tok[j])
                outs[i].logprobs.append(logp[j])
                outs[i].entropies.append(ent[j])
                self.pending[fed[j]] = [tok[j]]
                finish = self.engine.stop.check(outs[i].ids)
                if finish is not None:
                    outs[i].finish = finish
                elif len(outs[i].ids) < max_new_tokens[i]:
                    still.append(i)
            live = still
        for r, o in zip(rows, outs):
            self.row_stats[r].generated += len(o.ids)
        self._sum_stats()
        return outs

    def append(self, rows: Sequence[int], ids: Sequence[Sequence[int]]) -> None:
        """Queue observation ids; they are prefilled with the row's next forward (live cache, no re-prefill)."""
        for r, extra in zip(rows, ids):
            self.pending[self.index[r]].extend(int(t) for t in extra)

    @torch.inference_mode()
    def release(self, rows: Sequence[int]) -> None:
        """Drop finished rows from the cache (the batch gets narrower as episodes end); with a prefix
        store, keep their cached tokens and K/V there first."""
        gone = {self.index.pop(r) for r in rows}
        if not gone:
            return
        if self.prefixes is not None and self.prefixes.keep and self.cache.get_seq_length():
            order = sorted(gone)  # one gather per layer: each row's cached columns, left-aligned
            width = max(len(self.cols[i]) for i in order)
            cols = torch.tensor([self.cols[i] + [0] * (width - len(self.cols[i])) for i in order], device=self.device)
            picked = torch.tensor(order, device=self.device)[:, None]
            kv = [(layer.keys[picked, :, cols].transpose(1, 2), layer.values[picked, :, cols].transpose(1, 2))
                  for layer in self.cache.layers]  # (rows, heads, width, head_dim) each
            for j, i in enumerate(order):
                self.prefixes.add(self.cached[i], [(k[j], v[j]) for k, v in kv])
        keep = [i for i in range(len(self.pos)) if i not in gone]
        remap = {old: new for new, old in enumerate(keep)}
        self.index = {r: remap[i] for r, i in self.index.items()}
        self._select(torch.tensor(keep, dtype=torch.long))

    def _sum_stats(self) -> None:
        self.stats.computed = sum(s.computed for s in self.row_stats)
        self.stats.saved = sum(s.saved for s in self.row_stats)
        self.stats.generated = sum(s.generated for s in self.row_stats)
