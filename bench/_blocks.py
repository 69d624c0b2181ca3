"""The one writer of bench/README.md's generated tables: each bench script with `--write FILE` replaces the text
between its own pair of markers (`<!-- NAME:begin -->` ... `<!-- NAME:end -->`), or appends the pair."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from tg.trainer import METRICS, TIMERS


def write_section(path: Path, name: str, table: str) -> None:
    """Replace (or append) the text between block `name`'s markers in `path`; other blocks are left alone."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{table}\n{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text += ("\n" if text else "") + block + "\n"
    path.write_text(text)


def step_medians(rows: Sequence[dict]) -> dict[str, float]:
    """Medians over training steps' metric rows of each of the trainer's timers and of their sum (`step_s`)."""
    med = {p: statistics.median(r[p] for r in rows) for p in TIMERS}
    med["step_s"] = statistics.median(sum(r[p] for p in TIMERS) for r in rows)
    return med


def same_metrics(a: Sequence[dict], b: Sequence[dict]) -> bool:
    """Whether two runs' per-step rows log the same steps and every metric but the timers equal to the last bit."""
    keys = [k for k in METRICS if k not in TIMERS and a and k in a[0]]
    return len(a) == len(b) and all({k: x[k] for k in keys} == {k: y[k] for k in keys} for x, y in zip(a, b))


def timer_table(medians: dict[str, dict[str, float]], base: str) -> list[str]:
    """Markdown rows: each timer and `step_s` for every setting, then every other setting's ratio to `base`."""
    others = [n for n in medians if n != base]
    lines = [f"| part | {' | '.join(medians)} | {' | '.join(f'{n} / {base}' for n in others)} |",
             "|---" * (1 + len(medians) + len(others)) + "|"]
    for part in (*TIMERS, "step_s"):
        cells = [f"{m[part]:.2f} s" for m in medians.values()] + [f"{medians[n][part] / medians[base][part]:.2f}x"
                                                                   for n in others]
        lines.append(f"| {part} | {' | '.join(cells)} |")
    return lines
