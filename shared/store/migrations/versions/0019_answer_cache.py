"""the per-agent answer cache (issue 33): its entries, the sources they were built on,
the requests they served, per-agent totals; who may write them, through what

Revision ID: 0019
Revises: 0018

`answer_cache` holds one agent's own finished answers (a RETRIEVAL answer the generator
finished, a CODE_GENERATION answer the validator passed as VALID), keyed for the
classifier's lookups by type, language, model slot and model; `sources` are the
documents its passages came from (`versions`: a hash of each one's passages it used),
`accepted_at` when the original request was admitted (what it retrieved was at least
that fresh). Every insert and delete is announced on `intentroute_answer_cache`
(`+<id>` / `-<id>`), which each classifier replica LISTENs to for its in-memory index.

No worker role writes the table itself:
- the generator and the validator store an answer through `answer_cache_put`
  (SECURITY DEFINER), which takes everything that bounds what it touches from the
  owner's rows, never from its caller: whether the agent has the cache on and its TTL
  (`agent_policies`), the per-agent cap and default TTL (`owner_settings`); it refuses
  an answer whose sources changed at or after the request was admitted
  (`answer_cache_sources`, under a shared advisory lock the ingest's invalidation
  takes exclusively, so an answer retrieved from the old index is either refused or
  seen and deleted by the invalidation), or whose request already has a negative
  verdict; then it evicts the agent's expired entries and its least recently used ones
  beyond the cap;
- the classifier reads the entries (SELECT) and counts a hit through `answer_cache_hit`
  (SECURITY DEFINER): the entry's hits and last use, the request it served (for the
  verdicts on it) and the asker's totals; only for an entry of the asking agent, or of
  an agent sharing its cache group (both with the cache on);
- a verdict on a request an entry answered or served (`feedback`, whoever records it:
  an agent's explicit feedback on any door, the pipeline's implicit outcomes) runs
  `answer_cache_feedback` (a SECURITY DEFINER trigger): a negative one (not `success`,
  or a completion_quality under 5 of 10) deletes the entry, a positive one counts for it;
  a failure there is a warning, never a verdict (or a turn's rows) refused; it and the
  two functions take a transaction lock on the request (agent and request id), so a
  verdict recorded while an entry is stored or a hit counted is never missed by both;
- the owner (the operator's `intentroute cache clear`, `ingest`'s invalidation, `up`)
  does the rest.

Names and SQL are written out here, not imported: a migration keeps doing what it did.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

CLASSIFIER = "intentroute_classifier"
GENERATOR = "intentroute_generator"
VALIDATOR = "intentroute_validator"
CHANNEL = "intentroute_answer_cache"
# pg_advisory_xact_lock key: shared by answer_cache_put, exclusive for an invalidation.
LOCK = 3300033
DEFAULT_CAP = 1000
DEFAULT_TTL_S = 86400.0
# A verdict below this completion_quality (0..10) is negative.
NEGATIVE_QUALITY = 5
# How long a request to whom an entry served an answer is remembered (its verdict may
# come later and evict the entry).
SERVED_KEEP_DAYS = 7

_NOTIFY = f"""
CREATE FUNCTION answer_cache_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('{CHANNEL}', '-' || OLD.id::text);
    ELSE
        PERFORM pg_notify('{CHANNEL}', '+' || NEW.id::text);
    END IF;
    RETURN NULL;
