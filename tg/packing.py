"""Training a tree's rows once: its trajectories packed into one sequence with a tree attention mask.

The rows of one tree share prefixes (the prompt, the seed chain's first steps). Trained one row each,
every shared token is recomputed once per row through it: for (2,2,1) trees the update runs through
about twice the tokens of the tree itself (bench/README.md). Packed, each distinct prefix is one run
of positions; a token attends to the tokens on its own root-to-token path only, at the position ids
it has in its row, so its logits are the ones its rows would compute (equal up to float summation
order; tested against the per-row forward), and the rows' logits are gathered back from them. The
gather is differentiable: a shared token's gradient is the sum over its rows, as in per-row training.

    packed = pack_rows(row_ids)                  # one trie over the rows' exact ids
    logits = model(input_ids=packed.ids[None], attention_mask=packed.visible[None, None],
                   position_ids=packed.pos[None]).logits[0]
    row_logits = logits[packed.where]            # [R, T, V], as a per-row forward gives (padding: any)

`pack_batch` does the packing for several trees in one padded batch (the trainer's micro-batch, packed
once per update and reused by its reference, old-policy and training forwards), `packed_logits` the
forward. The trainer gathers only the logits it needs (`where` at the positions that predict policy
tokens), not whole rows.

Every row of a batch also begins with the same tokens: the prompt template's instructions, 101 of a prompt's
about 116 tokens on the cpu preset, about a third of a chain's row. `packed_logits(..., shared=n)` runs those
n positions once, as a batch of one, and lets every sequence attend to their keys and values, a
`DynamicCache` repeated over the batch (gradients flow back through it, summed over the sequences, as in
per-row training). The logits are those of the full forward up to float summation order (tested);
`rows_batch` gives right-padded rows the same form, so unpacked rows share the prefix too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Packed:
    """Rows merged on their common prefixes. P packed positions, R rows of width T."""

    ids: torch.Tensor
    """[P] token ids: every distinct (prefix, token) once, each after its predecessor on its path."""
    pos: torch.Tensor
    """[P] position ids: a token's index in the rows that contain it."""
    visible: torch.Tensor
    """[P, P] bool: visible[i, j] iff j lies on i's root-to-token path (itself included)."""
    where: torch.Tensor
    """[R, T] the packed position of each row token; padding columns point at position 0."""


def pack_rows(rows: Sequence[Sequence[int]], width: int | None = None) -> Packed:
    """Pack token-id rows into one sequence along their shared prefixes (a trie in creation order, so
    every token comes after all the tokens it attends to)."""
    node: dict[tuple[int, int], int] = {}
    ids: list[int] = []
    pos: list[int] = []
    parent: list[int] = []
    width = max(map(len, rows)) if width is None else width
    where = [[0] * width for _ in rows]  # a list, filled per token, made a tensor once (cheaper by far)
    for r, row in enumerate(rows):
        prev = -1
        for t, tok in enumerate(row):
            key = (prev, int(tok))
            if key not in node:
                node[key] = len(ids)
                ids.append(int(tok))
                pos.append(t)
                parent.append(prev)
            prev = node[key]
            where[r][t] = prev
    visible = torch.zeros(len(ids), len(ids), dtype=torch.bool)
    for i, p in enumerate(parent):
        if p >= 0:
            visible[i] = visible[p]
        visible[i, i] = True
    return Packed(torch.tensor(ids), torch.tensor(pos), visible, torch.tensor(where, dtype=torch.long))


@dataclass(frozen=True)
class PackedBatch:
    """Several trees' packed sequences, right-padded to P positions (a padding position sees itself)."""

    ids: torch.Tensor
    """[B, P] token ids."""
    pos: torch.Tensor
    """[B, P] position ids."""
    visible: torch.Tensor
    """[B, P, P] bool attention mask."""
    where: torch.Tensor
    """[R, width] each row token's index into the flattened [B * P] positions, rows in group order."""


def pack_batch(groups: Sequence[Sequence[Sequence[int]]], width: int, pad_id: int = 0) -> PackedBatch:
    """Pack each group (the rows of one tree) with `pack_rows`, then pad the packs into one batch."""
    packs = [pack_rows(g, width) for g in groups]
    P = max(len(p.ids) for p in packs)
    ids = torch.full((len(packs), P), pad_id, dtype=torch.long)
    pos = torch.zeros(len(packs), P, dtype=torch.long)
    visible = torch.eye(P, dtype=torch.bool).repeat(len(packs), 1, 1)
    for b, p in enumerate(packs):
        n = len(p.ids)
        ids[b, :n], pos[b, :n], visible[b, :n, :n] = p.ids, p.pos, p.visible
    where = torch.cat([p.where + b * P for b, p in enumerate(packs)])
    return PackedBatch(ids, pos, visible, where)


def rows_batch(ids: torch.Tensor) -> PackedBatch:
    """Right-padded rows [B, W] as a batch of trivially packed sequences: position ids 0.., causal visibility
    (one [1, W, W] mask broadcast over the rows), row tokens where they are."""
    B, W = ids.shape
    return PackedBatch(ids, torch.arange(W).expand(B, W), torch.ones(1, W, W, dtype=torch.bool).tril(),
                       torch.arange(B * W).view(B, W))


def common_prefix(ids: torch.Tensor, limit: int) -> int:
    """How many leading positions (at most `limit`) hold the same id in every row of `ids` [B, W]."""
    same = (ids[:, :limit] == ids[:1, :limit]).all(0)
    return int(same.long().cumprod(0).sum())


def packed_logits(model: torch.nn.Module, batch: PackedBatch, shared: int = 0,
                  prefix_model: torch.nn.Module | None = None) -> torch.Tensor:
    """[B * (P - shared), V] logits of the packed positions from `shared` on, from one forward over the batch;
    `batch.where` minus `shared` (per sequence) indexes them by row token.

    The first `shared` positions must hold the same ids at the same positions in every sequence, and every
    later position must see them (true of a common prefix of the rows: it is on every token's path). They run
    once through `prefix_model` (default `model`; a DDP wrapper's own module, whose single backward then
    reduces each gradient once) and every sequence attends to their keys and values."""
    first = next(p for p in model.parameters() if p.is_floating_point())  # the embedding: the activations' dtype
    dev = first.device
    ids, pos = batch.ids.to(dev), batch.pos.to(dev)
    prefix = {}
    if shared:
        cache = (prefix_model or model)(input_ids=ids[:1, :shared], position_ids=pos[:1, :shared],
                                        use_cache=True).past_key_values
        cache.batch_repeat_interleave(ids.shape[0])
        prefix = {"past_key_values": cache}
    # the mask made additive once (0 visible, -inf not), as SDPA would remake a boolean one in every layer
    mask = torch.where(batch.visible[:, None, shared:].to(dev), 0.0, float("-inf")).to(first.dtype)
    logits = model(input_ids=ids[:, shared:], attention_mask=mask, position_ids=pos[:, shared:], **prefix).logits
    return logits.flatten(0, 1)
