"""tg.reward: EM/F1, answer extraction, the format state machine, Eq. 13 and the official tiers."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tg.reward
from tg.agent.protocol import PROTOCOL_TAGS, parse_action
from tg.reward import (answer_score, exact_match, extract_answer, f1, is_valid_format, normalize_answer,
                       reward)

SEARCH = "<think> who founded it? </think>\n<search> Borv founder </search>"
OBS = "\n\n<information>Doc 1(Title: Borv) Borv was founded by Kalden.</information>\n\n"
ANSWER = "<think> Kalden </think>\n<answer> Kalden </answer>"


def test_doctests_pass() -> None:
    result = doctest.testmod(tg.reward)
    assert result.attempted >= 10 and result.failed == 0


@pytest.mark.parametrize("text, expected", [
    ("The Cat", "cat"), ("a  b\tc", "b c"), ("U.S.A.", "usa"), ("an-apple", "anapple"), ("", ""),
])
def test_normalize_answer_squad_rules(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_and_f1_take_the_best_gold() -> None:
    assert exact_match("kalden", ["Borv", "Kalden"]) == 1.0
    assert exact_match("Kalden", "Kalden") == 1.0  # a bare string is one gold, not characters
    assert exact_match("K", "Kalden") == 0.0
    assert exact_match(None, ["x"]) == 0.0 and f1(None, ["x"]) == 0.0
    assert exact_match("x", []) == 0.0 and f1("x", []) == 0.0
    assert f1("new york city", ["york", "New York City"]) == 1.0
    assert f1("york", ["new york"]) == pytest.approx(2 / 3)


def test_extract_answer_last_span_only() -> None:
    assert extract_answer(SEARCH + OBS + ANSWER) == "Kalden"
    assert extract_answer(SEARCH) is None
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("<answer> a <answer> b </answer>") == "b"


@pytest.mark.parametrize("steps", [
    [ANSWER],
    [SEARCH, ANSWER],
    [SEARCH + OBS, SEARCH + OBS, ANSWER],
    ["<think></think><answer>x</answer>"],            # empty thought, no whitespace
    ["  \n" + ANSWER + "\n  "],                        # surrounding whitespace
])
def test_valid_formats(steps: list[str]) -> None:
    assert is_valid_format(steps)


@pytest.mark.parametrize("steps", [
    [],
    [SEARCH],                                          # ends without an answer
    [ANSWER, ANSWER],                                  # answer before the last step
    ["<answer> Kalden </answer>"],                     # no think
    ["<search> q </search>", ANSWER],                  # search step without think
    ["<think> a </think> stray <answer> x </answer>"],  # text outside tags
    ["<think> a </think><answer> x </answer> tail"],    # text after the answer
    ["<think> a </think><search>  </search>", ANSWER],  # blank query
    ["<think> a </think><answer> </answer>"],           # blank answer
    ["<think> a <think> b </think></think><answer> x </answer>"],  # nested
    ["<think> a </think><answer> x"],                   # unclosed
    ["<think> a </think><information> x </information><answer> y </answer>"],  # policy-written obs
    ["<THINK> a </THINK><answer> x </answer>"],         # tags are case-sensitive
])
def test_invalid_formats(steps: list[str]) -> None:
    assert not is_valid_format(steps)


def test_paper_reward_is_eq13() -> None:
    gold = ["Kalden"]
    assert reward([SEARCH, ANSWER], gold) == 1.0
    assert reward([SEARCH, ANSWER], ["Borv"]) == 0.0
    assert reward(["<answer> Kalden </answer>"], gold) == pytest.approx(0.8)
    assert reward(["nothing"], gold) == pytest.approx(-0.2)
    assert reward(["nothing"], gold, format_penalty=0.0) == 0.0


def test_official_tiers_em() -> None:
    gold = ["Kalden"]
    assert reward([SEARCH, ANSWER], gold, mode="official") == 1.0
    assert reward(["<answer> Kalden </answer>"], gold, mode="official") == pytest.approx(0.8)
    assert reward([SEARCH, ANSWER], ["Borv"], mode="official") == pytest.approx(0.2)
    assert reward(["<answer> Borv </answer>"], gold, mode="official") == pytest.approx(0.1)
    assert reward(["no answer at all"], gold, mode="official") == 0.0


def test_official_tiers_f1() -> None:
    steps = [SEARCH, "<think> x </think><answer> Kalden of Borv </answer>"]
    partial = f1("Kalden of Borv", ["Kalden"])
    assert reward(steps, ["Kalden"], mode="official", metric="f1") == pytest.approx(partial)
    assert reward(["<answer> Kalden of Borv </answer>"], ["Kalden"], mode="official",
                  metric="f1") == pytest.approx(partial - 0.2)
    assert reward(steps, ["Rome"], mode="official", metric="f1") == pytest.approx(0.2)
    assert reward(["<answer> Borv </answer>"], ["Rome"], mode="official", metric="f1") == 0.0


def test_answer_score_ignores_format() -> None:
    assert answer_score("<answer> Kalden </answer>", ["Kalden"]) == 1.0
    assert answer_score("junk <answer> Kalden of Borv </answer>", ["Kalden"], "f1") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="metric"):
        answer_score("", ["x"], "bleu")


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="mode"):
        reward([ANSWER], ["x"], mode="tree")
    with pytest.raises(ValueError, match="format_penalty"):
        reward([ANSWER], ["x"], format_penalty=2.0)


# ---- property tests: malformed policy output never raises, rewards stay in range -------------

_PIECES = st.one_of(st.sampled_from(PROTOCOL_TAGS + (" ", "\n", "\t", "", "<answer", "answer>", "</")),
                    st.text(max_size=12))
_STEP = st.one_of(st.text(max_size=60), st.lists(_PIECES, max_size=12).map("".join))
_GOLDS = st.one_of(st.text(max_size=10), st.lists(st.text(max_size=10), max_size=3))
_NO_TAGS = st.text(max_size=15).filter(lambda s: "<" not in s and ">" not in s)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(_STEP, max_size=5), golds=_GOLDS, mode=st.sampled_from(["paper", "official"]),
       metric=st.sampled_from(["em", "f1"]), penalty=st.floats(0.0, 1.0))
def test_malformed_outputs_never_raise_and_stay_in_range(steps: list[str], golds: list[str] | str, mode: str,
                                                          metric: str, penalty: float) -> None:
    for text in steps:
        assert parse_action(text).kind in ("search", "answer", "invalid")
        answer = extract_answer(text)
        assert answer is None or isinstance(answer, str)
    assert isinstance(is_valid_format(steps), bool)
    r = reward(steps, golds, mode=mode, format_penalty=penalty, metric=metric)
    assert -penalty - 1e-12 <= r <= 1.0 + 1e-12


@settings(max_examples=100, deadline=None)
@given(thoughts=st.lists(_NO_TAGS, min_size=1, max_size=4), queries=st.lists(_NO_TAGS, min_size=4, max_size=4),
       answer=_NO_TAGS, pad=st.sampled_from(["", " ", "\n", " \n\t"]))
def test_well_formed_episodes_are_valid_and_score_pure_em(thoughts: list[str], queries: list[str], answer: str,
                                                         pad: str) -> None:
    queries = [q if q.strip() else "q" for q in queries]
    answer = answer if answer.strip() else "a"
    steps = [f"{pad}<think>{t}</think>{pad}<search>{q}</search>{pad}" for t, q in zip(thoughts[:-1], queries)]
    steps.append(f"{pad}<think>{thoughts[-1]}</think>{pad}<answer>{answer}</answer>{pad}")
    assert is_valid_format(steps)
    assert extract_answer("".join(steps)) == answer.strip()
    assert reward(steps, [answer]) == 1.0 and reward(steps, [answer], mode="official") == 1.0


@pytest.mark.parametrize("text, kind", [
    (SEARCH, "search"),
    (SEARCH + OBS, "search"),
    (ANSWER, "answer"),
    ("<think> a </think>", "invalid"),                          # stops before an action
    ("<think> a </think><search> q </search><information>", "invalid"),  # observation left open
    ("plain text", "invalid"),
    (ANSWER + "<think>", "invalid"),                             # a tag after the answer closed
    (SEARCH + OBS + "<answer> x </answer>", "invalid"),          # a tag after the observation closed
])
def test_each_step_is_classified_search_answer_or_invalid(text: str, kind: str) -> None:
    assert tg.reward._step_kind(text) == kind


def test_a_tag_after_a_final_state_is_invalid_not_an_error() -> None:
    assert not is_valid_format([ANSWER + "<answer> again </answer>"])
    assert not is_valid_format([SEARCH + OBS + "</information>", ANSWER])


def test_the_answer_is_read_from_the_steps_joined_as_they_were_generated() -> None:
    # a span cut across two steps (invalid format) still scores its answer, less the penalty
    assert reward(["<think> a </think><answer> Kal", "den </answer>"], ["Kalden"]) == pytest.approx(0.8)


def test_format_penalty_bounds_are_inclusive() -> None:
    assert reward(["no tags"], ["x"], format_penalty=1.0) == -1.0
    assert reward(["no tags"], ["x"], format_penalty=0.0) == 0.0
    with pytest.raises(ValueError, match="format_penalty"):
        reward(["no tags"], ["x"], format_penalty=-0.1)
