"""The import graph of `src/turnforge` collapsed to its top-level packages, and the cycles in it.

A top-level package is `turnforge.X` for each module or package X directly under `src/turnforge`. Every
`import turnforge.X...` / `from turnforge.X... import` in a file counts, wherever it is written: at module
level, inside a function, and under `if TYPE_CHECKING:` (a type-only import is still a dependency a reader
must follow). Imports of the package root (`import turnforge`) are not edges.

Run it to print the graph's cycles:

    .venv/bin/python tests/import_graph.py
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

import turnforge

ROOT = Path(turnforge.__file__).parent


@dataclass(frozen=True)
class ImportSite:
    """One import of package `target` written in package `source`, at `file:line`."""

    source: str
    target: str
    file: str
    line: int


def top_level_package(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def imported_modules(node: ast.AST, module_parts: tuple[str, ...]) -> list[str]:
    """The absolute module names an import statement names (relative imports resolved against the file)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level == 0:
        return [node.module] if node.module else []
    base = ("turnforge", *module_parts[: len(module_parts) - node.level])
    return [".".join((*base, node.module) if node.module else base)]


def import_sites() -> list[ImportSite]:
    sites = []
    for path in sorted(ROOT.rglob("*.py")):
        source = top_level_package(path)
        parts = path.relative_to(ROOT).with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in imported_modules(node, parts):
                names = name.split(".")
                if names[0] == "turnforge" and len(names) > 1 and names[1] != source:
                    sites.append(ImportSite(source, names[1], str(path.relative_to(ROOT)), node.lineno))
    return sites


def package_graph(sites: list[ImportSite]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for site in sites:
        graph.add_edge(site.source, site.target)
    return graph


def cyclic_components(graph: nx.DiGraph) -> list[set[str]]:
    """The strongly connected components with more than one package: each holds at least one cycle."""
    return sorted((c for c in nx.strongly_connected_components(graph) if len(c) > 1), key=sorted)


def describe_cycles(sites: list[ImportSite]) -> list[str]:
    """One line per import that lies on a cycle: `source -> target  file:line`."""
    graph = package_graph(sites)
    lines = []
    for component in cyclic_components(graph):
        for site in sites:
            if site.source in component and site.target in component:
                lines.append(f"{site.source} -> {site.target}  {site.file}:{site.line}")
    return lines


def main() -> None:
    sites = import_sites()
    graph = package_graph(sites)
    components = cyclic_components(graph)
    print(f"{graph.number_of_nodes()} top-level packages, {graph.number_of_edges()} edges")
    print(f"simple cycles: {sum(1 for _ in nx.simple_cycles(graph))}")
    print(f"strongly connected components with a cycle: {len(components)}")
    for component in components:
        print("  {" + ", ".join(sorted(component)) + "}")
    for line in describe_cycles(sites):
        print("   ", line)


if __name__ == "__main__":
    main()
