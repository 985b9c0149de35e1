"""Helpers shared by the tests of the installer and of what it installs (tests/install).

* The public API and its roles (:data:`ROLE_OF`), read back from the catalogs of an install: its
  functions and their comments, privileges, psql's ``\\df``, objects per schema.
* The numbered schema steps and rolling them back as yoyo does.
* The programs an operator runs: ``psql -f``, ``yoyo``, ``pyqueue``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from sqlhelpers import PROJECT, pg_program
from yoyo import get_backend, read_migrations

from pyqueue.migrate import FUNCTION_STEP, migrations_dir, yoyo_uri
from pyqueue.migrate import schema_steps as installer_schema_steps

#: The application roles an install creates.
ROLES = ("dq_producer", "dq_consumer", "dq_admin", "dq_viewer")

#: The functions the read-only role dq_viewer may execute too (besides the role of :data:`ROLE_OF`);
#: it may change nothing (tests/operations/test_observability_sql.py calls every other one as it).
VIEWER_READS = frozenset({
    "dq_now", "dq_get", "dq_dependencies", "dq_next_due", "dq_list_messages", "dq_dead_letters", "dq_queue_stats",
    "dq_cron_list", "dq_cron_occurrences", "dq_metrics", "dq_table_health",
    # the web console's reads (sql/168_console.sql)
    "dq_browse_messages", "dq_message_detail", "dq_dead_letter_groups", "dq_count_dead_letters", "dq_queue_config",
    "dq_throughput", "dq_audit_entries",
    # the console's live updates LISTEN on the queues' channels
    "dq_channel",
})

#: The role granted EXECUTE on each public function (dq_admin is a member of the other three).
ROLE_OF = {
    "dq_offer": "dq_producer",
    "dq_offer_many": "dq_producer",
    "dq_offer_many_counts": "dq_producer",
    "dq_cancel": "dq_producer",
    "dq_cancel_waiting": "dq_producer",
    "dq_poll_many": "dq_consumer",
    "dq_poll_or_wait": "dq_consumer",
    "dq_wait": "dq_consumer",
    "dq_wait_done": "dq_consumer",
    "dq_channel": "dq_consumer",
    "dq_now": "dq_producer+dq_consumer",
    "dq_ack": "dq_consumer",
    "dq_ack_many": "dq_consumer",
    "dq_nack": "dq_consumer",
    "dq_nack_outcome": "dq_consumer",
    "dq_dead_letter": "dq_consumer",
    "dq_extend": "dq_consumer",
    "dq_release": "dq_consumer",
    "dq_get": "dq_consumer",
    "dq_dependencies": "dq_consumer",
    "dq_export_messages": "dq_consumer",
    "dq_export_messages_bounds": "dq_consumer",
    "dq_export_archive": "dq_admin",
    "dq_export_archive_bounds": "dq_admin",
    "dq_next_due": "dq_consumer",
    "dq_configure_queue": "dq_admin",
    "dq_pause_queue": "dq_admin",
    "dq_resume_queue": "dq_admin",
    "dq_redrive": "dq_admin",
    "dq_dead_letters": "dq_admin",
    "dq_list_messages": "dq_admin",
    "dq_purge": "dq_admin",
    "dq_release_backlog": "dq_admin",
    "dq_release_locks": "dq_admin",
    "dq_prune_archive": "dq_admin",
    "dq_prune_archive_all": "dq_admin",
    "dq_queue_stats": "dq_admin",
    "dq_install_tick": "dq_admin",
    "dq_uninstall_tick": "dq_admin",
    "dq_cron_config_hash": "dq_admin",
    "dq_cron_occurrences": "dq_admin",
    "dq_cron_install": "dq_admin",
    "dq_cron_uninstall": "dq_admin",
    "dq_cron_pause": "dq_admin",
    "dq_cron_resume": "dq_admin",
    "dq_cron_tick": "dq_admin",
    "dq_cron_list": "dq_admin",
    "dq_cron_prune_run_details": "dq_admin",
    "dq_metrics": "dq_admin",
    "dq_table_health": "dq_admin",
    "dq_browse_messages": "dq_admin",
    "dq_message_detail": "dq_admin",
    "dq_dead_letter_groups": "dq_admin",
    "dq_count_dead_letters": "dq_admin",
    "dq_redrive_messages": "dq_admin",
    "dq_redrive_matching": "dq_admin",
    "dq_make_due": "dq_admin",
    "dq_queue_config": "dq_admin",
    "dq_throughput": "dq_admin",
    "dq_audit": "dq_admin",
    "dq_audit_entries": "dq_admin",
}


def install_functions(conn: psycopg.Connection[Any], schema: str = "public") -> dict[str, str | None]:
    """Every function and procedure of the install schema: signature -> comment."""
    return dict(conn.execute(
        "SELECT p.oid::regprocedure::text, obj_description(p.oid, 'pg_proc') FROM pg_proc p "
        "WHERE p.pronamespace = %s::regnamespace ORDER BY 1", (schema,)).fetchall())


def check_only_the_api(conn: psycopg.Connection[Any], schema: str = "public") -> None:
    """The install schema's functions are the documented API, each with its comment."""
    functions = install_functions(conn, schema)
    names = {sig.split("(", 1)[0] for sig in functions}
    assert names == set(ROLE_OF), f"not the API: {sorted(names ^ set(ROLE_OF))}"
    for sig, comment in functions.items():
        name = sig.split("(", 1)[0]
        assert comment, f"{sig} has no COMMENT ON FUNCTION"
        assert comment.startswith((name, "CALL " + name)), f"{sig}: the comment does not document it: {comment[:60]}"


