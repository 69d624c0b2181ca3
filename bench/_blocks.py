"""The one writer of bench/README.md's generated tables: each bench script with `--write FILE` replaces the text
between its own pair of markers (`<!-- NAME:begin -->` ... `<!-- NAME:end -->`), or appends the pair."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, table: str) -> None:
    """Replace (or append) the text between block `name`'s markers in `path`; other blocks are left alone."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{table}\n{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text += ("\n" if text else "") + block + "\n"
    path.write_text(text)
