"""The queue's clock: every function reads the time through ``dq__now()`` / ``dq__clock()`` of the
private schema. In an install they are the server's clock and no application role can shift them; in
a test database the owner replaces them (tests/support/clock.py) and moving that clock moves every function:
lock expiry, due times, nack delays, waits and schedules, without sleeping."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from clock import TestClock
from psycopg import errors, sql

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"


def test_no_function_reads_the_server_clock_directly() -> None:
    """Only the two clock functions call now() or clock_timestamp(): a new function that read the
    server's clock would escape the test clock (and a test of it would race real time)."""
    offenders = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("--", 1)[0]
            if re.search(r"(?<![\w.])(now|clock_timestamp|statement_timestamp|transaction_timestamp)\(\)", code) \
                    or re.search(r"\bcurrent_timestamp\b|\blocaltimestamp\b", code, re.I):
                if not code.lstrip().startswith("'") and "COMMENT ON" not in code:
                    offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []


def test_an_install_reads_the_server_clock(conn: psycopg.Connection[Any]) -> None:
    bodies = dict(conn.execute(
        "SELECT p.proname, btrim(p.prosrc) FROM pg_proc p "
        "WHERE p.pronamespace = 'public_internal'::regnamespace AND p.proname IN ('dq__now', 'dq__clock')"
    ).fetchall())
    assert bodies == {"dq__now": "SELECT pg_catalog.now()", "dq__clock": "SELECT pg_catalog.clock_timestamp()"}
    with conn.transaction():
        assert conn.execute("SELECT dq_now() = now()").fetchone() == (True,)
    assert conn.execute("SELECT to_regclass('public_internal.dq__test_clock')").fetchone() == (None,)


PLANT = [
    # replace the private clock: no USAGE on the private schema
    "CREATE OR REPLACE FUNCTION public_internal.dq__now() RETURNS timestamptz LANGUAGE sql "
    "AS $$ SELECT now() + interval '1 day' $$",
    "CREATE OR REPLACE FUNCTION public_internal.dq__clock() RETURNS timestamptz LANGUAGE sql "
    "AS $$ SELECT clock_timestamp() + interval '1 day' $$",
    # shadow it in the install schema: no CREATE there
    "CREATE FUNCTION public.dq__now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT now() + interval '1 day' $$",
    "CREATE FUNCTION public.dq__clock() RETURNS timestamptz LANGUAGE sql "
    "AS $$ SELECT clock_timestamp() + interval '1 day' $$",
    # change the public one: only its owner may
    "CREATE OR REPLACE FUNCTION public.dq_now() RETURNS timestamptz LANGUAGE sql "
    "AS $$ SELECT now() + interval '1 day' $$",
    "ALTER FUNCTION public.dq_now() RENAME TO dq_now_old",
    "ALTER FUNCTION public_internal.dq__clock() SET search_path = pg_temp",
]


def assert_the_server_clock_is_used(conn: psycopg.Connection[Any], app: psycopg.Connection[Any], role: str) -> None:
    """As ``role`` (on ``app``), the functions read the server's clock: dq_now() is now(), a default
    offer is due at the server's time, and the message 'later' (offered due in an hour) is not
    polled, and is reported due in the future."""
    with app.transaction():
        assert app.execute("SELECT dq_now() = pg_catalog.now()").fetchone() == (True,)
        if role in ("dq_producer", "dq_admin"):
            assert app.execute("SELECT dq_offer('q', 'default-time', 'x'::bytea)").fetchone() == ("created",)
    if role in ("dq_producer", "dq_admin"):
        row = conn.execute(
            "SELECT scheduled_at <= clock_timestamp(), scheduled_at = created_at FROM dq_messages "
            "WHERE key = 'default-time'").fetchone()
        assert row == (True, True)
    if role in ("dq_consumer", "dq_admin"):
        # a clock a day ahead would deliver the message due in an hour
        assert app.execute("SELECT count(*) FROM dq_poll_many('later', 10)").fetchone() == (0,)
        assert app.execute("SELECT dq_next_due('later') > pg_catalog.clock_timestamp()").fetchone() == (True,)


@pytest.mark.parametrize("role", ["dq_producer", "dq_consumer", "dq_admin"])
def test_no_application_role_can_shift_the_clock(conn: psycopg.Connection[Any], login: Any, role: str) -> None:
    """Each application role tries every way to move the clock the functions read: replacing or
    altering the clock functions (42501, nothing changed), shadowing them in a schema of its
    search_path or in pg_temp (allowed, and never used: the functions' search_path is pinned and
    functions are never looked up in pg_temp), and the test clock's table where one exists."""
    conn.execute("SELECT dq_offer('later', 'k', 'x'::bytea, clock_timestamp() + interval '1 hour')")
    with psycopg.connect(login(role), autocommit=True) as app:
        for statement in PLANT:
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute(statement)
        # pg_temp is writable by every role: plant the clock there and put it first on the path.
        for name in ("dq__now", "dq__clock", "dq_now", "now", "clock_timestamp"):
            app.execute(f"CREATE FUNCTION pg_temp.{name}() RETURNS timestamptz LANGUAGE sql "
                        "AS $$ SELECT pg_catalog.clock_timestamp() + interval '1 day' $$")
        app.execute("SET search_path = pg_temp, public")
        assert_the_server_clock_is_used(conn, app, role)
    with conn.transaction():
        assert conn.execute("SELECT dq_now() = now()").fetchone() == (True,)
    test_an_install_reads_the_server_clock(conn)

    # With a test clock installed, its offset is out of every application role's reach too.
    clock = TestClock(conn.info.dsn)
    try:
        with psycopg.connect(login(role), autocommit=True) as app:
            for statement in ("UPDATE public_internal.dq__test_clock SET shift = interval '1 day'",
                              "SELECT shift FROM public_internal.dq__test_clock"):
                with pytest.raises(errors.InsufficientPrivilege):
                    app.execute(statement)
        assert clock.shift == timedelta(0)
    finally:
        clock.close()


