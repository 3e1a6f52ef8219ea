"""Commands other installed distributions add to `intentroute`, found by entry point.

A distribution adds commands by naming, in its metadata, a function that takes the root
app and registers on it:

    [project.entry-points."intentroute.commands"]
    bench = "bench.commands:register"

The development install's `intentroute-tools` (tools/pyproject.toml) adds `bench ...`,
`eval ...` and `train-classifier` this way; an install of the `intentroute` wheel alone
(the image) has none of them. The CLI imports no plugin's module by name, so no import
arrow runs from it to the tools (import-linter, `make lint`).

A plugin that cannot be loaded (a tools install out of date) costs its own commands
only: one line on stderr names it and why, and every other command works."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

import typer

GROUP = "intentroute.commands"

Register = Callable[[typer.Typer], None]


def load_plugins(app: typer.Typer, *, group: str = GROUP) -> list[str]:
    """Register every installed plugin's commands on `app`, in the order of their names;
    the names of those registered."""
    loaded = []
    for point in sorted(entry_points(group=group), key=lambda p: p.name):
        register = _load(point)
        if register is not None:
            register(app)
            loaded.append(point.name)
    return loaded


def _load(point: EntryPoint) -> Register | None:
    try:
        register: Register = point.load()
    except Exception as exc:  # a broken plugin costs its own commands, not the CLI
        where = f" ({point.dist.name})" if point.dist is not None else ""
        print(f"intentroute: the `{point.name}` commands{where} are not available: "
              f"{point.value}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return register
