"""The synthetic world: deterministic, well-formed, disjoint splits, and fair (not guessable without search)."""

from __future__ import annotations

import dataclasses
import filecmp
from collections import Counter
from pathlib import Path

import pytest

from tg.config import DataConfig
from tg.agent.world import (MULTI, RELATIONS, SINGLE, World, build_world, ensure_world, load_world, question_text,
                            world_dir)


def answer_type(row: dict) -> str:
    """The entity type of a question's answer (the object type of its last relation)."""
    return RELATIONS[row["relations"][-1]].object


def most_common_answers(rows: list[dict]) -> dict[str, str]:
    """The most frequent golden answer per answer type: the no-search baseline's guesses."""
    counts: dict[str, Counter] = {}
    for q in rows:
        counts.setdefault(answer_type(q), Counter())[q["golden_answers"][0]] += 1
    return {t: c.most_common(1)[0][0] for t, c in counts.items()}


@pytest.fixture(scope="module")
def world() -> World:
    return build_world(DataConfig())


def test_same_seed_same_files_other_seed_other_world(tmp_path: Path) -> None:
    a = build_world(DataConfig()).write(tmp_path / "a")
    b = build_world(DataConfig()).write(tmp_path / "b")
    c = build_world(DataConfig(world_seed=1)).write(tmp_path / "c")
    names = ["corpus.jsonl", "train.jsonl", "test.jsonl", "entities.jsonl"]
    assert filecmp.cmpfiles(a, b, names, shallow=False)[0] == names
    assert not any(filecmp.cmp(a / n, c / n, shallow=False) for n in names)


def test_write_load_round_trip(world: World, tmp_path: Path) -> None:
    assert load_world(world.write(tmp_path)) == world


def test_counts_and_schema(world: World) -> None:
    cfg = DataConfig()
    assert Counter(e.type for e in world.entities) == {"country": 12, "city": 36, "company": 48, "person": 120}
    assert len({e.name for e in world.entities}) == 216 and all(" " not in e.name for e in world.entities)
    assert len(world.questions("test", SINGLE)) == cfg.n_test_single
    assert len(world.questions("test", MULTI)) == cfg.n_test_multi
    assert len(world.questions("train", SINGLE)) > 200 and len(world.questions("train", MULTI)) > 1000
    for doc in world.corpus:
        assert set(doc) == {"id", "contents", "title"}
        assert doc["contents"].split("\n")[0] == f'"{doc["title"]}"'  # wiki-18: the first line is the title
    for q in world.train + world.test:
        assert set(q) == {"id", "question", "golden_answers", "data_source", "hops", "chain", "relations"}
        assert len(q["hops"]) == len(q["chain"]) == len(q["relations"])
        assert q["golden_answers"] == [q["chain"][-1]] and q["hops"][1:] == q["chain"][:-1]
        assert (len(q["hops"]) == 1) == (q["data_source"] == SINGLE) and len(q["hops"]) <= 4


def test_each_hop_is_stated_in_the_searched_document(world: World) -> None:
    """The chain is readable: hop i's document states chain[i] (the next search query or the answer)."""
    docs = {d["title"]: d["contents"] for d in world.corpus}
    for q in world.test:
        for hop, rel, obj in zip(q["hops"], q["relations"], q["chain"]):
            assert RELATIONS[rel].sentence.format(s=hop, o=obj) in docs[hop]


def test_splits_disjoint_by_question(world: World) -> None:
    train = {q["question"] for q in world.train}
    assert not train & {q["question"] for q in world.test}
    assert len({q["id"] for q in world.train + world.test}) == len(world.train) + len(world.test)


def test_multi_hop_mix() -> None:
    hops = Counter(len(q["hops"]) for q in build_world(DataConfig()).questions("test", MULTI))
    assert hops == {2: 150, 3: 105, 4: 45}


def test_question_wording() -> None:
    assert question_text("Zanto", ("founder", "birthplace")) == "In which city was the founder of Zanto born?"
    assert question_text("Borv", ("country",)) == "In which country is Borv?"


def test_no_search_baseline_near_chance(world: World) -> None:
    """Answering the most common training answer of the right type: about 1/12 at best (countries)."""
    guess = most_common_answers(world.train)
    for source in (SINGLE, MULTI):
        rows = world.questions("test", source)
        em = sum(q["golden_answers"][0] == guess[answer_type(q)] for q in rows) / len(rows)
        assert em < 0.1, source
    countries = Counter(q["golden_answers"][0] for q in world.test if answer_type(q) == "country")
    assert len(countries) == 12 and max(countries.values()) / sum(countries.values()) < 0.2


def test_ensure_world_caches_by_key(tmp_path: Path) -> None:
    cfg = DataConfig(n_people=40, n_companies=20, n_cities=12, n_countries=4, n_test_single=30, n_test_multi=30)
    path = ensure_world(cfg, tmp_path)
    assert path == world_dir(cfg, tmp_path) and load_world(path) == build_world(cfg)
    assert ensure_world(dataclasses.replace(cfg, top_k=5), tmp_path) == path  # retrieval knobs share the world
    assert ensure_world(dataclasses.replace(cfg, world_seed=3), tmp_path) != path
