"""The shape of the code a newcomer meets, held by tests over the source (issue 39): no import
cycle among our modules, counting imports made inside functions; no module named like one of our
top-level packages; no folder of more than 15 modules; at most 40 service settings; eval/ at
most 7,000 lines; a README a user reads through."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("answer_service", "retrieval", "generation", "budget", "eval")
# Shipped SGLang patches, loaded into SGLang's own process (not our import graph).
OUTSIDE = ("generation/server/sglang_compat",)


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if not relative.startswith(OUTSIDE):
                yield path


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of our modules, wherever in the module they are made."""
    modules = {_module(path): path for path in _sources()}

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                found = ours(target) if target.split(".")[0] in PACKAGES else None
                if found is not None and found != name:
                    edges.add(found)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for edge in graph[node]:
            if edge not in index:
                visit(edge)
                low[node] = min(low[node], low[edge])
            elif edge in stack:
                low[node] = min(low[node], index[edge])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_our_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_module_is_named_like_a_top_level_package() -> None:
    named = [p.relative_to(ROOT).as_posix() for p in _sources() if p.stem in PACKAGES]
    assert named == []


def test_no_folder_holds_more_than_15_modules() -> None:
    crowded = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(ROOT / package).rglob("*")]:
            if folder.is_dir() and "__pycache__" not in folder.parts:
                modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
                if len(modules) > 15:
                    crowded[folder.relative_to(ROOT).as_posix()] = len(modules)
    assert crowded == {}


def test_at_most_40_service_settings() -> None:
    tree = ast.parse((ROOT / "answer_service/runtime/settings.py").read_text(encoding="utf-8"))
    settings = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Settings"
    )
    fields = [node for node in settings.body if isinstance(node, ast.AnnAssign)]
    assert len(fields) <= 40


def test_eval_is_at_most_7000_lines() -> None:
    lines = sum(
        len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / "eval").rglob("*.py")
    )
    assert lines <= 7000


def test_the_readme_and_each_docs_page_are_at_most_250_lines() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p in pages
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 250
    }
    assert long == {}


def test_no_two_test_modules_share_a_name() -> None:
    # tests/unit and tests/integration have no __init__.py, so pytest imports
    # each test module by its bare name: two of one name stop collection.
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []
