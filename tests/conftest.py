"""Fixtures shared by every test folder: a real PostgreSQL server with pg_cron (never a mock), one
template database built by the real installer, and a fresh copy of it per test that needs one (see
pyqueue.testing).

* ``dsn``, ``conn``, ``clock``, ``login``: this test's own database, a connection to it, its queue
  clock, login roles made for it.
* ``module_dsn``, ``module_conn``, ``module_clock``: one database shared by the tests of a module,
  for single-session SQL tests where a copy per test costs more than the test; ``module_conn``
  empties the queue tables before each test.
* ``new_database``: empty databases (no installer run), for the installer's own tests.
* ``q`` and ``kind``: the test runs twice, with the sync and with the asyncio client.

The modules the tests share (helpers, worker handlers, the blocking view of the asyncio API) are
in tests/support, on the import path (pyproject.toml's ``pythonpath``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from blocking import Blocking, EventLoopThread
from clock import TestClock
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlhelpers import clean_connection, cloned_database

from pyqueue import DelayedQueue, testing
from pyqueue.aio import AsyncDelayedQueue


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    """DSN of a database on the test server from which databases can be created."""
    dsn = testing.server_dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
    return dsn


@pytest.fixture(scope="session")
def template_dsn(admin_dsn: str) -> str:
    """A database installed by pyqueue.migrate, the template of every test database."""
    name = f"dq_template_{os.getpid()}"
    dsn = testing.create_template(admin_dsn, name)
    yield dsn  # type: ignore[misc]
    testing.drop_database(admin_dsn, name)


@pytest.fixture
def dsn(admin_dsn: str, template_dsn: str) -> Iterator[str]:
    """A fresh database (a copy of the template) for this test only."""
    template = conninfo_to_dict(template_dsn)["dbname"]
    dsn = testing.clone_database(admin_dsn, str(template))
    yield dsn
    testing.drop_database(admin_dsn, str(conninfo_to_dict(dsn)["dbname"]))


@pytest.fixture
def new_database(admin_dsn: str) -> Iterator[Callable[[], str]]:
    """Factory of empty databases (no installer run), dropped after the test."""
    names: list[str] = []

    def make() -> str:
        name = f"dq_mig_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        names.append(name)
        return testing.with_dbname(admin_dsn, name)

    yield make
    for name in names:
        testing.drop_database(admin_dsn, name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to this test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="module")
def module_dsn(admin_dsn: str, template_dsn: str) -> Iterator[str]:
    """One installed database shared by the tests of a module (single-session SQL tests, where a
    fresh copy per test would cost more than the test)."""
    with cloned_database(admin_dsn, template_dsn) as dsn:
        yield dsn


@pytest.fixture
def module_conn(module_dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the module's shared database (``module_dsn``), its queue tables
    emptied before the test."""
    with clean_connection(module_dsn) as c:
        yield c


@pytest.fixture
def login(dsn: str, conn: psycopg.Connection) -> Iterator[Callable[[str], str]]:
    """``login(role)``: the DSN of a new LOGIN role that is a member of ``role`` (dq_producer,
    dq_consumer, dq_admin) and has nothing else. Roles are cluster-wide: uniquely named, dropped
    after the test with what they own."""
    made: list[str] = []

    def make(role: str) -> str:
        name = f"login_{role}_{uuid.uuid4().hex[:8]}"
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' IN ROLE {}").format(
            sql.Identifier(name), sql.Identifier(role)))
        made.append(name)
        return make_conninfo(dsn, user=name, password="pw")

    yield make
    for name in made:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def clock(dsn: str) -> Iterator[TestClock]:
    """The queue's clock of this test's database, which the test moves (``clock.advance(seconds)``)
    instead of sleeping; see tests/support/clock.py."""
    c = TestClock(dsn)
    yield c
    c.close()


@pytest.fixture
def module_clock(module_dsn: str) -> Iterator[TestClock]:
    """The queue's clock of the module's shared database (``module_dsn``), restored after the test."""
    c = TestClock(module_dsn)
    yield c
    c.uninstall()
    c.close()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which client a test opens: ``"sync"`` (:class:`pyqueue.DelayedQueue`) or ``"async"``
    (:class:`pyqueue.aio.AsyncDelayedQueue`); the test runs once with each."""
    return str(request.param)


@pytest.fixture(params=["sync", "async"])
def q(request: pytest.FixtureRequest, dsn: str) -> Iterator[DelayedQueue]:
    """The queue "emails" of this test's database, once through :class:`pyqueue.DelayedQueue` and
    once through :class:`pyqueue.aio.AsyncDelayedQueue` (its blocking view, tests/support/blocking.py), so
    one test checks both clients."""
    if request.param == "sync":
        with DelayedQueue(dsn, "emails") as queue:
            yield queue
        return
    runner = EventLoopThread()
    try:
        with Blocking(AsyncDelayedQueue(dsn, "emails"), runner) as queue:
            yield queue  # type: ignore[misc]
    finally:
        runner.close()
