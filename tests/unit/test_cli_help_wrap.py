"""Help texts are wrapped by the terminal, not by the docstrings' line breaks (issue 31):
`intentroute --help` and every group's list of commands, at 80 and 120 columns."""

from __future__ import annotations

import itertools
import re

import pytest
import typer
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.cli.help_text import unwrap


def _commands(command: object, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...],
                                                                       object]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def test_no_paragraph_of_any_help_keeps_a_source_line_break() -> None:
    for path, command in _commands(typer.main.get_command(app)):
        for paragraph in (getattr(command, "help", None) or "").split("\n\n"):
            lines = paragraph.splitlines()
            indented = any(line[:1].isspace() for line in lines[1:])
            assert len(lines) == 1 or indented, (path, paragraph)


def test_unwrap_keeps_paragraphs_and_indented_examples() -> None:
    text = "One\ntwo.\n\nThree\nfour.\n\nExample:\n    a = 1\n    b = 2"
    assert unwrap(text) == "One two.\n\nThree four.\n\nExample:\n    a = 1\n    b = 2"


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", [[], ["docs"], ["agent"], ["deploy"]])
def test_a_sentence_breaks_only_where_the_panel_ends(columns: int, args: list[str]) -> None:
    """In a group's list of commands: a help line that ends with room for the next
    line's first word left was broken by the source, not by the terminal."""
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    rows = result.output.splitlines()
    assert max(len(row) for row in rows) <= columns
    # A line of a command's help that ends well before the panel's edge, while the next
    # line of the same help goes on with a word that would have fitted: a hard break.
    for row, after in itertools.pairwise(rows):
        inner = re.sub(r"^│\s*\S*\s{2,}", "", row).rstrip("│ ")
        nxt = re.sub(r"^│\s+", "", after).rstrip("│ ")
        if not (row.startswith("│") and after.startswith("│ ") and inner and nxt):
            continue
        if re.match(r"^│ \S", after) or nxt.startswith(("-", "[")):
            continue  # the next row is another command, an option or a default
        first_word = nxt.split()[0]
        room = columns - len(row.rstrip("│ ").rstrip()) - 3
        assert len(first_word) >= room, (args, columns, row, after)
