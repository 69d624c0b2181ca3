"""The miniature-reproduction runner (`tg mini`): rows with provenance, resume, the declared grids."""

import csv
from pathlib import Path

import pandas as pd
import pytest

from tg.agent.warmup import PINNED_DIR
from tg.budget import matched_chain_group
from tg.config import ConfigError
from tg.experiments import cells, grid_files, measure, mini, runner, summary
from tg.store.files import append_csv_rows


def _rows(path):
    return list(csv.DictReader(path.open()))


def test_theory_rows_check_proposition_3_1_exactly(tmp_path):
    path = runner.run_experiment("theory", workers=1, root=tmp_path)
    rows = _rows(path)
    assert len(rows) == 20 and {r["seed"] for r in rows} == {str(s) for s in range(20)}
    for r in rows:
        assert 0 < float(r["p_win"]) < 1
        assert max(float(r["intra_err"]), float(r["dpo_err"]), float(r["ratio_err"])) < 1e-12
        assert r["git_sha"] and r["date"] and float(r["run_s"]) >= 0


def test_training_cell_writes_one_row_per_point_and_resumes(tmp_path):
    """Two evaluation points of a tiny training cell; a second run finds both rows and does nothing."""
    small = ("optim.prompts_per_step=2", "optim.mini_batch_prompts=2", "optim.micro_batch_rows=8",
             "eval.n_single=3", "eval.n_multi=3", "agent.max_step_tokens=40")
    cell = cells.Cell("multi-hop/moderate/tree", "train", small + cells.TREE221, seeds=(0,), points=(1, 2),
                     labels=dict(method="tree"))
    path = runner.run_experiment("smoke", workers=1, root=tmp_path, cells=[cell])
    rows = _rows(path)
    assert [(r["cell"], r["seed"], r["step"]) for r in rows] == [(cell.name, "0", "1"), (cell.name, "0", "2")]
    r = rows[-1]
    assert (r["M"], r["N"], r["L"], r["budget"], r["regime"]) == ("2", "2", "1", "4.0", "moderate")
    assert r["n_single"] == "3" and r["n_multi"] == "3" and 0 <= float(r["em_multi"]) <= 100
    assert float(r["trajectories_per_q"]) == 6.0 and float(r["train_s"]) > 0
    # the worker's wall time of each row's segment: its steps, checkpoint write and evaluation (more than the steps)
    assert all(float(x["run_s"]) > float(x["train_s"]) - float(y.get("train_s") or 0)
               for x, y in zip(rows, [{}] + rows))
    assert len(r["config_hash"]) == 12 and r["git_sha"] and r["date"] and measure.EARLIER_KEY not in r
    steps = _rows(grid_files.steps_path(path))                          # each step's training metrics, at full precision
    assert [(r["cell"], r["seed"], r["step"]) for r in steps] == [(cell.name, "0", "1"), (cell.name, "0", "2")]
    assert float(steps[0]["grad_norm"]) > 0 and repr(float(steps[0]["reward"])) == steps[0]["reward"]
    questions = _rows(grid_files.questions_path(path))                 # each evaluation's per-question outcomes
    assert [(q["cell"], q["step"]) for q in questions] == [(cell.name, "1"), (cell.name, "2")]
    assert questions[0]["n_single"] == "3" and len(questions[0]["correct"]) == len(questions[0]["searches"]) == 6
    assert r["machine"] == open(tmp_path / "runs" / "mini" / "smoke" / "multi-hop_moderate_tree-s0" / "machine.txt").read().strip()
    before = path.read_text(), grid_files.steps_path(path).read_text()
    assert grid_files.pending_jobs("smoke", [cell], path) == []
    runner.run_experiment("smoke", workers=1, root=tmp_path, cells=[cell])
    assert (path.read_text(), grid_files.steps_path(path).read_text()) == before
    _check_a_run_past_a_missing_row(path, cell, tmp_path)
    _check_rerun(path, cell, tmp_path)
    _check_rerun_of_a_copy(path, cell, tmp_path)


