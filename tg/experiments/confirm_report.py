"""The confirmatory experiment's report (`tg mini report confirm`): the verdict sentence, the looks, the robustness
check, the secondaries, the horizon, the machine flags and the cost, all from results/mini/confirm.csv and its
question-level file. The rule itself is tg.experiments.confirm's; this module only reads and writes it out.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tg.experiments import confirm
from tg.experiments.grid_files import mini_dir, read_grid
from tg.experiments.summary import markdown


def load(root: str | Path | None = None) -> pd.DataFrame | None:
    """results/mini/confirm.csv, or None before its first row."""
    path = mini_dir(root) / f"{confirm.GRID}.csv"
    return read_grid(path) if path.exists() else None


def _signed(x: float) -> str:
    return f"{x:+.1f}"


def sentence(root: str | Path | None = None, rows: pd.DataFrame | None = None) -> str:
    """One line: 'tree (2,2,1) − chain (G = 4), multi-hop EM at step 60, N fresh seeds: +x.x (95% CI a to b):
    verdict', or how far the experiment has come."""
    rows = load(root) if rows is None else rows
    name = confirm.PRIMARY.name
    looks = confirm.primary_looks(rows) if rows is not None else []
    if not looks:
        done = len(confirm.pair_differences(rows, confirm.PRIMARY)) if rows is not None else 0
        return f"{name}: stage 1 running ({done} of {len(confirm.STAGE1_SEEDS)} seeds complete; no look yet)"
    t = looks[-1].test
    verdict = "stage 2 running" if looks[-1].decision == "continue" else looks[-1].decision
    if verdict == "holds" and t.upper < confirm.DELTA:
        verdict += f", smaller than the paper's {confirm.DELTA:.1f} on this scale"
    if verdict == "refuted":
        verdict += (f" (upper bound {_signed(t.upper)} at look {looks[-1].look}'s level, below the paper's "
                    f"{confirm.DELTA:.1f} on this scale; an edge up to {_signed(t.upper)} EM points is not excluded)")
    return f"{name}, {t.n} fresh seeds: {_signed(t.effect)} (95% CI {t.ci_low:+.1f} to {t.ci_high:+.1f}): {verdict}"


def _p(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}"


def report(root: str | Path | None = None) -> str:
    """The whole report in markdown (the protocol: results/mini/confirm.md)."""
    rows = load(root)
    parts = [f"**{sentence(root, rows)}**"]
    if rows is None:
        return parts[0] + "\n\nnot run yet: `tg mini run confirm` writes results/mini/confirm.csv"
    looks = confirm.primary_looks(rows)
    if looks:
        parts.append(markdown(
            ["look", "seeds", "mean d", "95% CI", "one-sided p", "level", "upper bound at the level", "δ", "decision"],
            [[str(k.look), str(k.test.n), _signed(k.test.effect), f"{k.test.ci_low:+.2f} to {k.test.ci_high:+.2f}",
              _p(k.test.p), f"{k.level:.5f}", f"{k.test.upper:+.2f}", f"{confirm.DELTA:.2f}", k.decision]
             for k in looks]))
        parts.append("d: per seed, tree − chain multi-hop EM at step 60 averaged over the hard and moderate starts. "
                     "The 95% interval is not adjusted for the two looks; the rule reads p and the upper bound.")
        questions = confirm.load_questions(root)
        if questions is not None:
            d = confirm.pair_differences(rows, confirm.PRIMARY)
            seeds = [int(s) for s in d.index if s in confirm.STAGE1_SEEDS + confirm.STAGE2_SEEDS][:looks[-1].test.n]
            low, high = confirm.bootstrap_interval(questions, seeds)
            parts.append(f"Robustness (not the verdict): resampling seeds and test questions, the mean d's 95% "
                         f"percentile interval is {low:+.2f} to {high:+.2f}.")
    secondaries = confirm.secondary_results(rows)
    parts.append(markdown(["secondary (> 0)", "seeds", "mean", "95% CI", "one-sided p", "Holm p", "verdict"],
                          [[s.name, str(s.seeds) if s.test else "", _signed(s.test.effect) if s.test else "",
                            f"{s.test.ci_low:+.1f} to {s.test.ci_high:+.1f}" if s.test else "",
                            _p(s.test.p) if s.test else "", _p(s.p_holm) if s.test else "", s.verdict]
                           for s in secondaries]))
    h = confirm.horizon(rows)
    if len(h):
        parts.append("Horizon (exploratory): tree − chain multi-hop EM on stage 1's seeds at each evaluation step.")
        parts.append(markdown(["start", "step", "seeds", "chain EM", "tree EM", "tree − chain", "95% CI"],
                              [[r.start, str(r.step), str(r.seeds), f"{r.chain:.1f}", f"{r.tree:.1f}", _signed(r.effect),
                                f"{r.ci_low:+.1f} to {r.ci_high:+.1f}"] for r in h.itertuples()]))
    flags = confirm.mixed_machines(rows)
    parts.append("Pairs trained on more than one CPU kind (kept in the test): " + ("; ".join(flags) if flags else "none."))
    parts.append(cost(rows))
    return "\n\n".join(parts)


def cost(rows: pd.DataFrame) -> str:
    """Worker hours per piece from the rows' `run_s` (rows copied from another grid cost nothing here): each stage,
    with stage 1's steps after `confirm.STEP` counted apart as the horizon check."""
    own = rows[rows.get("reused_from", pd.Series(index=rows.index, dtype=object)).isna()]
    piece = [f"horizon (stage 1's steps {confirm.STEP + 1}-{max(confirm.HORIZON)})" if stage == "1" and step > confirm.STEP
             else f"stage {stage} (steps 1-{confirm.STEP})"
             for stage, step in zip(own["stage"].astype(str), own["step"])]
    own = own.assign(piece=piece)
    hours = own.groupby("piece", sort=False)["run_s"].sum() / 3600
    runs = own[own["method"] != "start"].groupby("piece", sort=False)[["cell", "seed"]].apply(
        lambda g: len(g.drop_duplicates()))
    return ("Cost so far (worker hours, from `run_s`; two workers share two cores, and the hours include any time the "
            "runs shared them with other jobs): ") + "; ".join(
        f"{k}: {hours[k]:.1f} h over {int(runs.get(k, 0))} runs" for k in hours.index) + (
        f"; in all {hours.sum():.1f} worker hours, about {hours.sum() / 2:.1f} h of two cores.")
