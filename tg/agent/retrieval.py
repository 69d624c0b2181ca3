"""The search tool: a `Retriever` protocol, BM25 over any wiki-18 style JSONL corpus, and a cache.

A corpus row is `{"id", "contents"}` with the title on the first line of `contents` (wiki-18), or an
explicit `title` field. Every retriever returns, per query, the top-k documents as
`{"id", "title", "contents"}` dicts, ready for `tg.agent.protocol.format_observation`.

Departures from the paper (docs/paper.md#retriever):
1. The paper retrieves with dense E5 embeddings and an exact FAISS index; the cpu preset uses BM25
   (`bm25s`, English stopwords, no stemming), which finds an entity's page from its name alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from itertools import zip_longest
from pathlib import Path
from typing import Any, Protocol, Sequence

import bm25s
import numpy as np

from tg.agent.data import DataError, json_lines, shown_keys

log = logging.getLogger(__name__)
_CORPUS_HINT = 'each line must be one JSON object with a string id and contents: {"id": "0", "contents": "..."}'


class Retriever(Protocol):
    name: str

    def search(self, queries: Sequence[str], k: int) -> list[list[dict]]:
        """Top-k documents per query: `len(queries)` lists of k dicts {id, title, contents}."""
        ...


def doc_title(row: dict) -> str:
    """A corpus row's title: its `title` field, else the first line of `contents` without quotes (wiki-18)."""
    return row.get("title") or row["contents"].split("\n", 1)[0].strip().strip('"')


def _corpus_row(row: Any, where: str) -> dict:
    """One corpus line as {id, title, contents}; a line that is not such a row raises `DataError`."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: the line is {type(row).__name__}, not a JSON object; {_CORPUS_HINT}")
    for key in ("id", "contents"):
        if key not in row:
            raise DataError(f"{where}: no `{key}` (found: {shown_keys(row)}); {_CORPUS_HINT}")
    ok = isinstance(row["id"], (str, int)) and not isinstance(row["id"], bool) and isinstance(row["contents"], str)
    if not ok or not isinstance(row.get("title", ""), str):
        raise DataError(f"{where}: `id` must be a string or an integer, `contents` (and `title`, if given) strings; "
                        f"{_CORPUS_HINT}")
    return {"id": str(row["id"]), "title": doc_title(row), "contents": row["contents"]}


def read_corpus(path: str | Path) -> list[dict]:
    """A JSONL corpus as `{"id", "title", "contents"}` dicts. A missing or empty file, bytes that are not
    UTF-8, or a line that is not such a row raises `DataError` naming the file, the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such corpus file; a corpus is JSON lines, {_CORPUS_HINT}")
    rows = [_corpus_row(row, where) for where, row in json_lines(path)]
    if not rows:
        raise DataError(f"{path}: no documents (the corpus is empty); {_CORPUS_HINT}")
    return rows


def _tokenize(texts: Sequence[str], return_ids: bool) -> object:
    return bm25s.tokenize(list(texts), stopwords="en", return_ids=return_ids, show_progress=False)


class BM25Retriever:
    """BM25 (Lucene scoring, k1 = 1.5, b = 0.75) over a corpus, via `bm25s`'s sparse index."""

    name = "bm25"

    def __init__(self, index: bm25s.BM25, docs: list[dict]) -> None:
        self.index = index
        self.docs = docs

    @classmethod
    def build(cls, corpus_path: str | Path) -> "BM25Retriever":
        """Index every row of a JSONL corpus (title and text both count, as wiki-18's `contents`)."""
        docs = read_corpus(corpus_path)
        tokens = _tokenize([d["contents"] for d in docs], return_ids=True)
        if not tokens.vocab:
            raise DataError(f"{corpus_path}: no document has a word BM25 can index (all are empty or stopwords); "
                            "check that `contents` holds the documents' text")
        index = bm25s.BM25()
        index.index(tokens, show_progress=False)
        return cls(index, docs)

    def save(self, directory: str | Path) -> Path:
        """Write the index and its documents (bm25s format plus docs.jsonl)."""
        d = Path(directory)
        self.index.save(str(d), show_progress=False)
        (d / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.docs))
        return d

    @classmethod
    def load(cls, directory: str | Path, mmap: bool = True) -> "BM25Retriever":
        """Load a saved index; `mmap` keeps the score arrays on disk (large corpora)."""
        d = Path(directory)
        index = bm25s.BM25.load(str(d), mmap=mmap, show_progress=False)
        return cls(index, read_corpus(d / "docs.jsonl"))

    def search(self, queries: Sequence[str], k: int) -> list[list[dict]]:
        """Top-k documents per query, best first; equal scores in corpus order (deterministic)."""
        k = min(k, len(self.docs))
        return [[dict(self.docs[i]) for i in self._top_k(q, k)] for q in _tokenize(queries, return_ids=False)]

    def _top_k(self, tokens: list[str], k: int) -> list[int]:
        ids = self.index.get_tokens_ids(tokens)
        if not ids:  # no known word: every document scores 0
            return list(range(k))
        scores = self.index.get_scores_from_ids(ids)  # (n_docs,)
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        candidates = np.flatnonzero(scores >= kth)  # the top k and everything tied with the k-th
        order = np.lexsort((candidates, -scores[candidates]))  # by score, then by corpus position
        return candidates[order[:k]].tolist()


