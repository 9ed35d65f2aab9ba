"""Every command the documentation shows is one the suite runs; the API
reference names every public name; every file a page names exists.

README.md and docs/*.md show shell commands in code blocks; each line that
starts with `advtrain` or `scripts/` is a command a reader will type.
RUN_BY lists the commands the suite runs, each with the tests that run it,
and a page that shows a command missing from it fails here: a newly
documented command needs a test, then a line in RUN_BY. Nothing is run
from this file (no subprocess); the tests named in RUN_BY do that.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# A command's name is `advtrain` with its global options and subcommand
# (`advtrain run`, `advtrain --debug run`, `advtrain --version`), or the
# script (`scripts/quickstart`). Each maps to "tests/FILE.py::test_name"
# entries, or to ".ci/run" for a command CI runs itself.
RUN_BY = {
    "advtrain recipes": [
        "tests/cli/test_commands.py::test_recipes_lists_each_shipped_recipe"
    ],
    "advtrain run": ["tests/cli/test_commands.py::test_run_writes_the_run_folder"],
    "advtrain eval": [
        "tests/cli/test_commands.py::test_eval_run_folder",
        "tests/cli/test_commands.py::test_eval_model_file_with_shipped_recipe",
        "tests/cli/test_commands.py::test_eval_save_examples_writes_them_to_the_run_folder",
    ],
    "advtrain resume": ["tests/cli/test_commands.py::test_resume_interrupted_run"],
    "advtrain export": [
        "tests/cli/test_commands.py::test_export_run_folder_and_to_another_folder"
    ],
    "advtrain show": [
        "tests/cli/test_show.py::test_show_prints_the_plan_and_writes_nothing"
    ],
    "advtrain profile": ["tests/cli/test_commands.py::test_profile_shipped_recipe"],
    "advtrain launch": [
        "tests/train/test_preemption.py::"
        "test_sigterm_to_launch_stops_all_workers_after_one_checkpoint"
    ],
    "advtrain --version": ["tests/cli/test_commands.py::test_version"],
    "advtrain --debug run": [
        "tests/cli/test_commands.py::test_debug_shows_the_traceback"
    ],
    "advtrain --quiet run": [
        "tests/utils/test_progress.py::"
        "test_cli_run_prints_plain_progress_lines_and_none_when_quiet"
    ],
    # The test runs the script itself in a subprocess and checks the
    # recipe's promised numbers.
    "scripts/quickstart": [
        "tests/cli/test_quickstart.py::test_quickstart_reaches_promised_accuracy"
    ],
    # The scripts in examples/ (docs/your-model-your-data.md), each run in
    # a fresh interpreter by its test.
    **{
        f"python examples/{name}.py": [f"tests/docs/test_examples.py::test_{name}"]
        for name in (
            "own_model_numpy",
            "own_tf_data_and_folder",
            "finetune_pretrained",
            "research_subclass",
            "plugin_attack_and_objective",
            "evaluate_saved_model",
        )
    },
    "scripts/test": [".ci/run"],
    "scripts/docs": [".ci/run"],
}

FENCE = re.compile(r"^\s*(```|~~~)\s*(\S*)")
SHELL = {"", "bash", "sh", "shell", "console", "text"}
COMMAND = re.compile(r"^\s*(?:\$\s+)?((?:advtrain|scripts/\S+)(?:\s.*)?)$")


def shown_commands(path):
    """(line number, command line) for each command in a shell code block."""
    found, fence, shell = [], None, False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence, shell = match.group(1), match.group(2) in SHELL
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is not None and shell:
            command = COMMAND.match(line)
            if command:
                found.append((number, command.group(1)))
    return found


def command_name(line):
    """`advtrain --debug run quickstart  # x` -> `advtrain --debug run`."""
    words = line.split("#", 1)[0].split()
    if words[0] != "advtrain":
        return words[0]
    name = ["advtrain"]
    for word in words[1:]:
        name.append(word)
        if not word.startswith("-"):
            break
    return " ".join(name)


def documented():
    """Command name -> the places ("page:line") that show it."""
    names = {}
    for page in PAGES:
        for number, line in shown_commands(page):
            where = f"{page.relative_to(ROOT)}:{number}"
            names.setdefault(command_name(line), []).append(where)
    return names


DOCUMENTED = documented()


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_every_documented_command_is_run_by_a_test(name):
    assert name in RUN_BY, (
        f"`{name}` is shown in {', '.join(DOCUMENTED[name])} but no test runs "
        "it: add a test that runs it, then add it to RUN_BY in "
        "tests/docs/test_docs_commands.py. Received: "
        f"command={name!r}"
    )


def _test_functions(path):
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


@pytest.mark.parametrize("name", sorted(RUN_BY))
def test_each_listed_test_exists(name):
    for entry in RUN_BY[name]:
        if entry == ".ci/run":
            assert name in (ROOT / ".ci" / "run").read_text(), (
                f".ci/run does not run `{name}`"
            )
            continue
        file, _, function = entry.partition("::")
        path = ROOT / file
        assert path.is_file(), f"RUN_BY[{name!r}] names a missing file: {file}"
        assert function in _test_functions(path), (
            f"RUN_BY[{name!r}]: {file} has no test {function}"
        )


def test_the_extractor_finds_commands_in_every_form(tmp_path):
    # The forms the pages use: a prompt, a comment, an option before the
    # subcommand, an indented fence inside a list, and continuation lines;
    # not Python, and not inline code.
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nscripts/quickstart   # x\n$ advtrain --debug run q \\\n"
        "  --set a=1\n```\n\n- item\n\n  ```\n  advtrain --version\n  ```\n"
        "```python\nadvtrain = 1\n```\n`advtrain eval` inline is not a block\n"
    )
    found = [command_name(line) for _, line in shown_commands(page)]
    assert found == ["scripts/quickstart", "advtrain --debug run", "advtrain --version"]


def test_readme_shows_the_two_set_up_commands_and_stays_short():
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300)"
    shown = [command_name(line) for _, line in shown_commands(readme)]
    assert shown[:2] == ["scripts/quickstart", "scripts/test"], shown[:2]


def test_the_api_reference_covers_every_public_name():
    tree = ast.parse((ROOT / "advtrain" / "__init__.py").read_text())
    exported = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    )
    pages = "\n".join(
        p.read_text() for p in sorted((ROOT / "docs" / "reference").glob("*.md"))
    )
    # `advtrain.NAME`, or the defining module's path where NAME is also a
    # module's name (fgsm, pgd: griffe would render the module,
    # mkdocstrings/griffe#124).
    referenced = set(re.findall(r"^::: advtrain\.(?:[\w.]+\.)?(\w+)\s*$", pages, re.M))
    missing = set(exported) - referenced
    assert not missing, (
        "advtrain.__all__ names missing from docs/reference/*.md (add a "
        f"`::: advtrain.NAME` line): {sorted(missing)}"
    )
    assert referenced <= set(exported), sorted(referenced - set(exported))


def test_every_file_the_pages_name_exists():
    # `advtrain/...`, `tests/...` and `scripts/...` in inline code: a
    # module that moved leaves its old path behind in the prose.
    named = re.compile(r"`((?:advtrain|tests|scripts)/[\w/.]*\w)`")
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in PAGES
        for path in sorted(set(named.findall(page.read_text())))
        if not (ROOT / path).exists()
    ]
    assert not missing, "pages name files that do not exist: " + ", ".join(missing)
