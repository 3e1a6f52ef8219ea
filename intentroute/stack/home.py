"""Where a stack's state folder is: INTENTROUTE_HOME, else found from the current folder.

`intentroute up` keeps its state (servers' data, credentials, index, `stack.json`) in
`INTENTROUTE_HOME`, else in `.intentroute` of the folder it starts in. Every other
command finds it the way git finds `.git`: INTENTROUTE_HOME when set, else the nearest
`.intentroute` holding a running stack in the current folder or one of its parents, else
the nearest `.intentroute` there at all (a stopped stack: its index, its credentials),
else `./.intentroute`. Either way the path is made absolute once, here, so `stack.json`
and everything derived from it name absolute paths, whatever folder a command runs in.

A command that needs a running stack and finds none says so in one line
(`no_stack_line`): where it looked, the current folder, INTENTROUTE_HOME's value, and
the two ways to point at a stack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from intentroute.stack.state import STATE_FILE, StackInfo, pid_alive

FOLDER = ".intentroute"
VARIABLE = "INTENTROUTE_HOME"


@dataclass(frozen=True)
class Home:
    """A state folder and how it was chosen."""

    path: Path  # absolute
    cwd: Path
    # INTENTROUTE_HOME's value ("" unset or blank).
    variable: str = ""
    # The folders whose `.intentroute` was looked at, nearest first (none when the
    # variable decided).
    looked: tuple[Path, ...] = field(default_factory=tuple)
    # A running `up` keeps its stack.json there.
    running: bool = False


def _absolute(path: Path, cwd: Path) -> Path:
    path = path.expanduser()
    return Path(os.path.normpath(path if path.is_absolute() else cwd / path))


def running_in(folder: Path) -> bool:
    """Does a live `up` keep its stack.json in `folder`?"""
    try:
        info = msgspec.json.decode((folder / STATE_FILE).read_bytes(), type=StackInfo)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return False
    return not info.pid or pid_alive(info.pid)


def find_home(variable: str = "", cwd: Path | None = None) -> Home:
    """The state folder a command other than `up` uses (module doc); `variable`:
    INTENTROUTE_HOME's value ("" unset)."""
    cwd = _absolute(cwd or Path.cwd(), Path("/"))
    variable = variable.strip()
    if variable:
        path = _absolute(Path(variable), cwd)
        return Home(path, cwd, variable, running=running_in(path))
    looked: list[Path] = []
    existing: Path | None = None
    for folder in (cwd, *cwd.parents):
        looked.append(folder)
        candidate = folder / FOLDER
        if running_in(candidate):
            return Home(candidate, cwd, looked=tuple(looked), running=True)
        if existing is None and candidate.is_dir():
            existing = candidate
    return Home(existing or cwd / FOLDER, cwd, looked=tuple(looked))


def home_for_up(variable: str = "", cwd: Path | None = None) -> Home:
    """`up`'s state folder: INTENTROUTE_HOME (`variable`), else `.intentroute` here
    (never a parent's: a stack lives where it was started, as `git init` makes `.git`
    here)."""
    cwd = _absolute(cwd or Path.cwd(), Path("/"))
    variable = variable.strip()
    path = _absolute(Path(variable), cwd) if variable else cwd / FOLDER
    return Home(path, cwd, variable)


HOW_TO_POINT = (f"run the command from the stack's folder (where `intentroute up` runs) or "
                f"a sub-folder of it, or set {VARIABLE} to the stack's state folder (its "
                f"{FOLDER})")


def no_stack_line(home: Home) -> str:
    """One line: no running `intentroute up` was found, where it was looked for, and
    the two ways to point at one."""
    if home.variable:
        why = ("its `up` has stopped" if (home.path / STATE_FILE).exists()
               else f"no {STATE_FILE} there")
        return (f"no running `intentroute up` in {VARIABLE}={home.variable} ({why}); the "
                f"current folder is {home.cwd}: {HOW_TO_POINT} (or NATS_URL / DATABASE_URL "
                f"for servers of your own)")
    folders = ", ".join(str(f) for f in home.looked[1:])
    also = f", then {folders}" if folders else ""
    return (f"no running `intentroute up` found: looked for {FOLDER}/{STATE_FILE} in "
            f"{home.cwd} (the current folder){also}; {VARIABLE} is unset: {HOW_TO_POINT} "
            f"(or NATS_URL / DATABASE_URL for servers of your own)")


class HomeNotWritableError(Exception):
    """`up` cannot make its state folder (a read-only folder)."""


def make_home(home: Home) -> None:
    """Create `up`'s state folder, or say in one line why it cannot be and what to do."""
    try:
        home.path.mkdir(parents=True, exist_ok=True)
        probe = home.path / ".writable"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        where = (f"{VARIABLE}={home.variable}" if home.variable
                 else f"{FOLDER} in the current folder {home.cwd}")
        raise HomeNotWritableError(
            f"intentroute up: cannot write its state folder {home.path} ({where}): {why}: "
            f"run `intentroute up` from a folder you can write to, or set {VARIABLE} to "
            f"one (e.g. {VARIABLE}=~/.intentroute)") from None
