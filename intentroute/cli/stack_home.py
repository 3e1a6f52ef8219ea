"""The CLI's side of finding a stack (intentroute.stack.home): the one line a command
says when it needs a running `intentroute up` and finds none, and `up`'s when it cannot
write its state folder. Both exit 2 (usage: nothing to talk to, a folder to change)."""

from __future__ import annotations

from typing import NoReturn

from intentroute.cli.failure_lines import UsageError
from intentroute.settings import CliSettings, home_variable
from intentroute.stack.home import (
    HomeNotWritableError,
    find_home,
    home_for_up,
    make_home,
    no_stack_line,
)


def no_stack() -> NoReturn:
    """End the command: no running stack was found (where it looked, how to point)."""
    raise UsageError(no_stack_line(find_home(home_variable())))


def writable_home(cli: CliSettings) -> None:
    """`up`'s state folder, created; a read-only folder is one line naming the folder and
    what to do instead."""
    home = home_for_up(home_variable())
    if home.path != cli.state_dir:  # settings built from another environment (tests)
        return
    try:
        make_home(home)
    except HomeNotWritableError as exc:
        raise UsageError(str(exc)) from None
