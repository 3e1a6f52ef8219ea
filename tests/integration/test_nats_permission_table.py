"""What every NATS user may publish and subscribe to is what
docs/reference/permissions-nats.md lists (`intentroute docs permissions-nats` writes it
again): each user is probed on a live nats-server configured as `intentroute up`
configures it (intentroute.docs.nats_permissions), and a grant the table does not list,
added to any user, changes the rendering."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.docs import nats_permissions
from intentroute.stack import natsconf
from shared.auth import permissions
from shared.auth.permissions import STACK_USERS, WORKER_GRANTS, Permissions

pytestmark = pytest.mark.integration

COMMITTED = Path(__file__).resolve().parents[2] / nats_permissions.DEFAULT_OUT
REGENERATE = (f"{nats_permissions.DEFAULT_OUT} is not what the server allows: run "
              "`intentroute docs permissions-nats` (and review what changed)")


def _row(text: str, subject: str) -> list[str]:
    """The cells of `subject`'s row (its first) in a rendering."""
    for line in text.splitlines():
        if line.startswith(f"| `{subject}` |"):
            return [cell.strip() for cell in line.strip("|").split("|")][1:]
    raise AssertionError(f"no row {subject!r}")


def _column(role: str) -> int:
    return [r.column for r in nats_permissions.roles()].index(role)


@pytest.fixture(scope="module")
async def rendered(tmp_path_factory: pytest.TempPathFactory) -> str:
    return await nats_permissions.generate_async(tmp_path_factory.mktemp("nats-permissions"))


async def test_the_committed_table_is_what_the_server_allows(rendered: str) -> None:
    assert COMMITTED.read_text(encoding="utf-8") == rendered, REGENERATE


def test_every_grant_has_a_row_of_the_canonical_list() -> None:
    """Each subject a user is granted is probed by a row of `probes()` (a grant none
    covers gets a row under 'Other granted subjects': add it to the list)."""
    hashes = {user: "x" for user in STACK_USERS}
    agents = [(agent, "x") for agent in nats_permissions.AGENTS]
    users, _ = nats_permissions.read_config(
        natsconf.auth_config(natsconf.stack_users(hashes, agents)))
    rows = nats_permissions.probes()
    assert nats_permissions.with_granted(rows, users) == rows
    subjects = [nats_permissions.concrete(r.subject).lower() for r in rows]
    assert len(set(subjects)) == len(subjects)


def _widen_worker(worker: str, *, publish: tuple[str, ...] = (), max_responses: int = 0,
                  responses_seconds: float = 0.0) -> Callable[[pytest.MonkeyPatch], None]:
    def widen(monkeypatch: pytest.MonkeyPatch) -> None:
        grant = WORKER_GRANTS[worker]
        monkeypatch.setitem(WORKER_GRANTS, worker, grant._replace(
            publish=(*grant.publish, *publish),
            max_responses=max_responses or grant.max_responses,
            responses_seconds=responses_seconds or grant.responses_seconds))
    return widen


def _widen_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    def wider(agent_id: str) -> Permissions:
        granted = permissions.agent_permissions(agent_id)
        return granted._replace(subscribe=(*granted.subscribe, "agent.response.*.>"))
    monkeypatch.setattr(natsconf, "agent_permissions", wider)


# (what is granted more, the row it shows in, the column, the cell it makes)
WIDER = [
    pytest.param(_widen_worker("retriever", publish=("intentroute.stage.validate",)),
                 "intentroute.stage.validate", "retriever", "pub", id="a stage skipped"),
    pytest.param(_widen_worker("generator-conversational", publish=("intentroute.secret.>",)),
                 "intentroute.secret.>", "generator-conversational", "pub",
                 id="a subject no row names"),
    pytest.param(_widen_worker("classifier", max_responses=5, responses_seconds=30.0),
                 "classifier", "allow_responses", "5 replies within 30s",
                 id="more replies"),
    pytest.param(_widen_agent, "agent.response.<other>.req-1", "agent", "sub",
                 id="another agent's answers"),
]


@pytest.mark.parametrize(("widen", "subject", "column", "cell"), WIDER)
async def test_a_grant_the_table_does_not_list_fails_the_comparison(
        rendered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        widen: Callable[[pytest.MonkeyPatch], None], subject: str, column: str,
        cell: str) -> None:
    widen(monkeypatch)
    wider = await nats_permissions.generate_async(tmp_path)
    assert wider != rendered
    if column == "allow_responses":  # the users' table: column, user, account, grants, ...
        assert _row(wider, subject)[3] == cell
    else:
        assert _row(wider, subject)[_column(column)] == cell


def test_the_docs_command_writes_and_checks_the_table(
        rendered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`intentroute docs permissions-nats [--check]` (on this test's rendering: the
    command starts a throwaway server of its own)."""
    monkeypatch.setattr(nats_permissions, "generate", lambda: rendered)
    out = tmp_path / "reference" / "permissions-nats.md"
    runner = CliRunner()
    check = ["docs", "permissions-nats", "--out", str(out), "--check"]
    assert runner.invoke(app, check).exit_code == 1
    written = runner.invoke(app, ["docs", "permissions-nats", "--out", str(out)])
    assert written.exit_code == 0, written.output
    assert out.read_text(encoding="utf-8") == rendered
    assert runner.invoke(app, check).exit_code == 0
    out.write_text(rendered.replace("| pub |", "| pub+sub |", 1), encoding="utf-8")
    assert runner.invoke(app, check).exit_code == 1
    assert runner.invoke(app, ["docs", "permissions-nats", "--out", str(tmp_path)]
                         ).exit_code == 2
