"""The files of ``sql/`` as an installer sees them.

* Each file is self-contained and re-runnable: running any one of them again (through ``psql -f``
  with psql's default search_path, or through psycopg) changes nothing, ``pg_dump --schema-only``
  and the privileges included.
* Privileges are table-driven from ``pg_proc``: every public ``dq_*`` function is SECURITY DEFINER
  with the pinned search_path and executable by exactly the roles of :data:`installhelpers.ROLE_OF`
  (and dq_viewer for :data:`installhelpers.VIEWER_READS`);
  every internal ``dq__*`` helper lives in the private schema ``<install>_internal`` and is
  executable by no role, which may not even use that schema. A new function fails the test until it
  is added there.
* A second install in another schema of the same database (tables from the numbered
  ``migrations/*.sql`` steps, functions from ``sql/``, both run with that schema first on the
  search_path) is independent: its functions see only its tables, its NOTIFY channels and pg_cron
  jobs differ from those of the install in ``public``.
"""

from __future__ import annotations

import select
from pathlib import Path
from typing import Any

import psycopg
import pytest
from installhelpers import ROLE_OF, ROLES, VIEWER_READS, privileges, run_psql_file
from psycopg import sql
from sqlhelpers import PROJECT, schema_dump

SQL_FILES = sorted((PROJECT / "sql").glob("*.sql"))
SCHEMA_STEPS = sorted(
    p for p in (PROJECT / "migrations").glob("*.sql") if not p.name.endswith(".rollback.sql")
)

#: Which roles may execute a function granted to a role (through membership).
MAY_EXECUTE = {
    "dq_producer": {"dq_producer", "dq_admin"},
    "dq_consumer": {"dq_consumer", "dq_admin"},
    "dq_admin": {"dq_admin"},
    "dq_producer+dq_consumer": {"dq_producer", "dq_consumer", "dq_admin"},
}


@pytest.mark.parametrize("path", SQL_FILES, ids=[p.name for p in SQL_FILES])
def test_rerunning_one_file_changes_nothing(module_dsn: str, path: Path) -> None:
    before = schema_dump(module_dsn), privileges(module_dsn)
    proc = run_psql_file(module_dsn, path)
    assert proc.returncode == 0, proc.stderr
    assert (schema_dump(module_dsn), privileges(module_dsn)) == before
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        conn.execute(path.read_text(encoding="utf-8"))  # type: ignore[arg-type]
    assert (schema_dump(module_dsn), privileges(module_dsn)) == before


def test_every_file_pins_the_search_path_first_and_re_pins_its_functions_last() -> None:
    for path in SQL_FILES:
        statements = [
            line for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("--")
        ]
        assert statements[0].startswith("SELECT pg_catalog.set_config('search_path',"), path.name
        # ... and ends by re-pinning its SECURITY DEFINER functions to the private schema first.
        assert statements[-1].startswith("SELECT dq__search_path(internal => false);"), path.name


def test_privileges_are_those_of_the_table(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT p.oid, p.oid::regprocedure::text, p.proname, p.prokind, p.prosecdef, p.proconfig, n.nspname "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname IN ('public', 'public_internal') ORDER BY 2"
    ).fetchall()
    assert len(rows) > 60
    public_names = set()
    for oid, sig, name, kind, secdef, config, schema in rows:
        executable_by = {
            role
            for role in ("public", *ROLES)
            if conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, oid)).fetchone()[0]
        }
        if schema == "public_internal":
            assert name.startswith("dq__"), sig
            assert executable_by == set(), sig
            assert not secdef, sig
            continue
        assert not name.startswith("dq__"), f"{sig}: an internal helper in the install schema"
        public_names.add(name)
        assert name in ROLE_OF, f"{sig} is not in ROLE_OF: add it with the role that may execute it"
        assert executable_by == MAY_EXECUTE[ROLE_OF[name]] | ({"dq_viewer"} if name in VIEWER_READS else set()), sig
        if kind == "p":  # a procedure that commits can be neither SECURITY DEFINER nor pinned
            assert not secdef and config is None, sig
        else:
            assert secdef, sig
            assert "search_path=public_internal, public, pg_temp" in config, sig
    assert public_names == set(ROLE_OF)
    # No application role may use the private schema: the helpers are reached only by the owner.
    for role in ("public", *ROLES):
        assert conn.execute("SELECT has_schema_privilege(%s, 'public_internal', 'USAGE')", (role,)).fetchone() == (
            False,), role


