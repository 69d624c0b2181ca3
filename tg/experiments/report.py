"""The generated parts of README.md and results/mini/README.md (`tg mini report --readme`).

Each file holds its generated text between two markers, `<!-- BEGIN name (tg mini report --readme) -->` and
`<!-- END name -->`; `write_readmes` replaces what lies between them by what the CSVs under results/mini/ give
now, so no number in those tables is typed by hand, and a test checks that the committed text is what the
committed CSVs give.
"""

from __future__ import annotations

from pathlib import Path

from tg.config import ConfigError
from tg.experiments import confirm, confirm_report
from tg.experiments.claims import branching_table, claims_report, load_frames
from tg.experiments.summary import cost_table, demo_table, load_steps, report
from tg.store.files import atomic_write_text

GRIDS: dict[str, str] = {
    "ledger": "Claim 1: what a budget buys (`ledger.csv`, `figures/fig_mini_ledger.png`). One batch of rollouts "
              "per (start, shape, seed), the trainer's step-0 sampling on the first 16 multi-hop training "
              "questions, means over seeds. \"x\" columns are ratios to the chain of the same budget (for (6,3,1) "
              "and (4,5,1) the chain of 16).",
    "budget": "Claims 2 and 6: chain 4 against tree (2,2,1) (`budget.csv`, `figures/fig_mini_budget.png`). EM of "
              "the setting's own test questions; tree − chain paired by seed (± standard error); the seeds where "
              "the tree is ahead; searches per test question.",
    "sweep": "Claim 3: chain G against tree (G/2,2,1) at budgets 2, 4, 8, 16 (`sweep.csv`, "
             "`figures/fig_mini_sweep.png`), each tree paired by seed with the chain of its budget, and the tree "
             "at 4 with the chain at 16.",
    "ablation": "Claim 4: intra-tree, inter-tree and both advantages at (2,2,1) (3 leaves per tree, budget 4) and "
                "(2,6,1) (7 leaves, budget 8), against chain 4 (`ablation.csv`, `figures/fig_table4_ablation.png`).",
    "shapes": "Claim 5: Table 7's budget-4 shapes against chain 4 (`shapes.csv`, `figures/fig_table7_shapes.png`).",
    "theory": "Claim 7: Proposition 3.1 on random toy trees with log-linear policies in float64 (`theory.csv`, "
              "`figures/fig_mini_theory.png`): autograd's gradients of intra-tree GRPO and step-level DPO against "
              "the closed forms.",
    "branching": "Beyond the paper: chain 4, chain 4 with step groups, tree (2,2,1) with random nodes and with "
                 "entropy-guided nodes, at equal budget (`branching.csv`, `figures/fig_mini_branching.png`); each "
                 "cell paired by seed with the one it adds to (its verdicts are the table above this list).",
}
"""The grids of the full report, in the claims' order, with what each table shows (no numbers: those are data)."""


def grid_report(name: str, root: str | Path | None = None) -> str:
    """One experiment's report (`tg mini report NAME`): the confirmatory grid's verdict by its declared rule, any
    other grid's table."""
    return confirm_report.report(root) if name == confirm.GRID else report(name, root)


def full_report(root: str | Path | None = None) -> str:
    """The claims table, then every grid's table, then the training cost (results/mini/README.md's report)."""
    parts = ["### The claims table", claims_report(root),
             "### Claim 2 on fresh seeds: the confirmatory experiment",
             "Declared before its first row ([confirm.md](confirm.md)); `figures/fig_mini_confirm.png`.",
             confirm_report.report(root),
             "### Beyond the paper: where to branch", branching_table(load_frames(root))]
    for name, caption in GRIDS.items():
        try:
            table = report(name, root)
        except ConfigError:  # a grid not run yet: say so (no path: the text is the same in every checkout)
            table = f"not run yet: `tg mini run {name}` writes results/mini/{name}.csv"
        parts += [f"### {name}", caption, table]
    parts += ["### Training cost", "Step time of the runs each grid trained itself (copied cells count where they "
              "ran), as logged by the runs on a 2-core host, two workers at a time, and the workers' wall time for "
              "every row a grid made (loading, steps, checkpoint writes, evaluations). Both include any time a run "
              "shared the cores with other jobs.", cost_table(load_frames(root), load_steps(root))]
    return "\n\n".join(parts)


def blocks(root: str | Path | None = None) -> dict[Path, list[tuple[str, str]]]:
    """Each generated file under `root` (default: this checkout) -> its blocks (name, text): the README's short
    claims table and, where `make demo` (`tg demo --preset smol`) has written results/demo.csv (demo_smol.csv), its
    table; results/mini's full report."""
    from tg.agent.world import resolve
    base = Path(root) if root else resolve(".")
    readme = [("claims", claims_report(root, short=True) + "\n\n" + confirm_line(root))]
    for name in ("demo", "demo_smol"):   # `make demo` and `tg demo --preset smol` (tg.experiments.demo.outputs)
        if (base / "results" / f"{name}.csv").exists():
            readme.append((name, demo_table(base / "results" / f"{name}.csv")))
    return {base / "README.md": readme, base / "results" / "mini" / "README.md": [("report", full_report(root))]}


def confirm_line(root: str | Path | None = None) -> str:
    """The README's line on claim 2's confirmatory experiment: its verdict sentence and its secondaries."""
    rows = confirm_report.load(root)
    secondaries = confirm.secondary_results(rows) if rows is not None else []
    held = [s for s in secondaries if s.verdict == "holds"]
    tested = any(s.test for s in secondaries)
    decided = rows is not None and confirm.primary_verdict(rows) in ("refuted", "inconclusive")
    second = (f"{len(held)} of 6 secondaries hold" + (f" ({', '.join(s.name for s in held)})" if held else "")
              if tested else "the secondaries are not tested: the rule tests them only if it holds" if decided
              else "secondaries tested only once it holds")
    return (f"Claim 2 on fresh seeds, declared before its first row ([results/mini/confirm.md](results/mini/confirm.md)):"
            f" **{confirm_report.sentence(root, rows)}**; {second}.")


def markers(name: str) -> tuple[str, str]:
    """The lines that open and close generated block `name` in a README."""
    return f"<!-- BEGIN {name} (tg mini report --readme) -->", f"<!-- END {name} -->"


def replace_block(text: str, name: str, block: str) -> str:
    """`text` with what lies between block `name`'s markers replaced by `block` (ConfigError when a marker is
    missing or out of order)."""
    begin, end = markers(name)
    head, found, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise ConfigError(f"no {begin} ... {end} block to write the generated text into")
    return f"{head}{begin}\n{block}\n{end}{tail}"


def write_readmes(root: str | Path | None = None) -> list[Path]:
    """Regenerate every block in place (atomic writes); returns the files written."""
    texts = {}
    for path, made in blocks(root).items():
        if not path.is_file():
            raise ConfigError(f"{path} does not exist: --readme rewrites the generated blocks of a checkout's README.md "
                              "and results/mini/README.md; point --root at a checkout, or leave --readme out to print "
                              "the report")
        text = path.read_text()
        for name, block in made:
            text = replace_block(text, name, block)
        texts[path] = text
    for path, text in texts.items():  # every file's markers are checked before any file is written
        atomic_write_text(path, text)
    return list(texts)
