"""The README's commands are true: every `intentroute ...` it names (fenced examples,
the CLI table, the prose) is a command with the flags it shows, every command's --help
says what it does, and the examples that can run in a test run as written.

The README's fenced `sh` lines are each either run here (RUN) or listed in NOT_RUN with
the reason, so a new example cannot go unchecked."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from intentroute.cli import app
from tests.helpers.databases import fresh_database

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
BIN = Path(sys.executable).parent  # the venv's bin: `intentroute` and `.venv/bin/...`

# Fenced examples not run here, and why.
NOT_RUN = {
    "make run": "the whole demo (install, stack, ingest, one question per type): `make run`",
    "make test": "the whole suite",
    # Answers need `up`'s workers and models (about a minute to load on this machine);
    # `make run` asks one question per type; tests/integration/test_pipeline.py asks
    # through the same caller code (shared.client.caller).
    "ask": "needs the running workers (`intentroute up`)",
    # Compose and Kubernetes: they write ./secrets into the repository and need a Docker
    # engine or a cluster; tests/unit/test_compose.py, test_k8s_manifests.py and
    # tests/integration/test_deploy_secrets.py run the same commands on temporary dirs.
    "deploy": "writes ./secrets and deploy/k8s/secrets.yaml into the repository",
    "compose": "needs a Docker engine",
    "apply": "needs a Kubernetes cluster with KEDA",
    # tests/integration/test_feedback_up.py runs a real `up` (with --grpc and metrics).
    "up": "starts the whole stack and keeps running until Ctrl-C",
}


def fenced_lines() -> list[str]:
    """The command lines of the README's ```sh blocks, comments and continuations off."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        # A line ending in a backslash continues on the next, written flush left.
        for line in block.replace("\\\n", "").splitlines():
            command = line.split("  #")[0].strip()
            if command and not line.startswith(" "):
                # Environment assignments before the command are not the command.
                words = command.split()
                while len(words) > 1 and re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", words[0]):
                    words = words[1:]
                lines.append(" ".join(words))
    return lines


def mentions() -> set[str]:
    """Every `intentroute ...` the README shows: fenced lines and inline code."""
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    found = {m.replace("\\|", "|") for m in re.findall(
        r"`((?:\.venv/bin/)?intentroute [a-z][^`]*)`", prose)}
    return found | {line for line in fenced_lines() if "intentroute " in line}


def expand(words: list[str]) -> list[list[str]]:
    """`bench pipeline|classifier` -> one word list per alternative command."""
    variants: list[list[str]] = [[]]
    for word in words[:2]:
        if re.fullmatch(r"[a-z-]+(\|[a-z-]+)+", word):
            variants = [[*v, alt] for v in variants for alt in word.split("|")]
        else:
            variants = [[*v, word] for v in variants]
    return [v + words[2:] for v in variants]


ROOT: Any = typer.main.get_command(app)


def resolve(words: list[str]) -> tuple[Any, list[str]]:
    """The command `words` name and its path (the longest prefix that is a command)."""
    command: Any = ROOT
    path: list[str] = []
    for word in words:
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            break
        command, path = sub, [*path, word]
    return command, path


