"""`shared.store.migrate` says what it applied in one log line (Alembic's own lines, a
dozen plugin lines and a multi-line one per revision, are quieted in `up`'s log), and
nothing when the schema is current."""

from __future__ import annotations

import logging

import pytest
from alembic.script import ScriptDirectory

from shared.store import migrate
from tests.helpers.databases import alembic_config, fresh_database

pytestmark = pytest.mark.integration


def test_a_migration_is_one_line_and_a_current_schema_none(
    database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    script = ScriptDirectory.from_config(alembic_config(database_url))
    head = script.get_current_head()
    assert head is not None
    after_0010 = [rev.revision for rev in script.iterate_revisions(head, "0010")][::-1]
    with fresh_database(database_url, revision="0010") as url, \
            caplog.at_level(logging.INFO, logger="intentroute.store"):
        applied = migrate(url)
        assert applied == after_0010
        assert applied[-1] == head
        assert migrate(url) == []
    [line] = [r.getMessage() for r in caplog.records if r.name == "intentroute.store"]
    assert line == f"database migrated to revision {head} ({len(after_0010)} applied)"
