"""The sync and asyncio APIs are twins, the Python limits are the database's, and a queue names
the schema of its install.

Parity is table-driven over pairs (sync object, async object): the same public names, the same
parameters (names, kinds, defaults), annotations equal once the sync names are mapped to their
async twins (Connection → AsyncConnection, Message → AsyncMessage …), and every public method of
the async side that does I/O a coroutine function (or an async context manager). A method added
to one side only fails here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
import time
import typing
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from blocking import Blocking, EventLoopThread
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pyqueue
from pyqueue import cron, limits
from pyqueue.aio import client as aio
from pyqueue.aio import cron as aio_cron
from pyqueue.aio import worker as aio_worker
from pyqueue.core.statements import sql_texts as statements
from pyqueue.sync import client, worker

#: Sync names and their asyncio twins, as they appear in annotations and public names.
TWINS = {
    "Connection": "AsyncConnection",
    "ConnectionPool": "AsyncConnectionPool",
    "Message": "AsyncMessage",
    "DelayedQueue": "AsyncDelayedQueue",
    "TransactionalBatch": "AsyncTransactionalBatch",
    "QueueCron": "AsyncQueueCron",
    "Driver": "AsyncDriver",
    "Middleware": "AsyncMiddleware",
    "Worker": "AsyncWorker",
    "Handler": "AsyncHandler",
    "Iterator": "AsyncIterator",
    "__enter__": "__aenter__",
    "__exit__": "__aexit__",
}


def as_async(text: str) -> str:
    """``text`` (an annotation or a name) with every sync name replaced by its twin."""
    return re.sub(r"\b(" + "|".join(TWINS) + r")\b", lambda m: TWINS[m.group(1)], text)


def public(cls: type) -> set[str]:
    """The public names of a class, with the context manager protocol counted as names."""
    names = {n for n in dir(cls) if not n.startswith("_")}
    return names | {n for n in ("__enter__", "__exit__", "__aenter__", "__aexit__") if hasattr(cls, n)}


def signature(obj: Any) -> inspect.Signature:
    if isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, dataclasses.Field):
        return inspect.Signature(return_annotation=str(obj.type))
    elif hasattr(obj, "func"):  # functools.cached_property
        obj = obj.func
    return inspect.signature(obj)


def described(sig: inspect.Signature, mapped: bool) -> list[tuple[Any, ...]]:
    """Parameters (name, kind, default, annotation) and the return annotation, as comparable tuples;
    with ``mapped``, sync names become their async twins."""
    conv = as_async if mapped else str

    def ann(a: Any) -> str:
        return "-" if a is inspect.Parameter.empty else conv(str(a))

    params = [(p.name, p.kind, repr(p.default), ann(p.annotation)) for p in sig.parameters.values()]
    return [*params, ("return", ann(sig.return_annotation))]


def is_async_api(obj: Any) -> bool:
    """A coroutine function, or an async context manager factory (``@asynccontextmanager``)."""
    if isinstance(obj, property | dataclasses.Field) or hasattr(obj, "func"):
        return False
    return inspect.iscoroutinefunction(obj) or inspect.isasyncgenfunction(getattr(obj, "__wrapped__", None))


def member(cls: type, name: str) -> Any:
    """The dataclass field ``name``, or the class attribute ``name`` as defined (a property or a
    cached_property itself, not its value)."""
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return {f.name: f for f in dataclasses.fields(cls)}[name]
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(name)


# (sync class, async class, names that do no I/O on the sync side either (plain on both sides),
#  names present on the async side only, with the reason)
CLASS_PAIRS: list[Any] = [
    (client.DelayedQueue, aio.AsyncDelayedQueue, {"pool", "cron", "listen_available"}, {}),
    (client.Message, aio.AsyncMessage, {"payload", "is_redelivery", "settled"}, {}),
    (cron.QueueCron, aio_cron.AsyncQueueCron, set(), {}),
    (client.TransactionalBatch, aio.AsyncTransactionalBatch, {"message"}, {}),
    (worker.Worker, aio_worker.AsyncWorker, {"stop"}, {}),
]


@pytest.mark.parametrize(("sync_cls", "async_cls", "no_io", "async_only"), CLASS_PAIRS,
                         ids=["DelayedQueue", "Message", "QueueCron", "TransactionalBatch", "Worker"])
def test_class_pairs_have_the_same_api(sync_cls: type, async_cls: type, no_io: set[str],
                                       async_only: dict[str, str]) -> None:
    sync_names = {as_async(n) for n in public(sync_cls)}
    assert sync_names == public(async_cls) - set(async_only), "names on one side only"
    assert signature_of_init(sync_cls) == signature_of_init(async_cls, mapped=False)
    if dataclasses.is_dataclass(sync_cls):
        assert [(f.name, as_async(str(f.type))) for f in dataclasses.fields(sync_cls)] == [
            (f.name, str(f.type)) for f in dataclasses.fields(async_cls)]
    assert [as_async(s) for s in generic_arguments(sync_cls)] == generic_arguments(async_cls)
    for name in public(sync_cls):
        twin = as_async(name)
        sync_obj, async_obj = member(sync_cls, name), member(async_cls, twin)
        if name not in ("__enter__", "__exit__"):
            assert described(signature(sync_obj), True) == described(signature(async_obj), False), name
        assert not is_async_api(sync_obj), f"{sync_cls.__name__}.{name} is async on the sync side"
        if sync_obj is async_obj:  # one definition, inherited by both from a shared base
            continue
        if name in no_io:
            assert not is_async_api(async_obj), f"{async_cls.__name__}.{twin} does no I/O: not async"
        else:
            assert is_async_api(async_obj), f"{async_cls.__name__}.{twin} does I/O: it must be awaited"


def generic_arguments(cls: type) -> list[str]:
    """The type arguments of the generic bases of ``cls`` (Batch[Message, Connection] …), by name."""
    return [getattr(a, "__name__", None) or str(a) for b in getattr(cls, "__orig_bases__", ())
            for a in typing.get_args(b)]


def signature_of_init(cls: type, mapped: bool = True) -> list[tuple[Any, ...]]:
    return described(inspect.signature(cls.__init__), mapped)


# (sync module, async module, names of the sync module's __all__ without an async twin there,
#  names of the async module's __all__ without a sync twin there); the rest pair by name.
MODULE_PAIRS = [
    (client, aio, {"StoredMessage", "OfferOutcome", "OfferRequest", "QueueStats"}, set()),  # shared row types
    (cron, aio_cron, {"CronSchedule", "CronTicker", "TICKER_LOCK_KEY"}, set()),
]


@pytest.mark.parametrize(("sync_mod", "async_mod", "sync_only", "async_only"), MODULE_PAIRS,
                         ids=[p[0].__name__ for p in MODULE_PAIRS])
def test_module_functions_have_async_twins(sync_mod: Any, async_mod: Any, sync_only: set[str],
                                           async_only: set[str]) -> None:
    assert {as_async(n) for n in set(sync_mod.__all__) - sync_only} == set(async_mod.__all__) - async_only
    for name in sync_only:  # shared row types are the same objects, not copies
        obj = getattr(sync_mod, name)
        assert not inspect.isfunction(obj), f"{sync_mod.__name__}.{name} is a function without an async twin"
    functions = [n for n in sync_mod.__all__ if inspect.isfunction(getattr(sync_mod, n))]
    assert functions, "no module function compared"
    for name in functions:
        sync_fn, async_fn = getattr(sync_mod, name), getattr(async_mod, name)
        assert described(inspect.signature(sync_fn), True) == described(inspect.signature(async_fn), False), name
        assert inspect.iscoroutinefunction(async_fn) and not inspect.iscoroutinefunction(sync_fn), name


def test_the_parity_check_catches_a_method_on_one_side() -> None:
    """The checks above fail for a class pair where one side has a method more, or a parameter
    that differs, or a method not awaited."""

    class Sync:
        def get(self, key: str) -> int: ...
        def extra(self) -> None: ...

    class Async:
        async def get(self, key: str) -> int: ...

    class AsyncOtherParam:
        async def get(self, name: str) -> int: ...
        async def extra(self) -> None: ...

    class AsyncNotAwaited:
        def get(self, key: str) -> int: ...
        def extra(self) -> None: ...

    for async_cls in (Async, AsyncOtherParam, AsyncNotAwaited):
        with pytest.raises(AssertionError):
            test_class_pairs_have_the_same_api(Sync, async_cls, set(), {})


# -- limits ---------------------------------------------------------------------------------------

def raises_sqlstate(conn: psycopg.Connection, query: str, params: Any = None) -> str | None:
    """The SQLSTATE ``query`` raises, or None when it succeeds (rolled back either way)."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(query, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


