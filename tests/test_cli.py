"""The command line: one line per user error (the traceback with --debug), `python -m tg`, every command's help,
where `tg eval --policy` looks, and `tg retriever serve` saying where it serves only once it does."""

from __future__ import annotations

import csv
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tg import cli
from tg.agent.warmup import PolicyError
from tg.cli import main

REPO = Path(__file__).resolve().parents[1]


def _stderr_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


def test_python_m_tg_and_help_describe_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "tg", "--help"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    sub = next(a for a in cli.parser()._actions if a.dest == "command")
    assert len(sub.choices) == 12 and len(sub._choices_actions) == 12
    assert all(a.help and a.dest in out for a in sub._choices_actions)


@pytest.mark.parametrize("argv, shown", [
    (["config", "--set", "optim.lr=abc"], "config field `optim.lr` = 'abc' is invalid: allowed a finite number"),
    (["eval", "--policy", "runs/tree-typo"], "no run directory or checkpoint at runs/tree-typo"),
    (["eval", "--policy", "/nonexistent"], "no run directory or checkpoint at /nonexistent"),
])
def test_a_user_error_is_one_line_and_debug_shows_the_traceback(argv, shown, capsys) -> None:
    assert main(argv) == 2
    line = _stderr_line(capsys)
    assert line.startswith(f"tg: {shown}") and line.endswith("(--debug shows the traceback)")
    with pytest.raises(ValueError, match="no run directory|invalid"):
        main(["--debug", *argv])
    with pytest.raises(ValueError, match="no run directory|invalid"):
        main([*argv, "--debug"])


@pytest.mark.parametrize("error", ["tg.agent.data:DataError", "tg.agent.server:RetrieverUnavailableError",
                                   "tg.trainer:NonFiniteError", "tg.engines.vllm_setup:VLLMSetupError"])
def test_every_user_facing_error_class_is_caught(error, monkeypatch, capsys) -> None:
    from tg import commands
    module, name = error.split(":")
    cls = getattr(pytest.importorskip(module), name)

    def fail(cfg: object) -> None:
        raise cls(f"{name} happened.\nDo this to fix it.")

    monkeypatch.setattr(commands, "world", fail)
    assert main(["world"]) == 1
    assert _stderr_line(capsys) == f"tg: {name} happened. Do this to fix it. (--debug shows the traceback)"
    monkeypatch.setattr(commands, "world", lambda cfg: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # a bug, not a user error: its traceback shows
        main(["world"])


def test_eval_policy_names_what_a_valid_one_looks_like(tmp_path: Path) -> None:
    from tg.pipeline import policy_source
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert policy_source(str(tmp_path / "run")) == (None, tmp_path / "run")
    assert policy_source(str(tmp_path / "run" / "checkpoint.pt")) == (None, tmp_path / "run" / "checkpoint.pt")
    assert policy_source(str(tmp_path / "model")) == (str(tmp_path / "model"), None)
    assert policy_source("Qwen/Qwen2.5-1.5B") == ("Qwen/Qwen2.5-1.5B", None)
    (tmp_path / "empty").mkdir()
    for bad in ("empty", "empty/typo", "typo", "runs/tree-typo"):
        path = str(tmp_path / bad) if bad.startswith("empty") else bad
        with pytest.raises(PolicyError, match=r"no run directory or checkpoint at .* holding checkpoint\.pt"):
            policy_source(path)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{t} is a city.'}) + "\n"
                            for i, t in enumerate(["Borv", "Kalden"])))
    return path


