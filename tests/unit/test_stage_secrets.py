"""What `intentroute up` hands each process: its own database role's URL (the learner's
role to the learner), and the dashboard's token to the doors alone."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from intentroute.stack.pgroles import (
    StageSecrets,
    database_urls,
    read_passwords,
    role_passwords,
    role_url,
    stack_worker_url,
    with_password,
)
from shared.store.roles import LEARNER_ROLE, OWNER_ROLE, ROLES, WORKER_ROLES

SUPERUSER = "postgresql://postgres:su-secret@127.0.0.1:5433/intentroute"
PASSWORDS = {role: f"pw-{role}" for role in ROLES}


def _secrets(token: str = "board-token") -> StageSecrets:
    return StageSecrets(database_urls(SUPERUSER, PASSWORDS), token)


@pytest.mark.parametrize("worker", list(WORKER_ROLES))
def test_each_worker_gets_its_own_role_and_no_one_elses_secret(worker: str) -> None:
    env = _secrets().env_for(worker, {"LEARN_INTERVAL": "60"})
    url = urlsplit(env["DATABASE_URL"])
    assert url.username == WORKER_ROLES[worker]
    assert url.password == PASSWORDS[WORKER_ROLES[worker]]
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", 5433, "/intentroute")
    values = "\0".join(env.values())
    assert "su-secret" not in values
    assert ("board-token" in values) == (worker == "doors")
    assert f"pw-{LEARNER_ROLE}" not in values
    assert f"pw-{OWNER_ROLE}" not in values


def test_the_learner_connects_as_the_learners_role() -> None:
    env = _secrets().env_for("learner", {"LEARN_INTERVAL": "60"})
    assert set(env) == {"DATABASE_URL"}
    assert urlsplit(env["DATABASE_URL"]).username == LEARNER_ROLE


@pytest.mark.parametrize(("interval", "on"), [("", False), ("0", False), ("60", True),
                                              ("soon", True)])
def test_up_runs_a_learner_only_when_the_job_is_on(interval: str, on: bool) -> None:
    from intentroute.cli.stack_cmds import parse_replicas
    from intentroute.stack.pgroles import learns

    assert learns(interval) == on
    counts = parse_replicas([], learning=learns(interval))
    assert ("learner" in counts) == on
    assert counts["doors"] == 1
    assert parse_replicas(["doors=2,learner=1"])["learner"] == 1


def test_without_roles_every_worker_gets_the_one_url() -> None:
    from intentroute.stack.pgroles import DatabaseUrls

    secrets = StageSecrets(DatabaseUrls("postgresql://u:p@db/x", {}), "")
    assert secrets.env_for("classifier", {}) == {"DATABASE_URL": "postgresql://u:p@db/x"}
    assert "GATEWAY_DASHBOARD_TOKEN" not in secrets.env_for("doors", {})


def test_role_passwords_are_generated_once_and_private(tmp_path: Path) -> None:
    first = role_passwords(tmp_path)
    assert set(first) == set(ROLES)
    assert len(set(first.values())) == len(ROLES)
    assert role_passwords(tmp_path) == first
    folder = tmp_path / "roles"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in folder.iterdir())
    # `intentroute worker NAME` on the running stack connects as its role too.
    owner = role_url(SUPERUSER, OWNER_ROLE, first[OWNER_ROLE])
    assert urlsplit(stack_worker_url(tmp_path, "retriever", owner)).username == (
        "intentroute_retriever")
    assert stack_worker_url(tmp_path, "parser", owner) == owner


def test_passwords_with_url_characters_survive_the_url() -> None:
    url = with_password("postgresql://intentroute_gateway@db:5432/intentroute", "a/b@c:d%")
    assert urlsplit(url).username == "intentroute_gateway"
    from urllib.parse import unquote

    assert unquote(urlsplit(url).password or "") == "a/b@c:d%"


def test_read_passwords_refuses_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / OWNER_ROLE).write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_passwords(tmp_path)
    (tmp_path / OWNER_ROLE).write_text("pw\n")
    assert read_passwords(tmp_path) == {OWNER_ROLE: "pw"}
