"""Nothing an application role can create is used inside our SECURITY DEFINER functions.

An application role may be allowed to create functions in the install schema (the database owner
may create in ``public`` under PostgreSQL 15's defaults; PUBLIC may on clusters created before 15).
Here such a role plants, in the install schema, a twin of every internal ``dq__*`` helper (same
name, same argument types) and an overload of each that takes ``text`` for every argument (an
overload wins where a call passes an argument whose type differs from the helper's, e.g. an
unknown literal). Each planted function advances a sequence (which no rollback undoes) and raises.
Then the whole public API is exercised as each role (dq_producer, dq_consumer, dq_admin), with the
planter's own search_path as well as the default one: every call must succeed as it would without
the plants, and the sequence must show that no planted function ever ran.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from installhelpers import privileges, run_psql_file
from psycopg import sql
from sqlhelpers import PROJECT, schema_dump

import pyqueue
from pyqueue.migrate import migrate

PLANTED_HITS = "public.planted_hits"


def internal_functions(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str, int, bool]]:
    """(name, arguments with defaults, result, number of input arguments, whether all are text) of
    every function of the private schema, as pg_get_function_arguments / pg_get_function_result
    print them."""
    return conn.execute(
        "SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid), "
        "       coalesce(array_length(p.proargtypes::oid[], 1), 0), "
        "       coalesce((SELECT bool_and(t = 'text'::regtype) FROM unnest(p.proargtypes::oid[]) t), true) "
        "  FROM pg_proc p WHERE p.pronamespace = 'public_internal'::regnamespace AND p.prokind = 'f' "
        " ORDER BY 1, 2").fetchall()


def plant(conn: psycopg.Connection[Any], planter: psycopg.Connection[Any]) -> int:
    """As ``planter`` (a role with CREATE on public), create a raising twin and a text overload of
    every internal helper in public; returns how many functions were planted."""
    planter.execute(f"CREATE SEQUENCE {PLANTED_HITS}")
    planter.execute(f"GRANT USAGE ON SEQUENCE {PLANTED_HITS} TO PUBLIC")
    planted = 0
    helpers = internal_functions(conn)
    # (name, arity) whose all-text signature is taken: by a helper's own twin, then by overloads.
    overloads = {(name, count) for name, _, _, count, all_text in helpers if all_text}
    for name, arguments, result, count, _ in helpers:
        body = (f"BEGIN PERFORM nextval('{PLANTED_HITS}'); "
                f"RAISE EXCEPTION 'planted % ran as %', {sql.quote(name)}, current_user; END")
        planter.execute(sql.SQL("CREATE FUNCTION public.{}({}) RETURNS {} LANGUAGE plpgsql AS {}").format(
            sql.Identifier(name), sql.SQL(arguments), sql.SQL(result), sql.Literal(body)))
        planted += 1
        # The overload: every input argument as text (same count, so a call of the helper's arity can
        # resolve to it), unless that is the helper's own signature or was planted for an overload of it.
        if count == 0 or (name, count) in overloads:
            continue
        overloads.add((name, count))
        params = sql.SQL(", ").join(sql.SQL(f"a{i} text") for i in range(count))
        returns = sql.SQL(result) if not result.startswith("TABLE(") else sql.SQL("SETOF record")
        if "OUT " in arguments or "INOUT " in arguments:
            returns = sql.SQL("record")
        planter.execute(sql.SQL("CREATE FUNCTION public.{}({}) RETURNS {} LANGUAGE plpgsql AS {}").format(
            sql.Identifier(name), params, returns, sql.Literal(body)))
        planted += 1
    return planted


def hits(conn: psycopg.Connection[Any]) -> int:
    """How many times a planted function ran (the sequence is not transactional)."""
    last, called = conn.execute(f"SELECT last_value, is_called FROM {PLANTED_HITS}").fetchone()  # noqa: S608
    return int(last) if called else 0


# --------------------------------------------------------------------------------- the whole API

def producer_calls(app: psycopg.Connection[Any], q: str) -> None:
    one = lambda query, *p: app.execute(query, p).fetchone()  # noqa: E731
    assert one("SELECT dq_now() = now()") == (True,)
    assert one("SELECT dq_offer(%s, 'j', '{\"a\": 1}'::jsonb)", q) == ("created",)
    assert one("SELECT dq_offer(%s, 't', 'text'::text, priority => 5, headers => '{\"h\": \"v\"}')", q) == ("created",)
    assert one("SELECT dq_offer(%s, 'b', '\\x00ff'::bytea, message_group => 'g', "
               "expires_at => now() + interval '1 day')", q) == ("created",)
    assert one("SELECT dq_offer(%s, 'b', '\\x00'::bytea, can_update => false)", q) == ("ignored",)
    assert one("SELECT count(*) FROM dq_offer_many(%s, ARRAY['m1', 'm2', 'm3'], ARRAY['x', 'y', 'z']::bytea[])",
               q) == (3,)
    assert one("SELECT created, updated, ignored FROM dq_offer_many_counts(%s, ARRAY['m1', 'm4'], "
               "ARRAY['x', 'w']::bytea[], can_update => false)", q) == (1, 0, 1)
    assert one("SELECT dq_cancel(%s, 'm3')", q) == (True,)
    assert one("SELECT dq_cancel_waiting(%s, 'm2')", q) == ("cancelled",)
    # A child of j and of p in the queue beside (released when both are acknowledged: admin_calls).
    assert one("SELECT dq_offer(%s, 'p', 'x'::text)", q + ".parent") == ("created",)
    after = "jsonb_build_array('j', jsonb_build_array(%s::text, 'p'), jsonb_build_array('elsewhere', 'x'))"
    assert one(f"SELECT dq_offer(%s, 'child', 'c'::text, after => {after}, on_parent_failure => 'proceed')",
               q, q + ".parent") == ("created",)


def consumer_calls(app: psycopg.Connection[Any], q: str) -> None:
    one = lambda query, *p: app.execute(query, p).fetchone()  # noqa: E731
    assert one("SELECT dq_now() = now()") == (True,)
    assert one("SELECT dq_channel(%s) LIKE 'dq\\_%%'", q) == (True,)
    assert one("SELECT dq_next_due(%s) <= clock_timestamp()", q) == (True,)
    assert one("SELECT count(*) FROM dq_get(%s, 'j')", q) == (1,)
    assert one("SELECT count(*) FROM dq_dependencies(%s, 'child')", q) == (2,)
    tokens = [r[0] for r in app.execute("SELECT lock_token FROM dq_poll_many(%s, 3, interval '1 minute')", (q,))]
    assert len(tokens) == 3
    assert one("SELECT dq_ack(%s)", tokens[0]) == (True,)
    assert one("SELECT dq_nack(%s, interval '0 seconds', 'failed')", tokens[1]) == (True,)
    assert one("SELECT outcome FROM dq_nack_outcome(%s, interval '0 seconds', 'again')", tokens[1]) == ("stale",)
    assert one("SELECT dq_extend(%s, interval '2 minutes') > clock_timestamp()", tokens[2]) == (True,)
    assert one("SELECT dq_release(ARRAY[%s]::uuid[])", tokens[2]) == (1,)
    (token,) = one("SELECT lock_token FROM dq_poll_many(%s, 1, interval '1 minute')", q)
    assert one("SELECT dq_ack_many(ARRAY[%s]::uuid[])", token) == (1,)
    row = one("SELECT lock_token FROM dq_poll_or_wait(%s, 1, interval '1 minute', interval '0.1 seconds')", q)
    assert row is not None
    assert one("SELECT dq_ack(%s)", row[0]) == (True,)
    assert one("SELECT dq_wait(%s, interval '0.05 seconds') IS NOT NULL", q + ".empty") is not None
    app.execute("SELECT dq_wait_done(%s)", (q + ".empty",))
    assert one("SELECT id_min IS NOT NULL FROM dq_export_messages_bounds()") == (True,)
    with app.transaction():
        cursor = one("SELECT dq_export_messages()")[0]
        assert app.execute(sql.SQL("FETCH ALL FROM {}").format(sql.Identifier(cursor))).fetchall()


def admin_calls(app: psycopg.Connection[Any], q: str) -> None:
    one = lambda query, *p: app.execute(query, p).fetchone()  # noqa: E731
    dlq = q + ".dlq"
    app.execute("SELECT dq_configure_queue(%s, max_deliveries => 1, dead_letter_queue => %s, archive => true, "
                "retention => interval '1 day', notify => true, max_in_flight => 50, rate_limit => 1000, "
                "rate_period => interval '1 second')", (q, dlq))
    assert one("SELECT dq_pause_queue(%s)", q) == (True,)
    assert one("SELECT count(*) FROM dq_poll_many(%s, 10)", q) == (0,)
    assert one("SELECT dq_resume_queue(%s)", q) == (True,)
    assert one("SELECT (dq_queue_stats(%s)).queue", q) == (q,)
    assert one("SELECT count(*) > 0 FROM dq_stats") == (True,)
    assert one("SELECT count(*) > 0 FROM dq_metrics()") == (True,)
    assert one("SELECT count(*) > 0 FROM dq_table_health()") == (True,)
    assert one("SELECT count(*) > 0 FROM dq_health") == (True,)
    assert one("SELECT count(*) > 0 FROM dq_list_messages(%s)", q) == (True,)
    # A message nacked after its only delivery goes to the dead-letter queue at its next poll.
    assert one("SELECT dq_offer(%s, 'poison', 'x'::text)", q) == ("created",)
    polled = app.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100, interval '1 minute')", (q,)).fetchall()
    assert polled
    for key, token in polled:
        if key == "poison":
            assert one("SELECT dq_nack(%s, interval '0 seconds', 'boom')", token) == (True,)
        else:
            assert one("SELECT dq_ack(%s)", token) == (True,)
    assert one("SELECT count(*) FROM dq_poll_many(%s, 10)", q) == (0,)
    assert one("SELECT count(*) FROM dq_dead_letters(%s)", dlq) == (1,)
    assert one("SELECT dq_redrive(%s)", dlq) == (1,)
    # The web console's functions (sql/168_console.sql): the redriven message dies again first (its
    # consumer gives up).
    (token,) = one("SELECT lock_token FROM dq_poll_many(%s, 1, interval '1 minute')", q)
    assert one("SELECT outcome FROM dq_dead_letter(%s, 'boom')", token) == ("dead_lettered",)
    (dead_id,) = one("SELECT id FROM dq_browse_messages(%s, 'dead')", dlq)
    assert one("SELECT count(*) FROM dq_message_detail(%s, %s)", dlq, dead_id) == (1,)
    assert one("SELECT messages FROM dq_dead_letter_groups(%s)", dlq) == (1,)
    assert one("SELECT dq_count_dead_letters(%s, %s, 'boom')", dlq, q) == (1,)
    assert one("SELECT dq_redrive_messages(%s, %s)", dlq, [dead_id]) == (1,)
    assert one("SELECT dq_redrive_matching(%s)", dlq) == (0,)
    assert one("SELECT dq_offer(%s, 'later', 'x'::text, now() + interval '1 hour')", q) == ("created",)
    assert one("SELECT dq_make_due(%s, 'later')", q) == (True,)
    assert one("SELECT (dq_queue_config(%s)).max_deliveries", q) == (1,)
    assert one("SELECT count(*) > 0 FROM dq_throughput(%s)", q) == (True,)
    assert one("SELECT dq_audit('planted', 'test', %s, NULL, NULL, 'ok') > 0", q) == (True,)
    assert one("SELECT count(*) > 0 FROM dq_audit_entries()") == (True,)
    assert one("SELECT dq_release_locks(%s) >= 0", q) == (True,)
    assert one("SELECT id_min IS NOT NULL FROM dq_export_archive_bounds()") == (True,)
    with app.transaction():
        cursor = one("SELECT dq_export_archive()")[0]
        assert app.execute(sql.SQL("FETCH ALL FROM {}").format(sql.Identifier(cursor))).fetchall()
    assert one("SELECT dq_prune_archive() >= 0") == (True,)
    app.execute("CALL dq_prune_archive_all()")
    # The last parent of the producer's child is acknowledged: the child is released.
    (token,) = one("SELECT lock_token FROM dq_poll_many(%s, 1, interval '1 minute')", q + ".parent")
    assert one("SELECT dq_ack(%s)", token) == (True,)
    assert one("SELECT count(*) FROM dq_dependencies(%s, 'child')", q) == (0,)
    assert one("SELECT dq_release_backlog() >= 0") == (True,)
    assert one("SELECT dq_purge(%s, confirm => true) >= 0", q) == (True,)
    # Schedules.
    assert one("SELECT count(*) FROM dq_cron_occurrences('every 1 hour', 'UTC', now(), 'infinity', 3)") == (3,)
    assert one("SELECT dq_cron_config_hash(%s, 'every 1 hour', 'UTC', 'x'::bytea, 'text/plain') IS NOT NULL",
               q) == (True,)
    for payload in ("'x'::bytea", "'{}'::jsonb", "'x'::text"):
        assert one(f"SELECT dq_cron_install('s-' || md5({payload}::text), %s, 'every 1 hour', {payload})", q)
    assert one("SELECT count(*) FROM dq_cron_list()") == (3,)
    assert one("SELECT count(*) FROM dq_cron_schedules") == (3,)
    name = one("SELECT name FROM dq_cron_list() ORDER BY name LIMIT 1")[0]
    assert one("SELECT dq_cron_pause(%s)", name) == (True,)
    assert one("SELECT dq_cron_resume(%s)", name) == (True,)
    assert one("SELECT dq_cron_tick() >= 0") == (True,)
    assert one("SELECT dq_cron_uninstall(%s)", name) == (True,)
    assert one("SELECT dq_install_tick(%s, 'tick-', 'h1', ARRAY[now() + interval '1 hour'], ARRAY['x']::bytea[])",
               q) == (1,)
    assert one("SELECT dq_uninstall_tick(%s, 'tick-')", q) == (1,)
    assert one("SELECT dq_cron_prune_run_details() >= 0") == (True,)
    # The consumer and producer functions, as the admin (a member of both roles).
    producer_calls(app, q + ".admin")
    consumer_calls(app, q + ".admin")


SCENARIOS: dict[str, list[Callable[[psycopg.Connection[Any], str], None]]] = {
    "dq_producer": [producer_calls],
    "dq_consumer": [consumer_calls],
    "dq_admin": [admin_calls],
}


@pytest.fixture
def planter(dsn: str, conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """A role that may create in the install schema (as the database owner may) and is in no dq role."""
    name = f"planter_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(sql.Identifier(name)))
    conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(name)))
    with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, user=name, password="pw"), autocommit=True) as c:
        yield c
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_the_scenarios_call_every_public_function(conn: psycopg.Connection[Any]) -> None:
    import inspect

    names = {r[0] for r in conn.execute(
        "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'dq\\_%'")}
    assert len(names) > 35
    text = "".join(inspect.getsource(f) for f in (producer_calls, consumer_calls, admin_calls))
    assert {n for n in names if f"{n}(" not in text} == set()


@pytest.mark.parametrize("role", ["dq_producer", "dq_consumer", "dq_admin"])
@pytest.mark.parametrize("path", ["default", "planter"])
def test_planted_helpers_are_never_used(conn: psycopg.Connection[Any], login: Any, planter: psycopg.Connection[Any],
                                        role: str, path: str) -> None:
    assert plant(conn, planter) > 2 * 40
    # The planter's plants are visible: called directly, a twin runs (and counts).
    with pytest.raises(psycopg.errors.RaiseException, match="planted dq__now"):
        planter.execute("SELECT public.dq__now()")
    assert hits(conn) == 1
    q = f"planted.{role}"
    if role != "dq_producer":  # the consumer's messages come from a producer
        producer_calls(conn, q)
    with psycopg.connect(login(role), autocommit=True) as app:
        if path == "planter":
            app.execute("SET search_path = public, pg_temp")
        for scenario in SCENARIOS[role]:
            scenario(app, q)
    assert hits(conn) == 1, "a planted function ran inside the API"
    # The application role did not gain the owner's rights.
    assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (True,)
    assert conn.execute(
        "SELECT count(*) FROM pg_roles WHERE rolsuper AND rolname LIKE 'login\\_%' OR rolname LIKE 'planter\\_%' "
        "AND rolsuper").fetchone() == (0,)


# ------------------------------------------------------------------------ the install schema's owner

@pytest.mark.parametrize("how", ["database owner", "schema owner"])
def test_an_install_schema_another_role_owns_is_refused(dsn: str, conn: psycopg.Connection[Any], how: str) -> None:
    """The owner of the install schema may drop and replace any object in it, so installing there
    as another role would hand it that role's rights: refused (42501), nothing changed, unless the
    session sets dq.allow_schema_owner = on."""
    app = f"app_{uuid.uuid4().hex[:8]}"
    dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(app)))
    if how == "database owner":  # public belongs to pg_database_owner, that is to the database's owner
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(dbname), sql.Identifier(app)))
    else:
        conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(app)))
    try:
        before = schema_dump(dsn), privileges(dsn)
        for path in sorted((PROJECT / "sql").glob("*.sql"))[:1]:
            proc = run_psql_file(dsn, path)
            assert proc.returncode != 0
            assert f"schema public is owned by role {app}" in proc.stderr
            assert "act with the rights of the installing role postgres" in proc.stderr
        with pytest.raises(pyqueue.InsufficientPrivilege, match=f"owned by role {app}") as raised:
            migrate(dsn)
        assert raised.value.sqlstate == "42501"
        assert (schema_dump(dsn), privileges(dsn)) == before
        # Trusting the owner explicitly installs as before.
        trusting = psycopg.conninfo.make_conninfo(dsn, options="-c dq.allow_schema_owner=on")
        migrate(trusting)
        assert conn.execute("SELECT dq_offer('q', 'k', 'x'::text)").fetchone() == ("created",)
    finally:
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO postgres").format(sql.Identifier(dbname)))
        conn.execute("ALTER SCHEMA public OWNER TO pg_database_owner")
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(app)))


def test_a_fresh_database_another_role_owns_is_refused_before_any_step(admin_dsn: str) -> None:
    """``CREATE DATABASE appdb OWNER app``, migrated as postgres into public: ``pyqueue migrate``
    (and :func:`pyqueue.migrate.migrate`) refuse before the first schema step, so nothing is
    written; the CLI says so in one line."""
    from test_migrations import pyqueue_cli

    from pyqueue import testing

    app = f"app_{uuid.uuid4().hex[:8]}"
    name = f"dq_owned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(app)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(app)))
    dsn = testing.with_dbname(admin_dsn, name)
    try:
        with pytest.raises(pyqueue.InsufficientPrivilege, match=f"owned by role {app}"):
            migrate(dsn)
        proc = pyqueue_cli("migrate", "--dsn", dsn, returncode=2)
        assert "Traceback" not in proc.stderr and f"owned by role {app}" in proc.stderr and "42501" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace").fetchone() == (0,)
            assert conn.execute("SELECT to_regnamespace('public_internal')").fetchone() == (None,)
    finally:
        testing.drop_database(admin_dsn, name)
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(app)))