def _check_a_run_past_a_missing_row(path, cell, tmp_path):
    """A run whose checkpoint is past a point whose row is missing (its grid run was killed after the checkpoint,
    before the row): the points it can still reach are evaluated, and the job fails naming the lost point and the fix,
    rather than telling the user to delete the training."""
    from tg.store.rundir import RunDirError
    before = path.read_text()
    path.unlink()
    append_csv_rows(path, [r for r in _rows_of(before) if r["step"] == "2"])
    with pytest.raises(RunDirError, match=r"checkpoint at step 2, past the evaluation point\(s\) 1 whose rows are "
                                          r"missing .* move .* away and rerun"):
        runner.run_experiment("smoke", workers=1, root=tmp_path, cells=[cell])
    assert [r["step"] for r in _rows(path)] == ["2"]
    path.write_text(before)


def _rows_of(text):
    return list(csv.DictReader(text.splitlines()))


def test_a_run_resumed_after_an_interruption_counts_its_earlier_steps_in_run_s(tmp_path):
    """The worker time of a row whose run resumed from an interrupted attempt's checkpoint: that attempt's steps
    count by their timers, so `run_s` covers every step of the row's segment (and more: loading, evaluation)."""
    small = ("optim.prompts_per_step=2", "optim.mini_batch_prompts=2", "optim.micro_batch_rows=8",
             "eval.n_single=3", "eval.n_multi=3", "agent.max_step_tokens=40", "optim.checkpoint_every=1")
    first = cells.Cell("multi-hop/moderate/chain", "train", small + cells.CHAIN4, seeds=(0,), points=(1,))
    runner.run_experiment("interrupted", workers=1, root=tmp_path, cells=[first])   # stops after step 1's checkpoint
    (tmp_path / "results" / "mini" / "interrupted.csv").unlink()
    again = cells.Cell(first.name, "train", first.overrides, seeds=(0,), points=(2,))
    path = runner.run_experiment("interrupted", workers=1, root=tmp_path, cells=[again])
    [row] = _rows(path)
    steps = _rows(grid_files.steps_path(path))
    assert [s["step"] for s in steps if s["cell"] == first.name][-2:] == ["1", "2"]
    assert float(row["run_s"]) > float(row["train_s"]) > 0  # steps 1 and 2, though this attempt trained step 2 only
    assert measure.EARLIER_KEY not in row                       # counted in run_s, not a column of its own


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    """SIGKILL of `tg mini run` runs no handler; its workers notice the parent is gone (`runner.watch_parent`) and end
    within seconds instead of training on as orphans."""
    import os
    import signal
    import subprocess
    import sys
    import time
    parent = ("import multiprocessing as mp, os, sys, time\n"
              "from tg.experiments import runner\n"
              "def child(parent):\n    runner.watch_parent(parent, every_s=0.1)\n"
              "    print(os.getpid(), 'watching', flush=True)\n    time.sleep(600)\n"
              "if __name__ == '__main__':\n"
              "    p = mp.get_context('spawn').Process(target=child, args=(os.getpid(),))\n    p.start()\n    p.join()\n")
    script = tmp_path / "parent.py"
    script.write_text(parent)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    child, watching = proc.stdout.readline().split()
    child = int(child)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie waiting for its reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_failed_job_in_a_worker_process_fails_the_grid_run(tmp_path, capsys):
    """With worker processes (the default), a job that fails is printed and the other jobs go on, and then the run
    fails (`tg mini run` exits 1: JobsFailed is a user error), so `tg mini run X && tg mini report` stops there."""
    from tg.cli import user_error
    good = cells.Cell("toy-tree", "theory", seeds=(0,))
    bad = cells.Cell("broken", "theory", ("optim.lr=abc",), seeds=(0,))
    with pytest.raises(runner.JobsFailed, match=r"experiment two: 1 job\(s\) failed .* rerun the same command") as err:
        runner.run_experiment("two", workers=2, root=tmp_path, cells=[good, bad])
    assert user_error(err.value)
    assert "FAILED broken seed 0: ConfigError: config field `optim.lr`" in capsys.readouterr().out
    assert [r["cell"] for r in _rows(tmp_path / "results" / "mini" / "two.csv")] == ["toy-tree"]


