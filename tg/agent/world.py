"""A seeded synthetic multi-hop knowledge world: the cpu preset's stand-in for wiki-18 + NQ/HotpotQA.

Entities (countries, cities, companies, people) get made-up one-word names and functional relations
(`RELATIONS`). Each entity has one short title-first document stating its relations, in the
Search-R1 wiki-18 corpus schema (`{"id", "contents": '"Title"\\ntext', "title"}`). A question asks
for the end of a relation path from a named entity; answering it takes one search per relation,
each query being the entity name read from the previous observation:

    "In which city was the founder of Zanto born?"   hops  = [Zanto, Aldo]
                                                     chain = [Aldo, Borv]   answer = Borv

Question rows use the FlashRAG schema (`id`, `question`, `golden_answers`, `data_source`) plus
`hops`, `chain` and `relations`, which script the warm-up demonstrations.

Departures from the real data, on purpose:
1. Relations are functional and assigned evenly (3 cities per country, ...), so no answer is more
   likely than the others of its type: without search, the best guess is near chance.
2. Train and test questions are disjoint (distinct relation paths), but they share the world's
   facts, as NQ/HotpotQA share Wikipedia.
3. `HOP_WEIGHTS` gives 4-hop questions a small share (as Musique has); they need 4 searches, one
   more than the paper's cap of 3 tool calls (`agent.max_turns`), so at that cap they are answerable
   only from memorised facts.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tg.config import DataConfig

WORLD_VERSION = 4
"""Bump when the generator changes: it is part of the cache key."""
REPO_ROOT = Path(__file__).resolve().parents[2]
ENTITY_TYPES = ("country", "city", "company", "person")
HOP_WEIGHTS = {2: 0.5, 3: 0.35, 4: 0.15}
"""Share of each hop count in the multi-hop sets."""
TRAIN_MULTI = 2000
"""Multi-hop training questions (at most; fewer if the world has fewer relation paths)."""
SINGLE, MULTI = "synthetic_single", "synthetic_multi"


@dataclass(frozen=True)
class Relation:
    """A functional relation subject -> object, with its wordings ({s}: subject, {o}: object)."""

    name: str
    subject: str
    object: str
    noun: str
    """The object's role: 'founder' in 'the founder of {s}'."""
    question: str
    """One-hop question asking for the object."""

    @property
    def phrase(self) -> str:
        """Noun phrase for the object, nested to build multi-hop questions ('the founder of {s}')."""
        return f"the {self.noun} of {{s}}"

    @property
    def sentence(self) -> str:
        """Document sentence stating the fact ("{s}'s founder is {o}.")."""
        return f"{{s}}'s {self.noun} is {{o}}."


RELATIONS = {r.name: r for r in (
    Relation("country", "city", "country", "country", "In which country is {s}?"),
    Relation("capital", "country", "city", "capital", "What is the capital of {s}?"),
    Relation("leader", "country", "person", "leader", "Who leads {s}?"),
    Relation("headquarters", "company", "city", "headquarters", "In which city is {s} headquartered?"),
    Relation("founder", "company", "person", "founder", "Who founded {s}?"),
    Relation("chief", "company", "person", "chief executive", "Who is the chief executive of {s}?"),
    Relation("birthplace", "person", "city", "birthplace", "In which city was {s} born?"),
    Relation("employer", "person", "company", "employer", "Which company does {s} work for?"),
)}
"""Every fact is stated as "<subject>'s <noun> is <object>.", the sentence the scripted thoughts restate:
reading is a look-up-and-copy keyed by '<noun> is', which occurs once per observation for the relation
asked (infobox-like passages; a design choice that lets a 1M-parameter model learn to read in minutes)."""


@dataclass
class Entity:
    """A named entity and its facts (relation name -> object entity name)."""

    name: str
    type: str
    facts: dict[str, str] = field(default_factory=dict)

    def document(self) -> str:
        """Title line, then one sentence per relation (wiki-18 'contents'); short, as the toy model reads it often."""
        sentences = [RELATIONS[r].sentence.format(s=self.name, o=o) for r, o in self.facts.items()]
        return f'"{self.name}"\n' + " ".join(sentences)


