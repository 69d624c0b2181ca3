"""The rules a notebook keeps that a test can check (the notebooks themselves run under nbmake).

- outputs are stripped in git;
- code cells call `tg`: they never define a function or class whose name exists in `tg`, nor a
  function longer than ~10 lines;
- the first code cell sets up with `tg.experiments.lesson.setup(...)`, which prints the config first; no cell
  branches on the preset;
- each opens with title, what you will learn, run time and the paper section, has equations in
  LaTeX, asserts what it shows, and has exercises that ship blank (`...`, or a function whose body is
  `...` for a build-it-yourself exercise), checked by `tg.experiments.lesson.exercise` against
  notebooks/solutions.py;
- every lesson opens with what you need first and closes with takeaways and variations to try (only a
  "Going further" part of engineering asides may follow them), and each prediction (`my_guess_...`) is
  compared with its measurement by `versus`;
- headers and the notebooks' README describe the present: no dates, commit ids or working notes;
  links into docs/ point at files (and headings) that exist;
- a bare `pytest --nbmake` collects all the notebooks.
"""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tg

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
README = ROOT / "notebooks" / "README.md"
MAX_FUNCTION_LINES = 10
MAX_LINE = 120
STALE = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a working-note file": re.compile(r"PAPER\.md|NOTES\.md|STYLE\.md|\.\./shared|shared/"),
    "an issue or session": re.compile(r"\bissue \d+|\bsessions?\b", re.I),
    "a commit id": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
}


def _tg_names() -> set[str]:
    names: set[str] = set()
    for source in Path(tg.__path__[0]).rglob("*.py"):
        tree = ast.parse(source.read_text())
        names |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return {n for n in names if not n.startswith("_")}


def _cells(path: Path, kind: str = "code") -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def _code_tree(path: Path) -> ast.Module:
    lines = [line for c in _cells(path) for line in c.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def _solutions() -> dict:
    spec = importlib.util.spec_from_file_location("notebook_solutions", ROOT / "notebooks" / "solutions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SOLUTIONS


def _blank_names(path: Path) -> set[str]:
    """Names assigned `...`, and functions whose body is only a docstring and `...` (build it yourself)."""
    tree = _code_tree(path)
    names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and isinstance(n.value, ast.Constant) and n.value.value is ... for t in n.targets}
    for f in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        body = [b for b in f.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                                          and isinstance(b.value.value, str))]
        if [ast.unparse(b) for b in body] == ["..."]:
            names.add(f.name)
    return names


def _exercise_calls(path: Path) -> list[ast.Call]:
    calls = [n for n in ast.walk(_code_tree(path)) if isinstance(n, ast.Call)]
    return [c for c in calls if getattr(c.func, "id", "") == "exercise"]