def test_a_grid_resumes_a_run_only_under_the_config_its_checkpoint_carries(tmp_path):
    """A cell whose config changed since its run was checkpointed (a pull, an edited grid) is refused, naming the
    field, and the run's files are left as they were (no new config hash stamped on old training)."""
    import torch

    from tg.store.rundir import RunDirError, saved_config
    cell = cells.Cell("multi-hop/moderate/chain", "train", ("eval.n_single=3", "eval.n_multi=3") + cells.CHAIN4,
                     seeds=(0,), points=(1, 2))
    run = tmp_path / "runs" / "mini" / "changed" / "multi-hop_moderate_chain-s0"
    old = cells.cell_config(cell, 0).with_overrides("optim.lr=0.001")
    old.save(run)
    torch.save({"step": 1, "config": old.to_dict()}, run / "checkpoint.pt")
    with pytest.raises(RunDirError, match=r"optim.lr: 0.001 -> 0.0001\): cell 'multi-hop/moderate/chain' has changed"):
        runner.run_experiment("changed", workers=1, root=tmp_path, cells=[cell])
    assert saved_config(run) == old
    assert not (tmp_path / "results" / "mini" / "changed.csv").exists()


def test_until_stops_every_run_at_its_checkpoint_and_a_later_run_goes_on_exactly(tmp_path, capsys):
    """`--until`: the points up to a step now, the rest later. The later call resumes each run from its checkpoint
    (its progress bar counts the one step left), and its rows and per-step metrics equal an uninterrupted run's
    (timers and provenance aside)."""
    from tg.metrics import TIMERS
    small = ("optim.prompts_per_step=2", "optim.mini_batch_prompts=2", "optim.micro_batch_rows=8",
             "eval.n_single=3", "eval.n_multi=3", "agent.max_step_tokens=40")
    cell = cells.Cell("multi-hop/moderate/tree", "train", small + cells.TREE221, seeds=(0,), points=(1, 2),
                     labels=dict(method="tree"))
    split = runner.run_experiment("split", workers=1, root=tmp_path / "a", cells=[cell], until=1)
    assert [r["step"] for r in _rows(split)] == ["1"] and grid_files.pending_jobs("split", [cell], split)[0].points == (2,)
    capsys.readouterr()
    runner.run_experiment("split", workers=1, root=tmp_path / "a", cells=[cell])
    assert "| 1/1 [" in capsys.readouterr().err
    whole = runner.run_experiment("split", workers=1, root=tmp_path / "b", cells=[cell])
    kept = lambda rows, drop: [{k: v for k, v in r.items() if k not in drop} for r in rows]
    varies = {"run_s", "train_s", "eval_s", "date", "git_sha", *TIMERS}
    assert kept(_rows(split), varies) == kept(_rows(whole), varies) and len(_rows(split)) == 2
    assert kept(_rows(grid_files.steps_path(split)), varies) == kept(_rows(grid_files.steps_path(whole)), varies)
    assert _rows(grid_files.questions_path(split)) == _rows(grid_files.questions_path(whole))
    with pytest.raises(ConfigError, match="--until 0: name the last evaluation step"):
        runner.run_experiment("split", workers=1, root=tmp_path / "a", cells=[cell], until=0)


def _check_rerun(path, cell, tmp_path):
    """`tg mini rerun` retrains the committed row and finds every step and evaluation equal; a committed value
    changed by one ulp, or a changed configuration, is reported."""
    from unittest import mock

    from tg.experiments import rerun
    with mock.patch.object(rerun, "experiments", lambda: {"smoke": [cell]}):
        lines = []
        assert rerun.rerun(path, cell.name, 0, run_dir=tmp_path / "again", out=lines.append).equal
        assert lines[-1] == "identical to the committed values" and sum("| yes |" in x for x in lines) == 2
        assert sum(": equal" in x for x in lines) == 2
        steps = grid_files.steps_path(path)
        rows = _rows(steps)
        rows[1]["kl"] = repr(float(rows[1]["kl"]) * (1 + 2 ** -52))
        with steps.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        lines = []
        assert not rerun.rerun(path, cell.name, 0, steps=2, run_dir=tmp_path / "third", out=lines.append).equal
        assert sum("| no: kl |" in x for x in lines) == 1 and lines[-1] == "not identical to the committed values"
    other = cells.Cell(cell.name, "train", cell.overrides + ("optim.lr=0.5",), seeds=(0,), points=cell.points)
    with mock.patch.object(rerun, "experiments", lambda: {"smoke": [other]}), \
            pytest.raises(ConfigError, match="was made with config .* cannot be rerun exactly"):
        rerun.rerun(path, cell.name, 0)