@dataclass
class World:
    """Entities, their documents and the question splits (rows as written to the JSONL files)."""

    entities: list[Entity]
    corpus: list[dict]
    train: list[dict]
    test: list[dict]

    def write(self, directory: str | Path) -> Path:
        """Write corpus.jsonl, train.jsonl, test.jsonl and entities.jsonl into `directory`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for name, rows in (("corpus", self.corpus), ("train", self.train), ("test", self.test),
                           ("entities", [asdict(e) for e in self.entities])):
            write_jsonl(d / f"{name}.jsonl", rows)
        return d

    def questions(self, split: str, source: str | None = None) -> list[dict]:
        """Rows of 'train' or 'test', optionally only one data_source (SINGLE or MULTI)."""
        rows = self.train if split == "train" else self.test
        return [q for q in rows if source is None or q["data_source"] == source]

    def texts(self) -> list[str]:
        """Every document and question text (the tiny tokenizer's vocabulary source)."""
        return [d["contents"] for d in self.corpus] + [q["question"] for q in self.train + self.test]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def load_world(directory: str | Path) -> World:
    """The World written by `World.write` (the same object, field for field)."""
    d = Path(directory)
    entities = [Entity(**e) for e in read_jsonl(d / "entities.jsonl")]
    return World(entities, read_jsonl(d / "corpus.jsonl"), read_jsonl(d / "train.jsonl"), read_jsonl(d / "test.jsonl"))


# ---- generation ----------------------------------------------------------------------------------

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "s", "m")
_RESERVED = {w.lower() for r in RELATIONS.values() for t in (r.sentence, r.question, r.phrase) for w in t.split()}


def make_names(n: int, rng: random.Random) -> list[str]:
    """`n` distinct pronounceable one-word names (two or three syllables), e.g. 'Borvan', 'Kelistu'."""
    names: set[str] = set()
    while len(names) < n:
        syllables = rng.choice((2, 2, 3))
        w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
        if 4 <= len(w) <= 9 and w not in _RESERVED:
            names.add(w.capitalize())
    return rng.sample(sorted(names), n)


def _spread(objects: list[str], n: int, rng: random.Random) -> list[str]:
    """`n` objects covering `objects` as evenly as possible (distinct while n <= len), in random order."""
    pool = rng.sample(objects, len(objects))
    out = [pool[i % len(pool)] for i in range(n)]
    rng.shuffle(out)
    return out


def _entities(cfg: DataConfig, rng: random.Random) -> dict[str, Entity]:
    counts = dict(country=cfg.n_countries, city=cfg.n_cities, company=cfg.n_companies, person=cfg.n_people)
    names = iter(make_names(sum(counts.values()), rng))
    by_type = {t: [Entity(next(names), t) for _ in range(counts[t])] for t in ENTITY_TYPES}
    countries, cities, companies, people = (by_type[t] for t in ENTITY_TYPES)
    for city, country in zip(cities, _spread([c.name for c in countries], len(cities), rng)):
        city.facts["country"] = country
    person_names = [p.name for p in people]
    for country, leader in zip(countries, _spread(person_names, len(countries), rng)):
        own = [c.name for c in cities if c.facts["country"] == country.name] or [rng.choice(cities).name]
        country.facts["capital"] = rng.choice(own)
        country.facts["leader"] = leader
    heads = _spread(person_names, 2 * len(companies), rng)  # founders and chiefs: distinct people while they last
    for i, (company, city) in enumerate(zip(companies, _spread([c.name for c in cities], len(companies), rng))):
        company.facts["headquarters"] = city
        company.facts["founder"], company.facts["chief"] = heads[2 * i], heads[2 * i + 1]
    homes = _spread([c.name for c in cities], len(people), rng)
    jobs = _spread([c.name for c in companies], len(people), rng)
    for person, home, job in zip(people, homes, jobs):
        person.facts["birthplace"], person.facts["employer"] = home, job
    return {e.name: e for t in ENTITY_TYPES for e in by_type[t]}


