"""tg.agent.data: loading Search-R1/FlashRAG question files and `prepare` from a local FlashRAG layout."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tg.agent.data import DataError, Question, load_questions, load_split, prepare
from tg.agent.protocol import build_prompt


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _flashrag_rows(name: str, split: str, n: int) -> list[dict]:
    """Rows as FlashRAG ships them: id, question, golden_answers, metadata (no data_source)."""
    return [{"id": f"{split}_{i}", "question": f"{name} question {i}", "golden_answers": [f"{name}-a{i}", "alt"],
             "metadata": {"kind": name, "n": i}} for i in range(n)]


def test_loads_search_r1_parquet(tmp_path: Path) -> None:
    rows = [{"id": "q1", "question": "Who?", "golden_answers": ["Kalden"], "data_source": "nq",
             "extra_info": {"index": 0}}]
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    (q,) = load_questions(path)
    assert q == Question("q1", "Who?", ("Kalden",), "nq")
    assert q.extra == {"extra_info": {"index": 0}}


def test_accepts_flashrag_raw_and_search_r1_variants(tmp_path: Path) -> None:
    raw = load_questions(_jsonl(tmp_path / "popqa" / "test.jsonl", _flashrag_rows("popqa", "test", 2)))
    assert [q.data_source for q in raw] == ["popqa", "popqa"]  # from the folder name
    assert raw[0].golden_answers == ("popqa-a0", "alt") and raw[0].extra["metadata"]["n"] == 0
    variant = [{"question": "Q", "reward_model": {"ground_truth": {"target": "one gold"}}, "extra_info": {"index": 7}},
               {"question": "R", "golden_answers": "bare string"}]
    qs = load_questions(_jsonl(tmp_path / "v.jsonl", variant), data_source="mine", limit=5)
    assert [(q.id, q.golden_answers, q.data_source) for q in qs] == [
        ("7", ("one gold",), "mine"), ("mine-1", ("bare string",), "mine")]


def test_missing_column_error_names_file_and_fix(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "train.jsonl", [{"question": "Q", "answer": "x"}])
    with pytest.raises(DataError) as err:
        load_questions(path)
    msg = str(err.value)
    assert str(path) in msg and "'golden_answers'" in msg and "answer, question" in msg and "prepare" in msg
    with pytest.raises(DataError, match="'question'"):
        load_questions(_jsonl(tmp_path / "b.jsonl", [{"golden_answers": ["x"]}]))


def test_bad_files_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_questions(tmp_path / "absent.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Q", "golden_answers": ["x"]}\n{oops\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        load_questions(bad)
    with pytest.raises(DataError, match="no test.parquet or test.jsonl"):
        load_split(tmp_path, "test")


@pytest.mark.parametrize("row, error", [
    ({"question": "Q", "golden_answers": []}, r"t\.jsonl:2: `golden_answers` is \[\]; it must be a non-empty list"),
    ({"question": "Q", "golden_answers": 5}, r"t\.jsonl:2: `golden_answers` is 5; it must be a non-empty list"),
    ({"question": "Q", "golden_answers": [None]}, r"t\.jsonl:2: `golden_answers` is \[null\]"),
    ({"question": None, "golden_answers": ["x"]}, r"t\.jsonl:2: `question` is null; it must be a non-empty string"),
    ({"question": "  ", "golden_answers": ["x"]}, r"t\.jsonl:2: `question` is \"  \"; it must be"),
    ({"question": "Q", "reward_model": 5}, r"t\.jsonl:2: missing column 'golden_answers'"),
    ({"question": "Q", "golden_answers": ""}, r"t\.jsonl:2: gold answer '' is empty once normalised"),
    ({"question": "Q", "golden_answers": ["Paris", "The The"]}, r"t\.jsonl:2: gold answer 'The The' is empty once"),
    ({"question": "Q", "golden_answers": ["A"]}, r"t\.jsonl:2: gold answer 'A' is empty once normalised .* any answer "
                                                 r"of articles"),
    ([1, 2], r"t\.jsonl:2: the row is list, expected a JSON object"),
])
def test_a_bad_question_row_names_file_line_and_fix(tmp_path: Path, row, error: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + json.dumps(row) + "\n")  # a blank first line: the line number is the file's
    with pytest.raises(DataError, match=error):
        load_questions(path)


def test_unreadable_or_empty_question_files_name_the_file(tmp_path: Path) -> None:
    latin1 = tmp_path / "l.jsonl"
    latin1.write_bytes(b'{"question": "Q", "golden_answers": ["x"]}\n{"question": "caf\xe9", "golden_answers": ["x"]}\n')
    with pytest.raises(DataError, match=r"l\.jsonl:2: not UTF-8 text \(byte 0xe9 at column 18\)"):
        load_questions(latin1)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"question": "Q", "golden_answers": ["x"]}\n')
    assert load_questions(bom)[0].question == "Q"
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(DataError, match=r"train\.jsonl: no questions \(the file is empty\)"):
        load_split(tmp_path, "train")


def test_preflight_fails_on_an_empty_train_file(tmp_path: Path) -> None:
    from tg.config import load_config
    from tg.gpu.preflight import check_data
    _jsonl(tmp_path / "test.jsonl", [{"question": "Q", "golden_answers": ["x"]}])
    (tmp_path / "train.jsonl").write_text("\n")
    cfg = load_config("paper-1.5b-multi-hop", f"data.data_dir={tmp_path}")
    check = check_data(cfg)
    assert check.failed and "no questions" in check.detail and check.fix.startswith("tg data prepare")
    _jsonl(tmp_path / "train.jsonl", [{"question": "Q", "golden_answers": ["x"]}] * 2)
    assert check_data(cfg).status == "ok" and "(2 questions)" in check_data(cfg).detail


@pytest.fixture
def flashrag_dir(tmp_path: Path) -> Path:
    """A tiny local copy in the FlashRAG layout; triviaqa has no test split (dev is used)."""
    root = tmp_path / "FlashRAG_datasets"
    _jsonl(root / "nq" / "train.jsonl", _flashrag_rows("nq", "train", 5))
    _jsonl(root / "nq" / "dev.jsonl", _flashrag_rows("nq", "dev", 2))
    _jsonl(root / "nq" / "test.jsonl", _flashrag_rows("nq", "test", 3))
    _jsonl(root / "triviaqa" / "dev.jsonl", _flashrag_rows("triviaqa", "dev", 2))
    _jsonl(root / "triviaqa" / "train.jsonl", _flashrag_rows("triviaqa", "train", 4))
    _jsonl(root / "popqa" / "test.jsonl", _flashrag_rows("popqa", "test", 1))
    return root


def test_prepare_single_hop_from_local_directory(flashrag_dir: Path, tmp_path: Path) -> None:
    out = prepare("single-hop", tmp_path / "out", source=str(flashrag_dir), cache_dir=str(tmp_path / "hf"),
                  progress=False)
    assert out == {"train": tmp_path / "out" / "train.parquet", "test": tmp_path / "out" / "test.parquet"}
    train, test = load_split(tmp_path / "out", "train"), load_split(tmp_path / "out", "test")
    assert len(train) == 5 and {q.data_source for q in train} == {"nq"}
    counts = {s: sum(q.data_source == s for q in test) for s in ("nq", "triviaqa", "popqa")}
    assert counts == {"nq": 3, "triviaqa": 2, "popqa": 1}  # nq: test split; triviaqa: dev (no test)
    assert {q.extra["extra_info"]["split"] for q in test if q.data_source == "triviaqa"} == {"dev"}
    assert len({q.id for q in test}) == len(test)  # ids unique across the merged sets
    q = train[0]
    assert q.golden_answers == ("nq-a0", "alt") and q.id == "nq-train_0"
    assert q.extra["prompt"] == [{"role": "user", "content": build_prompt(q.question)}]
    assert q.extra["reward_model"]["ground_truth"]["target"] == ["nq-a0", "alt"]
    assert "metadata" not in q.extra


def test_prepare_names_a_missing_dataset(flashrag_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="hotpotqa.*FlashRAG layout"):
        prepare("multi-hop", tmp_path / "out", source=str(flashrag_dir), progress=False)
    with pytest.raises(DataError, match="setting"):
        prepare("web", tmp_path / "out", source=str(flashrag_dir), progress=False)


def test_prepare_hub_unreachable_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # no network in tests
    with pytest.raises(DataError) as err:
        prepare("single-hop", tmp_path / "out", source="RUC-NLPIR/FlashRAG_datasets",
                cache_dir=str(tmp_path / "hf"), progress=False)
    msg = str(err.value)
    assert "RUC-NLPIR/FlashRAG_datasets" in msg and "'nq'" in msg and "local directory" in msg


def test_evaluation_takes_the_first_n_of_every_test_set():
    """All 7 test sets reach the evaluation: eval.n_single / n_multi cap each data source, 0 = all."""
    from tg.config import load_config
    from tg.pipeline import Resources
    test = [Question(f"{s}-{i}", "q", ("a",), s) for s in ("nq", "triviaqa", "popqa", "hotpotqa", "bamboogle")
            for i in range(4)]
    res = Resources(Path("."), [], test, None, "")
    single, multi = res.test_sets(load_config("cpu", "eval.n_single=2", "eval.n_multi=3"))
    assert [q.id for q in single] == ["nq-0", "nq-1", "triviaqa-0", "triviaqa-1", "popqa-0", "popqa-1"]
    assert [q.id for q in multi] == ["hotpotqa-0", "hotpotqa-1", "hotpotqa-2", "bamboogle-0", "bamboogle-1", "bamboogle-2"]
    single, multi = res.test_sets(load_config("paper-1.5b-multi-hop"))
    assert len(single) == 12 and len(multi) == 8
