"""Full fine-tuning over several ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`): the paper's setting.

The sharding plan (`shard_plan`): every decoder layer is one FSDP unit, then the root (embeddings, final norm,
LM head, a tied head included). Parameters, gradients and AdamW's moments are split over the W ranks
(1 / W each); a unit's full weights exist only while it computes. The frozen reference of the KL term is
sharded the same way. What differs from one-rank training, numbered:
1. Rollouts. Ranks decode different numbers of tokens, so a unit cannot gather its weights at each forward
   (the collective would wait for ranks that have finished): `gathered` gathers every unit once,
   keeps them whole for the rollout, and shards them again after. A rollout holds the full policy on
   each rank, as vLLM would.
2. Gradients are reduce-scattered (averaged over the ranks) after every micro-batch's backward and
   accumulate in their shards (tg.gpu.distributed, 4: the loss weight carries the factor W).
3. Checkpoints hold full tensors in the one-process layout (weights by name, optimiser state by parameter
   index): a run may resume on another world size, with DDP, or in one process.
On CPU the gloo backend runs it (tests/test_distributed.py); bf16 and NCCL only on GPUs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from tg.gpu.distributed import DataParallel, collective


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (Qwen2, Llama: `model.model.layers`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


def shard_plan(model: Any) -> list[str]:
    """Names of the modules `fully_shard` wraps, in wrapping order: each decoder layer, then the root ('')."""
    names = {id(m): n for n, m in model.named_modules()}
    return [names[id(layer)] for layer in decoder_layers(model)] + [""]


def fully_shard_model(model: Any, mesh: Any) -> Any:
    """Apply `shard_plan` with FSDP2 on `mesh`; returns the same (now sharded) module."""
    from torch.distributed.fsdp import fully_shard
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def fsdp_units(model: Any) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: Any) -> Iterator[None]:
    """Every FSDP2 unit of `model` unsharded once and kept whole inside the block, sharded again after (rule 1);
    nothing to do for a model without units."""
    units = fsdp_units(model)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        collective(unit.unshard)  # an all-gather: a rank gone is a RankLostError here
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


class FullyShardedParallel(DataParallel):
    """W ranks, full fine-tuning sharded by FSDP2; prompts, metrics and files as `DataParallel`."""

    shares_prefix = False  # FSDP2 unshards a module's weights for backward only from its outputs' gradients, and
    # a shared prefix's gradient arrives through its keys and values, which are no outputs (with it on, the FSDP2
    # run of tests/test_distributed.py fails in backward)

    def prepare(self, policy: Any) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(self.device.type, (self.world,))
        fully_shard_model(policy.model, mesh)
        if policy.reference is not None:
            fully_shard_model(policy.reference, mesh)
        return policy.model

    def accumulate(self, model: Any, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def rollout_context(self, policy: Any) -> contextlib.AbstractContextManager:
        return gathered(policy.model)

    def model_state(self, policy: Any) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_model_state(self, policy: Any, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(policy.model, state, options=StateDictOptions(full_state_dict=True))

    def optim_state(self, policy: Any, optimizer: torch.optim.Optimizer) -> dict:
        """The full optimiser state, keyed by parameter index as `optimizer.state_dict()` is in one process."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        full = get_optimizer_state_dict(policy.model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.is_main:
            return {}
        index = {name: i for i, name in enumerate(_trained_names(policy.model))}
        groups = [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]
        return {"state": {index[n]: s for n, s in full["state"].items()}, "param_groups": groups}

    def load_optim_state(self, policy: Any, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        names = _trained_names(policy.model)
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
        by_name = {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}
        set_optimizer_state_dict(policy.model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def _trained_names(model: Any) -> list[str]:
    """Names of the trained parameters in `TrainablePolicy.parameters()` order (the optimiser's indices)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]
