"""Packed training rows (tg.packing): the logits of every row token equal a per-row forward's, and a
trainer step with packing matches one without."""

import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tg.packing import pack_batch, pack_rows, packed_row_logits


def _tree_rows(rng: random.Random, vocab: int = 40) -> list[list[int]]:
    """Rows of a tree: a shared prompt, then branches that split at random depths."""
    base = [rng.randrange(vocab) for _ in range(12)]
    rows = [base + [rng.randrange(vocab) for _ in range(rng.randrange(3, 9))]]
    for _ in range(3):
        cut = rng.randrange(12, len(rows[0]))
        rows.append(rows[rng.randrange(len(rows))][:cut] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))])
    return rows


def test_pack_rows_stores_each_prefix_once_and_points_rows_at_it():
    p = pack_rows([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6]], width=5)
    assert p.ids.tolist() == [1, 2, 3, 4, 5, 6] and p.pos.tolist() == [0, 1, 2, 3, 2, 3]
    assert p.where.tolist() == [[0, 1, 2, 3, 0], [0, 1, 4, 0, 0], [0, 1, 2, 5, 0]]
    assert p.visible[5].tolist() == [True, True, True, False, False, True]  # 6 sees 1, 2, 3 and itself


@pytest.mark.parametrize("seed", range(3))
def test_packed_logits_equal_per_row_logits(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=128)).eval()
    groups = [_tree_rows(rng) for _ in range(3)]
    width = max(len(r) for g in groups for r in g)
    with torch.no_grad():
        packed = packed_row_logits(model, pack_batch(groups, width))
        for k, row in enumerate(r for g in groups for r in g):
            alone = model(input_ids=torch.tensor([row])).logits[0]
            assert packed[k, :len(row)] == pytest.approx(alone, abs=1e-5)
    assert sum(len(pack_rows(g).ids) for g in groups) < sum(len(r) for g in groups for r in g)
