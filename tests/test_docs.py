"""The README a newcomer reads in ten minutes, and guides that are references (issue 38).

The README stays short (≤ 250 lines) and has a section for every command the CLI has; every relative link in it
and in docs/ reaches a file; and no document has dated section headings (a project's documents describe it
as it is; its history is in git).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from graphbisect.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted([README, *(ROOT / "docs").rglob("*.md")])
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md is {lines} lines: move the detail to docs/guide/"


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_the_readme_has_a_section_per_command(command: str) -> None:
    assert re.search(rf"^### `{command}`", README.read_text(), re.M), f"README.md has no section for `{command}`"


@pytest.mark.parametrize("document", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_reach_a_file(document: Path) -> None:
    missing = [target for target in _LINK.findall(document.read_text())
               if "://" not in target and not target.startswith("mailto:")
               and not (document.parent / target).exists()]
    assert not missing, f"{document.relative_to(ROOT)} links to what is not there: {missing}"


@pytest.mark.parametrize("document", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_section_headings(document: Path) -> None:
    dated = [line for line in document.read_text().splitlines()
             if line.startswith("#") and re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, f"{document.relative_to(ROOT)} has dated headings: {dated[:3]}"
