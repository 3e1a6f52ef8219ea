"""A stack is found from any folder (issue 31): INTENTROUTE_HOME, else the nearest
`.intentroute` of a running `up` in the current folder or a parent, as git finds `.git`;
the path is absolute; when none is found, one line says where it looked and how to point
at one. `up` keeps its state where it starts, and a folder it cannot write is one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from intentroute.settings import CliSettings
from intentroute.stack.home import find_home, home_for_up, no_stack_line
from intentroute.stack.state import StackInfo, write_state

REPO = Path(__file__).resolve().parent.parent.parent


def running_stack(folder: Path, pid: int | None = None) -> Path:
    home = folder / ".intentroute"
    write_state(home, StackInfo(nats_url="nats://127.0.0.1:1", database_url="",
                                pid=os.getpid() if pid is None else pid))
    return home


def test_a_sub_folder_finds_the_running_stack_of_a_parent(tmp_path: Path) -> None:
    home = running_stack(tmp_path / "project")
    deep = tmp_path / "project" / "src" / "pkg"
    deep.mkdir(parents=True)
    found = find_home("", deep)
    assert found.path == home
    assert found.running
    assert found.looked == (deep, deep.parent, deep.parent.parent)


def test_a_running_stack_further_up_wins_over_a_stopped_one_nearer(tmp_path: Path) -> None:
    home = running_stack(tmp_path)
    stopped = running_stack(tmp_path / "sub", pid=2**22 + 12345)  # no such process
    assert find_home("", tmp_path / "sub").path == home
    # With none running, the nearest state folder (its index, its credentials).
    (home / "stack.json").unlink()
    found = find_home("", tmp_path / "sub")
    assert found.path == stopped
    assert not found.running


def test_the_variable_decides_and_is_made_absolute(tmp_path: Path) -> None:
    running_stack(tmp_path)
    found = find_home("elsewhere/../state", tmp_path)
    assert found.path == tmp_path / "state"
    settings = CliSettings.from_env({"INTENTROUTE_HOME": str(tmp_path / "s")})
    assert settings.state_dir == tmp_path / "s"
    assert settings.index_dir == tmp_path / "s" / "index"


def test_up_keeps_its_state_where_it_starts_absolute(tmp_path: Path) -> None:
    running_stack(tmp_path)
    (tmp_path / "sub").mkdir()
    assert home_for_up("", tmp_path / "sub").path == tmp_path / "sub" / ".intentroute"
    assert home_for_up("h", tmp_path).path == tmp_path / "h"


def test_nothing_found_is_one_line_naming_where_it_looked_and_both_ways(
        tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    line = no_stack_line(find_home("", deep))
    assert "\n" not in line
    assert f"in {deep} (the current folder), then {deep.parent}, {tmp_path}," in line
    assert "INTENTROUTE_HOME is unset" in line
    assert "from the stack's folder (where `intentroute up` runs) or a sub-folder" in line
    assert "set INTENTROUTE_HOME to the stack's state folder" in line
    given = no_stack_line(find_home(str(tmp_path / "x"), deep))
    assert f"INTENTROUTE_HOME={tmp_path / 'x'} (no stack.json there)" in given
    assert f"the current folder is {deep}" in given


def test_commands_say_so_from_a_folder_without_a_stack(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_", "INTENTROUTE_"))}
    env["PYTHONPATH"] = str(REPO)
    for args in (["status"], ["ask", "hello"], ["agent", "list"], ["dlq", "list"]):
        done = subprocess.run([sys.executable, "-m", "intentroute.cli", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (args, done.stderr)
        assert lines[0].startswith(
            "no running `intentroute up` found: looked for .intentroute/stack.json in "
            f"{tmp_path} (the current folder)"), (args, done.stderr)


def _read_only_up(folder: Path) -> subprocess.CompletedProcess[str]:
    """`intentroute up` started in `folder`, made read-only: a read-only mount of its
    own where the test may mount (root, as CI), else the folder's write bits off."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_", "INTENTROUTE_"))}
    env["PYTHONPATH"] = str(REPO)
    up = [sys.executable, "-m", "intentroute.cli", "up"]
    if os.geteuid() == 0 and shutil.which("unshare"):
        script = f'mount -t tmpfs -o ro,size=1m tmpfs "{folder}" && cd "{folder}" && exec "$@"'
        return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *up], env=env,
                              capture_output=True, text=True, timeout=120)
    if os.geteuid() == 0:
        pytest.skip("root without unshare: no folder is read-only to it")
    folder.chmod(0o555)
    try:
        return subprocess.run(up, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        folder.chmod(0o755)


def test_up_in_a_read_only_folder_is_one_line_with_the_way_out(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    done = _read_only_up(folder)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"intentroute up: cannot write its state folder "
                               f"{folder}/.intentroute (.intentroute in the current folder "
                               f"{folder}): ")
    assert lines[0].endswith("run `intentroute up` from a folder you can write to, or set "
                             "INTENTROUTE_HOME to one (e.g. INTENTROUTE_HOME=~/.intentroute)")