def _paths(entities: dict[str, Entity], max_hops: int) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """Every (start, relations, chain) of 1..max_hops hops that never revisits an entity."""
    out = []

    def walk(start: str, rels: tuple[str, ...], chain: tuple[str, ...]) -> None:
        if rels:
            out.append((start, rels, chain))
        if len(rels) == max_hops:
            return
        for r, o in entities[chain[-1] if chain else start].facts.items():
            if o != start and o not in chain:
                walk(start, rels + (r,), chain + (o,))

    for name in entities:
        walk(name, (), ())
    return out


def question_text(start: str, relations: tuple[str, ...]) -> str:
    """Nest the relations' phrases: ('founder', 'birthplace') -> 'In which city was the founder of X born?'."""
    subject = start
    for r in relations[:-1]:
        subject = RELATIONS[r].phrase.format(s=subject)
    return RELATIONS[relations[-1]].question.format(s=subject)


def _row(qid: str, source: str, start: str, rels: tuple[str, ...], chain: tuple[str, ...]) -> dict:
    return {"id": qid, "question": question_text(start, rels), "golden_answers": [chain[-1]], "data_source": source,
            "hops": [start, *chain[:-1]], "chain": list(chain), "relations": list(rels)}


def _split(paths: list, sizes: tuple[int, int], rng: random.Random) -> tuple[list, list]:
    picked = rng.sample(paths, min(len(paths), sum(sizes)))
    return picked[:sizes[0]], picked[sizes[0]:]


def build_world(cfg: DataConfig) -> World:
    """The world of `cfg.world_seed` and the entity counts: deterministic, pure (no I/O)."""
    rng = random.Random(f"tg-world-{WORLD_VERSION}-{cfg.world_seed}")
    entities = _entities(cfg, rng)
    corpus = [{"id": str(i), "contents": e.document(), "title": e.name} for i, e in enumerate(entities.values())]
    paths = _paths(entities, max(HOP_WEIGHTS))
    by_hops: dict[int, list] = {}
    for p in paths:
        by_hops.setdefault(len(p[1]), []).append(p)
    splits: dict[str, list] = {"train": [], "test": []}
    test1, train1 = _split(by_hops[1], (cfg.n_test_single, len(by_hops[1])), rng)
    for split, part in (("test", test1), ("train", train1)):
        splits[split] += [_row(f"{split}-single-{i}", SINGLE, *p) for i, p in enumerate(part)]
    multi = {"test": [], "train": []}
    for h, w in HOP_WEIGHTS.items():
        test_h, train_h = _split(by_hops.get(h, []), (round(cfg.n_test_multi * w), round(TRAIN_MULTI * w)), rng)
        multi["test"] += test_h
        multi["train"] += train_h
    for split in ("test", "train"):
        rng.shuffle(multi[split])
        splits[split] += [_row(f"{split}-multi-{i}", MULTI, *p) for i, p in enumerate(multi[split])]
    return World(list(entities.values()), corpus, splits["train"], splits["test"])


# ---- on-disk cache -------------------------------------------------------------------------------

def resolve(path: str | Path) -> Path:
    """A config path: absolute as given, relative ones under the repository root."""
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def world_key(cfg: DataConfig) -> str:
    """Hash of the fields that shape the world (not top_k, retriever, ...) and the generator version."""
    fields = ("world_seed", "n_countries", "n_cities", "n_companies", "n_people", "n_test_single", "n_test_multi")
    d = {f: getattr(cfg, f) for f in fields} | {"version": WORLD_VERSION, "hops": HOP_WEIGHTS, "train": TRAIN_MULTI}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def world_dir(cfg: DataConfig, cache_dir: str | Path) -> Path:
    """Where the world of `cfg` is cached: `<cache_dir>/world-<key>/` (written by `ensure_world`)."""
    return resolve(cache_dir) / f"world-{world_key(cfg)}"


def ensure_world(cfg: DataConfig, cache_dir: str | Path) -> Path:
    """Build and write the world unless cached; returns its directory (corpus/train/test.jsonl)."""
    d = world_dir(cfg, cache_dir)
    if not (d / "test.jsonl").exists():
        tmp = d.with_name(f"{d.name}.tmp-{random.randrange(1 << 30)}")
        build_world(cfg).write(tmp)
        try:
            tmp.rename(d)
        except OSError:  # another process won the race: its identical world stays
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    return d
