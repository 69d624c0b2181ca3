"""Grid files that cannot double or tear: one `tg mini run` of a grid under a root at a time, a torn last row
never counted as done, and every reader (done_keys, load_rows, compare, report) refusing a wrong header or a
(cell, seed, step) written twice. The theory grid (20 toy trees, seconds) stands in for any grid."""

import csv
import logging
import os
import subprocess
import sys
import threading

import pytest

from tg.agent.world import REPO_ROOT
from tg.config import ConfigError
from tg.experiments import grid_files, rerun, runner, summary
from tg.store.files import append_csv_rows


def _rows(path):
    return list(csv.DictReader(path.open()))


def _theory(root):
    """The theory grid run under `root`: its CSV, 20 rows."""
    path = runner.run_experiment("theory", workers=1, root=root)
    assert len(_rows(path)) == 20
    return path


def test_a_second_run_of_a_grid_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    """Two runs of one grid at once would make every row twice; the second is refused at once, naming the first's
    pid and the lock file, and the first writes each row once."""
    started, release = threading.Event(), threading.Event()
    real = runner.run_job

    def held(job, root):  # the first run's jobs wait until the second has been tried
        if threading.current_thread() is not threading.main_thread():
            started.set()
            release.wait(120)
        yield from real(job, root)

    monkeypatch.setattr(runner, "run_job", held)
    first = threading.Thread(target=runner.run_experiment, args=("theory",), kwargs=dict(workers=1, root=tmp_path))
    first.start()
    try:
        assert started.wait(120)
        lock = tmp_path / "runs" / "mini" / "theory.lock"
        with pytest.raises(ConfigError, match=rf"`tg mini run theory` .* already running \(pid {os.getpid()}, "
                                              rf"holding {lock}\)"):
            runner.run_experiment("theory", workers=1, root=tmp_path)
    finally:
        release.set()
        first.join()
    rows = _rows(grid_files.mini_dir(tmp_path) / "theory.csv")
    assert len(rows) == len({(r["cell"], r["seed"], r["step"]) for r in rows}) == 20
    runner.run_experiment("theory", workers=1, root=tmp_path)  # the first has ended: the lock is free


def test_the_lock_of_a_killed_run_is_freed_by_the_kernel(tmp_path):
    lock = tmp_path / "runs" / "mini" / "theory.lock"
    code = ("import sys, time; from pathlib import Path; from tg.store.files import exclusive_run\n"
            "with exclusive_run(Path(sys.argv[1]), 'a run'):\n    print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=rf"pid {holder.pid}, holding {lock}"):
            runner.run_experiment("theory", workers=1, root=tmp_path)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert lock.exists()  # the file stays; the lock went with its holder
    _theory(tmp_path)


def test_workers_below_one_are_refused(tmp_path, capsys):
    from tg.cli import main
    with pytest.raises(ConfigError, match="--workers -1: .* at least 1"):
        runner.run_experiment("theory", workers=-1, root=tmp_path)
    assert main(["mini", "run", "theory", "--workers", "0", "--root", str(tmp_path)]) == 2
    assert "tg: --workers 0:" in capsys.readouterr().err
    assert not (grid_files.mini_dir(tmp_path) / "theory.csv").exists()


def test_a_torn_last_row_is_not_done_and_is_made_again(tmp_path, caplog):
    """The last row cut short (its key still whole, fields missing): left out with a warning by every reader, so the
    next run makes it again and the report never reads it."""
    path = _theory(tmp_path)
    whole = path.read_text()
    path.write_text(whole[:-40])
    with caplog.at_level(logging.WARNING):
        assert ("toy-tree", 19, 0) not in grid_files.done_keys(path) and len(grid_files.done_keys(path)) == 19
        assert len(summary.load_rows("theory", tmp_path)) == 19
    assert f"{path}, line 21: last row" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        runner.run_experiment("theory", workers=1, root=tmp_path)
    assert caplog.text.count("last row") == 1  # dropped once, at the start of the run
    rows = _rows(path)
    assert len(rows) == 20 and rows[-1]["seed"] == "19" and all(None not in r.values() for r in rows)
    assert [{k: v for k, v in r.items() if k not in ("run_s", "date")} for r in rows] == \
        [{k: v for k, v in r.items() if k not in ("run_s", "date")} for r in csv.DictReader(whole.splitlines())]


def test_a_whole_last_row_without_its_newline_and_a_byte_order_mark_are_read(tmp_path, caplog):
    """As a spreadsheet or an editor saves a grid file: a UTF-8 byte-order mark before the header, the last row whole
    but without its final newline. Every row is read and kept (a warning names the row), by the next run too."""
    path = _theory(tmp_path)
    whole = path.read_text()
    saved = b"\xef\xbb\xbf" + whole.rstrip("\n").encode()
    path.write_bytes(saved)
    with caplog.at_level(logging.WARNING):
        assert len(grid_files.done_keys(path)) == 20 and len(summary.load_rows("theory", tmp_path)) == 20
    assert f"{path}, line 21: last row has no newline at its end; kept" in caplog.text
    runner.run_experiment("theory", workers=1, root=tmp_path)
    assert path.read_bytes() == saved                                           # nothing made again, nothing lost
    assert grid_files.grid_rows(path) == list(csv.DictReader(whole.splitlines()))


def test_a_torn_last_row_is_dropped_by_the_next_append(tmp_path):
    path = tmp_path / "g.csv"
    append_csv_rows(path, [dict(cell="a", seed=0, step=0, em=1.5)])
    path.write_text(path.read_text() + "b,0,0")  # a row cut short
    append_csv_rows(path, [dict(cell="b", seed=0, step=0, em=2.5)])
    assert [(r["cell"], r["em"]) for r in _rows(path)] == [("a", "1.5"), ("b", "2.5")]


def test_a_bad_row_before_the_last_is_refused_naming_the_file_and_line(tmp_path):
    path = _theory(tmp_path)
    original = path.read_text().splitlines(keepends=True)
    lines = original[:4] + [original[4][:30] + "\n"] + original[5:]  # seed 3's row cut short
    path.write_text("".join(lines))
    for read in (lambda: grid_files.done_keys(path), lambda: summary.load_rows("theory", tmp_path),
                 lambda: runner.run_experiment("theory", workers=1, root=tmp_path)):
        with pytest.raises(ConfigError, match=rf"{path}, line 5: has \d+ fields, the header \d+; repair or delete"):
            read()
    path.write_text("".join(original[:4] + [original[4].replace("toy-tree,3,", "toy-tree,x,", 1)] + original[5:]))
    with pytest.raises(ConfigError, match=rf"{path}, line 5: has seed 'x', not an integer"):
        grid_files.done_keys(path)


def test_a_row_written_twice_is_refused_by_every_reader(tmp_path):
    """Duplicates would be averaged twice by a report and hide a second run; every reader refuses them."""
    committed = _theory(tmp_path / "a")
    path = _theory(tmp_path / "b")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + [lines[3]]))
    readers = {"done_keys": lambda: grid_files.done_keys(path), "load_rows": lambda: summary.load_rows("theory", tmp_path / "b"),
               "report": lambda: summary.report("theory", tmp_path / "b"),
               "compare": lambda: rerun.compare_grid("theory", tmp_path / "b", tmp_path / "a"),
               "run": lambda: runner.run_experiment("theory", workers=1, root=tmp_path / "b")}
    for name, read in readers.items():
        with pytest.raises(ConfigError, match=rf"{path}, lines 4 and 22: two rows of cell, seed, step = toy-tree, 2, 0"):
            read()
    assert committed.exists()


