"""The HF engine: prefix-KV reuse and live multi-turn caches give the logits of a full recomputation."""

import copy
import random
from contextlib import nullcontext

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import DynamicCache, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tg.agent.finetune import folded_lora
from tg.agent.protocol import STOP_STRINGS
from tg.engines.engine import HFEngine, Sampling, StopChecker, NUCLEUS_CANDIDATES, sample_next
from tg.engines.kvcache import GrowingCache, PrefixStore, grouped_attention


def _bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (like Qwen's) where the protocol tags are split into several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["<think> who founded it </think> <search> Zorva </search> <answer> Kalden </answer>"] * 3
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<|im_end|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return _bpe_tokenizer()


def _full_logprobs(model, context, ids):
    """Log-probs of `ids` after `context`, by one full forward with no cache."""
    x = torch.tensor([context + ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits[0].float(), -1)
    return [logp[len(context) - 1 + i, t].item() for i, t in enumerate(ids)]


def test_growing_cache_equals_dynamic_cache(model):
    """Prefill, row selection with repeats, decode past the buffer's capacity, a parent method that
    replaces the keys (batch_repeat_interleave): the logits equal DynamicCache's, bit for bit."""
    g = torch.Generator().manual_seed(1)
    caches = [DynamicCache(), GrowingCache()]
    outs = [[], []]
    with torch.no_grad():
        for cache, out in zip(caches, outs):
            out.append(model(input_ids=torch.randint(0, 300, (3, 20), generator=g.manual_seed(1)),
                             past_key_values=cache, use_cache=True).logits)
            cache.batch_select_indices(torch.tensor([0, 2, 2]))
            cache.batch_repeat_interleave(2)
            x = torch.randint(0, 300, (6, 1), generator=g.manual_seed(2))
            for _ in range(70):  # 20 + 70 > the first buffer's 64 columns: it grows
                out.append(model(input_ids=x, past_key_values=cache, use_cache=True).logits)
                x = out[-1][:, -1].argmax(-1, keepdim=True)
    assert caches[1].get_seq_length() == caches[0].get_seq_length() == 90
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_grouped_attention_equals_sdpa_under_padding(model):
    """sdpa_grouped (K/V heads kept grouped under a mask) gives transformers' sdpa logits, bit for bit:
    a right-padded prefill, then a masked decode step on the cache; the model's setting is restored."""
    ids = torch.randint(0, 300, (3, 12), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[1] * 12, [1] * 7 + [0] * 5, [1] * 3 + [0] * 9])
    outs = []
    for grouped in (False, True):
        cache = DynamicCache()
        with torch.no_grad(), (grouped_attention(model) if grouped else nullcontext()):
            a = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
            b = model(input_ids=ids[:, :1], attention_mask=torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1),
                      position_ids=mask.sum(1, keepdim=True), past_key_values=cache, use_cache=True).logits
        outs.append((a * mask[..., None], b))
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("reuse", [True, False])
def test_reuse_and_multiturn_match_full_recompute(model, tokenizer, reuse):
    contexts = [list(range(10, 40)), list(range(50, 62)), [7, 8]]
    counts = [3, 2, 1]
    engine = HFEngine(model, tokenizer, prefix_reuse=reuse)
    batch = engine.open(contexts, counts, Sampling(temperature=1.0, top_p=0.95, seed=3))
    rows = list(range(6))
    first = batch.generate(rows, [6] * 6)
    obs = {0: [100, 101, 102], 3: [120], 4: [130, 131]}
    batch.release([1, 5])
    batch.append(list(obs), list(obs.values()))
    second = batch.generate([0, 2, 3, 4], [5] * 4)
    ctx_of = [0, 0, 0, 1, 1, 2]
    for r, out in zip(rows, first):
        assert out.logprobs == pytest.approx(_full_logprobs(model, contexts[ctx_of[r]], out.ids), abs=1e-5)
    for r, out in zip([0, 2, 3, 4], second):
        ctx = contexts[ctx_of[r]] + first[r].ids + obs.get(r, [])
        assert out.logprobs == pytest.approx(_full_logprobs(model, ctx, out.ids), abs=1e-5)


def test_rows_whose_step_ended_are_left_out_of_the_forward(model, tokenizer):
    """Rows finish their steps at different times: each decode forward runs only as many rows as still decode (the
    finished ones swapped behind them), every log-prob and entropy still equals a full recomputation, across a
    second turn with observations of different lengths and a release; releasing the rows at the end copies
    nothing (the cache keeps its buffers)."""
    contexts, counts, caps = [list(range(10, 40)), list(range(50, 62)), [7, 8, 9]], [2, 2, 1], [2, 7, 4, 1, 6]
    sizes: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        batch = HFEngine(model, tokenizer).open(contexts, counts, Sampling(temperature=1.0, seed=3))
        sizes.clear()  # the prefill
        first = batch.generate(range(5), caps)
        lengths = [len(o.ids) for o in first]
        assert sizes == [sum(n >= k for n in lengths) for k in range(1, max(lengths) + 1)]
        assert sizes[-1] < 5
        obs = {0: [100, 101, 102], 1: [120], 4: [130, 131, 132, 133, 134]}
        batch.release([2, 3])
        batch.append(list(obs), list(obs.values()))
        second = batch.generate(list(obs), [3, 6, 2])
        survivors = sorted(batch.index.items(), key=lambda ri: ri[1])  # (external row, internal row)
        ptr = batch.cache.layers[0].keys.data_ptr()
        batch.release([r for r, i in survivors[1:]])  # every row but the first internal one
        assert batch.cache.layers[0].keys.data_ptr() == ptr and batch.cache.layers[0].keys.shape[0] == 1
        third = batch.generate([survivors[0][0]], [4])
    finally:
        hook.remove()
    ctx_of = [0, 0, 1, 1, 2]
    rows = [(contexts[ctx_of[r]], o) for r, o in enumerate(first)]
    rows += [(contexts[ctx_of[r]] + first[r].ids + obs[r], o) for r, o in zip(obs, second)]
    r = survivors[0][0]
    rows.append((contexts[ctx_of[r]] + first[r].ids + obs[r] + second[list(obs).index(r)].ids, third[0]))
    for context, out in rows:
        assert out.logprobs == pytest.approx(_full_logprobs(model, context, out.ids), abs=1e-5)
        assert out.entropies == pytest.approx(_full_entropies(model, context, out.ids), abs=1e-5)


def _full_entropies(model, context, ids):
    """Entropy of the distribution each of `ids` was drawn from, by one full forward with no cache."""
    x = torch.tensor([context + ids])
    with torch.no_grad():
        logits = model(x).logits[0, len(context) - 1:-1].float()  # [len(ids), V]
    return torch.distributions.Categorical(logits=logits).entropy().tolist()


def test_entropies_are_those_of_the_unmodified_distribution_across_turns_and_kept_prefixes(model, tokenizer):
    """`GenOut.entropies`: one per sampled id, the entropy of the model's distribution at temperature 1 with no
    top-p (sampling at 0.7 / 0.9 must not change them), equal to a full forward's, on a first turn, after an
    observation, and from a kept prefix."""
    store, engine = PrefixStore(), HFEngine(model, tokenizer)
    sampling = Sampling(temperature=0.7, top_p=0.9, seed=5)
    contexts, obs = [list(range(10, 40)), list(range(10, 40)), list(range(50, 62))], [[100, 101], [102], [103]]
    batch = engine.open(contexts[1:], [2, 1], sampling, store)
    first = batch.generate([0, 1, 2], [8] * 3)
    batch.append([0, 1, 2], obs)
    second = batch.generate([0, 1, 2], [6] * 3)
    batch.release([0, 1, 2])
    branch = contexts[0] + first[0].ids + obs[0]
    third = engine.open([branch], [2], sampling, store).generate([0, 1], [6, 6])
    rows = [*zip(contexts, first), *((c + f.ids + o, s) for c, f, o, s in zip(contexts, first, obs, second)),
            *((branch, t) for t in third)]
    for context, out in rows:
        assert len(out.entropies) == len(out.ids) > 0
        assert out.entropies == pytest.approx(_full_entropies(model, context, out.ids), abs=1e-5)
    assert max(h for _, o in rows for h in o.entropies) > 1.0   # a random model: far from deterministic


