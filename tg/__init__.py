"""tg: the Tree-GRPO kit (Tree Search for LLM Agent Reinforcement Learning, arXiv 2509.21240).

Where the paper lives in the code. The algorithm is the top level of the package (the trainer wires it; the
two files that are Tree-GRPO itself are `tree.py` and `advantage.py`); everything it stands on or is run
with sits in six subpackages.

    tree.py         initialize-then-expand tree sampling (Algorithm 1), node choice rules
    rollout.py      the multi-turn step loop shared by chains, tree seeds and expansions
    advantage.py    group-relative advantages, intra-tree / inter-tree / both (Eq. 5-7)
    loss.py         clipped token-level loss, K3 KL, entropy (Eq. 8)
    reward.py       EM / F1, format check, Eq. 13
    budget.py       the budget ledger and the paper's chain-equivalent budget
    packing.py      a tree's rows trained as one sequence along their shared prefixes (optim.pack_trees)
    batch.py        a step's batch from its trees: leaf scores, advantages, training rows, micro-batches
    trainer.py      one training step and the loop: the one place that wires the above; metrics.py: the
                    row a step logs and its glossary; memory.py: its large tensors kept in the process when
                    freed (glibc), a speed-up that changes no number
    theory.py       Proposition 3.1 (intra-tree GRPO vs step-level DPO), checked numerically
    config.py       one frozen config, presets, schedules, the one switch (TG_PRESET); config_groups.py: its
                    groups, every field documented; config_values.py: parsing
    evaluate.py     greedy single-chain evaluation, EM / F1 per data source, Table-1-shaped result rows
    pipeline.py     from a config to a trained, evaluated run: the API the CLI, experiments and notebooks share
    progress.py     the one progress bar (tqdm): the notebook widget where ipywidgets is installed, else text
    cli.py          `tg ...`: argument parsing; commands.py: what each command does; __main__.py: `python -m tg`

    agent/          the agent and its world
      protocol.py   the ReAct search protocol, Step / Trajectory records (token ids as sampled)
      env.py        the Environment and Reward interfaces; the search tool, the default environment
      contract.py   what a plug-in Environment or Reward must return, checked where it enters (PluginError)
      tasks.py      the tasks a config names (agent.env): environment, reward, questions of each
      calculator.py the worked example of one's own task: generated arithmetic, a calculator tool, its reward
      world.py      the synthetic world (entities, corpus, single- and multi-hop questions), cached on disk
      data.py       question files (Search-R1 / FlashRAG schema), `tg data prepare`, `is_single_hop`
      retrieval.py  BM25 over a JSONL corpus, cached; server.py: the same served and queried over HTTP
      policy.py     the tiny Qwen2-class policy and tokenizer; finetune.py: full / LoRA / QLoRA training
      warmup.py     the warmed-up starting policy, pinned in tg/policies (package data, sha256 checked)
      sft.py        its training: scripted demonstrations, renamed worlds, the masked LM loss
      smol.py       SmolLM2-135M-Instruct from its package (the smol preset): converted, pinned start, checked
    engines/        step generation (token ids in, token ids out)
      engine.py     the Engine protocol and HFEngine (transformers), prefix-KV reuse
      kvcache.py    HFEngine's caches: growing K/V buffers, kept rows (PrefixStore), grouped attention
      vllm_engine.py  VLLMEngine: the same protocol on vLLM, synced with the trainer's weights each step
                    (vllm_batch.py: its batch; vllm_setup.py: starting vLLM, VLLMSetupError)
    gpu/            the paper's scale: arithmetic, checks and several ranks
      estimate.py   memory and wall-time arithmetic of a run (pure); plan.py: `tg plan`
      preflight.py  the pre-flight checks; doctor.py: installed versions against the tested matrix
      distributed.py  several ranks under torchrun: prompt shards, DDP, gathered metrics; fsdp.py: FSDP2;
                    launch.py: a torchrun rank's choice of one process, DDP or FSDP2 (`start`)
    experiments/    what is run with the algorithm and read back; the grids top down:
      cells.py      a grid's vocabulary: a cell (overrides, seeds, evaluation points), the starts, tree shapes
      mini.py       the paper's claims in miniature: the named experiment grids (`tg mini list`)
      grid_files.py a grid's files (rows, per-step metrics, per-question outcomes) and the jobs still missing
      runner.py     `tg mini run`: a grid's missing rows in worker processes; measure.py: what a row holds
      rerun.py      `tg mini rerun`: retrain one committed row, step by step beside the committed metrics
      verdict.py    paired and one-sided t-tests, Holm's correction, two-look levels, the verdict rule (scipy)
      claims.py     the claims table: the declared comparisons and their verdicts
      confirm.py    the confirmatory experiment's declared protocol and rule (results/mini/confirm.md)
      summary.py    the grids' rows read back as tables; confirm_report.py: the confirmatory verdict's report
      findings.py   what the committed rows say about tree against chain, as tables and generated sentences
      report.py     `tg mini report`: every grid's report, the generated blocks of the READMEs
      demo.py       `make demo`: chain GRPO vs Tree-GRPO at equal budget; plots.py: its curves, trees drawn
      lesson.py     the notebooks' set-up in one call (`setup`) and self-checking exercises (`exercise`)
                    exercises.py: the build-it-yourself checks, a student's function against tg
    store/          what a run writes
      files.py      result CSVs safe under concurrent writers (`append_csv_rows`) and their `provenance`
      rundir.py     a run directory: one owner at a time, its checkpoint and saved config
      reporters.py  `--report-to tensorboard`: each step's metrics as TensorBoard scalars
    integrations/   Tree-GRPO in other trainers: trl.py (a tree rollout_func, a GRPOTrainer with Eq. 7), verl.py
                    (estimator, tree agent loop, trainer), verl_options.py (its options, index, padding rules)

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

from tg import progress  # noqa: E402,F401  before any library imports tqdm.auto: no stderr warning in a kernel
