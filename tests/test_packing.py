"""Packed training rows (tg.packing): the logits of every row token equal a per-row forward's, and a
trainer step with packing matches one without."""

import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tg.packing import common_prefix, pack_batch, pack_rows, packed_logits, rows_batch


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
        batch = pack_batch(groups, width)
        packed = packed_logits(model, batch)[batch.where]
        for k, row in enumerate(r for g in groups for r in g):
            alone = model(input_ids=torch.tensor([row])).logits[0]
            assert packed[k, :len(row)] == pytest.approx(alone, abs=1e-5)
    assert sum(len(pack_rows(g).ids) for g in groups) < sum(len(r) for g in groups for r in g)


@pytest.mark.parametrize("by_tree", [False, True])
def test_a_shared_prefix_runs_once_with_the_full_forwards_logits_and_gradients(by_tree):
    """packed_logits(shared=n): the sequences' common start runs once and its keys and values are repeated over
    the batch; every later position's logits and every parameter's gradient are the full forward's up to float
    summation order. Rows as they are (rows_batch) or packed by tree."""
    rng = random.Random(7)
    torch.manual_seed(7)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=128))
    start = [rng.randrange(40) for _ in range(7)]  # the instructions every prompt begins with
    groups = [[start + r for r in _tree_rows(rng)] for _ in range(3)]
    width = max(len(r) for g in groups for r in g)
    if by_tree:
        batch = pack_batch(groups, width)
    else:
        rows = [r for g in groups for r in g]
        batch = rows_batch(torch.tensor([r + [0] * (width - len(r)) for r in rows]))
    n = common_prefix(batch.ids, width)
    assert n == 7 and common_prefix(batch.ids, 3) == 3
    B, P = batch.ids.shape
    weights = torch.randn(B, P - n, 40)
    out = []
    for shared in (0, n):
        model.zero_grad()
        logits = packed_logits(model, batch, shared).view(B, P - shared, 40)[:, n - shared:]
        (logits * weights).sum().backward()
        out.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (full, full_grads), (once, once_grads) = out
    assert once == pytest.approx(full, abs=1e-5)
    for a, b in zip(once_grads, full_grads, strict=True):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()
    assert all(g.abs().max() > 0 for g in once_grads[:3])  # the embedding and the first layer learn through the cache


def test_the_additive_mask_gives_the_boolean_masks_logits_and_gradients_to_the_last_bit():
    """packed_logits makes the tree mask additive once per forward instead of SDPA once per layer."""
    rng = random.Random(5)
    torch.manual_seed(5)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=128))
    groups = [_tree_rows(rng) for _ in range(3)]
    batch = pack_batch(groups, max(len(r) for g in groups for r in g))
    grads = []
    for logits in (lambda: packed_logits(model, batch)[batch.where],
                   lambda: model(input_ids=batch.ids, attention_mask=batch.visible[:, None],
                                 position_ids=batch.pos).logits.flatten(0, 1)[batch.where]):
        model.zero_grad()
        out = logits()
        out.square().mean().backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (additive, g_add), (boolean, g_bool) = grads
    assert torch.equal(additive, boolean)
    assert all(torch.equal(a, b) for a, b in zip(g_add, g_bool))


def test_pack_rows_types_and_a_single_row():
    p = pack_rows([[4, 5, 6]])
    assert (p.ids.dtype, p.pos.dtype, p.where.dtype, p.visible.dtype) == (torch.long,) * 3 + (torch.bool,)
    assert p.ids.tolist() == [4, 5, 6] and p.pos.tolist() == [0, 1, 2] and p.where.tolist() == [[0, 1, 2]]
    assert p.visible.tolist() == [[True, False, False], [True, True, False], [True, True, True]]  # causal


