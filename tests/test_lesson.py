"""tg.experiments.lesson: the exercise self-check (blank -> NotAnswered, or the solution under TG_SOLUTIONS=1)
and set-up."""

import os

import pytest

import tg.experiments.lesson as lesson
from tg.experiments.lesson import NotAnswered, exercise


@pytest.fixture
def solutions(tmp_path, monkeypatch):
    path = tmp_path / "solutions.py"
    path.write_text("SOLUTIONS = {'one': 3, 'two': (1, 2), 'of-cfg': lambda width: 2 * width}\n")
    monkeypatch.setattr(lesson, "SOLUTIONS_FILE", str(path))


def test_answers_pass_through(solutions, monkeypatch):
    monkeypatch.delenv(lesson.SOLUTIONS_ENV, raising=False)
    assert exercise("one", 5) == 5
    assert exercise("two", 7, 8) == (7, 8)


def test_a_blank_stops_the_student_without_the_answer(solutions, monkeypatch):
    monkeypatch.delenv(lesson.SOLUTIONS_ENV, raising=False)
    with pytest.raises(NotAnswered, match="not answered yet") as err:
        exercise("one", ...)
    assert "3" not in str(err.value) and err.value._render_traceback_() == [f"NotAnswered: {err.value}"]


def test_the_test_runner_fills_blanks_from_the_solutions(solutions, monkeypatch):
    monkeypatch.setenv(lesson.SOLUTIONS_ENV, "1")
    assert exercise("one", ...) == 3
    assert exercise("two", ..., 9) == (1, 9)              # a given answer is kept
    assert exercise("of-cfg", ..., width=4) == 8         # a solution may depend on the notebook's inputs
    with pytest.raises(KeyError, match="no solution"):
        exercise("missing", ...)
    with pytest.raises(ValueError, match="2 answers"):
        exercise("two", ..., ..., ...)


def test_the_repository_runs_notebooks_with_solutions():
    assert os.environ.get(lesson.SOLUTIONS_ENV) == "1"   # set by the root conftest.py for every pytest call


def test_setup_without_policy_gives_the_config_only(capsys):
    lab = lesson.setup("cpu", policy=False, threads=None)
    assert lab.cfg.preset == "cpu" and lab.res is None and lab.model is None
    assert capsys.readouterr().out.startswith(str(lab.cfg).splitlines()[0])   # the config is printed first
    a, b = lab.rollout_kw(), lab.rollout_kw()
    assert a["rng"] is not b["rng"] and a["rng"].random() == b["rng"].random()   # a fresh rng, the same seed
    assert a["node_rule"] == lab.cfg.tree.node_rule and a["sampling"] == lab.sampling
