"""BM25 finds every entity's page from its name; save/load and the cache replay results exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tg.agent.data import DataError
from tg.agent.protocol import format_observation
from tg.agent.retrieval import BM25Retriever, CachedRetriever, bm25_for, doc_title, read_corpus
from tg.agent.world import build_world
from tg.config import DataConfig


@pytest.fixture(scope="module")
def world_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_world(DataConfig()).write(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def bm25(world_path: Path) -> BM25Retriever:
    return BM25Retriever.build(world_path / "corpus.jsonl")


def test_title_query_finds_its_document(bm25: BM25Retriever) -> None:
    titles = [d["title"] for d in bm25.docs]
    results = bm25.search(titles, k=3)
    assert len(titles) == 216
    assert [r[0]["title"] for r in results] == titles
    assert all(len(r) == 3 and set(r[0]) == {"id", "title", "contents"} for r in results)


def test_title_from_first_line_as_in_wiki18(tmp_path: Path) -> None:
    rows = [{"id": 0, "contents": '"Borv"\nBorv is a city.'}, {"id": 1, "contents": '"Kalden"\nKalden is a land.'}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [d["title"] for d in read_corpus(tmp_path / "c.jsonl")] == ["Borv", "Kalden"]
    assert doc_title({"contents": "x\ny", "title": "T"}) == "T"
    found = BM25Retriever.build(tmp_path / "c.jsonl").search(["kalden", "nothing known"], k=5)
    assert found[0][0]["id"] == "1" and len(found[0]) == 2  # k is capped by the corpus size
    assert [d["id"] for d in found[1]] == ["0", "1"]  # no known word: corpus order


def test_save_load_identical(bm25: BM25Retriever, tmp_path: Path) -> None:
    queries = ["Who founded it?", bm25.docs[7]["title"], bm25.docs[100]["title"] + " born"]
    loaded = BM25Retriever.load(bm25.save(tmp_path / "idx"), mmap=True)
    assert loaded.search(queries, 3) == bm25.search(queries, 3)


def test_bm25_for_caches_beside_corpus(world_path: Path) -> None:
    first = bm25_for(world_path / "corpus.jsonl")
    assert (world_path / "bm25" / "docs.jsonl").exists()
    assert bm25_for(world_path / "corpus.jsonl").search(["x"], 2) == first.search(["x"], 2)


def _corpus(path: Path, titles: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{t} is a city.'}) + "\n"
                            for i, t in enumerate(titles)))
    return path


def _later(path: Path) -> None:
    """Move the file's mtime a second on, as a later edit would (whatever the file system's resolution)."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_a_changed_corpus_rebuilds_its_cached_index(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", ["Borv", "Kalden"])
    assert [d["title"] for d in bm25_for(corpus).docs] == ["Borv", "Kalden"]
    _corpus(corpus, ["Borv", "Kalden", "Ustra"])                        # grown
    assert bm25_for(corpus).search(["Ustra"], 1)[0][0]["title"] == "Ustra"
    _corpus(corpus, ["Borv", "Kalden", "Narmo"])                        # same size, other bytes
    _later(corpus)
    assert [d["title"] for d in bm25_for(corpus).docs] == ["Borv", "Kalden", "Narmo"]
    inode = (tmp_path / "bm25" / "docs.jsonl").stat().st_ino
    _later(corpus)                                                      # touched, not changed: the index stays
    assert [d["title"] for d in bm25_for(corpus).docs] == ["Borv", "Kalden", "Narmo"]
    assert (tmp_path / "bm25" / "docs.jsonl").stat().st_ino == inode
    (tmp_path / "bm25" / "corpus.json").unlink()        # an index that records no corpus (an earlier tg's) ...
    bm25_for(corpus)                                    # ... is kept if its documents are the corpus's
    assert (tmp_path / "bm25" / "docs.jsonl").stat().st_ino == inode and (tmp_path / "bm25" / "corpus.json").exists()
    (tmp_path / "bm25" / "corpus.json").unlink()
    _corpus(corpus, ["Borv"])                           # ... and rebuilt if not
    assert [d["title"] for d in bm25_for(corpus).docs] == ["Borv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25", "corpus.jsonl"]  # no temporary left


@pytest.mark.parametrize("lines, error", [
    (b'{"id": 0, "contents": "\\"A\\"\\nA is."}\n\n{oops\n', r"c\.jsonl:3: not valid JSON"),
    (b'{"id": 0}\n', r"c\.jsonl:1: no `contents` \(found: id\)"),
    (b'{"contents": "x"}\n', r"c\.jsonl:1: no `id`"),
    (b'["id", "contents"]\n', r"c\.jsonl:1: the line is list, not a JSON object"),
    (b'{"id": 0, "contents": 5}\n', r"c\.jsonl:1: `id` must be .* `contents` .* strings"),
    (b'{"id": 0, "contents": "caf\xe9"}\n', r"c\.jsonl:1: not UTF-8 text \(byte 0xe9"),
    (b"\n  \n", r"c\.jsonl: no documents \(the corpus is empty\)"),
])
def test_a_bad_corpus_names_file_line_and_fix(tmp_path: Path, lines: bytes, error: str) -> None:
    (tmp_path / "c.jsonl").write_bytes(lines)
    with pytest.raises(DataError, match=error) as err:
        read_corpus(tmp_path / "c.jsonl")
    assert "\n" not in str(err.value)


def test_a_corpus_bm25_cannot_index_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such corpus file"):
        bm25_for(tmp_path / "absent.jsonl")
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": 0, "contents": "it is"}) + "\n")
    with pytest.raises(DataError, match="no document has a word BM25 can index"):
        bm25_for(tmp_path / "c.jsonl")
    assert not (tmp_path / "bm25").exists()


def test_cache_replays_exactly(bm25: BM25Retriever, tmp_path: Path) -> None:
    cached = CachedRetriever(bm25, tmp_path / "cache.json")
    queries = [bm25.docs[3]["title"], bm25.docs[4]["title"], bm25.docs[3]["title"]]
    first = cached.search(queries, 3)
    assert first == bm25.search(queries, 3) and (cached.misses, cached.hits) == (2, 1)
    cached.save()
    replay = CachedRetriever(bm25, tmp_path / "cache.json")
    assert replay.search(queries, 3) == first and replay.misses == 0
    assert replay.search(queries[:1], 2) == bm25.search(queries[:1], 2) and replay.misses == 1  # k is in the key
    first[0][0]["title"] = "mutated"
    assert cached.search(queries[:1], 3)[0][0]["title"] != "mutated"  # callers get copies


def test_observation_names_the_documents(bm25: BM25Retriever) -> None:
    title = bm25.docs[0]["title"]
    obs = format_observation(bm25.search([title], 3)[0])
    assert obs.startswith("\n\n<information>Doc 1(Title: " + title + ")") and obs.count("Doc ") == 3
