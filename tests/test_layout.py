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


def _module_imports() -> dict[str, set[str]]:
    """Each module of tg/ -> the modules of tg/ it imports, at the top or inside a function (relative imports
    resolved; `from tg.x import y` names tg.x.y when that is a module, else tg.x)."""
    paths = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (REPO / "tg").rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is one or more import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    """Counted over every import, also those inside functions: a late import hides a cycle, it does not break it."""
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the counter works
    assert import_cycles(_module_imports()) == []
