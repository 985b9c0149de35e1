"""Helpers shared by the database-side tests (test_sql_*, test_isolation, test_migrations, test_psql).

Nothing here mocks the database: every helper talks to the real test server.

* Table snapshots and server-clock waits (never the client's clock, never printing now()).
* :class:`RemoteSession`: a psycopg connection living in its own process, driven step by step
  from the test, so that "consumer A" and "consumer B" are really separate clients.
* :func:`run_workers`: start N processes (``spawn``), line them up on a Barrier, collect results.
* PostgreSQL client programs (``pg_dump``, ``psql``, ``pg_isolation_regress``) and a normalised
  ``pg_dump --schema-only``.
* The plans auto_explain logs for the statements inside a function; an error's CONTEXT that names
  only the function the user called.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import re
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

PROJECT = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_ISOLATION_REGRESS = Path("/usr/lib/postgresql/15/lib/pgxs/src/test/isolation/pg_isolation_regress")

SPAWN = multiprocessing.get_context("spawn")

# Every column of dq_messages, in table order: what "the table is unchanged" compares.
ALL_COLUMNS = (
    "id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, "
    "lock_token, delivery_count, created_at, priority, message_group, expires_at, headers"
)


# --------------------------------------------------------------------------- databases


@contextmanager
def cloned_database(admin_dsn: str, template_dsn: str) -> Iterator[str]:
    """A copy of the installed template for a whole test module (see :func:`clean_connection`).

    Single-session tests that only need an empty queue table share one copy and empty its
    queue tables before each test: cloning a database per test costs about 0.4 s.
    """
    from pyqueue import testing  # not at import time: spawned workers import this module

    dsn = testing.clone_database(admin_dsn, str(conninfo_to_dict(template_dsn)["dbname"]))
    try:
        yield dsn
    finally:
        testing.drop_database(admin_dsn, str(conninfo_to_dict(dsn)["dbname"]))


@contextmanager
def clean_connection(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to ``dsn`` whose queue tables (messages, groups and their queued
    settles, waiters, queue configuration, rate tokens, archive, dependencies and their release
    backlog) were just emptied."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM dq_messages")
        conn.execute("DELETE FROM dq_groups")
        conn.execute("DELETE FROM dq_group_settles")
        conn.execute("DELETE FROM dq_waiters")
        conn.execute("DELETE FROM dq_queues")
        conn.execute("DELETE FROM dq_rate_tokens")
        conn.execute("DELETE FROM dq_archive")
        conn.execute("DELETE FROM dq_dependencies")
        conn.execute("DELETE FROM dq_release_backlog")
        yield conn


# --------------------------------------------------------------------------- table and clock


def table_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Every row of dq_messages, every column, ordered by id (to compare before/after)."""
    return conn.execute(f"SELECT {ALL_COLUMNS} FROM dq_messages ORDER BY id").fetchall()  # noqa: S608


def row_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM dq_messages").fetchone()
    assert row is not None
    return int(row[0])


def message(conn: psycopg.Connection[Any], queue: str, key: str) -> dict[str, Any] | None:
    """The stored row of (queue, key), every column including lock_token, or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            f"SELECT {ALL_COLUMNS} FROM dq_messages WHERE queue = %s AND key = %s",  # noqa: S608
            (queue, key),
        )
        return cur.fetchone()


def row_of(conn: psycopg.Connection[Any], query: str, params: Any = None) -> tuple[Any, ...]:
    """The first row ``query`` returns (there must be one)."""
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return tuple(row)


def value_of(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    """The first column of the first row ``query`` returns (there must be one)."""
    return row_of(conn, query, params)[0]


def message_count(conn: psycopg.Connection[Any], queue: str, key: str | None = None) -> int:
    """How many messages ``queue`` holds (with ``key`` only, when given)."""
    return int(value_of(conn, "SELECT count(*) FROM dq_messages WHERE queue = %s AND (%s::text IS NULL OR key = %s)",
                        (queue, key, key)))


def poll_token(conn: psycopg.Connection[Any], queue: str, lock_timeout: str = "1 hour") -> Any:
    """Poll one message of ``queue`` (there must be one due) with ``lock_timeout``; its lock token."""
    rows = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 1, %s::interval)", (queue, lock_timeout)).fetchall()
    assert len(rows) == 1, rows
    return rows[0][0]


def wait_until_server_time(conn: psycopg.Connection[Any], moment: datetime, *, limit: float = 10.0) -> None:
    """Sleep until the *server's* clock_timestamp() has passed ``moment`` (a value read from the server).

    Deterministic: it does not guess how long the server needs, it asks; ``limit`` only guards
    against a hang.
    """
    deadline = time.monotonic() + limit
    while True:
        row = conn.execute(
            "SELECT clock_timestamp() > %s, extract(epoch FROM %s - clock_timestamp())", (moment, moment)
        ).fetchone()
        assert row is not None
        if row[0]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"server clock did not pass the awaited moment within {limit} s")
        time.sleep(min(max(float(row[1]), 0.0) + 0.005, 0.25))


# --------------------------------------------------------------------------- sessions in processes


class RemoteSQLError(Exception):
    """An SQL error raised in a :class:`RemoteSession`'s process."""

    def __init__(self, sqlstate: str | None, message: str) -> None:
        super().__init__(f"[{sqlstate}] {message}")
        self.sqlstate = sqlstate
        self.message = message