END
$fn$
"""

_SHARES = """
CREATE FUNCTION answer_cache_shares(asker text, owner text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT asker = owner OR EXISTS (
        SELECT 1 FROM public.agent_policies AS a, public.agent_policies AS o
        WHERE a.agent_id = asker AND o.agent_id = owner
          AND COALESCE((a.settings->>'cache')::boolean, false)
          AND COALESCE((o.settings->>'cache')::boolean, false)
          AND COALESCE(a.settings->>'cache_group', '') <> ''
          AND a.settings->>'cache_group' = o.settings->>'cache_group')
$fn$
"""

_PUT = f"""
CREATE FUNCTION answer_cache_put(
    agent text, request text, question text, qtype text, qlang text, slot text,
    answerer text, answer_text text, code text, status text, used text[],
    used_versions text[], spent integer, estimated boolean, accepted double precision)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    policy jsonb := (SELECT p.settings FROM public.agent_policies AS p
                     WHERE p.agent_id = agent);
    cap integer := COALESCE(
        (SELECT o.answer_cache_per_agent FROM public.owner_settings AS o), {DEFAULT_CAP});
    ttl double precision := COALESCE(
        (policy->>'cache_ttl')::double precision,
        (SELECT o.answer_cache_ttl_s FROM public.owner_settings AS o), {DEFAULT_TTL_S});
    admitted timestamptz := to_timestamp(accepted);
    new_id bigint;
    expired integer;
    over integer;
BEGIN
    IF NOT COALESCE((policy->>'cache')::boolean, false) OR cap <= 0 OR ttl <= 0 THEN
        RETURN NULL;
    END IF;
    IF qtype NOT IN ('RETRIEVAL', 'CODE_GENERATION')
       OR (qtype = 'CODE_GENERATION' AND status <> '')
       OR cardinality(used) = 0 OR cardinality(used) <> cardinality(used_versions)
       OR length(answer_text) > 65536 OR length(question) > 8000 OR accepted IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({LOCK});
    IF EXISTS (SELECT 1 FROM public.answer_cache_sources AS s
               WHERE (s.source = ANY(used) OR s.source = '*')
                 AND s.changed_at >= admitted) THEN
        RETURN NULL;  -- a source changed since the request was admitted
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(agent || '/' || request, 0));
    IF EXISTS (SELECT 1 FROM public.feedback AS f
               WHERE f.agent_id = agent AND f.request_id = request
                 AND (f.outcome <> 'success'
                      OR COALESCE(f.completion_quality, 10) < {NEGATIVE_QUALITY})) THEN
        RETURN NULL;
    END IF;
    INSERT INTO public.answer_cache
        (agent_id, request_id, query, query_type, lang, model_slot, model, answer,
         avap_code, validation_status, sources, versions, tokens, tokens_estimated,
         accepted_at, expires_at)
    VALUES (agent, request, question, qtype, qlang, slot, answerer, answer_text, code,
            status, used, used_versions, GREATEST(spent, 0), estimated, admitted,
            now() + make_interval(secs => ttl))
    ON CONFLICT (agent_id, request_id) DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL THEN
        RETURN NULL;
    END IF;
    DELETE FROM public.answer_cache AS c WHERE c.agent_id = agent AND c.expires_at < now();
    GET DIAGNOSTICS expired = ROW_COUNT;
    DELETE FROM public.answer_cache AS c WHERE c.id IN (
        SELECT x.id FROM public.answer_cache AS x WHERE x.agent_id = agent
        ORDER BY COALESCE(x.last_hit_at, x.created_at) DESC, x.id DESC OFFSET cap);
    GET DIAGNOSTICS over = ROW_COUNT;
    DELETE FROM public.answer_cache_served AS v
    WHERE v.agent_id = agent AND v.served_at < now() - interval '{SERVED_KEEP_DAYS} days';
    INSERT INTO public.answer_cache_totals AS t (agent_id, stored, evicted_ttl, evicted_cap)
    VALUES (agent, 1, expired, over)
    ON CONFLICT (agent_id) DO UPDATE SET stored = t.stored + 1,
        evicted_ttl = t.evicted_ttl + expired, evicted_cap = t.evicted_cap + over;
    RETURN new_id;
