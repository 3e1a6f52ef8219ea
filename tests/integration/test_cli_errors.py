"""A person's mistake, or a server that is away, is one line on stderr with the way out
and a documented exit code (2 usage, 1 refused or failed), never a traceback unless
`intentroute --debug`; a command waiting on NATS or Postgres gives up within
`intentroute --timeout`. Each case runs the real CLI in a process of its own."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from intentroute.stack.nats_users import admin_kwargs
from shared.auth.natsconn import write_credential
from shared.contracts.request import STREAM, request_subject
from tests.helpers.agents import add_agents

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
# The bound the server cases are given (`intentroute --timeout`).
REACH = 1.0
# What a run may take beyond the bound: the CLI's own start (~2-3 s of imports on a
# loaded 2-core machine). Without the bound a refused NATS was retried for 2 minutes
# and `ask` never gave up.
START = 20.0


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    code: int
    line: str  # a regex the one stderr line matches (fullmatch), after the placeholders
    env: dict[str, str] = field(default_factory=dict)
    waits: bool = False  # waits on a server: bounded by REACH


@dataclass(frozen=True)
class Places:
    missing: str  # a path that does not exist
    not_a_cred: str  # JSON, but not a credential
    garbage: str  # not JSON
    refused: int  # a port nobody listens on
    silent: int  # a port that accepts connections and never says a word
    fleet_with_key: str = ""  # an LLM_FLEET file with a key written into it

    def fill(self, text: str) -> str:
        return text.format(missing=self.missing, not_a_cred=self.not_a_cred,
                           garbage=self.garbage, refused=self.refused, silent=self.silent,
                           fleet_with_key=self.fleet_with_key, prog=PROG)


MISSING = r"{missing}: no such file or directory: check the path"
PROG = r"(intentroute|\S*python\S* -m intentroute\.cli)"
NATS_AWAY = (r"NATS at nats://127\.0\.0\.1:{port} not reachable within 1 s( \(.+\))?: is "
             r"`intentroute up` running, or NATS_URL right\? \(`intentroute --timeout N` "
             r"waits longer\)")
REFUSED_NATS = {"NATS_URL": "nats://127.0.0.1:{refused}"}
SILENT_NATS = {"NATS_URL": "nats://u:secret@127.0.0.1:{silent}"}
REFUSED_DB = {"DATABASE_URL": "postgresql://u:secret@127.0.0.1:{refused}/db"}
SILENT_DB = {"DATABASE_URL": "postgresql://u:secret@127.0.0.1:{silent}/db"}
DB_REFUSED = (r"Postgres at postgresql://127\.0\.0\.1:{refused}/db: connection refused: is "
              r"`intentroute up` running, or DATABASE_URL right\?")

CASES = [
    # Usage (2): a file that is not there or not what it should be, a bad setting value.
    Case("ask-editor-missing", ("ask", "q", "--editor", "{missing}"), 2, MISSING,
         REFUSED_NATS),
    Case("parse-missing", ("parse", "{missing}"), 2, MISSING),
    # An empty question is a usage error, not a request answered MISSING_FIELD (issue 31).
    Case("ask-empty", ("ask", ""), 2,
         r'ask needs a question: QUERY is empty \(e\.g\. intentroute ask "How do I loop '
         r'from 1 to 10 in AVAP\?"\)', REFUSED_NATS),
    Case("ask-blank", ("ask", "  "), 2, r"ask needs a question: QUERY is empty .*",
         REFUSED_NATS),
    Case("ingest-missing", ("ingest", "{missing}"), 2, r"no such file or folder: {missing}"),
    Case("eval-routing-missing", ("eval", "routing", "{missing}"), 2,
         r"{missing}: No such file or directory"),
    Case("ask-creds-missing", ("ask", "q", "--creds", "{missing}"), 2, MISSING, REFUSED_NATS),
    Case("ask-creds-invalid", ("ask", "q", "--creds", "{not_a_cred}"), 2,
         r"{not_a_cred}: not an agent credential \(Object missing required field `agent_id`\):"
         r" `intentroute agent add NAME --out FILE` writes one", REFUSED_NATS),
    Case("ask-creds-not-json", ("ask", "q", "--creds", "{garbage}"), 2,
         r"{garbage}: not an agent credential \(.+\): `intentroute agent add NAME --out FILE` "
         r"writes one", REFUSED_NATS),
    Case("setting-not-a-number", ("status",), 2,
         r"STAGE_ACK_WAIT: expected seconds as a number, got '2s'", {"STAGE_ACK_WAIT": "2s"}),
    Case("setting-not-a-switch", ("agent", "list"), 2,
         r"ACCOUNTING: expected on/off, got 'maybe'", {"ACCOUNTING": "maybe"}),
    # A model server's URL is checked before anything starts (issue 31).
    Case("model-url-without-scheme", ("up",), 2,
         r"OPENAI_BASE_URL: 'localhost:8080' is not an http\(s\) URL with a host \(e\.g\. "
         r"http://127\.0\.0\.1:11434\)", {"OPENAI_BASE_URL": "localhost:8080"}),
    Case("model-url-without-v1", ("up",), 2,
         r"OPENAI_BASE_URL: 'http://127\.0\.0\.1:8080': an OpenAI-compatible base URL ends "
         r"in /v1 \(e\.g\. http://127\.0\.0\.1:8080/v1\)",
         {"OPENAI_BASE_URL": "http://127.0.0.1:8080"}),
    Case("model-fleet-key-in-the-file", ("up",), 2,
         r"backend 'cloud': the key is given by reference \(env:NAME or file:/path\), never "
         r"in the file", {"LLM_FLEET": "{fleet_with_key}"}),
    # A bad flag, argument or command: one line instead of Typer's usage box (7 lines).
    # (Run as `python -m intentroute.cli`, the program names itself so.)
    Case("unknown-flag", ("ask", "q", "--nope"), 2,
         r"No such option: --nope \({prog} ask --help shows the options\)"),
    Case("unknown-root-flag", ("--nope", "status"), 2,
         r"No such option: --nope \({prog} --help shows the options\)"),
    Case("unknown-command", ("nosuch",), 2,
         r"No such command 'nosuch' \({prog} --help shows the usage\)"),
    Case("missing-argument", ("ask",), 2,
         r"Missing argument 'query' \({prog} ask --help shows the usage\)"),
    Case("bad-flag-value", ("status", "--interval", "x"), 2,
         r"Invalid value for '--interval': .+ \({prog} status --help shows the usage\)"),
    # Refused or failed (1): servers away (refused at once, or silent until the bound).
    Case("status-nats-refused", ("status",), 1, NATS_AWAY.replace("{port}", "{refused}"),
         REFUSED_NATS, waits=True),
    Case("ask-nats-refused", ("ask", "q"), 1, NATS_AWAY.replace("{port}", "{refused}"),
         REFUSED_NATS, waits=True),
    Case("dlq-nats-refused", ("dlq", "list"), 1, NATS_AWAY.replace("{port}", "{refused}"),
         REFUSED_NATS, waits=True),
    Case("status-nats-silent", ("status",), 1, NATS_AWAY.replace("{port}", "{silent}"),
         SILENT_NATS, waits=True),
    Case("ask-nats-silent", ("ask", "q"), 1, NATS_AWAY.replace("{port}", "{silent}"),
         SILENT_NATS, waits=True),
    Case("agent-db-refused", ("agent", "list"), 1, DB_REFUSED, REFUSED_DB, waits=True),
    Case("report-db-refused", ("report", "costs"), 1, DB_REFUSED, REFUSED_DB, waits=True),
    Case("learn-db-silent", ("learn",), 1,
         r"Postgres at postgresql://127\.0\.0\.1:{silent}/db did not answer within 1 s: is it "
         r"running\? \(`intentroute --timeout N` waits longer\)", SILENT_DB, waits=True),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Places]:
    tmp = tmp_path_factory.mktemp("cli-errors")
    (tmp / "not-a-cred.json").write_text('{"nats": {}}')
    (tmp / "garbage.json").write_text("not json at all")
    (tmp / "fleet.toml").write_text(
        '[backends.cloud]\nkind = "openai"\nurl = "https://api.example.com/v1"\n'
        'key = "sk-live-secret"\n')
    with socket.socket() as free:  # bound, then closed: refused from then on
        free.bind(("127.0.0.1", 0))
        refused = free.getsockname()[1]
    with silent_server() as silent:
        yield Places(missing=str(tmp / "missing.avap"), not_a_cred=str(tmp / "not-a-cred.json"),
                     garbage=str(tmp / "garbage.json"), refused=refused, silent=silent,
                     fleet_with_key=str(tmp / "fleet.toml"))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An INTENTROUTE_HOME with no running stack in it."""
    return tmp_path_factory.mktemp("no-stack")