def _check_rerun_of_a_copy(path, cell, tmp_path):
    """A row another grid copied (`reuse_rows`) reruns as the cell that trained it, though a start row of the same
    configuration (a start's config is its tree's) comes first in the source grid."""
    from unittest import mock

    from tg.experiments import rerun
    start = cells.Cell(cell.name.rpartition("/")[0] + "/start", "start", cell.overrides, seeds=(0,))
    rows = _rows(path)
    path.unlink()
    append_csv_rows(path, [dict(rows[0], cell=start.name, step="0")] + rows)
    copy = cells.Cell(cell.name.rpartition("/")[0] + "/(2,2,1)", "train", cell.overrides, seeds=(0,), points=cell.points)
    copied = grid_files.reuse_rows([copy], path.with_name("copy.csv"))
    assert [(r["cell"], r["step"], r["reused_from"]) for r in copied] == [(copy.name, "1", "smoke"), (copy.name, "2", "smoke")]
    with mock.patch.object(rerun, "experiments", lambda: {"smoke": [start, cell], "copy": [copy]}):
        lines = []
        assert rerun.rerun(path.with_name("copy.csv"), copy.name, 0, steps=1, run_dir=tmp_path / "copy",
                           out=lines.append).equal
        assert lines[0].startswith(f"rerun of {path} {cell.name} seed 0") and sum("| yes |" in x for x in lines) == 1


def test_declared_grids_and_regimes():
    grids = mini.experiments()
    budget = {c.name: c for c in grids["budget"]}
    for setting, regime in [("multi-hop", "moderate"), ("multi-hop", "hard"), ("single-hop", "moderate")]:
        for method in ("chain", "tree"):
            c = budget[f"{setting}/{regime}/{method}"]
            assert len(c.seeds) >= 5 and max(c.points) >= 60  # the issue: >= 5 seeds for the headline claims
            assert set(cells.REGIMES[regime]) <= set(c.overrides)
    assert all(len(c.seeds) >= 3 for c in grids["ledger"])
    leaves = {cells.cell_config(c, 0).optim.advantage: set() for c in grids["ablation"] if c.kind == "train"}
    for c in grids["ablation"]:
        cfg = cells.cell_config(c, 0)
        if c.kind == "train" and cfg.tree.N:
            leaves[cfg.optim.advantage].add(1 + cfg.tree.N * cfg.tree.L)
    assert leaves["intra"] == leaves["inter"] == leaves["intra+inter"] == {3, 7}   # Table 4's two tree sizes
    trees = [cells.cell_config(c, 0).tree for c in grids["shapes"] if c.kind == "train"]
    assert {matched_chain_group(t.M, t.N, t.L) for t in trees} == {4}                # Table 7's budget ≈4 block
    for regime in cells.REGIMES:                                           # claims 3-5 in both starts, alike
        sweep = [cells.cell_config(c, 0) for c in grids["sweep"] if c.kind == "train" and f"/{regime}/" in c.name]
        assert all(cfg.warmup.early_stop_share == (0.95 if regime == "hard" else 0.5) for cfg in sweep)
        assert sorted((c.tree.chain_equivalent_budget, c.tree.is_chain) for c in sweep) == [
            (b, m) for b in (2, 4, 8, 16) for m in (False, True)]                       # Table 3's pairs
        for grid in ("ablation", "shapes", "sweep"):
            assert sum(f"/{regime}/" in c.name for c in grids[grid]) == len(grids[grid]) // 2
    assert all(len(c.seeds) >= 5 for c in grids["sweep"] + grids["ablation"] if c.kind == "train")
    tree = cells.cell_config(budget["multi-hop/hard/tree"], 3)
    assert (tree.tree.M, tree.tree.N, tree.tree.L, tree.optim.seed, tree.warmup.early_stop_share) == (2, 2, 1, 3, 0.95)


def test_unknown_experiment_names_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="budget"):
        runner.run_experiment("nope", root=tmp_path)


