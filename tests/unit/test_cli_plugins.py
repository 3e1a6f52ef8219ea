"""Serving apart from tooling: the wheel ships what serves, and the CLI reaches the tools'
commands (`bench ...`, `eval ...`, `train-classifier`) through the `intentroute.commands`
entry points, never by import (import-linter says the second half in `make lint`)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest
import typer
from setuptools import find_packages
from typer.testing import CliRunner

from intentroute.cli import app, plugins
from intentroute.cli.plugins import GROUP, load_plugins

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("bench", "offline", "testkit")


def _said_hello(app: typer.Typer) -> None:
    @app.command("hello")
    def hello() -> None:
        typer.echo("hello")


def test_the_wheel_ships_the_serving_packages_only() -> None:
    found = (tomllib.loads((REPO / "pyproject.toml").read_text())
             ["tool"]["setuptools"]["packages"]["find"])
    packages = find_packages(str(REPO), include=found["include"], exclude=found["exclude"])
    assert {p.split(".")[0] for p in packages} == {"intentroute", "services", "shared"}
    assert "services.classifier.layer2" in packages
    assert not [p for p in packages if "offline" in p.split(".")]


def test_the_image_copies_no_tool() -> None:
    copied = re.findall(r"^COPY (\S+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert not set(copied) & {*TOOLS, "tools", "tests"}


def test_the_tools_register_their_commands_by_entry_point() -> None:
    points = {p.name: p.value for p in entry_points(group=GROUP)}
    assert points == {"bench": "bench.commands:register",
                      "offline": "offline.commands:register"}
    names = {c.name for c in app.registered_commands} | {
        g.name for g in app.registered_groups}
    assert {"bench", "eval", "train-classifier"} <= names


def test_a_plugin_module_imported_before_the_cli_still_registers() -> None:
    # bench.commands imports intentroute.cli.apps: loading plugins while the CLI package
    # is imported would find bench.commands half-initialised, without `register`.
    probe = ("import bench.commands, offline.commands\n"
             "from intentroute.cli import app\n"
             "print(sorted(g.name for g in app.registered_groups if g.name in "
             "('bench', 'eval')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    assert (done.stdout, done.stderr) == ("['bench', 'eval']\n", "")


@pytest.mark.parametrize(("args", "shown"), [
    (["bench", "--help"], "pipeline"),
    (["eval", "--help"], "retrieval"),
    (["train-classifier", "--help"], "--early-exit-layers"),
])
def test_the_tools_commands_answer_as_before(args: list[str], shown: str) -> None:
    result = CliRunner().invoke(app, args, terminal_width=100, prog_name="intentroute")
    assert result.exit_code == 0, result.output
    assert shown in result.output


def test_a_plugin_that_cannot_load_costs_only_its_own_commands(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    points = [EntryPoint("broken", "no_such_module_here:register", GROUP),
              EntryPoint("fine", f"{__name__}:_said_hello", GROUP)]
    monkeypatch.setattr(plugins, "entry_points", lambda group: points)
    root = typer.Typer()

    @root.callback()
    def main() -> None:
        pass

    assert load_plugins(root) == ["fine"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("intentroute: the `broken` commands are not available: "
                             "no_such_module_here:register: ModuleNotFoundError")
    result = CliRunner().invoke(root, ["hello"])
    assert (result.exit_code, result.output) == (0, "hello\n")
