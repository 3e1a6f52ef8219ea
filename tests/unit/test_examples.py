"""The docs' example files (README.md and the site's pages, docs/) are shipped in
examples/, and each AVAP one is a program the reference parser accepts in strict mode,
through `intentroute parse` as the docs run it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intentroute.cli import app

REPO = Path(__file__).resolve().parents[2]
DOCS = "\n".join(p.read_text(encoding="utf-8")
                 for p in [REPO / "README.md", *(REPO / "docs").rglob("*.md")])
# A path under examples/ as a page writes it in a command or in prose.
NAMED = sorted(set(re.findall(r"(?<![\w/])examples/[\w.-]+\.\w+", DOCS)))
SHIPPED = sorted(f"examples/{p.name}" for p in (REPO / "examples").iterdir() if p.is_file())


def test_the_docs_name_example_files_and_each_is_shipped() -> None:
    assert "examples/handler.avap" in NAMED
    missing = [name for name in NAMED if not (REPO / name).is_file()]
    assert missing == []


@pytest.mark.parametrize("name", [n for n in sorted({*NAMED, *SHIPPED}) if n.endswith(".avap")])
def test_an_avap_example_parses_valid_in_strict_mode(name: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the docs' commands run from the repository's root
    result = CliRunner().invoke(app, ["parse", name, "--strict", "--json"])
    assert json.loads(result.stdout) == {"valid": True, "trace": []}
    assert result.exit_code == 0