def test_views_are_granted_to_dq_admin_and_dq_viewer_only(conn: psycopg.Connection[Any]) -> None:
    for view in ("dq_stats", "dq_cron_schedules", "dq_health"):
        granted = {
            role
            for role in ("public", *ROLES)
            if conn.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", (role, view)).fetchone()[0]
        }
        assert granted == {"dq_admin", "dq_viewer"}, view


# --------------------------------------------------------------------------- a second install


def install_into(dsn: str, schema: str) -> None:
    """Tables from the numbered migration steps, then the functions, with ``schema`` first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        for path in SCHEMA_STEPS:
            conn.execute(path.read_text(encoding="utf-8"))  # type: ignore[arg-type]
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        for path in SQL_FILES:
            conn.execute(path.read_text(encoding="utf-8"))  # type: ignore[arg-type]


OTHER = "Other Q"  # a name that needs quoting
OTHER_INTERNAL = "Other Q_internal"  # its private schema


def in_other(query: str) -> sql.Composed:
    """``query`` with ``{o}`` replaced by the quoted name of the second schema, ``{oi}`` by its
    private schema's."""
    return sql.SQL(query).format(o=sql.Identifier(OTHER), oi=sql.Identifier(OTHER_INTERNAL))  # type: ignore[arg-type]


