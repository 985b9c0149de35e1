"""Every statement of the ``delayedqueue`` data source, naming the ``dq_*`` functions of one
install as the clients' statements do (:func:`pyqueue.core.statements.qualified`): ``"schema".dq_…`` when
the option ``schema`` is given, the bare names otherwise (the connection's ``search_path``
decides). No statement text is built from runtime data: values travel as parameters.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..core.statements import qualified

__all__ = ["Statements", "statements"]

# One batch of staged rows offered by one set-based call. A key repeated within the batch is
# offered once: with can_update the last row of the batch (highest seq) wins, without it the first
# (lowest seq) wins, which is what offering the rows one by one in order would leave. The four
# array_agg run over the same rows in the same order, so their elements line up.
_STAGED = """(SELECT array_agg(s.key) AS keys, array_agg(s.payload) AS payloads,
               array_agg(s.at) AS ats,
               array_agg(s.payload_type) AS types
          FROM (SELECT DISTINCT ON (t.key) t.key, t.payload, t.payload_type, t.at
                  FROM dq_spark_stage t
                 WHERE t.batch = %(batch)s
                 ORDER BY t.key, t.seq {order}) AS s) AS a
       CROSS JOIN LATERAL"""
_STAGED_ARGS = "(%(queue)s, a.keys, a.payloads, a.ats, %(can_update)s, a.types)"
# The same with each row's parents (the DataFrame's after and on_parent_failure columns), the rows
# in the order of the partition (seq): a row may name rows before it in its batch.
_STAGED_AFTER = """(SELECT array_agg(s.key ORDER BY s.seq) AS keys, array_agg(s.payload ORDER BY s.seq) AS payloads,
               array_agg(s.at ORDER BY s.seq) AS ats,
               array_agg(s.payload_type ORDER BY s.seq) AS types,
               array_agg(s.after::jsonb ORDER BY s.seq) AS afters,
               array_agg(s.on_parent_failure ORDER BY s.seq) AS failures
          FROM (SELECT DISTINCT ON (t.key) t.seq, t.key, t.payload, t.payload_type, t.at, t.after, t.on_parent_failure
                  FROM dq_spark_stage t
                 WHERE t.batch = %(batch)s
                 ORDER BY t.key, t.seq {order}) AS s) AS a
       CROSS JOIN LATERAL"""
_STAGED_AFTER_ARGS = ("(%(queue)s, a.keys, a.payloads, a.ats, %(can_update)s, a.types, afters => a.afters, "
                      "on_parent_failures => a.failures)")
# writeMethod=arrays: one batch sent as binary arrays (already de-duplicated, see rows.Batching).
_ARRAYS_ARGS = (
    "(%(queue)s, %(keys)b::text[], %(payloads)b::bytea[], %(ats)b::timestamptz[], %(can_update)s, %(types)b::text[])")
# The same with each row's parents (the JSON text of its after, "[]" for none) and on_parent_failure.
_ARRAYS_AFTER_ARGS = (
    "(%(queue)s, %(keys)b::text[], %(payloads)b::bytea[], %(ats)b::timestamptz[], %(can_update)s, %(types)b::text[], "
    "afters => %(afters)b::text[]::jsonb[], on_parent_failures => %(failures)b::text[])")
# Every offer statement returns (outcome, number of rows): dq_offer_many_counts where the install
# has it (no row per key), else the outcomes of dq_offer_many counted.
_BY_OUTCOME = "SELECT o.outcome, count(*)::bigint FROM {source} {s}dq_offer_many{args} AS o GROUP BY o.outcome"
_COUNTS = (
    "SELECT v.outcome, v.n FROM {source} {s}dq_offer_many_counts{args} AS o"
    " CROSS JOIN LATERAL (VALUES ('created', o.created), ('updated', o.updated), ('ignored', o.ignored))"
    " AS v(outcome, n)"
)


def _offer(template: str, source: str, args: str) -> str:
    return template.replace("{source}", source).replace("{args}", args)


@dataclass(frozen=True)
class Statements:
    """The SQL text of every statement; ``{s}`` stands for the schema prefix (see :func:`statements`)."""

    # On the driver, before a write: the job's default time (now(), in microseconds since 1970),
    # whether the install has dq_offer_many and whether it has dq_offer_many_counts (in the schema
    # given, else on the search_path).
    writer_check: str = (
        "SELECT (extract(epoch FROM date_trunc('microseconds', now())) * 1000000)::int8, "
        "coalesce(bool_or(p.proname = 'dq_offer_many'), false), "
        "coalesce(bool_or(p.proname = 'dq_offer_many_counts'), false) "
        "FROM (SELECT) AS one LEFT JOIN pg_catalog.pg_proc p ON p.proname IN ('dq_offer_many', 'dq_offer_many_counts') "
        "AND CASE WHEN %(schema)s::text IS NULL THEN pg_catalog.pg_function_is_visible(p.oid) "
        "ELSE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = %(schema)s) END"
    )

    # The staging table of one task (writeMethod=copy): its whole partition, checked, before
    # anything is offered. A temporary table, in the session's own schema whatever the install's.
    # seq is the row's position in the partition (0-based); batch = seq // batchSize.
    stage_create: str = """
