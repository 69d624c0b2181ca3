"""TRL's trie packing (`trl.experimental.async_grpo.packing.TreeRow`, trl 1.16.0) beside the kit's (`tg.packing`) on
the same training rows: tokens each forward runs and the packing's wall time, per step, side by side in one run.

One cpu-preset step per tree shape gives fixed training rows (16 multi-hop questions); the trainer's micro-batches
are packed both ways, `--reps` times each, the order alternating: the kit's `micro_inputs` with optim.pack_trees
(each tree's rows one sequence, the micro-batch padded to its longest tree, the rows' common start run once) and
TRL's `TreeRow` (the micro-batch's rows in one sequence without padding, a trie keyed on a token and the next,
so it forks one token before the rows part; any shared prefix merged, across trees too). Both train the same
policy tokens (checked). TRL forwards a `TreeRow` only through its FA3 `tree_attention` kernel (CUDA or ROCm,
fetched with `kernels`), so its forward is not timed here.

    .venv/bin/python bench/trie_packing.py [--shapes 2,2,1 8,2,1] [--reps 7] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from _blocks import alternating_medians, publish, step_rows
from trl.experimental.async_grpo.packing import TreeRow

from tg.batch import Micro, Rows, micro_batches
from tg.packing import pack_rows


def trie_rows(rows: Rows, micros: list[Micro]) -> list[dict[str, torch.Tensor]]:
    """Each micro-batch's rows as one `TreeRow`, packed (TRL's sample fields; log-probs 0, unused here)."""
    packs = []
    for mb in micros:
        row = TreeRow()
        for r in mb.idx.tolist():
            n = int(rows.attn[r].sum())
            row.add({"input_ids": rows.ids[r, :n], "completion_mask": rows.mask[r, :n], "old_log_probs": torch.zeros(n),
                     "advantage": float(rows.adv[r]), "group_id": rows.question[r]})
        packs.append(row.pack())
    return packs


def kit_tokens(rows: Rows, mb: Micro) -> tuple[int, int]:
    """Positions the kit's forward runs for a micro-batch (the common start once, then every packed tree's rest,
    padded to the longest), and as many without the padding."""
    ids = mb.packed.ids if mb.packed is not None else mb.ids
    trees: dict[int, list[list[int]]] = {}
    for r in mb.idx.tolist():
        trees.setdefault(rows.tree[r], []).append(rows.ids[r, :int(rows.attn[r].sum())].tolist())
    unpadded = sum(len(pack_rows(t).ids) - mb.shared for t in trees.values())
    return mb.shared + ids.shape[0] * (ids.shape[1] - mb.shared), mb.shared + unpadded


def measure(shape: tuple[int, int, int], reps: int) -> dict[str, float]:
    """Both packings of one step's micro-batches at tree shape (M, N, L): median seconds and token counts."""
    tr, rows = step_rows(shape)
    optim = dataclasses.replace(tr.cfg.optim, pack_trees=True)

    def kit() -> list[Micro]:
        return [mb for mini in micro_batches(rows, optim, 1, True, tr.pad_id) for mb in mini]

    micros = kit()
    packs = trie_rows(rows, micros)
    assert [len(p["token_index"]) for p in packs] == [len(mb.at) for mb in micros]   # the same trained tokens
    out = alternating_medians({"kit": kit, "trl": lambda: trie_rows(rows, micros)}, reps)
    padded, unpadded = (sum(x) for x in zip(*(kit_tokens(rows, mb) for mb in micros)))
    out.update(rows=float(rows.attn.sum()), kit_tokens=float(padded), kit_unpadded=float(unpadded),
               trl_tokens=float(sum(len(p["input_ids"]) for p in packs)), micros=float(len(micros)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2,2,1", "8,2,1"], help="tree shapes M,N,L")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--write", default=None, help="replace the trie_packing section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = [f"`bench/trie_packing.py --reps {args.reps}`: one step's micro-batches per shape; packing times are "
             f"medians of {args.reps - 1} repetitions (the first dropped), one torch thread.", "",
             "| (M,N,L) | micro-batches | row tokens | kit: tokens forwarded (unpadded) | TRL trie: tokens forwarded "
             "| TRL / kit | kit: packing | TRL trie: packing |", "|---" * 8 + "|"]
    for s in args.shapes:
        m = measure(tuple(int(x) for x in s.split(",")), args.reps)  # type: ignore[arg-type]
        cells = [f"({s})", f"{m['micros']:.0f}", f"{m['rows']:.0f}", f"{m['kit_tokens']:.0f} ({m['kit_unpadded']:.0f})",
                 f"{m['trl_tokens']:.0f}", f"{m['trl_tokens'] / m['kit_tokens']:.2f}x", f"{m['kit'] * 1e3:.0f} ms",
                 f"{m['trl'] * 1e3:.0f} ms"]
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    publish(lines, args.write, "trie_packing")


if __name__ == "__main__":
    main()