def test_retriever_serve_says_where_only_once_it_listens(corpus: Path, capsys, monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["retriever", "serve", "--corpus", str(corpus), "--port", str(taken.getsockname()[1])]) == 1
    out = capsys.readouterr()
    assert "serving" not in out.out and "cannot listen on 127.0.0.1" in out.err
    corpus.with_name("bad.jsonl").write_text("{oops\n")
    assert main(["retriever", "serve", "--corpus", str(corpus.with_name("bad.jsonl"))]) == 1
    assert "serving" not in capsys.readouterr().out

    def serve_once(server: object, *args: object) -> None:  # instead of serving forever: check it listens
        socket.create_connection(server.server_address[:2], timeout=5).close()
        raise KeyboardInterrupt

    monkeypatch.setattr("tg.agent.server._Server.serve_forever", serve_once)
    assert main(["retriever", "serve", "--corpus", str(corpus), "--port", "0"]) == 0
    assert "2 documents; serving bm25 at http://127.0.0.1:" in capsys.readouterr().out
    assert main(["retriever", "serve", "--corpus", str(corpus), "--port", "0", "--host", "0.0.0.0"]) == 1
    assert "--allow-remote" in _stderr_line(capsys)
    assert main(["retriever", "serve", "--corpus", str(corpus), "--port", "0", "--host", "0.0.0.0",
                 "--allow-remote"]) == 0
    assert "serving bm25 at http://0.0.0.0:" in capsys.readouterr().out


def test_tg_mini_run_all_runs_every_grid_in_turn(monkeypatch, tmp_path: Path, capsys) -> None:
    from tg.experiments import mini, runner
    ran = []
    monkeypatch.setattr(runner, "run_experiment", lambda name, workers, root, cells, until: ran.append((name, root, len(cells))))
    assert main(["mini", "run", "all", "--root", str(tmp_path), "--workers", "1"]) == 0
    assert ran == [(name, str(tmp_path), len(cells)) for name, cells in mini.experiments().items()]
    assert main(["mini", "run", "all", "--cell", "chain"]) == 2
    assert "name one grid with --cell" in capsys.readouterr().err


SMALL = ["--steps", "1", "--set", "optim.prompts_per_step=2", "--set", "optim.mini_batch_prompts=2",
         "--set", "agent.max_step_tokens=30", "--set", "eval.n_single=4", "--set", "eval.n_multi=4"]


def test_eval_of_a_run_directory_uses_the_runs_saved_config(monkeypatch, tmp_path: Path, capsys) -> None:
    """A LoRA run on the calculator is scored on the calculator, with its adapter, under its saved config; --set
    changes a field, a second preset is refused."""
    from tg import commands
    monkeypatch.setattr(commands, "RESULTS", str(tmp_path / "results"))
    run = tmp_path / "run"
    assert main(["train", "--method", "chain", "--group-size", "2", "--run-dir", str(run), "--skip-preflight",
                 "--set", "agent.env=calculator", "--set", "model.finetune=lora", *SMALL]) == 0
    capsys.readouterr()
    out = tmp_path / "eval.csv"
    assert main(["eval", "--policy", str(run), "--out", str(out), "--set", "eval.n_multi=3"]) == 0
    printed = capsys.readouterr().out
    assert "env                          calculator" in printed and "finetune                     lora" in printed
    [row] = list(csv.DictReader(out.open()))
    assert row["calculator"] != "" and "nq" not in row and row["n"] == "3" and row["step"] == "1"
    assert main(["eval", "--policy", str(run), "--out", str(out), "--preset", "cpu"]) == 2
    assert "under the config it was trained with (preset cpu): drop --preset" in _stderr_line(capsys)
    _check_eval_of_a_moved_or_damaged_checkpoint(run, out, tmp_path, capsys)
    _check_resume_of_a_finished_run_adds_no_row(run, tmp_path, capsys)


