"""A client's first connection fails fast, with the server's own reason, as
:class:`pyqueue.ConnectionFailed`; its pool retries in the background only after a first success.

Before, a wrong DSN made the first call wait for the pool's 30 s timeout while the pool logged the
same failure again and again, and raised a ``DatabaseError`` saying only ``couldn't get a connection
after 30.00 sec``. Every case here is a real bad DSN against the test server (a wrong password for a
real role, an unknown database or role, a role without the CONNECT privilege or over its connection
limit, a closed port on 127.0.0.1, a host name that does not resolve), for
:class:`pyqueue.DelayedQueue` and :class:`pyqueue.aio.AsyncDelayedQueue`, their workers and
``pyqueue worker``. The password cases need a server that asks members of ``test_password_auth``
for their password (``scripts/localpg.sh`` sets that rule up; Docker's image asks everyone)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from workerhandlers import HANG_S, SUPPORT, cut_all, read_until

import pyqueue
from pyqueue import ConnectionFailed, DatabaseError, DelayedQueue, Worker
from pyqueue.aio import AsyncDelayedQueue, AsyncWorker

#: A refused first connection is reported within this many seconds (it took 30 s before).
FAST_S = 5.0
PASSWORD_GROUP = "test_password_auth"


def first_call(kind: str, conninfo: str) -> Any:
    """Open a queue on ``conninfo`` the usual way (``with`` / ``async with``) and make its first call."""
    if kind == "sync":
        with DelayedQueue(conninfo, "emails") as q:
            return q.stats()

    async def main() -> Any:
        async with AsyncDelayedQueue(conninfo, "emails") as q:
            return await q.stats()

    return asyncio.run(main())


def refused(kind: str, conninfo: str, caplog: pytest.LogCaptureFixture) -> ConnectionFailed:
    """The :class:`ConnectionFailed` of a first call on ``conninfo``, checked to come fast, to
    carry psycopg's error as its cause, and to leave no pool retrying (and logging) behind."""
    caplog.set_level(logging.INFO, logger="psycopg.pool")
    start = time.monotonic()
    with pytest.raises(ConnectionFailed) as info:
        first_call(kind, conninfo)
    elapsed = time.monotonic() - start
    assert elapsed < FAST_S, f"the first connection took {elapsed:.1f} s to fail"
    assert isinstance(info.value, DatabaseError) and isinstance(info.value, pyqueue.PyQueueError)
    assert isinstance(info.value, ConnectionError)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg.pool")] == []
    return info.value


def role_of(conninfo: str) -> str:
    return str(conninfo_to_dict(conninfo)["user"])


def password_role(conn: psycopg.Connection, login: Callable[[str], str]) -> str:
    """A new dq_admin login (password ``pw``) that the server asks for its password."""
    conn.execute(sql.SQL(
        "DO $$ BEGIN CREATE ROLE {} NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    ).format(sql.Identifier(PASSWORD_GROUP)))
    right = login("dq_admin")
    conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(PASSWORD_GROUP), sql.Identifier(role_of(right))))
    return right


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that is bound but not listening: every connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


# -- the server's reason, typed --------------------------------------------------------------------

def test_wrong_password(kind: str, conn, login, caplog) -> None:
    right = password_role(conn, login)
    wrong = make_conninfo(right, password="not-the-password")
    try:
        psycopg.connect(wrong).close()
    except psycopg.OperationalError:
        pass
    else:
        pytest.fail(f"the test server trusts members of {PASSWORD_GROUP}: see this module's docstring")
    assert first_call(kind, right).queue == "emails"  # the right password connects
    err = refused(kind, wrong, caplog)
    assert err.sqlstate == "28P01" and err.permanent is True
    assert f'password authentication failed for user "{role_of(right)}"' in str(err)
    assert "not-the-password" not in str(err)


def test_unknown_database(kind: str, dsn: str, caplog) -> None:
    name = f"no_such_db_{uuid.uuid4().hex[:8]}"
    err = refused(kind, make_conninfo(dsn, dbname=name), caplog)
    assert err.sqlstate == "3D000" and err.permanent is True
    assert f'database "{name}" does not exist' in str(err)


def test_unknown_role(kind: str, dsn: str, caplog) -> None:
    name = f"no_such_role_{uuid.uuid4().hex[:8]}"
    err = refused(kind, make_conninfo(dsn, user=name), caplog)
    assert err.sqlstate == "28000" and err.permanent is True
    assert f'role "{name}" does not exist' in str(err)


def test_role_that_may_not_log_in(kind: str, dsn: str, conn, login, caplog) -> None:
    who = login("dq_admin")
    conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role_of(who))))
    err = refused(kind, who, caplog)
    assert err.sqlstate == "28000" and err.permanent is True
    assert f'role "{role_of(who)}" is not permitted to log in' in str(err)


