"""The search environment never crashes on malformed policy output, and its step records stay well-formed."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tg.agent.protocol import INVALID_ACTION, Trajectory
from tg.engines.engine import GenOut
from tg.reward import reward

PIECES = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>", " ", "Rumen",
          "capital", "of", "?", "\n", "", "<|im_end|>"]


@pytest.fixture(scope="module")
def tok_env(random_policy, make_env):
    _, tok = random_policy
    return tok, make_env(tok, max_turns=2, max_obs_tokens=40)


def _ids(tok, text, raw_bytes):
    ids = tok.encode(text, add_special_tokens=False)
    # ids outside the text's encoding (any vocabulary id), as a byte-level tokenizer could emit
    return ids + [b % len(tok) for b in raw_bytes]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(PIECES), max_size=12), extra=st.binary(max_size=6),
       finish=st.sampled_from(["stop", "eos", "length"]), turn=st.integers(0, 3))
def test_malformed_steps_give_well_formed_records(tok_env, parts, extra, finish, turn):
    tok, env = tok_env
    ids = _ids(tok, "".join(parts), extra)
    step = env.observe([GenOut(ids, [0.0] * len(ids), finish)], [turn])[0]
    assert step.gen_ids == ids  # the sampled ids, untouched
    assert step.mask == [1] * len(ids) + [0] * len(step.obs_ids)
    assert len(step.obs_ids) <= env.max_obs_tokens
    assert step.action.kind in ("search", "answer", "invalid")
    if turn >= env.max_turns or step.action.kind == "answer" or finish == "eos":
        assert step.ends_episode and step.obs_ids == []
    elif step.action.kind == "invalid":
        assert step.obs_ids == tok.encode(INVALID_ACTION, add_special_tokens=False)[:env.max_obs_tokens]
    else:
        assert step.obs_ids and step.docs
    traj = Trajectory([1, 2], [step])
    assert len(traj.ids) == len(traj.mask) and traj.mask[:2] == [0, 0]
    assert -0.2 <= reward([step.text], ["Rumen"]) <= 1.0


def test_search_after_the_turn_cap_is_not_executed(tok_env):
    tok, env = tok_env
    ids = tok.encode("<think> x </think> <search> Rumen </search>", add_special_tokens=False)
    capped, free = env.observe([GenOut(ids, [0.0] * len(ids), "stop")] * 2, [env.max_turns, 0])
    assert capped.ends_episode and capped.obs_ids == [] and not capped.is_search
    assert not free.ends_episode and free.is_search and free.docs[0] == "Rumen"
