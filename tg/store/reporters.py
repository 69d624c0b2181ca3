"""Training metrics for the ecosystem's viewers: `tg train --report-to tensorboard` (TRL's `report_to`).

Each step's row of the metrics glossary (`tg.metrics.METRICS`) goes to RUN_DIR/tensorboard as scalars
`train/<name>` at that step, beside RUN_DIR/metrics.jsonl (which stays the record the kit reads). View it with
`tensorboard --logdir runs` (docs/cli.md#tensorboard).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tg.config import ConfigError
from tg.metrics import METRICS

REPORT_TO = ("none", "tensorboard")
TENSORBOARD_DIR = "tensorboard"


def tensorboard(run_dir: str | Path) -> Callable[[dict], None]:
    """A reporter writing a metrics row's glossary scalars to RUN_DIR/tensorboard (flushed every step)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ConfigError(f"--report-to tensorboard needs the tensorboard package ({err}): pip install tensorboard")
    writer = SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR))

    def report(row: dict) -> None:
        for name in METRICS:
            if name != "step" and isinstance(row.get(name), (int, float)):
                writer.add_scalar(f"train/{name}", row[name], row["step"])
        writer.flush()
    return report


def reporters(names: list[str] | tuple[str, ...], run_dir: str | Path) -> list[Callable[[dict], None]]:
    """The reporters `--report-to` names ('none' or 'tensorboard')."""
    return [tensorboard(run_dir)] if "tensorboard" in names else []
