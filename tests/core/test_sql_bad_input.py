"""Bad input: one row per case (pg_cron's "Invalid input" block is the model).

Each case runs one statement against a database that holds a few messages (two due, one in
flight, one in the future) and checks:

* the SQLSTATE, which is always of class 22 (data exception) or 54000 (program limit exceeded)
  for the size limit, never the default P0001;
* the message starts with the function name and contains the parameter name and, where there
  is one, the limit;
* nothing was written: every row of dq_messages (all columns) and dq_waiters is unchanged. For
  dq_offer_many the bad element is placed last, after a new key and an existing key with a new
  payload, so that a function writing before it validates would be caught.

The statements may use ``%(token)s``: the lock token of the message in flight.

Timestamps: every timestamp stored must lie in [0001-01-02, 9999-12-30] UTC;
out of range is 22008 naming the parameter and the bound. Intervals are judged by their effect
``now() + x``: ``interval '-1 year +364 days'`` compares as positive (a year counts 360 days in
interval comparison) but lands a day or two in the past on every date.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlhelpers import check_context_names_only, row_count, table_rows

BIG = 100_001


def case(case_id: str, sql: str, sqlstate: str, *contains: str, marks: Any = ()) -> Any:
    """One row: the statement, its SQLSTATE, then the function name prefix and the fragments of
    the message (parameter name, limit). ``marks`` is for a strict xfail of a known bug."""
    return pytest.param(sql, sqlstate, contains, id=case_id, marks=marks)


def many(keys: str, payloads: str, *rest: str) -> str:
    """A dq_offer_many call on queue 'q' whose first two elements are valid and would write."""
    extra = "".join(", " + r for r in rest)
    return f"SELECT * FROM dq_offer_many('q', {keys}, {payloads}{extra})"  # noqa: S608 - constant test SQL


OK3 = r"ARRAY['\x01', '\x02', '\x03']::bytea[]"
KEYS3 = "ARRAY['new1', 'due1', 'new3']"  # due1 exists: with these payloads it would be updated

# Out-of-range instants: a dq_offer/dq_install_tick with one of these is 22008.
BAD_TIMES = {
    "infinity": "infinity",
    "minus-infinity": "-infinity",
    "year-10000": "10000-01-01 00:00:00+00",
    "after-9999-12-30": "9999-12-30 00:00:00.000001+00",
    "0001-01-01": "0001-01-01 00:00:00+00",
    "bc": "4713-01-01 00:00:00+00 BC",
}
# A payload one byte over the default limit of 1 MiB (1048576 bytes).
OVER_1MIB = "convert_to(repeat('x', 1048577), 'UTF8')"
# An interval that compares as positive (-360 + 364 days) but whose effect now() + x is in the past.
PAST_EFFECT = "interval '-1 year +364 days'"


def offer_time_cases() -> list[Any]:
    """dq_offer's scheduled_at out of range, in each payload form (bytea, text, jsonb)."""
    forms = {"bytea": r"'\x01'::bytea", "text": "'v'::text", "jsonb": "'{}'::jsonb"}
    return [
        case(
            f"offer-{form}-scheduled_at-{name}",
            f"SELECT dq_offer('q', 'k', {payload}, timestamptz '{value}')",  # noqa: S608 - constant test SQL
            "22008", "dq_offer:", "scheduled_at", "9999-12-30",
        )
        for form, payload in forms.items()
        for name, value in BAD_TIMES.items()
    ]


