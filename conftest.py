"""Test-run settings for every pytest call from the repository root (unit tests and notebooks).

TG_SOLUTIONS=1 lets the notebooks' exercise checks fill a blank answer from notebooks/solutions.py
(`tg.experiments.lesson.exercise`); notebook kernels inherit it from this process.
"""

import os

os.environ.setdefault("TG_SOLUTIONS", "1")
