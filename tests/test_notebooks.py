"""Notebook rules that a test can say (STYLE.md 7-11; the notebooks themselves run under nbmake).

- outputs are stripped in git;
- code cells never define a function or class whose name exists in `tg`, nor a function longer
  than ~10 lines (the paper's logic lives in `tg`, notebooks call it);
- notebooks never branch on the preset (the config comes from `tg.config.load_config`);
- each opens with title, what you will learn, run time and the paper section, and ends with an
  exercise checked by a cell.
"""

import ast
import json
import pkgutil
from pathlib import Path

import pytest

import tg

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
MAX_FUNCTION_LINES = 10


def _tg_names() -> set[str]:
    names: set[str] = set()
    for mod in pkgutil.iter_modules(tg.__path__):
        source = Path(tg.__path__[0], f"{mod.name}.py")
        if source.exists():
            tree = ast.parse(source.read_text())
            names |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return {n for n in names if not n.startswith("_")}


def _cells(path: Path, kind: str = "code") -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no .ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_stripped(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and (c.get("outputs") or
                                                                                c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_tg_logic_defined_inline(path):
    names = _tg_names()
    for source in _cells(path):
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                assert node.name not in names, f"{path.name} redefines tg's `{node.name}`: import it from tg"
            if isinstance(node, ast.FunctionDef):
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, f"{path.name}: `{node.name}` is {length} lines; move it into tg"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_preset_branching_and_config_printed(path):
    code = "\n".join(_cells(path))
    assert "TG_PRESET" not in code and "cfg.preset ==" not in code and ".preset ==" not in code
    assert "load_config(" in code and "print(cfg)" in code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_opening_and_exercise(path):
    first = _cells(path, "markdown")[0].lower()
    for needed in ("# ", "you will learn", "run time", "paper"):
        assert needed in first, f"{path.name}: the first cell lacks '{needed}'"
    md = "\n".join(_cells(path, "markdown")).lower()
    assert "exercise" in md, f"{path.name}: no exercise"
    assert "assert" in _cells(path)[-1], f"{path.name}: the last code cell should check the exercise"
    asserts = sum("assert " in c for c in _cells(path))
    assert asserts >= 3, f"{path.name}: only {asserts} cells assert an invariant"