# fmt: off
CASES = [
    # ---- dq_offer: queue and key
    case("offer-queue-null", r"SELECT dq_offer(NULL, 'k', '\x01'::bytea)", "22004", "dq_offer:", "queue", "NULL"),
    case("offer-queue-empty", r"SELECT dq_offer('', 'k', '\x01'::bytea)", "22023", "dq_offer:", "queue", "empty"),
    case(
        "offer-queue-101-chars", r"SELECT dq_offer(repeat('q', 101), 'k', '\x01'::bytea)",
        "22001", "dq_offer:", "queue", "101", "limit is 100",
    ),
    case("offer-key-null", r"SELECT dq_offer('q', NULL, '\x01'::bytea)", "22004", "dq_offer:", "key", "NULL"),
    case("offer-key-empty", r"SELECT dq_offer('q', '', '\x01'::bytea)", "22023", "dq_offer:", "key", "empty"),
    case(
        "offer-key-201-chars", r"SELECT dq_offer('q', repeat('k', 201), '\x01'::bytea)",
        "22001", "dq_offer:", "key", "201", "limit is 200",
    ),
    case(
        "offer-text-queue-101-chars", "SELECT dq_offer(repeat('q', 101), 'k', 'v'::text)",
        "22001", "dq_offer:", "queue", "limit is 100",
    ),
    case(
        "offer-jsonb-key-201-chars", "SELECT dq_offer('q', repeat('k', 201), '{}'::jsonb)",
        "22001", "dq_offer:", "key", "limit is 200",
    ),
    # ---- dq_offer: payload (each overload) and the other arguments
    case("offer-payload-null-bytea", "SELECT dq_offer('q', 'k', NULL::bytea)", "22004", "dq_offer:", "payload", "NULL"),
    case("offer-payload-null-jsonb", "SELECT dq_offer('q', 'k', NULL::jsonb)", "22004", "dq_offer:", "payload", "NULL"),
    case("offer-payload-null-text", "SELECT dq_offer('q', 'k', NULL::text)", "22004", "dq_offer:", "payload", "NULL"),
    case("offer-payload-null-untyped", "SELECT dq_offer('q', 'k', NULL)", "22004", "dq_offer:", "payload", "NULL"),
    case(
        "offer-scheduled_at-null", r"SELECT dq_offer('q', 'k', '\x01'::bytea, NULL)",
        "22004", "dq_offer:", "scheduled_at",
    ),
    case(
        "offer-can_update-null", r"SELECT dq_offer('q', 'k', '\x01'::bytea, now(), NULL)",
        "22004", "dq_offer:", "can_update",
    ),
    case(
        "offer-payload_type-empty", r"SELECT dq_offer('q', 'k', '\x01'::bytea, payload_type => '')",
        "22023", "dq_offer:", "payload_type", "empty",
    ),
    case(
        "offer-payload_type-101-chars", r"SELECT dq_offer('q', 'k', '\x01'::bytea, payload_type => repeat('t', 101))",
        "22001", "dq_offer:", "payload_type", "limit is 100",
    ),
    # ---- dq_offer_many: whole arguments
    case("offer_many-queue-null", many("ARRAY['k']", r"ARRAY['\x01'::bytea]").replace("'q'", "NULL", 1),
         "22004", "dq_offer_many:", "queue", "NULL"),
    case("offer_many-queue-empty", many("ARRAY['k']", r"ARRAY['\x01'::bytea]").replace("'q'", "''", 1),
         "22023", "dq_offer_many:", "queue", "empty"),
    case("offer_many-queue-101-chars",
         many("ARRAY['k']", r"ARRAY['\x01'::bytea]").replace("'q'", "repeat('q', 101)", 1),
         "22001", "dq_offer_many:", "queue", "limit is 100"),
    case("offer_many-keys-null", many("NULL::text[]", OK3), "22004", "dq_offer_many:", "keys", "NULL"),
    case("offer_many-payloads-null", many(KEYS3, "NULL::bytea[]"), "22004", "dq_offer_many:", "payloads", "NULL"),
    case("offer_many-can_update-null", many(KEYS3, OK3, "can_update => NULL"), "22004", "dq_offer_many:", "can_update"),
    case(
        "offer_many-payloads-shorter", many(KEYS3, r"ARRAY['\x01', '\x02']::bytea[]"),
        "22023", "dq_offer_many:", "payloads has 2 elements, keys has 3",
    ),
    case(
        "offer_many-payloads-longer", many(KEYS3, r"ARRAY['\x01', '\x02', '\x03', '\x04']::bytea[]"),
        "22023", "dq_offer_many:", "payloads has 4 elements, keys has 3",
    ),
    case(
        "offer_many-scheduled_ats-length", many(KEYS3, OK3, "ARRAY[now(), now()]"),
        "22023", "dq_offer_many:", "scheduled_ats has 2 elements, keys has 3",
    ),
    case(
        "offer_many-payload_types-length", many(KEYS3, OK3, "payload_types => ARRAY['a', 'b', 'c', 'd']"),
        "22023", "dq_offer_many:", "payload_types has 4 elements, keys has 3",
    ),
    case(
        "offer_many-two-dimensional",
        many("ARRAY[['a', 'b'], ['c', 'd']]", r"ARRAY['\x01', '\x02', '\x03', '\x04']::bytea[]"),
        "22023", "dq_offer_many:", "one-dimensional",
    ),
    case(
        "offer_many-over-100000-elements",
        many(
            f"array(SELECT 'k' || g FROM generate_series(1, {BIG}) g)",  # noqa: S608 - constant
            rf"array_fill('\x01'::bytea, ARRAY[{BIG}])",
        ),
        "54000", "dq_offer_many:", "keys", str(BIG), "limit is 100000",
    ),
    # ---- dq_offer_many: one bad element, always the last one
    case(
        "offer_many-key-repeated", many("ARRAY['new1', 'due1', 'new1']", OK3),
        "22023", "dq_offer_many:", "new1", "more than once",
    ),
    case("offer_many-key-element-null", many("ARRAY['new1', 'due1', NULL]", OK3),
         "22004", "dq_offer_many:", "keys[3]", "NULL"),
    case("offer_many-key-element-empty", many("ARRAY['new1', 'due1', '']", OK3),
         "22023", "dq_offer_many:", "keys[3]", "empty"),
    case(
        "offer_many-key-element-201-chars", many("ARRAY['new1', 'due1', repeat('k', 201)]", OK3),
        "22001", "dq_offer_many:", "keys[3]", "201", "limit is 200",
    ),
    case("offer_many-payload-element-null", many(KEYS3, r"ARRAY['\x01', '\x02', NULL]::bytea[]"),
         "22004", "dq_offer_many:", "payloads[3]", "NULL"),
    case(
        "offer_many-scheduled_ats-element-null", many(KEYS3, OK3, "ARRAY[now(), now(), NULL]"),
        "22004", "dq_offer_many:", "scheduled_ats[3]", "NULL",
    ),
    case(
        "offer_many-payload_types-element-empty", many(KEYS3, OK3, "payload_types => ARRAY['a', 'b', '']"),
        "22023", "dq_offer_many:", "payload_types[3]", "empty",
    ),
    case(
        "offer_many-payload_types-element-101-chars",
        many(KEYS3, OK3, "payload_types => ARRAY['a', 'b', repeat('t', 101)]"),
        "22001", "dq_offer_many:", "payload_types[3]", "limit is 100",
    ),
    # Arrays need not start at subscript 1 in PostgreSQL; positions in messages are 1-based ordinals
    # whatever the lower bound. Here the bad element is the first one, at subscript 0.
    case(
        "offer_many-key-element-empty-lower-bound-0",
        many("'[0:2]={\"\",new1,due1}'::text[]", OK3),
        "22023", "dq_offer_many:", "keys[1]", "empty",
    ),
    case(
        "offer_many-key-element-null-lower-bound-0",
        many("'[0:2]={NULL,new1,due1}'::text[]", OK3),
        "22004", "dq_offer_many:", "keys[1]", "NULL",
    ),
    case(
        "offer_many-payload_types-element-empty-lower-bound-0",
        many(KEYS3, OK3, "payload_types => '[0:2]={\"\",a,b}'::text[]"),
        "22023", "dq_offer_many:", "payload_types[1]", "empty",
    ),
    case(
        "offer_many-key-element-empty-last-lower-bound-0",
        many("'[0:2]={new1,due1,\"\"}'::text[]", OK3),
        "22023", "dq_offer_many:", "keys[3]", "empty",
    ),
    # ---- dq_poll_many
    case("poll-queue-null", "SELECT * FROM dq_poll_many(NULL, 1)", "22004", "dq_poll_many:", "queue", "NULL"),
    case("poll-queue-empty", "SELECT * FROM dq_poll_many('', 1)", "22023", "dq_poll_many:", "queue", "empty"),
    case("poll-queue-101-chars", "SELECT * FROM dq_poll_many(repeat('q', 101), 1)",
         "22001", "dq_poll_many:", "queue", "limit is 100"),
    case("poll-max_count-0", "SELECT * FROM dq_poll_many('q', 0)", "22023", "dq_poll_many:", "max_count", "10000"),
    case("poll-max_count-negative", "SELECT * FROM dq_poll_many('q', -1)", "22023", "dq_poll_many:", "max_count"),
    case("poll-max_count-10001", "SELECT * FROM dq_poll_many('q', 10001)",
         "22023", "dq_poll_many:", "max_count", "10001", "10000"),
    case("poll-max_count-null", "SELECT * FROM dq_poll_many('q', NULL)", "22004", "dq_poll_many:", "max_count", "NULL"),
    case("poll-lock_timeout-0", "SELECT * FROM dq_poll_many('q', 1, interval '0')",
         "22023", "dq_poll_many:", "lock_timeout", "positive"),
    case("poll-lock_timeout-negative", "SELECT * FROM dq_poll_many('q', 1, interval '-1 second')",
         "22023", "dq_poll_many:", "lock_timeout", "positive"),
    case("poll-lock_timeout-null", "SELECT * FROM dq_poll_many('q', 1, NULL)",
         "22004", "dq_poll_many:", "lock_timeout", "NULL"),
    # ---- dq_ack, dq_nack, dq_extend
    case("ack-token-null", "SELECT dq_ack(NULL::uuid)", "22004", "dq_ack:", "lock_token", "NULL"),
    case("ack-tokens-array-null", "SELECT dq_ack_many(NULL::uuid[])", "22004", "dq_ack_many:", "lock_tokens", "NULL"),
    case("nack-token-null", "SELECT dq_nack(NULL::uuid)", "22004", "dq_nack:", "lock_token", "NULL"),
    case("nack-delay-null", "SELECT dq_nack(%(token)s::uuid, NULL)", "22004", "dq_nack:", "delay", "NULL"),
    case("nack-delay-negative", "SELECT dq_nack(%(token)s::uuid, interval '-1 second')",
         "22023", "dq_nack:", "delay", "negative"),
    case("extend-token-null", "SELECT dq_extend(NULL, interval '1 minute')",
         "22004", "dq_extend:", "lock_token", "NULL"),
    case("extend-lock_timeout-0", "SELECT dq_extend(%(token)s::uuid, interval '0')",
         "22023", "dq_extend:", "lock_timeout", "positive"),
    case("extend-lock_timeout-negative", "SELECT dq_extend(%(token)s::uuid, interval '-5 minutes')",
         "22023", "dq_extend:", "lock_timeout", "positive"),
    case("extend-lock_timeout-null", "SELECT dq_extend(%(token)s::uuid, NULL)",
         "22004", "dq_extend:", "lock_timeout", "NULL"),
    # ---- dq_cancel, dq_get, dq_next_due, dq_wait
    case("cancel-queue-null", "SELECT dq_cancel(NULL, 'due1')", "22004", "dq_cancel:", "queue", "NULL"),
    case("cancel-queue-101-chars", "SELECT dq_cancel(repeat('q', 101), 'due1')",
         "22001", "dq_cancel:", "queue", "limit is 100"),
    case("cancel-key-null", "SELECT dq_cancel('q', NULL)", "22004", "dq_cancel:", "key", "NULL"),
    case("cancel-key-empty", "SELECT dq_cancel('q', '')", "22023", "dq_cancel:", "key", "empty"),
    case("cancel-key-201-chars", "SELECT dq_cancel('q', repeat('k', 201))",
         "22001", "dq_cancel:", "key", "limit is 200"),
    case("get-queue-empty", "SELECT * FROM dq_get('', 'k')", "22023", "dq_get:", "queue", "empty"),
    case("get-key-null", "SELECT * FROM dq_get('q', NULL)", "22004", "dq_get:", "key", "NULL"),
    case("get-key-201-chars", "SELECT * FROM dq_get('q', repeat('k', 201))", "22001", "dq_get:", "key", "limit is 200"),
    case("next_due-queue-null", "SELECT dq_next_due(NULL)", "22004", "dq_next_due:", "queue", "NULL"),
    case("next_due-queue-101-chars", "SELECT dq_next_due(repeat('q', 101))",
         "22001", "dq_next_due:", "queue", "limit is 100"),
    case("wait-queue-empty", "SELECT dq_wait('')", "22023", "dq_wait:", "queue", "empty"),
    case("wait-max_wait-null", "SELECT dq_wait('q', NULL)", "22004", "dq_wait:", "max_wait", "NULL"),
    case("wait-max_wait-0", "SELECT dq_wait('q', interval '0')", "22023", "dq_wait:", "max_wait", "positive"),
    # ---- timestamps within [0001-01-02, 9999-12-30], intervals by their effect
    *offer_time_cases(),
    *[
        case(
            f"offer_many-scheduled_ats-element-{name}",
            many(KEYS3, OK3, f"ARRAY[now(), now(), '{value}']::timestamptz[]"),
            "22008", "dq_offer_many:", "scheduled_ats[3]", "9999-12-30",
        )
        for name, value in BAD_TIMES.items()
    ],
    case("nack-delay-overflow", "SELECT dq_nack(%(token)s::uuid, interval '300000 years')",
         "22008", "dq_nack:", "delay", "9999-12-30"),
    case("nack-delay-past-9999", "SELECT dq_nack(%(token)s::uuid, interval '8000 years')",
         "22008", "dq_nack:", "delay", "9999-12-30"),
    case("nack-delay-negative-effect-1-mon-40-days", "SELECT dq_nack(%(token)s::uuid, interval '1 mon -40 days')",
         "22023", "dq_nack:", "delay"),
    case("nack-delay-negative-effect-year", f"SELECT dq_nack(%(token)s::uuid, {PAST_EFFECT})",
         "22023", "dq_nack:", "delay"),
    case("extend-lock_timeout-overflow", "SELECT dq_extend(%(token)s::uuid, interval '300000 years')",
         "22008", "dq_extend:", "lock_timeout", "9999-12-30"),
    case("extend-lock_timeout-past-9999", "SELECT dq_extend(%(token)s::uuid, interval '8000 years')",
         "22008", "dq_extend:", "lock_timeout", "9999-12-30"),
    case("extend-lock_timeout-negative-effect-1-mon-40-days",
         "SELECT dq_extend(%(token)s::uuid, interval '1 mon -40 days')", "22023", "dq_extend:", "lock_timeout"),
    case("extend-lock_timeout-negative-effect-year", f"SELECT dq_extend(%(token)s::uuid, {PAST_EFFECT})",
         "22023", "dq_extend:", "lock_timeout"),
    case("poll-lock_timeout-overflow", "SELECT * FROM dq_poll_many('q', 1, interval '300000 years')",
         "22008", "dq_poll_many:", "lock_timeout", "9999-12-30"),
    case("poll-lock_timeout-past-9999", "SELECT * FROM dq_poll_many('q', 1, interval '8000 years')",
         "22008", "dq_poll_many:", "lock_timeout", "9999-12-30"),
    case("poll-lock_timeout-negative-effect-1-mon-40-days",
         "SELECT * FROM dq_poll_many('q', 1, interval '1 mon -40 days')", "22023", "dq_poll_many:", "lock_timeout"),
    case("poll-lock_timeout-negative-effect-year",
         f"SELECT * FROM dq_poll_many('q', 1, {PAST_EFFECT})",  # noqa: S608 - constant test SQL
         "22023", "dq_poll_many:", "lock_timeout"),
    # ---- max_wait is at most 1 hour
    case("wait-max_wait-2-hours", "SELECT dq_wait('q', interval '2 hours')",
         "22023", "dq_wait:", "max_wait", "limit is 1 hour"),
    case("wait-max_wait-1000-years", "SELECT dq_wait('q', interval '1000 years')",
         "22023", "dq_wait:", "max_wait", "limit is 1 hour"),
    # ---- payloads of at most max_payload_bytes (default 1 MiB), counted in bytes
    case("offer-payload-1mib-plus-1-bytea", f"SELECT dq_offer('q', 'k', {OVER_1MIB})",
         "54000", "dq_offer:", "payload", "1048577", "1048576"),
    case("offer-payload-1mib-plus-1-text", "SELECT dq_offer('q', 'k', repeat('x', 1048577))",
         "54000", "dq_offer:", "payload", "1048577", "1048576"),
    case("offer-payload-1mib-plus-1-jsonb", "SELECT dq_offer('q', 'k', to_jsonb(repeat('x', 1048575)))",
         "54000", "dq_offer:", "payload", "1048577", "1048576"),
    case("offer-payload-multibyte-text", "SELECT dq_offer('q', 'k', repeat('é', 524289))",  # 524289 chars
         "54000", "dq_offer:", "payload", "1048578", "1048576"),
    case("offer-payload-update-too-big", f"SELECT dq_offer('q', 'due1', {OVER_1MIB})",
         "54000", "dq_offer:", "payload", "1048577", "1048576"),
    case("offer_many-payload-element-too-big", many(KEYS3, rf"ARRAY['\x01', '\x02', {OVER_1MIB}]::bytea[]"),
         "54000", "dq_offer_many:", "payloads[3]", "1048577", "1048576"),
    case("configure-max_payload_bytes-1023", "SELECT dq_configure_queue('q', max_payload_bytes => 1023)",
         "22023", "dq_configure_queue:", "max_payload_bytes", "1024"),
    case("configure-max_payload_bytes-1gib-plus-1",
         "SELECT dq_configure_queue('q', max_payload_bytes => 1073741825)",
         "22023", "dq_configure_queue:", "max_payload_bytes", "1073741824"),
    # ---- delivery controls: priority, message group, expiry, headers, queue limits
    case("offer-priority-32768", "SELECT dq_offer('q', 'k', 'v', priority => 32768)",
         "22023", "dq_offer:", "priority", "-32768", "32767"),
    case("offer-priority-minus-32769", "SELECT dq_offer('q', 'k', 'v', priority => -32769)",
         "22023", "dq_offer:", "priority", "-32768", "32767"),
    case("offer-priority-null", "SELECT dq_offer('q', 'k', 'v', priority => NULL)",
         "22004", "dq_offer:", "priority"),
    case("offer-priority-update", "SELECT dq_offer('q', 'due1', 'v', priority => 100000)",
         "22023", "dq_offer:", "priority", "32767"),
    case("offer-group-empty", "SELECT dq_offer('q', 'k', 'v', message_group => '')",
         "22023", "dq_offer:", "message_group", "empty"),
    case("offer-group-201", "SELECT dq_offer('q', 'k', 'v', message_group => repeat('g', 201))",
         "22001", "dq_offer:", "message_group", "201", "200"),
    case("offer-expires-before-scheduled",
         "SELECT dq_offer('q', 'k', 'v', timestamptz '2030-01-02', expires_at => timestamptz '2030-01-01')",
         "22023", "dq_offer:", "expires_at", "scheduled_at"),
    case("offer-expires-equal-scheduled",
         "SELECT dq_offer('q', 'k', 'v', timestamptz '2030-01-02', expires_at => timestamptz '2030-01-02')",
         "22023", "dq_offer:", "expires_at", "after scheduled_at"),
    case("offer-expires-infinity", "SELECT dq_offer('q', 'k', 'v', expires_at => 'infinity')",
         "22008", "dq_offer:", "expires_at", "9999-12-30"),
    case("offer-headers-array", "SELECT dq_offer('q', 'k', 'v', headers => '[1, 2]')",
         "22023", "dq_offer:", "headers", "JSON object"),
    case("offer-headers-string", """SELECT dq_offer('q', 'k', 'v', headers => '"x"')""",
         "22023", "dq_offer:", "headers", "JSON object"),
    case("offer-headers-8193", "SELECT dq_offer('q', 'k', 'v', headers => jsonb_build_object('a', repeat('x', 8184)))",
         "54000", "dq_offer:", "headers", "8193", "8192"),
    case("offer-jsonb-priority", "SELECT dq_offer('q', 'k', '{}'::jsonb, priority => 40000)",
         "22023", "dq_offer:", "priority"),
    case("offer_many-priorities-element", many(KEYS3, OK3, "priorities => ARRAY[1, 2, 40000]"),
         "22023", "dq_offer_many:", "priorities[3]", "32767"),
    case("offer_many-priorities-null-element", many(KEYS3, OK3, "priorities => ARRAY[1, 2, NULL]"),
         "22004", "dq_offer_many:", "priorities[3]"),
    case("offer_many-priorities-length", many(KEYS3, OK3, "priorities => ARRAY[1, 2]"),
         "22023", "dq_offer_many:", "priorities", "2", "3"),
    case("offer_many-groups-element-long", many(KEYS3, OK3, "message_groups => ARRAY['a', 'b', repeat('g', 201)]"),
         "22001", "dq_offer_many:", "message_groups[3]", "200"),
    case("offer_many-groups-length", many(KEYS3, OK3, "message_groups => ARRAY['a']"),
         "22023", "dq_offer_many:", "message_groups", "1", "3"),
    case("offer_many-expires-element",
         many(KEYS3, OK3, "scheduled_ats => ARRAY[timestamptz '2030-01-01', '2030-01-01', '2030-01-02']",
              "expires_ats => ARRAY[timestamptz '2031-01-01', '2031-01-01', '2030-01-01']"),
         "22023", "dq_offer_many:", "expires_ats[3]", "scheduled_at"),
    case("offer_many-expires-infinity", many(KEYS3, OK3, "expires_ats => ARRAY[NULL, NULL, 'infinity']::timestamptz[]"),
         "22008", "dq_offer_many:", "expires_ats[3]"),
    case("offer_many-headers-element", many(KEYS3, OK3, """headers => ARRAY['{}', '{}', '[1]']::jsonb[]"""),
         "22023", "dq_offer_many:", "headers[3]", "JSON object"),
    case("offer_many-headers-too-big",
         many(KEYS3, OK3, "headers => ARRAY['{}', '{}', jsonb_build_object('a', repeat('x', 9000))]::jsonb[]"),
         "54000", "dq_offer_many:", "headers[3]", "8192"),
    case("configure-max_in_flight-negative", "SELECT dq_configure_queue('q', max_in_flight => -1)",
         "22023", "dq_configure_queue:", "max_in_flight", "100000"),
    case("configure-max_in_flight-too-big", "SELECT dq_configure_queue('q', max_in_flight => 100001)",
         "22023", "dq_configure_queue:", "max_in_flight", "100000"),
    case("configure-rate_limit-too-big",
         "SELECT dq_configure_queue('q', rate_limit => 100001, rate_period => '1 second')",
         "22023", "dq_configure_queue:", "rate_limit", "100000"),
    case("configure-rate_limit-without-period", "SELECT dq_configure_queue('q', rate_limit => 10)",
         "22023", "dq_configure_queue:", "rate_limit", "rate_period"),
    case("configure-rate_period-without-limit", "SELECT dq_configure_queue('q', rate_period => '1 minute')",
         "22023", "dq_configure_queue:", "rate_period", "rate_limit"),
    case("configure-rate_period-zero",
         "SELECT dq_configure_queue('q', rate_limit => 10, rate_period => '0 seconds')",
         "22023", "dq_configure_queue:", "rate_period"),
    case("configure-rate_period-2-days",
         "SELECT dq_configure_queue('q', rate_limit => 10, rate_period => '2 days')",
         "22023", "dq_configure_queue:", "rate_period", "1 day"),
    case("pause-queue-null", "SELECT dq_pause_queue(NULL)", "22004", "dq_pause_queue:", "queue"),
    case("pause-queue-long", "SELECT dq_pause_queue(repeat('q', 101))", "22001", "dq_pause_queue:", "queue", "100"),
    case("resume-queue-empty", "SELECT dq_resume_queue('')", "22023", "dq_resume_queue:", "queue"),
]
# fmt: on