def test_there_are_seven_notebooks():
    assert [p.name[:3] for p in NOTEBOOKS] == [f"0{i}_" for i in range(1, 8)], [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_stripped(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and (c.get("outputs") or
                                                                                c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit(path):
    long = [line for cell in _cells(path) for line in cell.splitlines() if len(line) > MAX_LINE]
    assert not long, f"{path.name}: {len(long)} code lines over {MAX_LINE} characters, e.g. {long[0]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_tg_logic_defined_inline(path):
    names = _tg_names()
    for node in ast.walk(_code_tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assert node.name not in names, f"{path.name} redefines tg's `{node.name}`: import it from tg"
        if isinstance(node, ast.FunctionDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{path.name}: `{node.name}` is {length} lines; move it into tg"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_set_up_in_one_call_and_no_preset_branching(path):
    first = _cells(path)[0]
    assert re.search(r"^\w+ = setup\(", first, re.M), \
        f"{path.name}: the first code cell should call tg.experiments.lesson.setup"
    assert "verbose=False" not in first, f"{path.name}: setup() prints the config first; keep verbose on"
    code = "\n".join(_cells(path))
    assert "TG_PRESET" not in code and ".preset ==" not in code and "load_config()" not in code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_opening_latex_and_asserts(path):
    first = _cells(path, "markdown")[0].lower()
    for needed in ("# ", "you will learn", "run time", "paper"):
        assert needed in first, f"{path.name}: the first cell lacks '{needed}'"
    assert "$" in "\n".join(_cells(path, "markdown")), f"{path.name}: no equation in LaTeX ($...$)"
    asserts = sum("assert " in c for c in _cells(path))
    assert asserts >= 4, f"{path.name}: only {asserts} cells assert an invariant"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercise_ships_blank_and_has_a_solution(path):
    md = "\n".join(_cells(path, "markdown")).lower()
    assert "## exercise" in md, f"{path.name}: no exercise section"
    calls = _exercise_calls(path)
    assert calls, f"{path.name}: no `exercise(...)` self-check"
    assert any("exercise(" in c and ("assert" in c or "check_" in c) for c in _cells(path)), \
        f"{path.name}: a code cell should check the exercise"
    blanks = _blank_names(path)
    solutions = _solutions()
    for call in calls:
        key = call.args[0].value
        assert key in solutions, f"{path.name}: notebooks/solutions.py has no solution for {key!r}"
        for arg in call.args[1:]:
            assert isinstance(arg, ast.Name) and arg.id in blanks, \
                f"{path.name}: exercise {key!r}: `{ast.unparse(arg)}` should ship blank (`{ast.unparse(arg)} = ...`)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_lesson_says_what_it_needs_and_ends_with_takeaways(path):
    md = _cells(path, "markdown")
    assert "**you need first" in md[0].lower(), f"{path.name}: the first cell should say what you need first"
    closing = [k for k, cell in enumerate(md) if "## Takeaways" in cell]
    assert closing and "## Try next" in md[closing[-1]], f"{path.name}: close with Takeaways and Try next"
    end = md[closing[-1]]
    assert all(cell.lstrip().startswith("## Going further") for cell in md[closing[-1] + 1:]), \
        f"{path.name}: only a 'Going further' part may follow the takeaways"
    takeaways = end.split("## Takeaways")[1].split("## Try next")[0]
    assert 3 <= takeaways.count("\n- ") <= 5, f"{path.name}: three to five takeaways"
    assert 2 <= end.split("## Try next")[1].count("\n- ") <= 3 and "`" in end.split("## Try next")[1]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_build_it_yourself_exercise_or_a_prediction_is_checked(path):
    code = "\n".join(_cells(path))
    guesses = re.findall(r"^(my_guess_\w+) = \.\.\.", code, re.M)
    for g in guesses:
        assert re.search(rf"versus\({g}\b", code), f"{path.name}: the prediction {g} is never compared"
    if path.name[:2] in ("02", "03"):
        assert guesses, f"{path.name}: predict before the key measurement (`my_guess_... = ...`, then `versus`)"
        assert any(b.startswith("my_") and b in {f.name for f in ast.walk(_code_tree(path))
                                                  if isinstance(f, ast.FunctionDef)} for b in _blank_names(path))


def test_every_solution_belongs_to_an_exercise():
    keys = {c.args[0].value for p in NOTEBOOKS for c in _exercise_calls(p)}
    assert set(_solutions()) == keys


@pytest.mark.parametrize("path", [*NOTEBOOKS, README], ids=lambda p: p.name)
def test_text_describes_the_present(path):
    text = "\n".join(_cells(path, "markdown") + _cells(path)) if path.suffix == ".ipynb" else path.read_text()
    for what, pattern in STALE.items():
        hit = pattern.search(text)
        assert not hit, f"{path.name} names {what}: {hit.group()!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_links_into_the_repository_exist(path):
    for target, anchor in re.findall(r"\]\((\.\./[^)#\s]+)(#[^)\s]*)?\)", "\n".join(_cells(path, "markdown"))):
        file = (path.parent / target).resolve()
        if target.startswith("../docs/") and not file.exists():
            pytest.skip(f"{target} is not in this checkout")
        assert file.exists(), f"{path.name} links to {target}, which does not exist"
        if anchor and file.suffix == ".md":
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
            assert anchor[1:] in slugs, f"{path.name} links to {target}{anchor}: no such heading"


def test_bare_nbmake_collects_every_notebook():
    out = subprocess.run([sys.executable, "-m", "pytest", "--nbmake", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if line.endswith(".ipynb")}
    assert collected == {f"notebooks/{p.name}" for p in NOTEBOOKS}, out.stdout[-2000:]
    assert any(line.startswith("tests/") for line in out.stdout.splitlines()), "the unit tests are not collected"