def psql_names(dsn: str, command: str) -> set[str]:
    """The names psql's ``command`` (``\\df …``) lists, through the real psql."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    proc = subprocess.run(
        [pg_program("psql"), dsn, "-X", "-A", "-t", "-F", "|", "-c", command],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("|") for line in proc.stdout.splitlines() if line]
    assert all(r[0] == "public" for r in rows), rows
    return {r[1] for r in rows}


def privileges(dsn: str) -> list[tuple[Any, ...]]:
    """Security flags, settings and ACLs of every dq object, and the roles' memberships."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT n.nspname, p.oid::regprocedure::text, p.prosecdef::text, p.proconfig::text, p.proacl::text "
            "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.proname LIKE 'dq%' "
            "UNION ALL SELECT n.nspname, c.relname, c.relkind::text, NULL, c.relacl::text "
            "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname LIKE 'dq%' "
            "UNION ALL SELECT nspname, 'schema', NULL, NULL, nspacl::text FROM pg_namespace "
            "UNION ALL SELECT g.rolname, r.rolname, 'member', NULL, NULL FROM pg_auth_members m "
            "  JOIN pg_roles r ON r.oid = m.member JOIN pg_roles g ON g.oid = m.roleid WHERE g.rolname LIKE 'dq%' "
            "ORDER BY 1, 2"
        ).fetchall()


def run_psql_file(dsn: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``psql -f path`` (stop at the first error), with psql's defaults: no PG* variable, no psqlrc."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.run(
        [pg_program("psql"), dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def query(dsn: str, text: str) -> list[tuple[Any, ...]]:
    """Every row of ``text`` run on a new autocommit connection to ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(text).fetchall()  # type: ignore[arg-type]


def functions(dsn: str) -> list[tuple[Any, ...]]:
    """Every dq_* function with its oid and the xmin of its pg_proc row (changes on re-create)."""
    return query(
        dsn,
        "SELECT p.oid::regprocedure::text, p.oid::bigint, p.xmin::text, md5(p.prosrc) FROM pg_proc p "
        "WHERE p.proname LIKE 'dq\\_%' ORDER BY 1",
    )


def applied_migrations(dsn: str) -> list[tuple[Any, ...]]:
    """The ids of the schema steps yoyo recorded as applied, in order."""
    return query(dsn, "SELECT migration_id FROM _yoyo_migration ORDER BY migration_id")


def objects_in(dsn: str, schema: str) -> dict[str, int]:
    """How many dq_* functions, relations and types, and yoyo tables, ``schema`` holds."""
    (row,) = query(dsn, f"""
        SELECT (SELECT count(*) FROM pg_proc WHERE pronamespace = n.oid AND proname LIKE 'dq\\_%'),
               (SELECT count(*) FROM pg_class WHERE relnamespace = n.oid AND relname LIKE 'dq\\_%'),
               (SELECT count(*) FROM pg_type WHERE typnamespace = n.oid AND typname LIKE 'dq\\_%'
                  AND typrelid = 0 AND typelem = 0),
               (SELECT count(*) FROM pg_class WHERE relnamespace = n.oid
                  AND relname IN ('_yoyo_migration', '_yoyo_log', '_yoyo_version', 'yoyo_lock'))
          FROM pg_namespace n WHERE n.nspname = '{schema}'""")  # noqa: S608 (test constants)
    return dict(zip(("functions", "relations", "types", "yoyo"), row, strict=True))


def schema_steps() -> list[str]:
    """The numbered schema migrations, in order (everything but the function step 9999_sql)."""
    steps = sorted(m.id for m in read_migrations(str(migrations_dir())) if m.id != FUNCTION_STEP)
    assert steps == installer_schema_steps()
    return steps


def rollback(dsn: str, from_step: str, schema: str | None = None) -> list[str]:
    """Roll back (as ``yoyo rollback``) every applied schema step from ``from_step`` on; their ids."""
    backend = get_backend(yoyo_uri(dsn, schema))
    try:
        migrations = read_migrations(str(migrations_dir())).filter(lambda m: m.id >= from_step)
        with backend.lock():
            todo = backend.to_rollback(migrations)
            backend.rollback_migrations(todo)
    finally:
        backend.connection.close()
    return [m.id for m in todo]


def yoyo_cli() -> str:
    """The path of the ``yoyo`` command (beside this interpreter, or on PATH)."""
    candidate = Path(sys.executable).parent / "yoyo"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("yoyo")
    assert found is not None, "the yoyo CLI is not installed"
    return found


def pyqueue_cli(*args: str, pythonpath: Path = PROJECT, returncode: int = 0) -> subprocess.CompletedProcess[str]:
    """``pyqueue ARGS`` in a new process, importing the package from ``pythonpath``; asserts its
    exit status is ``returncode``."""
    proc = subprocess.run(
        [sys.executable, "-m", "pyqueue.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(pythonpath)),
        cwd=pythonpath,  # python -m puts the working directory first on sys.path
    )
    assert proc.returncode == returncode, f"pyqueue {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc
