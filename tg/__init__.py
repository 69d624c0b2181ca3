"""tg: the Tree-GRPO kit (Tree Search for LLM Agent Reinforcement Learning, arXiv 2509.21240).

Where the paper lives in the code (two files hold the algorithm: `tree.py` and `advantage.py`):

    protocol.py   the ReAct search protocol, Step / Trajectory records (token ids as sampled)
    env.py        the search tool as an environment: a generated step -> observation ids
    engine.py     batched step generation (transformers), prefix-KV reuse; vllm_engine.py: vLLM
    kvcache.py    the HF engine's caches: growing K/V buffers, kept rows (PrefixStore), grouped attention
    rollout.py    the multi-turn step loop shared by chains, tree seeds and expansions
    tree.py       initialize-then-expand tree sampling (Algorithm 1), node choice rules
    budget.py     the budget ledger and the paper's chain-equivalent budget
    reward.py     EM / F1, format check, Eq. 13
    advantage.py  group-relative advantages, intra-tree / inter-tree / both (Eq. 5-7)
    loss.py       clipped token-level loss, K3 KL, entropy (Eq. 8)
    theory.py     Proposition 3.1 (intra-tree GRPO vs step-level DPO), checked numerically
    trainer.py    one training step and the loop: the one place that wires the above
    packing.py    a tree's rows trained as one sequence along their shared prefixes (optim.pack_trees)
    distributed.py  several ranks under torchrun: prompt shards, DDP, gathered metrics; fsdp.py: FSDP2
    reporters.py  `--report-to tensorboard`: each step's metrics as TensorBoard scalars
    config.py     one frozen config, presets, schedules, the one switch (TG_PRESET)
    estimate.py   memory and wall-time arithmetic of a run (pure); preflight.py: the checks; plan.py: `tg plan`
    doctor.py     installed versions against the tested matrix
    mini.py       the paper's claims in miniature: named experiment grids (`tg mini`); summary.py reads them back
    rerun.py      `tg mini rerun`: retrain one committed row, step by step beside the committed metrics
    claims.py     the claims table: the declared family of comparisons and their verdicts; report.py writes it
    verdict.py    paired t-test, Holm's correction, the verdict rule (pure)
    lesson.py     the notebooks' set-up in one call (`setup`) and self-checking exercises (`exercise`)

Glossary (paper symbol -> config field -> argument):

    M   trees per prompt                      tree.M            sample_trees(M=)
    N   nodes expanded per tree per round     tree.N            sample_trees(N=)
    L   expansion rounds                      tree.L            sample_trees(L=)
    G   chain group size (GRPO baseline)      tree.M with N=L=0 (a chain is a one-leaf tree)
    B   cost of one chain; budget M(1+LN/2)   tree.chain_equivalent_budget
    node = one (think, action, observation) agent step; leaf = a node that ends the episode
    A_intra / A_inter / A_tree                optim.advantage   tree_grpo(mode=)
    eps (clip)                                optim.clip_low / clip_high
    beta (KL)                                 optim.kl_beta
    lambda_f (format penalty, Eq. 13)         agent.format_penalty
    max tool calls                            agent.max_turns
    top-k documents                           data.top_k
"""
