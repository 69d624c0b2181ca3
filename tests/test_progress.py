"""The kit's progress bar in a notebook kernel without ipywidgets: the text bar, and no warning on stderr."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]

# A kernel as tqdm.auto detects one (ipykernel.zmqshell imported), with ipywidgets not importable.
KERNEL_WITHOUT_WIDGETS = """
import sys, types, warnings
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
sys.modules["ipywidgets"] = None
import IPython  # tqdm.autonotebook asks sys.modules["IPython"] for the shell
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import tg.evaluate, tg.trainer
print(sorted({f"{w.category.__name__}: {w.message}" for w in caught if "tqdm" in w.category.__module__}))
print(tg.trainer.tqdm.__module__, tg.evaluate.tqdm.__module__)
"""


def test_a_kernel_without_ipywidgets_gets_the_text_bar_and_no_tqdm_warning():
    out = subprocess.run([sys.executable, "-c", KERNEL_WITHOUT_WIDGETS], cwd=REPO, capture_output=True, text=True,
                         check=True)
    warned, modules = out.stdout.splitlines()
    assert warned == "[]", f"importing tg in a kernel without ipywidgets warned: {warned}"
    assert modules == "tqdm.asyncio tqdm.asyncio"   # tqdm.auto's text bar, not the widget of tqdm.notebook
    assert "Warning" not in out.stderr, out.stderr
