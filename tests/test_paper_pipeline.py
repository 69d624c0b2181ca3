"""The paper preset's pipeline end to end, with tiny stand-ins through the same loading code: a local
model directory in place of the hub id, FlashRAG-layout files in place of the hub datasets (through
`tg data prepare`), BM25 over a local corpus, QLoRA, evaluation every `optim.eval_every` steps on every
test set of the setting into Table-1-shaped rows: multi-hop with the tree, single-hop with the chain."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from tg import commands
from tg.agent.data import SETTINGS
from tg.agent.policy import save_policy
from tg.agent.world import load_world
from tg.cli import main


def _flashrag(root: Path, world_dir: Path, setting: str) -> Path:
    """The synthetic world's questions of one setting laid out as FlashRAG's <dataset>/<split>.jsonl."""
    rows = [json.loads(x) for x in (world_dir / "test.jsonl").read_text().splitlines()]
    multi = [r for r in rows if r["data_source"].endswith("single") == (setting == "single-hop")]
    train_name, test_names = SETTINGS[setting]
    layout = [(train_name, "train")] + [(n, "test" if n == "bamboogle" else "dev") for n in test_names]
    for k, (name, split) in enumerate(layout):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        chunk = multi[4 * k: 4 * k + 4]
        d.joinpath(f"{split}.jsonl").write_text("".join(
            json.dumps({"id": str(i), "question": r["question"], "golden_answers": r["golden_answers"]}) + "\n"
            for i, r in enumerate(chunk)))
    return root


@pytest.mark.parametrize("setting, method, label", [
    ("multi-hop", ["--method", "tree"], "Tree-GRPO (2,2,1) intra+inter"),
    ("single-hop", ["--method", "chain", "--group-size", "4"], "chain GRPO (G=4)")])
def test_paper_preset_trains_and_evaluates_with_tiny_stand_ins(setting, method, label, random_policy, world_dir,
                                                                tmp_path, monkeypatch):
    pytest.importorskip("bitsandbytes")
    model_dir = save_policy(*random_policy, tmp_path / "model")
    data_dir = tmp_path / "data"
    assert main(["data", "prepare", "--setting", setting, "--out", str(data_dir),
                 "--source", str(_flashrag(tmp_path / "flashrag", world_dir, setting))]) == 0
    shutil.copy(world_dir / "corpus.jsonl", data_dir / "corpus.jsonl")
    monkeypatch.setattr(commands, "RESULTS", str(tmp_path / "results"))
    code = main(["train", "--preset", f"paper-1.5b-{setting}", *method, "--skip-preflight",
                 "--run-dir", str(tmp_path / "run"), "--set", f"model.name_or_path={model_dir}",
                 "--set", f"data.data_dir={data_dir}", "--set", "data.retriever=bm25", "--set", "model.lora_r=4",
                 "--set", "model.dtype=float32", "--set", "optim.steps=2", "--set", "optim.eval_every=1",
                 "--set", "optim.prompts_per_step=2", "--set", "optim.mini_batch_prompts=2",
                 "--set", "agent.max_step_tokens=16", "--set", "eval.n_multi=2", "--set", "eval.n_single=2"])
    assert code == 0
    rows = list(csv.DictReader((tmp_path / "results" / "runs.csv").open()))
    assert [r["step"] for r in rows] == ["1", "2"]
    for r in rows:
        assert r["preset"] == f"paper-1.5b-{setting}" and r["method"] == label
        tests = SETTINGS[setting][1]
        assert all(0 <= float(r[s]) <= 100 for s in tests)                      # every test set has a column
        assert r["n"] == str(2 * len(tests))                                     # 2 per test set
    assert json.loads((tmp_path / "run" / "tg_config.json").read_text())["model"]["finetune"] == "qlora"
    assert load_world(world_dir)  # the stand-in data came from the world, nothing was downloaded
