"""Fuzzing the inputs a user or a client controls: `--set` strings, corpus and question files, `/retrieve`
requests, what an environment or a reward returns. Every input ends in the module's own error (ConfigError,
DataError, a 400, PluginError) or in a correct answer."""

from __future__ import annotations

import json
import math
import random
import socket
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tg.agent.contract import CheckedEnv
from tg.agent.data import DataError, load_questions
from tg.agent.env import PluginError, generated_step
from tg.agent.protocol import Action, Step
from tg.agent.retrieval import read_corpus
from tg.agent.server import read_request, start_background
from tg.batch import leaf_rewards
from tg.config import Config, ConfigError, load_config
from tg.config_values import field_types, parse_value, type_ok
from tg.engines.engine import GenOut, PrefillStats, Sampling
from tg.tree import Tree, sample_trees

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FIELDS = [f"{group}.{f.name}" for group, tp in field_types(Config).items() if is_dataclass(tp) for f in fields(tp)]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                             max_size=4), max_leaves=8)
RAW = st.one_of(st.text(max_size=20), SCALARS.map(json.dumps), JSON.map(json.dumps))


@FAST
@given(key=st.one_of(st.sampled_from(FIELDS), st.text(max_size=15)), raw=RAW)
def test_any_override_is_a_config_error_or_the_value_asked_for(key: str, raw: str) -> None:
    try:
        cfg = load_config("cpu", f"{key}={raw}")
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    group, name = key.split(".", 1)
    tp = field_types(type(getattr(cfg, group)))[name]
    value = getattr(getattr(cfg, group), name)
    assert type_ok(value, tp) and value == parse_value(raw, tp)
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg   # what is saved loads back


def _lines(values: list) -> bytes:
    return b"".join(v if isinstance(v, bytes) else json.dumps(v).encode() + b"\n" for v in values)


CORPUS_ROW = st.fixed_dictionaries({"id": st.one_of(st.integers(), st.text(max_size=5), st.none()),
                                    "contents": st.one_of(st.text(max_size=20), st.integers())},
                                   optional={"title": SCALARS})
LINES = st.lists(st.one_of(CORPUS_ROW, JSON, st.binary(max_size=20)), max_size=5)


@FAST
@given(values=LINES)
def test_any_corpus_file_is_a_data_error_or_its_documents(tmp_path: Path, values: list) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(_lines(values))
    try:
        docs = read_corpus(path)
    except DataError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    rows = [json.loads(line) for line in path.read_bytes().decode("utf-8-sig").splitlines() if line.strip()]
    assert [d["id"] for d in docs] == [str(r["id"]) for r in rows]
    assert all(isinstance(d["title"], str) and d["contents"] == r["contents"] for d, r in zip(docs, rows))


QUESTION_ROW = st.fixed_dictionaries({"question": st.one_of(st.text(max_size=10), st.none(), st.integers()),
                                      "golden_answers": st.one_of(st.lists(SCALARS, max_size=3), SCALARS)},
                                     optional={"data_source": SCALARS, "id": SCALARS, "reward_model": JSON})


@FAST
@given(values=st.lists(st.one_of(QUESTION_ROW, JSON, st.binary(max_size=20)), max_size=5))
def test_any_question_file_is_a_data_error_or_its_questions(tmp_path: Path, values: list) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(_lines(values))
    try:
        questions = load_questions(path)
    except DataError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    assert questions and all(q.question.strip() and q.golden_answers for q in questions)
    assert all(isinstance(g, str) for q in questions for g in q.golden_answers)


REQUEST = st.fixed_dictionaries({}, optional={"queries": st.one_of(st.lists(st.text(max_size=8), max_size=3), JSON),
                                              "topk": SCALARS, "return_scores": SCALARS})


@FAST
@given(body=st.one_of(st.binary(max_size=40), JSON.map(lambda v: json.dumps(v).encode()),
                      REQUEST.map(lambda v: json.dumps(v).encode())))
def test_any_request_body_is_refused_or_read_as_sent(body: bytes) -> None:
    try:
        queries, topk, scores = read_request(body, default_topk=3)
    except ValueError as err:
        assert "\n" not in str(err)
        return
    sent = json.loads(body)
    assert queries == sent["queries"] and all(isinstance(q, str) for q in queries)
    assert topk == (3 if sent.get("topk") is None else sent["topk"]) and topk >= 1 and type(topk) is int
    assert scores is sent.get("return_scores", False)


class Echo:
    name = "echo"

    def search(self, queries: list[str], k: int) -> list[list[dict]]:
        return [[{"id": "0", "title": q, "contents": q}] for q in queries]


@pytest.fixture(scope="module")
def server():
    with start_background(Echo(), read_timeout=0.2) as srv:
        yield srv.server.server_address


