"""The kit's one progress bar: tqdm's notebook widget where ipywidgets is installed, its text bar otherwise.

In a notebook kernel without ipywidgets (`jupyter nbconvert --execute`, VS Code), `tqdm.auto` falls back to
the text bar by itself but first warns on stderr ("IProgress not found"). Importing it once here, with exactly
that warning ignored, keeps a lesson's output free of stderr for every later import of `tqdm.auto`, tg's and
its libraries' (transformers, huggingface_hub); `tg/__init__.py` imports this module first for that reason.
`make lab` installs ipywidgets, so JupyterLab shows the widget.
"""

import warnings

from tqdm.std import TqdmWarning

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)
    from tqdm.auto import tqdm

__all__ = ["tqdm"]