def test_role_without_connect_privilege(kind: str, dsn: str, conn, login, caplog) -> None:
    who = login("dq_admin")
    database = str(conninfo_to_dict(dsn)["dbname"])
    conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database)))
    err = refused(kind, who, caplog)
    assert err.sqlstate == "42501" and err.permanent is True
    assert f'permission denied for database "{database}"' in str(err)


@pytest.mark.parametrize("limited", ["role", "database"])
def test_over_a_connection_limit(kind: str, limited: str, dsn: str, conn, login, caplog) -> None:
    who = login("dq_admin")
    name = role_of(who) if limited == "role" else str(conninfo_to_dict(dsn)["dbname"])
    alter = {"role": "ALTER ROLE {} CONNECTION LIMIT 0", "database": "ALTER DATABASE {} CONNECTION LIMIT 0"}
    conn.execute(sql.SQL(alter[limited]).format(sql.Identifier(name)))
    err = refused(kind, who, caplog)
    assert err.sqlstate == "53300" and err.permanent is False
    assert f'too many connections for {limited} "{name}"' in str(err)


def test_closed_port(kind: str, closed_port: int, caplog) -> None:
    err = refused(kind, f"host=127.0.0.1 port={closed_port} dbname=dq user=postgres", caplog)
    assert err.sqlstate is None and err.permanent is False  # no server answered: it may, later
    assert f'port {closed_port} failed: Connection refused' in str(err)


def test_host_that_does_not_resolve(kind: str, caplog) -> None:
    """No time bound here: how fast a name fails to resolve is the resolver's business."""
    caplog.set_level(logging.INFO, logger="psycopg.pool")
    with pytest.raises(ConnectionFailed) as info:
        first_call(kind, "host=no-such-host.invalid dbname=dq user=postgres")
    assert info.value.sqlstate is None
    assert "no-such-host.invalid" in str(info.value)
    assert [r for r in caplog.records if r.name.startswith("psycopg.pool")] == []


def test_a_conninfo_that_is_not_one_is_an_invalid_argument(kind: str) -> None:
    with pytest.raises(pyqueue.InvalidArgument, match="conninfo_or_pool is not a libpq connection string") as info:
        first_call(kind, "this is not a dsn")
    assert info.value.sqlstate == "22023"


# -- after a failure, after a success ----------------------------------------------------------------

def test_a_failed_first_connection_is_tried_again_on_the_next_call(kind: str, conn, login) -> None:
    """A queue opened by its first call (no ``with``): a refused first connection leaves it
    unopened, and once the cause is gone the same object connects."""
    right = password_role(conn, login)
    role = role_of(right)
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD 'later'").format(sql.Identifier(role)))

    def fix() -> None:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD 'pw'").format(sql.Identifier(role)))

    if kind == "sync":
        q = DelayedQueue(right, "emails")  # no I/O yet
        try:
            with pytest.raises(ConnectionFailed) as info:
                q.offer("k", "x")
            assert info.value.sqlstate == "28P01"
            fix()
            assert q.offer("k", "x") == pyqueue.OfferOutcome.CREATED
        finally:
            q.close()
    else:
        async def main() -> None:
            q = AsyncDelayedQueue(right, "emails")
            try:
                with pytest.raises(ConnectionFailed) as info:
                    await q.offer("k", "x")
                assert info.value.sqlstate == "28P01"
                fix()
                assert await q.offer("k", "x") == pyqueue.OfferOutcome.CREATED
            finally:
                await q.close()

        asyncio.run(main())
    with DelayedQueue(right, "emails") as q:
        assert q.get("k") is not None


def test_after_a_first_success_the_pool_rides_out_cut_connections(kind: str, dsn: str) -> None:
    """Once connected, a ``pg_terminate_backend`` of every connection of the queue's pool (as a
    restart does) is the pool's to repair: only the call that finds its connection cut fails, with
    a plain :class:`DatabaseError` (not :class:`ConnectionFailed`: no first connection is made
    again), and the next one works on a new connection."""
    app = f"cut-{uuid.uuid4().hex[:8]}"
    conninfo = make_conninfo(dsn, application_name=app)

    if kind == "sync":
        with DelayedQueue(conninfo, "emails") as q:
            q.offer("k", "x")
            assert cut_all(dsn, app) >= 1
            got = [_outcome(q.get, "k") for _ in range(2)]
    else:
        async def main() -> list[str]:
            async with AsyncDelayedQueue(conninfo, "emails") as q:
                await q.offer("k", "x")
                assert cut_all(dsn, app) >= 1
                return [await _outcome_async(q.get("k")) for _ in range(2)]

        got = asyncio.run(main())
    assert got == ["DatabaseError", "found"]


def _outcome(get: Callable[[str], Any], key: str) -> str:
    try:
        return "found" if get(key) is not None else "missing"
    except ConnectionFailed:
        return "ConnectionFailed"
    except DatabaseError:
        return "DatabaseError"


async def _outcome_async(call: Any) -> str:
    try:
        return "found" if await call is not None else "missing"
    except ConnectionFailed:
        return "ConnectionFailed"
    except DatabaseError:
        return "DatabaseError"


