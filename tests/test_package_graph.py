"""The package graph is a DAG (docs/architecture.md): every import under
advtrain/, function-level ones included, points down the layers, no two
modules import each other through any path, and importing the library
leaves the recipe application and the CLI unloaded."""

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "advtrain"

# Bottom to top. A module may import its own package and the packages of
# the layers below; a sibling on the same layer is no more allowed than a
# layer above (what both need moves down). `utils` also holds the private
# top-level modules (advtrain/_keras_workarounds.py, ...). "advtrain" is the package
# itself (advtrain/__init__.py), which re-exports the library.
LAYERS = [
    ("utils",),
    # What differs per Keras backend (advtrain/backend/<name>/: ops, the
    # trainer, placement): below everything but the foundations.
    ("backend",),
    ("attacks", "backbones", "data"),
    ("models",),
    # `advtrain.fit` (train) evaluates the model it trained.
    ("evaluation",),
    ("train",),
    ("advtrain",),
    ("recipe",),
    ("cli",),
]
RANK = {package: rank for rank, names in enumerate(LAYERS) for package in names}
# The package's application names (advtrain.run, ...) are imported on first
# use: from inside a function or under `if TYPE_CHECKING`, never on import
# (test_importing_the_library_leaves_the_application_unloaded runs it).
LAZY_ONLY = {("advtrain", "recipe")}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the advtrain module imported
    where: str  # "advtrain/x.py:12"
    line: str  # the import statement as written
    lazy: bool  # inside a function or under `if TYPE_CHECKING`


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """`advtrain.x.y` -> its file, packages by their __init__.py."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


class _Collector(ast.NodeVisitor):
    """Every advtrain import in one module, with whether it runs lazily."""

    def __init__(self, source: str, is_package: bool, modules, where, text):
        self.source, self.is_package, self.modules = source, is_package, modules
        self.where, self.text = where, text
        self.depth = 0  # functions and TYPE_CHECKING blocks entered
        self.found: list[Import] = []

    def _lazy_block(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _lazy_block

    def visit_If(self, node: ast.If):
        if not _is_type_checking(node.test):
            return self.generic_visit(node)
        self.visit(node.test)
        self.depth += 1
        for child in node.body:
            self.visit(child)
        self.depth -= 1
        for child in node.orelse:
            self.visit(child)

    def _add(self, node, target: str):
        if target != "advtrain" and not target.startswith("advtrain."):
            return
        while target not in self.modules and "." in target:
            target = target.rsplit(".", 1)[0]  # an attribute, not a module
        where = f"{self.where}:{node.lineno}"
        if any(i.target == target and i.where == where for i in self.found):
            return  # `from advtrain.x import a, b`: one import of advtrain.x
        line = ast.get_source_segment(self.text, node) or ast.unparse(node)
        self.found.append(
            Import(self.source, target, where, " ".join(line.split()), self.depth > 0)
        )

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = self.source.split(".")
            if not self.is_package:
                package.pop()
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        for alias in node.names:
            # `from advtrain.x import y` imports the module advtrain.x.y
            # when there is one.
            submodule = f"{base}.{alias.name}"
            self._add(node, submodule if submodule in self.modules else base)


def collect_imports(modules: dict[str, Path], root: Path = ROOT) -> list[Import]:
    found = []
    for name, path in modules.items():
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(root))
        is_package = path.name == "__init__.py"
        collector = _Collector(name, is_package, modules, where, text)
        collector.visit(ast.parse(text, filename=str(path)))
        found.extend(collector.found)
    return found


def layer(module: str) -> str:
    """The package of the layer list a module belongs to."""
    parts = module.split(".")
    if len(parts) == 1:
        return "advtrain"
    if parts[1].startswith("_"):
        return "utils"
    return parts[1]


def layer_violations(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        src, dst = layer(imp.source), layer(imp.target)
        for package in (src, dst):
            if package not in RANK:
                bad.append(f"{imp.where}: package {package!r} is in no layer")
        if src == dst or src not in RANK or dst not in RANK:
            continue
        if RANK[dst] < RANK[src] or ((src, dst) in LAZY_ONLY and imp.lazy):
            continue
        kind = "a sibling" if RANK[dst] == RANK[src] else "a layer above"
        bad.append(f"{imp.where}: {src} imports {dst}, {kind}: {imp.line}")
    return bad


def find_cycles(imports: list[Import]) -> list[str]:
    """One cycle per strongly connected group of modules, as a path of
    imports (Tarjan's algorithm, then a shortest way round)."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.target != imp.source:
            graph.setdefault(imp.source, {}).setdefault(imp.target, imp)
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_cycle_text(graph, group) for group in groups]


def _cycle_text(graph, group: set[str]) -> str:
    start = min(group)
    paths = {start: []}
    frontier = [start]
    while frontier:  # breadth first, back to `start` inside the group
        node = frontier.pop(0)
        for nxt, imp in sorted(graph.get(node, {}).items()):
            if nxt == start:
                steps = [*paths[node], imp]
                return f"{start} -> " + " -> ".join(
                    f"{s.target} ({s.where}: {s.line})" for s in steps
                )
            if nxt in group and nxt not in paths:
                paths[nxt] = [*paths[node], imp]
                frontier.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


IMPORTS = collect_imports(module_names())


def test_the_parser_sees_every_kind_of_import(tmp_path):
    package = tmp_path / "advtrain"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from advtrain.models import c\n"
    )
    (package / "models" / "__init__.py").write_text("from . import c\n")
    (package / "models" / "c.py").write_text(
        "import advtrain.models\ndef f():\n    from advtrain.models.c import NAME\n"
    )
    imports = collect_imports(module_names(package), tmp_path)
    assert {(i.source, i.target, i.lazy) for i in imports} == {
        ("advtrain", "advtrain.models.c", True),
        ("advtrain.models", "advtrain.models.c", False),
        ("advtrain.models.c", "advtrain.models", False),
        ("advtrain.models.c", "advtrain.models.c", True),
    }
    (cycle,) = find_cycles(imports)
    assert cycle.startswith("advtrain.models -> advtrain.models.c (")


def test_every_import_points_down_the_layers():
    assert len(IMPORTS) > 100  # the parser found the package's imports
    bad = layer_violations(IMPORTS)
    assert not bad, "imports against the layering (LAYERS):\n" + "\n".join(bad)


def test_no_import_cycle_between_modules():
    cycles = find_cycles(IMPORTS)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_importing_the_library_leaves_the_application_unloaded():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    script = (
        "import json, sys, advtrain.attacks; print(json.dumps(sorted("
        "m for m in sys.modules if m.split('.')[:2] in "
        "(['advtrain', 'recipe'], ['advtrain', 'cli']))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == []
