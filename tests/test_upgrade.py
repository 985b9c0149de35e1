"""Upgrading a live database from the previous release (pgmq's upgrade job).

``tests/upgrade/pgdelayq-<version>-db.tar.gz`` holds the previous release's ``migrations/`` and
``sql/`` (made with ``git archive v<version> migrations sql``; ``make release-snapshot`` refreshes
it when a release is tagged). The test installs that release, puts messages in every state
(scheduled, ready, in flight, dead letter), then upgrades step by step with this tree's
installer, checking after every schema step that every public function of the old release can
still be called: a rolling deploy runs old workers against the database during the upgrade, so no
step may remove or break a function they call (a signature change adds the new function; the
old one goes away only in a later release). The one exception is ``REMOVED``: an old signature
whose presence breaks calls of another one (its replacement is named beside it, and docs/api.md
tells operators to stop older workers before migrating); it goes away with the final apply of
``sql/``, never in a schema step. At the end the database must equal a fresh install
(schema dump) and the messages must be intact and usable with their old lock tokens.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlhelpers import schema_dump
from test_migrations import new_database, schema_steps  # noqa: F401  (fixture)
from yoyo import get_backend, read_migrations

from pyqueue.migrate import migrate, yoyo_uri

# Old signature -> its replacement. dq_ack(uuid[]) made a quoted token ambiguous for dq_ack(uuid)
# ("function dq_ack(unknown) is not unique"); dq_ack_many(uuid[]) replaces it.
REMOVED = {"dq_ack(uuid[])": "dq_ack_many(uuid[])"}

SNAPSHOTS = sorted((Path(__file__).resolve().parent / "upgrade").glob("pgdelayq-*-db.tar.gz"))


def test_a_previous_release_snapshot_exists() -> None:
    assert SNAPSHOTS, "tests/upgrade/ holds no previous release"


def install_release(snapshot: Path, dsn: str, into: Path) -> None:
    with tarfile.open(snapshot) as tar:
        tar.extractall(into, filter="data")
    backend = get_backend(yoyo_uri(dsn))
    try:
        with backend.lock():
            backend.apply_migrations(backend.to_apply(read_migrations(str(into / "migrations"))))
    finally:
        backend.connection.close()


def signature_types(signature: str) -> str:
    """'dq_nack(uuid,interval,text)' -> '{uuid,interval,text}' (a regtype[] literal)."""
    inner = signature[signature.index("(") + 1:-1]
    return "{" + ",".join(f'"{t}"' for t in inner.split(",") if t) + "}"


def public_functions(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'public' AND p.proname LIKE 'dq\\_%' AND p.proname NOT LIKE 'dq\\_\\_%' ORDER BY 1")]


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.name.split("-")[1])
def test_upgrade_from_previous_release_keeps_messages_and_functions(
    snapshot: Path, template_dsn: str, new_database, tmp_path: Path  # noqa: F811
) -> None:
    dsn = new_database()
    install_release(snapshot, dsn, tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        old_functions = public_functions(conn)
        assert "dq_offer(text,text,bytea,timestamp with time zone,boolean,text)" in old_functions
        old_steps = {r[0] for r in conn.execute("SELECT migration_id FROM _yoyo_migration")}
        # Messages in every state, written by the old release's functions.
        conn.execute("SELECT dq_configure_queue('poison', 1, 'poison.dead')")
        conn.execute("SELECT dq_offer('poison', 'p', 'x')")
        (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('poison', 1, '1 minute')").fetchone()
        conn.execute("SELECT dq_nack(%s, '0 seconds', 'boom')", (token,))
        assert conn.execute("SELECT count(*) FROM dq_poll_many('poison', 1, '1 minute')").fetchone()[0] == 0
        conn.execute("SELECT dq_offer('jobs', 'later', 'x', now() + interval '1 hour')")
        conn.execute("SELECT dq_offer('jobs', 'ready', 'x', now() - interval '1 second')")
        conn.execute("SELECT dq_offer('jobs', 'inflight', 'x', now() - interval '2 seconds')")
        (key, token) = conn.execute("SELECT key, lock_token FROM dq_poll_many('jobs', 1, '1 minute')").fetchone()
        assert key == "inflight"
        # Times the old release accepted and no client can read (issue 12): the upgrade clamps them.
        conn.execute("SELECT dq_offer('times', 'minus', 'x', '-infinity')")
        conn.execute("SELECT dq_offer('times', 'plus', 'x', 'infinity')")
        before = conn.execute(
            "SELECT queue, key, delivery_count, last_error FROM dq_messages ORDER BY queue, key").fetchall()
        assert ("poison.dead", "p", 1, "boom") in before

    new_steps = [s for s in schema_steps() if s not in old_steps]
    assert new_steps, "this tree adds no schema step over the release: nothing to upgrade"
    for step in new_steps:
        assert migrate(dsn, up_to=step) == [step]
        with psycopg.connect(dsn, autocommit=True) as conn:
            missing = [f for f in old_functions if conn.execute("SELECT to_regprocedure(%s)", (f,)).fetchone()[0]
                       is None]
            assert missing == [], f"after {step}, old workers would fail calling {missing}"
    migrate(dsn)

    with psycopg.connect(dsn, autocommit=True) as conn:
        # An old signature may have been replaced by one with more, defaulted, parameters (in one
        # transaction of 9999_sql): every old call form must still resolve, with the same types.
        unresolved = [f for f in old_functions if not conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_proc p WHERE p.oid = to_regprocedure(%s)) OR EXISTS ("
            " SELECT 1 FROM pg_proc p WHERE p.proname = split_part(%s, '(', 1)"
            "   AND (p.proargtypes::oid[])[0:cardinality(%s::regtype[]) - 1] = %s::regtype[]::oid[]"
            "   AND p.pronargs - cardinality(%s::regtype[]) <= p.pronargdefaults)",
            (f, f, *[signature_types(f)] * 3)).fetchone()[0]]
        assert unresolved == [f for f in old_functions if f in REMOVED], unresolved
        assert all(conn.execute("SELECT to_regprocedure(%s)", (REMOVED[f],)).fetchone()[0] for f in unresolved)
        after = conn.execute(
            "SELECT queue, key, delivery_count, last_error FROM dq_messages ORDER BY queue, key").fetchall()
        assert after == before
        assert conn.execute("SELECT dq_ack(%s::uuid)", (token,)).fetchone()[0] is True  # the old token holds
        (ready,) = conn.execute("SELECT key FROM dq_poll_many('jobs', 5, '1 minute')").fetchall()
        assert ready == ("ready",)
        assert conn.execute("SELECT dq_redrive('poison.dead')").fetchone()[0] == 1
        times = conn.execute("SELECT key, scheduled_at, scheduled_at_initially FROM dq_messages "
                             "WHERE queue = 'times' ORDER BY key").fetchall()  # decoded by psycopg: readable
        assert [(k, a.year, b.year) for k, a, b in times] == [("minus", 1, 1), ("plus", 9999, 9999)]
        assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('times', 5, '1 minute')")] == ["minus"]
    assert schema_dump(dsn) == schema_dump(template_dsn)
