"""The library never names the application: no source under a library
package (docstrings and comments included) mentions recipes, the
`advtrain` commands or the run folder's files, and none imports
`advtrain.recipe` or `advtrain.cli`. Reword ("the caller", "a run") or
move application logic up."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "advtrain"

# Every library package (docs/architecture.md's layers below the package
# itself); recipe and cli are the application.
LIBRARY = [
    "attacks", "backbones", "backend", "data", "evaluation", "models", "train",
    "utils",
]  # fmt: skip

APPLICATION = re.compile(
    r"recipe|advtrain (run|resume|launch|show|eval)|--output|--set"
    r"|recipe\.yaml|metrics\.json|report\.md",
    re.IGNORECASE,
)


def _sources(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def _application_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [
            f"{path.name}:{node.lineno}: {name}"
            for name in names
            if name.split(".")[:2] in (["advtrain", "recipe"], ["advtrain", "cli"])
        ]
    return found


@pytest.mark.parametrize("package", LIBRARY)
def test_the_library_never_names_the_application(package):
    named = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in _sources(package)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if APPLICATION.search(line)
    ]
    assert not named, "\n".join(named)


@pytest.mark.parametrize("package", LIBRARY)
def test_the_library_never_imports_the_application(package):
    imports = [
        found for path in _sources(package) for found in _application_imports(path)
    ]
    assert not imports, "\n".join(imports)
