"""Deferred release: an acknowledged parent releases at most ``dq__limit_release_inline()`` children in
its own transaction; the rest waits in ``dq_release_backlog`` until the next poll (of any queue) or
``dq_release_backlog()`` (the job dq-release) releases it.

One test runs at the real limit (500). The others run in a fresh database whose limit is lowered to
3 (``small``): the same code paths with a handful of children.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

Q = "kids"
P = "parents"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
LOCK = timedelta(minutes=5)
LIMIT = 3


@pytest.fixture
def small(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to a fresh database whose inline release limit is 3."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE OR REPLACE FUNCTION public_internal.dq__limit_release_inline() RETURNS integer"
                  f" LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT {LIMIT} $$")
        yield c


def offer(c: psycopg.Connection[Any], queue: str, key: str, *, after: list[Any] | None = None,
          on_parent_failure: str = "wait", expires_at: datetime | None = None) -> str:
    row = c.execute(
        "SELECT dq_offer(%s, %s, 'p'::text, %s, expires_at => %s, after => %s::jsonb, on_parent_failure => %s)",
        (queue, key, LONG_AGO, expires_at, None if after is None else json.dumps(after), on_parent_failure),
    ).fetchone()
    assert row is not None
    return str(row[0])


def children(c: psycopg.Connection[Any], n: int, parent: str = "A", prefix: str = "c") -> None:
    """Offer n children of (parents, parent), keys prefix1..prefixN in id order."""
    c.execute("SELECT count(dq_offer(%s, %s || i, 'x'::text, %s,"
              " after => jsonb_build_array(jsonb_build_array(%s::text, %s::text)))) FROM generate_series(1, %s) i",
              (Q, prefix, LONG_AGO, P, parent, n))


def poll(c: psycopg.Connection[Any], queue: str, n: int = 10000) -> dict[str, uuid.UUID]:
    rows = c.execute("SELECT key, lock_token FROM dq_poll_many(%s, %s, %s)", (queue, n, LOCK)).fetchall()
    return {r[0]: r[1] for r in rows}


def ack_parent(c: psycopg.Connection[Any], key: str = "A") -> None:
    token = poll(c, P)[key]
    assert c.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)


@contextlib.contextmanager
def backlog_held(dsn: str) -> Iterator[None]:
    """Another transaction holds the backlog's rows: polls pass them over (SKIP LOCKED) meanwhile."""
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM dq_release_backlog FOR UPDATE").fetchall()
        yield
        holder.rollback()


def released(c: psycopg.Connection[Any]) -> set[str]:
    rows = c.execute("SELECT key FROM dq_messages WHERE queue = %s AND parents_pending = 0", (Q,)).fetchall()
    return {r[0] for r in rows}


def blocked(c: psycopg.Connection[Any]) -> dict[str, int]:
    rows = c.execute("SELECT key, parents_pending FROM dq_messages WHERE parents_pending > 0").fetchall()
    return {r[0]: r[1] for r in rows}


