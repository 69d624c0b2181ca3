"""Results and run directories under misuse: concurrent CSV writers, two runs in one directory, a rerun over
a finished run, a resume under another config, a gradient clip that reverses the update."""

import csv
import multiprocessing as mp
from pathlib import Path

import pytest

from tg import mini
from tg.config import ConfigError
from tg.evaluate import append_row

WRITERS, APPENDS = 4, 100


@pytest.mark.parametrize("value", ["-1", "0", "NaN"])
def test_grad_clip_must_be_positive(cfg, value):
    with pytest.raises(ConfigError, match=r"`optim.grad_clip` = .* allowed > 0") as err:
        cfg.with_overrides(f"optim.grad_clip={value}")
    assert "\n" not in str(err.value)


def _append_many(writer: str, path: str, k: int, start) -> None:
    start.wait()
    for i in range(APPENDS):
        row = dict(writer=k, i=i, **({"extra": i} if i % 25 == 0 else {}))  # now and then a wider header
        append_row(path, row) if writer == "append_row" else mini.append_rows(Path(path), [row])


@pytest.mark.parametrize("writer", ["append_row", "mini.append_rows"])
def test_concurrent_appends_lose_no_row(tmp_path, writer):
    path = tmp_path / "runs.csv"
    ctx = mp.get_context("fork")
    start = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_append_many, args=(writer, str(path), k, start)) for k in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    rows = list(csv.DictReader(path.open(newline="")))
    assert sorted((int(r["writer"]), int(r["i"])) for r in rows) == [(k, i) for k in range(WRITERS)
                                                                      for i in range(APPENDS)]
    assert list(rows[0]) == ["writer", "i", "extra"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv", "runs.csv.lock"]   # no temporary left
