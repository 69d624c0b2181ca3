"""The vocabulary of a grid: a cell (a name, config overrides, seeds, evaluation points, labels), the two starting
regimes, tree shapes and the config of one (cell, seed).

The two starting regimes are declared here, before any result was seen (results/mini/README.md, protocol):
- `moderate`: the default warm-up (multi-hop demonstrations 30%, half of them stopping one hop early);
- `hard`: 95% of the multi-hop demonstrations stop one hop early, so the warmed-up policy rarely
  completes a multi-hop chain (criterion, checked before any RL run: greedy multi-hop EM <= 5% on the
  300 test questions), the regime of the paper's 1.5B multi-hop rows. The first choice, 90%, gave
  6.0% (moderate: 12.7%) and was replaced before anything was trained.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tg.config import Config, load_config


REGIMES: dict[str, tuple[str, ...]] = {"moderate": (), "hard": ("warmup.early_stop_share=0.95",)}
"""Config overrides of each starting regime (the warm-up's difficulty knob)."""


def tree_shape(M: int, N: int, L: int) -> tuple[str, ...]:
    """Config overrides of the (M, N, L) tree; a chain of group G is (G, 0, 0)."""
    return (f"tree.M={M}", f"tree.N={N}", f"tree.L={L}")


CHAIN4, TREE221 = tree_shape(4, 0, 0), tree_shape(2, 2, 1)
SEEDS5, SEEDS3 = (0, 1, 2, 3, 4), (0, 1, 2)
POINTS = (30, 60)
"""Evaluation steps of every training cell (60 = the cpu preset's optim.steps)."""


LEDGER_SHAPES = [(2, 0, 0), (1, 2, 1), (4, 0, 0), (2, 2, 1), (8, 0, 0), (4, 2, 1), (2, 6, 1), (16, 0, 0),
                 (8, 2, 1), (6, 3, 1), (4, 5, 1)]
"""Table 3's (M, N, L) shapes; a chain of group G is (G, 0, 0)."""


@dataclass(frozen=True)
class Cell:
    """One configuration of an experiment and what to do with it."""

    name: str
    kind: str
    """'train' (train, evaluate at `points`), 'start' (evaluate the starting policy), 'ledger' (sample
    rollouts, count the budget) or 'theory' (Proposition 3.1 on a toy tree)."""
    overrides: tuple[str, ...] = ()
    seeds: tuple[int, ...] = SEEDS5
    points: tuple[int, ...] = (0,)
    labels: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def start_cell(regime: str, setting: str) -> Cell:
    """The starting policy's evaluation (step 0) for one regime and setting."""
    return Cell(f"{setting}/{regime}/start", "start", REGIMES[regime] + (f"data.setting={setting}",), seeds=(0,),
                labels=dict(method="start"))


def train_cells(regime: str, setting: str, shapes: dict[str, tuple[str, ...]], advantage: str = "intra+inter",
                 seeds: tuple[int, ...] = SEEDS5, start: bool = True) -> list[Cell]:
    """One training cell per named shape (and, with `start`, the starting policy's evaluation)."""
    base = start_cell(regime, setting).overrides
    cells = [start_cell(regime, setting)] if start else []
    for method, shape in shapes.items():
        cells.append(Cell(f"{setting}/{regime}/{method}", "train", base + shape + (f"optim.advantage={advantage}",),
                          seeds=seeds, points=POINTS, labels=dict(method=method)))
    return cells


def cell_config(cell: Cell, seed: int, base: Config | None = None) -> Config:
    return (base or load_config("cpu")).with_overrides(*cell.overrides, f"optim.seed={seed}")


def regime_of(cell: Cell) -> str:
    """The starting regime whose overrides the cell carries (moderate: none)."""
    return next((r for r, o in REGIMES.items() if o and set(o) <= set(cell.overrides)), "moderate")
