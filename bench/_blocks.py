"""The one writer of bench/README.md's generated tables: each bench script with `--write FILE` replaces the text
between its own pair of markers (`<!-- NAME:begin -->` ... `<!-- NAME:end -->`), or appends the pair."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tg.metrics import METRICS, TIMERS


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


def publish(lines: Sequence[str], path: str | None, name: str) -> None:
    """Print a bench's table and, with `--write PATH`, replace its block `name` in that markdown file."""
    print("\n".join(lines))
    if path:
        write_section(Path(path), name, "\n".join(lines))


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


def step_rows(shape: tuple[int, int, int], share_prefix: bool = True) -> tuple[Any, Any]:
    """A cpu-preset trainer at tree shape (M, N, L) after one step (16 multi-hop questions), and the training rows
    that step's update took: fixed rows to time the update on."""
    import tempfile

    from tg.config import load_config
    from tg.pipeline import build_run
    cfg = load_config("cpu").replace(tree=dict(M=shape[0], N=shape[1], L=shape[2]), optim=dict(steps=1))
    tr = build_run(cfg, tempfile.mkdtemp(prefix="tg-bench-")).trainer
    tr.share_prefix = share_prefix
    seen: list[Any] = []
    update = tr.update
    tr.update = lambda rows: seen.append(rows) or update(rows)
    tr.step()
    return tr, seen[0]


def alternating_medians(runs: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Each run `reps` times, the order reversed every other repetition; median seconds after the first."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(reps):
        for name in (list(runs) if rep % 2 else list(runs)[::-1]):
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def two_ways_main(script: str, doc: str, before: str, after: str,
                  timings: Callable[[tuple[int, int, int], int], dict[str, float]],
                  extra: Sequence[tuple[str, Callable[[dict[str, float]], str]]] = ()) -> None:
    """The command line of a bench that times the update and the reference forward two ways, `before` and `after`,
    on one step's rows per tree shape (`timings(shape, reps)` returns 'update, <way>' and 'reference, <way>'
    medians): --shapes, --reps, --write; a table of both ways, their ratios and the `extra` columns."""
    import argparse

    import torch
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4,0,0", "2,2,1", "8,2,1"], help="tree shapes M,N,L")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--write", default=None, help=f"replace the {script} section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    heads = [f"{part}, {way}" for part in ("update", "reference") for way in (before, after)]
    lines = [f"`bench/{script}.py --reps {args.reps}`: medians of {args.reps - 1} repetitions (the first dropped), "
             "one step's micro-batches, one torch thread.", "",
             "| (M,N,L) | " + " | ".join(heads[:2] + ["ratio"] + heads[2:] + ["ratio"] + [h for h, _ in extra]) + " |",
             "|---" * (7 + len(extra)) + "|"]
    for s in args.shapes:
        m = timings(tuple(int(x) for x in s.split(",")), args.reps)  # type: ignore[arg-type]
        cells = []
        for part in ("update", "reference"):
            a, b = m[f"{part}, {before}"], m[f"{part}, {after}"]
            cells += [f"{a:.2f} s", f"{b:.2f} s", f"{b / a:.2f}x"]
        lines.append(f"| ({s}) | " + " | ".join(cells + [f(m) for _, f in extra]) + " |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.write:
        write_section(Path(args.write), script, "\n".join(lines))
