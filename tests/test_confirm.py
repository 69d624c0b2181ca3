"""The confirmatory experiment's declared protocol (tg.experiments.confirm, results/mini/confirm.md): fresh seeds, the
translated effect, the two-look levels, the rule on synthetic rows, and the committed rows against the protocol."""

import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tg.experiments import confirm, grid_files
from tg.experiments.verdict import one_sided_test, two_look_levels

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "results" / "mini"


def test_seeds_are_fresh():
    """No row of another grid trained or evaluated with a confirmatory seed."""
    fresh = set(confirm.STAGE1_SEEDS + confirm.STAGE2_SEEDS)
    assert len(fresh) == 24 and not set(confirm.STAGE1_SEEDS) & set(confirm.STAGE2_SEEDS)
    for path in MINI.glob("*.csv"):
        if path.stem != confirm.GRID:
            assert not fresh & set(pd.read_csv(path)["seed"]), path.name
    cells = confirm.cells()
    assert {s for c in cells if c.kind == "train" for s in c.seeds} == fresh


def test_the_translated_effect_comes_from_table_3_and_the_budget_grid():
    table3 = pd.read_csv(ROOT / "results" / "paper" / "table3_budget_em.csv")
    at4 = table3[table3["budget"] == 4].set_index("method")["multi_hop_avg"]
    budget = pd.read_csv(MINI / "budget.csv")
    chains = budget[(budget["step"] == 60) & budget["cell"].isin(["multi-hop/hard/chain", "multi-hop/moderate/chain"])]
    assert (confirm.PAPER_TREE_EM, confirm.PAPER_CHAIN_EM) == (at4["Tree"], at4["Chain"])
    assert chains.groupby("cell")["em_multi"].mean().mean() == pytest.approx(confirm.CHAIN_EM_HERE, abs=1e-9)
    assert confirm.DELTA == pytest.approx(3.061, abs=1e-3)


def test_two_look_levels_match_the_published_obrien_fleming_boundaries():
    """Lan-DeMets O'Brien-Fleming spending, two equally spaced looks, one-sided alpha 0.025: z 2.963 then 1.969
    (gsDesign's sfLDOF; Jennison & Turnbull's tables); the protocol's own levels at one-sided 0.05."""
    a1, a2 = two_look_levels(1, 2, 0.025)
    assert (stats.norm.isf(a1), stats.norm.isf(a2)) == (pytest.approx(2.963, abs=1e-3), pytest.approx(1.969, abs=1e-3))
    assert confirm.LEVELS == (pytest.approx(0.00557, abs=1e-5), pytest.approx(0.04825, abs=1e-5))
    with pytest.raises(ValueError, match="n1 < n2"):
        two_look_levels(12, 12)


def test_one_sided_test_matches_r():
    """R: t.test(sleep$extra[11:20] - sleep$extra[1:10], alternative = "greater") gives t = 4.0621, df = 9,
    p = 0.001416; the upper 95% bound of alternative = "less" is mean + qt(0.95, 9) se = 2.29301."""
    drug1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
    drug2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
    r = one_sided_test([b - a for a, b in zip(drug1, drug2)], 0.05)
    assert r.p == pytest.approx(0.001416, abs=5e-7) and r.upper == pytest.approx(2.29301, abs=5e-5)
    with pytest.raises(ValueError, match="not all equal"):
        one_sided_test([1.0, 1.0], 0.05)


def _rows(effects: dict[int, float], cells=("tree", "chain"), starts=confirm.STARTS, base=20.0):
    """Synthetic step-60 rows: per seed, tree − chain equals `effects[seed]` in every start."""
    out = []
    for seed, eff in effects.items():
        for start in starts:
            for cell in cells:
                em = base + (eff if cell.startswith("tree") else 0.0)
                out.append({"cell": f"multi-hop/{start}/{cell}", "seed": seed, "step": 60, "em_multi": em, "em_single": em,
                            "regime": start, "method": cell, "machine": "x"})
    return pd.DataFrame(out)


def _stage(cells):
    return sorted({c.labels["stage"] for c in cells})