def test_pack_rows_keys_tokens_by_their_prefix_not_their_value():
    # the same token 7 after different prefixes is two positions; the same prefix twice is one
    p = pack_rows([[1, 7], [2, 7], [1, 7]])
    assert p.ids.tolist() == [1, 7, 2, 7] and p.pos.tolist() == [0, 1, 0, 1]
    assert p.where.tolist() == [[0, 1], [2, 3], [0, 1]]
    assert p.visible[3].tolist() == [False, False, True, True]


def test_pack_batch_pads_each_pack_and_offsets_its_rows():
    groups = [[[1, 2, 3], [1, 2, 4]], [[5, 6]]]                     # packs of 4 and 2 positions
    b = pack_batch(groups, width=3)
    assert (b.ids.dtype, b.pos.dtype, b.visible.dtype) == (torch.long, torch.long, torch.bool)
    assert b.ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]] and b.pos.tolist() == [[0, 1, 2, 2], [0, 1, 0, 0]]
    assert b.visible[1].tolist() == [[True, False, False, False], [True, True, False, False],
                                     [False, False, True, False], [False, False, False, True]]  # padding: itself
    assert b.where.tolist() == [[0, 1, 2], [0, 1, 3], [4, 5, 4]]   # second pack starts at 1 * P = 4
    assert pack_batch(groups, width=3, pad_id=9).ids[1].tolist() == [5, 6, 9, 9]


class _Recorder(torch.nn.Module):
    """Wraps a model and records the device and dtype of every input it is called with."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.inputs: dict[str, tuple[str, torch.dtype]] = {}

    def forward(self, **inputs: torch.Tensor):
        self.inputs = {k: (v.device.type, v.dtype) if torch.is_tensor(v) else v for k, v in inputs.items()}
        return self.model(**inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_logits_runs_on_the_model_device_in_its_dtype(dtype):
    """A model on the meta device (no memory, any machine) gets every input moved there, and the additive tree
    mask in the activations' dtype (SDPA refuses a float mask of another dtype than the queries')."""
    with torch.device("meta"):
        model = _Recorder(Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=64, num_hidden_layers=1,
                                                       num_attention_heads=2, num_key_value_heads=1,
                                                       intermediate_size=128)).to(dtype))
    out = packed_logits(model, pack_batch([[[1, 2, 3], [1, 2, 4]]], width=3))
    assert model.inputs == {"input_ids": ("meta", torch.long), "attention_mask": ("meta", dtype),
                            "position_ids": ("meta", torch.long)}
    assert out.device.type == "meta" and out.shape == (4, 40)  # one tree, 4 packed positions
    out = packed_logits(model, rows_batch(torch.tensor([[1, 2, 3], [1, 2, 4]])), shared=2)
    assert model.inputs["attention_mask"] == ("meta", dtype) and "past_key_values" in model.inputs
    assert out.shape == (2, 40)  # the shared 2 positions once, then one position per row


def test_rows_batch_keeps_rows_where_they_are():
    """Unpacked rows: position ids 0.., a causal mask shared by the rows, and row token (r, t) at flat index r W + t."""
    b = rows_batch(torch.tensor([[1, 2, 3], [1, 4, 0]]))
    assert b.ids.tolist() == [[1, 2, 3], [1, 4, 0]] and b.pos.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert b.visible.tolist() == [[[True, False, False], [True, True, False], [True, True, True]]]
    assert b.where.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_the_shared_prefix_asks_for_its_cache_whatever_the_models_config_says():
    """A model saved with use_cache=False (as training checkpoints often are) still returns the prefix's keys and
    values: packed_logits asks for them, it does not rely on the config's default."""
    with torch.device("meta"):
        model = _Recorder(Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=64, num_hidden_layers=1,
                                                       num_attention_heads=2, num_key_value_heads=1,
                                                       intermediate_size=128, use_cache=False)))
    out = packed_logits(model, rows_batch(torch.tensor([[1, 2, 3], [1, 2, 4]])), shared=2)
    assert "past_key_values" in model.inputs and out.shape == (2, 40)
