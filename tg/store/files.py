"""Result files that survive concurrent writers and interruption, and the provenance every result row carries.

Several processes append to one CSV (`tg train` runs, `tg eval`, the demo, `tg mini` workers writing
results/): each append holds an exclusive lock (fcntl) and rewrites the file through a temporary file and
a rename, so no row is lost to a concurrent writer and an interrupted write leaves the previous file whole.
A file written some other way (copied, merged, edited, cut short by a full disk) is read back checked
(`checked_rows`): a torn last row is left out with a warning, any other malformed row or a repeated key is
refused. A whole job that must not run twice at once (a `tg mini` grid) holds `exclusive_run`.
"""

from __future__ import annotations

import csv
import datetime
import fcntl
import hashlib
import io
import logging
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from tg.config_values import ConfigError

if TYPE_CHECKING:
    from tg.config import Config

log = logging.getLogger(__name__)


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


@contextmanager
def exclusive_run(lock: Path, what: str) -> Iterator[None]:
    """Hold the lock file `lock` for the block, or refuse at once (ConfigError naming the holder's pid and the
    lock file) while another process holds it; `what` names the job in that line. The holder writes its pid into
    the file; the kernel releases the lock when the holder exits, however it exits, so a file left behind by a
    killed run never blocks the next one."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "unknown"
            raise ConfigError(f"{what} is already running (pid {pid}, holding {lock}): wait for it to finish or "
                              "stop it, then run again") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def checked_rows(path: Path, key: Sequence[str] = (), ints: Sequence[str] = ()) -> tuple[list[str], list[dict]]:
    """The header and rows (values as str) of the CSV at `path`, each row checked: as many fields as the header,
    every `key` column filled (`ints` among them as integers), and no two rows with the same `key`. A bad last row
    is a torn write (the writer stopped within it): it is left out with a logged warning, so whatever counts the rows
    makes it again; a whole last row that only lacks its final newline (an editor's save) is kept, with a warning. A
    byte-order mark (a spreadsheet's UTF-8 export) is read past. A header without a `key` column, a bad row before
    the last or a repeated key is refused: ConfigError naming the file, the line and the fix."""
    header, rows, _ = _checked(path, key, ints)
    return header, rows


def drop_torn_row(path: Path, key: Sequence[str] = (), ints: Sequence[str] = ()) -> None:
    """Rewrite the CSV at `path` without its torn last row where it has one (`checked_rows` warns, once), so the
    reads after this one find the file whole."""
    if path.exists():
        with file_lock(path):
            header, rows, torn = _checked(path, key, ints)
            if torn:
                _write_rows(path, header, rows)


def _checked(path: Path, key: Sequence[str], ints: Sequence[str]) -> tuple[list[str], list[dict], bool]:
    """`checked_rows`, and whether a torn last row was left out."""
    if not path.exists():
        return [], [], False
    with path.open(newline="", encoding="utf-8-sig") as f:
        text = f.read()
    if not text:
        return [], [], False
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    if missing := [k for k in key if k not in header]:
        raise ConfigError(f"{path}: the header has no {missing[0]!r} column (it has {', '.join(header) or 'nothing'});"
                          f" a row is keyed by {', '.join(key)}: restore the header as written, or move the file away")
    lines = [(reader.line_num, fields) for fields in reader if fields]
    rows, seen = [], {}
    for i, (line, fields) in enumerate(lines):
        bad = _bad_row(header, fields, key, ints)
        if not bad and i == len(lines) - 1 and not text.endswith(("\n", "\r")):
            log.warning("%s, line %d: last row has no newline at its end; kept as a whole row (if its writer was cut "
                        "off within its last value, delete that line)", path, line)
        if bad and i == len(lines) - 1:
            log.warning("%s, line %d: last row %s, an interrupted write: left out, to be made again", path, line, bad)
            return header, rows, True
        if bad:
            raise ConfigError(f"{path}, line {line}: {bad}; repair or delete that line (git shows what was there)")
        row = dict(zip(header, fields))
        k = tuple(row[c] for c in key)
        if k and k in seen:
            raise ConfigError(f"{path}, lines {seen[k]} and {line}: two rows of {', '.join(key)} = {', '.join(k)}; "
                              "a row is written once: delete the one that should not be there")
        seen[k] = line
        rows.append(row)
    return header, rows, False


def _bad_row(header: list[str], fields: list[str], key: Sequence[str], ints: Sequence[str]) -> str:
    """What is wrong with one row ('' if nothing)."""
    if len(fields) != len(header):
        return f"has {len(fields)} fields, the header {len(header)}"
    row = dict(zip(header, fields))
    if empty := [k for k in key if not row[k]]:
        return f"has no {empty[0]!r}"
    for k in ints:
        if not row[k].lstrip("-").isdigit():
            return f"has {k} {row[k]!r}, not an integer"
    return ""


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


def append_csv_rows(path: str | Path, rows: Sequence[dict], key: Sequence[str] = ()) -> None:
    """Append `rows` to the CSV at `path`, widening the header when new columns appear (values as str). The rows
    there are read back checked (`checked_rows`: a torn last row is dropped); with `key`, a row whose key is already
    there is refused (ConfigError), so no row is written twice."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        _, old = checked_rows(path, key)
        new = [{k: str(v) for k, v in r.items()} for r in rows]
        there = {tuple(r[c] for c in key) for r in old}
        if key and (twice := next((r for r in new if tuple(r.get(c, "") for c in key) in there), None)):
            raise ConfigError(f"{path}: a row of {', '.join(key)} = {', '.join(twice.get(c, '') for c in key)} is "
                              "already there; another writer made it (only one run of a grid at a time)")
        allrows = old + new
        _write_rows(path, list(dict.fromkeys(k for r in allrows for k in r)), allrows)


def _write_rows(path: Path, header: list[str], rows: Sequence[dict]) -> None:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=header)
    w.writeheader()
    w.writerows(rows)
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


def sha256_of(path: Path) -> str:
    """The sha256 of a file, read in 16 MiB chunks (pinned weights run to hundreds of MB)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()
