"""Supervised warm-up of the tiny policy on scripted demonstrations of the search protocol.

The paper starts RL from a pretrained Qwen2.5 that can already follow the prompt. A random toy
model cannot, so the cpu preset first imitates scripted episodes of the synthetic world, built
token-exactly as rollouts will see them (docs/paper.md#setting):

    prompt_ids(question)
    <think> I need the founder of Zanto. </think> <search> Zanto </search>        policy (mask 1)
    \\n\\n<information>Doc 1(Title: Zanto) ... </information>\\n\\n               retriever (mask 0)
    <think> Zanto's founder is Aldo. I need the birthplace of Aldo. </think> <search> Aldo </search>
    ...
    <think> Aldo's birthplace is Borv. </think> <answer> Borv </answer>           policy, ends the episode

Difficulty knobs (`WarmupConfig`): `multi_hop_share` of the demonstrations are multi-hop, and
`early_stop_share` of those stop one hop early and answer the intermediate entity: plausible but
wrong behaviour that RL can fix. The result is cached on disk by the hash of the model, data and
warm-up config groups (tg.agent.warmup).

Renaming (what makes the policy read instead of memorise): at every step each demonstration is shown
in a freshly renamed world, its entity names permuted within their type consistently across the
question, the thoughts and the documents (`renaming_tables`). A renamed episode is the exact episode
of the renamed world (names are single tokens and BM25 scores are invariant to renaming), but no fact
survives from one step to the next, so the only way to lower the loss on a name is to copy it from
the context: the warmed-up policy knows how to search and read, and knows none of the world's facts,
as a pretrained model does not know the test questions' facts. Without renaming, a 1M-parameter model
memorises the training facts and never learns to copy (held-out answer accuracy ~0 after 450 steps); with it, copying appears after 250-400 steps, or not within 700 (one of four
measured runs stalled). With `observation_loss` the loss also covers the documents, as pretraining on
text would: each observation repeats its titles three times, ten times more copy events per episode
than the policy's own tokens; in a probe, held-out answer accuracy reached 0.41 by step 250 (0.07
without), and both measured default warm-ups crossed (loss drop at steps 350-450). RL still masks
observations. The crossing is stochastic: greedy EM (150 single-hop / 300 multi-hop test questions) after
warm-up seeds 0, 1, 2 (`warmup.seed`; it also seeds the model's initialisation) was 0.50 / 0.127,
0.26 / 0.003 and 0.54 / 0.123 (one torch thread): seed 1 barely learned to
complete a multi-hop chain. The kit's default is seed 0; the seed is part of the cache key.

Departures from the paper: the warm-up itself (the paper has none; its models are pretrained).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from tg.agent.protocol import Step, Trajectory, build_prompt, format_observation, parse_action, prompt_ids, user_turn_ids
from tg.agent.retrieval import Retriever
from tg.agent.world import MULTI, RELATIONS, SINGLE, World
from tg.config import WarmupConfig
from tg.progress import tqdm

LR_WARMUP_SHARE = 0.05
"""Linear LR warm-up over this share of the steps."""
LR_DECAY_SHARE = 0.2
"""Linear LR decay to zero over this last share of the steps."""
WARMUP_VERSION = 2
"""Bump when the recipe changes (part of the cache key, with the formats it depends on)."""
CURRICULUM_SHARE = 0.7
"""Share of the steps (the first ones) that show the question without the instruction."""

def _phrase(relation: str, subject: str) -> str:
    return RELATIONS[relation].phrase.format(s=subject)


def script(question: dict, early_stop: bool = False) -> list[tuple[str, str | None]]:
    """The scripted steps of a question row as (policy text, search query or None for the answer).

    One search per hop; each thought restates the fact just read and names the next need.
    `early_stop` answers the second-to-last chain entity one hop early (multi-hop rows only).
    """
    rels, hops, chain = question["relations"], question["hops"], question["chain"]
    n = len(rels) - 1 if early_stop and len(rels) > 1 else len(rels)
    steps: list[tuple[str, str | None]] = []
    known = ""
    for i in range(n):
        steps.append((f"<think> {known}I need {_phrase(rels[i], hops[i])}. </think> <search> {hops[i]} </search>", hops[i]))
        known = RELATIONS[rels[i]].sentence.format(s=hops[i], o=chain[i]) + " "  # the document's sentence, restated
    steps.append((f"<think> {known.strip()} </think> <answer> {chain[n - 1]} </answer>", None))
    return steps


def short_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """The chat-wrapped prompt without the instruction: only its last line, 'Question: ...?' (curriculum)."""
    return user_turn_ids(tokenizer, "Question:" + build_prompt(question).rsplit("Question:", 1)[1])


def demonstration(question: dict, tokenizer: Any, retriever: Retriever, top_k: int,
                  early_stop: bool = False, instruction: bool = True) -> Trajectory:
    """A scripted episode as a `Trajectory`: prompt ids, then per step the encoded policy text and the
    encoded observation of the retriever's top-k documents (the same ids a rollout would hold).
    `instruction=False` replaces the prompt by `short_prompt_ids` (curriculum only)."""
    steps = []
    for text, query in script(question, early_stop):
        gen = tokenizer.encode(text, add_special_tokens=False)
        if query is None:
            steps.append(Step(gen, [], parse_action(text), True, text=text))
            continue
        docs = retriever.search([query], top_k)[0]
        obs = tokenizer.encode(format_observation(docs), add_special_tokens=False)
        steps.append(Step(gen, obs, parse_action(text), False, text=text, docs=[d["title"] for d in docs]))
    answer = steps[-1].action.argument
    prompt = (prompt_ids if instruction else short_prompt_ids)(tokenizer, question["question"])
    return Trajectory(prompt, steps,
                      reward=float(answer in question["golden_answers"]), answer=answer)


def pick_demonstrations(world: World, cfg: WarmupConfig) -> list[tuple[dict, bool]]:
    """(training question, early_stop) pairs: `multi_hop_share` multi-hop, of which `early_stop_share`
    stop early. Questions repeat only when the split has fewer than needed."""
    rng = random.Random(cfg.seed)
    n_multi = round(cfg.n_demos * cfg.multi_hop_share)
    n_early = round(n_multi * cfg.early_stop_share)

    def draw(rows: list[dict], n: int) -> list[dict]:
        out: list[dict] = []
        while len(out) < n and rows:
            out += rng.sample(rows, min(len(rows), n - len(out)))
        return out

    multi = draw(world.questions("train", MULTI), n_multi)
    single = draw(world.questions("train", SINGLE), cfg.n_demos - len(multi))
    picked = [(q, i < n_early) for i, q in enumerate(multi)] + [(q, False) for q in single]
    rng.shuffle(picked)
    return picked


@dataclass
class Batch:
    """Right-padded training rows sharing their first `prefix` ids (the instruction before the question).

    ids, labels: (B, T) long; labels are -100 off policy tokens and on padding.
    """

    ids: torch.Tensor
    labels: torch.Tensor
    prefix: int


def collate(demos: Sequence[Trajectory], pad_id: int, observations: bool = False) -> Batch:
    """Pad to the longest row; find the prefix all rows share (never past a row's first policy token).
    Labels cover the policy tokens, and with `observations` the observation tokens too (never the prompt)."""
    width = max(len(d.ids) for d in demos)
    ids = torch.full((len(demos), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(demos), width), -100, dtype=torch.long)  # (B, T)
    for r, d in enumerate(demos):
        row = torch.tensor(d.ids)
        ids[r, : len(row)] = row
        target = [0] * len(d.prompt_ids) + [1] * len(d.response_ids) if observations else d.mask
        labels[r, : len(row)] = torch.where(torch.tensor(target, dtype=torch.bool), row, -100)
    first_policy = min(len(d.prompt_ids) for d in demos)
    return Batch(ids, labels, min(common_prefix(ids), first_policy - 1))


def common_prefix(ids: torch.Tensor) -> int:
    """Length of the prefix all rows of `ids` (B, T) share; 0 for a single row (nothing to share)."""
    same = (ids == ids[:1]).all(dim=0).long()  # (T,) 1 where every row has the same id
    return int(same.cumprod(0).sum().item()) if len(ids) > 1 else 0


def masked_lm_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the policy tokens of the batch (token-mean).

    The shared prefix (B copies of the instruction) runs once at batch size 1; its keys and values are
    repeated for the B rows (gradients flow back through the copy). Equal to the plain forward up to
    float rounding (`tests/test_warmup.py`); it saves about a third of the compute.
    """
    p = batch.prefix
    if p > 0:
        cache = model(input_ids=batch.ids[:1, :p], use_cache=True).past_key_values  # prefix K/V at batch 1
        cache.batch_repeat_interleave(batch.ids.shape[0])
        logits = model(input_ids=batch.ids[:, p:], past_key_values=cache).logits  # (B, T-p, V)
    else:
        logits = model(input_ids=batch.ids).logits  # (B, T, V); right padding needs no attention mask
    # logits at position t predict token t+1; label p is a prompt token (-100), so the prefix's logits are not needed
    logits, targets = logits[:, :-1], batch.labels[:, p + 1:]  # (B, T-p-1, V), (B, T-p-1)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                             ignore_index=-100)


def lr_factor(step: int, total: int) -> float:
    """Trapezoid: linear warm-up over LR_WARMUP_SHARE of the steps, constant, linear decay to 0 over the
    last LR_DECAY_SHARE (a cosine spends too many of a short run's steps at a small rate)."""
    warm, decay = max(1, int(total * LR_WARMUP_SHARE)), max(1, int(total * LR_DECAY_SHARE))
    return min((step + 1) / warm, 1.0, (total - step) / decay)


def batches(lengths: Sequence[int], size: int, steps: int, rng: random.Random, pool: int = 16) -> list[list[int]]:
    """`steps` batches of indices: epochs of random permutations, cut into pools of `pool` batches whose
    rows are sorted by length before being split, so a batch holds rows of similar length (less padding)."""
    order: list[int] = []
    while len(order) < steps * size:
        order += rng.sample(range(len(lengths)), len(lengths))
    out: list[list[int]] = []
    for start in range(0, steps * size, size * pool):
        chunk = sorted(order[start:min(start + size * pool, steps * size)], key=lambda i: lengths[i])
        group = [chunk[j:j + size] for j in range(0, len(chunk), size)]
        rng.shuffle(group)
        out += group
    return out


def name_groups(world: World, tokenizer: Any) -> list[torch.Tensor]:
    """Token ids of the world's entity names, one long tensor per entity type (each name is one token)."""
    groups: dict[str, list[int]] = {}
    for e in world.entities:
        ids = tokenizer.encode(e.name, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"entity name {e.name!r} encodes to {len(ids)} tokens; renaming needs one per name")
        groups.setdefault(e.type, []).append(ids[0])
    return [torch.tensor(ids) for ids in groups.values()]


def renaming_tables(groups: Sequence[torch.Tensor], vocab_size: int, rows: int,
                    generator: torch.Generator) -> torch.Tensor:
    """(rows, vocab_size) long: per row, an id map that permutes each group's ids at random and keeps
    every other id (a renamed world per demonstration)."""
    tables = torch.arange(vocab_size).repeat(rows, 1)  # (rows, V)
    for ids in groups:
        perm = torch.argsort(torch.rand(rows, len(ids), generator=generator), dim=1)  # (rows, n) random permutations
        tables[:, ids] = ids[perm]
    return tables


def rename(batch: Batch, tables: torch.Tensor) -> Batch:
    """`batch` with row r's ids and labels mapped through tables[r] (its shared prefix shrinks if a
    name in it is renamed differently per row)."""
    ids = torch.gather(tables, 1, batch.ids)
    labels = torch.where(batch.labels == -100, -100, torch.gather(tables, 1, batch.labels.clamp(min=0)))
    return Batch(ids, labels, min(batch.prefix, common_prefix(ids)))


def train(model: torch.nn.Module, demos: Sequence[Trajectory], cfg: WarmupConfig, pad_id: int,
          groups: Sequence[torch.Tensor] = (), short: Sequence[Trajectory] | None = None,
          progress: bool = True) -> list[float]:
    """AdamW on the masked LM loss for cfg.steps steps of cfg.batch_size demonstrations; the losses.

    Each step's rows are renamed with fresh `renaming_tables` over `groups` (none: no renaming). With
    `short` (the same episodes without the instruction), the first CURRICULUM_SHARE of the steps train
    on those, the rest on the token-exact `demos`.
    """
    n_short = round(cfg.steps * CURRICULUM_SHARE) if short is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.steps))
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(cfg.seed)
    model.train()
    losses = []
    bar = tqdm(batches([len(d.ids) for d in demos], cfg.batch_size, cfg.steps, random.Random(cfg.seed)), desc="warm-up",
               disable=not progress)
    for step, idx in enumerate(bar):
        rows = short if step < n_short and short is not None else demos
        batch = collate([rows[i] for i in idx], pad_id, cfg.observation_loss)
        if groups:
            batch = rename(batch, renaming_tables(groups, vocab, len(idx), generator))
        loss = masked_lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    return losses