def test_select_cells_runs_a_grid_in_pieces_and_names_bad_cells():
    picked = mini.select_cells("sweep", ["hard/chain-16", "tree (1,2,1)", "multi-hop/hard/chain-2"])
    assert [c.name for c in picked] == ["multi-hop/hard/chain-2", "multi-hop/hard/chain-16", "multi-hop/hard/tree (1,2,1)",
                                        "multi-hop/moderate/tree (1,2,1)"]     # a last part names the cell in both starts
    assert mini.select_cells("sweep", None) == mini.experiments()["sweep"]
    with pytest.raises(ConfigError, match=r"--cell 'chain-3'.*'multi-hop/hard/chain-2'"):
        mini.select_cells("sweep", ["chain-3"])


def test_budget_summary_pairs_methods_by_seed(tmp_path):
    import pandas as pd
    rows = [dict(cell="multi-hop/hard/start", setting="multi-hop", regime="hard", method="start", seed=0, step=0,
                 em_multi=4.0, em_single=40.0, calls_multi=1.5, calls_single=1.0)]
    for seed in range(3):
        for method, em in (("chain", 10.0 + seed), ("tree", 12.0 + 2 * seed)):
            rows.append(dict(cell=f"multi-hop/hard/{method}", setting="multi-hop", regime="hard", method=method,
                             seed=seed, step=60, em_multi=em, em_single=50.0, calls_multi=2.0, calls_single=1.0))
    (tmp_path / "results" / "mini").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(tmp_path / "results" / "mini" / "budget.csv", index=False)
    table = summary.report("budget", tmp_path)
    assert "| multi-hop | hard | 60 | 4.0 | 11.0 ± 1.0 (3) | 14.0 ± 2.0 (3) | +3.0 ± 0.6 | 3/3 | 2.00, 2.00 |" in table
    r = summary.budget_summary(pd.DataFrame(rows)).iloc[0]
    assert (r.start_em, r.chain_em, r.tree_em, r.chain_n, r.tree_n) == (4.0, 11.0, 14.0, 3, 3)
    assert r["diff"] == 3.0 and r.diff_se == pytest.approx(1 / 3 ** 0.5) and (r.tree_wins, r.pairs) == (3, 3)


def test_a_nan_measurement_that_drops_a_seed_is_said(tmp_path, caplog):
    import logging
    rows = [dict(cell=f"multi-hop/hard/{m}", setting="multi-hop", regime="hard", method=m, seed=s, step=60,
                 em_multi=float("nan") if (m, s) == ("tree", 1) else 10.0 + s, em_single=50.0, calls_multi=2.0,
                 calls_single=1.0) for s in range(2) for m in ("chain", "tree")]
    append_csv_rows(tmp_path / "results" / "mini" / "budget.csv", rows)
    with caplog.at_level(logging.WARNING):
        table = summary.report("budget", tmp_path)
    assert "1 row(s) hold nan, left out of the means and paired differences (their seeds drop out): " \
           "multi-hop/hard/tree seed 1 step 60 (em_multi)" in caplog.text
    assert "| 10.0 ± nan (1) | +0.0 ± nan | 0/1 |" in table                      # one pair left: the warning says why


def test_ledger_summary_compares_each_tree_with_its_budgets_chain():
    import pandas as pd
    base = dict(regime="moderate", L=1, prefill_computed_per_q=1.0, tool_calls_per_q=1.0, seed=0)
    df = pd.DataFrame([dict(base, M=4, N=0, L=0, budget=4.0, trajectories_per_q=4.0, generated_per_q=160.0,
                            generated_per_traj=40.0, calls_per_traj=2.0, seconds_per_q=0.2),
                       dict(base, M=2, N=2, budget=4.0, trajectories_per_q=6.0, generated_per_q=180.0,
                            generated_per_traj=30.0, calls_per_traj=1.0, seconds_per_q=0.3)])
    tree = summary.ledger_summary(df).set_index("N").loc[2]
    assert (tree.traj_ratio, tree.tokens_per_traj_ratio, tree.calls_per_traj_ratio) == (1.5, 0.75, 0.5)
    assert tree.seconds_per_q_ratio == pytest.approx(1.5)


