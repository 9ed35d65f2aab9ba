"""The two layers stay apart: the library never imports the recipe
application or the CLI, and never names a recipe key, a run folder's file,
a command or a command-line flag in what it says; the application passes
such names in as plain arguments.

Library errors name arguments (`weights`, `batch_size`); the recipe layer
says which key it filled them from (`advtrain.recipe.build`).
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "advtrain"
LIBRARY = (
    "attacks",
    "backbones",
    "backend",
    "models",
    "data",
    "train",
    "evaluation",
    "utils",
)
APPLICATION = ("advtrain.recipe", "advtrain.cli")
# The run folder's files, the commands and their flags.
APPLICATION_NAMES = re.compile(
    r"recipe\.yaml|metrics\.json"
    r"|\badvtrain (run|resume|eval|export|launch|show|profile|recipes)\b"
    r"|(?<![\w-])--(output|set|recipe|workers|debug|quiet|unsafe-load"
    r"|save-examples|max-restarts)\b"
)


# The run folder's recipe file and the flags that choose a run folder or
# override a recipe: no library module holds them anywhere, docstrings and
# comments included (the imports are checked above).
APPLICATION_TEXT = ("recipe.yaml", "--output", "--set")


def library_files() -> list[Path]:
    return sorted(p for name in LIBRARY for p in (PACKAGE / name).rglob("*.py"))


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an import names, top-level or inside a function."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            found += [
                (node.lineno, f"{node.module}.{alias.name}") for alias in node.names
            ]
    return found


def recipe_keys() -> list[str]:
    """Every dotted key a recipe has (`model.weights`, `data.augment.flip`)."""
    from pydantic import BaseModel

    from advtrain.recipe.schema import Recipe

    def walk(model: type[BaseModel], prefix: str) -> list[str]:
        keys = []
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                keys += [key, *walk(sub, f"{key}.")] if prefix else walk(sub, f"{key}.")
            elif prefix:
                keys.append(key)
        return keys

    return walk(Recipe, "")


def messages(tree: ast.AST) -> list[tuple[int, str]]:
    """The string constants a module holds, docstrings excepted."""
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            docstrings.add(id(body[0].value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


@pytest.mark.parametrize("path", library_files(), ids=lambda p: p.stem)
def test_library_does_not_import_the_application(path):
    tree = ast.parse(path.read_text())
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for line, module in imported_modules(tree)
        if module.startswith(APPLICATION)
    ]
    assert not bad, "\n".join(bad)


def test_library_text_never_names_the_application():
    """No library module, docstrings and comments included, names the run
    folder's recipe file or the flags of a run folder or an override."""
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{number} names {name!r}"
        for path in library_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for name in APPLICATION_TEXT
        if name in line
    ]
    assert not bad, "\n".join(bad)


def test_library_messages_name_arguments_not_recipe_keys():
    keys = recipe_keys()
    assert "model.weights" in keys and "model.batchnorm.momentum" in keys
    sections = sorted({key.split(".")[0] for key in keys})
    pattern = re.compile(
        r"(?<![\w.])(" + "|".join(map(re.escape, keys)) + r")(?![\w])"
        # a key put together at run time: "data." + name
        r"|(?<![\w.])((?:" + "|".join(sections) + r")\.)$"
    )
    bad = []
    for path in library_files():
        for line, text in messages(ast.parse(path.read_text())):
            match = pattern.search(text)
            if match and not _names_a_fit_option(path, match.group(0)):
                where = path.relative_to(PACKAGE.parent)
                bad.append(f"{where}:{line} names {match.group(0)}: {text!r}")
    assert not bad, "\n".join(bad)


def _names_a_fit_option(path: Path, name: str) -> bool:
    """`advtrain.fit`'s option groups are the recipe's sections, one
    definition for both (`train=PlanOptions`, ...): its own messages name
    the group's fields (`train.learning_rate`) as its arguments."""
    import inspect

    from advtrain.train.fitting import fit

    groups = {"train", "runtime", "batchnorm", "attack", "checkpoints"}
    assert groups <= set(inspect.signature(fit).parameters)
    return path.name == "fitting.py" and name.split(".")[0] in groups


def application_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) for each run-folder file, command or flag a module's
    messages name."""
    found = []
    for line, text in messages(tree):
        match = APPLICATION_NAMES.search(text)
        if match:
            found.append((line, match.group(0)))
    return found


def test_library_messages_name_no_run_folder_file_command_or_flag():
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line} names {name!r}"
        for path in library_files()
        for line, name in application_names(ast.parse(path.read_text()))
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "source",
    [
        'path = out / "recipe.yaml"\n',
        'def f(out):\n    raise ValueError(f"--output {out}: not a folder")\n',
        'hint = "resume with `advtrain resume RUN`"\n',
    ],
)
def test_the_name_check_sees_each_kind_of_name(source):
    assert application_names(ast.parse(source))


def test_the_name_check_lets_docstrings_and_plain_words_be():
    source = (
        '"""Used by `advtrain run`, which writes recipe.yaml."""\n'
        'def f(output):\n    """Writes --output."""\n'
        '    return {"output": output, "dir": "--x", "note": "a recipe"}\n'
    )
    assert application_names(ast.parse(source)) == []


def test_the_checks_see_a_violation(tmp_path):
    """The two checks above fire on a module that breaks the rule."""
    tree = ast.parse(
        "def f():\n"
        "    from advtrain.recipe.schema import Recipe\n"
        "    raise ValueError(f'train.batch_size={1} is too large')\n"
    )
    modules = [m for _, m in imported_modules(tree)]
    assert any(m.startswith(APPLICATION) for m in modules)
    texts = [t for _, t in messages(tree)]
    assert any("train.batch_size" in t for t in texts)