@pytest.mark.parametrize("role", ["dq_producer", "dq_consumer", "dq_admin"])
def test_a_role_that_may_create_in_the_install_schema_cannot_shift_the_clock(
        conn: psycopg.Connection[Any], login: Any, role: str) -> None:
    """A role with CREATE on the install schema (as the database owner has on public under
    PostgreSQL 15, and PUBLIC before 15) may create clock twins there, a day ahead; the functions
    search their private schema first, so the twins are never used."""
    conn.execute("SELECT dq_offer('later', 'k', 'x'::bytea, clock_timestamp() + interval '1 hour')")
    dsn = login(role)
    app_role = psycopg.conninfo.conninfo_to_dict(dsn)["user"]
    conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(str(app_role))))
    with psycopg.connect(dsn, autocommit=True) as app:
        app.execute("CREATE FUNCTION public.dq__now() RETURNS timestamptz LANGUAGE sql "
                    "AS $$ SELECT pg_catalog.now() + interval '1 day' $$")
        app.execute("CREATE FUNCTION public.dq__clock() RETURNS timestamptz LANGUAGE sql "
                    "AS $$ SELECT pg_catalog.clock_timestamp() + interval '1 day' $$")
        assert app.execute("SELECT public.dq__now() > now() + interval '23 hours'").fetchone() == (True,)
        assert_the_server_clock_is_used(conn, app, role)
    conn.execute("DROP FUNCTION public.dq__now(), public.dq__clock()")
    test_an_install_reads_the_server_clock(conn)


def test_moving_the_clock_moves_every_function(conn: psycopg.Connection[Any], clock: TestClock) -> None:
    """Due times, lock expiry, nack delays, extend, next-due and waits follow the test clock."""
    def one(query: str, *params: Any) -> Any:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        return row[0] if len(row) == 1 else row

    before = clock.now()
    clock.advance(timedelta(days=3))
    assert clock.now() - before >= timedelta(days=3)
    # the default due time is the shifted time; a delay counts from it
    assert one("SELECT dq_offer('q', 'now', 'x'::bytea)") == "created"
    assert one("SELECT scheduled_at - clock_timestamp() > interval '2 days' FROM dq_messages WHERE key = 'now'")
    assert one("SELECT dq_offer('q', 'in-10-min', 'x'::bytea, dq_now() + interval '10 minutes')") == "created"
    assert one("SELECT dq_next_due('q') <= dq_now()")

    poll = "SELECT key, lock_token, delivery_count FROM dq_poll_many('q', 10, interval '30 seconds')"
    polled = conn.execute(poll).fetchall()
    assert [(k, d) for k, _, d in polled] == [("now", 1)]
    token = polled[0][1]
    # the lock holds until the clock passes it...
    clock.advance(29)
    assert one("SELECT count(*) FROM dq_poll_many('q', 10, interval '30 seconds')") == 0
    # extend counts from the (shifted) current instant: the new deadline is 60 s after it
    assert one("SELECT dq_extend(%s::uuid, interval '60 seconds') - dq_now() "
               "BETWEEN interval '60 s' AND interval '70 s'", token) is True
    clock.advance(59)
    assert one("SELECT count(*) FROM dq_poll_many('q', 10, interval '30 seconds')") == 0
    # ...and expires when it does: redelivered, the old token is refused
    clock.advance(2)
    again = conn.execute(poll).fetchall()
    assert [(k, d) for k, _, d in again] == [("now", 2)]
    assert one("SELECT dq_ack(%s::uuid)", token) is False
    # nack with a delay: due again only when the clock reaches it
    assert one("SELECT dq_nack(%s::uuid, interval '5 minutes', 'boom')", again[0][1]) is True
    assert one("SELECT count(*) FROM dq_poll_many('q', 10)") == 0
    assert one("SELECT dq_wait('q', interval '1 hour') BETWEEN interval '4 minutes' AND interval '5 minutes'")
    clock.advance(timedelta(minutes=5))
    # both are due now: the nacked one and the one offered for +10 min (at most 10 min have passed)
    assert one("SELECT count(*) FROM dq_poll_many('q', 10)") == 1
    clock.advance(timedelta(minutes=5))
    assert one("SELECT array_agg(key ORDER BY key) FROM dq_poll_many('q', 10)") == ["in-10-min", "now"]


def test_the_clock_is_restored(dsn: str, conn: psycopg.Connection[Any]) -> None:
    clock = TestClock(dsn)
    clock.advance(3600)
    assert conn.execute("SELECT dq_now() - now() >= interval '1 hour'").fetchone() == (True,)
    clock.uninstall()
    clock.close()
    test_an_install_reads_the_server_clock(conn)