def test_rows_of_identical_configurations_are_copied_not_retrained(tmp_path):
    """The shapes grid's (2,2,1) cell is the budget grid's hard multi-hop tree: its rows are reused, named
    for the new cell and for their source; a cell that differs in anything (here the shape) is not."""
    grids = mini.experiments()
    tree = {c.name: c for c in grids["budget"]}["multi-hop/hard/tree"]
    same = {c.name: c for c in grids["shapes"]}["multi-hop/hard/(2,2,1)"]
    other = {c.name: c for c in grids["shapes"]}["multi-hop/hard/(2,1,2)"]
    mini_dir = tmp_path / "results" / "mini"
    mini_dir.mkdir(parents=True)
    rows = [dict(cell=tree.name, seed=s, step=p, method="tree", em_multi=10 + s,
                 config_hash=cells.cell_config(tree, s).hash()) for s in (0, 1) for p in (30, 60)]
    append_csv_rows(mini_dir / "budget.csv", rows)
    append_csv_rows(mini_dir / "ablation.csv", [dict(rows[0], em_multi="", generated_per_q=30)])  # not evaluated
    path = mini_dir / "shapes.csv"
    copied = grid_files.reuse_rows([same, other], path)
    assert [(r["cell"], r["seed"], r["step"], r["em_multi"]) for r in _rows(path)] == [
        (same.name, str(s), str(p), str(10 + s)) for s in (0, 1) for p in (30, 60)]
    assert {r["reused_from"] for r in copied} == {"budget"} and {r["method"] for r in copied} == {"(2,2,1)"}
    assert [(j.cell.name, j.seed) for j in grid_files.pending_jobs("shapes", [same], path)] == [(same.name, s) for s in (2, 3, 4)]
    assert grid_files.reuse_rows([same, other], path) == []   # nothing twice


def test_cell_summary_pairs_each_cell_with_the_reference_by_seed():
    import pandas as pd
    rows = [dict(cell="start", seed=0, step=0, em_multi=3.0, calls_multi=1.5, generated_per_q=float("nan"))]
    for seed in range(3):
        for step in (30, 60):    # rows land as runs finish: (cell, step) pairs interleave in the file
            for cell, em in (("chain", 10.0 + seed), ("(2,2,1)", 12.0 + 2 * seed), ("(1,5,1)", 9.0)):
                rows.append(dict(cell=cell, seed=seed, step=step, em_multi=em, calls_multi=2.0, generated_per_q=100.0))
    s = summary.cell_summary(pd.DataFrame(rows), reference="chain")
    assert list(zip(s.cell, s.step)) == [(c, p) for c in ("chain", "(2,2,1)", "(1,5,1)") for p in (30, 60)]  # no start row
    s = s[s.step == 60].set_index("cell")
    assert (s.loc["(2,2,1)", "diff"], s.loc["(2,2,1)", "ahead"], s.loc["(2,2,1)", "pairs"]) == (3.0, 3, 3)
    assert s.loc["(2,2,1)", "diff_se"] == pytest.approx(1 / 3 ** 0.5)
    assert (s.loc["(1,5,1)", "diff"], s.loc["(1,5,1)", "ahead"]) == (-2.0, 0) and s.loc["chain", "diff"] == 0.0


def test_cell_summary_pairs_each_cell_within_its_own_start():
    """A grid run from both starts: each cell is paired with the reference of its own start, hard first."""
    import pandas as pd
    em = {"moderate/(4,0,0)": 20.0, "moderate/(2,1,2)": 25.0, "hard/(4,0,0)": 10.0, "hard/(2,1,2)": 11.0}
    rows = [dict(cell=f"multi-hop/{c}", regime=c.split("/")[0], seed=s, step=60, budget=4.0, N=0 if "4,0" in c else 1,
                 em_multi=v + s, calls_multi=2.0, generated_per_q=100.0) for c, v in em.items() for s in range(2)]
    s = summary.cell_summary(pd.DataFrame(rows), summary.REFERENCES["shapes"])
    assert list(s.cell) == [f"multi-hop/{r}/{c}" for r in ("hard", "moderate") for c in ("(4,0,0)", "(2,1,2)")]
    assert list(s["diff"]) == [0.0, 1.0, 0.0, 5.0]


