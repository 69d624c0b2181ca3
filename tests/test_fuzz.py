"""Fuzzing the inputs a user or a client controls: `--set` strings, corpus and question files, `/retrieve`
requests. Every input ends in the module's own error (ConfigError, DataError, a 400) or in a correct answer."""

from __future__ import annotations

import json
import socket
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tg.agent.data import DataError, load_questions
from tg.agent.retrieval import read_corpus
from tg.agent.server import read_request, start_background
from tg.config import Config, ConfigError, load_config
from tg.config_values import field_types, parse_value, type_ok

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
