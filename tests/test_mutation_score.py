"""scripts/mutation_score.py: equivalent mutants matched by their changed lines, and every recorded entry still
names lines of the current source (checked here without a mutation run)."""

import importlib.util
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_score", ROOT / "scripts" / "mutation_score.py")
score = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(score)


def _function_source(dotted: str) -> str:
    """The source of tg.MODULE.FUNCTION (or tg.MODULE.CLASS.METHOD), its lines whitespace-normalised."""
    module, _, name = dotted.removeprefix("tg.").partition(".")
    obj = importlib.import_module(f"tg.{module}")
    for part in name.split("."):
        obj = getattr(obj, part)
    return score._lines(inspect.getsource(obj))


def test_every_equivalent_entry_names_lines_of_its_function():
    """A `before` that no longer occurs in its function would match no mutant: caught here, before a 15-minute run."""
    changes = score.equivalent_changes(ROOT / score.EQUIVALENT)
    assert len(changes) == len(set(changes)) > 0
    for function, before, after in changes:
        source = _function_source(function)
        assert f"\n{before}\n" in f"\n{source}\n", f"{function}: {before!r} are not whole lines of its source"
        assert after != before


def test_a_mutant_matches_its_entry_by_content_whatever_its_number_and_spacing(tmp_path, monkeypatch):
    """mutmut's mutated copy holds the original and each mutant of a function; the change is their differing lines."""
    (tmp_path / "mutants" / "tg").mkdir(parents=True)
    body = "    y = x + {}    # the step\n    return y\n"
    (tmp_path / "mutants" / "tg" / "toy.py").write_text(
        "def x_f__mutmut_orig(x):\n" + body.format(1) + "\n\ndef x_f__mutmut_7(x):\n" + body.format(2))
    (tmp_path / "eq.toml").write_text('[[equivalent]]\nfunction = "tg.toy.f"\nbefore = "y  =  x + 1 # the step"\n'
                                      'after = "y = x + 2 # the step"\nwhy = "Any step."\n')
    monkeypatch.chdir(tmp_path)
    change = score.mutant_change("tg.toy.x_f__mutmut_7", "toy")
    assert change == ("tg.toy.f", "y = x + 1 # the step", "y = x + 2 # the step")
    assert score.equivalent_changes(tmp_path / "eq.toml") == [change]


def test_an_entry_without_its_reason_is_refused(tmp_path):
    (tmp_path / "eq.toml").write_text('[[equivalent]]\nfunction = "tg.toy.f"\nbefore = "a"\nafter = "b"\n')
    with pytest.raises(SystemExit, match="entry 1 \\(tg.toy.f\\) needs exactly the text fields function, before, "
                                         "after, why"):
        score.equivalent_changes(tmp_path / "eq.toml")