class silent_server:  # noqa: N801 - a context manager, used as a function
    """A loopback port that accepts connections and never answers (a hung server)."""

    def __enter__(self) -> int:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        return int(self.sock.getsockname()[1])

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.held.append(conn)

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def run_cli(home: Path, args: list[str], env: dict[str, str]) -> tuple[
        subprocess.CompletedProcess[str], float]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("NATS_", "DATABASE_", "INTENTROUTE_", "STAGE_"))}
    base.update(INTENTROUTE_HOME=str(home), PYTHONPATH=str(REPO), **env)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "intentroute.cli", *args], env=base,
                          capture_output=True, text=True, timeout=REACH + START + 60)
    return done, time.monotonic() - start


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_bad_usage_is_one_line_and_its_exit_code(
    case: Case, places: Places, home: Path
) -> None:
    args = ["--timeout", str(REACH), *(places.fill(arg) for arg in case.args)]
    env = {name: places.fill(value) for name, value in case.env.items()}
    done, took = run_cli(home, args, env)
    line = one_line(done.stderr)
    assert re.fullmatch(places.fill(case.line), line), line
    assert done.returncode == case.code, done.stderr
    assert "secret" not in done.stderr  # a URL's password is not shown
    if case.waits:
        assert took < REACH + START, f"{took:.1f} s"


