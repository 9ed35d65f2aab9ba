"""Every Python code block in README.md and docs/*.md runs, as a whole
program per page, in a fresh interpreter (docs/reference/ is generated
from the docstrings and not included).

The design, for whoever writes a page:
- A page's ```python blocks are one program, in page order: a block may
  use what an earlier block on the same page defined (`classifier`,
  `train_ds`), never what the reader is left to imagine. An undefined
  name, a wrong keyword or a failing call fails the page's test.
- A block whose first line is `# NAME.py` shows a module file: it is
  written to NAME.py in the page's working folder (on `sys.path`, as the
  current folder is for a recipe's `plugins`) and not run in line; later
  blocks import it, and the program imports every such module at its end,
  so a module no block imports still runs.
- A block preceded by `<!-- doc-test: skip REASON -->` is not run. SKIPPED
  below lists them: a new skip fails until it is added there (so a skip is
  a decision someone reviewed, not a way round a failure).
The program runs in a temporary folder (files a block writes land there),
one subprocess per page, TF_NUM_INTRAOP_THREADS=1.
"""

import re
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import run_fresh

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Blocks not run, per page: (first line of the block, why).
SKIPPED = {
    "docs/data.md": [
        ("import tensorflow_datasets as tfds", "needs the GTSRB archives")
    ],
}

FENCE = re.compile(r"^(\s*)(```|~~~)\s*(\S*)")
MODULE = re.compile(r"^# (\w+)\.py\s*$")
SKIP = re.compile(r"^\s*<!-- doc-test: skip\b(.*)-->\s*$")


def python_blocks(text):
    """[(line number, code, skip reason or None)] for each ```python block."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = match.groups()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(
                lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i]
            )
            i += 1
        i += 1
        if language == "python":
            before = lines[start - 2] if start >= 2 else ""
            skip = SKIP.match(before)
            reason = skip.group(1).strip() if skip else None
            blocks.append((start + 1, "\n".join(body), reason))
    return blocks


def page_program(page_name, text):
    """(program, {module name: source}, [skipped first lines]) of a page."""
    parts, modules, skipped = [], {}, []
    for line, code, reason in python_blocks(text):
        first = code.splitlines()[0] if code else ""
        if reason is not None:
            skipped.append(first)
            continue
        module = MODULE.match(first)
        if module:
            modules[module.group(1)] = code + "\n"
            continue
        parts.append(f"# ---- {page_name}:{line}\n{code}\n")
    if modules:
        parts.append(
            "# ---- the page's module blocks, each imported at least once\n"
            + "".join(f"import {name}  # noqa\n" for name in modules)
        )
    return "\n".join(parts), modules, skipped


def _pages_with_blocks():
    return [p for p in PAGES if python_blocks(p.read_text())]


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", _pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_pages_python_blocks_run(page, tmp_path):
    name = str(page.relative_to(ROOT))
    program, modules, skipped = page_program(name, page.read_text())
    assert skipped == [first for first, _ in SKIPPED.get(name, [])], (
        f"{name} skips blocks not listed in SKIPPED (tests/docs/test_doc_blocks.py). "
        f"Received: {skipped}"
    )
    for module, source in modules.items():
        (tmp_path / f"{module}.py").write_text(source)
    (tmp_path / "page.py").write_text(program)
    done = run_fresh(
        [sys.executable, "page.py"], tmp_path, check=False, TF_CPP_MIN_LOG_LEVEL=2
    )
    assert done.returncode == 0, (
        f"{name}: its Python blocks, run in order as one program, fail "
        "(the traceback's '# ---- page:line' comment above the failing line "
        "names the block):\n" + done.stderr[-4000:]
    )


def test_the_extractor_reads_continuations_modules_and_skips():
    page = textwrap.dedent(
        """\
        ```python
        x = 1
        ```
        text
        ```python
        # helper.py
        VALUE = 2
        ```
        <!-- doc-test: skip needs a data set -->
        ```python
        load_the_world()
        ```
        - a list item:

          ```python
          print(x + helper.VALUE)
          ```
        ```bash
        python -c 'not python'
        ```
        """
    )
    program, modules, skipped = page_program("p.md", page)
    assert modules == {"helper": "# helper.py\nVALUE = 2\n"}
    assert skipped == ["load_the_world()"]
    assert "x = 1" in program and "print(x + helper.VALUE)" in program
    assert "load_the_world" not in program and "not python" not in program
    assert program.rstrip().endswith("import helper  # noqa")
    # The indented block lost its list indentation, so it compiles.
    compile(program, "p.md", "exec")


def test_every_skip_listed_is_still_on_its_page():
    for name, entries in SKIPPED.items():
        _, _, skipped = page_program(name, (ROOT / name).read_text())
        assert skipped == [first for first, _ in entries], name
