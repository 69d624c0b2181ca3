"""Run directories that one run owns at a time and never loses.

- One run per directory: `run_lock` holds RUN_DIR/run.lock (fcntl), which names the holder's PID; a second
  run in the directory is refused, not interleaved.
- No silent overwrite: `check_run_dir` refuses a directory that already holds a run unless the run is
  resumed or explicitly overwritten.
- A checkpoint carries its config, and every reader (resume, grid resume, eval, rerun) checks against it:
  `trained_config` reads the config a run was trained with from its newest readable checkpoint (tg_config.json
  beside it only says what the last command asked for), and `check_trained_as` refuses to go on under a config
  that trains differently, naming the fields.
- Checkpoints: `write_checkpoint` reads the new file back before it replaces the old one, and keeps the
  last verified one as checkpoint.prev.pt; `read_checkpoint` falls back to it when checkpoint.pt is
  truncated or corrupt.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from tg.config import Config, ConfigError

RUN_LOCK = "run.lock"
CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
METRICS = "metrics.jsonl"
CONFIG = "tg_config.json"
RUN_FILES = (CHECKPOINT, PREVIOUS, METRICS)
"""The files of a run that `tg train` without --resume would replace."""

NOT_TRAINING = frozenset({
    "preset", "cache_dir", "eval.n_single", "eval.n_multi", "eval.batch_size", "optim.checkpoint_every",
    "optim.eval_every", "optim.micro_batch_rows", "model.gradient_checkpointing", "agent.vllm_kv_cache_gib",
    "agent.vllm_gpu_memory_utilization", "optim.parallel"})
"""Config fields a resumed run may change: evaluation, bookkeeping, memory (micro-batches accumulate to the
same gradient up to float summation order, as do DDP and FSDP2) and places. optim.steps joins them when the LR schedule is
constant (warmup_ratio 0 before and after); every other field changes what is trained."""

_HELD: set[Path] = set()
"""Run directories whose lock this process holds (run_lock is re-entrant within a process)."""


class RunDirError(ConfigError):
    """A run directory cannot be used as asked: in use, holding another run, saved under another config,
    or without a readable checkpoint. The message names the path and what to do."""


@contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Own `run_dir` for the block: an exclusive lock on RUN_DIR/run.lock, which holds this process's PID.
    Raises RunDirError naming the holder when another process owns it. Re-entrant within one process
    (`tg train` holds it around `Trainer.fit`, which takes it too); the kernel drops it when the holder
    exits, even killed, so a crashed run never blocks its resume."""
    key = Path(run_dir).resolve()
    if key in _HELD:
        yield
        return
    _make_run_dir(key)
    with (key / RUN_LOCK).open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            raise RunDirError(f"run directory {key} is in use by {f'process {holder}' if holder else 'another run'} "
                              f"({key / RUN_LOCK}): wait for it to end or choose another --run-dir") from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
            f.truncate(0)


