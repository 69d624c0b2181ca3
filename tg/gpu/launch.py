"""Joining a torchrun job: `start` picks this process's `Parallel`: one process, DDP (tg.gpu.distributed) or FSDP2
(tg.gpu.fsdp). The choice names both classes, and FSDP2's extends DDP's (tg.gpu.fsdp imports tg.gpu.distributed),
so it lives here: in tg.gpu.distributed the two modules would import each other."""

from __future__ import annotations

import os

import torch

from tg.config import Config, ConfigError
from tg.gpu.distributed import TIMEOUT, DataParallel, Parallel, world_size
from tg.gpu.fsdp import FullyShardedParallel


def start(cfg: Config) -> Parallel:
    """The `Parallel` of this process: under torchrun (WORLD_SIZE > 1) join the process group (NCCL on CUDA,
    else gloo), pin this rank's GPU (LOCAL_RANK), and pick DDP or FSDP2 (optim.parallel); else one process."""
    if world_size() == 1:
        return Parallel(cfg.optim.rollout_shards)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
    kind = cfg.optim.parallel
    if kind == "auto":
        kind = "fsdp" if cfg.model.finetune == "full" else "ddp"
    if kind == "fsdp":
        if cfg.agent.engine == "vllm":
            raise ConfigError("optim.parallel=fsdp with agent.engine=vllm is not supported (the engine sync would "
                              "need the sharded weights gathered): use agent.engine=hf or optim.parallel=ddp")
        if cfg.model.finetune != "full":
            raise ConfigError(f"optim.parallel=fsdp shards full fine-tuning only (model.finetune is "
                              f"{cfg.model.finetune!r}): use optim.parallel=ddp or auto")
        return FullyShardedParallel(cfg.optim.rollout_shards)
    return DataParallel(cfg.optim.rollout_shards)
