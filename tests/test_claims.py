"""The claims table (tg.experiments.claims, tg.experiments.report): the declared family against the grids, the
rules of claims 1 and 7, and the generated README blocks against the committed CSVs."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tg.config import ConfigError
from tg.experiments import claims, mini, report, summary

REPO = Path(__file__).parents[1]
pytestmark = pytest.mark.usefixtures("no_gc_collect")  # Holm, called 23 times here (tests/conftest.py)


def block_text(text: str, name: str) -> str:
    """What lies between block `name`'s markers in `text` (without the newlines next to the markers)."""
    begin, end = report.markers(name)
    return text.partition(begin)[2].partition(end)[0].strip("\n")


def test_the_family_names_declared_cells_once_each_and_every_statistical_claim():
    grids = mini.experiments()
    assert len(set(claims.FAMILY)) == len(claims.FAMILY)
    assert {c for comp in claims.FAMILY for c in comp.claims} == {2, 3, 4, 5, 6}
    for comp in claims.FAMILY:
        names = {c.name for c in grids[comp.grid]}
        for cell in (comp.cell, comp.reference):
            assert f"{comp.setting}/{comp.regime}/{cell}" in names, (comp, cell)
        assert comp.sign in (1, -1)


def test_the_shared_comparison_is_one_set_of_runs():
    """The ≈4 pair serves claims 2 and 3 once: the sweep's chain-4 and tree (2,2,1) rows are the budget grid's."""
    frames = claims.load_frames(REPO)
    for regime in claims.REGIMES:
        for sweep_cell, budget_cell in (("chain-4", "chain"), ("tree (2,2,1)", "tree")):
            def em(grid, cell):
                rows = frames[grid][frames[grid]["cell"] == f"multi-hop/{regime}/{cell}"]
                return rows.sort_values(["seed", "step"])[["seed", "step", "em_multi"]].to_numpy().tolist()
            assert em("sweep", sweep_cell) == em("budget", budget_cell)


def _rows(em: dict[str, list[float]], setting: str = "multi-hop", regime: str = "hard",
          metric: str = "em_multi") -> pd.DataFrame:
    return pd.DataFrame([{"cell": f"{setting}/{regime}/{c}", "seed": s, "step": claims.FINAL_STEP, metric: v}
                         for c, values in em.items() for s, v in enumerate(values)])


def test_evaluate_pairs_by_seed_and_corrects_over_the_family():
    family = [claims.Comparison((2,), "g", "hard", "tree", "chain"),
              claims.Comparison((5,), "g", "hard", "small", "tree", sign=-1),
              claims.Comparison((3,), "g", "hard", "flat", "chain"),
              claims.Comparison((3,), "missing", "hard", "tree", "chain")]
    rows = _rows({"chain": [10, 12, 14, 11, 13], "tree": [13, 15.5, 17, 14.5, 16], "small": [20, 23, 24, 22, 25],
                  "flat": [11, 11, 15, 10, 13]})
    got = claims.evaluate({"g": rows}, family)
    assert [r.verdict for r in got] == ["holds", "opposite", "not shown", "not run"]
    assert got[0].test.effect == pytest.approx(3.2) and got[0].test.n == 5
    assert got[3].test is None and got[3].p_holm == 1.0
    assert got[0].p_holm == pytest.approx(min(1, 4 * got[0].test.p))   # m = 4: the missing one counts


def test_a_difference_of_differences_pairs_seed_by_seed():
    single = claims.Comparison((2,), "g", "moderate", "tree", "chain", metric="em_single", setting="single-hop")
    both = claims.Comparison((2,), "g", "moderate", "tree", "chain", minus=single)
    rows = pd.concat([_rows({"chain": [10, 10, 10], "tree": [13, 14, 15]}, regime="moderate"),
                      _rows({"chain": [50, 50, 50], "tree": [51, 50, 52]}, "single-hop", "moderate", "em_single")])
    assert claims.differences(rows, both).tolist() == [2.0, 4.0, 3.0]
    assert both.label() == "(tree − chain, multi-hop EM) − (tree − chain, single-hop EM) (> 0)"


