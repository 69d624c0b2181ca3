"""Reading `tg mini`'s CSVs back (results/mini/<experiment>.csv): per-grid summaries over seeds, and the
markdown tables of results/mini/README.md's report (`tg mini report`; the claims' verdicts are
`tg.experiments.claims`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from tg.experiments.grid_files import grid_rows, mini_dir, read_grid
from tg.metrics import TIMERS

log = logging.getLogger(__name__)


def load_rows(name: str, root: str | Path | None = None) -> pd.DataFrame:
    """results/mini/<name>.csv as a DataFrame, its rows checked (`tg.experiments.grid_files.read_grid`: a torn last row
    left out, a wrong header or a (cell, seed, step) written twice refused, so no summary averages a row twice);
    ConfigError naming the command when the file is missing. A measurement written as nan is left out of every mean
    and paired difference, which drops its seed: a logged warning names each."""
    from tg.config import ConfigError
    path = mini_dir(root) / f"{name}.csv"
    if not path.exists():
        raise ConfigError(f"{path} does not exist: run `tg mini run {name}` first")
    nan = [f"{r['cell']} seed {r['seed']} step {r['step']} ({', '.join(k for k, v in r.items() if v.lower() == 'nan')})"
           for r in grid_rows(path) if any(v.lower() == "nan" for v in r.values())]
    if nan:
        log.warning("%s: %d row(s) hold nan, left out of the means and paired differences (their seeds drop out): %s",
                    path, len(nan), "; ".join(nan))
    return read_grid(path)


def budget_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, regime): the starting EM, chain and tree EM (mean, std, seeds) at each evaluation step,
    and the tree - chain difference paired by seed (same seed = same question order) with its standard
    error. EM is the setting's own (multi-hop EM for multi-hop training, single-hop for single-hop)."""
    df = df.assign(em=np.where(df["setting"] == "single-hop", df["em_single"], df["em_multi"]),
                   calls=np.where(df["setting"] == "single-hop", df["calls_single"], df["calls_multi"]))
    out = []
    for (setting, regime), d in df.groupby(["setting", "regime"], sort=False):
        start = d[d["method"] == "start"]
        for step, s in d[d["method"] != "start"].groupby("step"):
            wide = s.pivot_table(index="seed", columns="method", values=["em", "calls"])
            row = {"setting": setting, "regime": regime, "step": int(step),
                   "start_em": float(start["em"].iloc[0]) if len(start) else float("nan")}
            for m in ("chain", "tree"):
                if ("em", m) in wide:
                    v = wide[("em", m)].dropna()
                    row.update({f"{m}_em": v.mean(), f"{m}_sd": v.std(), f"{m}_n": len(v),
                                f"{m}_calls": wide[("calls", m)].mean()})
            if ("em", "chain") in wide and ("em", "tree") in wide:
                diff = (wide[("em", "tree")] - wide[("em", "chain")]).dropna()
                row.update(diff=diff.mean(), diff_se=diff.std() / np.sqrt(len(diff)) if len(diff) > 1 else float("nan"),
                           tree_wins=int((diff > 0).sum()), pairs=len(diff))
            out.append(row)
    return pd.DataFrame(out)