LIMIT_CASES: list[tuple[str, Callable[[int], tuple[str, Any]], int, str]] = [
    # (limit, query at value n, the limit's value, SQLSTATE one past it)
    ("QUEUE_CHARS", lambda n: ("SELECT dq_offer(%s, 'k', 'x')", ("q" * n,)), limits.QUEUE_CHARS, "22001"),
    ("KEY_CHARS", lambda n: ("SELECT dq_offer('q', %s, 'x')", ("k" * n,)), limits.KEY_CHARS, "22001"),
    ("PAYLOAD_TYPE_CHARS", lambda n: ("SELECT dq_offer('q', 'k', 'x', payload_type => %s)", ("t" * n,)),
     limits.PAYLOAD_TYPE_CHARS, "22001"),
    ("POLL_MAX_COUNT", lambda n: ("SELECT * FROM dq_poll_many('q', %s)", (n,)), limits.POLL_MAX_COUNT, "22023"),
    ("REDRIVE_MAX_COUNT", lambda n: ("SELECT dq_redrive('q', %s)", (n,)), limits.REDRIVE_MAX_COUNT, "22023"),
    ("DEAD_LETTERS_MAX_ROWS", lambda n: ("SELECT * FROM dq_dead_letters('q', %s)", (n,)),
     limits.DEAD_LETTERS_MAX_ROWS, "22023"),
    ("OCCURRENCES_MAX_COUNT", lambda n: ("SELECT * FROM dq_cron_occurrences('@daily', 'UTC', now(), now(), %s)",
                                         (n,)), limits.OCCURRENCES_MAX_COUNT, "22023"),
    ("CRON_SCHEDULE_CHARS", lambda n: ("SELECT * FROM dq_cron_occurrences(%s)", ("@daily" + " " * (n - 6),)),
     limits.CRON_SCHEDULE_CHARS, "22001"),
    ("CRON_NAME_CHARS", lambda n: ("SELECT dq_cron_install(%s, 'q', '@daily', 'x'::text)", ("c" * n,)),
     limits.CRON_NAME_CHARS, "22001"),
    ("CRON_LOOKAHEAD_MAX", lambda n: ("SELECT dq_cron_install('c', 'q', '@daily', 'x'::text, lookahead => %s)",
                                      (timedelta(days=n),)), limits.CRON_LOOKAHEAD_MAX.days, "22023"),
    # a lower bound: counted downwards, so that "one past it" is one below
    ("PAYLOAD_BYTES_MIN", lambda n: ("SELECT dq_configure_queue('q', max_payload_bytes => %s)", (-n,)),
     -limits.PAYLOAD_BYTES_MIN, "22023"),
    ("PAYLOAD_BYTES_MAX", lambda n: ("SELECT dq_configure_queue('q', max_payload_bytes => %s)", (n,)),
     limits.PAYLOAD_BYTES_MAX, "22023"),
    ("PAYLOAD_BYTES_DEFAULT", lambda n: ("SELECT dq_offer('q', 'k', %s::bytea)", (b"x" * n,)),
     limits.PAYLOAD_BYTES_DEFAULT, "54000"),
    ("WAIT_MAX", lambda n: ("SELECT dq_wait('q', %s)", (timedelta(seconds=n),)),
     int(limits.WAIT_MAX.total_seconds()), "22023"),
    ("PRIORITY_MAX", lambda n: ("SELECT dq_offer('q', 'k', 'x', priority => %s)", (n,)), limits.PRIORITY_MAX,
     "22023"),
    ("PRIORITY_MIN", lambda n: ("SELECT dq_offer('q', 'k', 'x', priority => %s)", (-n,)), -limits.PRIORITY_MIN,
     "22023"),
    ("GROUP_CHARS", lambda n: ("SELECT dq_offer('q', 'k', 'x', message_group => %s)", ("g" * n,)),
     limits.GROUP_CHARS, "22001"),
    # {"a": "<n - 9 characters>"} is n bytes as jsonb text
    ("HEADERS_BYTES", lambda n: ("SELECT dq_offer('q', 'k', 'x', headers => jsonb_build_object('a', repeat('x', %s)))",
                                 (n - 9,)), limits.HEADERS_BYTES, "54000"),
    ("MAX_IN_FLIGHT_MAX", lambda n: ("SELECT dq_configure_queue('q', max_in_flight => %s)", (n,)),
     limits.MAX_IN_FLIGHT_MAX, "22023"),
    ("RATE_LIMIT_MAX", lambda n: ("SELECT dq_configure_queue('q', rate_limit => %s, rate_period => '1 second')", (n,)),
     limits.RATE_LIMIT_MAX, "22023"),
    ("AFTER_PARENTS_MAX", lambda n: ("SELECT dq_offer('q', 'k', 'x', after => (SELECT jsonb_agg(i::text) "
                                     "FROM generate_series(1, %s) i))", (n,)), limits.AFTER_PARENTS_MAX, "54000"),
    ("RATE_PERIOD_MAX", lambda n: ("SELECT dq_configure_queue('q', rate_limit => 1, rate_period => %s)",
                                   (timedelta(seconds=n),)), int(limits.RATE_PERIOD_MAX.total_seconds()), "22023"),
]