@settings(max_examples=30, deadline=None)
@given(length=st.one_of(st.integers(-5, 60).map(str), st.text(max_size=6)), body=st.binary(max_size=40))
def test_any_request_gets_an_answer(server, length: str, body: bytes) -> None:
    """Any Content-Length and a body no longer than it (more would be unread, and a close with unread bytes
    resets the connection, answer and all) get a 200, 400 or 413, truncated bodies after read_timeout."""
    head = f"POST /retrieve HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {length}\r\n\r\n"
    body = body[:int(length)] if length.isascii() and length.isdigit() else b""
    try:
        head_bytes = head.encode("latin-1")
    except UnicodeEncodeError:
        return  # not sendable as an HTTP header
    with socket.create_connection(server, timeout=5) as s:
        s.sendall(head_bytes + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.split(b" ", 2)[1] in (b"200", b"400", b"413")


VOCAB, CAP = 50, 6
"""The fuzzed rollout's vocabulary size and agent.max_obs_tokens."""
QUESTIONS = ["What is one?", "What is two?"]
TOKEN_IDS = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([VOCAB, VOCAB + 7, -1]))


def _embed(ids) -> None:
    """What a model's embedding does with an id outside the vocabulary."""
    if any(not 0 <= t < VOCAB for t in ids):
        raise IndexError("index out of range in self")


class ListBatch:
    """An engine batch stand-in: every row samples the ids 5, 6, 7; its contexts and appended ids go through `_embed`."""

    def __init__(self, rows: list) -> None:
        for row in rows:
            _embed(row)
        self.row_stats = [PrefillStats() for _ in rows]
        self.stats = PrefillStats()

    def generate(self, rows, caps):
        return [GenOut([5, 6, 7][:c], [0.0] * len([5, 6, 7][:c]), "stop") for c in caps]

    def append(self, rows, ids) -> None:
        for x in ids:
            _embed(x)

    def release(self, rows) -> None:
        pass


class ListEngine:
    def open(self, contexts, counts, sampling, prefixes=None) -> ListBatch:
        return ListBatch([list(c) for c, k in zip(contexts, counts) for _ in range(k)])


class FuzzEnv:
    """Observes what hypothesis draws: an observation of drawn ids at each step's first turn (the second ends the
    episode), and sometimes a step more or fewer than it was given."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def prompt_ids(self, question: str) -> list[int]:
        return [ord(c) % VOCAB for c in question]

    def observe(self, outs, turns) -> list:
        steps = [generated_step(o, "", Action("search"), [] if t >= 1 else self.data.draw(
            st.lists(TOKEN_IDS, min_size=1, max_size=CAP + 2)), t >= 1) for o, t in zip(outs, turns)]
        extra = self.data.draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
        return steps[:len(steps) + extra] if extra < 0 else steps + steps[:extra]


@FAST
@given(data=st.data())
def test_any_environment_output_is_a_plugin_error_or_a_rollout_within_the_contract(data) -> None:
    """Random observation lengths, token ids and step counts through the trainer's checked rollout (Tree-GRPO
    M=2, N=1, L=1): one PluginError line naming the environment and a question, or full trees within the contract."""
    env = CheckedEnv(FuzzEnv(data), VOCAB, CAP)
    try:
        trees, _ = sample_trees(ListEngine(), env, [env.prompt_ids(q) for q in QUESTIONS], M=2, N=1, L=1,
                                sampling=Sampling(1.0), rng=random.Random(0), max_step_tokens=4, max_context_tokens=200)
    except PluginError as err:
        msg = str(err)
        assert "\n" not in msg and msg.startswith("FuzzEnv.observe") and any(q in msg for q in QUESTIONS), msg
        return
    assert [sum(len(t.leaves()) for t in ts) for ts in trees] == [4, 4]   # M(1 + NL) leaves per question
    steps = [n.step for ts in trees for t in ts for n in t.nodes[1:]]
    assert all(len(s.obs_ids) <= CAP and all(0 <= i < VOCAB for i in s.obs_ids) for s in steps)


REWARDS = st.one_of(st.none(), st.booleans(), st.integers(-10**7, 10**7), st.just(10**400), st.floats(),
                    st.text(max_size=4), st.floats().map(torch.tensor), st.lists(st.floats(-2, 2), max_size=3).map(
                        torch.tensor), st.just(ZeroDivisionError("no\nscore")))


def _acceptable(value) -> float | None:
    """The float a reward value trains as, or None where the contract refuses it (an independent statement of it)."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else None
    if not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return float(value) if abs(value) <= 1e6 else None


@FAST
@given(values=st.lists(REWARDS, min_size=1, max_size=4))
def test_any_reward_value_is_a_plugin_error_or_the_float_it_trains_as(values: list) -> None:
    """One leaf per drawn value: every leaf's reward is that value as a float when all are acceptable (a finite real
    scalar with |r| <= 1e6), else the first bad one stops scoring with one PluginError line."""
    tree = Tree(0, [1, 2])
    for _ in values:
        tree.add_path(0, [Step([5], [], Action("answer", "x"), True, text="<answer> x </answer>")])
    given_values = iter(values)

    def drawn(step_texts, golden_answers):
        value = next(given_values)
        if isinstance(value, Exception):
            raise value
        return value
    try:
        out = leaf_rewards([tree], [("x",)], drawn, ["What is x?"])
    except PluginError as err:
        assert "\n" not in str(err) and str(err).startswith("drawn, question 'What is x?'"), str(err)
        assert any(_acceptable(v) is None for v in values)
        return
    assert out["reward"] == [_acceptable(v) for v in values]
