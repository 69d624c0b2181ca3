"""`tg doctor`: the installed versions of what `tg` runs on, against the tested matrix.

The matrix is read from the repository's own files, so it never drifts from them:
- `pyproject.toml`: the ranges every environment must satisfy (dependencies, the `gpu` and `bench` extras, Python);
- `constraints-cpu.txt`: the exact CPU pins (CI, laptops);
- `environment.yml`: the exact GPU pins (vLLM 0.33 and what it needs).

A version is 'ok' when it equals a pin, 'untested' when it is in range but pinned nowhere,
'MISMATCH' when it is outside the range, 'missing' when a dependency is not installed.
"""

from __future__ import annotations

import platform
import re
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

PACKAGES = ("python", "torch", "transformers", "peft", "accelerate", "bitsandbytes", "tokenizers", "datasets",
            "bm25s", "numpy", "vllm", "trl", "verl")
"""What the doctor reports, in this order (vllm is optional: the `gpu` extra; trl: the `bench` extra, docs/trl.md;
verl: its own venv, docs/verl.md)."""
_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*((?:[<>=!~]=?|===)\s*[^;#\s]+(?:\s*,\s*[<>=!~]=?\s*[^;#,\s]+)*)?")


@dataclass(frozen=True)
class Matrix:
    """Tested versions: ranges (specifier strings), CPU pins and GPU pins, by package name."""

    ranges: dict[str, str]
    required: frozenset[str]
    cpu: dict[str, str]
    gpu: dict[str, str]


@dataclass(frozen=True)
class Row:
    package: str
    installed: str | None
    range: str
    cpu: str
    gpu: str
    status: str


def _requirement(line: str) -> tuple[str, str] | None:
    m = _REQ.match(line)
    return (m.group(1).lower(), (m.group(2) or "").replace(" ", "")) if m else None


def read_matrix(root: Path) -> Matrix:
    """The matrix from `root`'s pyproject.toml, constraints-cpu.txt and environment.yml."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    deps = [r for r in map(_requirement, project["dependencies"]) if r]
    extras = project.get("optional-dependencies", {})
    gpu_extra = [r for r in map(_requirement, extras.get("gpu", []) + extras.get("bench", [])) if r]
    ranges = dict(deps + gpu_extra) | {"python": project["requires-python"]}
    cpu = {n: s[2:] for n, s in (_requirement(x) or ("", "") for x in (root / "constraints-cpu.txt").read_text()
                                 .splitlines() if not x.lstrip().startswith("#")) if s.startswith("==")}
    gpu: dict[str, str] = {}
    for line in (root / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s*(python)=(\S+)|^\s*-\s*([A-Za-z0-9_.\-]+)==(\S+)", line)
        if m:
            gpu[(m.group(1) or m.group(3)).lower()] = m.group(2) or m.group(4)
    return Matrix(ranges, frozenset(n for n, _ in deps) | {"python"}, cpu, gpu)


def installed_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed distribution versions (None when absent); 'python' is the interpreter."""
    out: dict[str, str | None] = {}
    for p in packages:
        if p == "python":
            out[p] = platform.python_version()
            continue
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def _matches(version: Version, pin: str) -> bool:
    """Equal to a pin ('3.12' pins a Python minor version); local labels such as '+cpu' are ignored."""
    parts = pin.split(".")
    return version.public == pin or (len(parts) == 2 and version.release[:2] == tuple(map(int, parts)))


def compare(installed: dict[str, str | None], matrix: Matrix) -> list[Row]:
    """One row per package: its status against the matrix (module docstring)."""
    rows = []
    for name, version in installed.items():
        spec, cpu, gpu = matrix.ranges.get(name, ""), matrix.cpu.get(name, ""), matrix.gpu.get(name, "")
        if version is None:
            status = "missing" if name in matrix.required else "absent (optional)"
        else:
            try:
                v = Version(version)
            except InvalidVersion:
                rows.append(Row(name, version, spec, cpu, gpu, "untested (unparsable version)"))
                continue
            pins = [tag for tag, pin in (("cpu pin", cpu), ("gpu pin", gpu)) if pin and _matches(v, pin)]
            if spec and not SpecifierSet(spec).contains(v, prereleases=True):
                status = "MISMATCH"
            else:
                status = f"ok ({', '.join(pins)})" if pins else "untested"
        rows.append(Row(name, version, spec, cpu, gpu, status))
    return rows


def format_rows(rows: list[Row]) -> str:
    head = ("package", "installed", "range (pyproject)", "cpu pin", "gpu pin", "status")
    table = [head] + [(r.package, r.installed or "-", r.range or "-", r.cpu or "-", r.gpu or "-", r.status)
                      for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip() for t in table)


def failed(rows: list[Row]) -> bool:
    """A required package is missing or a version is outside its range."""
    return any(r.status in ("MISMATCH", "missing") for r in rows)
