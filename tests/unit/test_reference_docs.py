"""The site's generated pages (docs/reference/configuration.md, cli.md, subjects.md,
metrics.md and docs/diagrams/*.svg) are what the code generates, byte for byte: a
stale one fails here, saying which command writes it again. Each command's --check
finds a stale copy; the pages say what they must (every variable with its doc, every
command, every subject and metric); the diagrams render offline."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.docs import cli_reference, configuration, diagrams, metrics_reference, subjects
from intentroute.docs.asyncapi import document
from shared.common.settings import CommonSettings, declared_variables

REPO = Path(__file__).resolve().parents[2]

PAGES: dict[str, tuple[Path, Callable[[], str]]] = {
    "config": (configuration.DEFAULT_OUT, configuration.render),
    "cli": (cli_reference.DEFAULT_OUT, cli_reference.render),
    "subjects": (subjects.DEFAULT_OUT, lambda: subjects.render(document())),
    "metrics": (metrics_reference.DEFAULT_OUT, metrics_reference.render),
}


@pytest.mark.parametrize("command", sorted(PAGES))
def test_the_committed_page_is_what_the_code_generates(command: str) -> None:
    path, render = PAGES[command]
    committed = (REPO / path).read_text(encoding="utf-8")
    if committed != render():
        pytest.fail(f"{path} is out of date: run `intentroute docs {command}`", pytrace=False)


def test_the_committed_diagrams_are_what_the_declarations_draw() -> None:
    committed = {p.name: p.read_text(encoding="utf-8")
                 for p in (REPO / diagrams.DEFAULT_OUT).glob("*.svg")}
    if committed != diagrams.render():
        pytest.fail("docs/diagrams is out of date: run `intentroute docs diagrams`",
                    pytrace=False)


@pytest.mark.parametrize("command", sorted(PAGES))
def test_check_finds_a_stale_page_in_one_line(command: str, tmp_path: Path) -> None:
    runner = CliRunner()
    page = tmp_path / "page.md"
    assert runner.invoke(app, ["docs", command, "--out", str(page)]).exit_code == 0
    assert runner.invoke(app, ["docs", command, "--check", "--out", str(page)]).exit_code == 0
    page.write_text(page.read_text(encoding="utf-8") + "edited by hand\n", encoding="utf-8")
    stale = runner.invoke(app, ["docs", command, "--check", "--out", str(page)])
    assert stale.exit_code == 1
    assert len(stale.output.strip().splitlines()) == 1
    assert f"run `intentroute docs {command}" in stale.output
    assert runner.invoke(app, ["docs", command, "--check", "--out",
                               str(tmp_path / "missing.md")]).exit_code == 1


def test_diagrams_check_finds_a_changed_or_extra_file(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["docs", "diagrams", "--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["docs", "diagrams", "--check", "--out", str(tmp_path)]
                         ).exit_code == 0
    (tmp_path / "architecture.svg").write_text("<svg/>", encoding="utf-8")
    (tmp_path / "gone.svg").write_text("<svg/>", encoding="utf-8")
    stale = runner.invoke(app, ["docs", "diagrams", "--check", "--out", str(tmp_path)])
    assert stale.exit_code == 1
    assert "architecture.svg" in stale.output
    assert "gone.svg" in stale.output
    assert runner.invoke(app, ["docs", "diagrams", "--out", str(tmp_path)]).exit_code == 0
    assert not (tmp_path / "gone.svg").exists()


def test_the_pages_do_not_depend_on_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    before = {name: render() for name, (_, render) in PAGES.items()}
    for name, value in {"HOME": "/nowhere", "XDG_CACHE_HOME": "/cache", "COLUMNS": "40",
                        "NATS_URL": "nats://elsewhere:4222", "INTENTROUTE_HOME": "/state",
                        "DATABASE_URL": "postgresql://x@y/z", "STAGE_ACK_WAIT": "9"}.items():
        monkeypatch.setenv(name, value)
    assert {name: render() for name, (_, render) in PAGES.items()} == before
    assert diagrams.render() == diagrams.render()


def test_every_variable_is_on_the_configuration_page_with_what_it_does() -> None:
    assert configuration.undocumented() == [], (
        "write a comment above these settings fields (it is their documentation)")
    page = configuration.render()
    listed = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", page, re.M))
    for cls in configuration.settings_classes():
        for name, _ in declared_variables(cls):
            assert name in listed, name
    # A secret's file variable is listed beside it.
    assert {"NATS_PASSWORD_FILE", "INTENTROUTE_ADMISSION_KEY_FILE",
            "GATEWAY_DASHBOARD_TOKEN_FILE"} <= listed
    # Defaults are the declarations' (not this machine's).
    assert "| `STAGE_ACK_WAIT` | `2` | number (seconds) |" in page
    assert "| `INTENTROUTE_ONNX_CACHE` | derived when unset |" in page
    assert CommonSettings.__name__ in page


def test_a_comment_documents_the_fields_under_it_up_to_a_blank_line() -> None:
    from services.gateway.settings import GatewaySettings

    docs = configuration.field_docs(GatewaySettings)
    assert docs["fair_quantum"] == docs["pipeline_backlog"]  # one comment, four fields
    assert "gRPC" not in docs["batch_size"]  # its own comment, not the one above it


def test_every_command_is_on_the_cli_page_with_its_options() -> None:
    page = cli_reference.render()
    for path, command, _ in cli_reference.commands():
        title = " ".join(("intentroute", *path))
        assert re.search(rf"^#+ {re.escape(title)}$", page, re.M), title
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert f"`{opt}" in page, (title, opt)


def test_every_channel_and_message_is_on_the_subjects_page() -> None:
    doc = document()
    page = subjects.render(doc)
    for channel in doc["channels"].values():
        assert f"`{channel['address']}`" in page if channel["address"] else \
            "the reply subject (an inbox)" in page
    for name in doc["components"]["messages"]:
        assert f"### {name} message" in page
    for name in doc["components"]["schemas"]:
        assert f"### {name}\n" in page


def test_every_metric_is_on_the_metrics_page() -> None:
    source = (REPO / "shared" / "runtime" / "metrics.py").read_text(encoding="utf-8")
    # Instrument names as metrics.py writes them (the consumer gauges by a loop).
    declared = set(re.findall(r'"(intentroute\.(?:stage|dead_letters|breaker)\.[a-z_]+)"',
                              source))
    declared |= {f"intentroute.consumer.{f}" for f in
                 re.findall(r'\("(\w+)", "[A-Z]', source)}
    page = metrics_reference.render()
    found = {m.otel_name for m in metrics_reference.metrics()}
    assert len(declared) == 12
    assert declared == found
    for metric in metrics_reference.metrics():
        assert f"`{metric.prometheus}`" in page
    assert "`intentroute_stage_duration_seconds` | histogram" in page


@pytest.mark.parametrize("name", sorted(diagrams.render()))
def test_a_diagram_is_plain_svg_that_renders_offline(name: str) -> None:
    drawn = diagrams.render()[name]
    root = ET.fromstring(drawn)  # well-formed
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.find("{http://www.w3.org/2000/svg}title") is not None
    for active in ("<script", "@import", "@font-face", "<foreignObject", "xlink:href"):
        assert active not in drawn
    # The only URL is the SVG namespace; references are to the file's own ids.
    urls = set(re.findall(r"https?://[^\"' )]+", drawn))
    assert urls == {"http://www.w3.org/2000/svg"}
    assert set(re.findall(r"url\((#[^)]+)\)", drawn)) <= {"#arrow"}
    assert json.dumps(drawn)  # text only
