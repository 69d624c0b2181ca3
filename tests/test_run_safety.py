"""Results and run directories under misuse: concurrent CSV writers, two runs in one directory, a rerun over
a finished run, a resume under another config, a gradient clip that reverses the update."""

import csv
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tg import commands

from tg.cli import main, method_config
from tg.config import ConfigError, load_config
from tg.store.files import append_csv_rows
from tg.store.rundir import RunDirError, run_lock, training_differences

WRITERS, APPENDS = 4, 100
HOLD = "import sys; from tg.store.rundir import run_lock\n" \
       "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n" \
       "    sys.stdin.read()\n"


@pytest.mark.parametrize("value", ["-1", "0", "NaN"])
def test_grad_clip_must_be_positive(cfg, value):
    with pytest.raises(ConfigError, match=r"`optim.grad_clip` = .* allowed (> 0|a finite number)") as err:
        cfg.with_overrides(f"optim.grad_clip={value}")
    assert "\n" not in str(err.value)


def _append_many(path: str, k: int, start) -> None:
    start.wait()
    for i in range(APPENDS):
        row = dict(writer=k, i=i, **({"extra": i} if i % 25 == 0 else {}))  # now and then a wider header
        append_csv_rows(path, [row])


def test_concurrent_appends_lose_no_row(tmp_path):
    path = tmp_path / "runs.csv"
    ctx = mp.get_context("fork")
    start = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_append_many, args=(str(path), k, start)) for k in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    rows = list(csv.DictReader(path.open(newline="")))
    assert sorted((int(r["writer"]), int(r["i"])) for r in rows) == [(k, i) for k in range(WRITERS)
                                                                      for i in range(APPENDS)]
    assert list(rows[0]) == ["writer", "i", "extra"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv", "runs.csv.lock"]   # no temporary left


@pytest.fixture
def holder(tmp_path):
    """Another process holding the run lock of tmp_path/run; yields its PID."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[1])
    assert proc.stdout.readline() == "held\n"
    yield proc
    proc.kill()
    proc.wait()


def test_a_second_run_in_a_directory_is_refused(holder, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setattr(commands, "build_run", _no_training)
    assert main(["train", "--method", "tree", "--run-dir", str(run), "--skip-preflight"]) == 2
    err = capsys.readouterr().err
    assert f"in use by process {holder.pid} ({run / 'run.lock'})" in err and err.count("\n") == 1
    assert sorted(p.name for p in run.iterdir()) == ["run.lock"]                 # nothing written
    os.kill(holder.pid, signal.SIGKILL)                                         # the kernel drops a dead holder's lock
    holder.wait()
    with run_lock(run), run_lock(run):                                          # re-entrant in one process
        assert (run / "run.lock").read_text() == f"{os.getpid()}\n"
    assert (run / "run.lock").read_text() == ""


def test_trainer_fit_takes_the_run_lock(holder, cfg, warm_policy_dir, make_env, train_questions, tmp_path):
    from transformers import AutoTokenizer
    from tg.agent.finetune import trainable_policy
    from tg.trainer import Trainer
    tok = AutoTokenizer.from_pretrained(warm_policy_dir)
    tr = Trainer(cfg, trainable_policy(warm_policy_dir, cfg.model, torch.device("cpu")), tok, make_env(tok), train_questions,
                 tmp_path / "run")
    with pytest.raises(RunDirError, match=f"in use by process {holder.pid}"):
        tr.fit(steps=1, progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


class Trained(Exception):
    """Raised in place of building a run: the command got past its run-directory checks."""


def _no_training(*args, **kwargs):
    raise Trained


def _old_run(run: Path, cfg) -> dict[str, bytes]:
    """A run trained under `cfg` to step 2: its config, metrics and a checkpoint that carries the config."""
    cfg.save(run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    torch.save({"step": 2, "config": cfg.to_dict()}, run / "checkpoint.pt")
    return {p.name: p.read_bytes() for p in run.iterdir()}


def test_train_never_replaces_a_run_unasked(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    before = _old_run(run, method_config(load_config("cpu"), "tree"))
    monkeypatch.setattr(commands, "build_run", _no_training)
    assert main(["train", "--method", "tree", "--run-dir", str(run), "--skip-preflight"]) == 2
    err = capsys.readouterr().err
    assert f"{run} already holds a run (checkpoint.pt, metrics.jsonl, at step 2)" in err and err.count("\n") == 1
    assert "--resume" in err and "--overwrite" in err
    assert {n: (run / n).read_bytes() for n in before} == before
    with pytest.raises(SystemExit):
        main(["train", "--method", "tree", "--run-dir", str(run), "--resume", "--overwrite"])
    with pytest.raises(Trained):
        main(["train", "--method", "tree", "--run-dir", str(run), "--skip-preflight", "--overwrite"])
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoint.pt").exists()


def test_resume_refuses_a_config_that_trains_differently(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _old_run(run, method_config(load_config("cpu"), "tree"))
    monkeypatch.setattr(commands, "build_run", _no_training)
    assert main(["train", "--method", "tree", "--M", "4", "--set", "optim.lr=0.001", "--resume",
                 "--run-dir", str(run), "--skip-preflight"]) == 2
    err = capsys.readouterr().err
    assert "tree.M: 2 -> 4" in err and "optim.lr: 0.0001 -> 0.001" in err and err.count("\n") == 1
    assert '"lr": 0.0001' in (run / "tg_config.json").read_text()              # the saved config is kept
    with pytest.raises(Trained):                                               # evaluation and bookkeeping may change
        main(["train", "--method", "tree", "--resume", "--run-dir", str(run), "--skip-preflight", "--steps", "90",
              "--set", "eval.n_single=5", "--set", "optim.checkpoint_every=1"])


def test_resume_without_tg_config_json_checks_the_config_its_checkpoint_carries(tmp_path, capsys, monkeypatch):
    """A chain run whose tg_config.json is gone is not resumed as a tree: checkpoint.pt holds its config."""
    run = tmp_path / "run"
    _old_run(run, method_config(load_config("cpu"), "chain"))
    (run / "tg_config.json").unlink()
    monkeypatch.setattr(commands, "build_run", _no_training)
    assert main(["train", "--method", "tree", "--resume", "--run-dir", str(run), "--skip-preflight"]) == 2
    err = capsys.readouterr().err
    assert f"the run in {run} was trained under a config that trains differently" in err and err.count("\n") == 1
    assert "tree.M: 4 -> 2" in err and "tree.N: 0 -> 2" in err and not (run / "tg_config.json").exists()
    with pytest.raises(Trained):
        main(["train", "--method", "chain", "--resume", "--run-dir", str(run), "--skip-preflight"])


def test_every_reader_checks_the_config_a_checkpoint_carries(tmp_path, cfg, monkeypatch):
    """The one rule: resume (`tg train --resume`, Trainer.fit), grid resume (`tg mini run`), eval and rerun (which
    resume through Trainer.fit) read the config from the checkpoint, not from the file beside it."""
    from tg.pipeline import policy_source
    from tg.store.rundir import check_trained_as, trained_config
    run = tmp_path / "run"
    _old_run(run, cfg)
    cfg.replace(optim=dict(lr=1.0)).save(run)                                  # the file beside it says otherwise
    assert trained_config(run) == cfg
    copied = tmp_path / "elsewhere" / "copy.pt"
    copied.parent.mkdir()
    copied.write_bytes((run / "checkpoint.pt").read_bytes())
    assert policy_source(str(copied)) == (None, copied) and trained_config(copied) == cfg
    (run / "checkpoint.pt").rename(run / "checkpoint.prev.pt")                 # after an interrupted save
    assert policy_source(str(run)) == (None, run) and trained_config(run) == cfg
    with pytest.raises(RunDirError, match=r"optim.lr: 0.0001 -> 1.0\): move it"):
        check_trained_as(run, cfg.replace(optim=dict(lr=1.0)), "move it")
    check_trained_as(run, cfg.replace(eval=dict(n_multi=3)), "move it")         # evaluation may change


def test_training_differences_name_what_changes_training(cfg):
    assert training_differences(cfg, cfg.replace(eval=dict(n_multi=3), optim=dict(micro_batch_rows=1))) == []
    assert training_differences(cfg, cfg.replace(optim=dict(steps=90))) == []                 # constant LR
    warm = cfg.replace(optim=dict(warmup_ratio=0.3))
    assert training_differences(warm, warm.replace(optim=dict(steps=90))) == ["optim.steps: 60 -> 90"]
    assert training_differences(cfg, cfg.replace(agent=dict(reward="official"), data=dict(top_k=5))) == [
        "data.top_k: 3 -> 5", "agent.reward: 'paper' -> 'official'"]


def test_a_run_dir_that_cannot_be_a_directory_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(commands, "build_run", _no_training)
    (tmp_path / "file").write_text("not a directory")
    for run, why in [(tmp_path / "file", "it is a file"), (tmp_path / "file" / "run", "Not a directory"),
                     (Path("/dev/null/run"), "Not a directory")]:
        assert main(["train", "--method", "tree", "--run-dir", str(run), "--skip-preflight"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tg: run directory {run} cannot be made ({why}") and err.count("\n") == 1
        assert "pass a --run-dir that is a directory" in err


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"),
                                     RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")])
def test_a_full_disk_during_a_checkpoint_save_says_disk(tmp_path, monkeypatch, failure):
    """ENOSPC, or torch's zip writer's 'unexpected pos' (its report of a short write), is one line naming the disk;
    the checkpoint already there is kept and no temporary file is left."""
    from tg.store.rundir import write_checkpoint
    write_checkpoint(tmp_path, {"step": 1})
    before = (tmp_path / "checkpoint.pt").read_bytes()

    def full(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise failure
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RunDirError) as err:
        write_checkpoint(tmp_path, {"step": 2})
    message = str(err.value)
    assert f"the disk holding {tmp_path} is full (" in message and "continue with --resume" in message
    assert "\n" not in message
    assert (tmp_path / "checkpoint.pt").read_bytes() == before and not (tmp_path / "checkpoint.pt.tmp").exists()
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("another failure")))
    with pytest.raises(RuntimeError, match="another failure"):                 # not a disk: raised as it is
        write_checkpoint(tmp_path, {"step": 2})
