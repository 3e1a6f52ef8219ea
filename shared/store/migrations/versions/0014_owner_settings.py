"""the owner's SECURITY DEFINER functions take their limits from `owner_settings`, a
one-row table only the owner writes, never from anything a caller can set

Revision ID: 0014
Revises: 0013

A SECURITY DEFINER function runs with its owner's privileges for whoever may call it,
so whatever bounds what it touches must be out of the caller's reach: not a setting
(any role may SET any `intentroute.*` GUC, even for one transaction), not an argument,
not a table a caller may write. Audited:

- `sessions_expire_oldest` (0011, the `sessions_cap` trigger: deletes sessions and
  messages, which no worker role may) read its cap from the connection's
  `intentroute.max_sessions_per_agent`: any stage could expire every other session of
  any agent with `SET LOCAL intentroute.max_sessions_per_agent = '1'` and one INSERT
  in that agent's name. It now reads `owner_settings.max_sessions_per_agent`, written
  by `intentroute migrate` / `up` from MAX_SESSIONS_PER_AGENT (shared.store.migrate);
  the setting is no longer read.
- `request_log_drop_partition(day)` (0009, executable by the learner alone) dropped
  any day's partition the caller named: the learner, granted DELETE on the DEFAULT
  partition only, could drop the whole log. It now drops only a partition of the
  request log older than the owner's hot window (`owner_settings.request_log_hot_days`,
  from REQUEST_LOG_HOT_DAYS, by the server's UTC clock: a day D once D < today - hot
  days, as `shared.accounting.retention` computes it), unless the session's own user
  is the function's owner (or a member of it): the operator's `intentroute retention
  --hot-days N` runs as the owner, who may drop any table anyway.
- `request_log_create_partition(day)` (0009, the learner alone): the day names the
  partition made and only that day's rows move into it from the DEFAULT partition;
  nothing is deleted or read out. Unchanged.
Each keeps `SET search_path = pg_catalog, pg_temp` and names its tables with their
schema. `intentroute_admit` / `intentroute_lease` (0010, 0012) are SECURITY INVOKER:
they run with the gateway's own grants.

The table has no grant: only its owner reads or writes it (the functions run as that
owner). Names and SQL are written out here, not imported: a migration keeps doing what
it did.
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

DEFAULT_CAP = 10_000
DEFAULT_HOT_DAYS = 30

_EXPIRE = f"""
CREATE OR REPLACE FUNCTION sessions_expire_oldest() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    cap integer := COALESCE(
        (SELECT o.max_sessions_per_agent FROM public.owner_settings AS o), {DEFAULT_CAP});
BEGIN
    IF cap <= 0 THEN
        RETURN NULL;
    END IF;
    WITH expired AS (
        SELECT stale.agent_id, stale.session_id
        FROM (SELECT DISTINCT agent_id FROM created) AS a
        CROSS JOIN LATERAL (
            SELECT s.agent_id, s.session_id FROM public.sessions AS s
            WHERE s.agent_id = a.agent_id
            ORDER BY s.updated_at DESC, s.created_at DESC, s.session_id DESC
            OFFSET cap
        ) AS stale
    ), gone AS (
        DELETE FROM public.messages AS m USING expired AS e
        WHERE m.agent_id = e.agent_id AND m.session_id = e.session_id
    )
    DELETE FROM public.sessions AS s USING expired AS e
    WHERE s.agent_id = e.agent_id AND s.session_id = e.session_id;
    RETURN NULL;
END
$fn$
"""

_DROP_PARTITION = f"""
CREATE OR REPLACE FUNCTION request_log_drop_partition(day date) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    name text := 'request_log_p' || to_char(day, 'YYYYMMDD');
    hot integer := COALESCE(
        (SELECT o.request_log_hot_days FROM public.owner_settings AS o), {DEFAULT_HOT_DAYS});
    cutoff date := (now() AT TIME ZONE 'UTC')::date - hot;
BEGIN
    IF day >= cutoff AND NOT pg_has_role(session_user, current_user, 'MEMBER') THEN
        RAISE EXCEPTION 'request_log_drop_partition: % is inside the % days of request log '
                        'the owner keeps (owner_settings.request_log_hot_days)', day, hot
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.request_log'::regclass
          AND c.relnamespace = 'public'::regnamespace AND c.relname = name) THEN
        RAISE EXCEPTION 'request_log_drop_partition: % is no partition of request_log', name
            USING ERRCODE = 'undefined_table';
    END IF;
    EXECUTE format('DROP TABLE public.%I', name);
END
$fn$
"""

# What 0011 and 0009 made, for the downgrade.
_EXPIRE_0011 = f"""
CREATE OR REPLACE FUNCTION sessions_expire_oldest() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    cap integer := COALESCE(
        NULLIF(current_setting('intentroute.max_sessions_per_agent', true), '')::integer,
        {DEFAULT_CAP});
BEGIN
    IF cap <= 0 THEN
        RETURN NULL;
    END IF;
    WITH expired AS (
        SELECT stale.agent_id, stale.session_id
        FROM (SELECT DISTINCT agent_id FROM created) AS a
        CROSS JOIN LATERAL (
            SELECT s.agent_id, s.session_id FROM public.sessions AS s
            WHERE s.agent_id = a.agent_id
            ORDER BY s.updated_at DESC, s.created_at DESC, s.session_id DESC
            OFFSET cap
        ) AS stale
    ), gone AS (
        DELETE FROM public.messages AS m USING expired AS e
        WHERE m.agent_id = e.agent_id AND m.session_id = e.session_id
    )
    DELETE FROM public.sessions AS s USING expired AS e
    WHERE s.agent_id = e.agent_id AND s.session_id = e.session_id;
    RETURN NULL;
END
$fn$
"""
_DROP_PARTITION_0009 = """
CREATE OR REPLACE FUNCTION request_log_drop_partition(day date) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    EXECUTE format('DROP TABLE public.%I', 'request_log_p' || to_char(day, 'YYYYMMDD'));
END
$fn$
"""


def upgrade() -> None:
    op.create_table(
        "owner_settings",
        sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.true()),
        sa.Column("max_sessions_per_agent", sa.Integer, nullable=False,
                  server_default=str(DEFAULT_CAP)),
        sa.Column("request_log_hot_days", sa.Integer, nullable=False,
                  server_default=str(DEFAULT_HOT_DAYS)),
        sa.CheckConstraint("id", name="owner_settings_one_row"),
        sa.CheckConstraint("max_sessions_per_agent >= 0", name="owner_settings_cap"),
        sa.CheckConstraint("request_log_hot_days >= 1", name="owner_settings_hot_days"),
    )
    op.execute("INSERT INTO owner_settings DEFAULT VALUES")
    op.execute("REVOKE ALL ON owner_settings FROM PUBLIC")
    # CREATE OR REPLACE keeps each function's owner and grants (EXECUTE: the learner's).
    op.execute(_EXPIRE)
    op.execute(_DROP_PARTITION)


def downgrade() -> None:
    op.execute(_DROP_PARTITION_0009)
    op.execute(_EXPIRE_0011)
    op.drop_table("owner_settings")