END
$fn$
"""

_HIT = f"""
CREATE FUNCTION answer_cache_hit(agent text, request text, entry bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    owner text;
    saved integer;
BEGIN
    -- With the verdict trigger's lock on the same request: a verdict recorded while this
    -- runs sees the request it served, or this sees the verdict.
    PERFORM pg_advisory_xact_lock(hashtextextended(agent || '/' || request, 0));
    SELECT c.agent_id, c.tokens INTO owner, saved FROM public.answer_cache AS c
    WHERE c.id = entry;
    IF owner IS NULL OR NOT public.answer_cache_shares(agent, owner) THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM public.feedback AS f
               WHERE f.agent_id = agent AND f.request_id = request
                 AND (f.outcome <> 'success'
                      OR COALESCE(f.completion_quality, 10) < {NEGATIVE_QUALITY})) THEN
        -- The verdict came before this count: it evicts the entry now.
        DELETE FROM public.answer_cache AS c WHERE c.id = entry;
        INSERT INTO public.answer_cache_totals AS t (agent_id, evicted_feedback)
        VALUES (owner, 1)
        ON CONFLICT (agent_id) DO UPDATE SET evicted_feedback = t.evicted_feedback + 1;
        RETURN false;
    END IF;
    UPDATE public.answer_cache AS c SET hits = c.hits + 1, last_hit_at = now()
    WHERE c.id = entry;
    INSERT INTO public.answer_cache_served (agent_id, request_id, entry_id)
    VALUES (agent, request, entry) ON CONFLICT DO NOTHING;
    INSERT INTO public.answer_cache_totals AS t (agent_id, hits, tokens_saved)
    VALUES (agent, 1, saved)
    ON CONFLICT (agent_id) DO UPDATE SET hits = t.hits + 1,
        tokens_saved = t.tokens_saved + saved;
    RETURN true;
