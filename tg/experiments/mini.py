"""The paper's claims in miniature: the named experiment grids on the cpu preset (`tg mini list`).

An experiment is a list of cells (`tg.experiments.cells`) run for several seeds; a training cell is evaluated at
several steps. Its rows live in `results/mini/<experiment>.csv` and the files beside it
(`tg.experiments.grid_files`); `tg.experiments.runner` runs the missing rows and `tg.experiments.measure` says what
a row holds.
"""

from __future__ import annotations

from tg.config import ConfigError
from tg.experiments import confirm
from tg.experiments.cells import (CHAIN4, LEDGER_SHAPES, REGIMES, SEEDS3, TREE221, Cell, train_cells,
                                  tree_shape)


def experiments() -> dict[str, list[Cell]]:
    """The named grids. `budget`: claims 2 and 6 at the paper's budget 4 (chain G=4 vs tree (2,2,1)),
    multi-hop in both regimes and single-hop; `ledger`: claim 1; `theory`: claim 7; multi-hop in both regimes,
    `ablation` (claim 4, Table 4: intra / inter / both at 3 and 7 leaves per tree), `shapes` (claim 5, Table 7
    at budget 4) and `sweep` (claim 3, Table 3: chain G vs tree (G/2, 2, 1) at budgets 2, 4, 8, 16); beyond the
    paper, `branching`: chain 4, chain 4 with step groups, tree (2,2,1) with random and with entropy-guided nodes."""
    pair = {"chain": CHAIN4, "tree": TREE221}
    # 5 seeds per training cell (results/mini/README.md, protocol: seeds)
    budget = (train_cells("moderate", "multi-hop", pair) + train_cells("hard", "multi-hop", pair)
              + train_cells("moderate", "single-hop", pair))
    ledger = [Cell(f"{regime}/({m},{n},{l})", "ledger", REGIMES[regime] + tree_shape(m, n, l),
                   seeds=SEEDS3, labels=dict(method="chain" if n == 0 else "tree"))
              for regime in REGIMES for m, n, l in LEDGER_SHAPES]
    theory = [Cell("toy-tree", "theory", seeds=tuple(range(20)))]
    # claims 3-5 (Tables 3, 4 and 7) from both starts: the hard start's cells were declared and run first
    # and the moderate start's were declared before any of them ran.
    # Cells whose configuration another grid ran (chain 4, (2,2,1), chain 8) are copied (`reuse_rows`).
    ablation, shapes, sweep = [], [], []
    for regime in ("hard", "moderate"):
        ablation += train_cells(regime, "multi-hop", {"chain": CHAIN4, "chain-8": tree_shape(8, 0, 0)})
        for adv in ("intra", "inter", "intra+inter"):
            ablation += train_cells(regime, "multi-hop", {f"{adv} (2,2,1)": TREE221,
                                                           f"{adv} (2,6,1)": tree_shape(2, 6, 1)}, advantage=adv, start=False)
        shapes += train_cells(regime, "multi-hop", {f"({m},{n},{l})": tree_shape(m, n, l)
                                                     for m, n, l in [(4, 0, 0), (2, 2, 1), (2, 1, 2), (1, 5, 1)]})
        sweep += train_cells(regime, "multi-hop", {f"chain-{g}": tree_shape(g, 0, 0) for g in (2, 4, 8, 16)})
        sweep += train_cells(regime, "multi-hop", {f"tree ({m},{n},{l})": tree_shape(m, n, l)
                                                    for m, n, l in [(1, 2, 1), (2, 2, 1), (4, 2, 1), (8, 2, 1)]}, start=False)
    # beyond the paper (results/mini/README.md, protocol): where to branch at equal budget;
    # chain and tree are the budget grid's runs (copied)
    branching = []
    for regime in ("hard", "moderate"):
        branching += train_cells(regime, "multi-hop", {"chain": CHAIN4, "chain+steps": CHAIN4 + ("optim.step_groups=1.0",),
                                                        "tree": TREE221, "tree-entropy": TREE221 + ("tree.node_rule=entropy",)})
    return {"budget": budget, "ledger": ledger, "theory": theory, "ablation": ablation, "shapes": shapes,
            "sweep": sweep, "branching": branching, confirm.GRID: confirm.cells()}


def select_cells(name: str, wanted: list[str] | None = None) -> list[Cell]:
    """The cells of experiment `name`, or (with `wanted`) only those named: a full name or its last parts
    ("chain-16" in both starts, "moderate/chain-16" in one), so a long grid can run in pieces of whole cells."""
    grids = experiments()
    if name not in grids:
        raise ConfigError(f"unknown experiment {name!r}; choose one of {sorted(grids)}")
    if not wanted:
        return grids[name]
    def named(cell: Cell, w: str) -> bool:
        return cell.name == w or cell.name.endswith("/" + w)
    unknown = [w for w in wanted if not any(named(c, w) for c in grids[name])]
    if unknown:
        raise ConfigError(f"--cell {unknown[0]!r} is not a cell of {name}; its cells: "
                          f"{', '.join(repr(c.name) for c in grids[name])}")
    return [c for c in grids[name] if any(named(c, w) for w in wanted)]


def describe(name: str | None = None) -> str:
    """The cells of one experiment (or all): name, kind, seeds, evaluation points, config overrides."""
    grids = experiments()
    lines = []
    for exp in [name] if name in grids else grids:
        lines.append(f"[{exp}]")
        for c in grids[exp]:
            pts = ",".join(map(str, c.points)) if c.kind == "train" else "-"
            stage = f"stage {c.labels['stage']:<10}" if "stage" in c.labels else ""
            lines.append(f"  {c.name:<36}{c.kind:<7} seeds {len(c.seeds):>2}  steps {pts:<6} {stage}{' '.join(c.overrides)}")
    return "\n".join(lines)
