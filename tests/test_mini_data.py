"""The committed miniature grids hold what their protocol declares (results/mini/README.md): the seeds, the
evaluation points, the starts and the full test sets. Notebook 07 reads these files; their integrity is
checked here, once, instead of in the lesson."""

from pathlib import Path

import pytest

from tg.experiments.summary import REFERENCES, budget_summary, cell_summary, load_rows

ROOT = Path(__file__).resolve().parents[1]
PAPER_TABLES = {"table1_qa_em", "table2_web_f1", "table3_budget_em", "table4_advantage_ablation_em",
                "table6_node_granularity_em", "table7_tree_structure_em"}


def test_the_paper_tables_are_the_six_transcribed():
    assert {p.stem for p in (ROOT / "results" / "paper").glob("*.csv")} == PAPER_TABLES


def test_budget_grid_has_its_seeds_points_and_hard_start():
    budget = load_rows("budget")
    summary = budget_summary(budget)
    assert (summary[["chain_n", "tree_n"]] >= 3).all().all()
    assert set(summary.step) == {30, 60} and (summary.groupby(["setting", "regime"]).size() == 2).all()
    assert budget.query("method == 'start' and regime == 'hard'").em_multi.item() <= 5.0   # the declared hard start


def test_shapes_grid_is_complete_from_both_starts():
    shapes = load_rows("shapes")
    table7 = cell_summary(shapes, REFERENCES["shapes"])
    assert (table7.n >= 5).all() and set(table7.step) == {30, 60}
    assert set(shapes.query("step > 0").regime) == {"hard", "moderate"}
    assert (table7.step == 60).sum() == 8                                 # 4 shapes x 2 starts
    assert (shapes.query("step > 0").n_multi == 300).all()                # all 300 multi-hop test questions


@pytest.mark.parametrize("grid", ["ablation", "sweep"])
def test_ablation_and_sweep_have_eight_hard_cells_of_five_seeds(grid):
    rows = load_rows(grid)
    final = cell_summary(rows, REFERENCES[grid]).query("step == 60")
    assert final.cell.str.contains("/hard/").sum() == 8 and (final.n == 5).all()
    assert (rows.query("step > 0").n_multi == 300).all()


def test_a_grid_without_declared_seeds_fails_the_check():
    """The seed check above is not vacuous: two seeds per cell fall short of the declared three."""
    rows = load_rows("budget")
    short = rows[rows.seed.isin([0, 1]) | (rows.method == "start")]
    assert not (budget_summary(short)[["chain_n", "tree_n"]] >= 3).all().all()
