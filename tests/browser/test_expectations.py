"""Every Playwright ``expect(...)`` in the test suite is followed by a matcher.

``expect(locator)`` alone builds an assertion object and asserts nothing; a test written that
way passes whatever the page shows. This reads the tests' syntax trees (no browser needed).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _bare_expects(tree: ast.AST) -> list[int]:
    """Lines of ``expect(...)`` calls whose result is not the receiver of a matcher call."""
    used = set()
    for node in ast.walk(tree):
        # expect(x).to_be_visible() / expect(x).not_to_have_text(...)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if _is_expect(receiver) and node.func.attr.startswith(("to_", "not_to_")):
                used.add(id(receiver))
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _is_expect(node) and id(node) not in used
    )


def _is_expect(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "expect"
    )


def test_the_checker_sees_a_bare_expect() -> None:
    source = "expect(page.get_by_text('x'))\nexpect(page.locator('y')).to_be_visible()\n"
    assert _bare_expects(ast.parse(source)) == [1]


def test_every_expect_in_the_tests_has_a_matcher() -> None:
    bare = {
        f"{path.relative_to(TESTS)}:{line}"
        for path in TESTS.rglob("*.py")
        if "node_modules" not in path.parts
        for line in _bare_expects(ast.parse(path.read_text(), filename=str(path)))
    }
    assert bare == set(), f"expect(...) without a matcher asserts nothing: {sorted(bare)}"
