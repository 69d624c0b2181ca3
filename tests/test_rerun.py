"""A committed grid row, rerun: the first steps of one committed training run, retrained from its pinned start
by `tg mini rerun`, give the committed per-step metrics. On the machine kind that made the row (CPU and torch's
vector ISA, recorded in it) every metric is equal to the last bit, so the sampled tokens and the trained weights
are too; this is what keeps a refactor of the rollout or the update honest. On another kind float sums differ:
the first rollout, sampled from the same pinned weights, still gives the committed token counts and rewards
(a sampled token flips only when a draw falls within float noise of a boundary), and the first update's
metrics agree to float precision. The caller's torch thread count does not matter: the rerun trains with the
grid's (`tg.experiments.runner.GRID_THREADS`), and the test calls it from a process set to another count."""

import csv

import pytest
import torch

from tg.agent.warmup import machine
from tg.agent.world import REPO_ROOT
from tg.experiments import rerun
from tg.experiments.runner import GRID_THREADS

GRID = REPO_ROOT / "results" / "mini" / "budget.csv"
CELL, SEED, STEPS = "multi-hop/moderate/tree", 0, 2
ROLLOUT = ("reward", "em", "format_valid", "tool_calls", "tool_calls_per_traj", "generated", "prefill",
           "prefill_saved", "trajectories", "zero_std_intra", "zero_std_inter", "adv_mean", "adv_std")
UPDATE = ("loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm")


def test_the_first_steps_of_a_committed_run_come_out_as_committed(tmp_path):
    lines: list[str] = []
    before = torch.get_num_threads()
    torch.set_num_threads(GRID_THREADS + 1)
    try:
        result = rerun.rerun(GRID, CELL, SEED, steps=STEPS, run_dir=tmp_path, out=lines.append)
        assert torch.get_num_threads() == GRID_THREADS + 1  # the caller's count, restored
    finally:
        torch.set_num_threads(before)
    made_on = next(iter(result.committed.rows.values()))["machine"]
    assert [m["step"] for m in result.steps] == list(range(1, STEPS + 1))
    if made_on == machine():
        assert result.equal, "\n".join(lines)
        return
    first, committed = result.steps[0], result.committed.steps[1]
    assert {k: first[k] for k in ROLLOUT} == {k: float(committed[k]) for k in ROLLOUT}, "\n".join(lines)
    for k in UPDATE:
        assert first[k] == pytest.approx(float(committed[k]), rel=1e-3, abs=1e-6), k


def test_compare_counts_identical_rows_moved_columns_and_rows_not_rerun(tmp_path):
    from tg.store.files import append_csv_rows
    committed, again = tmp_path / "a", tmp_path / "b"
    row = dict(cell="c", seed=0, step=30, em_multi="20.0", calls_multi="2.0", date="d1", train_s="100", machine="x")
    step = dict(cell="c", seed=0, step=1, reward="0.5", grad_norm="0.1", rollout_s="1.0")
    for root in (committed, again):
        append_csv_rows(root / "results/mini/budget.csv", [row, {**row, "step": 60}])
        append_csv_rows(root / "results/mini/steps/budget.csv", [step])
    append_csv_rows(committed / "results/mini/budget.csv", [{**row, "seed": 1}])  # not rerun yet
    rows, steps = rerun.compare_grid("budget", again, committed)
    assert (rows.matched, rows.identical, rows.missing, rows.moved) == (2, 2, 1, {})
    assert (steps.matched, steps.identical) == (1, 1)
    # a moved EM counts; a wall-clock or provenance column (train_s, date, machine, a timer) does not
    path = again / "results/mini/budget.csv"
    path.write_text(path.read_text().replace("20.0,2.0,d1,100", "20.67,2.0,d2,99", 1))
    path = again / "results/mini/steps/budget.csv"
    path.write_text(path.read_text().replace("1.0\n", "2.5\n"))  # a timer
    rows, steps = rerun.compare_grid("budget", again, committed)
    assert (rows.matched, rows.identical, rows.moved) == (2, 1, {"em_multi": 1})
    assert "em_multi 20.0 -> 20.67" in rows.examples[0]
    assert (steps.matched, steps.identical) == (1, 1)


