"""Question files in the Search-R1 / FlashRAG schema, and `prepare` to build them (paper App. A; docs/paper.md#data).

A question row needs `question` and `golden_answers` (a list of strings, or one string) and
usually `data_source`. Accepted variants, so raw FlashRAG files and Search-R1 files both load:
- no `golden_answers`: Search-R1's `reward_model.ground_truth.target` is used instead;
- no `data_source`: the `data_source` argument, else the file's folder name (FlashRAG layout
  `<dataset>/<split>.jsonl`, e.g. `nq/test.jsonl` -> 'nq');
- no `id`: Search-R1's `extra_info.index`, else '<data_source>-<row number>'.

`prepare` writes Search-R1's columns (id, question, golden_answers, data_source, prompt, ability,
reward_model, extra_info), so its files also feed the official code. Departures, numbered:
1. Ids are prefixed with the data source ('nq-test_12') so they are unique in the merged test file.
2. FlashRAG's per-dataset `metadata` column is dropped (its fields differ across datasets).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from tg.agent.protocol import build_prompt
from tg.agent.world import SINGLE
from tg.reward import normalize_answer

SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "single-hop": ("nq", ("nq", "triviaqa", "popqa")),
    "multi-hop": ("hotpotqa", ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")),
}
"""setting -> (training set, test sets), paper App. A."""


def is_single_hop(data_source: str) -> bool:
    """Whether a question from `data_source` is single-hop: the synthetic world's single-hop set and the paper's
    single-hop test sets (Table 1's left half). Every other source counts as multi-hop."""
    return data_source == SINGLE or data_source in SETTINGS["single-hop"][1]

TEST_SIZES: dict[str, int] = {"nq": 3610, "triviaqa": 11313, "popqa": 14267, "hotpotqa": 7405,
                              "2wikimultihopqa": 12576, "musique": 2417, "bamboogle": 125}
"""Questions in each test set (paper App. A), for estimates before the files exist."""

TEST_SPLIT_ORDER = ("test", "dev", "train")
"""Split used as a dataset's test set: the first present (as the official code; docs/paper.md#data)."""

HUB_SOURCE = "RUC-NLPIR/FlashRAG_datasets"
_SUFFIXES = (".parquet", ".jsonl", ".json")
_PREPARE_HINT = "`tg data prepare --setting <setting> --out <dir>` (tg.agent.data.prepare)"


class DataError(ValueError):
    """A question file or dataset source is unusable; the message says which and how to fix it."""


@dataclass(frozen=True)
class Question:
    """One QA example: gold answers are compared with EM / F1 after SQuAD normalisation."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    data_source: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Every other column of the row (prompt, reward_model, extra_info, metadata, ...)."""


def json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """The JSON value of every non-blank line of a JSON-lines file, with where it is ('file:line').
    Bytes that are not UTF-8 and lines that are not JSON raise `DataError` naming the file and line."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                                "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from e
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError
                why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else "nested too deeply"
                raise DataError(f"{where}: not valid JSON ({why}); each line must be one JSON object") from e


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """Rows of a parquet or JSON-lines file as plain Python values, each with where it is."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"{path}: row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    return list(json_lines(path))


def _nested(row: dict[str, Any], *keys: str) -> Any:
    """row[k1][k2]... or None where a level is missing or not a JSON object."""
    for key in keys:
        row = row.get(key) if isinstance(row, dict) else None
    return row


def _golds(row: dict[str, Any]) -> Any:
    if "golden_answers" in row:
        return row["golden_answers"]
    return _nested(row, "reward_model", "ground_truth", "target")


def shown_keys(row: dict[str, Any]) -> str:
    """A row's keys for a one-line message: sorted, escaped as Python writes them ('a\\nb'), or 'none'."""
    return ", ".join(repr(k)[1:-1] for k in sorted(row)) or "none"


def _missing(where: str, column: str, row: dict[str, Any]) -> DataError:
    return DataError(
        f"{where}: missing column {column!r} (found: {shown_keys(row)}). tg reads the "
        "Search-R1/FlashRAG schema: `question` (str), `golden_answers` (list of str), `data_source` (str). "
        f"Rename the column, or rebuild the file with {_PREPARE_HINT}.")


def _gold_tuple(golds: Any, where: str) -> tuple[str, ...]:
    """Gold answers as a tuple of strings: one string, or a non-empty list of strings (numbers are written out), each
    keeping something under EM's normalisation (tg.reward.normalize_answer drops articles and punctuation: a gold
    "The The" would match any answer made of articles, an empty one nothing a policy says)."""
    ok = isinstance(golds, str) or isinstance(golds, (list, tuple)) and len(golds) > 0 and all(
        isinstance(g, (str, int, float)) and not isinstance(g, bool) for g in golds)
    if not ok:
        shown = json.dumps(golds, default=str)[:100]
        raise DataError(f"{where}: `golden_answers` is {shown}; it must be a non-empty list of strings (or one "
                        'string), e.g. ["Paris"]. Fix the row or drop it.')
    out = (golds,) if isinstance(golds, str) else tuple(str(g) for g in golds)
    if (empty := next((g for g in out if not normalize_answer(g)), None)) is not None:
        raise DataError(f"{where}: gold answer {empty!r} is empty once normalised (lowercase, no articles or "
                        "punctuation), so exact match would score it against any answer of articles or none; fix the "
                        "row or drop it.")
    return out


def _to_question(row: Any, index: int, source: str, where: str) -> Question:
    if not isinstance(row, dict):
        raise DataError(f"{where}: the row is {type(row).__name__}, expected a JSON object")
    if "question" not in row:
        raise _missing(where, "question", row)
    if not isinstance(row["question"], str) or not row["question"].strip():
        shown = json.dumps(row["question"], default=str)[:100]
        raise DataError(f"{where}: `question` is {shown}; it must be a non-empty string. Fix the row or drop it.")
    golds = _golds(row)
    if golds is None:
        raise _missing(where, "golden_answers", row)
    golds = _gold_tuple(golds, where)
    data_source = str(row.get("data_source") or source)
    qid = row.get("id", _nested(row, "extra_info", "index"))
    extra = {k: v for k, v in row.items() if k not in ("id", "question", "golden_answers", "data_source")}
    return Question(id=str(qid) if qid is not None else f"{data_source}-{index}", question=row["question"],
                    golden_answers=golds, data_source=data_source, extra=extra)


def load_questions(path: str | Path, data_source: str | None = None, limit: int | None = None) -> list[Question]:
    """Questions from a parquet or JSONL file (see the module docstring for the accepted columns).

    data_source: used for rows without a `data_source` column (default: the file's folder name).
    limit: keep only the first `limit` rows.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file; build train/test files with {_PREPARE_HINT}")
    if path.suffix not in _SUFFIXES:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use .parquet or .jsonl")
    rows = _read_rows(path)
    if not rows:
        raise DataError(f"{path}: no questions (the file is empty); rebuild it with {_PREPARE_HINT}")
    source = data_source or path.parent.name
    return [_to_question(r, i, source, where) for i, (where, r) in enumerate(rows[:limit])]


def split_file(data_dir: str | Path, split: str) -> Path:
    """The file of one split in a directory: `<split>.parquet`, `.jsonl` or `.json`, first found."""
    for suffix in _SUFFIXES:
        p = Path(data_dir) / f"{split}{suffix}"
        if p.is_file():
            return p
    raise DataError(f"{data_dir}: no {split}.parquet or {split}.jsonl; build it with {_PREPARE_HINT} "
                    "or copy your file there")


def load_split(data_dir: str | Path, split: str, limit: int | None = None) -> list[Question]:
    """Questions of `<data_dir>/<split>.{parquet,jsonl}` (e.g. the output of `prepare`)."""
    return load_questions(split_file(data_dir, split), limit=limit)


# ---- prepare: FlashRAG datasets -> Search-R1 train/test parquet --------------------------------

def _load_dataset_dict(source: str, name: str, cache_dir: str | None) -> Any:
    """One FlashRAG dataset as a `datasets.DatasetDict`, from a local directory or a hub id."""
    import datasets

    local = Path(source).expanduser()
    if local.is_dir():
        files = {p.stem: str(p) for p in sorted((local / name).glob("*")) if p.suffix in _SUFFIXES}
        if not files:
            raise DataError(f"{local / name}: no split files; expected the FlashRAG layout "
                            f"{name}/train.jsonl, {name}/test.jsonl (or dev), .jsonl or .parquet")
        kinds = {"parquet" if f.endswith(".parquet") else "json" for f in files.values()}
        if len(kinds) > 1:
            raise DataError(f"{local / name}: mixes parquet and JSON split files; keep one format per dataset")
        return datasets.load_dataset(kinds.pop(), data_files=files, cache_dir=cache_dir)
    try:
        return datasets.load_dataset(source, name, cache_dir=cache_dir)
    except (OSError, ValueError) as e:  # ConnectionError (offline) and FileNotFoundError are OSErrors
        raise DataError(
            f"could not load {name!r} from the hub dataset {source!r} ({type(e).__name__}: {e}). If the hub is "
            f"unreachable, download the FlashRAG files ({name}/train.jsonl, {name}/test.jsonl, ...) where it "
            f"is reachable, copy them here and pass source='/path/to/FlashRAG_datasets', a local directory "
            f"in the same <dataset>/<split>.jsonl layout."
        ) from e


def _rows(dataset: Iterable[dict[str, Any]], name: str, split: str) -> list[dict[str, Any]]:
    """Search-R1 training rows (departures 1 and 2 of the module docstring)."""
    out = []
    for i, row in enumerate(dataset):
        golds = row["golden_answers"]
        golds = [golds] if isinstance(golds, str) else [str(g) for g in golds]
        out.append({
            "id": f"{name}-{row.get('id', i)}", "question": row["question"], "golden_answers": golds,
            "data_source": name, "prompt": [{"role": "user", "content": build_prompt(row["question"])}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"split": split, "index": i},
        })
    return out


def _pick_split(dd: Any, name: str, wanted: tuple[str, ...]) -> str:
    for split in wanted:
        if split in dd:
            return split
    raise DataError(f"dataset {name!r} has splits {sorted(dd)}; needed one of {list(wanted)}")


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def prepare(setting: str, out_dir: str | Path, source: str = HUB_SOURCE, cache_dir: str | None = None,
            progress: bool = True) -> dict[str, Path]:
    """Build `<out_dir>/train.parquet` and `<out_dir>/test.parquet` for one setting (paper App. A).

    setting: 'single-hop' (train NQ; test NQ, TriviaQA, PopQA) or 'multi-hop' (train HotpotQA;
        test HotpotQA, 2WikiMultiHopQA, Musique, Bamboogle). Each test set uses its `test`
        split if present, else `dev` (else `train`, as the official code).
    source: a hub dataset id, or a local directory in the FlashRAG layout `<dataset>/<split>.jsonl`
        (or .parquet); both go through `datasets.load_dataset` and the same conversion.
    cache_dir: the `datasets` cache (default: the HF default). progress: show a tqdm bar.
    Returns {'train': path, 'test': path}.
    """
    from tg.progress import tqdm

    if setting not in SETTINGS:
        raise DataError(f"setting must be one of {sorted(SETTINGS)}, got {setting!r}")
    train_name, test_names = SETTINGS[setting]
    jobs = [("train", train_name)] + [("test", n) for n in test_names]
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for role, name in tqdm(jobs, desc=f"prepare {setting}", unit="dataset", disable=not progress):
        dd = _load_dataset_dict(source, name, cache_dir)
        split = _pick_split(dd, name, ("train",) if role == "train" else TEST_SPLIT_ORDER)
        rows[role] += _rows(dd[split], name, split)
    out = Path(out_dir)
    return {role: _write_parquet(r, out / f"{role}.parquet") for role, r in rows.items()}


# ---- the wiki-18 corpus (docs/paper.md#retriever) -----------------------------------------------------

WIKI18_HUB = "PeterJinGo/wiki-18-corpus"
"""Search-R1's wiki-18 corpus (DPR's 2018 Wikipedia in 100-word passages, 21,015,324 rows) as wiki-18.jsonl.gz."""


def prepare_corpus(out_dir: str | Path, source: str = WIKI18_HUB) -> Path:
    """`<out_dir>/wiki-18.jsonl` ({"id", "contents": '"Title"\\ntext'} rows) from the hub or a local file.

    source: a hub dataset id holding `wiki-18.jsonl.gz` (the default; a multi-GB download), or a
    local `.jsonl.gz` / `.jsonl` file (copied from a machine with network).
    An existing output is kept. Serve it with `tg retriever serve --corpus <out_dir>/wiki-18.jsonl`.
    """
    import gzip
    import shutil

    out = Path(out_dir) / "wiki-18.jsonl"
    if out.is_file():
        return out
    local = Path(source).expanduser()
    if not local.is_file():
        from huggingface_hub import hf_hub_download
        try:
            local = Path(hf_hub_download(source, "wiki-18.jsonl.gz", repo_type="dataset", local_dir=str(out_dir)))
        except (OSError, ValueError) as e:
            raise DataError(f"could not download wiki-18.jsonl.gz from the hub dataset {source!r} "
                            f"({type(e).__name__}: {e}). Where the hub is reachable run `hf download "
                            f"{source} wiki-18.jsonl.gz --repo-type dataset`, copy wiki-18.jsonl.gz here and pass "
                            "--source /path/to/wiki-18.jsonl.gz") from e
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".jsonl.tmp")
    with (gzip.open(local, "rb") if local.suffix == ".gz" else local.open("rb")) as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 24)
    tmp.replace(out)
    return out
