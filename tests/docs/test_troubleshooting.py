"""docs/troubleshooting.md quotes commands that scripts/check_troubleshooting
runs and checks: the page and the script name the same commands, and the
page names no path of the machine it was written on. Nothing is run here.
"""

import importlib.machinery
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"


def _script():
    path = str(ROOT / "scripts" / "check_troubleshooting")
    loader = importlib.machinery.SourceFileLoader("check_troubleshooting", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_script_runs_every_run_command_the_page_quotes():
    quoted = re.findall(r"`(advtrain run [^`]+)`", PAGE.read_text())
    assert quoted
    assert sorted(set(quoted)) == sorted(c for c, _, _ in _script().EXAMPLES)


def test_what_the_script_expects_is_what_the_page_shows():
    text = " ".join(PAGE.read_text().split())
    for command, code, lines in _script().EXAMPLES:
        for start in lines:
            assert start in text, start
        if code is not None:
            assert f"exit code {code}" in text, command


def test_the_page_names_no_machine_path():
    found = re.findall(r"(?:/work|/home|/tmp|/Users)/\S+", PAGE.read_text())
    assert not found
