"""the request log keeps the parts of an answer several models wrote (`model_parts`),
and every cost counts each part at its own model's price

Revision ID: 0017
Revises: 0016

A model server that breaks mid-answer has the answer continued by the chain's next
model from what the caller already has (shared.llm.walk): the delivered answer is then
two (or more) models' work. The request log's `model`, `tokens_in` and `tokens_out`
are the model that wrote the end of it and the sums; `model_parts` is every part as
`[[model, tokens_in, tokens_out], ...]` (NULL when one model wrote it all). The row's
cost is its parts' costs when it has parts (and a model's price is found under its
`backend/model` name or, set before fleets, its own: `intentroute_price`):
`intentroute_parts_cost(prices, parts)` is
the parts' cost less what pricing the sums at the row's model would give, so whatever
priced a row before prices it right by adding it. `intentroute_lease` (0012) is
written out again with that one addition (a migration keeps doing what it did); the
daily rollups and `budget_overshoot` add it in their own SQL.
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

GATEWAY = "intentroute_gateway"
SIGNATURE = ("intentroute_lease(text, text, bigint, float8, text[], float8[], float8[], "
             "text[], float8[], float8[], float8[], int, int, float8, int, float8, float8, "
             "int, float8, float8, float8, bool, jsonb, float8)")

# prices: {model: [input_per_1k, output_per_1k, per_compute_s]}; parts: [[model, in, out]].
# The parts' token cost, less the sums' cost at the row's own model (its last part's):
# added to a row's usual cost it makes each part count at its own price.
# A model's price in the agent's table: under its `backend/model` name, else under the
# model's own name (the prices set before models were named by their backend).
_PRICE = """
CREATE FUNCTION intentroute_price(p_prices jsonb, p_model text) RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce(p_prices -> p_model,
                    p_prices -> substr(p_model, strpos(p_model, '/') + 1))
$fn$
"""

_PARTS_COST = """
CREATE FUNCTION intentroute_parts_cost(p_prices jsonb, p_parts jsonb) RETURNS float8
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce(sum(
               (x.value ->> 1)::float8 / 1000.0
                   * coalesce((public.intentroute_price(p_prices, x.value ->> 0) ->> 0)::float8, 0)
             + (x.value ->> 2)::float8 / 1000.0
                   * coalesce((public.intentroute_price(p_prices, x.value ->> 0) ->> 1)::float8, 0)
             - (x.value ->> 1)::float8 / 1000.0
                   * coalesce((public.intentroute_price(p_prices, p_parts -> -1 ->> 0)
                                ->> 0)::float8, 0)
             - (x.value ->> 2)::float8 / 1000.0
                   * coalesce((public.intentroute_price(p_prices, p_parts -> -1 ->> 0)
                                ->> 1)::float8, 0)), 0)
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_parts) = 'array' THEN p_parts
                                   ELSE '[]'::jsonb END) AS x
$fn$
"""

_LEASE = """
CREATE OR REPLACE FUNCTION intentroute_lease(
    p_agent text, p_replica text, p_seq bigint, p_now float8,
    p_ask_ids text[], p_ask_created float8[], p_ask_deadlines float8[],
    p_held_ids text[], p_held_created float8[], p_held_deadlines float8[],
    p_held_estimates float8[],
    p_keep int, p_want int, p_ttl float8, p_share int,
    p_rate float8, p_burst float8, p_max_inflight int, p_tokens_per_min float8,
    p_budget_day float8, p_budget_month float8, p_degrade bool, p_prices jsonb,
    p_grace float8)
