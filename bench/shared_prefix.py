"""What running a micro-batch's common start once saves the update: the trainer's forward + loss + backward of one
step's micro-batches, and its reference forward, with the rows' shared prefix (the prompt's instructions) run once
against every row running it, on the same rows in one process.

One rollout of the cpu preset's pinned policy per shape (16 multi-hop questions, one torch thread) gives fixed
training rows; the trainer builds its micro-batches twice, with `share_prefix` on and off; then, alternating the
order, `--reps` times each: the training forward, loss and backward over the step's micro-batches
(`Trainer._micro_loss`, gradients discarded, so the weights stay put) and the reference forward. Medians of the
repetitions after the first. The reference log-probs of both ways are compared too (largest difference: float
summation order).

    .venv/bin/python bench/shared_prefix.py [--shapes 4,0,0 2,2,1 8,2,1] [--reps 7] [--write bench/README.md]
"""

from __future__ import annotations

from _blocks import alternating_medians, step_rows, two_ways_main


def timings(shape: tuple[int, int, int], reps: int) -> dict[str, float]:
    tr, rows = step_rows(shape)
    model, micros = tr.policy.model, {}
    for share in (True, False):
        tr.share_prefix = share
        micros[share] = [mb for mini in tr.micro_batches(rows) for mb in mini]
    refs = {share: tr._frozen_logprobs(micros[share], reference=True) for share in micros}

    def train(share: bool) -> None:
        model.train()
        for mb, ref in zip(micros[share], refs[share]):
            tr._micro_loss(rows, mb, None, ref, 1.0)
        model.zero_grad(set_to_none=True)

    out = alternating_medians({"update, every row": lambda: train(False), "update, shared once": lambda: train(True),
                               "reference, every row": lambda: tr._frozen_logprobs(micros[False], True),
                               "reference, shared once": lambda: tr._frozen_logprobs(micros[True], True)}, reps)
    out["shared"] = min(mb.shared for mb in micros[True])
    out["diff"] = max(float((a - b).abs().max()) for a, b in zip(refs[True], refs[False], strict=True))
    return out


if __name__ == "__main__":
    two_ways_main("shared_prefix", __doc__, "every row", "shared once", timings,
                  [("shared positions (fewest)", lambda m: f"{m['shared']:.0f}"),
                   ("reference log-probs, largest difference", lambda m: f"{m['diff']:.1e}")])