@pytest.fixture
def token(module_conn: psycopg.Connection[Any]) -> str:
    """Fill queue 'q': due1, due2 (due), inflight (polled, its token returned), future1."""
    module_conn.execute(
        r"""SELECT dq_offer('q', k, '\x00'::bytea, t)
              FROM (VALUES ('inflight', timestamptz '2020-01-01'), ('due1', '2020-01-02'),
                           ('due2', '2020-01-03'), ('future1', '2100-01-01')) v(k, t)"""
    )
    row = module_conn.execute("SELECT key, lock_token FROM dq_poll_many('q', 1, interval '1 hour')").fetchone()
    assert row is not None and row[0] == "inflight"
    return str(row[1])


@pytest.mark.parametrize(("sql", "sqlstate", "contains"), CASES)
def test_bad_input(module_conn, token, sql, sqlstate, contains):
    before = table_rows(module_conn)
    count_before = row_count(module_conn)
    waiters_before = module_conn.execute("SELECT * FROM dq_waiters ORDER BY queue, pid").fetchall()
    config_before = module_conn.execute(
        "SELECT (SELECT array_agg(q ORDER BY q.queue)::text FROM dq_queues q), "
        "(SELECT array_agg(g ORDER BY g.queue, g.message_group)::text FROM dq_groups g), "
        "(SELECT array_agg(t ORDER BY t.queue, t.slot)::text FROM dq_rate_tokens t)").fetchone()

    with pytest.raises(psycopg.Error) as info:
        module_conn.execute(sql, {"token": token} if "%(token)s" in sql else None)
    err = info.value
    message = err.diag.message_primary or ""

    assert err.sqlstate == sqlstate, f"{err.sqlstate}: {message}"
    assert err.sqlstate != "P0001"
    assert err.sqlstate.startswith("22") or err.sqlstate == "54000"
    function = contains[0]
    assert message.startswith(function), message
    for fragment in contains[1:]:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert token not in message, "lock tokens must not be echoed into messages"

    assert row_count(module_conn) == count_before
    assert table_rows(module_conn) == before
    assert module_conn.execute("SELECT * FROM dq_waiters ORDER BY queue, pid").fetchall() == waiters_before
    assert module_conn.execute(
        "SELECT (SELECT array_agg(q ORDER BY q.queue)::text FROM dq_queues q), "
        "(SELECT array_agg(g ORDER BY g.queue, g.message_group)::text FROM dq_groups g), "
        "(SELECT array_agg(t ORDER BY t.queue, t.slot)::text FROM dq_rate_tokens t)").fetchone() == config_before
    # The error is raised by the function called: its CONTEXT names no internal helper.
    check_context_names_only(err, function.rstrip(":"))


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