def ledger_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (regime, shape): means over seeds of the ledger, and each tree's ratios to the chain of its
    matched budget (trajectories, generated tokens per trajectory, searches per trajectory)."""
    from tg.budget import matched_chain_group
    cols = ["trajectories_per_q", "generated_per_q", "tool_calls_per_q", "generated_per_traj", "calls_per_traj",
            "prefill_computed_per_q", "seconds_per_q"]
    g = df.groupby(["regime", "M", "N", "L", "budget"], sort=False)[cols].mean().reset_index()
    chains = g[g["N"] == 0].set_index(["regime", "M"])
    for col, name in (("trajectories_per_q", "traj_ratio"), ("generated_per_traj", "tokens_per_traj_ratio"),
                      ("calls_per_traj", "calls_per_traj_ratio"), ("generated_per_q", "tokens_per_q_ratio"),
                      ("prefill_computed_per_q", "prefill_per_q_ratio"), ("seconds_per_q", "seconds_per_q_ratio")):
        g[name] = [r[col] / chains.loc[(r["regime"], matched_chain_group(r["M"], r["N"], r["L"]) if r["N"] else r["M"]),
                                       col] for _, r in g.iterrows()]
    return g


def cell_summary(df: pd.DataFrame, reference: str | Mapping[str, str] | None = None) -> pd.DataFrame:
    """Any training grid, per (cell, step), cells by starting regime, budget and chains (N = 0) first where the
    rows say, then in the order of their first row: multi-hop EM (mean, sd, seeds), searches per multi-hop test
    question, tokens generated per training question; with `reference` (one cell for all, or a cell per cell,
    named by the last part of a cell name and looked up in the cell's own setting and start), each cell's EM minus
    its reference's, paired by seed, its standard error, and the seeds where the cell is ahead (cells a mapping
    leaves out are not paired)."""
    runs = df[df["step"] > 0]
    by_budget = runs.sort_values([k for k in ("regime", "budget", "N") if k in runs], kind="stable")  # a grid run in pieces
    first_seen = {cell: i for i, cell in enumerate(by_budget["cell"].unique())}
    out = runs.groupby(["cell", "step"], sort=False).agg(
        em=("em_multi", "mean"), sd=("em_multi", "std"), n=("seed", "nunique"), calls=("calls_multi", "mean"),
        generated=("generated_per_q", "mean")).reset_index()
    out = out.sort_values(["cell", "step"], key=lambda s: s.map(first_seen) if s.name == "cell" else s,
                          kind="stable", ignore_index=True)
    if reference is None:
        return out
    prefix, sep, short = (runs["cell"].str.rpartition("/")[i] for i in range(3))
    ref_cell = prefix + sep + (short.map(reference) if isinstance(reference, Mapping) else reference)
    em = runs.set_index(["cell", "step", "seed"])["em_multi"]
    diff = runs["em_multi"].to_numpy() - em.reindex(pd.MultiIndex.from_arrays(
        [ref_cell, runs["step"], runs["seed"]])).to_numpy()
    paired = runs.assign(diff=diff).dropna(subset=["diff"]).groupby(["cell", "step"], sort=False)["diff"].agg(
        diff="mean", diff_se=lambda d: d.std() / np.sqrt(len(d)), ahead=lambda d: int((d > 0).sum()), pairs="count")
    return out.merge(paired.reset_index(), on=["cell", "step"], how="left")


REFERENCES: dict[str, str | dict[str, str]] = {
    "shapes": "(4,0,0)", "ablation": "chain", "sweep": {f"tree ({g // 2},2,1)": f"chain-{g}" for g in (2, 4, 8, 16)},
    "branching": {"chain+steps": "chain", "tree": "chain", "tree-entropy": "tree"}}
"""The cell each grid's report pairs the others with, in each cell's own start: the chain of budget 4, or
(sweep) each tree's chain of its budget, (branching) the cell each method adds to (tg.experiments.mini declares
the grids)."""
QUARTER_BUDGET = {"tree (2,2,1)": "chain-16"}
"""Claim 3's "quarter budget": the tree at budget 4 against the chain at 16 (sweep)."""


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the header, the separator, one line per row of cells."""
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def report(name: str, root: str | Path | None = None) -> str:
    """A markdown table of an experiment's results (what results/mini/README.md quotes); the confirmatory grid's
    report is a verdict by its declared rule instead (tg.experiments.confirm_report)."""
    df = load_rows(name, root)
    if name == "theory":
        worst = df[["intra_err", "dpo_err", "ratio_err"]].max()
        return (f"{len(df)} random toy trees, p(win) {df.p_win.min():.3f}..{df.p_win.max():.3f}: largest |difference| "
                f"intra {worst.intra_err:.1e}, DPO {worst.dpo_err:.1e}, ratio {worst.ratio_err:.1e} "
                f"(gradient norms {df.grad_scale.min():.2f}..{df.grad_scale.max():.2f})")
    if name == "ledger":
        return markdown(["start", "(M,N,L)", "budget", "trajectories/q", "generated/traj", "searches/traj",
                         "x trajectories", "x generated/traj", "x searches/traj", "x generated/q", "x prefill/q",
                         "x seconds/q"],
                        [[r.regime, f"({r.M},{r.N},{r.L})", f"{r.budget:g}", f"{r.trajectories_per_q:.1f}",
                          f"{r.generated_per_traj:.1f}", f"{r.calls_per_traj:.2f}", f"{r.traj_ratio:.2f}",
                          f"{r.tokens_per_traj_ratio:.2f}", f"{r.calls_per_traj_ratio:.2f}",
                          f"{r.tokens_per_q_ratio:.2f}", f"{r.prefill_per_q_ratio:.2f}", f"{r.seconds_per_q_ratio:.2f}"]
                         for r in ledger_summary(df).itertuples()])
    if name == "budget":
        return markdown(["setting", "start", "step", "start EM", "chain EM (mean ± sd, n)", "tree EM (mean ± sd, n)",
                         "tree - chain (paired, ± se)", "tree wins", "searches/q chain, tree"],
                        [[r.setting, r.regime, str(r.step), f"{r.start_em:.1f}",
                          f"{r.chain_em:.1f} ± {r.chain_sd:.1f} ({r.chain_n:.0f})",
                          f"{r.tree_em:.1f} ± {r.tree_sd:.1f} ({r.tree_n:.0f})", f"{r.diff:+.1f} ± {r.diff_se:.1f}",
                          f"{r.tree_wins:.0f}/{r.pairs:.0f}", f"{r.chain_calls:.2f}, {r.tree_calls:.2f}"]
                         for r in budget_summary(df).itertuples()])
    table = _cell_table(df, REFERENCES.get(name))
    if name != "sweep":
        return table
    quarter = _cell_table(df, QUARTER_BUDGET, cells=list(QUARTER_BUDGET))
    return f"{table}\n\nQuarter budget (claim 3): the tree at budget 4 against the chain at 16\n\n{quarter}"


def _cell_table(df: pd.DataFrame, ref: str | Mapping[str, str] | None, cells: list[str] | None = None) -> str:
    rows = cell_summary(df, ref)
    rows = rows[rows["cell"].str.rpartition("/")[2].isin(cells)] if cells else rows
    against = ref or "reference"
    if isinstance(ref, Mapping):  # one reference cell for all (the quarter budget) is named; several are not
        refs = set(ref.values())
        against = refs.pop() if len(refs) == 1 else "its reference"  # the grid's caption names them
    paired = [f"{r.diff:+.1f} ± {r.diff_se:.1f} ({r.ahead:.0f}/{r.pairs:.0f} ahead)"
              if pd.notna(r.diff) and r.cell.rpartition("/")[2] != ref else "" for r in rows.itertuples()]
    return markdown(["cell", "step", "multi-hop EM (mean ± sd)", "seeds", f"- {against} (paired ± se)",
                     "searches / multi-hop q", "generated tokens / training q"],
                    [[r.cell, str(r.step), f"{r.em:.1f} ± {r.sd:.1f}", str(r.n), d, f"{r.calls:.2f}", f"{r.generated:.0f}"]
                     for r, d in zip(rows.itertuples(), paired)])


def load_steps(root: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """Each grid's committed per-step metrics (results/mini/steps/<grid>.csv), for the grids that have them."""
    return {p.stem: read_grid(p) for p in sorted((mini_dir(root) / "steps").glob("*.csv"))}


