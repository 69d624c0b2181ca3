"""Worked answers to the notebooks' exercises, keyed by exercise id. Try each exercise first.

A notebook's self-check cell starts with `tg.experiments.lesson.exercise(id, *answers)`. A blank answer (`...`)
stops that cell with "not answered yet", unless TG_SOLUTIONS=1 (set by the test runner: the
repository's `conftest.py` and the Makefile); then the blank is filled from here, so CI runs every
check against a worked answer. A value is the answer (a tuple when the exercise asks for several);
a callable receives the keyword arguments the notebook passes to `exercise`.
"""


def lora_parameters(config, r: int, targets: tuple[str, ...]) -> int:
    """05: r (d_in + d_out) per targeted projection and layer; k and v map to num_kv_heads x head_dim."""
    h, inter = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    return config.num_hidden_layers * r * sum(sum(shapes[t]) for t in targets)


SOLUTIONS = {
    # 01: "The city of {g}, in {other}." normalises to [city, of, g, in, other]: 5 words, 1 shared with the
    # one-word gold. P = 1/5, R = 1/1, F1 = 2 (1/5) (1) / (1/5 + 1) = 1/3.
    "01-f1": (1 / 5, 1.0, 1 / 3),
    # 02: (M, N, L) = (1, 3, 2): a tree has 1 + L N = 7 leaves, a prompt M (1 + L N) = 7 trajectories,
    # and costs M (1 + L N / 2) = 4 chains.
    "02-tree-shape": (7, 7, 4.0),
    # 03: intra, tree 0 [1, 0, 0]: mean 1/3, std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3); tree 1 [1, 1, 0]:
    # mean 2/3, the same std. Inter, all six: mean 1/2, std sqrt(6 (1/2)^2 / 5) = sqrt(0.3). Total = intra + inter.
    "03-advantages": (
        [a / (1 / 3) ** 0.5 for a in (2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3)],
        [(r - 0.5) / 0.3 ** 0.5 for r in (1, 0, 0, 1, 1, 0)],
        [a / (1 / 3) ** 0.5 + (r - 0.5) / 0.3 ** 0.5
         for a, r in zip((2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3), (1, 0, 0, 1, 1, 0))],
    ),
    # 04: 2 (1 + N / 2) = 8 gives N = 6; the tree (2, 6, 1) yields 2 (1 + 6) = 14 trajectories per question.
    "04-budget-8": (6, 14),
    # 07: in Table 3 the tree (2, 2, 1) at budget 4 already beats the chain at 16 on multi-hop (36.8 > 33.9).
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