def test_the_branching_family_is_its_own_and_says_in_words_what_it_decided():
    """Holm runs over the six branching comparisons alone; the table's note names what was decided, or says
    that nothing was."""
    names = {c.name for c in mini.experiments()["branching"]}
    for comp in claims.BRANCHING:
        assert {f"{comp.setting}/{comp.regime}/{c}" for c in (comp.cell, comp.reference)} <= names, comp
    assert not set(claims.BRANCHING) & set(claims.FAMILY) and len(claims.BRANCHING) == 6
    flat = {"chain": [10, 12, 14, 11, 13], "chain+steps": [11, 11, 15, 10, 13], "tree": [11, 11, 15, 10, 13],
            "tree-entropy": [10, 12, 14, 11, 13]}
    rows = pd.concat([_rows(flat, regime=r) for r in ("hard", "moderate")])
    text = claims.branching_table({"branching": rows})
    assert text.count("| not shown |") == 6 and "None of the 6 tested comparisons differs" in text
    up = [13, 15.5, 17, 14.5, 16]                                               # +3.2 over chain, sd 0.27
    ahead = pd.concat([rows[~rows["cell"].isin(["multi-hop/hard/tree", "multi-hop/hard/tree-entropy"])],
                       _rows({"tree": up, "tree-entropy": up}, regime="hard")])
    [held] = [r for r in claims.evaluate({"branching": ahead}, claims.BRANCHING) if r.verdict != "not shown"]
    assert (held.comparison.cell, held.comparison.regime, held.verdict) == ("tree", "hard", "holds")
    assert held.p_holm == pytest.approx(min(1, 6 * held.test.p))
    assert "1 of 6 decided: tree − chain, multi-hop EM (> 0) (hard) holds." in claims.branching_table({"branching": ahead})


def test_ledger_and_theory_rules():
    def row(regime, seed, M, N, L, traj, gen, calls):
        return dict(regime=regime, seed=seed, M=M, N=N, L=L, trajectories_per_q=traj, generated_per_traj=gen,
                    calls_per_traj=calls)
    ok = pd.DataFrame([row("hard", 0, 4, 0, 0, 4.0, 40.0, 2.0), row("hard", 0, 2, 2, 1, 6.0, 30.0, 1.0)])
    assert claims.ledger_rule(ok)[1] == "holds" and "1.50-1.50x" in claims.ledger_rule(ok)[0]
    bad = pd.concat([ok, pd.DataFrame([row("hard", 1, 4, 0, 0, 4.0, 40.0, 2.0),
                                       row("hard", 1, 2, 2, 1, 6.0, 41.0, 1.0)])])
    assert claims.ledger_rule(bad)[1] == "not shown"   # one seed's tree pays more tokens per trajectory
    theory = pd.DataFrame(dict(intra_err=[1e-16, 2e-15], dpo_err=[0.0, 1e-16], ratio_err=[3e-16, 0.0]))
    assert claims.theory_rule(theory)[1] == "holds"
    assert claims.theory_rule(theory.assign(dpo_err=[0.0, 1e-9]))[1] == "not shown"


@pytest.mark.parametrize("path", ["README.md", "results/mini/README.md"])
def test_committed_readme_blocks_are_what_the_committed_csvs_give(path):
    """Regenerate with `python -m tg mini report --readme` when this fails."""
    for name, block in report.blocks(REPO)[REPO / path]:
        assert block_text((REPO / path).read_text(), name) == block, name