CREATE TEMPORARY TABLE dq_spark_stage (
    seq           bigint  NOT NULL,
    batch         integer NOT NULL,
    key           text    NOT NULL,
    payload       bytea   NOT NULL,
    payload_type  text    NOT NULL,
    at            timestamptz NOT NULL,
    after         text,
    on_parent_failure text
)"""
    stage_copy: str = "COPY dq_spark_stage (seq, batch, key, payload, payload_type, at) FROM STDIN (FORMAT binary)"
    stage_copy_after: str = (
        "COPY dq_spark_stage (seq, batch, key, payload, payload_type, at, after, on_parent_failure) "
        "FROM STDIN (FORMAT binary)")
    stage_index: str = "CREATE INDEX ON dq_spark_stage (batch)"
    stage_analyze: str = "ANALYZE dq_spark_stage"
    stage_drop: str = "DROP TABLE IF EXISTS dq_spark_stage"
    offer_staged_last: str = _offer(_BY_OUTCOME, _STAGED.replace("{order}", "DESC"), _STAGED_ARGS)
    offer_staged_first: str = _offer(_BY_OUTCOME, _STAGED.replace("{order}", "ASC"), _STAGED_ARGS)
    offer_arrays: str = _offer(_BY_OUTCOME, "", _ARRAYS_ARGS)
    offer_staged_last_counts: str = _offer(_COUNTS, _STAGED.replace("{order}", "DESC"), _STAGED_ARGS)
    offer_staged_first_counts: str = _offer(_COUNTS, _STAGED.replace("{order}", "ASC"), _STAGED_ARGS)
    offer_arrays_counts: str = _offer(_COUNTS, "", _ARRAYS_ARGS)
    offer_staged_last_after: str = _offer(_BY_OUTCOME, _STAGED_AFTER.replace("{order}", "DESC"), _STAGED_AFTER_ARGS)
    offer_staged_first_after: str = _offer(_BY_OUTCOME, _STAGED_AFTER.replace("{order}", "ASC"), _STAGED_AFTER_ARGS)
    offer_staged_last_after_counts: str = _offer(_COUNTS, _STAGED_AFTER.replace("{order}", "DESC"),
                                                 _STAGED_AFTER_ARGS)
    offer_staged_first_after_counts: str = _offer(_COUNTS, _STAGED_AFTER.replace("{order}", "ASC"),
                                                  _STAGED_AFTER_ARGS)
    offer_arrays_after: str = _offer(_BY_OUTCOME, "", _ARRAYS_AFTER_ARGS)
    offer_arrays_after_counts: str = _offer(_COUNTS, "", _ARRAYS_AFTER_ARGS)

    # Reading (sql/170_export.sql): the smallest and largest id of the rows matching the filters,
    # and the call that opens a cursor over the rows of an id range (lo <= id < hi) matching them.
    messages_bounds: str = 'SELECT id_min, id_max FROM {s}"dq_export_messages_bounds"(%s::jsonb)'
    messages_open: str = 'SELECT {s}"dq_export_messages"(%s, %s, %s::jsonb)'
    archive_bounds: str = 'SELECT id_min, id_max FROM {s}"dq_export_archive_bounds"(%s::jsonb)'
    archive_open: str = 'SELECT {s}"dq_export_archive"(%s, %s, %s::jsonb)'


@functools.cache
def statements(schema: str | None) -> Statements:
    """Every statement naming the install in ``schema`` (``"schema".dq_…``, quoted as an
    identifier), or the bare ``dq_…`` names when ``schema`` is None."""
    return qualified(Statements, schema)