def backlog(c: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return c.execute("SELECT parent_queue, parent_key, after_id, up_to FROM dq_release_backlog ORDER BY id").fetchall()


def dependency_rows(c: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return c.execute("SELECT d.parent_key, m.key FROM dq_dependencies d LEFT JOIN dq_messages m ON m.id = d.child_id"
                     " ORDER BY 1, 2").fetchall()


def ids(c: psycopg.Connection[Any], *keys: str) -> list[int]:
    rows = c.execute("SELECT id FROM dq_messages WHERE queue = %s AND key = ANY (%s) ORDER BY id", (Q, list(keys)))
    return [r[0] for r in rows.fetchall()]


def parent_state(c: psycopg.Connection[Any], child: str) -> list[tuple[Any, ...]]:
    return c.execute("SELECT related_key, state FROM dq_dependencies(%s, %s) WHERE relation = 'parent'",
                     (Q, child)).fetchall()


# --------------------------------------------------------------------------- at the real limit


def test_the_first_500_inline_the_rest_by_the_next_poll(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    (limit,) = c.execute("SELECT public_internal.dq__limit_release_inline()").fetchone()  # type: ignore[misc]
    assert limit == 500
    offer(c, P, "A")
    children(c, limit + 5)
    ack_parent(c)
    # the lowest 500 ids are released (due, deliverable), the 5 highest wait in the backlog
    first = c.execute("SELECT key FROM dq_messages WHERE queue = %s ORDER BY id LIMIT %s", (Q, limit)).fetchall()
    assert released(c) == {r[0] for r in first}
    assert set(blocked(c)) == {f"c{i}" for i in range(limit + 1, limit + 6)}
    (after_id, up_to) = backlog(c)[0][2:]
    assert backlog(c) == [(P, "A", after_id, up_to)]
    assert ids(c, f"c{limit}") == [after_id] and ids(c, f"c{limit + 5}") == [up_to]
    assert parent_state(c, f"c{limit + 1}") == [("A", "releasing")]
    assert c.execute("SELECT count(*) FROM dq_dependencies(%s, 'A') WHERE state = 'releasing'", (P,)).fetchone() == (5,)
    # a poll of any queue releases the next chunk before it reads
    assert poll(c, "elsewhere") == {}
    assert blocked(c) == {} and backlog(c) == [] and dependency_rows(c) == []
    assert len(poll(c, Q)) == limit + 5


# --------------------------------------------------------------------------- a small limit


def test_backlog_ranges_and_chunks(small: psycopg.Connection[Any]) -> None:
    c = small
    offer(c, P, "A")
    children(c, 8)
    ack_parent(c)
    assert released(c) == {"c1", "c2", "c3"}
    assert backlog(c) == [(P, "A", *ids(c, "c3", "c8"))]
    assert c.execute("SELECT dq_release_backlog(2)").fetchone() == (2,)
    assert released(c) == {f"c{i}" for i in range(1, 6)}
    assert backlog(c) == [(P, "A", *ids(c, "c5", "c8"))]  # after_id moved past what was released
    poll(c, "elsewhere")  # one chunk of the limit: the last three, and the row is done
    assert blocked(c) == {} and backlog(c) == []
    assert c.execute("SELECT dq_release_backlog()").fetchone() == (0,)


def test_a_re_offered_key_is_a_new_parent(small: psycopg.Connection[Any]) -> None:
    c = small
    offer(c, P, "A")
    children(c, 5)
    ack_parent(c)
    assert set(blocked(c)) == {"c4", "c5"}
    # A again: a new message, a new parent. Its child D is not the backlog's, nor the reverse.
    offer(c, P, "A")
    offer(c, Q, "D", after=[[P, "A"]])
    assert parent_state(c, "D") == [("A", "ready")]
    assert parent_state(c, "c4") == [("A", "releasing")]
    rows = c.execute("SELECT relation, related_key, state FROM dq_dependencies(%s, 'A') ORDER BY 2", (P,)).fetchall()
    assert rows == [("child", "D", "blocked"), ("child", "c4", "releasing"), ("child", "c5", "releasing")]
    # the backlog releases c4 and c5, not D
    assert c.execute("SELECT dq_release_backlog()").fetchone() == (2,)
    assert blocked(c) == {"D": 1} and backlog(c) == []
    # and the new A's acknowledgement releases D
    ack_parent(c)
    assert blocked(c) == {} and dependency_rows(c) == []


def test_a_new_parents_ack_leaves_the_backlog_to_the_backlog(small: psycopg.Connection[Any], dsn: str) -> None:
    c = small
    offer(c, P, "A")
    children(c, 5)
    ack_parent(c)
    offer(c, P, "A")
    children(c, 4, prefix="d")  # more than the limit again: a second backlog row, above the first
    with backlog_held(dsn):
        ack_parent(c)
    assert released(c) == {"c1", "c2", "c3", "d1", "d2", "d3"}
    assert backlog(c) == [(P, "A", *ids(c, "c3", "c5")), (P, "A", *ids(c, "d3", "d4"))]
    assert c.execute("SELECT dq_release_backlog()").fetchone() == (3,)
    assert blocked(c) == {} and backlog(c) == [] and dependency_rows(c) == []


@pytest.mark.parametrize("fate", ["cancelled", "dead"])
def test_a_new_parents_failure_does_not_touch_the_backlog(small: psycopg.Connection[Any], dsn: str, fate: str) -> None:
    c = small
    c.execute("SELECT dq_configure_queue(%s, dead_letter_queue => 'kids_dlq')", (Q,))
    c.execute("SELECT dq_configure_queue(%s, dead_letter_queue => 'parents_dlq')", (P,))
    offer(c, P, "A")
    c.execute("SELECT count(dq_offer(%s, 'c' || i, 'x'::text, %s, after => %s::jsonb,"
              " on_parent_failure => 'dead_letter')) FROM generate_series(1, 5) i",
              (Q, LONG_AGO, json.dumps([[P, "A"]])))
    ack_parent(c)
    offer(c, P, "A")
    offer(c, Q, "D", after=[[P, "A"]], on_parent_failure="dead_letter")
    if fate == "cancelled":
        assert c.execute("SELECT dq_cancel(%s, 'A')", (P,)).fetchone() == (True,)
    else:
        with backlog_held(dsn):
            token = poll(c, P)["A"]
        assert c.execute("SELECT outcome FROM dq_dead_letter(%s)", (token,)).fetchone() == ("dead_lettered",)
    # D followed its own parent to the dead-letter queue; c4 and c5 wait for the backlog
    assert c.execute("SELECT queue FROM dq_messages WHERE key = 'D'").fetchone() == ("kids_dlq",)
    assert blocked(c) == {"c4": 1, "c5": 1}
    poll(c, "elsewhere")
    assert blocked(c) == {} and released(c) == {f"c{i}" for i in range(1, 6)}


def test_a_child_offered_after_the_ack_is_satisfied(small: psycopg.Connection[Any]) -> None:
    c = small
    offer(c, P, "A")
    children(c, 5)
    ack_parent(c)
    assert backlog(c) != []
    assert offer(c, Q, "E", after=[[P, "A"]]) == "created"
    assert "E" in released(c)
    assert parent_state(c, "E") == []


@pytest.mark.parametrize("how", ["cancelled", "expired", "purged"])
def test_a_child_that_leaves_the_backlog_is_not_brought_back(small: psycopg.Connection[Any], how: str) -> None:
    c = small
    offer(c, P, "A")
    c.execute("SELECT count(dq_offer(%s, 'c' || i, 'x'::text, %s, expires_at => %s, after => %s::jsonb))"
              " FROM generate_series(1, 5) i", (Q, LONG_AGO, LONG_AGO + timedelta(days=1), json.dumps([[P, "A"]])))
    ack_parent(c)
    assert set(blocked(c)) == {"c4", "c5"}
    if how == "cancelled":
        assert c.execute("SELECT dq_cancel(%s, 'c4')", (Q,)).fetchone() == (True,)
        assert dependency_rows(c) == [("A", "c5")]
        assert c.execute("SELECT dq_release_backlog()").fetchone() == (1,)
        assert released(c) == {"c1", "c2", "c3", "c5"}
    elif how == "expired":
        # released past its expiry, it expires at the poll that reaches it
        assert c.execute("SELECT dq_release_backlog()").fetchone() == (2,)
        assert poll(c, Q) == {}
        assert released(c) == set()
    else:
        c.execute("SELECT dq_purge(%s, confirm => true)", (Q,))
        assert c.execute("SELECT dq_release_backlog()").fetchone() == (0,)
        assert released(c) == set()
    assert dependency_rows(c) == [] and backlog(c) == [] and blocked(c) == {}
    assert c.execute("SELECT count(*) FROM dq_messages WHERE key = 'c4'").fetchone() == (0,)


def test_ack_many_shares_one_budget(small: psycopg.Connection[Any]) -> None:
    c = small
    offer(c, P, "A")
    offer(c, P, "B")
    children(c, 2, "A", "a")
    children(c, 2, "B", "b")
    tokens = poll(c, P)
    assert c.execute("SELECT dq_ack_many(%s)", ([tokens["A"], tokens["B"]],)).fetchone() == (2,)
    assert released(c) == {"a1", "a2", "b1"}
    assert backlog(c) == [(P, "B", *ids(c, "b1", "b2"))]
    poll(c, "elsewhere")
    assert released(c) == {"a1", "a2", "b1", "b2"}


def test_a_child_of_two_parents_counts_each_once(small: psycopg.Connection[Any]) -> None:
    c = small
    offer(c, P, "A")
    offer(c, P, "B")
    children(c, 3, "A", "a")
    offer(c, Q, "both", after=[[P, "A"], [P, "B"]])  # the 4th child of A: in the backlog
    tokens = poll(c, P)
    c.execute("SELECT dq_ack(%s)", (tokens["A"],))
    assert blocked(c) == {"both": 2}
    c.execute("SELECT dq_ack(%s)", (tokens["B"],))  # B's own release: one of its two parents
    assert blocked(c) == {"both": 1}
    assert c.execute("SELECT dq_release_backlog()").fetchone() == (1,)
    assert blocked(c) == {} and dependency_rows(c) == []


def test_bad_max_children(small: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="max_children"):
        small.execute("SELECT dq_release_backlog(NULL)")
    for bad in (0, 1000001):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="dq_release_backlog: max_children"):
            small.execute("SELECT dq_release_backlog(%s)", (bad,))


# --------------------------------------------------------------------------- concurrency


def test_two_runners_take_different_rows_and_never_wait(small: psycopg.Connection[Any], dsn: str) -> None:
    c = small
    for p in ("A", "B"):
        offer(c, P, p)
        children(c, 6, p, p.lower())
    tokens = poll(c, P)
    for t in tokens.values():
        c.execute("SELECT dq_ack(%s)", (t,))
    assert len(backlog(c)) == 2 and len(blocked(c)) == 6
    with psycopg.connect(dsn) as r1, psycopg.connect(dsn) as r2:
        assert r1.execute("SELECT dq_release_backlog(3)").fetchone() == (3,)  # holds A's row, open
        r2.execute("SET lock_timeout = '2s'")
        start = time.monotonic()
        assert r2.execute("SELECT dq_release_backlog()").fetchone() == (3,)  # B's row: SKIP LOCKED
        assert r2.execute("SELECT dq_release_backlog()").fetchone() == (0,)  # A's row is r1's: passed over
        assert time.monotonic() - start < 1.0
        r2.commit()
        assert r2.execute("SELECT count(*) FROM dq_release_backlog").fetchone() == (1,)  # A's, locked by r1
        r1.commit()
    assert blocked(c) == {} and backlog(c) == [] and dependency_rows(c) == []
    assert len(released(c)) == 12


def test_polls_and_the_job_at_once_release_each_child_once(small: psycopg.Connection[Any], dsn: str) -> None:
    c = small
    offer(c, P, "A")
    children(c, 300)
    ack_parent(c)
    errors: list[BaseException] = []
    counts: list[int] = []

    def run(kind: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as r:
                for _ in range(1000):
                    if r.execute("SELECT count(*) FROM dq_release_backlog").fetchone() == (0,):
                        break
                    if kind == "job":
                        counts.append(r.execute("SELECT dq_release_backlog(7)").fetchone()[0])  # type: ignore[index]
                    else:
                        r.execute("SELECT * FROM dq_poll_many('nobody', 1)").fetchall()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in ("job", "job", "poll", "poll")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert blocked(c) == {} and backlog(c) == [] and dependency_rows(c) == []
    assert c.execute("SELECT count(*), min(parents_pending), max(parents_pending) FROM dq_messages WHERE queue = %s",
                     (Q,)).fetchone() == (300, 0, 0)
    assert sum(counts) <= 297
