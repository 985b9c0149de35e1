"""A clock the test controls, for the database functions of one test database.

Every ``dq_*`` function reads the time through two internal functions of the private schema,
``dq__now()`` (the start of the transaction) and ``dq__clock()`` (the current instant); in an install
they are ``now()`` and ``clock_timestamp()`` and nothing can shift them. :class:`TestClock` replaces
both, as the owner of a test database, with readings that add an offset kept in a table of the
private schema, so that a test moves time forward (lock expiry, due times, schedules) instead of
sleeping. The offset is read at every statement, by every session of the database (workers in other
processes included). Application roles can neither use that schema nor replace the functions:
``tests/core/test_clock.py`` proves it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

INSTALL = sql.SQL("""
CREATE TABLE IF NOT EXISTS {private}.dq__test_clock (shift interval NOT NULL);
INSERT INTO {private}.dq__test_clock (shift)
SELECT interval '0' WHERE NOT EXISTS (SELECT FROM {private}.dq__test_clock);
CREATE OR REPLACE FUNCTION {private}.dq__now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.now() + (SELECT c.shift FROM {private}.dq__test_clock c) $$;
CREATE OR REPLACE FUNCTION {private}.dq__clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT pg_catalog.clock_timestamp() + (SELECT c.shift FROM {private}.dq__test_clock c) $$;
""")

#: The definitions of the clock functions as installed, saved before they are replaced.
DEFINITIONS = sql.SQL(
    "SELECT pg_get_functiondef(p.oid) FROM pg_proc p "
    "WHERE p.pronamespace = {private_name}::regnamespace AND p.proname IN ('dq__now', 'dq__clock')")


class TestClock:
    """The queue's clock of the database at ``dsn`` (an install in ``schema``), shifted by an offset
    this test sets. Connects as the DSN's user, which must own the install (the test databases'
    owner). Starts at offset 0: the server's time."""

    __test__ = False  # not a pytest test class

    def __init__(self, dsn: str, schema: str = "public") -> None:
        self._conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
        self._private = sql.Identifier(f"{schema}_internal")
        self._installed = [row[0] for row in self._conn.execute(
            DEFINITIONS.format(private_name=sql.Literal(f"{schema}_internal"))).fetchall()]
        self._conn.execute(INSTALL.format(private=self._private))

    @property
    def shift(self) -> timedelta:
        """How far the queue's clock is ahead of the server's."""
        row = self._conn.execute(
            sql.SQL("SELECT shift FROM {}.dq__test_clock").format(self._private)).fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    def advance(self, delta: timedelta | float) -> None:
        """Move the queue's clock forward by ``delta`` (a timedelta, or seconds); every session sees it
        from its next statement."""
        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=delta)
        self._conn.execute(
            sql.SQL("UPDATE {}.dq__test_clock SET shift = shift + %s").format(self._private), (delta,))

    def now(self) -> datetime:
        """The queue's time, ``dq_now()``, in a transaction of its own."""
        row = self._conn.execute("SELECT dq_now()").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    def uninstall(self) -> None:
        """Restore the server's clock (the definitions saved before the replacement) and drop the offset."""
        for definition in self._installed:
            self._conn.execute(definition)  # type: ignore[arg-type]
        self._conn.execute(sql.SQL("DROP TABLE IF EXISTS {}.dq__test_clock").format(self._private))

    def close(self) -> None:
        self._conn.close()
