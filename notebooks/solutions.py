"""Worked answers to the notebooks' exercises, keyed by exercise id. Try each exercise first.

A notebook's self-check cell starts with `tg.experiments.lesson.exercise(id, *answers)`. A blank answer (`...`)
stops that cell with "not answered yet", unless TG_SOLUTIONS=1 (set by the test runner: the
repository's `conftest.py` and the Makefile); then the blank is filled from here, so CI runs every
check against a worked answer. A value is the answer (a tuple when the exercise asks for several);
a callable receives the keyword arguments the notebook passes to `exercise`; a build-it-yourself
exercise's entry returns the worked function.
"""

import torch


def lora_parameters(config, r: int, targets: tuple[str, ...]) -> int:
    """05: r (d_in + d_out) per targeted projection and layer; k and v map to num_kv_heads x head_dim."""
    h, inter = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    return config.num_hidden_layers * r * sum(sum(shapes[t]) for t in targets)


def tree_shape(M: int, N: int, L: int) -> tuple[int, int, float]:
    """02: each of the L rounds adds N leaves to the seed chain's one; M trees per prompt; an expansion costs
    half a chain in expectation, the seed chain a whole one (Eq. 4 with its factor M)."""
    return 1 + L * N, M * (1 + L * N), M * (1 + L * N / 2)


def tree_advantages(rewards, tree_ids, prompt_ids, eps=1e-6):
    """03: (R - mean) / (std + eps) within each (prompt, tree) and within each prompt (Eq. 6), summed (Eq. 7).
    torch.std divides by n - 1; a group whose rewards are all equal gets (about) 0 thanks to eps, and a group of
    one leaf (a chain's tree) gets 0: the std of one value is nan."""
    def normalised(keys):
        out = torch.zeros_like(rewards)
        for k in set(keys):
            idx = [i for i, key in enumerate(keys) if key == k]
            if len(idx) > 1:
                out[idx] = (rewards[idx] - rewards[idx].mean()) / (rewards[idx].std() + eps)
        return out
    return normalised(list(zip(prompt_ids.tolist(), tree_ids.tolist()))) + normalised(prompt_ids.tolist())


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip=0.2, beta=0.001):
    """03: -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta K3 per token, averaged over each row's policy tokens,
    then over rows (Eq. 8); K3 = exp(ref - logp) - (ref - logp) - 1."""
    ratio, a = torch.exp(logp - old_logp), advantages[:, None]
    objective = torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    d = ref_logp - logp
    per_token = -objective + beta * (torch.exp(d) - d - 1)
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


SOLUTIONS = {
    # 01: "The city of {g}, in {other}." normalises to [city, of, g, in, other]: 5 words, 1 shared with the
    # one-word gold. P = 1/5, R = 1/1, F1 = 2 (1/5) (1) / (1/5 + 1) = 1/3.
    "01-f1": (1 / 5, 1.0, 1 / 3),
    # 02: (M, N, L) -> (1 + L N, M (1 + L N), M (1 + L N / 2)); (1, 3, 2) gives 7 leaves, 7 trajectories, 4 chains.
    "02-tree-shape": lambda: tree_shape,
    # 03: the two build-it-yourself pieces of Tree-GRPO, Eq. 6-7 and Eq. 8.
    "03-tree-advantages": lambda: tree_advantages,
    "03-grpo-loss": lambda: grpo_loss,
    # 04: 2 (1 + N / 2) = 8 gives N = 6; the tree (2, 6, 1) yields 2 (1 + 6) = 14 trajectories per question.
    "04-budget-8": (6, 14),
    # 07: in Table 3 the tree (2, 2, 1) at budget 4 already beats the chain at 16 on multi-hop (36.8 > 33.9).
    # 05: the same two functions, now trained with (Trainer.advantage_fn, Trainer.loss_fn).
    "05-own-functions": lambda: (tree_advantages, grpo_loss),
    # 05: r A = 0.7 (-0.5) = -0.35 and clip(0.7, 0.8, 1.2) A = 0.8 (-0.5) = -0.4; the min is -0.4, the clipped
    # branch: flat in r, so no gradient. On the CPU preset LoRA has 4 * 16 * (256 + 2 * 192 + 256 + 3 * 640) = 180,224.
    "05-clip": (-0.4, False),
    "05-lora-parameters": lora_parameters,
    # 06: the paper preset samples 512 prompts x (2, 2, 1) trees: 512 * 2 * (1 + 1 * 2) = 3,072 rows; its budget,
    # 2 (1 + 2 / 2) = 4 chains, is matched by chain GRPO with a group of 4.
    "06-paper-step": (3072, 4),
    # 07: single-hop, the chain at 16 scores 51.2; the trees at 8 score 50.8 and 50.4, at 16 (8, 2, 1) and (6, 3, 1)
    # score 51.7: budget 16.
    "07-single-hop-budget": 16,
}