def test_debug_shows_the_traceback_instead(home: Path) -> None:
    for args, env in ((["--debug", "status"], {"STAGE_ACK_WAIT": "2s"}),
                      (["status"], {"STAGE_ACK_WAIT": "2s", "INTENTROUTE_DEBUG": "1"})):
        done, _ = run_cli(home, args, env)
        assert done.returncode == 1  # an uncaught exception's
        assert "Traceback" in done.stderr or "─ Traceback" in done.stderr, done.stderr
        assert "SettingError: STAGE_ACK_WAIT: expected seconds as a number, got '2s'" in (
            " ".join(done.stderr.split())), done.stderr


def stack_env(nats_url: str, database_url: str) -> dict[str, str]:
    """The test stack as an external server reached with its admin's credential."""
    admin = admin_kwargs(Path(os.environ["INTENTROUTE_HOME"]))
    env = {"NATS_URL": nats_url, "DATABASE_URL": database_url,
           "NATS_USER": admin["user"], "NATS_PASSWORD": admin["password"]}
    if admin.get("inbox_prefix"):
        env["NATS_INBOX_PREFIX"] = admin["inbox_prefix"]
    return env


@pytest.mark.parametrize(("args", "line"), [
    (["dlq", "replay", "999"], r"no dead letter 999: `intentroute dlq list` shows the ids"),
    (["agent", "revoke", "nobody-h3"],
     r"no agent 'nobody-h3': `intentroute agent list` shows the agents"),
    (["agent", "show", "nobody-h3"],
     r"no agent 'nobody-h3': `intentroute agent list` shows the agents"),
], ids=["dlq-replay-unknown", "agent-revoke-unknown", "agent-show-unknown"])
def test_an_unknown_id_is_refused_in_one_line(
    stack: tuple[str, str], home: Path, args: list[str], line: str
) -> None:
    done, _ = run_cli(home, args, stack_env(*stack))
    assert re.fullmatch(line, one_line(done.stderr)), done.stderr
    assert done.returncode == 1, done.stderr
    assert not done.stdout


async def test_ask_waits_for_its_answer_only_as_long_as_asked(
    stack: tuple[str, str], home: Path, tmp_path: Path, admin_nc: Any
) -> None:
    """Connected with a real credential, no gateway running: the answer's wait ends at
    `ask --timeout` with one line, exit 1. (An agent of its own: the question stays in
    AGENT_REQUESTS, and a later gateway answers it under that agent only.)"""
    creds = tmp_path / "cli-asker.json"
    write_credential(creds, (await add_agents(*stack, {"cli-asker": False}))["cli-asker"])
    done, took = await asyncio.to_thread(
        run_cli, home, ["ask", "hello", "--creds", str(creds), "--timeout", "2"],
        {"NATS_URL": stack[0]})
    assert one_line(done.stderr) == (
        "no answer within 2 s: are the workers running? (`intentroute status` shows each "
        "stage; `ask --timeout N` waits longer)")
    # The unanswered question is not left for later tests' gateways to answer.
    await admin_nc.jetstream().purge_stream(STREAM, subject=request_subject("cli-asker"))
    assert done.returncode == 1
    assert took < 2 + START, f"{took:.1f} s"