def test_the_rule_on_synthetic_rows():
    all_cells = confirm.cells()
    rng = np.random.default_rng(0)
    s1, s2 = confirm.STAGE1_SEEDS, confirm.STAGE2_SEEDS
    partial = _rows({s: 3.0 for s in s1[:11]})
    assert confirm.primary_looks(partial) == [] and _stage(confirm.active_cells(all_cells, partial)) == ["1"]
    clear = _rows({s: 3.0 + rng.normal(0, 0.5) for s in s1})            # a large effect: holds at look 1
    [look] = confirm.primary_looks(clear)
    assert look.decision == "holds" and look.test.p < confirm.LEVELS[0]
    assert _stage(confirm.active_cells(all_cells, clear)) == ["1", "secondary"]
    null = _rows({s: rng.normal(0, 0.3) for s in s1})                   # a tight zero: refuted at look 1
    assert confirm.primary_verdict(null) == "refuted" and _stage(confirm.active_cells(all_cells, null)) == ["1"]
    vague = {s: 1.0 + rng.normal(0, 6) for s in s1}                   # neither: stage 2
    assert confirm.primary_verdict(_rows(vague)) == "stage 2 running"
    assert _stage(confirm.active_cells(all_cells, _rows(vague))) == ["1", "2"]
    more = _rows({**vague, **{s: 1.0 + rng.normal(0, 6) for s in s2}})
    looks = confirm.primary_looks(more)
    assert [x.look for x in looks] == [1, 2] and looks[1].test.n == 24 and looks[1].level == confirm.LEVELS[1]
    assert looks[1].decision in ("holds", "refuted", "inconclusive")
    # the secondaries are "not tested" unless the primary holds, then Holm over six
    assert {s.verdict for s in confirm.secondary_results(null)} == {"not tested"}
    assert [s.verdict for s in confirm.secondary_results(clear)][:2] != ["not tested"] * 2


def test_mixed_machine_pairs_are_flagged():
    rows = _rows({100: 1.0, 101: 2.0})
    rows.loc[(rows["seed"] == 101) & (rows["cell"] == "multi-hop/hard/tree"), "machine"] = "y"
    assert confirm.mixed_machines(rows) == ["multi-hop/hard tree − chain, seed 101: x | y"]


def test_question_outcomes_round_trip():
    from types import SimpleNamespace

    from tg.agent.data import Question
    result = SimpleNamespace(scores=[1.0, 0.0, 1.0], tool_calls=[0, 2, 3], sources=["nq", "hotpotqa", "musique"])
    qs = [Question(str(i), "q", ("a",), s) for i, s in enumerate(result.sources)]
    row = grid_files.question_outcomes(result, qs)
    assert (row["n_single"], row["correct"], row["searches"]) == (1, "101", "023")
    assert grid_files.outcome_vector(row, "multi").tolist() == [0, 1] and grid_files.outcome_vector(row, "single").tolist() == [1]
    assert grid_files.outcome_vector(row, "multi", "searches").tolist() == [2, 3]
    with pytest.raises(ValueError, match="0/1 scores"):
        grid_files.question_outcomes(SimpleNamespace(scores=[0.5], tool_calls=[0], sources=["nq"]), qs[:1])


def test_committed_rows_follow_the_protocol():
    """Every committed confirmatory row was made by a commit that already held this protocol, with a declared
    seed, cell and point, and a question-level row beside it."""
    path = MINI / f"{confirm.GRID}.csv"
    if not path.exists():
        pytest.skip("no confirmatory row committed yet")
    rows = pd.read_csv(path)
    declared = {(c.name, s, p) for c in confirm.cells() for s in c.seeds for p in c.points}
    for r in rows.itertuples():
        assert (r.cell, r.seed, r.step) in declared
        if r.method != "start":
            held = subprocess.run(["git", "cat-file", "-e", f"{r.git_sha}:tg/experiments/confirm.py"], cwd=ROOT)
            assert held.returncode == 0, f"row {r.cell} seed {r.seed} step {r.step}: made before the protocol"
    questions = confirm.load_questions()
    trained = rows[rows["method"] != "start"]
    assert questions is not None and len(questions) == len(trained)
    assert set(zip(questions["cell"], questions["seed"], questions["step"])) == set(
        zip(trained["cell"], trained["seed"], trained["step"]))
    assert not rows.duplicated(["cell", "seed", "step"]).any()