def one(conn: psycopg.Connection[Any], query: str | sql.Composable, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


def test_a_second_schema_is_an_independent_install(dsn: str) -> None:
    install_into(dsn, OTHER)
    other = sql.Identifier(OTHER).as_string(None)
    other_internal = sql.Identifier(OTHER_INTERNAL).as_string(None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Every function of the second install pins its own schema.
        configs = conn.execute(
            "SELECT DISTINCT p.proconfig[1] FROM pg_proc p "
            "WHERE p.pronamespace = %s::regnamespace AND p.proconfig IS NOT NULL",
            (other,),
        ).fetchall()
        assert configs == [(f"search_path={other_internal}, {other}, pg_temp",)]
        assert one(conn, in_other("SELECT {oi}.dq__schema()")) == OTHER
        assert one(conn, "SELECT public_internal.dq__schema()") == "public"
        # Its helpers live in its own private schema, and none in the install schema.
        assert one(conn, "SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace "
                   "AND proname LIKE 'dq\\_\\_%%'", other) == 0
        assert one(conn, "SELECT count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace", other_internal) == one(
            conn, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public_internal'::regnamespace") > 40

        # One queue name, one key in both: each install sees only its own message.
        assert one(conn, "SELECT public.dq_offer('q', 'k', 'in public'::text)") == "created"
        assert one(conn, in_other("SELECT {o}.dq_offer('q', 'k', 'in other'::text)")) == "created"
        assert one(conn, in_other("SELECT convert_from(payload, 'UTF8') FROM {o}.dq_get('q', 'k')")) == "in other"
        assert one(conn, "SELECT convert_from(payload, 'UTF8') FROM public.dq_get('q', 'k')") == "in public"
        token = one(conn, in_other("SELECT lock_token FROM {o}.dq_poll_many('q')"))
        assert one(conn, "SELECT public.dq_ack(%s::uuid)", token) is False
        assert one(conn, in_other("SELECT {o}.dq_ack(%s::uuid)"), token) is True
        assert one(conn, "SELECT count(*) FROM public.dq_messages") == 1
        assert one(conn, in_other("SELECT count(*) FROM {o}.dq_messages")) == 0

        # Channels and pg_cron jobs differ; public keeps the names of earlier releases.
        assert one(conn, "SELECT public.dq_channel('q')") == "dq_" + one(conn, "SELECT md5('q')")
        assert one(conn, in_other("SELECT {o}.dq_channel('q')")) == "dq_" + one(conn, "SELECT md5(%s)", other + ".q")
        assert conn.execute("SELECT * FROM public_internal.dq__pg_cron_jobs() ORDER BY 1").fetchall() == [
            ("dq-archive-prune", "*/10 * * * *", "CALL public.dq_prune_archive_all()"),
            ("dq-cron-prune-history", "17 3 * * *", "SELECT public.dq_cron_prune_run_details()"),
            ("dq-cron-tick", "* * * * *", "SELECT public.dq_cron_tick()"),
            ("dq-release", "* * * * *", "SELECT public.dq_release_backlog(100000)"),  # no pg_cron 1.5 here
            ("dq-vacuum", "* * * * *", "VACUUM (SKIP_LOCKED) public.dq_messages"),
        ]
        assert conn.execute(in_other("SELECT * FROM {oi}.dq__pg_cron_jobs() ORDER BY 1")).fetchall() == [
            (f"dq-archive-prune@{OTHER}", "*/10 * * * *", f"CALL {other}.dq_prune_archive_all()"),
            (f"dq-cron-prune-history@{OTHER}", "17 3 * * *", f"SELECT {other}.dq_cron_prune_run_details()"),
            (f"dq-cron-tick@{OTHER}", "* * * * *", f"SELECT {other}.dq_cron_tick()"),
            (f"dq-release@{OTHER}", "* * * * *", f"SELECT {other}.dq_release_backlog(100000)"),
            (f"dq-vacuum@{OTHER}", "* * * * *", f"VACUUM (SKIP_LOCKED) {other}.dq_messages"),
        ]
        # Each tick job's command runs its own install's tick, whatever the search_path.
        tick_command = in_other("SELECT command FROM {oi}.dq__pg_cron_jobs() WHERE jobname LIKE 'dq-cron-tick%%'")
        conn.execute("SELECT public.dq_cron_install('s', 'cq', 'every 1 hour', 'x'::text)")
        conn.execute("DELETE FROM public.dq_messages")
        conn.execute(in_other("SELECT {o}.dq_cron_install('s', 'cq', 'every 1 hour', 'x'::text)"))
        conn.execute(in_other("DELETE FROM {o}.dq_messages"))
        conn.execute("UPDATE public.dq_cron SET next_at = NULL, installed_through = NULL")
        conn.execute(one(conn, tick_command))
        assert one(conn, in_other("SELECT count(*) FROM {o}.dq_messages")) == 0  # its schedule needed no work
        assert one(conn, "SELECT count(*) FROM public.dq_messages") == 0
        conn.execute(in_other("UPDATE {o}.dq_cron SET next_at = NULL, installed_through = NULL"))
        conn.execute(one(conn, tick_command))
        assert one(conn, in_other("SELECT count(*) FROM {o}.dq_messages")) == 1
        assert one(conn, "SELECT count(*) FROM public.dq_messages") == 0
        # The retention procedure, which cannot pin a search_path, calls its own install's function.
        src = one(conn, "SELECT prosrc FROM pg_proc WHERE oid = %s::regproc", other + ".dq_prune_archive_all")
        assert f"{other}.dq_prune_archive(batch_size)" in src
        conn.execute("SET search_path = public")
        conn.execute(in_other("CALL {o}.dq_prune_archive_all()"))

        # The roles reach the second install through the schema, and still not its tables.
        conn.execute("SET ROLE dq_producer")
        assert one(conn, in_other("SELECT {o}.dq_offer('p', 'k', 'x'::text)")) == "created"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(in_other("SELECT count(*) FROM {o}.dq_messages"))
        conn.execute("RESET ROLE")


def test_offers_in_one_schema_do_not_wake_consumers_of_the_other(dsn: str) -> None:
    install_into(dsn, OTHER)
    with psycopg.connect(dsn, autocommit=True) as consumer, psycopg.connect(dsn, autocommit=True) as producer:
        channel = one(consumer, "SELECT public.dq_channel('q')")
        consumer.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        one(consumer, "SELECT public.dq_wait('q', '30 seconds')")

        def notified(timeout: float) -> list[str]:
            select.select([consumer.fileno()], [], [], timeout)
            return [n.payload for n in consumer.notifies(timeout=0.01, stop_after=1)]

        one(producer, in_other("SELECT {o}.dq_offer('q', 'k', 'x'::text)"))
        assert notified(1.0) == []
        one(producer, "SELECT public.dq_offer('q', 'k', 'x'::text)")
        assert notified(5.0) == ["q"]
