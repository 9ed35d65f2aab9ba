"""Code as the formatter writes it, in functions that fit on a screen
(STYLE 11, 14): none over 80 lines, docstring and decorators included, and
no `fmt: skip`/`fmt: off` marker, anywhere in the package."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "advtrain"
CHECKED = sorted(ROOT.rglob("*.py"))
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


def test_no_function_is_over_80_lines():
    assert len(CHECKED) > 50  # the whole package was read
    found = [f"{p.relative_to(ROOT)}: {f}" for p in CHECKED for f in long_functions(p)]
    assert found == []


def test_the_formatter_lays_out_every_line():
    markers = ("# fmt: skip", "# fmt: off", "# fmt: on")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in CHECKED
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if line.rstrip().endswith(markers)
    ]
    assert found == []
