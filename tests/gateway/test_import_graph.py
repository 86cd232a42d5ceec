"""The gateway's imports form no circle and stay on its floor (DESIGN.md, "Layout").

Read from the source with ``ast``, not by importing: every import counts, at module level, in
a function, or under ``TYPE_CHECKING`` (a circle hidden from the interpreter is still one for
the reader, and STYLE.md 16 forbids dodging one). Importing ``a.b.c`` runs the packages
``a.b`` and ``a`` first, so those count too, except the importer's own enclosing packages,
which are already running. A failure names the circle, module by module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from ops.processes import REPO_ROOT

# Above the gateway's floor: the policy snapshot is the contract between them.
FORBIDDEN = ("governance", "portal", "scheduler", "records")


def modules(package: str = "gateway") -> dict[str, Path]:
    found = {}
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement loads, as written (relative ones resolved)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = importer.split(".")
        if not is_package:
            anchor.pop()
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    yield base
    # ``from pkg import name`` loads the module pkg.name when there is one.
    yield from (f"{base}.{alias.name}" for alias in node.names)


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` that importing ``name`` runs, directly."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    if is_package:
        own_packages.add(name)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for dotted in _imported(node, name, is_package):
            parts = dotted.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in known and prefix not in own_packages and prefix != name:
                    found.add(prefix)
    return found


def all_imports(package: str = "gateway") -> dict[str, set[str]]:
    """Every top-level name each module of ``package`` imports (ours or not)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules(package).items():
        tree = ast.parse(path.read_text(), str(path))
        roots: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                roots.update(
                    dotted.split(".")[0]
                    for dotted in _imported(node, name, path.name == "__init__.py")
                )
        graph[name] = roots
    return graph


def graph(package: str = "gateway") -> dict[str, set[str]]:
    known = modules(package)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted,
    plus any module that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(edges.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_gateway_imports_itself_round_in_a_circle() -> None:
    found = cycles(graph())
    assert found == [], "import circles in gateway/: " + "; ".join(
        " <-> ".join(component) for component in found
    )


def test_the_gateway_imports_nothing_above_its_floor() -> None:
    above = {
        module: sorted(roots & set(FORBIDDEN))
        for module, roots in all_imports().items()
        if roots & set(FORBIDDEN)
    }
    assert above == {}, f"gateway modules importing {', '.join(FORBIDDEN)}: {above}"


def test_the_async_door_passes_the_front_door_not_the_app() -> None:
    """The async door's steps are the front door's (gateway/front_door.py), not copies of
    the synchronous path's reached through gateway/app.py; and the policy builds its
    guardrail plans without the clients that run them."""
    edges = graph()
    reaching_into_the_app = sorted(
        name
        for name, imported in edges.items()
        if "gateway.app" in imported and name != "gateway.asgi"
    )
    assert reaching_into_the_app == []
    assert "gateway.front_door" in edges["gateway.async_tasks.api"]
    assert not {name for name in edges["gateway.policy"] if name.startswith("gateway.guardrails")}
    assert "gateway.guardrail_plan" in edges["gateway.policy"]


def test_the_check_sees_a_circle_through_a_type_checking_import(tmp_path: Path) -> None:
    """The check itself: a circle closed only under TYPE_CHECKING is still reported."""
    package = tmp_path / "loop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from loop.b import B\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from loop.a import A\nB = 1\n"
    )
    (package / "c.py").write_text("from loop import a\n")
    known = {
        "loop": package / "__init__.py",
        "loop.a": package / "a.py",
        "loop.b": package / "b.py",
        "loop.c": package / "c.py",
    }
    edges = {name: imports_of(name, path, known) for name, path in known.items()}
    assert cycles(edges) == [["loop.a", "loop.b"]]


if __name__ == "__main__":
    for component in cycles(graph()):
        print("cycle:", " <-> ".join(component))
    for module, roots in sorted(all_imports().items()):
        if roots & set(FORBIDDEN):
            print("above the floor:", module, sorted(roots & set(FORBIDDEN)))
