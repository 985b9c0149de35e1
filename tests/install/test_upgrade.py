"""Upgrading a live database from the previous release (pgmq's upgrade job).

``tests/upgrade/pgdelayq-<version>-db.tar.gz`` holds the previous release's ``migrations/`` and
``sql/`` (made with ``git archive v<version> migrations sql``; ``make release-snapshot`` refreshes
it when a release is tagged). The test installs that release, puts messages in every state
(scheduled, ready, in flight, dead letter), then upgrades step by step with this tree's
installer, calling after every schema step every public function of the old release (the list
read from its pg_proc) with valid arguments, in positional and named notation, and checking what
each returns against the old release's documented result (:data:`SCENARIOS`; after the final
apply as the role granted the function): a rolling deploy runs old workers against the database
during the upgrade, so no step may remove or break a function they call (a signature change adds the new function; the
old one goes away only in a later release). The one exception is ``REMOVED``: an old signature
whose presence breaks calls of another one (its replacement is named beside it, and docs/api.md
tells operators to stop older workers before migrating); it goes away with the final apply of
``sql/``, never in a schema step. At the end the database must equal a fresh install
(schema dump) and the messages must be intact and usable with their old lock tokens; the install
schema must hold only the public API (the old release's internal helpers, which lived there, are
gone), so that psql's ``\\df`` lists only the API.
"""

from __future__ import annotations

import hashlib
import tarfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from installhelpers import ROLE_OF, check_only_the_api, install_functions, psql_names, schema_steps
from psycopg import sql
from psycopg.rows import dict_row
from sqlhelpers import schema_dump
from yoyo import get_backend, read_migrations

from pyqueue.migrate import migrate, yoyo_uri

# Old signature -> its replacement. dq_ack(uuid[]) made a quoted token ambiguous for dq_ack(uuid)
# ("function dq_ack(unknown) is not unique"); dq_ack_many(uuid[]) replaces it.
REMOVED = {"dq_ack(uuid[])": "dq_ack_many(uuid[])"}

SNAPSHOTS = sorted((Path(__file__).resolve().parents[1] / "upgrade").glob("pgdelayq-*-db.tar.gz"))


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


# --- The old release's API, called as its workers call it -------------------------------------
#
# Every public function of the old release (read from its pg_proc, so the list cannot go stale)
# has a scenario below that calls it with valid arguments and checks what it returns against the
# old release's documented result. The scenarios run on the old release itself (which proves them),
# after every schema step, and after the final apply of sql/ as the role granted each function.
# Each call is made twice over: positionally and in named notation with the old parameter names
# (both are call forms an old client may use), every argument cast to the old parameter type; the
# result columns the old release returned must all still be there.

PAST = timedelta(seconds=-5)


@dataclass(frozen=True)
class OldFunction:
    signature: str
    name: str
    params: tuple[tuple[str, str], ...]  # (name, type) of each input parameter, in order
    required: int  # how many leading parameters have no default


def old_api_of(conn: psycopg.Connection[Any]) -> dict[str, OldFunction]:
    """The public functions of the release installed in ``conn``'s database, from pg_proc."""
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, p.proname, pg_get_function_identity_arguments(p.oid), "
        "       p.pronargs - p.pronargdefaults "
        "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        " WHERE n.nspname = 'public' AND p.proname LIKE 'dq\\_%' AND p.proname NOT LIKE 'dq\\_\\_%'").fetchall()
    functions = {}
    for signature, name, arguments, required in rows:
        params = tuple(tuple(a.split(" ", 1)) for a in arguments.split(", ") if a)
        assert all(len(p) == 2 for p in params), f"{signature}: unnamed parameter in {arguments!r}"
        functions[signature] = OldFunction(signature, name, params, required)  # type: ignore[arg-type]
    return functions


