"""PostgreSQL's claim statements: the fast claim (counted or not), the limited claim's update by ids,
and how a dispatcher's session prepares them (``PostgreSQLDialect.prepare_dispatcher_connection``).
"""

from __future__ import annotations

import re

from .base import CLAIM_COLUMNS, JOB, NOT_PAUSED

# What a claim writes: its parameters are the worker, then the claim time twice.
_TAKE = f"""UPDATE {JOB} AS job SET
    status = 'running',
    attempts = job.attempts + 1,
    claim_token = job.claim_token + 1,
    claimed_by = %s,
    started_ms = %s,
    lease_expires_ms = %s + job.lease_ms,
    reclaimed_from = CASE WHEN job.status = 'running' THEN job.claimed_by ELSE NULL END
"""
_RETURNING = "RETURNING " + ", ".join("job." + column for column in CLAIM_COLUMNS)

# A CTE that locks rows is always materialized, so it works as an optimization fence: the
# planner cannot fold the picking subquery into the UPDATE and lock more rows than it picks.
# "id = ANY(ARRAY(...))" makes the update primary-key lookups whatever the table statistics say
# (a join may hash a sequential scan of the whole table).
_PICKED = f"""
WITH expired AS (
    SELECT id, priority, run_at_ms FROM {JOB}
    WHERE queue = %s AND status = 'running' AND lease_expires_ms <= %s AND attempts < max_attempts
        AND limit_key IS NULL AND {NOT_PAUSED}
    ORDER BY lease_expires_ms LIMIT %s
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT id, priority, run_at_ms FROM {JOB}
    WHERE queue = %s AND status = 'waiting' AND run_at_ms <= %s AND limit_key IS NULL AND {NOT_PAUSED}
    ORDER BY priority DESC, run_at_ms, id LIMIT %s
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM expired UNION ALL SELECT id FROM due LIMIT %s
)"""
_TAKE_PICKED = f"{_TAKE}WHERE job.id = ANY(ARRAY(SELECT id FROM picked))"
CLAIM = f"{_PICKED}\n{_TAKE_PICKED}\n{_RETURNING}"

# A claim that is a transaction of its own counts what it claims in the same statement, a
# data-modifying CTE into its writer's rows of ``durq_counter`` (db/counters.py): claim and count
# commit together in one round trip. Its parameters after the claim's: the claim time, then the
# writer, the update time, the names of the started count and the wait's sum, the wait's bucket
# names and their bounds in ms. An observation goes in the first bucket whose bound is not below
# it: ``width_bucket`` counts the bounds at or below its operand, and times are whole ms.
CLAIM_COUNTED = f"""{_PICKED}, taken AS (
{_TAKE_PICKED}
{_RETURNING}
), waited AS (
    SELECT queue, name, GREATEST(%s - run_at_ms, 0) AS wait_ms FROM taken
), counted AS (
    INSERT INTO durq_counter AS counter (writer, queue, job_name, metric, value, updated_ms)
    SELECT %s, queue, name, metric, SUM(amount)::bigint, %s
    FROM waited CROSS JOIN LATERAL (VALUES
        (%s::varchar, 1::bigint),
        (%s::varchar, wait_ms),
        ((%s::varchar[])[width_bucket(wait_ms - 1, %s::bigint[]) + 1], 1::bigint)
    ) AS counts(metric, amount)
    GROUP BY queue, name, metric
    ON CONFLICT (writer, queue, job_name, metric)
    DO UPDATE SET value = counter.value + excluded.value, updated_ms = excluded.updated_ms
)
SELECT * FROM taken
"""

# The same, committing without waiting for the server to flush its WAL record
# (``synchronous_commit`` off for this transaction only, set in a one-time filter so that claim,
# count and setting are one statement). See ``claim_counted``.
CLAIM_COUNTED_UNFLUSHED = CLAIM_COUNTED.replace(
    _TAKE_PICKED, _TAKE_PICKED + " AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'"
)

# A limited claim's update of the jobs it admitted (db/flow.py). A row another transaction holds
# (an enqueue replacing its arguments, an operator's cancel) is skipped, not waited for: the
# claimer holds its queue's turn, and other claimers would wait with it.
CLAIM_IDS = f"""
{_TAKE}WHERE job.id = ANY(ARRAY(
    SELECT id FROM {JOB} WHERE id = ANY(%s::bigint[])
        AND COALESCE(limit_key, '') = (%s::text[])[array_position(%s::bigint[], id)]
        AND ((status = 'waiting' AND run_at_ms <= %s) OR (status = 'running' AND lease_expires_ms <= %s))
    FOR UPDATE SKIP LOCKED))
{_RETURNING}
"""

# The claims a dispatcher on a session of its own prepares, by name (see ``prepare_dispatcher_connection``).
PREPARED = {
    "durq_claim": CLAIM,
    "durq_claim_counted": CLAIM_COUNTED,
    "durq_claim_counted_unflushed": CLAIM_COUNTED_UNFLUSHED,
    "durq_claim_ids": CLAIM_IDS,
}
# The types of their parameters, declared: inferred from ``%s + job.lease_ms`` a time would be an integer.
_CLAIM_TYPES = "varchar, bigint, varchar, bigint, varchar, bigint, varchar, bigint, bigint, varchar, bigint, bigint"
_COUNT_TYPES = "bigint, varchar, bigint, varchar, varchar, varchar[], bigint[]"
TYPES = {"durq_claim": _CLAIM_TYPES, "durq_claim_counted": f"{_CLAIM_TYPES}, {_COUNT_TYPES}"}
TYPES["durq_claim_counted_unflushed"] = TYPES["durq_claim_counted"]
TYPES["durq_claim_ids"] = "varchar, bigint, bigint, bigint[], text[], bigint[], bigint, bigint"
# How the dispatcher runs each, written once: the claim is the hot path.
EXECUTE = {name: f"EXECUTE {name}({', '.join(['%s'] * (types.count(',') + 1))})" for name, types in TYPES.items()}


def numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders written ``$1``, ``$2``, … as ``PREPARE`` takes them."""
    numbers = iter(range(1, sql.count("%s") + 1))
    return re.sub("%s", lambda _: f"${next(numbers)}", sql)
