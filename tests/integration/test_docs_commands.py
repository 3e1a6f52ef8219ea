"""The documentation's commands are true, on every page of the site and the README:
every `intentroute ...` they name (fenced examples, tables, prose) is a command with the
flags it shows, every command's --help says what it does, and every fenced shell line is
either run here as written (offline, against a fresh database, or in a scratch
directory) or listed in NOT_RUN with the reason, so a new example cannot go unchecked.

The pages are README.md and docs/**/*.md (the site, mkdocs.yml)."""

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
PAGES = {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
         for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]}
BIN = Path(sys.executable).parent  # the venv's bin: `intentroute` and `.venv/bin/...`
SHELL_BLOCK = re.compile(r"```(?:sh|bash|shell|console)\n(.*?)```", re.S)

# Fenced lines not run here, by what they start with, and why.
NOT_RUN = {
    "make run": "the whole demo (install, stack, ingest, one question per type): `make run`",
    "make test": "the whole suite",
    # Answers need `up`'s workers and models: tests/integration/test_first_hour.py runs
    # the quick start's `ask` lines as written against a real `up`, from its folder, a
    # sub-folder and another folder with INTENTROUTE_HOME.
    "intentroute ask": "needs the running workers (`intentroute up`): test_first_hour.py",
    # tests/integration/test_feedback_up.py runs a real `up` (with --grpc and metrics);
    # test_nats_cluster.py the cluster.
    "intentroute up": "starts the whole stack and keeps running until Ctrl-C",
    "intentroute worker": "runs one worker against a running stack until stopped",
    "intentroute status": "reads a running stack (tests/integration/test_ops_signals.py)",
    "intentroute dlq": "needs a running stack's dead letters (test_dead_letters.py)",
    # Compose and Kubernetes need a Docker engine or a cluster; tests/unit/test_compose.py
    # and test_k8s_manifests.py check the files these commands use.
    "docker compose": "needs a Docker engine",
    "kubectl": "needs a Kubernetes cluster with KEDA",
    # A running gateway's doors: tests/integration/test_grpc_contract.py and
    # test_openai_door.py make the same calls with grpcio and the OpenAI SDK.
    "grpcurl": "needs a running gateway with --grpc; grpcurl is not installed here",
    "curl": "needs a running gateway's HTTP listener",
    "assign": "reads .intentroute/stack.json of a running stack",
    "nats": "the NATS CLI is not installed here (test_agents_cli.py checks the context)",
}
# Run against a fresh database, page by page in the order written (agents `ide` and
# `chat`, which the examples name, added first).
WITH_DATABASE = ("intentroute agent", "intentroute learn", "intentroute report",
                 "intentroute retention")
# Run in a scratch directory (they write ./secrets, ./prod).
IN_SCRATCH = ("intentroute deploy",)


def shell_lines(text: str) -> list[str]:
    """The command lines of a page's shell blocks, comments and continuations off."""
    lines: list[str] = []
    for block in SHELL_BLOCK.findall(text):
        # A line ending in a backslash continues on the next.
        for line in block.replace("\\\n", "").splitlines():
            command = line.split("  #")[0].strip()
            if command and not line.startswith(" "):
                lines.append(command)
    return lines


def fenced_lines() -> list[tuple[str, str]]:
    """(page, line) for every fenced shell line of the site and the README."""
    return [(page, line) for page, text in PAGES.items() for line in shell_lines(text)]


def command_words(line: str) -> list[str]:
    """The words of the command itself: environment assignments before it dropped."""
    words = line.split()
    while len(words) > 1 and re.fullmatch(r"[A-Z][A-Z0-9_]*=[^$\s]\S*", words[0]):
        words = words[1:]
    return words


def key(line: str) -> str:
    """What a fenced line is, for NOT_RUN and the runs below: `intentroute agent`,
    `make run`, `docker compose`, `grpcurl`, `assign` (NAME=$(...))."""
    words = command_words(line)
    if re.fullmatch(r"[A-Z][A-Z0-9_]*=\$\(.*", words[0]):
        return "assign"
    program = words[0]
    if program.endswith("intentroute"):
        sub = next((w for w in words[1:] if not w.startswith("-")), "")
        return f"intentroute {sub}"
    if program in ("make", "docker"):
        return " ".join(words[:2])
    return program


def mentions() -> set[str]:
    """Every `intentroute ...` the pages show: fenced lines and inline code."""
    found: set[str] = set()
    for text in PAGES.values():
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        found |= {m.replace("\\|", "|") for m in re.findall(
            r"`((?:\.venv/bin/)?intentroute [a-z-][^`]*)`", prose)}
    return found | {line for _, line in fenced_lines() if "intentroute " in line}


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


def test_the_site_and_the_readme_are_read() -> None:
    assert "README.md" in PAGES
    assert "docs/guides/cli.md" in PAGES
    assert "docs/reference/cli.md" in PAGES
    assert len(PAGES) > 40


def test_every_command_the_docs_name_exists_with_its_flags() -> None:
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
    assert checked > 100  # the CLI guide and reference, the examples and the prose


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


