"""Step generation: the engines the rollout calls (they know token ids, not trees or rewards).

    engine.py       the Engine protocol and HFEngine (transformers), with prefix-KV reuse
    kvcache.py      HFEngine's caches: growing K/V buffers, kept rows (PrefixStore), grouped attention
    vllm_engine.py  VLLMEngine: the same protocol on vLLM, weights synced from the trainer each step
"""