RETURNS TABLE (verdict text, retry_after_ms bigint, spent_day float8, spent_month float8,
               reserved float8, extra int, estimate float8)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    s agent_limit_state%ROWTYPE;
    mine agent_leases%ROWTYPE;
    found_mine bool;
    current_call bool;
    today date := (to_timestamp(p_now) AT TIME ZONE 'UTC')::date;
    this_month date := date_trunc('month', (to_timestamp(p_now) AT TIME ZONE 'UTC'))::date;
    this_minute bigint := floor(p_now / 60);
    into_minute float8 := p_now - floor(p_now / 60) * 60;
    done record;
    cost float8;
    price jsonb;
    own int;            -- this replica's allowance kept (requests it may still admit)
    leased int;         -- the other replicas' unexpired allowances
    returned int := 0;  -- what this replica gave back of its last allowance
    live int;           -- counted in flight: rows before their deadline, allowances
    pending int;        -- not settled yet: rows, allowances (the budget's probe)
    held float8;        -- cost units reserved: rows' estimates, allowances' estimates
    used float8;        -- model tokens in the sliding minute
    cap float8;
    bucket float8;
    e float8;
    room float8;
    v_extra int := 0;
    v_estimate float8;
    all_ok bool := true;
    out_verdict text;
    out_retry float8;
    verdicts text[] := '{}';
    retries bigint[] := '{}';
    reserveds float8[] := '{}';
BEGIN
    -- Limit state, not a record: committed without waiting for the WAL flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO s FROM agent_limit_state WHERE agent_id = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agent_limit_state (agent_id, bucket, bucket_at, tokens_minute, day, month)
        VALUES (p_agent, coalesce(p_burst, 0), p_now, this_minute, today, this_month)
        ON CONFLICT (agent_id) DO NOTHING;
        SELECT * INTO s FROM agent_limit_state WHERE agent_id = p_agent FOR UPDATE;
    END IF;
    -- Windows: a new UTC day / month starts its spend at 0; tokens slide by the minute.
    IF today > s.day THEN s.day := today; s.spent_day := 0; END IF;
    IF this_month > s.month THEN s.month := this_month; s.spent_month := 0; END IF;
    IF this_minute = s.tokens_minute + 1 THEN
        s.tokens_prev := s.tokens_cur; s.tokens_cur := 0; s.tokens_minute := this_minute;
    ELSIF this_minute > s.tokens_minute + 1 THEN
        s.tokens_prev := 0; s.tokens_cur := 0; s.tokens_minute := this_minute;
    END IF;
    -- Allowances: an expired one is spent (its requests admitted, none given back).
    DELETE FROM agent_leases WHERE agent_id = p_agent AND expires <= p_now;
    SELECT * INTO mine FROM agent_leases WHERE agent_id = p_agent AND replica = p_replica;
    found_mine := FOUND;
    current_call := NOT found_mine OR mine.seq < p_seq;
    IF current_call THEN
        own := greatest(p_keep, 0);
        IF found_mine THEN
            -- What it held, less what it admitted (recorded below) and what it keeps.
            returned := greatest(mine.held - coalesce(cardinality(p_held_ids), 0) - own, 0);
        END IF;
    ELSE  -- a late call: the newer one's allowance stands
        own := mine.held;
    END IF;
    SELECT coalesce(sum(held), 0) INTO leased FROM agent_leases
    WHERE agent_id = p_agent AND replica <> p_replica;
    -- Settle: a request whose request-log row is written is answered; its real cost
    -- counts on its admission day and month, its tokens in the current minute.
    -- Each row is looked up by the log's whole key (a LATERAL probe per row in flight;
    -- LIMIT 1 keeps the planner from flattening it into a join that filters the agent's
    -- whole log per row: measured 190 ms a call with 5,000 logged and 300 in flight).
    -- The admissions made on an allowance are settled at once when answered already
    -- (most are, at a call every half second), and become requests in flight if not:
    -- inserting and deleting them made ~40 us of a call's time per admission.
    FOR done IN
        WITH held AS (
            SELECT h.id AS request_id, to_timestamp(h.created) AS created_at, h.deadline,
                   h.estimate, l.model, l.tokens_in, l.tokens_out, l.compute_ms,
                   l.model_parts, coalesce(l.found, false) AS answered
            FROM unnest(p_held_ids, p_held_created, p_held_deadlines, p_held_estimates)
                 AS h(id, created, deadline, estimate)
            LEFT JOIN LATERAL (
                SELECT true AS found, model, tokens_in, tokens_out, compute_ms, model_parts
                FROM request_log r
                WHERE r.agent_id = p_agent AND r.request_id = h.id
                  AND r.created_at = to_timestamp(h.created) LIMIT 1) l ON true
        ), recorded AS (
            INSERT INTO agent_inflight (agent_id, request_id, created_at, deadline, estimate)
            SELECT p_agent, request_id, created_at, deadline, estimate FROM held
            WHERE NOT answered
            ON CONFLICT DO NOTHING
        ), answered AS (
            SELECT i.request_id, i.created_at, l.model, l.tokens_in, l.tokens_out,
                   l.compute_ms, l.model_parts
            FROM agent_inflight i CROSS JOIN LATERAL (
                SELECT model, tokens_in, tokens_out, compute_ms, model_parts
                FROM request_log r
                WHERE r.agent_id = i.agent_id AND r.request_id = i.request_id
                  AND r.created_at = i.created_at LIMIT 1) l
            WHERE i.agent_id = p_agent
        ), settled AS (
            DELETE FROM agent_inflight x USING answered a
            WHERE x.agent_id = p_agent AND x.request_id = a.request_id
              AND x.created_at = a.created_at
        )
        SELECT request_id, created_at, model, tokens_in, tokens_out, compute_ms,
               model_parts FROM answered
        UNION ALL
        SELECT request_id, created_at, model, tokens_in, tokens_out, compute_ms,
               model_parts FROM held
        WHERE answered
    LOOP
        price := intentroute_price(p_prices, done.model);
        cost := done.tokens_in / 1000.0 * coalesce((price ->> 0)::float8, 0)
              + done.tokens_out / 1000.0 * coalesce((price ->> 1)::float8, 0)
              + coalesce(done.compute_ms, 0) / 1000.0 * coalesce((price ->> 2)::float8, 0)
              + intentroute_parts_cost(p_prices, done.model_parts);
        IF (done.created_at AT TIME ZONE 'UTC')::date = s.day THEN
            s.spent_day := s.spent_day + cost;
        END IF;
        IF date_trunc('month', done.created_at AT TIME ZONE 'UTC')::date = s.month THEN
            s.spent_month := s.spent_month + cost;
        END IF;
        s.tokens_cur := s.tokens_cur + done.tokens_in + done.tokens_out;
        -- Decaying maxima: a costlier request raises one at once, cheaper ones lower
        -- it by a fifth of the gap each.
        s.cost_estimate := greatest(cost, 0.8 * coalesce(s.cost_estimate, cost) + 0.2 * cost);
        s.tokens_estimate := greatest(done.tokens_in + done.tokens_out,
            0.8 * coalesce(s.tokens_estimate, done.tokens_in + done.tokens_out)
            + 0.2 * (done.tokens_in + done.tokens_out));
    END LOOP;
    -- A request whose row never came (its deadline and the error rows' grace are past)
    -- is settled at its estimate.
    FOR done IN
        DELETE FROM agent_inflight
        WHERE agent_id = p_agent AND deadline + p_grace < p_now
        RETURNING created_at, estimate
    LOOP
        IF (done.created_at AT TIME ZONE 'UTC')::date = s.day THEN
            s.spent_day := s.spent_day + done.estimate;
        END IF;
        IF date_trunc('month', done.created_at AT TIME ZONE 'UTC')::date = s.month THEN
            s.spent_month := s.spent_month + done.estimate;
        END IF;
    END LOOP;
    e := s.cost_estimate;
    SELECT count(*) FILTER (WHERE deadline > p_now), coalesce(sum(estimate), 0), count(*)
      INTO live, held, pending
      FROM agent_inflight WHERE agent_id = p_agent;
    live := live + leased + own;
    pending := pending + leased + own;
    held := held + (leased + own) * coalesce(e, 0);
    used := s.tokens_prev * (1 - into_minute / 60) + s.tokens_cur;
    -- The bucket refills up to its size less the allowances out of it.
    cap := greatest(coalesce(p_burst, 1) - leased - own, 0);
    bucket := least(cap, s.bucket + returned
                         + greatest(p_now - s.bucket_at, 0) * coalesce(p_rate, 0));
    FOR i IN 1 .. coalesce(cardinality(p_ask_ids), 0) LOOP
        out_verdict := 'ok';
        out_retry := 0;
        IF p_rate IS NOT NULL AND bucket < 1 THEN
            out_verdict := 'RATE_LIMITED';
            out_retry := (1 - bucket) / p_rate * 1000;
        ELSIF p_max_inflight IS NOT NULL AND live >= p_max_inflight THEN
            out_verdict := 'CONCURRENCY_LIMITED';
        ELSIF p_tokens_per_min IS NOT NULL AND used >= p_tokens_per_min THEN
            out_verdict := 'QUOTA_EXCEEDED';
            -- When the sliding count falls below the limit: later this minute as the
            -- previous minute's weight fades, or next minute as this one's does.
            IF s.tokens_cur < p_tokens_per_min THEN
                out_retry := (60 * (1 - (p_tokens_per_min - s.tokens_cur) / s.tokens_prev)
                              - into_minute) * 1000;
            ELSE
                out_retry := (60 - into_minute
                              + 60 * (1 - p_tokens_per_min / s.tokens_cur)) * 1000;
            END IF;
        ELSIF (p_budget_day IS NOT NULL OR p_budget_month IS NOT NULL)
              AND e IS NULL AND pending > 0 THEN
            -- The agent's cost per request is not known yet: one request at a time until
            -- one is settled, so the budget's bound holds from the first request on.
            out_verdict := 'probe';
        ELSIF s.spent_month + held >= p_budget_month THEN
            out_verdict := CASE WHEN p_degrade THEN 'degrade' ELSE 'BUDGET_EXCEEDED' END;
            out_retry := (extract(epoch FROM (this_month + interval '1 month')::timestamp
                                  AT TIME ZONE 'UTC') - p_now) * 1000;
        ELSIF s.spent_day + held >= p_budget_day THEN
            out_verdict := CASE WHEN p_degrade THEN 'degrade' ELSE 'BUDGET_EXCEEDED' END;
            out_retry := (extract(epoch FROM (today + 1)::timestamp AT TIME ZONE 'UTC')
                          - p_now) * 1000;
        END IF;
        IF out_verdict IN ('ok', 'degrade') THEN
            IF p_rate IS NOT NULL THEN
                bucket := bucket - 1;
            END IF;
            v_estimate := CASE WHEN out_verdict = 'ok' THEN coalesce(e, 0) ELSE 0 END;
            INSERT INTO agent_inflight (agent_id, request_id, created_at, deadline, estimate)
            VALUES (p_agent, p_ask_ids[i], to_timestamp(p_ask_created[i]),
                    p_ask_deadlines[i], v_estimate)
            ON CONFLICT DO NOTHING;
            held := held + v_estimate;
            pending := pending + 1;
            IF p_ask_deadlines[i] > p_now THEN
                live := live + 1;
            END IF;
            IF out_verdict = 'ok' THEN
                s.reserved := held;
            END IF;
        END IF;
        all_ok := all_ok AND out_verdict = 'ok';
        verdicts := verdicts || out_verdict;
        retries := retries || ceil(greatest(out_retry, 0))::bigint;
        reserveds := reserveds || held;
    END LOOP;
    -- The new allowance: only while every request so far was admitted, at most what was
    -- asked for and 1/p_share of each limit's room (none while a cost is unknown).
    IF current_call AND all_ok AND p_want > 0 THEN
        room := p_want;
        IF p_rate IS NOT NULL THEN
            room := least(room, floor(bucket / p_share));
        END IF;
        IF p_max_inflight IS NOT NULL THEN
            room := least(room, floor((p_max_inflight - live)::float8 / p_share));
        END IF;
        IF p_tokens_per_min IS NOT NULL THEN
            room := CASE WHEN s.tokens_estimate IS NULL THEN 0
                         WHEN s.tokens_estimate = 0 THEN room
                         ELSE least(room, floor(((p_tokens_per_min - used) / s.tokens_estimate
                                                 - pending) / p_share)) END;
        END IF;
        IF p_budget_day IS NOT NULL OR p_budget_month IS NOT NULL THEN
            room := CASE WHEN e IS NULL THEN 0
                         WHEN e = 0 THEN room
                         ELSE least(room,
                                    floor((coalesce(p_budget_day, 'Infinity'::float8)
                                           - s.spent_day - held) / e / p_share),
                                    floor((coalesce(p_budget_month, 'Infinity'::float8)
                                           - s.spent_month - held) / e / p_share)) END;
        END IF;
        v_extra := greatest(room, 0)::int;
    END IF;
    IF current_call THEN
        IF p_rate IS NOT NULL THEN
            bucket := bucket - v_extra;
        END IF;
        IF own + v_extra > 0 THEN
            INSERT INTO agent_leases (agent_id, replica, seq, held, expires)
            VALUES (p_agent, p_replica, p_seq, own + v_extra, p_now + p_ttl)
            ON CONFLICT (agent_id, replica) DO UPDATE SET
                seq = EXCLUDED.seq, held = EXCLUDED.held, expires = EXCLUDED.expires;
        ELSIF found_mine THEN
            DELETE FROM agent_leases WHERE agent_id = p_agent AND replica = p_replica;
        END IF;
        IF v_extra > 0 THEN  -- the overshoot bound: every estimate in flight or leased
            s.reserved := held + v_extra * coalesce(e, 0);
        END IF;
    END IF;
    IF p_rate IS NOT NULL THEN
        s.bucket := bucket;
        s.bucket_at := greatest(p_now, s.bucket_at);
    END IF;
    UPDATE agent_limit_state SET
        bucket = s.bucket, bucket_at = s.bucket_at, tokens_minute = s.tokens_minute,
        tokens_cur = s.tokens_cur, tokens_prev = s.tokens_prev, day = s.day,
        spent_day = s.spent_day, month = s.month, spent_month = s.spent_month,
        cost_estimate = s.cost_estimate, tokens_estimate = s.tokens_estimate,
        reserved = s.reserved
    WHERE agent_id = p_agent;
    IF coalesce(cardinality(p_ask_ids), 0) = 0 THEN
        RETURN QUERY SELECT NULL::text, 0::bigint, s.spent_day, s.spent_month, held,
                            v_extra, coalesce(e, 0);
    ELSE
        RETURN QUERY SELECT v.verdict, v.retry, s.spent_day, s.spent_month, v.reserved,
                            v_extra, coalesce(e, 0)
                     FROM unnest(verdicts, retries, reserveds) AS v(verdict, retry, reserved);
    END IF;
END
$fn$
"""

_LEASE_0012 = """
CREATE OR REPLACE FUNCTION intentroute_lease(
    p_agent text, p_replica text, p_seq bigint, p_now float8,
    p_ask_ids text[], p_ask_created float8[], p_ask_deadlines float8[],
    p_held_ids text[], p_held_created float8[], p_held_deadlines float8[],
    p_held_estimates float8[],
    p_keep int, p_want int, p_ttl float8, p_share int,
    p_rate float8, p_burst float8, p_max_inflight int, p_tokens_per_min float8,
    p_budget_day float8, p_budget_month float8, p_degrade bool, p_prices jsonb,
    p_grace float8)
RETURNS TABLE (verdict text, retry_after_ms bigint, spent_day float8, spent_month float8,
               reserved float8, extra int, estimate float8)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    s agent_limit_state%ROWTYPE;
    mine agent_leases%ROWTYPE;
    found_mine bool;
    current_call bool;
    today date := (to_timestamp(p_now) AT TIME ZONE 'UTC')::date;
    this_month date := date_trunc('month', (to_timestamp(p_now) AT TIME ZONE 'UTC'))::date;
    this_minute bigint := floor(p_now / 60);
    into_minute float8 := p_now - floor(p_now / 60) * 60;
    done record;
    cost float8;
    own int;            -- this replica's allowance kept (requests it may still admit)
    leased int;         -- the other replicas' unexpired allowances
    returned int := 0;  -- what this replica gave back of its last allowance
    live int;           -- counted in flight: rows before their deadline, allowances
    pending int;        -- not settled yet: rows, allowances (the budget's probe)
    held float8;        -- cost units reserved: rows' estimates, allowances' estimates
    used float8;        -- model tokens in the sliding minute
    cap float8;
    bucket float8;
    e float8;
    room float8;
    v_extra int := 0;
    v_estimate float8;
    all_ok bool := true;
    out_verdict text;
    out_retry float8;
    verdicts text[] := '{}';
    retries bigint[] := '{}';
    reserveds float8[] := '{}';
BEGIN
    -- Limit state, not a record: committed without waiting for the WAL flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO s FROM agent_limit_state WHERE agent_id = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agent_limit_state (agent_id, bucket, bucket_at, tokens_minute, day, month)
        VALUES (p_agent, coalesce(p_burst, 0), p_now, this_minute, today, this_month)
        ON CONFLICT (agent_id) DO NOTHING;
        SELECT * INTO s FROM agent_limit_state WHERE agent_id = p_agent FOR UPDATE;
    END IF;
    -- Windows: a new UTC day / month starts its spend at 0; tokens slide by the minute.
    IF today > s.day THEN s.day := today; s.spent_day := 0; END IF;
    IF this_month > s.month THEN s.month := this_month; s.spent_month := 0; END IF;
    IF this_minute = s.tokens_minute + 1 THEN
        s.tokens_prev := s.tokens_cur; s.tokens_cur := 0; s.tokens_minute := this_minute;
    ELSIF this_minute > s.tokens_minute + 1 THEN
        s.tokens_prev := 0; s.tokens_cur := 0; s.tokens_minute := this_minute;
    END IF;
    -- Allowances: an expired one is spent (its requests admitted, none given back).
    DELETE FROM agent_leases WHERE agent_id = p_agent AND expires <= p_now;
    SELECT * INTO mine FROM agent_leases WHERE agent_id = p_agent AND replica = p_replica;
    found_mine := FOUND;
    current_call := NOT found_mine OR mine.seq < p_seq;
    IF current_call THEN
        own := greatest(p_keep, 0);
        IF found_mine THEN
            -- What it held, less what it admitted (recorded below) and what it keeps.
            returned := greatest(mine.held - coalesce(cardinality(p_held_ids), 0) - own, 0);
        END IF;
    ELSE  -- a late call: the newer one's allowance stands
        own := mine.held;
    END IF;
    SELECT coalesce(sum(held), 0) INTO leased FROM agent_leases
    WHERE agent_id = p_agent AND replica <> p_replica;
    -- Settle: a request whose request-log row is written is answered; its real cost
    -- counts on its admission day and month, its tokens in the current minute.
    -- Each row is looked up by the log's whole key (a LATERAL probe per row in flight;
    -- LIMIT 1 keeps the planner from flattening it into a join that filters the agent's
    -- whole log per row: measured 190 ms a call with 5,000 logged and 300 in flight).
    -- The admissions made on an allowance are settled at once when answered already
    -- (most are, at a call every half second), and become requests in flight if not:
    -- inserting and deleting them made ~40 us of a call's time per admission.
    FOR done IN
        WITH held AS (
            SELECT h.id AS request_id, to_timestamp(h.created) AS created_at, h.deadline,
                   h.estimate, l.model, l.tokens_in, l.tokens_out, l.compute_ms,
                   coalesce(l.found, false) AS answered
            FROM unnest(p_held_ids, p_held_created, p_held_deadlines, p_held_estimates)
                 AS h(id, created, deadline, estimate)
            LEFT JOIN LATERAL (
                SELECT true AS found, model, tokens_in, tokens_out, compute_ms
                FROM request_log r
                WHERE r.agent_id = p_agent AND r.request_id = h.id
                  AND r.created_at = to_timestamp(h.created) LIMIT 1) l ON true
        ), recorded AS (
            INSERT INTO agent_inflight (agent_id, request_id, created_at, deadline, estimate)
            SELECT p_agent, request_id, created_at, deadline, estimate FROM held
            WHERE NOT answered
            ON CONFLICT DO NOTHING
        ), answered AS (
            SELECT i.request_id, i.created_at, l.model, l.tokens_in, l.tokens_out,
                   l.compute_ms
            FROM agent_inflight i CROSS JOIN LATERAL (
                SELECT model, tokens_in, tokens_out, compute_ms FROM request_log r
                WHERE r.agent_id = i.agent_id AND r.request_id = i.request_id
                  AND r.created_at = i.created_at LIMIT 1) l
            WHERE i.agent_id = p_agent
        ), settled AS (
            DELETE FROM agent_inflight x USING answered a
            WHERE x.agent_id = p_agent AND x.request_id = a.request_id
              AND x.created_at = a.created_at
        )
        SELECT request_id, created_at, model, tokens_in, tokens_out, compute_ms FROM answered
        UNION ALL
        SELECT request_id, created_at, model, tokens_in, tokens_out, compute_ms FROM held
        WHERE answered
    LOOP
        cost := done.tokens_in / 1000.0 * coalesce((p_prices -> done.model ->> 0)::float8, 0)
              + done.tokens_out / 1000.0 * coalesce((p_prices -> done.model ->> 1)::float8, 0)
              + coalesce(done.compute_ms, 0) / 1000.0
                * coalesce((p_prices -> done.model ->> 2)::float8, 0);
        IF (done.created_at AT TIME ZONE 'UTC')::date = s.day THEN
            s.spent_day := s.spent_day + cost;
        END IF;
        IF date_trunc('month', done.created_at AT TIME ZONE 'UTC')::date = s.month THEN
            s.spent_month := s.spent_month + cost;
        END IF;
        s.tokens_cur := s.tokens_cur + done.tokens_in + done.tokens_out;
        -- Decaying maxima: a costlier request raises one at once, cheaper ones lower
        -- it by a fifth of the gap each.
        s.cost_estimate := greatest(cost, 0.8 * coalesce(s.cost_estimate, cost) + 0.2 * cost);
        s.tokens_estimate := greatest(done.tokens_in + done.tokens_out,
            0.8 * coalesce(s.tokens_estimate, done.tokens_in + done.tokens_out)
            + 0.2 * (done.tokens_in + done.tokens_out));
    END LOOP;
    -- A request whose row never came (its deadline and the error rows' grace are past)
    -- is settled at its estimate.
    FOR done IN
        DELETE FROM agent_inflight
        WHERE agent_id = p_agent AND deadline + p_grace < p_now
        RETURNING created_at, estimate
    LOOP
        IF (done.created_at AT TIME ZONE 'UTC')::date = s.day THEN
            s.spent_day := s.spent_day + done.estimate;
        END IF;
        IF date_trunc('month', done.created_at AT TIME ZONE 'UTC')::date = s.month THEN
            s.spent_month := s.spent_month + done.estimate;
        END IF;
    END LOOP;
    e := s.cost_estimate;
    SELECT count(*) FILTER (WHERE deadline > p_now), coalesce(sum(estimate), 0), count(*)
      INTO live, held, pending
      FROM agent_inflight WHERE agent_id = p_agent;
    live := live + leased + own;
    pending := pending + leased + own;
    held := held + (leased + own) * coalesce(e, 0);
    used := s.tokens_prev * (1 - into_minute / 60) + s.tokens_cur;
    -- The bucket refills up to its size less the allowances out of it.
    cap := greatest(coalesce(p_burst, 1) - leased - own, 0);
    bucket := least(cap, s.bucket + returned
                         + greatest(p_now - s.bucket_at, 0) * coalesce(p_rate, 0));
    FOR i IN 1 .. coalesce(cardinality(p_ask_ids), 0) LOOP
        out_verdict := 'ok';
        out_retry := 0;
        IF p_rate IS NOT NULL AND bucket < 1 THEN
            out_verdict := 'RATE_LIMITED';
            out_retry := (1 - bucket) / p_rate * 1000;
        ELSIF p_max_inflight IS NOT NULL AND live >= p_max_inflight THEN
            out_verdict := 'CONCURRENCY_LIMITED';
        ELSIF p_tokens_per_min IS NOT NULL AND used >= p_tokens_per_min THEN
            out_verdict := 'QUOTA_EXCEEDED';
            -- When the sliding count falls below the limit: later this minute as the
            -- previous minute's weight fades, or next minute as this one's does.
            IF s.tokens_cur < p_tokens_per_min THEN
                out_retry := (60 * (1 - (p_tokens_per_min - s.tokens_cur) / s.tokens_prev)
                              - into_minute) * 1000;
            ELSE
                out_retry := (60 - into_minute
                              + 60 * (1 - p_tokens_per_min / s.tokens_cur)) * 1000;
            END IF;
        ELSIF (p_budget_day IS NOT NULL OR p_budget_month IS NOT NULL)
              AND e IS NULL AND pending > 0 THEN
            -- The agent's cost per request is not known yet: one request at a time until
            -- one is settled, so the budget's bound holds from the first request on.
            out_verdict := 'probe';
        ELSIF s.spent_month + held >= p_budget_month THEN
            out_verdict := CASE WHEN p_degrade THEN 'degrade' ELSE 'BUDGET_EXCEEDED' END;
            out_retry := (extract(epoch FROM (this_month + interval '1 month')::timestamp
                                  AT TIME ZONE 'UTC') - p_now) * 1000;
        ELSIF s.spent_day + held >= p_budget_day THEN
            out_verdict := CASE WHEN p_degrade THEN 'degrade' ELSE 'BUDGET_EXCEEDED' END;
            out_retry := (extract(epoch FROM (today + 1)::timestamp AT TIME ZONE 'UTC')
                          - p_now) * 1000;
        END IF;
        IF out_verdict IN ('ok', 'degrade') THEN
            IF p_rate IS NOT NULL THEN
                bucket := bucket - 1;
            END IF;
            v_estimate := CASE WHEN out_verdict = 'ok' THEN coalesce(e, 0) ELSE 0 END;
            INSERT INTO agent_inflight (agent_id, request_id, created_at, deadline, estimate)
            VALUES (p_agent, p_ask_ids[i], to_timestamp(p_ask_created[i]),
                    p_ask_deadlines[i], v_estimate)
            ON CONFLICT DO NOTHING;
            held := held + v_estimate;
            pending := pending + 1;
            IF p_ask_deadlines[i] > p_now THEN
                live := live + 1;
            END IF;
            IF out_verdict = 'ok' THEN
                s.reserved := held;
            END IF;
        END IF;
        all_ok := all_ok AND out_verdict = 'ok';
        verdicts := verdicts || out_verdict;
        retries := retries || ceil(greatest(out_retry, 0))::bigint;
        reserveds := reserveds || held;
    END LOOP;
    -- The new allowance: only while every request so far was admitted, at most what was
    -- asked for and 1/p_share of each limit's room (none while a cost is unknown).
    IF current_call AND all_ok AND p_want > 0 THEN
        room := p_want;
        IF p_rate IS NOT NULL THEN
            room := least(room, floor(bucket / p_share));
        END IF;
        IF p_max_inflight IS NOT NULL THEN
            room := least(room, floor((p_max_inflight - live)::float8 / p_share));
        END IF;
        IF p_tokens_per_min IS NOT NULL THEN
            room := CASE WHEN s.tokens_estimate IS NULL THEN 0
                         WHEN s.tokens_estimate = 0 THEN room
                         ELSE least(room, floor(((p_tokens_per_min - used) / s.tokens_estimate
                                                 - pending) / p_share)) END;
        END IF;
        IF p_budget_day IS NOT NULL OR p_budget_month IS NOT NULL THEN
            room := CASE WHEN e IS NULL THEN 0
                         WHEN e = 0 THEN room
                         ELSE least(room,
                                    floor((coalesce(p_budget_day, 'Infinity'::float8)
                                           - s.spent_day - held) / e / p_share),
                                    floor((coalesce(p_budget_month, 'Infinity'::float8)
                                           - s.spent_month - held) / e / p_share)) END;
        END IF;
        v_extra := greatest(room, 0)::int;
    END IF;
    IF current_call THEN
        IF p_rate IS NOT NULL THEN
            bucket := bucket - v_extra;
        END IF;
        IF own + v_extra > 0 THEN
            INSERT INTO agent_leases (agent_id, replica, seq, held, expires)
            VALUES (p_agent, p_replica, p_seq, own + v_extra, p_now + p_ttl)
            ON CONFLICT (agent_id, replica) DO UPDATE SET
                seq = EXCLUDED.seq, held = EXCLUDED.held, expires = EXCLUDED.expires;
        ELSIF found_mine THEN
            DELETE FROM agent_leases WHERE agent_id = p_agent AND replica = p_replica;
        END IF;
        IF v_extra > 0 THEN  -- the overshoot bound: every estimate in flight or leased
            s.reserved := held + v_extra * coalesce(e, 0);
        END IF;
    END IF;
    IF p_rate IS NOT NULL THEN
        s.bucket := bucket;
        s.bucket_at := greatest(p_now, s.bucket_at);
    END IF;
    UPDATE agent_limit_state SET
        bucket = s.bucket, bucket_at = s.bucket_at, tokens_minute = s.tokens_minute,
        tokens_cur = s.tokens_cur, tokens_prev = s.tokens_prev, day = s.day,
        spent_day = s.spent_day, month = s.month, spent_month = s.spent_month,
        cost_estimate = s.cost_estimate, tokens_estimate = s.tokens_estimate,
        reserved = s.reserved
    WHERE agent_id = p_agent;
    IF coalesce(cardinality(p_ask_ids), 0) = 0 THEN
        RETURN QUERY SELECT NULL::text, 0::bigint, s.spent_day, s.spent_month, held,
                            v_extra, coalesce(e, 0);
    ELSE
        RETURN QUERY SELECT v.verdict, v.retry, s.spent_day, s.spent_month, v.reserved,
                            v_extra, coalesce(e, 0)
                     FROM unnest(verdicts, retries, reserveds) AS v(verdict, retry, reserved);
    END IF;
END
$fn$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE request_log ADD COLUMN model_parts jsonb")
    op.execute(_PRICE)
    op.execute(_PARTS_COST)
    op.execute(_LEASE)
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {GATEWAY}")


def downgrade() -> None:
    op.execute(_LEASE_0012)
    op.execute("DROP FUNCTION IF EXISTS intentroute_parts_cost(jsonb, jsonb)")
    op.execute("DROP FUNCTION IF EXISTS intentroute_price(jsonb, text)")
    op.execute("ALTER TABLE request_log DROP COLUMN IF EXISTS model_parts")
