"""The house stays small (ADR 37): no product module over 500 lines, no function over 90.

Product code is every module under domain/, application/, projections/ and interfaces/. A module
or function that grows past its bound fails here, by name, with its size; split it by job (ADR 37
says where each capability lives) rather than raising the bound.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("domain", "application", "projections", "interfaces")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 90


def product_modules() -> list[Path]:
    return sorted(path for layer in LAYERS for path in (ROOT / layer).rglob("*.py"))


def long_functions(source: str) -> list[tuple[str, int]]:
    """Every function or method in `source` longer than MAX_FUNCTION_LINES, with its length
    (decorators excluded, its docstring and body included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append((f"{node.name} (line {node.lineno})", length))
    return found


def test_the_product_modules_are_all_found():
    modules = product_modules()
    assert len(modules) > 50
    assert {path.relative_to(ROOT).parts[0] for path in modules} == set(LAYERS)


def test_the_function_check_catches_a_long_function():
    body = "\n".join(f"        x{n} = {n}" for n in range(MAX_FUNCTION_LINES))
    source = f"def short():\n    return 1\n\nclass C:\n    async def long(self):\n{body}\n"
    assert long_functions(source) == [("long (line 5)", MAX_FUNCTION_LINES + 1)]


@pytest.mark.parametrize("path", product_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_is_at_most_500_lines_and_its_functions_at_most_90(path):
    source = path.read_text()
    lines = len(source.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} has {lines} lines"
    assert long_functions(source) == [], f"{path.relative_to(ROOT)} has long functions"
