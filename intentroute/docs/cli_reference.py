"""Every command of the CLI with its arguments, options and help, rendered from the Typer
app itself (`docs/reference/cli.md`, `intentroute docs cli`): what `--help` says, on one
page. Commands come in the order the app registers them; each option's line is the one
`--help` prints (its metavar, help and default)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from intentroute.docs.markdown import GENERATED, code, table, text

DEFAULT_OUT = Path("docs/reference/cli.md")
PROGRAM = "intentroute"


def root() -> Any:
    from intentroute.cli import app

    return typer.main.get_command(app)


def commands(command: Any = None, path: tuple[str, ...] = (),
             parent: Any = None) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """(path, command, its context) for the root and every command and group under it."""
    command = command if command is not None else root()
    context = command.make_context(path[-1] if path else PROGRAM, [], parent=parent,
                                   resilient_parsing=True)
    yield path, command, context
    for name, sub in getattr(command, "commands", {}).items():
        if not getattr(sub, "hidden", False):
            yield from commands(sub, (*path, name), context)


def _usage(path: tuple[str, ...], command: Any) -> str:
    words = [PROGRAM, *path]
    if any(not _is_argument(p) for p in command.params):
        words.append("[OPTIONS]")
    for param in command.params:
        if _is_argument(param):
            name = param.name.upper()
            many = param.nargs != 1
            word = f"{name}..." if many else name
            words.append(word if param.required else f"[{word}]")
    if getattr(command, "commands", None):
        words.append("COMMAND [ARGS]...")
    return " ".join(words)


def _is_argument(param: Any) -> bool:
    return not getattr(param, "opts", [""])[0].startswith("-")


def _help(command: Any) -> list[str]:
    """The command's help as Markdown paragraphs."""
    body = inspect.cleandoc(command.help or "")
    return [text(paragraph) for paragraph in body.split("\n\n") if paragraph.strip()]


def _anchor(path: tuple[str, ...]) -> str:
    """The heading's id, as the site's table of contents makes it."""
    return "-".join((PROGRAM, *path))


def render() -> str:
    found = list(commands())
    lines = [
        GENERATED.format(command="cli", source="a command or its options"), "",
        "# CLI reference", "",
        "Every command of `intentroute`, as its `--help` describes it. Options of the "
        "root command (`--debug`, `--timeout`, `--version`) come before the command: "
        "`intentroute --timeout 10 status`. [Using the CLI](../guides/cli.md) tells "
        "what the commands are for, how a failure is reported and the exit codes.", "",
    ]
    listing = [(f"[{code(' '.join((PROGRAM, *p)))}](#{_anchor(p)})",
                (_help(c) or [""])[0])
               for p, c, _ in found if p]
    lines += table(("command", "what it does"), listing)
    lines.append("")
    for path, command, context in found:
        heading = "#" * min(2 + len(path[:-1]) if path else 2, 4)
        title = " ".join((PROGRAM, *path))
        lines += [f"{heading} {title}", ""]
        lines += [*(p + "\n" for p in _help(command))]
        lines += ["```text", _usage(path, command), "```", ""]
        rows = []
        for param in command.params:
            record = param.get_help_record(context)
            if record is None:
                continue
            name, what = record
            rows.append((code(name), text(what) or "—"))
        if rows:
            lines += table(("argument / option", "what it does"), rows)
            lines.append("")
    return "\n".join(lines)