@dataclass
class OldApi:
    """Calls the old release's functions by their old signature, on ``conn`` (autocommit)."""

    conn: psycopg.Connection[Any]
    functions: dict[str, OldFunction]
    named: bool
    #: after the final apply: each call runs as the role granted the function (ROLE_OF)
    as_granted_role: bool = False
    #: old signature -> name of the function that replaces it (REMOVED), after the final apply
    replaced: dict[str, str] = field(default_factory=dict)
    #: signature -> the result columns seen on the old release (shared by every run)
    columns: dict[str, list[str]] = field(default_factory=dict)
    called: set[str] = field(default_factory=set)

    def statement(self, signature: str, args: dict[str, Any]) -> tuple[sql.Composable, str]:
        fn = self.functions[signature]
        names = [n for n, _ in fn.params]
        assert list(args) == names[:len(args)] and len(args) >= fn.required, (
            f"{signature}: give a prefix of {names} (at least {fn.required}), not {list(args)}")
        target = self.replaced.get(signature, fn.name)
        parts = [
            (sql.SQL("{} => ").format(sql.Identifier(name)) if self.named else sql.SQL(""))
            + sql.SQL("%s::" + type_) for name, type_ in fn.params[:len(args)]
        ]
        return sql.SQL("SELECT * FROM {}({}) AS r").format(sql.Identifier(target), sql.SQL(", ").join(parts)), target

    def rows(self, signature: str, **args: Any) -> list[dict[str, Any]]:
        """``SELECT * FROM f(args) AS r`` for the old signature; a scalar result is column ``r``."""
        query, target = self.statement(signature, args)
        role = ROLE_OF[target] if self.as_granted_role else None
        with self.conn.cursor(row_factory=dict_row) as cur:
            if role:
                cur.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            try:
                cur.execute(query, list(args.values()))
                result = cur.fetchall()
                assert cur.description is not None
                returned = [d.name for d in cur.description]
            finally:
                if role:
                    cur.execute("RESET ROLE")
        old_columns = self.columns.setdefault(signature, returned)
        assert set(old_columns) <= set(returned), f"{signature} no longer returns {set(old_columns) - set(returned)}"
        self.called.add(signature)
        return result

    def value(self, signature: str, **args: Any) -> Any:
        """The one value a scalar function returns."""
        rows = self.rows(signature, **args)
        assert len(rows) == 1, rows
        return rows[0]["r"]

    def owner(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """A read of the tables as the test's (owner) user, to check what a call did."""
        return self.conn.execute(query, params).fetchall()  # type: ignore[arg-type]


OFFER = "dq_offer(text,text,bytea,timestamp with time zone,boolean,text)"
OFFER_JSON = "dq_offer(text,text,jsonb,timestamp with time zone,boolean,text)"
OFFER_TEXT = "dq_offer(text,text,text,timestamp with time zone,boolean,text)"
OFFER_MANY = "dq_offer_many(text,text[],bytea[],timestamp with time zone[],boolean,text[])"
POLL = "dq_poll_many(text,integer,interval)"
POLL_OR_WAIT = "dq_poll_or_wait(text,integer,interval,interval)"
ACK = "dq_ack(uuid)"
ACK_MANY = "dq_ack(uuid[])"
NACK = "dq_nack(uuid,interval,text)"
EXTEND = "dq_extend(uuid,interval)"
CANCEL = "dq_cancel(text,text)"
GET = "dq_get(text,text)"
NEXT_DUE = "dq_next_due(text)"
CONFIGURE = "dq_configure_queue(text,integer,text)"
REDRIVE = "dq_redrive(text,integer)"
CHANNEL = "dq_channel(text)"
WAIT = "dq_wait(text,interval)"
WAIT_DONE = "dq_wait_done(text)"


def db_now(api: OldApi) -> datetime:
    return api.owner("SELECT now()")[0][0]  # type: ignore[no-any-return]


def poll(api: OldApi, q: str, count: int = 10, lock: timedelta = timedelta(minutes=1)) -> list[dict[str, Any]]:
    return api.rows(POLL, queue=q, max_count=count, lock_timeout=lock)


def offer(api: OldApi, q: str, key: str, payload: bytes = b"x", at: timedelta = PAST) -> None:
    assert api.value(OFFER, queue=q, key=key, payload=payload, scheduled_at=db_now(api) + at) == "created"


def deliver_once(api: OldApi, q: str) -> dict[str, Any]:
    """Poll the queue's only message, acknowledge it; the queue is then empty. Returns the delivery."""
    (got,) = poll(api, q)
    assert api.value(ACK, lock_token=got["lock_token"]) is True
    assert poll(api, q) == [] and api.rows(GET, queue=q, key=got["key"]) == []
    return got


def s_offer(api: OldApi, q: str) -> None:
    at = db_now(api) + PAST
    assert api.value(OFFER, queue=q, key="k", payload=b"\x00\xff", scheduled_at=at) == "created"
    assert api.value(OFFER, queue=q, key="k", payload=b"\x00\xff", scheduled_at=at) == "ignored"  # same message
    assert api.value(OFFER, queue=q, key="k", payload=b"new", scheduled_at=at, can_update=False) == "ignored"
    assert api.value(OFFER, queue=q, key="k", payload=b"new", scheduled_at=at, can_update=True,
                     payload_type="bin") == "updated"
    got = deliver_once(api, q)
    assert (got["key"], got["payload"], got["payload_type"], got["delivery_count"]) == ("k", b"new", "bin", 1)
    assert got["scheduled_at"] == at


def s_offer_json(api: OldApi, q: str) -> None:
    assert api.value(OFFER_JSON, queue=q, key="j", payload='{"a": [1, "é"]}') == "created"
    got = deliver_once(api, q)
    assert (got["payload"], got["payload_type"]) == ('{"a": [1, "é"]}'.encode(), "json")


def s_offer_text(api: OldApi, q: str) -> None:
    assert api.value(OFFER_TEXT, queue=q, key="t", payload="héllo") == "created"
    got = deliver_once(api, q)
    assert (got["payload"], got["payload_type"]) == ("héllo".encode(), "text")


def s_offer_many(api: OldApi, q: str) -> None:
    now = db_now(api)
    first = api.rows(OFFER_MANY, queue=q, keys=["a", "b"], payloads=[b"1", b"2"],
                     scheduled_ats=[now - timedelta(seconds=2), now - timedelta(seconds=1)])
    assert [(r["key"], r["outcome"]) for r in first] == [("a", "created"), ("b", "created")]
    again = api.rows(OFFER_MANY, queue=q, keys=["a", "b"], payloads=[b"1", b"3"], scheduled_ats=None,
                     can_update=False, payload_types=["x", "y"])
    assert sorted((r["key"], r["outcome"]) for r in again) == [("a", "ignored"), ("b", "ignored")]
    got = poll(api, q)
    assert [(g["key"], g["payload"], g["payload_type"]) for g in got] == [("a", b"1", "bytes"), ("b", b"2", "bytes")]
    for g in got:
        assert api.value(ACK, lock_token=g["lock_token"]) is True
    assert poll(api, q) == []


def s_poll(api: OldApi, q: str) -> None:
    for i, key in enumerate(["first", "second", "third"]):
        offer(api, q, key, at=timedelta(seconds=i - 10))
    offer(api, q, "later", at=timedelta(hours=1))
    before = db_now(api)
    two = api.rows(POLL, queue=q, max_count=2, lock_timeout=timedelta(minutes=10))
    assert [m["key"] for m in two] == ["first", "second"]  # earliest due first
    assert all(m["delivery_count"] == 1 and m["lock_token"] is not None for m in two)
    assert all(m["locked_until"] >= before + timedelta(minutes=10) for m in two)
    assert [m["key"] for m in api.rows(POLL, queue=q)] == ["third"]  # the defaults: one message
    assert api.rows(POLL, queue=q, max_count=5) == []  # in flight or not due
    assert api.value(CANCEL, queue=q, key="later") is True
    for m in two:
        assert api.value(ACK, lock_token=m["lock_token"]) is True
    assert api.value(CANCEL, queue=q, key="third") is True


def s_poll_or_wait(api: OldApi, q: str) -> None:
    (idle,) = api.rows(POLL_OR_WAIT, queue=q, max_count=5, lock_timeout=timedelta(minutes=1),
                       max_wait=timedelta(seconds=30))
    assert idle["id"] is None and timedelta(0) < idle["wake_in"] <= timedelta(seconds=30)
    pid = api.owner("SELECT pg_backend_pid()")[0][0]
    assert api.owner("SELECT count(*) FROM dq_waiters WHERE queue = %s AND pid = %s", q, pid) == [(1,)]
    offer(api, q, "w")
    (got,) = api.rows(POLL_OR_WAIT, queue=q, max_count=5, lock_timeout=timedelta(minutes=1),
                      max_wait=timedelta(seconds=30))
    assert (got["key"], got["delivery_count"], got["wake_in"]) == ("w", 1, None)
    assert api.owner("SELECT count(*) FROM dq_waiters WHERE queue = %s AND pid = %s", q, pid) == [(0,)]
    assert api.value(ACK, lock_token=got["lock_token"]) is True


def s_ack(api: OldApi, q: str) -> None:
    offer(api, q, "a")
    (got,) = poll(api, q)
    assert api.value(ACK, lock_token=got["lock_token"]) is True
    assert api.value(ACK, lock_token=got["lock_token"]) is False  # stale: nothing left to delete
    assert api.value(ACK, lock_token=uuid.uuid4()) is False
    assert api.rows(GET, queue=q, key="a") == []


def s_ack_many(api: OldApi, q: str) -> None:
    offer(api, q, "a")
    offer(api, q, "b")
    tokens = [m["lock_token"] for m in poll(api, q)]
    assert len(tokens) == 2
    assert api.value(ACK_MANY, lock_tokens=[*tokens, uuid.uuid4()]) == 2
    assert api.value(ACK_MANY, lock_tokens=tokens) == 0
    assert poll(api, q) == [] and api.rows(GET, queue=q, key="a") == []


def s_nack(api: OldApi, q: str) -> None:
    offer(api, q, "n")
    (got,) = poll(api, q)
    before = db_now(api)
    assert api.value(NACK, lock_token=got["lock_token"], delay=timedelta(hours=1), error="boom") is True
    assert api.value(NACK, lock_token=got["lock_token"]) is False  # stale
    (row,) = api.rows(GET, queue=q, key="n")
    assert row["scheduled_at"] >= before + timedelta(hours=1) and row["locked_until"] is None
    assert row["delivery_count"] == 1
    assert api.owner("SELECT last_error FROM dq_messages WHERE queue = %s AND key = 'n'", q) == [("boom",)]
    assert poll(api, q) == []  # back, but not before its delay
    assert api.value(CANCEL, queue=q, key="n") is True
    offer(api, q, "again")
    (first,) = poll(api, q)
    assert api.value(NACK, lock_token=first["lock_token"]) is True  # the defaults: visible again now
    (second,) = poll(api, q)
    assert (second["key"], second["delivery_count"]) == ("again", 2)
    assert second["lock_token"] != first["lock_token"]
    assert api.value(ACK, lock_token=second["lock_token"]) is True


def s_extend(api: OldApi, q: str) -> None:
    offer(api, q, "e")
    (got,) = poll(api, q, lock=timedelta(minutes=1))
    before = db_now(api)
    until = api.value(EXTEND, lock_token=got["lock_token"], lock_timeout=timedelta(hours=1))
    assert until >= before + timedelta(hours=1)
    assert api.rows(GET, queue=q, key="e")[0]["locked_until"] == until
    assert api.value(EXTEND, lock_token=uuid.uuid4(), lock_timeout=timedelta(hours=1)) is None
    assert api.value(ACK, lock_token=got["lock_token"]) is True  # the token still holds


def s_cancel(api: OldApi, q: str) -> None:
    offer(api, q, "c", at=timedelta(hours=1))
    offer(api, q, "held")
    (held,) = poll(api, q)
    assert api.value(CANCEL, queue=q, key="c") is True
    assert api.value(CANCEL, queue=q, key="held") is True  # in flight or not
    assert api.value(CANCEL, queue=q, key="c") is False
    assert api.value(ACK, lock_token=held["lock_token"]) is False
    assert api.rows(GET, queue=q, key="c") == [] and api.rows(GET, queue=q, key="held") == []


def s_get(api: OldApi, q: str) -> None:
    at = db_now(api).replace(microsecond=0) + timedelta(days=1)
    assert api.value(OFFER_TEXT, queue=q, key="g", payload="p", scheduled_at=at) == "created"
    (row,) = api.rows(GET, queue=q, key="g")
    assert (row["queue"], row["key"], row["payload"], row["payload_type"]) == (q, "g", b"p", "text")
    assert (row["scheduled_at"], row["scheduled_at_initially"]) == (at, at)
    assert (row["delivery_count"], row["locked_until"]) == (0, None)
    assert api.rows(GET, queue=q, key="absent") == []
    assert api.value(CANCEL, queue=q, key="g") is True


def s_next_due(api: OldApi, q: str) -> None:
    assert api.value(NEXT_DUE, queue=q) is None  # empty queue
    at = db_now(api).replace(microsecond=0) + timedelta(days=2)
    assert api.value(OFFER, queue=q, key="late", payload=b"x", scheduled_at=at) == "created"
    assert api.value(NEXT_DUE, queue=q) == at
    assert api.value(OFFER, queue=q, key="early", payload=b"x", scheduled_at=at - timedelta(days=1)) == "created"
    assert api.value(NEXT_DUE, queue=q) == at - timedelta(days=1)
    assert api.value(CANCEL, queue=q, key="early") is True and api.value(CANCEL, queue=q, key="late") is True
    assert api.value(NEXT_DUE, queue=q) is None


def dead_letter_one(api: OldApi, q: str, key: str) -> str:
    """Configure q to dead-letter at the first failed delivery, fail one message; returns the DLQ."""
    dead = q + ".dead"
    (config,) = api.rows(CONFIGURE, queue=q, max_deliveries=1, dead_letter_queue=dead)
    assert (config["queue"], config["max_deliveries"], config["dead_letter_queue"]) == (q, 1, dead)
    offer(api, q, key)
    (got,) = poll(api, q)
    assert api.value(NACK, lock_token=got["lock_token"], delay=timedelta(0), error="boom") is True
    assert poll(api, q) == []
    return dead


def s_configure(api: OldApi, q: str) -> None:
    dead = dead_letter_one(api, q, "d")
    assert api.rows(GET, queue=q, key="d") == []
    (letter,) = api.rows(GET, queue=dead, key="d")  # the dead letter is a message of the dead-letter queue
    assert (letter["queue"], letter["payload"], letter["locked_until"]) == (dead, b"x", None)
    assert api.owner("SELECT key, last_error FROM dq_messages WHERE queue = %s", dead) == [("d", "boom")]
    (config,) = api.rows(CONFIGURE, queue=q)
    # The old release documented this call (naming no setting) as removing the limit; now a
    # setting not named keeps its value (docs/api.md, dq_configure_queue; clearing names the
    # setting), so once this tree's sql/ is applied (the final run) the limit stays.
    kept = (1, dead) if api.as_granted_role else (None, None)
    assert (config["max_deliveries"], config["dead_letter_queue"]) == kept
    assert api.value(REDRIVE, dead_letter_queue=dead) == 1
    got = deliver_once(api, q)
    assert (got["key"], got["delivery_count"]) == ("d", 1)


def s_redrive(api: OldApi, q: str) -> None:
    dead = dead_letter_one(api, q, "r")
    assert api.value(REDRIVE, dead_letter_queue=dead, max_count=10) == 1
    assert api.value(REDRIVE, dead_letter_queue=dead, max_count=10) == 0
    (row,) = api.rows(GET, queue=q, key="r")
    assert row["delivery_count"] == 0  # an ordinary message again, due now
    got = deliver_once(api, q)
    assert (got["key"], got["delivery_count"]) == ("r", 1)
    api.rows(CONFIGURE, queue=q)


def s_channel(api: OldApi, q: str) -> None:
    """The channel is the old rule, and a waiting session listening on it is woken by an offer."""
    channel = api.value(CHANNEL, queue=q)
    assert channel == "dq_" + hashlib.md5(q.encode()).hexdigest()
    api.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    try:
        assert timedelta(0) < api.value(WAIT, queue=q, max_wait=timedelta(minutes=5)) <= timedelta(minutes=5)
        offer(api, q, "wake")
        notes = list(api.conn.notifies(timeout=60, stop_after=1))
    finally:
        api.conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
    assert [(n.channel, n.payload) for n in notes] == [(channel, q)]
    assert api.rows(WAIT_DONE, queue=q) == [{"r": None}]
    deliver_once(api, q)


def s_wait(api: OldApi, q: str) -> None:
    pid = api.owner("SELECT pg_backend_pid()")[0][0]
    slept = api.value(WAIT, queue=q, max_wait=timedelta(seconds=30))
    assert timedelta(0) < slept <= timedelta(seconds=30)
    assert api.owner("SELECT count(*) FROM dq_waiters WHERE queue = %s AND pid = %s", q, pid) == [(1,)]
    offer(api, q, "due")
    assert api.value(WAIT, queue=q) == timedelta(0)  # a message is due: do not sleep
    assert api.rows(WAIT_DONE, queue=q) == [{"r": None}]
    deliver_once(api, q)


def s_wait_done(api: OldApi, q: str) -> None:
    pid = api.owner("SELECT pg_backend_pid()")[0][0]
    api.value(WAIT, queue=q, max_wait=timedelta(seconds=30))
    assert api.rows(WAIT_DONE, queue=q) == [{"r": None}]
    assert api.owner("SELECT count(*) FROM dq_waiters WHERE queue = %s AND pid = %s", q, pid) == [(0,)]
    assert api.rows(WAIT_DONE, queue=q) == [{"r": None}]  # not waiting: nothing to do


#: old signature -> the scenario that calls it (with whatever else it needs) and checks its results
SCENARIOS: dict[str, Callable[[OldApi, str], None]] = {
    OFFER: s_offer, OFFER_JSON: s_offer_json, OFFER_TEXT: s_offer_text, OFFER_MANY: s_offer_many,
    POLL: s_poll, POLL_OR_WAIT: s_poll_or_wait, ACK: s_ack, ACK_MANY: s_ack_many, NACK: s_nack,
    EXTEND: s_extend, CANCEL: s_cancel, GET: s_get, NEXT_DUE: s_next_due, CONFIGURE: s_configure,
    REDRIVE: s_redrive, CHANNEL: s_channel, WAIT: s_wait, WAIT_DONE: s_wait_done,
}


def call_the_old_api(conn: psycopg.Connection[Any], functions: dict[str, OldFunction], run: str,
                     columns: dict[str, list[str]], *, final: bool = False) -> None:
    """Run every scenario, in both call forms; leave no message behind."""
    assert set(SCENARIOS) == set(functions), (
        f"the old release's functions without a scenario: {sorted(set(functions) - set(SCENARIOS))}")
    for named in (False, True):
        replaced = {sig: REMOVED[sig].split("(", 1)[0] for sig in REMOVED} if final else {}
        api = OldApi(conn, functions, named=named, as_granted_role=final, replaced=replaced, columns=columns)
        prefix = f"old.{run}.{'named' if named else 'positional'}."
        for signature, scenario in SCENARIOS.items():
            scenario(api, prefix + signature.split("(", 1)[0] + "." + str(list(SCENARIOS).index(signature)))
        assert api.called == set(functions), sorted(set(functions) - api.called)
        left = conn.execute("SELECT queue, key FROM dq_messages WHERE queue LIKE %s", (prefix + "%",)).fetchall()
        assert left == [], f"{run}: the scenarios left messages behind: {left}"
    if final:
        for sig in REMOVED:  # the old call forms fail plainly, both of them
            for named in (False, True):
                api = OldApi(conn, functions, named=named)
                nulls = {name: None for name, _ in functions[sig].params[:functions[sig].required]}
                query, _ = api.statement(sig, nulls)
                with pytest.raises(psycopg.errors.UndefinedFunction):
                    conn.execute(query, list(nulls.values()))


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.name.split("-")[1])
def test_upgrade_from_previous_release_keeps_messages_and_functions(
    snapshot: Path, template_dsn: str, new_database, tmp_path: Path
) -> None:
    dsn = new_database()
    install_release(snapshot, dsn, tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        old_functions = public_functions(conn)
        old_helpers = [f for f in install_functions(conn) if f.startswith("dq__")]
        assert old_helpers, "the old release kept its helpers in the install schema"
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
        # Times the old release accepted and no client can read: the upgrade clamps them.
        conn.execute("SELECT dq_offer('times', 'minus', 'x', '-infinity')")
        conn.execute("SELECT dq_offer('times', 'plus', 'x', 'infinity')")
        before = conn.execute(
            "SELECT queue, key, delivery_count, last_error FROM dq_messages ORDER BY queue, key").fetchall()
        assert ("poison.dead", "p", 1, "boom") in before
        functions = old_api_of(conn)
        assert sorted(functions) == old_functions
        columns: dict[str, list[str]] = {}  # the old release's result columns, recorded by this first run
        call_the_old_api(conn, functions, "release", columns)

    new_steps = [s for s in schema_steps() if s not in old_steps]
    assert new_steps, "this tree adds no schema step over the release: nothing to upgrade"
    for step in new_steps:
        assert migrate(dsn, up_to=step) == [step]
        with psycopg.connect(dsn, autocommit=True) as conn:
            missing = [f for f in old_functions if conn.execute("SELECT to_regprocedure(%s)", (f,)).fetchone()[0]
                       is None]
            assert missing == [], f"after {step}, old workers would fail calling {missing}"
            call_the_old_api(conn, functions, step, columns)
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
        # Old workers after the upgrade, each call as the role granted the function; REMOVED
        # signatures are absent and their replacement, called with the old arguments, does the same.
        call_the_old_api(conn, functions, "final", columns, final=True)
        assert conn.execute("SELECT dq_ack(%s::uuid)", (token,)).fetchone()[0] is True  # the old token holds
        (ready,) = conn.execute("SELECT key FROM dq_poll_many('jobs', 5, '1 minute')").fetchall()
        assert ready == ("ready",)
        assert conn.execute("SELECT dq_redrive('poison.dead')").fetchone()[0] == 1
        times = conn.execute("SELECT key, scheduled_at, scheduled_at_initially FROM dq_messages "
                             "WHERE queue = 'times' ORDER BY key").fetchall()  # decoded by psycopg: readable
        assert [(k, a.year, b.year) for k, a, b in times] == [("minus", 1, 1), ("plus", 9999, 9999)]
        assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('times', 5, '1 minute')")] == ["minus"]
        # Nothing internal is left in the install schema: \df lists the API.
        check_only_the_api(conn)
    assert psql_names(dsn, "\\df dq_*") == set(ROLE_OF)
    assert schema_dump(dsn) == schema_dump(template_dsn)


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.name.split("-")[1])
def test_old_workers_can_call_every_function_between_schema_steps(
    snapshot: Path, new_database, tmp_path: Path
) -> None:
    """A rolling deploy, or an upgrade in several deploys (``migrate(up_to=…)``), runs old workers
    against every intermediate schema: each old function still returns what it returned."""
    dsn = new_database()
    install_release(snapshot, dsn, tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        functions = old_api_of(conn)
        old_steps = {r[0] for r in conn.execute("SELECT migration_id FROM _yoyo_migration")}
        columns: dict[str, list[str]] = {}
        call_the_old_api(conn, functions, "release", columns)
    for step in [s for s in schema_steps() if s not in old_steps]:
        assert migrate(dsn, up_to=step) == [step]
        with psycopg.connect(dsn, autocommit=True) as conn:
            call_the_old_api(conn, functions, step, columns)
