"""`--report-to tensorboard`: the metrics glossary's scalars beside metrics.jsonl, read back offline."""

import pytest

from tg.cli import parser
from tg.metrics import METRICS
from tg.store.reporters import reporters


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_gets_every_glossary_scalar_of_each_step(tmp_path):
    rows = [{name: float(i + k) for k, name in enumerate(METRICS)} | {"step": i} for i in (1, 2)]
    rows[1]["sync_maxdiff"] = None                                      # absent or not a number: skipped
    report, = reporters(["tensorboard"], tmp_path)
    for row in rows:
        report(row)
    got = _scalars(tmp_path / "tensorboard")
    assert set(got) == {f"train/{n}" for n in METRICS if n != "step"}
    assert got["train/reward"] == [(1, pytest.approx(rows[0]["reward"])), (2, pytest.approx(rows[1]["reward"]))]
    assert [s for s, _ in got["train/sync_maxdiff"]] == [1]


def test_report_to_is_a_train_option():
    assert reporters(["none"], "unused") == []
    args = parser().parse_args(["train", "--method", "tree", "--report-to", "tensorboard"])
    assert args.report_to == "tensorboard"