def test_reuse_saves_prefill_and_keeps_tokens(model, tokenizer):
    contexts, counts = [list(range(10, 60)), list(range(60, 80))], [4, 2]
    res = {}
    for reuse in (True, False):
        b = HFEngine(model, tokenizer, prefix_reuse=reuse).open(contexts, counts, Sampling(seed=1))
        res[reuse] = ([o.ids for o in b.generate(range(6), [8] * 6)], b.stats)
    assert res[True][0] == res[False][0]
    on, off = res[True][1], res[False][1]
    assert on.saved == 3 * 49 + 1 * 19 and off.saved == 0
    assert off.computed == on.computed + on.saved


def test_prefix_store_continues_kept_rows_exactly(model, tokenizer):
    """A later batch starts from the cache of released rows (a tree expansion): contexts that extend a
    kept row, branch inside it, or share only part of it; logits equal a full recomputation, and the
    kept tokens count as saved, not computed."""
    store = PrefixStore()
    engine = HFEngine(model, tokenizer)
    seed = [list(range(10, 40)), list(range(50, 62))]
    first = engine.open(seed, [1, 1], Sampling(seed=2), store)
    steps = first.generate([0, 1], [6, 6])
    first.append([0, 1], [[100, 101, 102], [120]])
    more = first.generate([0, 1], [4, 4])
    first.release([0, 1])
    full = [seed[r] + steps[r].ids + obs + more[r].ids[:-1] for r, obs in enumerate([[100, 101, 102], [120]])]
    assert store.ids == full  # the cached tokens: all but each row's last sampled token (still pending)
    contexts = [full[0][:33],                   # a branch inside row 0's first step
                full[0] + [more[0].ids[-1]],    # the whole row, its pending token included
                full[1][:12] + [7, 8, 9],       # shares row 1's first 12 tokens only
                [200, 201, 202]]                # shares nothing
    second = engine.open(contexts, [2, 1, 1, 1], Sampling(seed=3), store)
    outs = second.generate(range(5), [5] * 5)
    for out, c in zip(outs, [0, 0, 1, 2, 3]):
        assert out.logprobs == pytest.approx(_full_logprobs(model, contexts[c], out.ids), abs=1e-5)
    saved = [s.saved for s in second.row_stats]
    assert saved == [32, 32, len(full[0]), 12, 0]
    assert [s.computed + s.saved for s in second.row_stats] == [33, 33, len(contexts[1]), 15, 3]
    branches = [full[0][:33], full[1][:20]]  # every context cached already: rows assembled, repeats included
    third = engine.open(branches, [2, 1], Sampling(seed=4), store)
    assert third.stats.computed == 3 and third.stats.saved == 2 * 32 + 19
    for out, c in zip(third.generate(range(3), [5] * 3), [0, 0, 1]):
        assert out.logprobs == pytest.approx(_full_logprobs(model, branches[c], out.ids), abs=1e-5)
    store.keep = False  # a rollout's last round: its released rows are not kept
    second.release(range(5))
    assert len(store.ids) == 2
    off = HFEngine(model, tokenizer, prefix_reuse=False).open(contexts, [2, 1, 1, 1], Sampling(seed=3), store)
    assert off.stats.saved == 0 and off.prefixes is None  # reuse off: the store is ignored


def test_prefix_store_finds_the_longest_shared_prefix_of_the_earliest_row():
    """The sorted look-up against a brute-force scan: many shared prefixes and duplicates (4 symbols)."""
    rng = random.Random(0)
    store, rows = PrefixStore(), [[rng.randrange(4) for _ in range(rng.randrange(1, 12))] for _ in range(60)]
    assert store.longest([1, 2]) == (-1, 0)
    for r in rows:
        store.add(r, [])
    for _ in range(500):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 14))]
        common = [next((i for i, (a, b) in enumerate(zip(r, ctx)) if a != b), min(len(r), len(ctx))) for r in rows]
        best = max(common)
        assert store.longest(ctx) == ((common.index(best), best) if best else (-1, 0))


