"""The package layout: the map in tg/__init__.py names every module, and no library module, notebook or
script imports the CLI (so the run API has one home, tg.pipeline, and no import cycle runs through the CLI)."""

import ast
import json
import re
from pathlib import Path

import tg

REPO = Path(__file__).parents[1]
CLI = {"tg.cli", "tg.commands"}


def _imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_package_map_names_every_module_under_its_subpackage():
    doc = tg.__doc__
    for path in sorted((REPO / "tg").rglob("*.py")):
        rel = path.relative_to(REPO / "tg")
        if path.name == "__init__.py":
            continue
        assert re.search(rf"\b{re.escape(path.name)}\b", doc), f"tg/{rel} is missing from the package map"
        if len(rel.parts) == 2:  # its lines are those between `<subpackage>/` and the next unindented entry
            section = re.search(rf"^    {rel.parts[0]}/.*?(?=^    \S|\Z)", doc, re.M | re.S)
            assert section and path.name in section.group(), f"tg/{rel} is not listed under {rel.parts[0]}/"


def test_only_the_cli_imports_the_cli():
    sources = {p: p.read_text() for p in (REPO / "tg").rglob("*.py") if p.name not in ("cli.py", "__main__.py")}
    for nb in (REPO / "notebooks").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        sources[nb] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for path, source in sources.items():
        bad = _imports(source) & CLI
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}: import the run API from tg.pipeline"
