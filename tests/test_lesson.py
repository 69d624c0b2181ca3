"""tg.experiments.lesson and tg.experiments.exercises: the exercise self-check (blank -> NotAnswered, or the
solution under TG_SOLUTIONS=1), each exercise's check (the worked answer passes, a typical mistake fails with its
hint), predictions, and set-up."""

import os

import pytest
import torch

import tg.experiments.lesson as lesson
from tg.experiments import exercises
from tg.experiments.lesson import NotAnswered, NotYet, exercise, is_blank, near, solution, versus


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
    out = capsys.readouterr().out
    assert out.startswith(f"preset 'cpu', config {lab.cfg.hash()}") and "print(lab.cfg)" in out
    assert len(out.splitlines()) <= 6 and len(str(lab.cfg).splitlines()) > 50   # a summary; the config one call away
    a, b = lab.rollout_kw(), lab.rollout_kw()
    assert a["rng"] is not b["rng"] and a["rng"].random() == b["rng"].random()   # a fresh rng, the same seed
    assert a["node_rule"] == lab.cfg.tree.node_rule and a["sampling"] == lab.sampling


def test_setup_prints_six_lines_and_no_loading_bars(capsys):
    lab = lesson.setup("cpu")
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) <= 6 and lines[0].startswith("preset 'cpu'"), captured.out
    assert "pinned warmup-" in captured.out and "sha256 " in captured.out and "device cpu" in captured.out
    assert "Loading weights" not in captured.err + captured.out
    from transformers.utils import logging as hf_logging
    assert hf_logging.is_progress_bar_enabled()       # silenced while loading only
    assert lab.engine is not None and lab.model is not None


# Every exercise: the blank stops with "not answered yet", the worked answer passes, a typical mistake fails
# with the hint that names it.

def _blank_function(a, b, c):
    """The shipped template: a docstring and `...`."""
    ...


def test_a_function_whose_body_is_blank_counts_as_blank(monkeypatch):
    monkeypatch.delenv(lesson.SOLUTIONS_ENV, raising=False)
    assert is_blank(...) and is_blank(_blank_function) and is_blank(lambda x: ...)
    assert not is_blank(0) and not is_blank(lambda x: x) and not is_blank(print)
    with pytest.raises(NotAnswered, match="not answered yet"):
        exercise("03-tree-advantages", _blank_function)
    monkeypatch.setenv(lesson.SOLUTIONS_ENV, "1")
    assert exercise("03-tree-advantages", _blank_function).__name__ == "tree_advantages"   # the worked function


@pytest.mark.parametrize("key", ["01-f1", "02-tree-shape", "03-tree-advantages", "03-grpo-loss"])
def test_blank_stops_with_not_answered(key, monkeypatch):
    monkeypatch.delenv(lesson.SOLUTIONS_ENV, raising=False)
    blanks = (..., ..., ...) if key == "01-f1" else (_blank_function,)
    with pytest.raises(NotAnswered, match="not answered yet"):
        exercise(key, *blanks)


def test_f1_accepts_a_rounded_answer_and_names_the_normalising():
    assert "correct" in exercises.check_f1("The city of Paris, in Rome.", "Paris", *solution("01-f1"))
    assert "correct" in exercises.check_f1("The city of Paris, in Rome.", "Paris", 0.2, 1, 0.333)
    assert "correct" in exercises.check_f1("The city of Paris, in Rome.", "Paris", 0.2, 1, 0.33)
    with pytest.raises(NotYet, match="after.*normalising"):
        exercises.check_f1("The city of Paris, in Rome.", "Paris", 1 / 6, 1, 2 / 7)
    with pytest.raises(NotYet, match="not their mean"):
        exercises.check_f1("The city of Paris, in Rome.", "Paris", 0.2, 1, 0.6)


def test_tree_shape_solution_passes_and_the_printed_eq4_fails():
    assert "matches tg" in exercises.check_tree_shape(solution("02-tree-shape"))
    with pytest.raises(NotYet, match="drops a factor M"):
        exercises.check_tree_shape(lambda M, N, L: (1 + L * N, M * (1 + L * N), M + L * N / 2))
    with pytest.raises(NotYet, match="half a chain"):
        exercises.check_tree_shape(lambda M, N, L: (1 + L * N, M * (1 + L * N), M * (1 + L * N)))
    with pytest.raises(NotYet, match="1 \\+ L N, not 1 \\+ N"):
        exercises.check_tree_shape(lambda M, N, L: (1 + N, M * (1 + L * N), M * (1 + L * N / 2)))


def _normalised(rewards, keys, unbiased=True, eps=1e-6, singletons=True):
    """(R - mean) / (std + eps) per group; a group of one gets 0 unless `singletons` is False (then nan)."""
    out = torch.zeros_like(rewards)
    for k in set(keys):
        idx = [i for i, key in enumerate(keys) if key == k]
        if len(idx) > 1 or not singletons:
            out[idx] = (rewards[idx] - rewards[idx].mean()) / (rewards[idx].std(unbiased=unbiased) + eps)
    return out


