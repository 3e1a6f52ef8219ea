"""Help texts wrapped by the terminal, not by the source: a command's docstring is
written wrapped at the code's line length, and Typer's rich help keeps those line
breaks (in a group's list of commands, and after a help's first paragraph), so at 80 or
200 columns a sentence broke where the source did. `unwrap_help` joins each paragraph's
lines once, for every command of the app (the plugins' too); a paragraph whose lines
are indented (an example) is kept as written."""

from __future__ import annotations

import inspect
from types import FunctionType
from typing import Any

import typer


def unwrap(text: str) -> str:
    """`text` with the line breaks inside each paragraph turned into spaces."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines = paragraph.splitlines()
        if paragraph.startswith("\b") or any(line[:1].isspace() for line in lines[1:]):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)


def _unwrap_info(info: Any) -> None:
    """A command's or group's help where Typer takes it from: its `help` when given,
    else its function's docstring (rewritten in place, so Typer's order is kept)."""
    if isinstance(info.help, str):
        info.help = unwrap(info.help)
        return
    callback = getattr(info, "callback", None)
    if isinstance(callback, FunctionType) and callback.__doc__:
        callback.__doc__ = unwrap(callback.__doc__)


def unwrap_help(app: typer.Typer) -> None:
    """Every command's and group's help in `app`, unwrapped (module doc)."""
    if app.registered_callback is not None:
        _unwrap_info(app.registered_callback)
    if isinstance(app.info.help, str):
        app.info.help = unwrap(app.info.help)
    for command in app.registered_commands:
        _unwrap_info(command)
    for group in app.registered_groups:
        _unwrap_info(group)
        if group.typer_instance is not None:
            unwrap_help(group.typer_instance)