def test_sweep_report_pairs_each_tree_with_the_chain_of_its_budget_and_the_quarter_budget(tmp_path):
    import pandas as pd
    p = "multi-hop/hard/"
    em = {"chain-16": 14.0, "tree (1,2,1)": 6.0, "chain-2": 5.0, "chain-4": 10.0, "tree (4,2,1)": 13.0,
          "chain-8": 12.0, "tree (2,2,1)": 15.0, "tree (8,2,1)": 13.0}   # rows in the order a run in pieces left
    budget = {c: float(c.split("-")[1]) if c.startswith("chain") else 2.0 * int(c[6]) for c in em}
    rows = [dict(cell=p + c, seed=s, step=60, budget=budget[c], N=0 if c.startswith("chain") else 2, em_multi=v + s,
                 calls_multi=2.0, generated_per_q=100.0) for c, v in em.items() for s in range(2)]
    s = summary.cell_summary(pd.DataFrame(rows), summary.REFERENCES["sweep"]).set_index("cell")
    assert [c[len(p):] for c in s.index] == [f"{m}-{g}" if m == "chain" else f"tree ({g // 2},2,1)"
                                             for g in (2, 4, 8, 16) for m in ("chain", "tree")]  # by budget, chain first
    assert [s.loc[p + f"tree ({g // 2},2,1)", "diff"] for g in (2, 4, 8, 16)] == [1.0, 5.0, 1.0, -1.0]
    assert s.loc[p + "chain-4", "diff"] != s.loc[p + "chain-4", "diff"]          # chains are references, not paired
    (tmp_path / "results" / "mini").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(tmp_path / "results" / "mini" / "sweep.csv", index=False)
    text = summary.report("sweep", tmp_path)
    quarter = text.split("Quarter budget")[1]
    assert "- chain-16 (paired ± se)" in quarter and "the chain of its budget" not in quarter
    assert "| multi-hop/hard/tree (2,2,1) | 60 | 15.5 ± 0.7 | 2 | +1.0 ± 0.0 (2/2 ahead) |" in quarter
    assert "+5.0 ± 0.0 (2/2 ahead)" in text.split("Quarter budget")[0]


@pytest.mark.parametrize("regime", ["moderate", "hard"])
def test_starting_policies_are_the_ones_behind_the_committed_results(regime):
    """The pinned starting policy of each regime (tg/policies) scores what the committed `start` row of its
    regime says, to the question."""
    from tg.agent.policy import load_policy
    from tg.config import load_config
    from tg.pipeline import evaluate_model
    from tg.pipeline import load_resources
    cell = f"multi-hop/{regime}/start"
    row = next(r for r in _rows(Path(__file__).parents[1] / "results" / "mini" / "budget.csv") if r["cell"] == cell)
    cfg = load_config("cpu", *cells.REGIMES[regime], "data.setting=multi-hop")
    res = load_resources(cfg)
    assert Path(res.policy_path).parent == PINNED_DIR
    model, tok = load_policy(res.policy_path)
    cols = measure.eval_columns(evaluate_model(model, tok, res, cfg, progress=False))
    assert (cols["em_single"], cols["em_multi"]) == (float(row["em_single"]), float(row["em_multi"])), (
        f"{res.policy_path} scores EM {cols['em_single']} / {cols['em_multi']} (single / multi-hop), the committed "
        f"{cell} row {row['em_single']} / {row['em_multi']}")
    assert (cols["n_single"], cols["n_multi"]) == (int(row["n_single"]), int(row["n_multi"]))


@pytest.mark.parametrize("grid", ["budget", "sweep", "ablation", "shapes", "branching"])
def test_each_grid_steps_file_holds_every_run_of_the_grid(grid):
    """Runs copied from another grid (`reused_from`) have their steps copied too, renamed, equal to the source's."""
    root = grid_files.mini_dir()
    rows = grid_files.read_grid(root / f"{grid}.csv")
    steps = grid_files.read_grid(root / "steps" / f"{grid}.csv")
    runs = rows[rows["method"] != "start"][["cell", "seed"]].drop_duplicates()
    counts = steps.groupby(["cell", "seed"]).size()
    assert all(counts.get((r.cell, r.seed), 0) == 60 for r in runs.itertuples()), grid
    assert grid_files.copy_steps(root / f"{grid}.csv") == 0                           # nothing left to copy
    if grid == "budget":   # the hard start's seed-0 runs were trained by `shapes`
        shapes = grid_files.read_grid(root / "steps" / "shapes.csv")
        a = steps[(steps["cell"] == "multi-hop/hard/tree") & (steps["seed"] == 0)].drop(columns="cell")
        b = shapes[(shapes["cell"] == "multi-hop/hard/(2,2,1)") & (shapes["seed"] == 0)].drop(columns="cell")
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
