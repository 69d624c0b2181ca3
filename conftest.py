"""Test-run settings for every pytest call from the repository root (unit tests and notebooks).

TG_SOLUTIONS=1 lets the notebooks' exercise checks fill a blank answer from notebooks/solutions.py
(`tg.experiments.lesson.exercise`); notebook kernels inherit it from this process.
"""

import os

os.environ.setdefault("TG_SOLUTIONS", "1")

LONGEST_FIRST = ("tests/test_smol.py", "tests/test_learning.py", "tests/test_trainer.py",
                 "notebooks/05_training_chain_vs_tree.ipynb", "tests/test_warmup.py", "tests/test_trl.py",
                 "tests/test_distributed.py", "tests/test_mini.py", "notebooks/06_reproduce_qwen2.5_1.5b.ipynb",
                 "notebooks/04_budget_tradeoffs.ipynb")
"""The files that take longest in `make test` (SmolLM2's training and token checks, then about 200, 120, 100, 90,
80, 70, 60, 40 and 40 s on 2 cores), handed to the two workers first (with `--no-loadscope-reorder`), so that
neither finishes a long file alone at the end. tests/test_smol.py, the first, converts SmolLM2 into the cache
on a fresh clone, before the other files that load it (test_trl.py, notebook 06) start."""


def pytest_collection_modifyitems(items):
    first = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))
