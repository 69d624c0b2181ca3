"""What taking log-probs at policy tokens only saves the update: the trainer's forward + loss + backward of one
step's micro-batches against the same forward with the log-softmax and entropy over whole rows, in one process.

One rollout of the cpu preset's pinned policy per shape (16 multi-hop questions, one torch thread) gives fixed
training rows; then, alternating the order, `--reps` times each: the trainer's training forward, loss and backward
over the step's micro-batches (`Trainer._micro_loss`, gradients discarded, so the weights stay put) and the same with
whole rows (`tg.loss.token_logprobs` and the entropy over [rows, width, vocabulary], then the masked loss: the
update before this change, less its reordering of packed rows into micro-batch order); and the reference forward
both ways. Medians of the repetitions after the first.

    .venv/bin/python bench/policy_tokens.py [--shapes 4,0,0 2,2,1 8,2,1] [--reps 7] [--write bench/README.md]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _blocks import alternating_medians, step_rows, two_ways_main

from tg.loss import entropy, grpo_loss, token_logprobs
from tg.packing import packed_logits


def timings(shape: tuple[int, int, int], reps: int) -> dict[str, float]:
    # whole rows in both ways, no shared start: only the log-softmax's extent differs (bench/shared_prefix.py)
    tr, rows = step_rows(shape, share_prefix=False)
    o, model = tr.cfg.optim, tr.policy.model
    micros = [mb for mini in tr.micro_batches(rows) for mb in mini]
    refs = tr._frozen_logprobs(micros, reference=True)

    def whole(m, mb):  # every row position's logits (rows in tree order when packed)
        return m(input_ids=mb.ids).logits if mb.packed is None else packed_logits(m, mb.packed)[mb.packed.where]

    def train(fast: bool) -> None:
        model.train()
        for mb, ref in zip(micros, refs):
            if fast:
                tr._micro_loss(rows, mb, None, ref, 1.0)
                continue
            logits = whole(model, mb)
            logp = token_logprobs(logits, mb.ids)
            ent = F.pad(entropy(logits.detach()[:, :-1]), (1, 0))
            mask = rows.mask[mb.idx, :mb.ids.shape[1]].float()
            loss, _ = grpo_loss(logp, logp.detach(), rows.adv[mb.idx], mask, ref_logp=ref, entropy=ent,
                                clip_low=o.clip_low, clip_high=o.clip_high, agg=o.loss_agg, kl_beta=o.kl_beta)
            loss.backward()
        model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def reference(fast: bool) -> None:
        with tr.policy.reference_context():
            for mb in micros:
                (tr._forward_logprobs(tr.policy.reference_model, mb) if fast
                 else token_logprobs(whole(tr.policy.reference_model, mb), mb.ids))

    return alternating_medians({"update, whole rows": lambda: train(False), "update, policy tokens": lambda: train(True),
                                "reference, whole rows": lambda: reference(False),
                                "reference, policy tokens": lambda: reference(True)}, reps)


if __name__ == "__main__":
    two_ways_main("policy_tokens", __doc__, "whole rows", "policy tokens", timings)