def test_tree_advantages_solution_passes_and_typical_mistakes_get_their_hint():
    assert "matches tg" in exercises.check_tree_advantages(solution("03-tree-advantages"))
    trees = lambda p, t: list(zip(p.tolist(), t.tolist()))
    mistakes = {
        "population std": lambda r, t, p: _normalised(r, trees(p, t), False) + _normalised(r, p.tolist(), False),
        "intra-tree part alone": lambda r, t, p: _normalised(r, trees(p, t)),
        "inter-tree part alone": lambda r, t, p: _normalised(r, p.tolist()),
        "add eps to the std": lambda r, t, p: _normalised(r, trees(p, t), eps=0) + _normalised(r, p.tolist(), eps=0),
        "by \\(prompt, tree\\)": lambda r, t, p: _normalised(r, t.tolist()) + _normalised(r, p.tolist()),
    }
    for hint, wrong in mistakes.items():
        with pytest.raises(NotYet, match=hint):
            exercises.check_tree_advantages(wrong)


def test_tree_advantages_rejects_nan_on_chains_and_shows_the_smallest_case():
    trees = lambda p, t: list(zip(p.tolist(), t.tolist()))
    with pytest.warns(UserWarning, match="degrees of freedom"):   # torch.std of one value
        with pytest.raises(NotYet, match="tree of one leaf.*rewards \\[[^,]*\\], .*you gave \\[nan\\], tg gives \\[0.0\\]"):
            exercises.check_tree_advantages(lambda r, t, p: _normalised(r, trees(p, t), singletons=False)
                                            + _normalised(r, p.tolist(), singletons=False))


def test_right_advantages_pass_in_float32_and_a_wrong_shape_is_named():
    worked = solution("03-tree-advantages")
    assert "matches tg" in exercises.check_tree_advantages(lambda r, t, p: worked(r, t, p).float())
    with pytest.raises(NotYet, match="one advantage per leaf: shape \\[1\\], you gave shape \\[1, 1\\]"):
        exercises.check_tree_advantages(lambda r, t, p: worked(r, t, p)[:, None])


def _constant(rewards, tree_ids, prompt_ids):
    return torch.zeros_like(rewards)


def test_a_constant_function_is_a_wrong_answer_not_a_blank(monkeypatch):
    monkeypatch.delenv(lesson.SOLUTIONS_ENV, raising=False)
    assert not is_blank(lambda r, t, p: 0) and exercise("03-tree-advantages", _constant) is _constant
    with pytest.raises(NotYet, match="you gave \\[0.0, 0.0\\], tg gives \\[-1.414, 1.414\\]"):
        exercises.check_tree_advantages(_constant)


def test_tree_shape_tries_chains():
    """Right whenever N, L >= 1 (all the old random shapes), wrong on a chain."""
    with pytest.raises(NotYet, match="\\(M, N, L\\) = \\(\\d, 0, \\d\\): you gave .*, tg gives \\(1.0, "):
        exercises.check_tree_shape(lambda M, N, L: (1 + L * max(N, 1), M * (1 + L * max(N, 1)),
                                                    M * (1 + L * max(N, 1) / 2)))


def test_f1_check_takes_a_prediction_that_normalises_to_nothing():
    assert "correct" in exercises.check_f1("The!", "Paris", 0, 0, 0)


def test_a_right_loss_passes_in_float32_and_as_shape_1():
    worked = solution("03-grpo-loss")
    assert "matches tg" in exercises.check_grpo_loss(lambda *a, **k: worked(*(x.float() for x in a), **k))
    assert "matches tg" in exercises.check_grpo_loss(lambda *a, **k: worked(*a, **k).reshape(1))
    with pytest.raises(NotYet, match="B, T = \\(2, 2\\).*you gave \\[0.3\\], tg gives"):
        exercises.check_grpo_loss(lambda *a, **k: torch.tensor([0.3], requires_grad=True))


def _loss(logp, old, ref, adv, mask, clip, beta, *, clipped=True, kl_sign=1.0, k3=True, agg="seq", detach=False):
    ratio, a = torch.exp(logp - old), adv[:, None]
    objective = torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a) if clipped else ratio * a
    d = ref - logp
    kl = torch.exp(d) - d - 1 if k3 else -d
    per_token = -objective + kl_sign * beta * kl
    loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean() if agg == "seq" else \
        (per_token * mask).sum() / mask.sum()
    return loss.detach() if detach else loss


def test_grpo_loss_solution_passes_and_typical_mistakes_get_their_hint():
    assert "matches tg" in exercises.check_grpo_loss(solution("03-grpo-loss"))
    assert "matches tg" in exercises.check_grpo_loss(lambda *a, **k: _loss(*a, **k))     # the test's own version
    mistakes = {"no clipping": dict(clipped=False), "a penalty": dict(kl_sign=-1.0), "K1 estimator": dict(k3=False),
                "aggregation": dict(agg="token"), "no gradient|carries no gradient": dict(detach=True)}
    for hint, how in mistakes.items():
        with pytest.raises(NotYet, match=hint):
            exercises.check_grpo_loss(lambda *a, how=how, **k: _loss(*a, **k, **how))
    with pytest.raises(NotYet, match="the mask"):
        exercises.check_grpo_loss(lambda lp, o, r, a, m, **k: _loss(lp, o, r, a, torch.ones_like(m), **k))


def test_a_prediction_is_compared_with_the_measurement():
    assert versus(4, 3.0, "cost") == "cost: you guessed 4.00, measured 3.00 (-1.00, 25% off)"
    assert "no guess written" in versus(..., 3.0, "cost")
    assert near(0.333, 1 / 3) and near(0.33, 1 / 3) and not near(0.3, 1 / 3)
