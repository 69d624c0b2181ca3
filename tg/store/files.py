"""Result files that survive concurrent writers and interruption, and the provenance every result row carries.

Several processes append to one CSV (`tg train` runs, `tg eval`, the demo, `tg mini` workers writing
results/): each append holds an exclusive lock (fcntl) and rewrites the file through a temporary file and
a rename, so no row is lost to a concurrent writer and an interrupted write leaves the previous file whole.
"""

from __future__ import annotations

import csv
import datetime
import fcntl
import io
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

if TYPE_CHECKING:
    from tg.config import Config


def lock_path(path: Path) -> Path:
    """The lock file of `path`: PATH.lock beside it. A separate file because writers replace `path` itself
    (os.replace), and a lock held on a replaced file guards nothing."""
    return path.with_name(path.name + ".lock")


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of `path` for the block, waiting while another process or thread holds it.
    The kernel releases it when the holder exits, however it exits."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` by `text` through a temporary file in its directory and a rename: readers see the old
    file or the new one, never a part. The caller serialises writers (`file_lock`) where there are several."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def append_csv_rows(path: str | Path, rows: Sequence[dict]) -> None:
    """Append `rows` to the CSV at `path`, widening the header when new columns appear (values as str)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        old = []
        if path.exists():
            with path.open(newline="") as f:
                old = list(csv.DictReader(f))
        allrows = old + [{k: str(v) for k, v in r.items()} for r in rows]
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=list(dict.fromkeys(k for r in allrows for k in r)))
        w.writeheader()
        w.writerows(allrows)
        atomic_write_text(path, out.getvalue())


def git_sha() -> str:
    """The checkout's short commit id, or 'unknown' outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(cfg: Config | None, seed: int) -> dict:
    """What made a result row: the preset and config hash (when a config made it), commit, seed and date.
    A row that already holds `seed` keeps it where it stands (dict order is the CSV's column order)."""
    made = {"preset": cfg.preset, "config_hash": cfg.hash()} if cfg is not None else {}
    return {**made, "git_sha": git_sha(), "seed": seed, "date": datetime.date.today().isoformat()}
