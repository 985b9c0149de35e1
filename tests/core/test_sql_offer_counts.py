"""dq_offer_many_counts: the same body, checks and errors as dq_offer_many, one row of counts."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlhelpers import offer_many_counts_worker, run_workers

T1 = datetime(2020, 1, 1, tzinfo=UTC)
T2 = datetime(2020, 1, 2, tzinfo=UTC)

# The columns an offer writes, to compare two queues row by row.
STATE = (
    "SELECT key, payload, payload_type, scheduled_at, scheduled_at_initially, priority, message_group, expires_at,"
    " headers, delivery_count FROM dq_messages WHERE queue = %s ORDER BY key"
)


def call(conn: psycopg.Connection[Any], fn: str, queue: str, keys: list[Any], payloads: list[Any],
         **named: Any) -> Any:
    """fn (dq_offer_many or dq_offer_many_counts) on queue; named arguments in named notation.
    dq_offer_many's outcomes come back counted, as dq_offer_many_counts returns them."""
    extra = "".join(f", {name} => %({name})s" for name in named)
    args = f"(%(queue)s, %(keys)s::text[], %(payloads)s::bytea[]{extra})"
    params = {"queue": queue, "keys": keys, "payloads": payloads, **named}
    if fn == "dq_offer_many":
        rows = conn.execute(f"SELECT outcome FROM dq_offer_many{args}", params).fetchall()  # noqa: S608
        tally = Counter(r[0] for r in rows)
        return (tally["created"], tally["updated"], tally["ignored"])
    return conn.execute(f"SELECT created, updated, ignored FROM dq_offer_many_counts{args}", params).fetchall()  # noqa: S608


# Batches offered in order to a fresh queue: new keys, updates, unchanged re-offers, inserts if
# absent, grouped and controlled messages.
BATCHES: list[tuple[list[str], list[bytes], dict[str, Any], tuple[int, int, int]]] = [
    (["a", "b", "c"], [b"1", b"2", b"3"], {"scheduled_ats": [T1, T1, T1]}, (3, 0, 0)),
    (["c", "b", "d"], [b"3", b"two", b"4"], {"scheduled_ats": [T1, T1, T1]}, (1, 1, 1)),
    (["b", "e"], [b"x", b"5"], {"scheduled_ats": [T2, T2], "can_update": False}, (1, 0, 1)),
    (["f", "g", "a"], [b"6", b"7", b"1"], {"scheduled_ats": [T1, T1, T1], "message_groups": ["g1", "g1", "g2"]},
     (2, 1, 0)),
    (["h", "a"], [b"8", b"1"], {"scheduled_ats": [T1, T1], "priorities": [3, 0], "headers": ['{"t": 1}', None]},
     (1, 1, 0)),
    ([], [], {}, (0, 0, 0)),
]


def test_counts_match_the_outcomes_of_dq_offer_many(module_conn):
    for keys, payloads, named, expected in BATCHES:
        many = call(module_conn, "dq_offer_many", "qa", keys, payloads, **named)
        counts = call(module_conn, "dq_offer_many_counts", "qb", keys, payloads, **named)
        assert many == expected
        assert counts == [expected], "one row of counts"
    assert module_conn.execute(STATE, ("qa",)).fetchall() == module_conn.execute(STATE, ("qb",)).fetchall()
    groups = "SELECT message_group, (SELECT key FROM dq_messages m WHERE m.id = g.head_id) FROM dq_groups g " \
             "WHERE queue = %s ORDER BY 1"
    assert module_conn.execute(groups, ("qa",)).fetchall() == module_conn.execute(groups, ("qb",)).fetchall()


BAD: list[tuple[str, list[Any], list[Any], dict[str, Any], str]] = [
    ("key repeated", ["f", "g", "f"], [b"1", b"2", b"3"], {}, "22023"),
    ("key repeated, insert if absent", ["f", "f"], [b"1", b"2"], {"can_update": False}, "22023"),
    ("key NULL", ["f", None], [b"1", b"2"], {}, "22004"),
    ("key empty", ["f", ""], [b"1", b"2"], {}, "22023"),
    ("key too long", ["f", "k" * 201], [b"1", b"2"], {}, "22001"),
    ("payload NULL", ["f", "g"], [b"1", None], {}, "22004"),
    ("lengths differ", ["f", "g"], [b"1"], {}, "22023"),
    ("time out of range", ["f"], [b"1"], {"scheduled_ats": ["-infinity"]}, "22008"),
    ("payload type empty", ["f"], [b"1"], {"payload_types": [""]}, "22023"),
    ("priority NULL", ["f", "g"], [b"1", b"2"], {"priorities": [1, None]}, "22004"),
    ("headers not an object", ["f"], [b"1"], {"headers": ['"x"']}, "22023"),
    ("payload over the limit", ["f"], [b"x" * (1024 * 1024 + 1)], {}, "54000"),
    ("a bad key after a repeated one", ["f", "f", ""], [b"1", b"2", b"3"], {}, "22023"),
]


@pytest.mark.parametrize(("keys", "payloads", "named", "sqlstate"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_errors_are_those_of_dq_offer_many_and_write_nothing(module_conn, keys, payloads, named, sqlstate):
    seen = []
    for fn in ("dq_offer_many", "dq_offer_many_counts"):
        with pytest.raises(psycopg.Error) as exc:
            call(module_conn, fn, "qe", keys, payloads, **named)
        diag = exc.value.diag
        assert diag.sqlstate == sqlstate
        assert diag.message_primary is not None and diag.message_primary.startswith(f"{fn}: ")
        seen.append((diag.sqlstate, diag.message_primary.removeprefix(f"{fn}: "), diag.message_hint))
    assert seen[0] == seen[1], "the same error, naming the function called"
    assert module_conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'qe'").fetchone() == (0,)


def test_dq_producer_may_call_it(module_conn):
    granted = "SELECT has_function_privilege('dq_producer', p.oid, 'EXECUTE') FROM pg_proc p WHERE proname = %s"
    assert module_conn.execute(granted, ("dq_offer_many_counts",)).fetchone() == (True,)
    public = "SELECT has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc p WHERE proname = %s"
    assert module_conn.execute(public, ("dq_offer_many_counts",)).fetchone() == (False,)


def test_concurrent_producers_on_overlapping_keys(conn, dsn):
    keys = [f"k{i:04d}" for i in range(2000)]
    args = []
    for worker in range(4):
        rnd = random.Random(worker)
        # Each process offers an overlapping 3/4 of the keys in its own order with its own payload:
        # a key offered by two processes is an update, and their row locks collide.
        mine = [k for i, k in enumerate(keys) if i % 4 != worker]
        rnd.shuffle(mine)
        args.append((dsn, "q", mine, [f"w{worker}".encode()] * len(mine), T1))
    results = run_workers(offer_many_counts_worker, args)

    for (_, _, mine, _, _), (created, updated, ignored) in zip(args, results, strict=True):
        assert created + updated + ignored == len(mine)
        assert ignored == 0, "each process's payload differs from the others': an update, never ignored"
    assert sum(r[0] for r in results) == len(keys), "exactly one 'created' per key"
    assert sum(r[1] for r in results) == 4 * len(keys) * 3 // 4 - len(keys)
    rows = conn.execute("SELECT key, count(*) FROM dq_messages GROUP BY key").fetchall()
    assert sorted(k for k, _ in rows) == keys
    assert {c for _, c in rows} == {1}