def _session_main(dsn: str, autocommit: bool, pipe: Any) -> None:
    try:
        conn = psycopg.connect(dsn, autocommit=autocommit, row_factory=dict_row)
    except Exception as exc:  # pragma: no cover - reported to the parent
        pipe.send(("error", None, repr(exc)))
        return
    pipe.send(("ready", None, None))
    with conn:
        while True:
            request = pipe.recv()
            if request is None:
                break
            query, params = request
            try:
                cur = conn.execute(query, params)
                rows = cur.fetchall() if cur.description is not None else []
                pipe.send(("ok", rows, None))
            except psycopg.Error as exc:
                pipe.send(("error", exc.sqlstate, str(exc)))
    pipe.close()


class RemoteSession:
    """One psycopg connection in its own (spawned) process; :meth:`execute` runs SQL there.

    Rows come back as dicts. Used as "consumer A", "consumer B", "producer": separate clients
    whose calls the test orders explicitly.
    """

    def __init__(self, dsn: str, *, autocommit: bool = True, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._pipe, child = SPAWN.Pipe()
        self._proc = SPAWN.Process(target=_session_main, args=(dsn, autocommit, child), daemon=True)
        self._proc.start()
        child.close()
        kind, _, detail = self._receive()
        if kind != "ready":
            self.close()
            raise RuntimeError(f"remote session could not connect: {detail}")

    def _receive(self) -> tuple[str, Any, Any]:
        if not self._pipe.poll(self.timeout):
            raise TimeoutError(f"remote session did not answer within {self.timeout} s")
        return self._pipe.recv()  # type: ignore[no-any-return]

    def execute(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self._pipe.send((query, params))
        kind, rows, detail = self._receive()
        if kind == "error":
            raise RemoteSQLError(rows, detail)
        return rows  # type: ignore[no-any-return]

    def one(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> dict[str, Any]:
        rows = self.execute(query, params)
        assert len(rows) == 1, rows
        return rows[0]

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(10)
        if self._proc.is_alive():  # pragma: no cover - only on a hang
            self._proc.terminate()
            self._proc.join(5)
        self._pipe.close()
        self._proc.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _worker_shell(target: Callable[..., Any], barrier: Any, results: Any, index: int, args: tuple[Any, ...]) -> None:
    try:
        results.put((index, "ok", target(barrier, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((index, "error", traceback.format_exc()))


def run_workers(
    target: Callable[..., Any], arg_tuples: Sequence[tuple[Any, ...]], *, timeout: float = 120.0
) -> list[Any]:
    """Run ``target(barrier, *args)`` in one spawned process per ``args``; return results in order.

    Every process opens its own connection and should call ``barrier.wait()`` right before the
    racing statement, so they all start it together. A failure in any child fails the caller
    with the child's traceback.
    """
    n = len(arg_tuples)
    barrier = SPAWN.Barrier(n)
    results = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_worker_shell, args=(target, barrier, results, i, tuple(args)), daemon=True)
        for i, args in enumerate(arg_tuples)
    ]
    for p in procs:
        p.start()
    collected: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(collected) + len(errors) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{n - len(collected) - len(errors)} worker(s) did not finish in {timeout} s")
            try:
                index, kind, value = results.get(timeout=remaining)
            except queue_mod.Empty:
                continue
            if kind == "ok":
                collected[index] = value
            else:
                errors.append(f"worker {index}:\n{value}")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():  # pragma: no cover - only on a hang
                p.terminate()
                p.join(5)
            p.close()
        results.close()
        results.join_thread()
    assert not errors, "\n".join(errors)
    return [collected[i] for i in range(n)]


# Worker bodies for test_sql_races (module level, so that 'spawn' children can import them).


def offer_one_worker(barrier: Any, dsn: str, queue: str, key: str, payload: bytes, scheduled_at: datetime) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        barrier.wait(30)
        row = conn.execute("SELECT dq_offer(%s, %s, %s::bytea, %s)", (queue, key, payload, scheduled_at)).fetchone()
        assert row is not None
        return str(row[0])


def drain_worker(barrier: Any, dsn: str, queue: str, batch: int) -> list[str]:
    """Poll batches and acknowledge them until a poll finds nothing; return the keys delivered."""
    keys: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        barrier.wait(30)
        while True:
            rows = conn.execute(
                "SELECT key, lock_token, delivery_count FROM dq_poll_many(%s, %s, interval '5 minutes')",
                (queue, batch),
            ).fetchall()
            if not rows:
                return keys
            assert all(r[2] == 1 for r in rows), "a message was delivered a second time"
            acked = conn.execute("SELECT dq_ack_many(%s::uuid[])", ([r[1] for r in rows],)).fetchone()
            assert acked is not None and acked[0] == len(rows), (acked, len(rows))
            keys.extend(r[0] for r in rows)


def offer_many_counts_worker(
    barrier: Any, dsn: str, queue: str, keys: list[str], payloads: list[bytes], scheduled_at: datetime
) -> tuple[int, int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        barrier.wait(30)
        row = conn.execute(
            "SELECT created, updated, ignored FROM dq_offer_many_counts(%s, %s::text[], %s::bytea[], "
            "array_fill(%s::timestamptz, ARRAY[cardinality(%s::text[])]))",
            (queue, keys, payloads, scheduled_at, keys),
        ).fetchone()
        assert row is not None
        return (row[0], row[1], row[2])


def offer_many_worker(
    barrier: Any, dsn: str, queue: str, keys: list[str], payloads: list[bytes], scheduled_at: datetime
) -> list[tuple[str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        barrier.wait(30)
        return [
            (r[0], r[1])
            for r in conn.execute(
                "SELECT key, outcome FROM dq_offer_many(%s, %s::text[], %s::bytea[], "
                "array_fill(%s::timestamptz, ARRAY[cardinality(%s::text[])]))",
                (queue, keys, payloads, scheduled_at, keys),
            )
        ]


# --------------------------------------------------------------------------- PostgreSQL programs


def pg_program(name: str) -> str:
    """Path of a PostgreSQL 15 client program (the server's major version), else from PATH."""
    candidate = PG_BIN / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found in {PG_BIN} nor on PATH")
    return found


def _is_yoyo_block(header: str) -> bool:
    name = header[len("-- Name: ") :].split(";", 1)[0]
    return "_yoyo_" in name or "yoyo_lock" in name


def schema_dump(dsn: str) -> str:
    """``pg_dump --schema-only``, normalised: no comment lines (pg_dump's headers, the random
    ``\\restrict`` key), no SET lines, no blank lines, and without yoyo's bookkeeping tables."""
    out = subprocess.run(
        [pg_program("pg_dump"), "--schema-only", "--dbname", dsn],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, PGTZ="UTC"),
    ).stdout
    kept: list[str] = []
    skipping = False
    for line in out.splitlines():
        if line.startswith("-- Name: "):
            skipping = _is_yoyo_block(line)
            continue
        if skipping:
            continue
        if (
            line.startswith("--")
            or line.startswith("SET ")
            or line.startswith("SELECT pg_catalog.set_config(")
            or line.startswith("\\restrict")
            or line.startswith("\\unrestrict")
            or not line.strip()
        ):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def wait_for_lock_wait(conn: psycopg.Connection, text: str) -> None:
    """Until another session running a statement containing ``text`` waits for a lock (at most 60 s)."""
    deadline = time.monotonic() + 60
    while not conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() "
        "AND strpos(query, %s) > 0)", (text,)).fetchone()[0]:
        assert time.monotonic() < deadline, f"no session running {text} waits for a lock"
        time.sleep(0.05)


def nested_plans(conn: psycopg.Connection, statement: str) -> str:
    """The plans of the statements that ``statement`` runs inside functions, as auto_explain logs
    them (the statement is run three times, so the plan cache has settled by the last)."""
    logs: list[str] = []
    conn.add_notice_handler(lambda diag: logs.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET client_min_messages = log")
    for _ in range(3):  # also after the plan cache has settled
        conn.execute(statement)
    conn.execute("SET client_min_messages = notice")
    return "\n".join(logs)


def check_context_names_only(err: psycopg.Error, function: str) -> None:
    """The error's CONTEXT (psycopg ``diag.context``) names no internal helper, no private schema,
    and no function but ``function`` (the one the user called; its overloads share its name)."""
    context = err.diag.context or ""
    assert "dq__" not in context and "_internal" not in context, context
    named = set(re.findall(r'function "?([\w.]+)', context))
    assert named <= {function}, context
