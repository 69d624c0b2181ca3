"""Search-R1's retrieval-server contract: a client (`HTTPRetriever`) and a standard-library server.

The contract (Search-R1 `search_r1/search/retrieval_server.py`, docs/paper.md#retriever):

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "0", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}

With `return_scores` false each inner list holds the documents themselves. wiki-18 documents carry
the title on the first line of `contents`; tg's server also sends an explicit `title`.

- `HTTPRetriever(url)` is a `tg.agent.retrieval.Retriever` backed by any such server (Search-R1's E5 +
  FAISS server, or tg's own). Each request has a timeout; connection failures, timeouts and 5xx
  answers are retried with exponential backoff, then ONE `RetrieverUnavailableError` names the URL
  and what to start. A malformed answer raises `RetrieverResponseError` at once.
- `serve(retriever, host, port)` answers the same contract from any `Retriever`, with only
  `http.server`; `start_background(...)` runs it in a thread (tests, notebooks).

Departures from Search-R1's server, numbered:
1. A retriever without scores answers `"score": null` (Search-R1's clients ignore the score).
2. Bad requests get a 400 with {"error": ...} instead of FastAPI's 422; other paths get a 404. `topk` must be
   a positive integer (or absent/null: the server's default) and `return_scores` a JSON boolean; FastAPI
   would coerce "no" to false. A body over `MAX_BODY` bytes gets a 413.
3. Binding a non-loopback address needs `allow_remote=True` (`tg retriever serve --allow-remote`): the server
   has no authentication.
4. A client that sends less than its Content-Length is answered 400 after `read_timeout` seconds, so a
   truncated request never holds a handler thread.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from tg.agent.retrieval import Retriever, doc_title

log = logging.getLogger(__name__)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""urllib without proxies: a proxy would swallow requests to a loopback retrieval server."""


class RetrieverUnavailableError(ConnectionError):
    """The retrieval server did not answer after all retries."""


class RetrieverResponseError(ValueError):
    """The retrieval server answered, but not in the Search-R1 `/retrieve` format."""


class ServerStartError(ValueError):
    """The retrieval server cannot listen where asked (a non-loopback host without consent, a taken port)."""


def _garbage(url: str, why: str) -> RetrieverResponseError:
    return RetrieverResponseError(f"retrieval server at {url} gave a malformed answer: {why}. Expected "
                                  '{"result": [[{"document": {"id", "contents"}, "score"}, ...] per query]}.')


def _to_doc(item: Any, url: str) -> dict[str, Any]:
    """One answer entry -> {id, title, contents} (+ score when the server gave a number)."""
    document = item.get("document", item) if isinstance(item, dict) else None
    if not isinstance(document, dict) or not isinstance(document.get("contents"), str):
        raise _garbage(url, f"an entry has no document with a string `contents`: {str(item)[:200]!r}")
    doc_id = document.get("id")
    doc = {"id": "" if doc_id is None else str(doc_id), "title": doc_title(document), "contents": document["contents"]}
    score = item.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        doc["score"] = float(score)
    return doc


