"""The agent and its world: the search protocol, the environment, questions, retrieval, and the policy.

    protocol.py   the ReAct search protocol, Step / Trajectory records (token ids as sampled)
    env.py        the search tool as an environment: a generated step -> observation ids
    world.py      the synthetic world (entities, relations, corpus, single- and multi-hop questions)
    data.py       question files (Search-R1 / FlashRAG schema) and `tg data prepare`
    retrieval.py  BM25 over a JSONL corpus, cached; server.py: the same over HTTP (`tg retriever serve`)
    policy.py     the tiny Qwen2-class policy and its tokenizer; finetune.py: full / LoRA / QLoRA training
    warmup.py     the warmed-up starting policy (pinned in tg/policies, sha256 checked)
    sft.py        its training: scripted demonstrations, renamed worlds, the masked LM loss
"""