def test_tg_mini_compare_exits_0_on_the_committed_rows_and_1_when_one_moved(tmp_path, capsys):
    from tg.cli import main
    committed = REPO_ROOT / "results" / "mini" / "budget.csv"
    (tmp_path / "results/mini/steps").mkdir(parents=True)
    rows, steps = committed.read_text(), (committed.parent / "steps" / committed.name).read_text()
    (tmp_path / "results/mini/steps/budget.csv").write_text(steps)
    (tmp_path / "results/mini/budget.csv").write_text(rows)
    assert main(["mini", "compare", "budget", "--root", str(tmp_path)]) == 0
    n = len(rows.splitlines()) - 1
    assert f"budget, rows: {n} of {n} identical" in capsys.readouterr().out
    table = list(csv.DictReader(committed.open()))
    table[0]["em_multi"] = "99.0"
    with (tmp_path / "results/mini/budget.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    assert main(["mini", "compare", "budget", "--root", str(tmp_path)]) == 1
    assert f"{n - 1} of {n} identical" in capsys.readouterr().out
    assert main(["mini", "compare", str(tmp_path / "results/mini/budget.csv")]) == 1  # the rerun's CSV itself
    assert main(["mini", "compare", str(committed)]) == 2  # the committed grid against itself: refused


def test_nothing_compared_is_never_reported_as_identical(tmp_path, capsys):
    """`tg mini rerun --steps 0` (or -1) trains nothing and `tg mini compare` of a rerun sharing no row with the
    committed grid compares nothing: both fail in one line instead of reporting success."""
    from tg.cli import main
    for k in ("0", "-1"):
        assert main(["mini", "rerun", "budget", "multi-hop/hard/tree", "0", "--steps", k]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tg: --steps {k}: a rerun trains and compares at least the first step") and err.count("\n") == 1
    from tg.store.files import append_csv_rows
    append_csv_rows(tmp_path / "results/mini/budget.csv", [dict(cell="not/a/committed/cell", seed=0, step=30, em_multi=1)])
    assert main(["mini", "compare", "budget", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "budget.csv shares no (cell, seed, step) with the committed" in err and err.count("\n") == 1


def test_a_row_copied_from_another_grid_is_looked_up_as_the_cell_that_trained_it(tmp_path, monkeypatch):
    """The source grid's start cell shares the copied training cell's configuration (a start's config is its tree's);
    the rerun takes the source's training rows at the copied steps, not the start row that comes first."""
    from tg.experiments import cells, grid_files
    from tg.store.files import append_csv_rows
    same = ("tree.M=2",)
    start = cells.Cell("multi-hop/hard/start", "start", same, seeds=(0,))
    trained = cells.Cell("multi-hop/hard/(2,2,1)", "train", same, seeds=(0,), points=(30, 60))
    copied = cells.Cell("multi-hop/hard/tree", "train", same, seeds=(0,), points=(30, 60))
    monkeypatch.setattr(rerun, "experiments", lambda: {"src": [start, trained], "dst": [copied]})
    h = cells.cell_config(trained, 0).hash()
    src = tmp_path / "results/mini/src.csv"
    append_csv_rows(src, [dict(cell=c.name, seed=0, step=p, config_hash=h, em_multi=p) for c, p in
                          ((start, 0), (trained, 30), (trained, 60))])
    append_csv_rows(grid_files.steps_path(src), [dict(cell=trained.name, seed=0, step=s, reward=0.5) for s in (1, 2)])
    dst = tmp_path / "results/mini/dst.csv"
    assert len(grid_files.reuse_rows([copied], dst)) == 2
    found = rerun.committed(dst, copied.name, 0)
    assert (found.path, found.cell, sorted(found.rows), sorted(found.steps)) == (src, trained, [30, 60], [1, 2])