def parse_response(body: bytes, n_queries: int, url: str = "<server>") -> list[list[dict[str, Any]]]:
    """Decode a `/retrieve` answer into `n_queries` lists of doc dicts; malformed: RetrieverResponseError."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _garbage(url, f"not JSON ({e}); body starts {body[:200]!r}") from e
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list) or len(result) != n_queries or not all(isinstance(r, list) for r in result):
        raise _garbage(url, f"`result` is not a list of {n_queries} lists; body starts {body[:200]!r}")
    return [[_to_doc(item, url) for item in per_query] for per_query in result]


class HTTPRetriever:
    """A `Retriever` that asks a Search-R1 style `/retrieve` server.

    url: the endpoint, e.g. 'http://127.0.0.1:8000/retrieve' (config `data.retriever_url`).
    timeout: seconds per socket operation (connect, each read). retries: extra attempts after the
    first. backoff: seconds before the first retry, doubled each time. A dead or silent server
    fails after at most (retries + 1) * timeout + backoff * (2**retries - 1) seconds.
    Proxy variables (http_proxy, ...) are ignored: retrieval servers live on the local network.
    """

    def __init__(self, url: str = "http://127.0.0.1:8000/retrieve", timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.5) -> None:
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError(f"need timeout > 0, retries >= 0, backoff >= 0; got {timeout}, {retries}, {backoff}")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"retriever url {url!r} is not an http(s) URL like http://127.0.0.1:8000/retrieve")
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.name = f"http:{url}"

    def search(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]:
        """Top-k documents per query, as the server ranks them."""
        if not queries:
            return []
        payload = {"queries": list(queries), "topk": int(k), "return_scores": True}
        return parse_response(self._post(json.dumps(payload).encode()), len(queries), self.url)

    def _post(self, data: bytes) -> bytes:
        """POST with bounded retries; transient failures end in one RetrieverUnavailableError."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
            try:
                with _OPENER.open(request, timeout=self.timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as e:
                if e.code < 500:  # the server is up but refuses the request: retrying will not help
                    raise RetrieverResponseError(f"retrieval server at {self.url} refused the request: "
                                                 f"HTTP {e.code} {e.read()[:200]!r}") from e
                last = e
            except OSError as e:  # refused or reset connections, timeouts (URLError, TimeoutError)
                last = e
            except http.client.HTTPException as e:  # something answered, but not in HTTP
                raise _garbage(self.url, f"not an HTTP response ({type(e).__name__}: {e})") from e
            log.debug("retrieval attempt %d/%d at %s failed: %s", attempt + 1, self.retries + 1, self.url, last)
        port = urlsplit(self.url).port or 8000
        raise RetrieverUnavailableError(
            f"no retrieval server answered at {self.url} after {self.retries + 1} attempts "
            f"(last error: {last}). Start one with `tg retriever serve --corpus <corpus.jsonl> --port {port}` "
            f"(or Search-R1's retrieval_server.py), or set data.retriever='bm25' to search in-process.")


# ---- the server ---------------------------------------------------------------------------------

MAX_BODY = 1 << 26
"""Largest request body accepted (64 MiB; a batch of 512 queries is well under 1 MiB)."""


def read_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """Validate a `/retrieve` request body into (queries, topk, return_scores); ValueError says what is wrong."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, RecursionError) as e:  # json.JSONDecodeError is a ValueError already
        raise ValueError(f"body is not JSON ({type(e).__name__})") from e
    if not isinstance(data, dict):
        raise ValueError("body must be a JSON object")
    queries, topk, scores = data.get("queries"), data.get("topk"), data.get("return_scores", False)
    topk = default_topk if topk is None else topk
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("`queries` must be a list of strings")
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"`topk` must be a positive integer, got {json.dumps(topk)[:50]}")
    if not isinstance(scores, bool):
        raise ValueError(f"`return_scores` must be true or false, got {json.dumps(scores)[:50]}")
    return queries, topk, scores


class _Refused(Exception):
    """A request whose body cannot be read as declared: answered with `code`, then the connection closes."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _encode(docs: list[dict[str, Any]], return_scores: bool) -> list[Any]:
    plain = [{"id": d.get("id"), "title": d.get("title", ""), "contents": d["contents"]} for d in docs]
    if not return_scores:
        return plain
    return [{"document": p, "score": float(d["score"]) if "score" in d else None} for p, d in zip(plain, docs)]


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def setup(self) -> None:
        self.timeout = self.server.read_timeout  # StreamRequestHandler.setup applies it to the socket
        super().setup()

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.rstrip("/") != "/retrieve":
            return self._send(404, {"error": f"unknown path {self.path}; POST /retrieve"})
        try:
            queries, topk, scores = read_request(self._body(), self.server.default_topk)
        except _Refused as e:  # the stream is out of step with the headers: end the connection
            self.close_connection = True
            return self._send(e.code, {"error": str(e)})
        except ValueError as e:  # includes json.JSONDecodeError
            return self._send(400, {"error": f"bad request: {e}"})
        try:
            with self.server.lock:  # retrievers need not be thread-safe
                results = self.server.retriever.search(queries, topk)
            payload = {"result": [_encode(docs, scores) for docs in results]}
        except Exception as e:  # noqa: BLE001 (any retriever failure becomes a 500, never a dead thread)
            log.exception("retriever failed")
            return self._send(500, {"error": f"retriever failed: {type(e).__name__}: {e}"})
        self._send(200, payload)

    def _body(self) -> bytes:
        """The request body, read within the server's read_timeout; `_Refused` when Content-Length is not a
        non-negative integer, is over MAX_BODY, or promises more bytes than arrive."""
        declared = (self.headers.get("Content-Length") or "").strip()
        if not (declared.isascii() and declared.isdigit()):
            raise _Refused(400, f"bad request: Content-Length must be a non-negative integer, got {declared!r}")
        size = int(declared)
        if size > MAX_BODY:
            raise _Refused(413, f"body of {size} bytes is over the {MAX_BODY}-byte limit")
        try:
            body = self.rfile.read(size)
        except TimeoutError:
            body = b""
        if len(body) < size:
            raise _Refused(400, f"bad request: the body is shorter than its Content-Length ({size}) or took over "
                                f"{self.server.read_timeout} s")
        return body

    def _send(self, code: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError as e:  # the client left (reset, broken pipe, timeout): nobody to answer
            log.debug("could not answer %s: %s", self.address_string(), e)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.debug("%s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog (socketserver's 5 resets bursts of concurrent clients)

    def __init__(self, address: tuple[str, int], retriever: Retriever, default_topk: int,
                 read_timeout: float) -> None:
        super().__init__(address, _Handler)
        self.retriever, self.default_topk, self.lock = retriever, default_topk, threading.Lock()
        self.read_timeout = read_timeout


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: cannot tell without resolving it
        return False


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
                allow_remote: bool = False, read_timeout: float = 30.0) -> ThreadingHTTPServer:
    """A bound (not yet serving) `/retrieve` server; port 0 picks a free port (departure 3). read_timeout:
    seconds a client may take to send its request (departure 4)."""
    if not allow_remote and not _is_loopback(host):
        raise ServerStartError(f"host {host!r} is not a loopback address and the server has no authentication: "
                               "pass --allow-remote (allow_remote=True) to expose it anyway")
    try:
        return _Server((host, port), retriever, default_topk, read_timeout)
    except OSError as e:  # port taken, address not on this machine, no permission
        raise ServerStartError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port, "
                               "or stop what holds this one") from e


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
          allow_remote: bool = False, ready: Callable[[str], None] | None = None) -> None:
    """Answer POST /retrieve from `retriever` until interrupted (blocks). Once the port is bound, `ready`
    (default: the log) gets one line with the URL."""
    with make_server(retriever, host, port, default_topk, allow_remote) as server:
        (ready or log.info)(f"serving {retriever.name} at http://{host}:{server.server_address[1]}/retrieve "
                            "(Ctrl-C to stop)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            log.info("retrieval server stopped")


@dataclass
class BackgroundServer:
    """A server running in a daemon thread: `.url` to query, `.stop()` (or `with`) to shut it down."""

    url: str
    server: ThreadingHTTPServer
    thread: threading.Thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_background(retriever: Retriever, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3,
                     read_timeout: float = 30.0) -> BackgroundServer:
    """Start `serve` in a thread on a loopback port (0: a free one) and return its URL and stop handle."""
    server = make_server(retriever, host, port, default_topk, read_timeout=read_timeout)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="tg-retrieval-server",
                              daemon=True)  # poll 0.05 s: stop() returns quickly
    thread.start()
    return BackgroundServer(f"http://{host}:{server.server_address[1]}/retrieve", server, thread)