def option_names(command: Any) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def leaf_commands(command: Any = ROOT, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = getattr(command, "commands", None)
    if not subs:
        return [path]
    found = [path] if path and command.callback is not None else []
    for name, sub in subs.items():
        found += leaf_commands(sub, (*path, name))
    return found


def test_every_command_the_readme_names_exists_with_its_flags() -> None:
    checked, wrong = 0, []
    for mention in sorted(mentions()):
        # Environment assignments (`OTEL_...=x intentroute up`) come before the command.
        split = mention.split()
        at = next((i for i, w in enumerate(split) if w.endswith("intentroute")), 0)
        words = split[at + 1:]
        if words and words[0].endswith(":"):  # a message `intentroute up:` prints
            continue
        for variant in expand(words):
            command, path = resolve(variant)
            if variant and not variant[0].startswith("-") and not path:
                wrong.append(f"{mention!r}: no command {variant[0]!r}")
                continue
            flags = set(re.findall(r"--[a-z][a-z0-9-]*", " ".join(variant)))
            unknown = flags - option_names(command) - option_names(ROOT)
            if unknown:
                wrong.append(f"{mention!r}: {' '.join(path)} has no {sorted(unknown)}")
            checked += 1
    assert not wrong, "\n".join(wrong)
    assert checked > 60  # the CLI table, the examples and the prose


@pytest.mark.parametrize("path", leaf_commands(), ids=" ".join)
def test_every_command_has_a_help_saying_what_it_does(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    command, _ = resolve(list(path))
    assert len(command.help or "") > 20, f"{path}: {command.help!r}"


@pytest.mark.parametrize(("path", "says"), [
    # What ingest does to what is indexed already, and what --replace does.
    (("ingest",), ["every other indexed source stays", "--replace",
                   "makes the index hold PATH's documents only"]),
    # The values --query-type takes.
    (("ask",), ["RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL", "PLATFORM"]),
    # The root options: exit codes, --version, --debug, --timeout.
    ((), ["Exit codes: 0 done, 1 refused or failed", "--version", "--debug",
          "INTENTROUTE_DEBUG", "--timeout"]),
    (("learn",), ["runs it once", "--json"]),
])
def test_a_help_says_what_the_command_changes(path: tuple[str, ...], says: list[str]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    for phrase in says:
        assert phrase in text, f"{path}: no {phrase!r} in {text}"


def run_as_written(line: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A README line as a person runs it from the repository root, with the venv's
    `intentroute` on PATH and no running stack unless `env` names one."""
    args = shlex.split(line)
    if args[0] == ".venv/bin/intentroute":
        args[0] = str(BIN / "intentroute")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("NATS_", "DATABASE_", "INTENTROUTE_"))}
    base.update(PATH=f"{BIN}{os.pathsep}{base.get('PATH', '')}", INTENTROUTE_HOME=str(home),
                **env)
    return subprocess.run(args, cwd=REPO, env=base, capture_output=True, text=True,
                          timeout=600)


# Fenced examples run here as written (the `intentroute agent ...` block runs in
# test_the_policy_examples_run_as_written).
RUN = {
    ".venv/bin/intentroute parse examples/handler.avap --strict --json":
        lambda out: json.loads(out) == {"valid": True, "trace": []},
}


def test_each_fenced_example_is_run_or_said_why_not() -> None:
    for line in fenced_lines():
        words = line.replace(".venv/bin/intentroute", "intentroute").split()
        key = " ".join(words[:2]) if words[0] == "make" else words[1]
        assert key in NOT_RUN or line in RUN or key == "agent", line


def test_the_offline_examples_run_as_written(tmp_path: Path) -> None:
    for line, printed_right in RUN.items():
        done = run_as_written(line, tmp_path)
        assert done.returncode == 0, done.stderr
        assert printed_right(done.stdout), done.stdout
    # The files the ask examples name are shipped.
    for name in re.findall(r"--editor (\S+)", "\n".join(fenced_lines())):
        assert (REPO / name).is_file(), name
    version = run_as_written("intentroute --version", tmp_path)
    assert re.fullmatch(r"intentroute \S+\n", version.stdout), version.stdout
    listed = run_as_written("intentroute ingest --list", tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "nothing indexed" in listed.stdout + listed.stderr
    as_json = json.loads(run_as_written("intentroute ingest --list --json", tmp_path).stdout)
    assert as_json["sources"] == {}


def test_the_routing_evaluation_runs_on_the_repositorys_set(tmp_path: Path) -> None:
    line = re.search(r"`(intentroute eval routing tests/data/routing_eval\.jsonl --json)`",
                     README)
    assert line, "the README's evaluation table names the routing set"
    done = run_as_written(line.group(1), tmp_path, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n"] == 286  # "the cascade on 286 held-out lines"


def test_the_policy_examples_run_as_written(database_url: str, tmp_path: Path) -> None:
    block = [line for line in fenced_lines() if line.startswith("intentroute agent ")]
    assert len(block) == 4, block
    with fresh_database(database_url) as db_url:
        for name in ("ide", "chat"):
            added = run_as_written(f"intentroute agent add {name}", tmp_path,
                                   DATABASE_URL=db_url)
            assert added.returncode == 0, added.stderr
        for line in block:
            done = run_as_written(line, tmp_path, DATABASE_URL=db_url)
            assert done.returncode == 0, (line, done.stderr)
        comment = re.search(r"intentroute agent show chat\s+# (\{.*\})", README)
        assert comment, "the show example says what it prints"
        assert json.loads(done.stdout) == json.loads(comment.group(1))