def test_multi_token_stop_strings_end_at_the_completing_token(tokenizer):
    text = "<think> who founded it </think> <search> Zorva </search> <answer> Kalden </answer>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(tokenizer.encode("</search>", add_special_tokens=False)) > 1
    checker = StopChecker(tokenizer, STOP_STRINGS)
    assert not checker.by_id
    cut = next(i for i in range(1, len(ids) + 1) if checker.check(ids[:i]) == "stop")
    assert "</search>" in tokenizer.decode(ids[:cut]) and "</search>" not in tokenizer.decode(ids[:cut - 1])
    assert checker.check(ids[:cut] + [tokenizer.eos_token_id]) == "eos"


def test_greedy_is_deterministic_and_caps_length(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    a = engine.open([list(range(5, 25))], [2], Sampling(temperature=0)).generate([0, 1], [7, 3])
    assert a[0].ids[:3] == a[1].ids and len(a[1].ids) == 3 and a[1].finish == "length"


def _full_sort_nucleus(logits, sampling, generator):
    """Top-p by a full sort of the vocabulary: the definition `sample_next` must keep."""
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < sampling.top_p
    probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@pytest.mark.parametrize("scale", [8.0, 0.01])  # a peaked distribution (nucleus among the candidates), a flat one
def test_top_p_from_the_top_candidates_samples_what_a_full_sort_samples(scale):
    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(1)) * scale
    sampling = Sampling(temperature=1.0, top_p=0.95, seed=0)
    held = torch.softmax(logits, -1).topk(NUCLEUS_CANDIDATES, -1).values.sum(-1)
    assert bool((held > 0.95).all()) == (scale > 1)  # each case takes the path it is named for
    for seed in range(20):
        got = sample_next(logits, sampling, torch.Generator().manual_seed(seed))
        want = _full_sort_nucleus(logits, sampling, torch.Generator().manual_seed(seed))
        assert got.tolist() == want.tolist(), seed


def test_sync_serves_a_lora_model_folded_and_refreshes_it_in_place(model, tokenizer):
    """A LoRA policy is sampled from a copy with W + scale * B A in its linear layers (one matmul per layer):
    log-probs within float rounding of the trainer's peft model, refreshed in place after the adapters move
    (bit for bit what a fresh fold gives), and the trainer's own weights untouched. Full fine-tuning is served
    unfolded (test_trainer's finetune-mode test checks QLoRA's 4-bit base too)."""
    from peft import LoraConfig, get_peft_model
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    engine = HFEngine(peft, tokenizer)
    contexts = [list(range(10, 40)), [7, 8, 9]]
    for step in range(2):
        with torch.no_grad():
            for p in (p for n, p in peft.named_parameters() if "lora_B" in n):
                p.add_(torch.randn_like(p) * 0.05)  # an optimiser step that moves the adapters
        before = {n: p.clone() for n, p in peft.state_dict().items()}
        engine.sync(peft)
        folded = engine.folded
        assert engine.model is folded and not any("lora" in n for n in folded.state_dict())
        assert all(torch.equal(p, before[n]) for n, p in peft.state_dict().items())
        fresh = copy.deepcopy(peft).merge_and_unload()
        assert all(torch.equal(p, fresh.state_dict()[n]) for n, p in folded.state_dict().items())
        outs = engine.open(contexts, [2, 1], Sampling(seed=step)).generate([0, 1, 2], [8] * 3)
        for out, c in zip(outs, [0, 0, 1]):
            assert out.logprobs == pytest.approx(_full_logprobs(peft.eval(), contexts[c], out.ids), abs=1e-5)
    engine.sync(peft)
    assert engine.folded is folded  # the same copy, refreshed in place: no second allocation per step
    assert folded_lora(model) is None  # nothing to fold: full fine-tuning serves the model itself