# -- workers ---------------------------------------------------------------------------------------

def run_worker(kind: str, conninfo: str, *, stop_after: float | None = None) -> None:
    """Run a :class:`Worker` or :class:`AsyncWorker` on a queue opened by its first poll, at
    most ``FAST_S`` (or stopped after ``stop_after`` s); what ``run()`` raises propagates."""

    def handler(message: Any) -> None:
        raise AssertionError("nothing to handle")

    if kind == "sync":
        q = DelayedQueue(conninfo, "jobs")
        worker = Worker(q, handler, idle_check=0.5)
        if stop_after is not None:
            threading.Timer(stop_after, worker.stop).start()
        errors: list[BaseException] = []
        t = threading.Thread(target=lambda: errors.extend(_run_catching(worker)), daemon=True)
        t.start()
        t.join(FAST_S)
        in_time = not t.is_alive()
        if not in_time:
            worker.stop()
            t.join(HANG_S)
        q.close()
        if errors:
            raise errors[0]
        assert in_time, f"the worker ran past {FAST_S} s"
        return

    async def handle(message: Any) -> None:
        handler(message)

    async def main() -> None:
        q = AsyncDelayedQueue(conninfo, "jobs")
        worker = AsyncWorker(q, handle, idle_check=0.5)
        if stop_after is not None:
            asyncio.get_running_loop().call_later(stop_after, worker.stop)
        try:
            await asyncio.wait_for(worker.run(install_signal_handlers=False), FAST_S)
        finally:
            await q.close()

    asyncio.run(main())


def _run_catching(worker: Worker) -> list[BaseException]:
    try:
        worker.run(install_signal_handlers=False)
    except BaseException as exc:  # handed to the test's thread
        return [exc]
    return []


def test_worker_ends_at_once_when_its_first_connection_is_refused_for_good(kind: str, dsn: str) -> None:
    """A worker on a queue never connected, whose first connection the server refuses for a reason
    a retry does not change (here an unknown database): :meth:`run` raises :class:`ConnectionFailed`
    at once instead of a retry loop."""
    name = f"no_such_db_{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    with pytest.raises(ConnectionFailed, match=f'database "{name}" does not exist') as info:
        run_worker(kind, make_conninfo(dsn, dbname=name))
    assert time.monotonic() - start < FAST_S
    assert info.value.sqlstate == "3D000" and info.value.permanent


def test_worker_waits_for_a_server_that_does_not_answer_yet(kind: str, closed_port: int, caplog) -> None:
    """No server answering (a closed port, as during a restart) may pass: the worker retries its
    polls, logging the reason at once, until stopped."""
    caplog.set_level(logging.WARNING)
    run_worker(kind, f"host=127.0.0.1 port={closed_port} dbname=dq user=postgres", stop_after=1.5)
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("poll failed (attempt 1:")]
    assert len(failed) == 1 and f"port {closed_port} failed: Connection refused" in failed[0], failed
    assert [r for r in caplog.records if r.name.startswith("psycopg.pool")] == []


@pytest.mark.parametrize("mode", [[], ["--async"]], ids=["sync", "async"])
def test_pyqueue_worker_with_a_wrong_database_ends_with_one_error_line(dsn: str, mode: list[str]) -> None:
    """``pyqueue worker`` logs its start and stop (INFO), tries no second poll, and ends with the
    reason on one line and status 2: no traceback, no retry."""
    name = f"no_such_db_{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pyqueue", "worker", "--dsn", make_conninfo(dsn, dbname=name), "--queue", "jobs",
         *mode, "workerhandlers:record"],
        cwd=SUPPORT, env=dict(os.environ), capture_output=True, text=True, timeout=60,
    )
    assert time.monotonic() - start < FAST_S + 5  # the interpreter's start-up besides the connection
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert f'database "{name}" does not exist' in lines[-1] and "(SQLSTATE 3D000)" in lines[-1], proc.stderr
    assert lines[-1].startswith("pyqueue: connection failed: ")
    assert [line for line in lines[:-1] if " INFO " not in line] == [], proc.stderr  # no warning, no traceback


@pytest.mark.parametrize("mode", [[], ["--async"]], ids=["sync", "async"])
def test_pyqueue_worker_waits_for_a_server_that_does_not_answer_yet(closed_port: int, mode: list[str]) -> None:
    """A server not answering may be restarting: ``pyqueue worker`` keeps polling, logging the
    reason from the first attempt on, and a SIGTERM stops it as usual (status 0)."""
    nobody = f"host=127.0.0.1 port={closed_port} dbname=dq user=postgres"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyqueue", "worker", "--dsn", nobody, "--queue", "jobs", *mode, "workerhandlers:record"],
        cwd=SUPPORT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        out = read_until(proc, "poll failed (attempt 1: ")
        assert f"port {closed_port} failed: Connection refused" in out.splitlines()[-1]
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=HANG_S)
        assert proc.returncode == 0, out + rest
        assert "Traceback" not in out + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=HANG_S)
