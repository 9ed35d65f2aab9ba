"""The lists the docs give of registered things equal the registries: the
attack settings table in the API reference (issue 29)."""

import re
from pathlib import Path

from advtrain.attacks.attack import attack_settings, attacks

ROOT = Path(__file__).resolve().parents[2]


def _table(page: str, name: str) -> dict[str, str]:
    """The rows of the table between `<!-- NAME: begin -->` and `end`, by
    their first cell (without backticks)."""
    text = (ROOT / page).read_text()
    body = text.split(f"<!-- {name}: begin -->")[1].split(f"<!-- {name}: end -->")[0]
    rows = {}
    for line in body.strip().splitlines()[2:]:
        first, second = (c.strip() for c in line.strip("|").split("|")[:2])
        rows[first.strip("`")] = second
    return rows


def _built_in(registry) -> list[str]:
    """The names advtrain itself registers (not tests' or plugins')."""
    return [
        name
        for name in registry.names()
        if registry.get(name).__module__.startswith("advtrain.")
        and not name.startswith("cleverhans_")
    ]


def test_the_attack_settings_table_is_the_registry():
    rows = _table("docs/reference/attacks.md", "attack-settings")
    assert sorted(rows) == sorted(_built_in(attacks))
    for method, cell in rows.items():
        documented = re.findall(r"`(\w+)` \(([^):]+)", cell)
        settings = attack_settings(method)
        assert [n for n, _ in documented] == list(settings), method
        for name, default in documented:
            assert default == str(settings[name]), (method, name)


# ------------------------------------------------ the lists on the pages (issue 30)


def _built_in_backbones() -> list[str]:
    """The backbones advtrain registers (a spec's builder lives in
    advtrain; ones tests or plugins register do not)."""
    from advtrain.backbones.registry import backbones

    return [
        name
        for name in backbones.names()
        if backbones.get(name).builder.__module__.startswith("advtrain.")
    ]


def test_the_python_api_lists_every_attack():
    rows = _table("docs/python-api.md", "attacks")
    assert sorted(rows) == sorted(_built_in(attacks))


def test_the_architecture_page_lists_every_backbone():
    rows = _table("docs/architecture.md", "backbones")
    assert sorted(rows) == sorted(_built_in_backbones())
