"""The HF engine's key/value caches: a cache that grows without copies, attention that keeps grouped K/V
heads grouped under a padding mask, and the store of finished rows a later batch continues from.

Values never change here, only copies go: every structure gives the logits of transformers' own
`DynamicCache` and `sdpa` attention (tests/test_engine.py checks each, bit for bit or within 1e-5).
"""

from __future__ import annotations

import bisect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import Cache, DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


@dataclass
class PrefixStore:
    """Finished rows of earlier batches of one rollout: their cached token ids and K/V, so that a later
    batch prefills only what a context adds to the longest cached prefix it shares (HF engine; vLLM's
    prefix cache does the same by itself). Scoped to one rollout: the K/V belong to the weights that
    computed them, so a store must not outlive an optimiser step.
    """

    ids: list[list[int]] = field(default_factory=list)
    kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    """Per kept row, per layer: keys and values (heads, >= len(ids), head_dim); the first len(ids) columns count."""
    keep: bool = True
    """Whether released rows are added (False for a rollout's last round: no later batch continues them)."""
    _order: list[tuple[list[int], int]] = field(default_factory=list, repr=False)
    """(ids, row) sorted by ids: the longest common prefix with a context is a sorted neighbour's."""

    def add(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        bisect.insort(self._order, (ids, len(self.ids)))
        self.ids.append(ids)
        self.kv.append(kv)

    def longest(self, context: Sequence[int]) -> tuple[int, int]:
        """(kept row, length) of the longest cached prefix of `context` (length 0: none); among rows that
        share as much, the earliest kept."""
        ctx = list(context)
        at = bisect.bisect_left(self._order, (ctx,))
        length = max((_common(self._order[i][0], ctx) for i in (at - 1, at) if 0 <= i < len(self._order)), default=0)
        if not length:
            return -1, 0
        lo, hi = at, at  # the sorted run of rows whose first `length` ids are the context's
        while lo > 0 and self._order[lo - 1][0][:length] == ctx[:length]:
            lo -= 1
        while hi < len(self._order) and self._order[hi][0][:length] == ctx[:length]:
            hi += 1
        return min(r for _, r in self._order[lo:hi]), length


def _common(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two id lists (bisect on list equality: C speed)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid - 1)
    return lo


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` that appends into buffers with spare capacity (doubled when full) instead of
    re-concatenating the whole cache at every step; `keys`/`values` are views of their first T columns.

    `DynamicLayer.update` copies the cache with `torch.cat` per layer per decoded token: at batch 128 with
    450 cached tokens that copy was 58% of a forward on CPU. The values are the same; only the copies go.
    """

    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    rows: int | None = None
    """While set (`GrowingCache.narrowed`), only the first `rows` batch rows take part in a forward: `keys`/`values`
    are views of those rows, and `update` writes theirs and zeros into the other rows' new columns (masked, finite)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._buffers = None
        length, n = self.get_seq_length(), key_states.shape[-2]
        if not self._holds_keys():  # fresh, or a parent method replaced the keys: they are the whole cache
            self._buffers = (self.keys, self.values) if length else None
        if self._buffers is None or self._buffers[0].shape[-2] < length + n:
            old = self._buffers
            batch = old[0].shape[0] if old is not None else key_states.shape[0]
            shape = (batch, key_states.shape[1], max(64, 2 * (length + n)), key_states.shape[-1])
            self._buffers = (key_states.new_empty(shape), value_states.new_empty(shape))
            if length:
                for new, src in zip(self._buffers, old):
                    new[:, :, :length] = src[:, :, :length]
        fed = key_states.shape[0]
        for buf, states in zip(self._buffers, (key_states, value_states)):
            buf[:fed, :, length:length + n] = states
            buf[fed:, :, length:length + n] = 0
        self._view(length + n)
        return self.keys, self.values

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Start from buffers the caller filled: their first `length` columns are the cache, the rest spare."""
        self.lazy_initialization(keys, values)
        self._buffers = (keys, values)
        self._view(length)

    def narrow(self, rows: int | None) -> None:
        """Let only the first `rows` batch rows take part (None: all of them); see `rows`."""
        length = self.get_seq_length()
        if not self._holds_keys():
            raise RuntimeError("narrow() needs the cache in this layer's buffers")
        self.rows = rows
        self._view(length)

    def _holds_keys(self) -> bool:
        """Whether `keys` is still the view of the buffers (a parent method may have replaced it)."""
        b = self._buffers
        rows = b[0].shape[0] if b is not None and self.rows is None else self.rows
        return b is not None and rows == self.keys.shape[0] and (
            self.keys.numel() == 0 or self.keys.data_ptr() == b[0].data_ptr())

    def _view(self, length: int) -> None:
        self.keys, self.values = (b[:self.rows, :, :length] for b in self._buffers)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep (or repeat) batch rows into buffers of the same capacity, copying only the cached columns
        (row by row: a whole-buffer gather would copy the spare capacity too, about twice the time). Keeping
        the first rows in order copies nothing: the buffers' first rows are kept as they are."""
        if self.get_seq_length() > 0 and self._holds_keys():
            length, keep = self.get_seq_length(), indices.tolist()
            if keep == list(range(len(keep))):
                self._buffers = tuple(b[:len(keep)] for b in self._buffers)
            else:
                old, self._buffers = self._buffers, tuple(b.new_empty(len(keep), *b.shape[1:]) for b in self._buffers)
                for j, i in enumerate(keep):
                    for new, src in zip(self._buffers, old):
                        new[j, :, :length] = src[i, :, :length]
            self._view(length)
        else:
            super().batch_select_indices(indices)


class GrowingCache(DynamicCache):
    """A `DynamicCache` of `GrowingLayer`s (the HF engine's cache)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    def adopt(self, layer: int, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Layer `layer` starts from buffers the caller filled (see `GrowingLayer.adopt`)."""
        while len(self.layers) <= layer:
            self.layers.append(GrowingLayer())
        self.layers[layer].adopt(keys, values, length)

    @contextmanager
    def narrowed(self, rows: int) -> Iterator[None]:
        """Inside the block only the first `rows` batch rows take part in a forward (`GrowingLayer.rows`)."""
        for layer in self.layers:
            layer.narrow(rows)
        try:
            yield
        finally:
            for layer in self.layers:
                layer.narrow(None)

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange batch rows a and b of every layer (their cached columns): three row copies through a spare row,
        where an indexed exchange (`t[[a, b]] = t[[b, a]]`) gathers both rows and then scatters them."""
        for layer in self.layers:
            for t in (layer.keys, layer.values):
                spare = t[a].clone()
                t[a] = t[b]
                t[b] = spare


GROUPED_SDPA = "tg_sdpa_grouped"


def sdpa_grouped(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' `sdpa` attention, except that grouped K/V heads stay grouped under a padding mask.

    transformers repeats K/V to every query head whenever a mask is given (CUDA's fast kernels lack masked
    GQA); on CPU that is a copy of the whole cache per layer per forward, about half of a masked decode
    forward at batch 128. torch's `enable_gqa` gives the same values without the copy (tested).
    """
    causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, sdpa_grouped)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


@contextmanager
def grouped_attention(model: Any) -> Iterator[None]:
    """Run `model`'s sdpa attention as `sdpa_grouped` inside the block (CPU only; restored after)."""
    config = model.config
    if config._attn_implementation != "sdpa" or next(model.parameters()).device.type != "cpu":
        yield
        return
    config._attn_implementation = GROUPED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