def run_as_written(line: str, home: Path, cwd: Path = REPO,
                   **env: str) -> subprocess.CompletedProcess[str]:
    """A docs line as a person runs it (from the repository root unless `cwd`), with the
    venv's `intentroute` on PATH and no running stack unless `env` names one."""
    args = shlex.split(line)
    if args[0] == ".venv/bin/intentroute":
        args[0] = str(BIN / "intentroute")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("NATS_", "DATABASE_", "INTENTROUTE_"))}
    base.update(PATH=f"{BIN}{os.pathsep}{base.get('PATH', '')}", INTENTROUTE_HOME=str(home),
                **env)
    return subprocess.run(args, cwd=cwd, env=base, capture_output=True, text=True,
                          timeout=600)


# Fenced examples run here as written, offline, and what they must print.
RUN = {
    ".venv/bin/intentroute parse examples/handler.avap --strict --json":
        lambda out: json.loads(out) == {"valid": True, "trace": []},
}
# Run with the shell's redirect left off (its target is the reader's own file).
REDIRECTED = {
    ".venv/bin/intentroute agent export .intentroute/creds/demo.json > "
    "~/.config/nats/context/intentroute-demo.json",
}


def test_each_fenced_example_is_run_or_said_why_not() -> None:
    for page, line in fenced_lines():
        what = key(line)
        assert (what in NOT_RUN or line in RUN or line in REDIRECTED
                or what.startswith(WITH_DATABASE) or what.startswith(IN_SCRATCH)), (page, line)
    shown = {line for _, line in fenced_lines()}
    assert all(line in shown for line in (*RUN, *REDIRECTED))


def test_the_offline_examples_run_as_written(tmp_path: Path) -> None:
    for line, printed_right in RUN.items():
        done = run_as_written(line, tmp_path)
        assert done.returncode == 0, done.stderr
        assert printed_right(done.stdout), done.stdout
    # The files the ask examples name are shipped.
    for name in re.findall(r"--editor (\S+)", "\n".join(line for _, line in fenced_lines())):
        assert (REPO / name).is_file(), name
    version = run_as_written("intentroute --version", tmp_path)
    assert re.fullmatch(r"intentroute \S+\n", version.stdout), version.stdout
    listed = run_as_written("intentroute ingest --list", tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "nothing indexed" in listed.stdout + listed.stderr
    as_json = json.loads(run_as_written("intentroute ingest --list --json", tmp_path).stdout)
    assert as_json["sources"] == {}


def test_the_routing_evaluation_runs_on_the_repositorys_set(tmp_path: Path) -> None:
    lines = {m for text in PAGES.values() for m in re.findall(
        r"`(intentroute eval routing tests/data/routing_eval\.jsonl --json)`", text)}
    assert lines, "the measurements page names the routing set"
    done = run_as_written(lines.pop(), tmp_path, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n"] == 286  # "the cascade on 286 held-out lines"


def test_the_deployment_examples_run_as_written(tmp_path: Path) -> None:
    """`deploy init` and `deploy k8s`, in a scratch directory as an operator runs them
    in a checkout of their own: the secrets and the rendered manifests are written."""
    lines = [line for _, line in fenced_lines() if key(line).startswith(IN_SCRATCH)]
    assert any("deploy k8s" in line for line in lines), lines
    for line in lines:
        done = run_as_written(line, tmp_path / "home", cwd=tmp_path)
        assert done.returncode == 0, (line, done.stderr)
    assert (tmp_path / "secrets" / "nats" / "auth.conf").is_file()
    assert (tmp_path / "prod" / "kustomization.yaml").is_file()
    assert (tmp_path / "prod" / "secrets.yaml").is_file()


def test_the_database_examples_run_as_written(database_url: str, tmp_path: Path) -> None:
    """Every fenced `intentroute agent|learn|report|retention` line, page by page in the
    order written, against a fresh database: each exits 0, and what the pages say they
    print is what they print."""
    lines = [(page, line) for page, line in fenced_lines()
             if key(line).startswith(WITH_DATABASE) and line not in REDIRECTED]
    policy = [line for _, line in lines if " agent set " in line or " agent show " in line]
    assert len(policy) == 5, policy
    with fresh_database(database_url) as db_url:
        for name in ("ide", "chat"):
            added = run_as_written(f"intentroute agent add {name}", tmp_path,
                                   DATABASE_URL=db_url)
            assert added.returncode == 0, added.stderr
        printed: dict[str, str] = {}
        for page, line in lines:
            done = run_as_written(line, tmp_path, DATABASE_URL=db_url)
            assert done.returncode == 0, (page, line, done.stderr)
            printed[line] = done.stdout
            if "--json" in line.split():
                json.loads(done.stdout)  # one JSON document, as the pages say
        show = next(line for line in policy if " agent show " in line)
        comment = re.search(r"intentroute agent show chat\s+# (\{.*\})",
                            PAGES["docs/guides/agents.md"])
        assert comment, "the show example says what it prints"
        assert json.loads(printed[show]) == json.loads(comment.group(1))
        # The credential the agent guide's `agent add` prints, in the NATS guide's form.
        added = next(out for line, out in printed.items() if " agent add " in line)
        creds = tmp_path / "cwd" / ".intentroute" / "creds"
        creds.mkdir(parents=True)
        (creds / "demo.json").write_text(added, encoding="utf-8")
        for line in REDIRECTED:
            done = run_as_written(line.split(" > ")[0], tmp_path, cwd=tmp_path / "cwd")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["user"] == json.loads(added)["agent_id"]
