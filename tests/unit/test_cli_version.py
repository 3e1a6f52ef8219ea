from importlib.metadata import version

from typer.testing import CliRunner

from intentroute.cli import app


def test_version_prints_the_installed_version_and_exits_zero() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"intentroute {version('intentroute')}"


def test_a_command_still_runs_below_the_root_callback() -> None:
    result = CliRunner().invoke(app, ["agent", "--help"])
    assert result.exit_code == 0
    assert "agent" in result.output.lower()