END
$fn$
"""

_FEEDBACK = f"""
CREATE FUNCTION answer_cache_feedback() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    negative boolean := NEW.outcome <> 'success'
        OR COALESCE(NEW.completion_quality, 10) < {NEGATIVE_QUALITY};
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.outcome IS NOT DISTINCT FROM NEW.outcome
       AND OLD.completion_quality IS NOT DISTINCT FROM NEW.completion_quality THEN
        RETURN NULL;  -- a repeat counts once
    END IF;
    -- Serialised with answer_cache_put / answer_cache_hit of the same request: whichever
    -- comes second sees what the other wrote.
    PERFORM pg_advisory_xact_lock(
        hashtextextended(NEW.agent_id || '/' || NEW.request_id, 0));
    IF negative THEN
        WITH hit AS (
            SELECT c.id, c.agent_id FROM public.answer_cache AS c
            WHERE c.agent_id = NEW.agent_id AND c.request_id = NEW.request_id
            UNION
            SELECT c.id, c.agent_id FROM public.answer_cache_served AS v
            JOIN public.answer_cache AS c ON c.id = v.entry_id
            WHERE v.agent_id = NEW.agent_id AND v.request_id = NEW.request_id
        ), removed AS (
            DELETE FROM public.answer_cache AS c USING hit WHERE c.id = hit.id
            RETURNING c.agent_id
        )
        INSERT INTO public.answer_cache_totals AS t (agent_id, evicted_feedback)
        SELECT r.agent_id, count(*) FROM removed AS r GROUP BY r.agent_id
        ON CONFLICT (agent_id) DO UPDATE
            SET evicted_feedback = t.evicted_feedback + EXCLUDED.evicted_feedback;
    ELSE
        UPDATE public.answer_cache AS c SET feedback_pos = c.feedback_pos + 1
        WHERE (c.agent_id = NEW.agent_id AND c.request_id = NEW.request_id)
           OR c.id IN (SELECT v.entry_id FROM public.answer_cache_served AS v
                       WHERE v.agent_id = NEW.agent_id AND v.request_id = NEW.request_id);
    END IF;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    -- The verdict is stored whatever happens to the cache (the turn's rows with it).
    RAISE WARNING 'answer_cache_feedback: % (%)', SQLERRM, SQLSTATE;
    RETURN NULL;
END
$fn$
"""

_FUNCTIONS = {
    "answer_cache_put(text, text, text, text, text, text, text, text, text, text, text[], "
    "text[], integer, boolean, double precision)": (GENERATOR, VALIDATOR),
    "answer_cache_hit(text, text, bigint)": (CLASSIFIER,),
    "answer_cache_shares(text, text)": (),
    "answer_cache_feedback()": (),
    "answer_cache_notify()": (),
}


def upgrade() -> None:
    op.create_table(
        "answer_cache",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("agent_id", sa.String(128), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("query", sa.Text, nullable=False),
        sa.Column("query_type", sa.String(32), nullable=False),
        sa.Column("lang", sa.String(8), nullable=False),
        sa.Column("model_slot", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("answer", sa.Text, nullable=False),
        sa.Column("avap_code", sa.Text, nullable=False, server_default=""),
        sa.Column("validation_status", sa.String(32), nullable=False, server_default=""),
        sa.Column("sources", ARRAY(sa.Text), nullable=False),
        sa.Column("versions", ARRAY(sa.Text), nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tokens_estimated", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hits", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_hit_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("feedback_pos", sa.Integer, nullable=False, server_default="0"),
        sa.UniqueConstraint("agent_id", "request_id", name="answer_cache_request"),
    )
    op.execute("CREATE INDEX answer_cache_lru ON answer_cache "
               "(agent_id, (COALESCE(last_hit_at, created_at)))")
    op.execute("CREATE INDEX answer_cache_by_source ON answer_cache USING gin (sources)")
    op.create_table(
        "answer_cache_sources",
        sa.Column("source", sa.Text, primary_key=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "answer_cache_served",
        sa.Column("agent_id", sa.String(128), primary_key=True),
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("entry_id", sa.BigInteger,
                  sa.ForeignKey("answer_cache.id", ondelete="CASCADE"), nullable=False),
        sa.Column("served_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
    )
    op.create_index("answer_cache_served_entry", "answer_cache_served", ["entry_id"])
    counters = ("stored", "hits", "tokens_saved", "evicted_cap", "evicted_ttl",
                "evicted_feedback", "invalidated", "cleared")
    op.create_table(
        "answer_cache_totals",
        sa.Column("agent_id", sa.String(128), primary_key=True),
        *(sa.Column(name, sa.BigInteger, nullable=False, server_default="0")
          for name in counters),
    )
    op.add_column("owner_settings", sa.Column(
        "answer_cache_per_agent", sa.Integer, nullable=False, server_default=str(DEFAULT_CAP)))
    op.add_column("owner_settings", sa.Column(
        "answer_cache_ttl_s", sa.Float, nullable=False, server_default=str(DEFAULT_TTL_S)))
    for table in ("answer_cache", "answer_cache_sources", "answer_cache_served",
                  "answer_cache_totals"):
        op.execute(f"REVOKE ALL ON {table} FROM PUBLIC")
    for sql in (_NOTIFY, _SHARES, _PUT, _HIT, _FEEDBACK):
        op.execute(sql)
    op.execute("CREATE TRIGGER answer_cache_changed AFTER INSERT OR DELETE ON answer_cache "
               "FOR EACH ROW EXECUTE FUNCTION answer_cache_notify()")
    op.execute("CREATE TRIGGER answer_cache_verdict AFTER INSERT OR UPDATE ON feedback "
               "FOR EACH ROW EXECUTE FUNCTION answer_cache_feedback()")
    for function, roles in _FUNCTIONS.items():
        # Functions are executable by PUBLIC unless revoked.
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
        for role in roles:
            op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {role}")
    op.execute(f"GRANT SELECT ON answer_cache TO {CLASSIFIER}")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS answer_cache_verdict ON feedback")
    op.execute("DROP TRIGGER IF EXISTS answer_cache_changed ON answer_cache")
    for function in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {function}")
    op.drop_column("owner_settings", "answer_cache_ttl_s")
    op.drop_column("owner_settings", "answer_cache_per_agent")
    for table in ("answer_cache_totals", "answer_cache_served", "answer_cache_sources",
                  "answer_cache"):
        op.drop_table(table)