def _check_eval_of_a_moved_or_damaged_checkpoint(run: Path, out: Path, tmp_path: Path, capsys) -> None:
    """A checkpoint copied out of its run directory is scored under the config it carries (the calculator); a run
    directory holding only checkpoint.prev.pt (an interrupted save) is one; a truncated checkpoint is one line."""
    copy = tmp_path / "elsewhere" / "copy.pt"
    copy.parent.mkdir()
    shutil.copy(run / "checkpoint.pt", copy)
    assert main(["eval", "--policy", str(copy), "--out", str(out)]) == 0
    assert list(csv.DictReader(out.open()))[-1]["calculator"] != ""
    prev = tmp_path / "prev-only"
    prev.mkdir()
    shutil.copy(run / "checkpoint.pt", prev / "checkpoint.prev.pt")
    assert main(["eval", "--policy", str(prev), "--out", str(out)]) == 0
    assert list(csv.DictReader(out.open()))[-1]["step"] == "1"
    capsys.readouterr()
    for damaged in (b"", (run / "checkpoint.pt").read_bytes()[:1000]):
        copy.write_bytes(damaged)
        assert main(["eval", "--policy", str(copy), "--out", str(out)]) == 2
        assert _stderr_line(capsys).startswith(f"tg: checkpoint {copy} is unreadable (truncated or corrupt")


def _check_resume_of_a_finished_run_adds_no_row(run: Path, tmp_path: Path, capsys) -> None:
    """`--resume` of a finished run whose row is in results/runs.csv: nothing trained, evaluated or appended."""
    runs = tmp_path / "results" / "runs.csv"
    before = runs.read_text()
    argv = ["train", "--method", "chain", "--group-size", "2", "--run-dir", str(run), "--skip-preflight",
            "--set", "agent.env=calculator", "--set", "model.finetune=lora", *SMALL]
    assert main([*argv, "--resume"]) == 0
    assert f"{run} is finished (step 1) and its row is in" in capsys.readouterr().out
    assert runs.read_text() == before and len(list(csv.DictReader(runs.open()))) == 1


@pytest.fixture
def trained(monkeypatch) -> list:
    """`tg train` stopped at its config: the configs it would train, in order."""
    from tg import commands
    got: list = []
    monkeypatch.setattr(commands, "train", lambda cfg, *args, **kwargs: got.append(cfg) or {})
    return got


@pytest.mark.parametrize("argv, field", [
    (["--method", "chain", "--group-size", "0"], "tree.M"),
    (["--method", "chain", "--group-size", "-2"], "tree.M"),
    (["--method", "tree", "--M", "0"], "tree.M"),
    (["--method", "tree", "--steps", "0"], "optim.steps"),
    (["--method", "tree", "--steps", "-5"], "optim.steps"),
])
def test_a_count_given_is_used_or_refused_never_replaced_by_a_default(argv, field, trained, capsys) -> None:
    assert main(["train", *argv]) == 2 and trained == []
    assert _stderr_line(capsys).startswith(f"tg: config field `{field}` = ")


def test_the_methods_shape_applies_before_set_is_checked(trained) -> None:
    assert main(["train", "--method", "chain", "--group-size", "4", "--set", "optim.step_groups=0.5",
                 "--steps", "3", "--seed", "0"]) == 0
    [cfg] = trained
    assert (cfg.tree.M, cfg.tree.N, cfg.tree.L, cfg.optim.step_groups, cfg.optim.steps) == (4, 0, 0, 0.5, 3)


def test_report_readme_under_a_root_without_readme_is_one_line(tmp_path: Path, capsys) -> None:
    assert main(["mini", "report", "--readme", "--root", str(tmp_path)]) == 2
    assert _stderr_line(capsys).startswith(f"tg: {tmp_path / 'README.md'} does not exist: --readme rewrites")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, hint", [
    (["train", "--method", "tree", "--skip-preflight"], "the same command with --resume continues exactly"),
    (["mini", "run", "theory"], "the same command goes on from them"),
])
def test_ctrl_c_is_one_line_that_says_how_to_go_on(argv, hint, monkeypatch, capsys) -> None:
    from tg import commands
    from tg.experiments import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(commands, "train", interrupted)
    monkeypatch.setattr(runner, "run_experiment", interrupted)
    assert main(argv) == 130
    line = _stderr_line(capsys)
    assert line.startswith("tg: interrupted; ") and hint in line
    with pytest.raises(KeyboardInterrupt):
        main([*argv, "--debug"])