SOURCE_FILE = "corpus.json"
"""Written beside a cached index: the size, mtime and sha256 of the corpus it was built from."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _source(corpus: Path) -> dict[str, Any]:
    stat = corpus.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(corpus)}


def _write_source(directory: Path, source: dict[str, Any]) -> None:
    tmp = directory / f"{SOURCE_FILE}.tmp-{np.random.randint(1 << 30)}"
    tmp.write_text(json.dumps(source))
    tmp.replace(directory / SOURCE_FILE)


def _same_documents(corpus: Path, docs: Path) -> bool:
    """Whether an index's saved documents are the corpus's rows in order (streamed, for a large corpus)."""
    try:
        rows = zip_longest(json_lines(corpus), json_lines(docs))
        return all(a is not None and b is not None and _corpus_row(a[1], a[0]) == _corpus_row(b[1], b[0])
                   for a, b in rows)
    except DataError:
        return False


def _adopt_unrecorded(corpus: Path, directory: Path) -> bool:
    """An index built by an earlier `tg`, which recorded no corpus, counts (and is recorded now) if its saved
    documents are the corpus's rows: a stream through both is far cheaper than rebuilding a large index."""
    if not (directory / "docs.jsonl").is_file() or not _same_documents(corpus, directory / "docs.jsonl"):
        return False
    _write_source(directory, _source(corpus))
    return True


def _index_matches(corpus: Path, directory: Path) -> bool:
    """Whether the index in `directory` was built from `corpus` as it is now: same size and mtime, or, the
    mtime alone having changed, the same sha256 (then the record takes the new mtime)."""
    if not (directory / SOURCE_FILE).exists():
        return _adopt_unrecorded(corpus, directory)
    try:
        recorded = json.loads((directory / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    stat = corpus.stat()
    if not isinstance(recorded, dict) or recorded.get("size") != stat.st_size:
        return False
    if recorded.get("mtime_ns") == stat.st_mtime_ns:
        return True
    if recorded.get("sha256") != file_sha256(corpus):
        return False
    _write_source(directory, {**recorded, "mtime_ns": stat.st_mtime_ns})
    return True


def bm25_for(corpus_path: str | Path) -> BM25Retriever:
    """The BM25 index of a corpus, built once and cached beside it in `bm25/`. The cache records the corpus
    it was built from (`SOURCE_FILE`): after the corpus changes, the next call rebuilds it."""
    corpus = Path(corpus_path)
    if not corpus.is_file():
        raise DataError(f"{corpus}: no such corpus file; a corpus is JSON lines, {_CORPUS_HINT}")
    directory = corpus.parent / "bm25"
    if _index_matches(corpus, directory):
        return BM25Retriever.load(directory)
    if directory.exists():
        log.info("%s changed since its BM25 index was built: rebuilding %s", corpus, directory)
    source = _source(corpus)
    retriever = BM25Retriever.build(corpus)
    tmp = directory.with_name(f"bm25.tmp-{np.random.randint(1 << 30)}")
    retriever.save(tmp)
    _write_source(tmp, source)
    _install(tmp, directory, corpus)
    return retriever


def _install(tmp: Path, directory: Path, corpus: Path) -> None:
    """Move a freshly built index into place, replacing a stale one; another process's index of the same
    corpus, installed meanwhile, is kept (the two are identical)."""
    if directory.exists() and not _index_matches(corpus, directory):
        stale = directory.with_name(f"{tmp.name}.stale")
        try:
            directory.rename(stale)
        except OSError:  # moved away by another process meanwhile
            pass
        else:
            shutil.rmtree(stale)
    try:
        tmp.rename(directory)
    except OSError:  # installed concurrently by another process: same index, keep theirs
        shutil.rmtree(tmp)


class CachedRetriever:
    """Memoises another retriever by (retriever name, query, k): replays are cheap and exact.

    The cache can be saved to and loaded from a JSON file, so a rerun sees the same documents even
    if the underlying index changed (or was never built there).
    """

    def __init__(self, inner: Retriever, path: str | Path | None = None) -> None:
        self.inner = inner
        self.name = f"cached-{inner.name}"
        self.path = Path(path) if path else None
        self.cache: dict[str, list[dict]] = {}
        self.hits = self.misses = 0
        if self.path and self.path.exists():
            self.cache = json.loads(self.path.read_text())

    def _key(self, query: str, k: int) -> str:
        return json.dumps([self.inner.name, query, k])

    def search(self, queries: Sequence[str], k: int) -> list[list[dict]]:
        missing = sorted({q for q in queries if self._key(q, k) not in self.cache})
        for q, docs in zip(missing, self.inner.search(missing, k) if missing else []):
            self.cache[self._key(q, k)] = docs
        self.misses += len(missing)
        self.hits += len(queries) - len(missing)
        return [[dict(d) for d in self.cache[self._key(q, k)]] for q in queries]

    def save(self) -> None:
        """Write the cache to `path` (atomically)."""
        if self.path is None:
            raise ValueError("CachedRetriever was made without a path; nothing to save to")
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.cache, sort_keys=True))
        tmp.replace(self.path)
