"""A function fits on a screen (STYLE 11): none over 80 lines, docstring
and decorators included, in the training loop, the recipe's run and the
commands that share its setup."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "advtrain"
CHECKED = [
    *sorted((ROOT / "train").glob("*.py")),
    *sorted((ROOT / "recipe").glob("*.py")),
    ROOT / "cli" / "profile.py",
    ROOT / "cli" / "show.py",
]
LIMIT = 80


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = node.end_lineno - start + 1
            if lines > LIMIT:
                found.append(f"{node.name}: {lines} lines")
    return found


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_function_is_over_80_lines(path):
    assert long_functions(path) == []