def cost_table(frames: Mapping[str, pd.DataFrame], steps: Mapping[str, pd.DataFrame] | None = None) -> str:
    """Per grid (`frames`: name -> rows) and machine kind: the runs it trained itself (rows of a run's last step
    not copied from another grid), their training step time (`train_s`: rollout, log-prob and update seconds) in
    all, split into those pieces where the grid's per-step metrics are there (`steps`: name -> rows of
    steps/<grid>.csv), and per run (median, range); then the workers' wall time for every row the grid made
    itself (`run_s`: loading, steps, checkpoint writes, evaluations; start, ledger and theory rows too). Machine
    kinds differ in speed, so each has its own line; the last line sums the worker time of every grid."""
    rows, steps = [], steps or {}
    total, unrecorded = 0.0, 0
    for name, df in frames.items():
        made = df[df["reused_from"].isna()] if "reused_from" in df else df
        made = made.assign(machine=made["machine"].fillna("not recorded") if "machine" in made else "not recorded")
        trained = made[made["step"] > 0] if "train_s" in made else made.iloc[:0]
        trained = trained[trained["step"] == trained.groupby(["cell", "seed"])["step"].transform("max")]
        for kind, part in made.groupby("machine", sort=False):
            run_s = part["run_s"] if "run_s" in part else pd.Series(float("nan"), index=part.index)
            worker = f"{run_s.sum() / 3600:.1f}" if run_s.notna().all() else "-"
            total += run_s.sum()
            unrecorded += int(run_s.isna().sum())
            last = trained[trained["machine"] == kind]  # a run counts where its last row was made
            if last.empty:
                rows.append([name, str(kind), "0", "-", "-", "-", "-", worker])
                continue
            s = last["train_s"].astype(float)
            split = "-"
            if name in steps:
                runs = steps[name].merge(last[["cell", "seed"]], on=["cell", "seed"])
                split = " / ".join(f"{runs[c].sum() / 3600:.1f}" for c in TIMERS)
            rows.append([name, str(kind), str(len(s)), f"{s.sum() / 3600:.1f}", split, f"{s.median():.0f}",
                         f"{s.min():.0f}-{s.max():.0f}", worker])
    table = markdown(["grid", "machine", "runs trained", "step time, hours in all",
                      "rollout / log-probs / update, hours", "per run, median s", "per run, range s",
                      "worker time, hours in all"], rows)
    if unrecorded:
        return table + f"\n\nWorker time is not recorded for {unrecorded} rows (made before rows carried `run_s`)."
    return table + (f"\n\nEvery grid together: {total / 3600:.1f} hours of worker time, {total / 7200:.1f} h "
                    "with two one-thread workers on two cores.")


def last_demo_run(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the newest `make demo` run in results/demo.csv (its last code version, one row per method)."""
    return df[df["git_sha"] == df["git_sha"].iloc[-1]].drop_duplicates("method", keep="last")


def demo_table(path: str | Path) -> str:
    """The README's demo table from results/demo.csv: start, chain and tree of the newest run (EM in %)."""
    from tg.agent.data import is_single_hop
    df = pd.read_csv(path)
    sets = [c for c in df.columns if c.startswith("synthetic_")]
    single, multi = [c for c in sets if is_single_hop(c)], [c for c in sets if not is_single_hop(c)]
    rows = []
    for _, r in last_demo_run(df).iterrows():
        trained = r["method"] != "start"
        rows.append([str(r["method"]), f"{r[single].mean():.1f}", f"{r[multi].mean():.1f}",
                     f"{r[['calls_' + c for c in multi]].mean():.2f}",
                     f"{r['trajectories_per_q']:.1f}" if trained else "", f"{r['generated_per_q']:.0f}" if trained else "",
                     f"{r['minutes']:.1f}" if trained else ""])
    return markdown(["method", "EM 1-hop", "EM multi", "searches / multi-hop q", "trajectories / q", "tokens / q",
                     "minutes"], rows)
