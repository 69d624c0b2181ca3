"""The search tool: a `Retriever` protocol, BM25 over any wiki-18 style JSONL corpus, and a cache.

A corpus row is `{"id", "contents"}` with the title on the first line of `contents` (wiki-18), or an
explicit `title` field. Every retriever returns, per query, the top-k documents as
`{"id", "title", "contents"}` dicts, ready for `tg.protocol.format_observation`.

Departures from the paper (docs/paper.md#retriever):
1. The paper retrieves with dense E5 embeddings and an exact FAISS index; the cpu preset uses BM25
   (`bm25s`, English stopwords, no stemming), which finds an entity's page from its name alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, Sequence

import bm25s
import numpy as np


class Retriever(Protocol):
    name: str

    def search(self, queries: Sequence[str], k: int) -> list[list[dict]]:
        """Top-k documents per query: `len(queries)` lists of k dicts {id, title, contents}."""
        ...


def doc_title(row: dict) -> str:
    """A corpus row's title: its `title` field, else the first line of `contents` without quotes (wiki-18)."""
    return row.get("title") or row["contents"].split("\n", 1)[0].strip().strip('"')


def read_corpus(path: str | Path) -> list[dict]:
    """A JSONL corpus as `{"id", "title", "contents"}` dicts."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                rows.append({"id": str(r["id"]), "title": doc_title(r), "contents": r["contents"]})
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
        index = bm25s.BM25()
        index.index(_tokenize([d["contents"] for d in docs], return_ids=True), show_progress=False)
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


def bm25_for(corpus_path: str | Path) -> BM25Retriever:
    """The BM25 index of a corpus, built once and cached beside it in `bm25/`."""
    directory = Path(corpus_path).parent / "bm25"
    if (directory / "docs.jsonl").exists():
        return BM25Retriever.load(directory)
    retriever = BM25Retriever.build(corpus_path)
    tmp = directory.with_name(f"bm25.tmp-{np.random.randint(1 << 30)}")
    retriever.save(tmp)
    try:
        tmp.rename(directory)
    except OSError:  # built concurrently by another process: same index, keep theirs
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return retriever


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
