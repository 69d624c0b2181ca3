"""`python -m figures [NAME ...] [--root DIR]` (or `make figures`): redraw the named figures (all by default)
from the data under results/."""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

from figures import SCRIPTS, _common as c


def main(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(prog="python -m figures", description=__doc__)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"figure scripts to run (default: all): {', '.join(SCRIPTS)}")
    p.add_argument("--root", type=Path, default=c.ROOT, help="repository root holding results/ (default: this repo)")
    args = p.parse_args(argv)
    if set(args.names) - set(SCRIPTS):
        p.error(f"unknown figure(s) {sorted(set(args.names) - set(SCRIPTS))}; known: {', '.join(SCRIPTS)}")
    root = args.root.resolve()
    paths = []
    for name in args.names or SCRIPTS:
        t0 = time.perf_counter()
        script = importlib.import_module(f"figures.{name}")
        paths.append(c.save(script.draw(root), root, script.NAME))
        print(f"{paths[-1]}  ({time.perf_counter() - t0:.1f} s)")
    return paths


if __name__ == "__main__":
    main()