@pytest.mark.parametrize(("name", "query", "value", "sqlstate"), LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_python_limits_are_the_ones_the_database_enforces(conn, name: str, query: Callable[[int], tuple[str, Any]],
                                                          value: int, sqlstate: str) -> None:
    """At the limit the call is accepted, one past it refused with the documented SQLSTATE."""
    assert raises_sqlstate(conn, *query(value)) is None, name
    assert raises_sqlstate(conn, *query(value + 1)) == sqlstate, name


def test_error_and_offer_many_limits_are_the_ones_the_database_enforces(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x')")
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('q', 1)").fetchone()
    nack = "SELECT dq_nack(%s, '0', %s)"
    assert raises_sqlstate(conn, nack, (token, "e" * (limits.ERROR_CHARS + 1))) == "22001"
    assert raises_sqlstate(conn, nack, (token, "e" * limits.ERROR_CHARS)) is None
    keys = [f"k{i}" for i in range(limits.OFFER_MANY_MAX_ITEMS + 1)]
    many = "SELECT * FROM dq_offer_many('q', %s::text[], array_fill('x'::bytea, ARRAY[cardinality(%s::text[])]))"
    assert raises_sqlstate(conn, many, (keys, keys)) == "54000"


#: Limits the SQL functions name that the Python side does not check itself (no pyqueue.limits twin).
SQL_ONLY_LIMITS = {"CONFIG_HASH_CHARS", "LIST_MESSAGES_MAX_ROWS", "PRUNE_BATCH_MAX", "AUDIT_ACTOR_CHARS",
                   "AUDIT_ACTION_CHARS", "THROUGHPUT_BUCKETS", "RELEASE_INLINE", "RELEASE_BACKLOG_MAX"}


def test_every_limit_named_in_sql_is_the_python_one(conn) -> None:
    """sql/003_limits.sql names each limit once, as ``dq__limit_<name>()``: every one of them is
    :mod:`pyqueue.limits`' ``<NAME>`` with the same value, and every Python limit is named there."""
    rows = conn.execute(
        "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'public_internal'::regnamespace "
        "AND p.proname LIKE 'dq\\_\\_limit\\_%' ORDER BY 1").fetchall()
    named = {name.removeprefix("dq__limit_").upper() for (name,) in rows}
    assert named - SQL_ONLY_LIMITS == set(limits.__all__)
    for name in sorted(limits.__all__):
        function = sql.Identifier("public_internal", f"dq__limit_{name.lower()}")
        (value,) = conn.execute(sql.SQL("SELECT {}()").format(function)).fetchone()
        assert value == getattr(limits, name), name


def test_limits_are_not_restated_in_the_client() -> None:
    """The client's checks use :mod:`pyqueue.limits`: a queue name one past the limit is refused
    before any I/O, one at the limit is accepted."""
    with pytest.raises(pyqueue.InvalidArgument):
        client.DelayedQueue(psycopg_pool_closed(), "q" * (limits.QUEUE_CHARS + 1))
    assert client.DelayedQueue(psycopg_pool_closed(), "q" * limits.QUEUE_CHARS).queue == "q" * limits.QUEUE_CHARS
    with pytest.raises(pyqueue.InvalidArgument):
        pyqueue.SerializerRegistry().register("t" * (limits.PAYLOAD_TYPE_CHARS + 1), bytes, bytes)


def psycopg_pool_closed() -> Any:
    from psycopg_pool import ConnectionPool

    return ConnectionPool("", open=False)


# -- schema ---------------------------------------------------------------------------------------

def test_statements_name_the_schema_quoted_once() -> None:
    assert statements(None) is statements(None)
    assert "SELECT dq_offer(" in statements(None).offer
    assert '"public".dq_offer(' in statements("public").offer
    assert '"My ""odd"" %%q".dq_ack(' in statements('My "odd" %q').ack  # quoted, % escaped for psycopg
    for text in vars(statements("s")).values():
        if "dq_" in text:
            assert re.findall(r"(?<![\w.\"])dq_\w+\(|FROM dq_\w+\b(?!\()", text) == [], text
    with pytest.raises(pyqueue.InvalidArgument):
        client.DelayedQueue(psycopg_pool_closed(), "q", schema="")


@pytest.fixture
def elsewhere(dsn: str) -> str:
    """The test database's DSN with a search_path that does not hold the install (public)."""
    return make_conninfo(dsn, options="-csearch_path=pg_catalog")


@pytest.fixture
def queue_in(kind: str):
    """Open a queue of either kind (the async one through tests/support/blocking.py)."""
    runners: list[EventLoopThread] = []

    def make(dsn: str, name: str, **kwargs: Any) -> Any:
        if kind == "sync":
            return client.DelayedQueue(dsn, name, **kwargs)
        runners.append(EventLoopThread())
        return Blocking(aio.AsyncDelayedQueue(dsn, name, **kwargs), runners[-1])

    yield make
    for runner in runners:
        runner.close()


def test_without_the_schema_the_search_path_decides(queue_in, elsewhere: str) -> None:
    # the first function of the statement that the search_path cannot find (dq_now, for the due time)
    with queue_in(elsewhere, "jobs") as q, pytest.raises(pyqueue.DatabaseError,
                                                        match=r"function dq_(now|offer)\(.*\) does not exist"):
        q.offer("k", "x")


def test_a_queue_with_a_schema_works_whatever_the_search_path(queue_in, elsewhere: str, conn, kind: str) -> None:
    """Every statement names the schema: a connection whose search_path lacks it works end to end
    (offer, poll with and without waiting, transaction, settle, read, operate, cron)."""
    with queue_in(elsewhere, "jobs", schema="public") as q:
        assert q.schema == "public"
        assert q.offer("a", {"n": 1}) is pyqueue.OfferOutcome.CREATED
        assert q.offer_many([("b", 2), pyqueue.OfferRequest("c", 3, delay=3600)]) == {
            "b": pyqueue.OfferOutcome.CREATED, "c": pyqueue.OfferOutcome.CREATED}
        assert q.get("a").payload == {"n": 1} and q.contains("c") and q.next_due() is not None
        a, b = q.poll(2)
        assert a.extend(60) is not None and a.ack() and b.nack(0, error="e") and b.settled == "nacked"
        with q.transaction() as batch:
            assert batch.message.key == "b"
        assert q.poll(1, wait=0.2) == []
        assert q.channel().startswith("dq")
        conn.execute("SELECT dq_offer('jobs', 'd', 'x')")
        (d,) = q.poll(1, wait=5)
        assert d.key == "d" and q.release_locks() == 1
        q.configure(archive=True, max_in_flight=10, rate_limit=100, rate_period=1)
        assert q.pause() and q.resume()
        assert q.stats().ready == 1 and q.redrive() == 0 and q.cancel("c")
        assert q.cron.install("beat", schedule="@daily", payload="x") and [s.name for s in q.cron.list()] == ["beat"]
        assert q.cron.pause("beat") and q.cron.tick() == 0 and q.cron.resume("beat") and q.cron.uninstall("beat")
        assert q.purge(confirm=True) == 1


def run_either(kind: str, sync_fn: Callable[..., Any], async_fn: Callable[..., Any], dsn: str, *args: Any,
               **kwargs: Any) -> Any:
    """``sync_fn(conn, …)`` on a sync connection, or ``async_fn(conn, …)`` on an async one."""
    if kind == "sync":
        with psycopg.connect(dsn, autocommit=True) as c:
            return sync_fn(c, *args, **kwargs)

    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            return await async_fn(c, *args, **kwargs)

    return asyncio.run(main())


def test_cron_functions_and_all_stats_of_both_kinds(kind: str, elsewhere: str, conn) -> None:
    """The module functions of pyqueue.cron and pyqueue.aio.cron, and both all_stats, give the same
    results, here with schema="public" on a search_path without it."""
    def call(name: str, *args: Any, **kwargs: Any) -> Any:
        sync_mod, async_mod = (client, aio) if name == "all_stats" else (cron, aio_cron)
        return run_either(kind, getattr(sync_mod, name), getattr(async_mod, name), elsewhere, *args,
                          schema="public", **kwargs)

    h = call("install", "py", "q", "every 10 minutes", {"a": 1}, lookahead=timedelta(hours=1))
    assert len(h) == 16
    [s] = call("schedules")
    assert (s.name, s.queue, s.config_hash, len(s.next_occurrences)) == ("py", "q", h, 5)
    assert call("tick") == 0
    assert call("pause", "py") is True and call("resume", "py") is True
    assert [r.queue for r in call("all_stats")] == ["q"]
    assert call("uninstall", "py") is True and call("uninstall", "py") is False
    got = call("occurrences", "0 0 * * *", timezone="Europe/Berlin", max_count=3)
    assert len(got) == 3 and got == sorted(got)
    with pytest.raises(pyqueue.InvalidArgument):
        call("install", "bad", "q", "61 * * * *", b"x")
    assert conn.execute("SELECT count(*) FROM dq_cron").fetchone() == (0,)


def test_cron_ticker_takes_the_schema(elsewhere: str, conn) -> None:
    conn.execute("SELECT dq_cron_install('beat', 'q', 'every 1 second', 'x'::text, lookahead => '2 seconds')")
    ticks: list[int] = []
    ticker = cron.CronTicker(elsewhere, every=0.2, on_tick=ticks.append, schema="public")
    ticker.start()
    try:
        for _ in range(100):
            if ticker.ticks >= 2:
                break
            time.sleep(0.1)
    finally:
        ticker.stop(timeout=10)
    assert ticker.ticks >= 2 and ticker.failures == 0 and ticker.holds_lock is False