def test_a_row_already_there_is_not_appended_again(tmp_path):
    path = tmp_path / "results" / "mini" / "g.csv"
    grid_files.append_grid_rows(path, [dict(cell="a", seed=0, step=30, em=1.0)])
    with pytest.raises(ConfigError, match="cell, seed, step = a, 0, 30 is already there"):
        grid_files.append_grid_rows(path, [dict(cell="a", seed=0, step=30, em=2.0)])
    assert len(_rows(path)) == 1


def test_a_wrong_header_is_refused_by_every_reader(tmp_path):
    committed = _theory(tmp_path / "a")
    path = _theory(tmp_path / "b")
    path.write_text(path.read_text().replace("cell,", "cells,", 1))
    for read in (lambda: grid_files.done_keys(path), lambda: summary.load_rows("theory", tmp_path / "b"),
                 lambda: rerun.compare_grid("theory", tmp_path / "b", tmp_path / "a"),
                 lambda: runner.run_experiment("theory", workers=1, root=tmp_path / "b")):
        with pytest.raises(ConfigError, match=rf"{path}: the header has no 'cell' column \(it has cells, seed, .*\); "
                                              "a row is keyed by cell, seed, step: restore the header"):
            read()
    assert committed.exists()


def test_the_committed_grid_files_pass_the_checks(caplog):
    """Every committed grid file (its rows, per-step metrics and question outcomes): each line a whole row,
    each (cell, seed, step) once."""
    files = sorted((REPO_ROOT / "results" / "mini").rglob("*.csv"))
    assert len(files) >= 10
    with caplog.at_level(logging.WARNING):
        for path in files:
            lines = [x for x in path.read_text().splitlines()[1:] if x]
            assert len(grid_files.grid_rows(path)) == len(lines), path
    assert not caplog.text


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_tg_mini_run_refuses_a_worker_count_in_one_line(workers, tmp_path, capsys):
    from tg.cli import main
    assert main(["mini", "run", "theory", "--workers", workers, "--root", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        f"tg: --workers {workers}: a grid runs with at least 1 worker process (default 2) (--debug shows the traceback)"]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("until", ["0", "-60"])
def test_tg_mini_run_refuses_an_until_below_one_in_one_line(until, tmp_path, capsys):
    from tg.cli import main
    assert main(["mini", "run", "theory", "--until", until, "--root", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        f"tg: --until {until}: name the last evaluation step to run now (at least 1), or leave it out "
        "(--debug shows the traceback)"]
    assert not (tmp_path / "results").exists()
