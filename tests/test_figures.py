"""Figures are code over data: every script draws from the committed CSVs alone, draws tg's rows when
they exist, shows the paper's numbers exactly as transcribed, and never imports torch."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `figures` is a folder of scripts, not part of the installed `tg` package
from figures import SCRIPTS  # noqa: E402
from figures import _common as c  # noqa: E402
PNG = b"\x89PNG\r\n\x1a\n"


def script(name: str):
    return importlib.import_module(f"figures.{name}")


def png_ok(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 5_000 and path.read_bytes()[:8] == PNG


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """A root holding a copy of the committed results/ (so tests never overwrite figures/*.png)."""
    root = tmp_path_factory.mktemp("committed")
    shutil.copytree(ROOT / "results", root / "results")
    return root


@pytest.fixture(scope="module")
def paper_only(tmp_path_factory) -> Path:
    """A root with the paper's tables and no tg results at all."""
    root = tmp_path_factory.mktemp("paper_only")
    shutil.copytree(ROOT / "results" / "paper", root / "results" / "paper")
    return root


def _rows(cells: list[dict], seeds: int, value) -> list[dict]:
    """One row per (cell, seed) at step 60, plus a stale step-0 row that the figures must ignore."""
    out = []
    for cell in cells:
        for seed in range(seeds):
            for step in (0, 60):
                v = value(cell, seed) if step else -50.0
                out.append(dict(cell, seed=seed, step=step, em_single=v + 20, em_multi=v, preset="cpu",
                                config_hash="h", git_sha="s", date="2025-12-01"))
    return out


@pytest.fixture(scope="module")
def with_ours(tmp_path_factory) -> Path:
    """The paper's tables plus synthetic tg rows: results/mini/*.csv, results/demo.csv, results/runs.csv."""
    root = tmp_path_factory.mktemp("ours")
    shutil.copytree(ROOT / "results" / "paper", root / "results" / "paper")
    mini = root / "results" / "mini"
    mini.mkdir()
    shape = [dict(budget=b, method="chain GRPO (G=%d)" % b, M=b, N=0, L=0) for b in (2, 4)]
    shape += [dict(budget=4, method="Tree-GRPO (2,2,1) intra+inter", M=2, N=2, L=1),
              dict(budget=2, method="Tree-GRPO (1,2,1) intra+inter", M=1, N=2, L=1)]
    budget = [dict(c, setting=setting, regime=regime) for c in shape
              for setting, regime in [("multi-hop", "moderate"), ("multi-hop", "hard"), ("single-hop", "moderate")]]
    budget = pd.DataFrame(_rows(budget, 3, lambda cell, s: 10.0 + cell["N"] + s + (cell["regime"] == "hard")))
    budget["method"] = np.where(budget["N"] > 0, "tree", "chain")
    budget["calls_multi"], budget["calls_single"] = 2.0 + budget["N"] / 10, 1.0
    start = budget[(budget["step"] == 60) & (budget["seed"] == 0) & (budget["M"] == 2) & (budget["N"] == 2)]
    start = start.assign(method="start", step=0, em_multi=5.0, em_single=40.0)
    pd.concat([budget, start]).to_csv(mini / "budget.csv", index=False)
    ledger = [dict(regime=r, M=m, N=n, L=l, budget=m * (1 + l * n / 2), method="tree" if n else "chain", seed=s,
                   step=0, trajectories_per_q=m * (1 + l * n), generated_per_traj=40 - 5 * n, calls_per_traj=2 - n / 4,
                   preset="cpu", date="2025-12-01") for r in ("moderate", "hard") for m, n, l in [(4, 0, 0), (2, 2, 1)]
              for s in range(3)]
    pd.DataFrame(ledger).to_csv(mini / "ledger.csv", index=False)
    pd.DataFrame([dict(cell="toy-tree", seed=s, step=0, p_win=0.1 * (s + 1), intra_err=1e-17, dpo_err=4e-16,
                       ratio_err=0.0, grad_scale=2.0, git_sha="s", date="2025-12-01") for s in range(3)]
                 ).to_csv(mini / "theory.csv", index=False)
    pd.DataFrame(_rows(shape, 2, lambda cell, s: 8.0 + s)).to_csv(mini / "shapes.csv", index=False)
    sweep = pd.DataFrame(_rows(shape, 3, lambda cell, s: 10.0 + cell["N"] + cell["budget"] + s))
    pd.concat([sweep, start]).to_csv(mini / "sweep.csv", index=False)  # with a starting-policy row to ignore
    abl = [dict(budget=4, advantage=a, M=2, N=2, L=1) for a in ("chain", "intra", "inter", "intra+inter")]
    abl = pd.DataFrame(_rows(abl, 2, lambda cell, s: 12.0 + s))
    abl["collapsed"] = (abl["advantage"] == "intra") & (abl["seed"] == 0)
    abl.to_csv(mini / "ablation.csv", index=False)
    branching = [dict(cell=f"multi-hop/{r}/{m}", regime=r, method=m, generated_per_q=100.0 + 10 * k, calls_multi=2.0)
                 for r in ("hard", "moderate") for k, m in enumerate(("chain", "chain+steps", "tree", "tree-entropy"))]
    pd.DataFrame(_rows(branching, 3, lambda cell, s: 10.0 + cell["generated_per_q"] / 10 + s)  # EM = 20..23 + seed
                 ).to_csv(mini / "branching.csv", index=False)
    demo = [dict(model="tiny", method=m, step=40, synthetic_single=50.0 + s, synthetic_multi=10.0 + 2 * s,
                 calls_synthetic_single=1.0, calls_synthetic_multi=2.0, preset="cpu", config_hash="h", git_sha="s",
                 seed=s, date="2025-12-01", n=100)
            for m in ("chain GRPO (G=4)", "Tree-GRPO (2,2,1) intra+inter") for s in (0, 1)]
    pd.DataFrame(demo).to_csv(root / "results" / "demo.csv", index=False)
    runs = [dict(model="Qwen/Qwen2.5-1.5B", method="Tree-GRPO (2,2,1) intra+inter", step=200, hotpotqa=20.0,
                 **{"2wikimultihopqa": 24.0}, musique=6.0, bamboogle=10.0, preset="paper-1.5b", config_hash="h1",
                 seed=0, date="2025-12-02"),
            dict(model="tiny", method="chain GRPO (G=4)", step=20, hotpotqa=1.0, preset="cpu", config_hash="h2", seed=0,
                 date="2025-12-02")]
    pd.DataFrame(runs).to_csv(root / "results" / "runs.csv", index=False)
    return root


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_alone_on_committed_data(name, committed):
    out = subprocess.run([sys.executable, "-m", "figures", name, "--root", str(committed)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert png_ok(committed / "figures" / script(name).NAME)


def test_redraw_all_without_torch(with_ours):
    code = ("import sys; from figures.__main__ import main; main(['--root', sys.argv[1]]); "
            "assert 'torch' not in sys.modules, 'a figure script imported torch'")
    out = subprocess.run([sys.executable, "-c", code, str(with_ours)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert all(png_ok(with_ours / "figures" / script(n).NAME) for n in SCRIPTS)


def test_every_script_is_listed_and_documented():
    on_disk = {p.stem for p in (ROOT / "figures").glob("fig_*.py")}
    assert on_disk == set(SCRIPTS)
    readme = (ROOT / "figures" / "README.md").read_text()
    assert all(f"{n}.py" in readme and script(n).NAME in readme for n in SCRIPTS)


def test_paper_copies_match_the_shared_transcription():
    shared = ROOT.parent / "shared" / "paper"
    if not shared.exists():
        pytest.skip("the paper's tables are not in this checkout")
    for path in (ROOT / "results" / "paper").glob("*.csv"):
        assert path.read_bytes() == (shared / path.name).read_bytes(), path.name


def texts(fig) -> str:
    """All the text drawn in a figure (titles, notes, labels), then the figure is closed."""
    out = " ".join(t.get_text() for t in fig.findobj(Text))
    c.plt.close(fig)
    return out


# ---- the paper's numbers read back exactly ------------------------------------------------------------

def test_table1_paper_numbers(paper_only):
    paper, ours = script("fig_table1_qa").load(paper_only)
    csv = pd.read_csv(paper_only / "results/paper/table1_qa_em.csv")
    pd.testing.assert_frame_equal(paper, csv[csv["model"].isin(["Qwen2.5-1.5b", "Qwen2.5-3b"])].reset_index(drop=True))
    assert ours is None
    fig = script("fig_table1_qa").draw(paper_only)
    heights = [b.get_height() for b in fig.axes[1].containers[1]]       # Qwen2.5-3b, multi-hop avg
    assert heights[-1] == 36.8 and heights == csv[csv["model"] == "Qwen2.5-3b"]["multi_hop_avg"].tolist()
    assert "No tg rows yet" in texts(fig)


def test_table3_paper_numbers(paper_only):
    paper, ours = script("fig_table3_budget").load(paper_only)
    multi = paper[(paper["hop"] == "multi") & (paper["kind"] == "tree")].set_index(["M", "N", "L"])["mean"]
    assert multi.loc[(2, 2, 1)] == 36.8 and multi.loc[(4, 5, 1)] == 37.3
    csv = pd.read_csv(paper_only / "results/paper/table3_budget_em.csv")
    assert sorted(paper[paper["hop"] == "single"]["mean"]) == sorted(csv["single_hop_avg"])
    assert ours is None
    fig = script("fig_table3_budget").draw(paper_only)
    line = next(ln for ln in fig.axes[0].lines if ln.get_label() == "tree (M,2,1)")
    assert list(line.get_ydata()) == [31.6, 36.8, 35.1, 36.1]
    assert "not run yet" in texts(fig)


def test_table4_paper_numbers(paper_only):
    paper, _ = script("fig_table4_ablation").load(paper_only)
    at = paper.set_index(["budget", "advantage"])
    assert at.loc[(4, "intra"), "collapsed"] == 1 and at.loc[(4, "intra+inter"), "mean"] == 36.8
    assert at.loc[(8, "intra"), "mean"] == 34.6 and at.loc[(8, "chain"), "mean"] == 31.4
    fig = script("fig_table4_ablation").draw(paper_only)
    bars = next(b for b in fig.axes[0].containers if b.get_label() == "intra + inter (Tree-GRPO)")
    assert [b.get_height() for b in bars] == [36.8, 36.4]
    assert "collapse" in texts(fig)


def test_table7_paper_numbers(paper_only):
    paper, _ = script("fig_table7_shapes").load(paper_only)
    at = paper.set_index(["budget", "M", "N", "L"])["mean"]
    assert at.loc[(4, 4, 0, 0)] == 31.8 and at.loc[(16, 4, 5, 1)] == 37.3 and len(at) == 12


def test_table6_and_table2_paper_numbers(paper_only):
    t6 = script("fig_table6_granularity").load(paper_only)
    assert t6.loc["Token/sentence-level tree", "multi-hop avg"] == 22.2
    t2 = script("fig_table2_web").load(paper_only).set_index(["model", "method"])
    assert t2.loc[("Qwen2.5-14b", "Tree-GRPO"), "GAIA avg"] == 21.0


# ---- tg's rows: aggregated over seeds at each seed's last step, labelled tg --------------------------

def test_ours_budget_mean_and_standard_error_over_seeds(with_ours):
    _, ours = script("fig_table3_budget").load(with_ours)
    tree4 = ours[(ours["budget"] == 4) & (ours["kind"] == "tree") & (ours["hop"] == "multi")].iloc[0]
    assert tree4["mean"] == pytest.approx(13.0) and tree4["std"] == pytest.approx(1.0) and tree4["count"] == 3
    assert tree4["se"] == pytest.approx(1.0 / 3 ** 0.5)
    assert ours["label"].iloc[0] == "tg (cpu)"


def test_ours_ablation_counts_collapsed_seeds(with_ours):
    _, ours = script("fig_table4_ablation").load(with_ours)
    intra = ours.set_index("advantage").loc["intra"]
    assert intra["collapsed"] == 1 and intra["count"] == 1 and intra["mean"] == 13.0
    assert "over 2 seeds" in script("fig_table4_ablation").draw(with_ours).axes[1].get_title()  # collapsed included


def test_ours_sweep_reads_the_last_step_of_training_rows(with_ours):
    paper, ours = script("fig_mini_sweep").load(with_ours)
    assert set(paper["hop"]) == {"multi"} and paper.query("budget == 16 and kind == 'chain'")["mean"].item() == 33.9
    tree4 = ours.query("kind == 'tree' and budget == 4").iloc[0]
    assert (tree4["mean"], tree4["count"], len(ours)) == (17.0, 3, 4)  # 10 + N + budget + mean seed; no start row
    fig = script("fig_mini_sweep").draw(with_ours)
    assert "tree at ≈4" in texts(fig)
    ticks = [t.get_text() for t in fig.axes[1].get_xticklabels()]
    marks = [t.get_position()[0] for t in fig.axes[1].texts if t.get_text() == "not run yet"]
    assert ticks == ["≈2", "≈4", "≈8", "≈16"] and marks == [8, 16]  # the paper's budgets without rows here


def test_grids_from_both_starts_are_drawn_per_start_never_pooled(tmp_path):
    """Claims 3-5 run from the hard and the moderate start: one panel (or block) per start, hard first."""
    shutil.copytree(ROOT / "results" / "paper", tmp_path / "results" / "paper")
    (tmp_path / "results" / "mini").mkdir()
    cells = [dict(budget=4, M=4, N=0, L=0, method="chain", advantage="chain"),
             dict(budget=4, M=2, N=2, L=1, method="tree", advantage="intra+inter")]
    rows = pd.DataFrame(_rows([dict(cell, regime=r) for r in ("moderate", "hard") for cell in cells], 2,
                              lambda cell, s: (30.0 if cell["regime"] == "moderate" else 10.0) + cell["N"] + s))
    for name in ("sweep", "ablation", "shapes"):
        rows.to_csv(tmp_path / "results" / "mini" / f"{name}.csv", index=False)
    _, ours = script("fig_mini_sweep").load(tmp_path)
    assert sorted(zip(ours["regime"], ours["mean"])) == [("hard", 10.5), ("hard", 12.5), ("moderate", 30.5),
                                                          ("moderate", 32.5)]
    for name in ("fig_mini_sweep", "fig_table4_ablation"):
        titles = [ax.get_title() for ax in script(name).draw(tmp_path).axes]
        assert ["hard start" in t for t in titles[1:]] == [True, False] and "moderate start" in titles[2]
    titles = [ax.get_title() for ax in script("fig_table7_shapes").draw(tmp_path).axes if "start" in ax.get_title()]
    assert titles == ["budget ≈4, hard start", "budget ≈4, moderate start"]


def test_ours_demo_and_runs(with_ours):
    df, em, calls = script("fig_demo").load(with_ours)
    assert em == ["synthetic_single", "synthetic_multi"] and calls == ["calls_synthetic_single", "calls_synthetic_multi"]
    _, ours = script("fig_table1_qa").load(with_ours)
    row = ours.iloc[0]
    assert (row["model"], row["method"], row["average"], row["mean"]) == ("Qwen2.5-1.5b", "Tree-GRPO", "multi_hop_avg", 15.0)
    assert len(ours) == 1 and row["label"] == "tg (paper-1.5b)"


def test_table1_counts_a_run_evaluated_twice_as_one_seed(tmp_path):
    """Two seeds (multi-hop EM 40 and 30), the first evaluated twice at its last step: 35.0 over 2 seeds."""
    shutil.copytree(ROOT / "results" / "paper", tmp_path / "results" / "paper")
    row = dict(model="Qwen/Qwen2.5-1.5B", method="Tree-GRPO (2,2,1) intra+inter", step=200, preset="paper-1.5b")
    runs = [dict(row, **dict.fromkeys(("hotpotqa", "2wikimultihopqa", "musique", "bamboogle"), em), config_hash=h, seed=s)
            for em, h, s in [(40.0, "a", 0), (30.0, "b", 1), (40.0, "a", 0)]]
    pd.DataFrame(runs).to_csv(tmp_path / "results" / "runs.csv", index=False)
    _, ours = script("fig_table1_qa").load(tmp_path)
    multi = ours.set_index("average").loc["multi_hop_avg"]
    assert (multi["mean"], multi["count"]) == (35.0, 2)


def test_tg_label_names_the_preset_and_no_date():
    df = pd.DataFrame({"preset": ["cpu", "cpu"], "date": ["2025-12-02", "2025-12-01"]})
    assert c.tg_label(df) == "tg (cpu)" and c.span(df, "date") == "2025-12-01..2025-12-02"


def test_figures_are_readable_at_notebook_width(with_ours):
    """No text smaller than the tick labels, no date in any title, and every figure over seeds names its
    error bars (the standard error, `_common.ERROR_BARS`), never the std."""
    tick = c.plt.rcParams["xtick.labelsize"]
    for name in SCRIPTS:
        if name == "fig_tree_advantages":
            continue
        fig = script(name).draw(with_ours)
        small = {t.get_text() for t in fig.findobj(Text) if t.get_text().strip() and t.get_fontsize() < tick}
        assert not small, f"{name}: text smaller than the ticks: {sorted(small)[:3]}"
        drawn = texts(fig)
        assert "2025-12" not in drawn and "± std" not in drawn and "(band)" not in drawn, name
        if "seeds" in drawn and name not in ("fig_demo", "fig_mini_theory"):
            assert "standard error" in drawn, f"{name} draws seeds without naming its error bars"


def test_ours_mini_budget_curves_start_at_the_starting_policy(with_ours):
    df = script("fig_mini_budget").load(with_ours)
    hard_tree = df[(df["regime"] == "hard") & (df["method"] == "tree") & (df["setting"] == "multi-hop")]
    assert sorted(hard_tree["step"].unique()) == [0, 60] and set(hard_tree["seed"]) == {0, 1, 2}
    assert (hard_tree[hard_tree["step"] == 0]["em_multi"] == 5.0).all()
    assert hard_tree[hard_tree["step"] == 60]["em_multi"].mean() == pytest.approx(14.0)  # 10 + N + mean seed + 1
    fig = script("fig_mini_budget").draw(with_ours)
    assert "36.8" in texts(fig)  # the paper's budget-4 tree, as text beside ours


def test_ours_branching_pairs_the_four_cells_by_seed_at_the_last_step(with_ours):
    df = script("fig_mini_branching").load(with_ours)
    assert sorted(df["step"].unique()) == [60] and len(df) == 2 * 4 * 3      # the stale step-0 rows are gone
    means = df[df["regime"] == "hard"].groupby("method")["em_multi"].mean()
    assert means.to_dict() == {"chain": 21.0, "chain+steps": 22.0, "tree": 23.0, "tree-entropy": 24.0}
    fig = script("fig_mini_branching").draw(with_ours)
    drawn = texts(fig)
    assert "hard start" in drawn and "moderate start" in drawn and "24.0" in drawn


def test_ours_table3_uses_each_hops_own_setting(with_ours):
    _, ours = script("fig_table3_budget").load(with_ours)
    single = ours[(ours["hop"] == "single") & (ours["kind"] == "tree") & (ours["budget"] == 4)].iloc[0]
    assert single["mean"] == pytest.approx(33.0) and single["count"] == 3  # em_single = em_multi + 20, moderate only


def test_a_grid_in_progress_is_drawn_at_each_cell_s_last_step_only():
    """Seed 1 has reached step 30 only: the cell's step-60 statistics leave it out (one seed), never mixing
    its step-30 EM into them."""
    df = pd.DataFrame({"cell": ["a"] * 3 + ["b"] * 2, "seed": [0, 0, 1, 0, 1], "step": [30, 60, 30, 30, 30],
                       "em": [10.0, 20.0, 12.0, 5.0, 7.0]})
    stats = c.seed_stats(df, ["cell"], "em").set_index("cell")
    assert stats.loc["a", ["mean", "count"]].tolist() == [20.0, 1] and stats.loc["a", "std"] == 0.0
    assert stats.loc["b", ["mean", "count"]].tolist() == [6.0, 2]