def test_the_generated_sentence_and_report():
    from tg.experiments import confirm_report
    rng = np.random.default_rng(1)
    rows = _rows({s: 3.0 + rng.normal(0, 0.5) for s in confirm.STAGE1_SEEDS}).assign(stage="1", run_s=100.0)
    line = confirm_report.sentence(rows=rows)
    assert line.startswith("tree (2,2,1) − chain (G = 4), multi-hop EM at step 60, 12 fresh seeds: +3.")
    assert "(95% CI +" in line and line.endswith(": holds")
    assert confirm_report.sentence(rows=rows.iloc[:8]).endswith("(2 of 12 seeds complete; no look yet)")
    null = _rows({s: rng.normal(0, 0.3) for s in confirm.STAGE1_SEEDS})
    [look] = confirm.primary_looks(null)
    assert confirm_report.sentence(rows=null).endswith(
        f": refuted (upper bound {look.test.upper:+.1f} at look 1's level, below the paper's 3.1 on this scale; "
        f"an edge up to {look.test.upper:+.1f} EM points is not excluded)")
    assert confirm_report.cost(rows).endswith("): stage 1 (steps 1-60): 1.3 h over 48 runs; in all 1.3 worker hours, "
                                              "about 0.7 h of two cores.")
    horizon = pd.concat([rows, rows.assign(step=120, run_s=50.0)])
    assert confirm_report.cost(horizon).endswith("stage 1 (steps 1-60): 1.3 h over 48 runs; horizon (stage 1's steps "
                                                 "61-120): 0.7 h over 48 runs; in all 2.0 worker hours, about 1.0 h of "
                                                 "two cores.")


def test_question_files_keep_leading_zeros(tmp_path):
    """`correct` and `searches` are digit strings: read back as written, not as numbers."""
    from tg.store.files import append_csv_rows
    path = tmp_path / "results" / "mini" / "questions" / "confirm.csv"
    append_csv_rows(path, [{"cell": "multi-hop/hard/tree", "seed": 100, "step": 60, "n_single": 1, "ids": "x",
                            "correct": "0010", "searches": "0123"}])
    q = confirm.load_questions(tmp_path)
    assert (q["correct"][0], q["searches"][0], q["seed"][0]) == ("0010", "0123", 100)


def test_one_run_goes_on_while_the_rule_adds_cells(tmp_path, monkeypatch, capsys):
    """`tg mini run confirm` runs each stage the rule opens after a look in the same call, and stops when a stage adds
    nothing or a job fails (no endless retry). Theory cells (seconds) stand in for the training cells; the stand-in
    rule opens stage 2 once stage 1's rows are in."""
    from tg.experiments import runner
    from tg.experiments.cells import Cell
    one = Cell("toy-1", "theory", seeds=(0, 1), labels={"stage": "1"})
    two = Cell("toy-2", "theory", seeds=(0,), labels={"stage": "2"})
    monkeypatch.setattr(confirm, "primary_verdict", lambda rows: "stand-in")
    monkeypatch.setattr(confirm, "active_cells", lambda cells, rows: [one] if rows is None else [one, two])
    path = runner.run_experiment("confirm", workers=1, root=tmp_path, cells=[one, two])
    assert sorted(zip(pd.read_csv(path)["cell"], pd.read_csv(path)["seed"])) == [("toy-1", 0), ("toy-1", 1), ("toy-2", 0)]
    out = capsys.readouterr().out
    assert out.count("stages run now") == 3 and "stages run now: 1, 2" in out  # stage 1, stage 2, nothing left

    three = Cell("toy-3", "theory", seeds=(0,), labels={"stage": "2"})
    monkeypatch.setattr(confirm, "active_cells", lambda cells, rows: [three])
    monkeypatch.setattr(runner, "_run_jobs", lambda *args: 1)  # one job failed, its row not written
    with pytest.raises(runner.JobsFailed, match="1 job"):
        runner.run_experiment("confirm", workers=2, root=tmp_path, cells=[three])
    assert capsys.readouterr().out.count("stages run now") == 1
