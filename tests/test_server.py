"""tg.agent.server: the Search-R1 /retrieve contract over loopback: round trip, down, hung, garbage, retries."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest

from tg.agent.server import (HTTPRetriever, RetrieverResponseError, RetrieverUnavailableError, ServerStartError,
                       make_server, parse_response, start_background)

DOCS = [
    {"id": "0", "title": "Borv", "contents": '"Borv"\nBorv is a company founded by Kalden.'},
    {"id": "1", "title": "Kalden", "contents": '"Kalden"\nKalden was born in Ustra.'},
    {"id": "2", "title": "Ustra", "contents": '"Ustra"\nUstra is a city in Narm.'},
]


class FakeRetriever:
    """Implements tg.agent.retrieval.Retriever: ranks DOCS by shared words, with scores."""

    name = "fake"

    def search(self, queries: Sequence[str], k: int) -> list[list[dict]]:
        out = []
        for q in queries:
            words = set(q.lower().split())
            scored = sorted(DOCS, key=lambda d: -len(words & set(d["contents"].lower().split())))
            out.append([dict(d, score=float(len(words & set(d["contents"].lower().split())))) for d in scored[:k]])
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[BaseHTTPRequestHandler], None]], str]]:
    """Start loopback servers whose POST handler is the given function; all stopped after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(handle: Callable[[BaseHTTPRequestHandler], None]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/retrieve"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _reply(handler: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
    handler.send_response(code)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _post(url: str, payload: Any) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_round_trip_equals_the_direct_retriever(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy"):  # a proxy must not swallow loopback requests
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    direct, queries = FakeRetriever(), ["who founded Borv", "where is Ustra", "nothing matches"]
    with start_background(direct) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        client = HTTPRetriever(srv.url, timeout=5, retries=0)
        assert client.search(queries, 2) == direct.search(queries, 2)
        assert client.search([], 2) == []


def test_round_trip_with_bm25(tmp_path: Path) -> None:
    retrieval = pytest.importorskip("tg.agent.retrieval")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d["id"], "contents": d["contents"]}) + "\n" for d in DOCS))
    bm25 = retrieval.BM25Retriever.build(corpus)
    queries = ["Kalden born", "city in Narm"]
    with start_background(bm25) as srv:
        assert HTTPRetriever(srv.url, timeout=5, retries=0).search(queries, 3) == bm25.search(queries, 3)


def test_server_speaks_search_r1_shapes_and_rejects_bad_requests() -> None:
    with start_background(FakeRetriever(), default_topk=1) as srv:
        code, body = _post(srv.url, {"queries": ["Borv"], "topk": 2, "return_scores": True})
        assert code == 200 and len(body["result"][0]) == 2
        assert set(body["result"][0][0]) == {"document", "score"} and body["result"][0][0]["document"]["id"] == "0"
        code, body = _post(srv.url, {"queries": ["Borv"]})  # Search-R1 defaults: server topk, no scores
        assert code == 200 and body["result"] == [[{"id": "0", "title": "Borv", "contents": DOCS[0]["contents"]}]]
        assert _post(srv.url, {"queries": "Borv"})[0] == 400
        assert _post(srv.url, {"queries": ["x"], "topk": -1})[0] == 400
        assert _post(srv.url.replace("/retrieve", "/other"), {"queries": ["x"]})[0] == 404


def test_search_r1_documents_without_title(raw_server: Callable) -> None:
    answer = {"result": [[{"document": {"id": 7, "contents": '"Narm"\nNarm is a country.'}, "score": 0.5}]]}
    url = raw_server(lambda h: _reply(h, 200, json.dumps(answer).encode()))
    (docs,) = HTTPRetriever(url, timeout=5, retries=0).search(["narm"], 1)
    assert docs == [{"id": "7", "title": "Narm", "contents": '"Narm"\nNarm is a country.', "score": 0.5}]


def test_server_down_fails_fast_with_one_clear_error() -> None:
    url = f"http://127.0.0.1:{_free_port()}/retrieve"
    start = time.monotonic()
    with pytest.raises(RetrieverUnavailableError) as err:
        HTTPRetriever(url, timeout=1, retries=2, backoff=0.05).search(["q"], 3)
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert url in msg and "3 attempts" in msg and "tg retriever serve --corpus" in msg and "--port" in msg


def test_hung_server_times_out() -> None:
    with socket.socket() as listener:  # accepts connections (backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/retrieve"
        start = time.monotonic()
        with pytest.raises(RetrieverUnavailableError, match="timed out"):
            HTTPRetriever(url, timeout=0.3, retries=1, backoff=0.01).search(["q"], 3)
        assert time.monotonic() - start < 3


