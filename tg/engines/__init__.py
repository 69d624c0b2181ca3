"""Step generation: the engines the rollout calls (they know token ids, not trees or rewards).

    engine.py       the Engine protocol and HFEngine (transformers), with prefix-KV reuse
    kvcache.py      HFEngine's caches: growing K/V buffers, kept rows (PrefixStore), grouped attention
    vllm_engine.py  VLLMEngine: the same protocol on vLLM, weights synced from the trainer each step
    vllm_batch.py   its batch: rows as token contexts, vLLM's cache counts as the ledger, log-probs, seeds
    vllm_setup.py   starting vLLM: the import, VLLMSetupError, the in-process start-up workarounds
"""