def test_report_readme_rewrites_the_blocks_in_place(tmp_path, capsys):
    from tg.cli import main
    shutil.copytree(REPO / "results" / "mini", tmp_path / "results" / "mini",
                    ignore=shutil.ignore_patterns("README.md", "ablation.csv"))   # a grid not run yet
    (tmp_path / "README.md").write_text("# x\n<!-- BEGIN claims (tg mini report --readme) -->\nSTALE\n"
                                        "<!-- END claims -->\ntail\n")
    (tmp_path / "results" / "mini" / "README.md").write_text(
        "<!-- BEGIN report (tg mini report --readme) -->\n<!-- END report -->\n")
    assert main(["mini", "report", "--readme", "--root", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# x\n") and text.endswith("<!-- END claims -->\ntail\n") and "STALE" not in text
    assert "| not run (0 of 10 hold) |" in text and "not shown" in capsys.readouterr().out
    assert "not run yet" in block_text((tmp_path / "results" / "mini" / "README.md").read_text(), "report")
    assert main(["mini", "report", "--readme", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == text   # a second run changes nothing
    (tmp_path / "README.md").write_text("no markers\n")
    stale = "<!-- BEGIN report (tg mini report --readme) -->\nstale\n<!-- END report -->\n"
    (tmp_path / "results" / "mini" / "README.md").write_text(stale)
    with pytest.raises(ConfigError, match="BEGIN claims"):
        report.write_readmes(tmp_path)
    assert (tmp_path / "results" / "mini" / "README.md").read_text() == stale   # no file is half done


def test_the_cost_table_gives_each_machine_kind_its_own_line():
    def run(cell: str, seed: int, train_s: float, machine: str, reused_from: str | None = None) -> list[dict]:
        return [{"cell": cell, "seed": seed, "step": step, "train_s": train_s * step / 60, "machine": machine,
                 "reused_from": reused_from} for step in (30, 60)]
    df = pd.DataFrame(run("a", 0, 100.0, "Intel") + run("a", 1, 300.0, "AMD") + run("a", 2, 500.0, "AMD")
                      + run("b", 0, 9999.0, "Intel", reused_from="budget"))
    lines = summary.cost_table({"ablation": df}).splitlines()
    assert lines[2:4] == ["| ablation | Intel | 1 | 0.0 | - | 100 | 100-100 | - |",
                          "| ablation | AMD | 2 | 0.2 | - | 400 | 300-500 | - |"]
    assert lines[-1] == "Worker time is not recorded for 6 rows (made before rows carried `run_s`)."
    # worker time: every row a grid made itself, its start and ledger rows too; summed over the grids at the end
    timed = df.assign(run_s=1800.0)
    ledger = pd.DataFrame([{"cell": "l", "seed": 0, "step": 0, "machine": "Intel", "run_s": 3600.0}])
    lines = summary.cost_table({"ablation": timed, "ledger": ledger}).splitlines()
    assert [line.split(" | ")[-1] for line in lines[2:5]] == ["1.0 |", "2.0 |", "1.0 |"]
    assert lines[4].startswith("| ledger | Intel | 0 | - |")
    assert lines[-1] == "Every grid together: 4.0 hours of worker time, 2.0 h with two one-thread workers on two cores."
    # with per-step metrics: each machine's own runs split into rollout / log-probs / update (copied runs left out)
    steps = pd.DataFrame([{"cell": c, "seed": s, "step": k, "rollout_s": 360.0, "logprob_s": 0.0, "update_s": 720.0}
                          for c, s in (("a", 0), ("a", 1), ("a", 2), ("b", 0)) for k in range(1, 11)])
    lines = summary.cost_table({"ablation": df}, {"ablation": steps}).splitlines()
    assert [line.split(" | ")[4] for line in lines[2:4]] == ["1.0 / 0.0 / 2.0", "2.0 / 0.0 / 4.0"]


def test_pairs_trained_on_two_cpu_kinds_are_counted():
    """In the committed sweep every tree (2,2,1) − chain-16 pair was trained on two CPU kinds; budget's pairs on one."""
    from tg.experiments.claims import evaluate, load_frames
    results = {(r.comparison.grid, r.comparison.cell, r.comparison.reference, r.comparison.regime): r
               for r in evaluate(load_frames())}
    assert [results["sweep", "tree (2,2,1)", "chain-16", s].mixed for s in ("hard", "moderate")] == [5, 5]
    assert results["budget", "tree", "chain", "hard"].mixed == 0


TREE_WINS = re.compile(r"\btree(?:'s edge)?\s+(?:wins|leads|ends ahead|is ahead|beats the chain|comes out ahead)"
                       r"|\btree ahead\b|points the paper's way", re.I)
"""Prose that says the tree wins in the miniature; only the confirmatory verdict 'holds' would back it."""


def _prose() -> dict[str, str]:
    """Every notebook's markdown cells and every README's text outside its generated blocks."""
    root = Path(__file__).resolve().parents[1]
    out = {p.name: "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"]
                             if c["cell_type"] == "markdown") for p in sorted((root / "notebooks").glob("*.ipynb"))}
    for p in (root / "README.md", root / "notebooks" / "README.md", root / "results" / "mini" / "README.md"):
        out[str(p.relative_to(root))] = re.sub(r"<!-- BEGIN (\w+).*?<!-- END \1 -->", "", p.read_text(), flags=re.S)
    return out


def test_no_notebook_or_readme_says_the_tree_wins_unless_the_rows_do():
    from tg.experiments import confirm, confirm_report
    for said in ("the tree ends ahead", "with the tree ahead from both starts", "the tree's edge points the paper's way",
                 "over 60 steps and five seeds the tree leads on multi-hop EM"):
        assert TREE_WINS.search(said), said
    verdict = confirm.primary_verdict(confirm_report.load())
    claims_made = {name: m.group(0) for name, text in _prose().items() if (m := TREE_WINS.search(text))}
    assert verdict == "holds" or not claims_made, (
        f"the confirmatory verdict is {verdict!r}, yet {claims_made} say the tree wins: generate the sentence from "
        "the rows (tg.experiments.findings, confirm_report.sentence) or remove it")