@pytest.mark.parametrize("body", [
    b"<html>not json</html>",
    b'{"result": "nope"}',
    b'{"result": [[], []]}',                            # two lists for one query
    b'{"result": [[{"document": {"id": 1}}]]}',          # no contents
    b'{"detail": "Not Found"}',
])
def test_garbage_answers_raise_a_clear_error(raw_server: Callable, body: bytes) -> None:
    url = raw_server(lambda h: _reply(h, 200, body))
    with pytest.raises(RetrieverResponseError, match=f"{url}.*malformed"):
        HTTPRetriever(url, timeout=5, retries=2).search(["q"], 3)


def test_non_http_answer_and_client_errors_are_not_retried(raw_server: Callable) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def babble() -> None:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(b"HELLO I AM NOT HTTP\r\n\r\n")
            conn.close()

        threading.Thread(target=babble, daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/retrieve"
        with pytest.raises(RetrieverResponseError, match="not an HTTP response"):
            HTTPRetriever(url, timeout=2, retries=0).search(["q"], 3)
    url = raw_server(lambda h: _reply(h, 422, b'{"detail": "bad"}'))
    with pytest.raises(RetrieverResponseError, match="HTTP 422"):
        HTTPRetriever(url, timeout=2, retries=3, backoff=5).search(["q"], 3)  # backoff 5 s: would hang if retried


def test_transient_5xx_is_retried(raw_server: Callable) -> None:
    calls = []
    ok = json.dumps({"result": [[{"document": DOCS[0], "score": 1.0}]]}).encode()
    url = raw_server(lambda h: (calls.append(1), _reply(h, 503 if len(calls) < 3 else 200,
                                                         b"busy" if len(calls) < 3 else ok)))
    (docs,) = HTTPRetriever(url, timeout=2, retries=3, backoff=0.01).search(["q"], 1)
    assert len(calls) == 3 and docs[0]["id"] == "0"


def test_parse_response_accepts_plain_documents() -> None:
    body = json.dumps({"result": [[DOCS[1]]]}).encode()  # return_scores = false shape
    assert parse_response(body, 1) == [[DOCS[1]]]


def test_only_loopback_by_default() -> None:
    with pytest.raises(ServerStartError, match="loopback.*--allow-remote"):
        make_server(FakeRetriever(), host="0.0.0.0", port=0)
    make_server(FakeRetriever(), host="0.0.0.0", port=0, allow_remote=True).server_close()
    with pytest.raises(ValueError, match="http"):
        HTTPRetriever("127.0.0.1:8000/retrieve")


def _raw(url: str, request: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes to the server of `url` and read its whole answer (the server closes after one)."""
    host, port = url.split("/")[2].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _request(body: bytes, length: int | str | None = None) -> bytes:
    size = len(body) if length is None else length
    return b"POST /retrieve HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " + str(size).encode() + \
        b"\r\n\r\n" + body


def test_fifty_concurrent_plain_clients_are_all_answered() -> None:
    body = json.dumps({"queries": ["Borv"], "topk": 1}).encode()
    with start_background(FakeRetriever()) as srv:
        start, answers = threading.Barrier(50), []

        def client() -> None:
            start.wait()
            try:
                answers.append(_raw(srv.url, _request(body)).split(b" ", 2)[1])
            except OSError as e:  # reset by a full listen backlog
                answers.append(type(e).__name__.encode())

        threads = [threading.Thread(target=client) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert answers == [b"200"] * 50


def test_topk_and_return_scores_mean_what_they_say() -> None:
    with start_background(FakeRetriever(), default_topk=2) as srv:
        for bad, field in (({"topk": 0}, "topk"), ({"topk": "3"}, "topk"), ({"topk": 1.5}, "topk"),
                           ({"return_scores": "no"}, "return_scores"), ({"return_scores": 1}, "return_scores")):
            code, answer = _post(srv.url, {"queries": ["Borv"], **bad})
            assert code == 400 and f"`{field}` must be" in answer["error"]
        code, answer = _post(srv.url, {"queries": ["Borv"], "topk": None, "return_scores": False})
        assert code == 200 and len(answer["result"][0]) == 2 and "document" not in answer["result"][0][0]


def test_a_truncated_body_or_a_bad_length_never_holds_a_thread() -> None:
    with start_background(FakeRetriever(), read_timeout=0.5) as srv:
        t0 = time.perf_counter()
        assert b" 400 " in _raw(srv.url, _request(b'{"queries": ', length=100))   # 12 of 100 bytes, then silence
        assert time.perf_counter() - t0 < 3
        for length in (-1, "x", "1e3", ""):
            answer = _raw(srv.url, _request(b"{}", length=length))
            assert b" 400 " in answer and b"Content-Length must be a non-negative integer" in answer
        assert b" 413 " in _raw(srv.url, _request(b"{}", length=1 << 40))
        assert _post(srv.url, {"queries": ["Borv"]})[0] == 200  # still serving