def _make_run_dir(path: Path) -> None:
    """Create `path` (and its parents); RunDirError naming the path when it cannot be a directory."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        why = "it is a file" if path.is_file() else f"{err.strerror or type(err).__name__}: {err.filename or path}"
        raise RunDirError(f"run directory {path} cannot be made ({why}): pass a --run-dir that is a directory, or a "
                          "new path whose parents are directories") from err


def _flat(cfg: Config) -> dict[str, Any]:
    """Every field as 'group.field' (or 'preset', 'cache_dir') -> value."""
    out: dict[str, Any] = {}
    for name, value in cfg.to_dict().items():
        if isinstance(value, dict):
            out.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            out[name] = value
    return out


def training_differences(saved: Config, new: Config) -> list[str]:
    """'field: saved -> new' for every field on which `new` trains differently from `saved` (NOT_TRAINING aside)."""
    skip = NOT_TRAINING | ({"optim.steps"} if saved.optim.warmup_ratio == 0 == new.optim.warmup_ratio else set())
    a, b = _flat(saved), _flat(new)
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if k not in skip and a[k] != b[k]]


def saved_config(run_dir: Path) -> Config | None:
    """The config saved in RUN_DIR/tg_config.json, None when there is none."""
    path = run_dir / CONFIG
    if not path.exists():
        return None
    try:
        return Config.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as err:  # JSONDecodeError and ConfigError are ValueErrors
        raise RunDirError(f"{path} is not a readable config ({err}); pass --overwrite to start the run anew") from err


def _last_step(run_dir: Path) -> int | None:
    path = run_dir / METRICS
    lines = path.read_text().splitlines() if path.exists() else []
    try:
        return int(json.loads(lines[-1])["step"]) if lines else None
    except (ValueError, KeyError, TypeError):
        return None


def trained_config(source: Path) -> Config | None:
    """The config the run at `source` was trained with: the one its checkpoint holds (`source` a checkpoint file,
    or a run directory's newest readable checkpoint); for a run directory without a checkpoint, its
    tg_config.json; None when there is neither. RunDirError when a checkpoint is there but none reads."""
    if not source.is_file() and not has_checkpoint(source):
        return saved_config(source)
    state = read_trained(source, mmap=True).state
    if "config" not in state:
        raise RunDirError(f"checkpoint {source} holds no config (not written by this version of tg): evaluate it from "
                          f"its run directory, or retrain it")
    return Config.from_dict(state["config"])


def check_trained_as(source: Path, cfg: Config, fix: str) -> None:
    """RunDirError naming the fields when `cfg` trains differently (`training_differences`) from the config the run
    at `source` was trained with (`trained_config`); `fix` says what to do instead."""
    trained = trained_config(source)
    diff = training_differences(trained, cfg) if trained is not None else []
    if diff:
        raise RunDirError(f"the run in {source} was trained under a config that trains differently from this one "
                          f"({'; '.join(diff)}): {fix}")


def check_run_dir(run_dir: Path, cfg: Config, resume: bool, overwrite: bool) -> None:
    """Before `tg train` writes into `run_dir` (holding its `run_lock`): without `resume` or `overwrite`, refuse
    a directory that already holds a run, finished or not; with `resume`, refuse a config that trains differently
    from the one the run was trained with (`check_trained_as`); with `overwrite`, delete the old run's
    checkpoints and metrics."""
    found = [n for n in RUN_FILES if (run_dir / n).exists()]
    if resume:
        check_trained_as(run_dir, cfg, "--resume with the trained values, or pass --overwrite instead")
    elif found and not overwrite:
        step = _last_step(run_dir)
        raise RunDirError(f"run directory {run_dir} already holds a run ({', '.join(found)}"
                          f"{f', at step {step}' if step is not None else ''}): pass --resume to continue it or "
                          "--overwrite to replace it")
    elif overwrite:
        for name in found:
            (run_dir / name).unlink()


@dataclass(frozen=True)
class Loaded:
    """A checkpoint read back: its state, its path, and why a newer one was passed over (None if not)."""

    state: dict
    path: Path
    skipped: str | None = None


_UNREADABLE = (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError)
"""What torch.load raises on a truncated or corrupt file."""


def _load(path: Path, mmap: bool) -> dict:
    """torch.load with one-line errors; `mmap` reads the structure and maps the tensors (a cheap check)."""
    try:
        state = torch.load(path, weights_only=False, mmap=mmap, map_location="cpu" if mmap else None)
    except _UNREADABLE as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        raise RunDirError(f"checkpoint {path} is unreadable (truncated or corrupt: {lines[0]})") from err
    if not isinstance(state, dict) or "step" not in state:
        raise RunDirError(f"checkpoint {path} is unreadable (not a tg checkpoint: no step)")
    return state


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / CHECKPOINT).exists() or (run_dir / PREVIOUS).exists()


def read_checkpoint(run_dir: Path, mmap: bool = False) -> Loaded:
    """The newest readable checkpoint of `run_dir`: checkpoint.pt, else (truncated, corrupt, or missing after
    an interrupted save) checkpoint.prev.pt. Raises RunDirError naming each path when none reads."""
    errors = []
    for path in (run_dir / CHECKPOINT, run_dir / PREVIOUS):
        if not path.exists():
            errors.append(f"no {path}")
            continue
        try:
            return Loaded(_load(path, mmap), path, "; ".join(errors) or None)
        except RunDirError as err:
            errors.append(str(err))
    raise RunDirError(f"no readable checkpoint in {run_dir} ({'; '.join(errors)}): pass --overwrite to start the "
                      "run anew")


def read_trained(source: Path, mmap: bool = False) -> Loaded:
    """The checkpoint file `source`, or the run directory `source`'s newest readable checkpoint (`read_checkpoint`)."""
    return Loaded(_load(source, mmap), source) if source.is_file() else read_checkpoint(source, mmap)


def write_checkpoint(run_dir: Path, state: dict) -> Path:
    """Save `state` as RUN_DIR/checkpoint.pt so a readable checkpoint exists at every moment: write a temporary
    file, read it back, move the current checkpoint (when it reads) to checkpoint.prev.pt, then the new
    one into place. Raises RunDirError, keeping the old checkpoint, when the new file does not read back or the disk
    is full (`_disk_full`: the line says so)."""
    path, tmp = run_dir / CHECKPOINT, run_dir / (CHECKPOINT + ".tmp")
    try:
        try:
            with tmp.open("wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        except (OSError, RuntimeError) as err:
            if not _disk_full(err):
                raise
            free = shutil.disk_usage(run_dir).free / 2**20
            raise RunDirError(f"checkpoint {tmp} could not be written: the disk holding {run_dir} is full ({free:.0f} MiB "
                              f"free; {err.strerror if isinstance(err, OSError) else 'short write'}); free some space "
                              f"and continue with --resume: {path} is kept") from err
        if _load(tmp, mmap=True)["step"] != state["step"]:
            raise RunDirError(f"checkpoint {tmp} reads back another step than {state['step']}; {path} is kept")
        if path.exists() and _readable(path):
            os.replace(path, run_dir / PREVIOUS)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _disk_full(err: BaseException) -> bool:
    """Whether a failed save ran out of disk: ENOSPC (or EDQUOT, a full quota), or torch's zip writer finding fewer
    bytes in the file than it wrote ('unexpected pos', its way of reporting a short write)."""
    return getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "unexpected pos" in str(err)


def _readable(path: Path) -> bool:
    try:
        _load(path, mmap=True)
    except RunDirError:
        return False
    return True

