"""Training over several ranks with PyTorch's own stack: torchrun, torch.distributed, DDP (FSDP2: tg.gpu.fsdp).

    torchrun --nproc_per_node K -m tg train ...          # docs/distributed.md

One K-rank step equals one one-process step over the same global batch:
1. Prompts. A step's P prompts are split into S = optim.rollout_shards contiguous shards of P / S. Of W ranks,
   rank r holds shards r S / W to (r + 1) S / W - 1 and rolls them out on its own engine, each shard from its
   own seed (`shard_seed`): a shard's trees do not depend on which process samples it, so one process with
   the same S samples the same tokens. S = 1 is the one-process trainer unchanged.
2. Advantages. A prompt's trees stay in its shard, and its groups (Eq. 5-7) are per prompt: computed locally,
   exactly.
3. Mini-batches. PPO mini-batch b takes, from every shard, its prompts b m / S to (b + 1) m / S - 1
   (m = optim.mini_batch_prompts; `minibatch_of`): the same prompts whichever rank holds the shard.
4. Gradients. A micro-batch's loss is weighted by its share of the global mini-batch (the sizes are summed
   over the ranks); DDP and FSDP2 average the gradients over the W ranks, so the weight is multiplied by W.
   The reduced gradient is the one-process gradient up to float summation order.
5. Metrics. Every rank's leaf scores, ledgers and advantages are gathered in rank order (= shard order), so
   the rollout and advantage metrics are the one-process run's; the loss statistics are the mean over the
   ranks of each one's last micro-batch; timings are the slowest rank's.
6. Files. Rank 0 alone takes the run lock and writes metrics.jsonl and checkpoints; a checkpoint holds every
   rank's RNG state. A rank that fails stops the job (torchrun ends the others); the survivors' failing
   collective becomes `RankLostError`, and what was written before stays.

`tg.gpu.launch.start` joins the job and picks DDP (`DataParallel`, here) or FSDP2 (`tg.gpu.fsdp`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import re
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np
import torch

from tg.advantage import TreeAdvantage
from tg.budget import Ledger
from tg.config import Config, ConfigError

T = TypeVar("T")
TIMEOUT = datetime.timedelta(minutes=30)
"""How long a collective waits for a slow rank (a whole rollout runs between two of them)."""
SHARD_STRIDE = 2**32
"""Seeds of shards k > 0 are offset by k x SHARD_STRIDE (shard 0 keeps the step's seed)."""


class RankLostError(RuntimeError):
    """A collective failed: another rank stopped (its own error is printed above by torchrun)."""


def shard_seed(step_seed: int, shard: int) -> int:
    """The rollout seed of `shard` in a step seeded `step_seed` (shard 0: the step's own seed)."""
    return step_seed + shard * SHARD_STRIDE


def shard_slices(prompts: int, shards: int) -> list[slice]:
    """The S contiguous, equal slices of a step's `prompts` prompts."""
    per = prompts // shards
    return [slice(k * per, (k + 1) * per) for k in range(shards)]


def minibatch_of(position: int, per_shard: int, mini_per_shard: int) -> int:
    """The PPO mini-batch of the prompt at `position` in a rank's prompts (its shards, concatenated)."""
    return (position % per_shard) // mini_per_shard


def merge_scores(parts: Sequence[dict[str, list]]) -> dict[str, list]:
    """Per-rank `tg.batch.leaf_rewards` outputs as one, in rank order; tree and prompt ids made global."""
    out: dict[str, list] = {k: [] for k in parts[0]}
    trees = prompts = 0
    for part in parts:
        for k, v in part.items():
            out[k] += [x + trees for x in v] if k == "tree" else [x + prompts for x in v] if k == "prompt" else v
        trees += max(part["tree"], default=-1) + 1
        prompts += max(part["prompt"], default=-1) + 1
    return out


def gather_step(par: "Parallel", scores: dict[str, list], ledgers: list[Ledger], adv: TreeAdvantage,
                stats: dict[str, float]) -> tuple[dict[str, list], list[Ledger], TreeAdvantage, dict[str, float]]:
    """Every rank's leaf scores, per-question ledgers, advantages [G] and update stats as one step's (item 5):
    concatenated in rank order; stats averaged, timings the slowest rank's, grad norm and LR as they are."""
    parts = par.gather((scores, ledgers, adv, stats))
    cat = [torch.cat([getattr(p[2], k) for p in parts]) for k in ("total", "intra", "inter")]
    merged = {k: float(np.mean([p[3][k] for p in parts])) for k in stats}
    merged.update({k: max(p[3][k] for p in parts) for k in ("rollout_s", "logprob_s", "update_s", "sync_maxdiff")
                   if k in stats})
    merged.update(grad_norm=stats["grad_norm"], lr=stats["lr"])
    return (merge_scores([p[0] for p in parts]), [x for p in parts for x in p[1]], TreeAdvantage(*cat), merged)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class Parallel:
    """One process: every prompt shard is rolled out here and every hook is the identity. `DataParallel`
    (DDP) and `tg.gpu.fsdp.FullyShardedParallel` (FSDP2) are the several-rank versions."""

    rank, world = 0, 1
    shares_prefix = True
    """Whether a micro-batch's common start may run once for all its rows (tg.packing.packed_logits)."""

    def __init__(self, shards: int = 1) -> None:
        self.shards = shards

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def my_shards(self) -> range:
        """The rollout shards this rank holds."""
        per = self.shards // self.world
        return range(self.rank * per, (self.rank + 1) * per)

    def prepare(self, policy: Any) -> Any:
        """The module the trainer calls in its training forwards (the policy's model, here)."""
        return policy.model

    def accumulate(self, model: Any, last: bool) -> contextlib.AbstractContextManager:
        """Context of one micro-batch's backward; `last` ends a mini-batch (DDP reduces there only)."""
        return contextlib.nullcontext()

    def rollout_context(self, policy: Any) -> contextlib.AbstractContextManager:
        """Context in which the engine samples from the policy (FSDP2: its weights gathered)."""
        return contextlib.nullcontext()

    def grad_weight(self, size: float, total: float) -> float:
        """A micro-batch's loss weight: its share of the global mini-batch."""
        return size / total

    def sum(self, x: float) -> float:
        return x

    def barrier(self) -> None:
        """Wait for every rank."""

    def gather(self, obj: T) -> list[T]:
        """`obj` of every rank, in rank order."""
        return [obj]

    def model_state(self, policy: Any) -> dict[str, torch.Tensor]:
        """The trained weights as one full state dict (every rank calls it; rank 0's is saved)."""
        return policy.state_dict()

    def load_model_state(self, policy: Any, state: dict[str, torch.Tensor]) -> None:
        policy.load_state_dict(state)

    def optim_state(self, policy: Any, optimizer: torch.optim.Optimizer) -> dict:
        return optimizer.state_dict()

    def load_optim_state(self, policy: Any, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    def rng_states(self) -> list[dict[str, Any]]:
        """Every rank's RNG state, in rank order."""
        return self.gather(rng_state())

    def close(self) -> None:
        """Leave the process group after a run that ended well on every rank (nothing to leave in one process).
        After a failure, do not call it: the other ranks may be gone; the process just exits."""


class DataParallel(Parallel):
    """W ranks of one torchrun job (torch.distributed initialised): DDP for the gradients, gloo or NCCL
    collectives for the rest. Every collective failure is raised as `RankLostError`."""

    def __init__(self, shards: int) -> None:
        super().__init__(shards)
        self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if shards % self.world:
            raise ConfigError(f"optim.rollout_shards={shards} is not a multiple of the {self.world} ranks: "
                              f"set optim.rollout_shards to a multiple of {self.world}")

    def prepare(self, policy: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel
        dev = next(policy.model.parameters()).device
        ids = [dev.index] if dev.type == "cuda" else None
        return DistributedDataParallel(policy.model, device_ids=ids)  # starts every rank from rank 0's weights

    def accumulate(self, model: Any, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else model.no_sync()

    def grad_weight(self, size: float, total: float) -> float:
        return size / total * self.world

    def sum(self, x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        collective(torch.distributed.all_reduce, t)
        return float(t.item())

    def barrier(self) -> None:
        collective(torch.distributed.barrier)

    def gather(self, obj: T) -> list[T]:
        out: list[Any] = [None] * self.world
        collective(torch.distributed.all_gather_object, out, obj)
        return out

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    def close(self) -> None:
        """Every rank arrives before any leaves: a rank that tears the group down while another still holds
        its connections can leave that one hanging in its own teardown (gloo and NCCL alike)."""
        if torch.distributed.is_initialized():
            self.barrier()
            torch.distributed.destroy_process_group()


def collective(fn: Callable[..., Any], *args: Any) -> Any:
    """Run one torch.distributed call; a failure (a rank gone) becomes `RankLostError`."""
    try:
        return fn(*args)
    except RuntimeError as err:
        raise lost(err) from err


def lost(err: BaseException) -> RankLostError:
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return RankLostError(f"rank {rank}: a collective failed ({first}): another rank has stopped; its own error is "
                         "above. metrics.jsonl and the last checkpoint are kept: continue with --resume")


BACKEND_FAILURE = re.compile(r"third_party/gloo/|\bNCCL\b|ProcessGroup(Gloo|NCCL)")
"""What the message of a plain RuntimeError raised by a gloo or NCCL collective holds (FSDP2's weight gathers
raise those, not DistError): gloo's source path, or NCCL's name."""


@contextlib.contextmanager
def failures_as_rank_lost(world: int) -> Iterator[None]:
    """Within several ranks, a communication error in a block (a DDP all-reduce in a backward, an FSDP2 gather)
    becomes `RankLostError`: a DistError, or a RuntimeError whose message is a backend's (`BACKEND_FAILURE`);
    other errors pass through."""
    try:
        yield
    except RankLostError:
        raise
    except RuntimeError as err:
        ours = isinstance(err, torch.distributed.DistError) or BACKEND_FAILURE.search(str(err))
        if world == 1 or not ours:
            raise
        raise lost(err) from err


def world_size() -> int:
    """The number of ranks torchrun started (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def with_shards(cfg: Config, world: int) -> Config:
    """`cfg` for a `world`-rank run: optim.rollout_shards left at 1 becomes `world`; another value must be a
    multiple of it (then any world size dividing it samples the same tokens)."""
    s = cfg.optim.rollout_shards
    if world == 1:
        return cfg
    if s == 1:
        return cfg.replace(optim=dict(rollout_shards=world))
    if s % world:
        raise ConfigError(f"optim.rollout_shards={s} is not a multiple of the {world} ranks (WORLD_SIZE): set it to "
                          f"a multiple of {world}")
    return cfg
