"""Installs into a schema of the user's choice (rule 6 of the docstring of pyqueue.migrate).

* ``migrate(dsn, schema=NAME)`` creates the schema and installs everything into it, yoyo's own
  bookkeeping tables included; running it again changes nothing;
* two schemas of one database hold two independent installs: the functions of each see only
  their own tables, and one is rolled back without touching the other;
* plain yoyo with the URL parameter the docs give (``?schema=NAME``, or libpq's
  ``?options=-csearch_path%3DNAME``) reaches the same state as ``pyqueue migrate --schema NAME``;
* in the database where pg_cron runs, an install outside ``public`` registers jobs of its own.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import psycopg
import pytest
from installhelpers import (
    applied_migrations,
    functions,
    objects_in,
    pyqueue_cli,
    query,
    rollback,
    schema_steps,
    yoyo_cli,
)
from psycopg import sql
from sqlhelpers import PROJECT, pg_program, schema_dump

from pyqueue.migrate import migrate, private_schema, yoyo_uri

OTHER = "other"
YOYO_TABLES = ("_yoyo_migration", "_yoyo_log", "_yoyo_version", "yoyo_lock")


def schema_dump_of(dsn: str, schema: str) -> str:
    """``pg_dump --schema-only`` of one install (the schema and its private schema
    ``<schema>_internal``) without yoyo's tables nor the schemas' own statements (owner, comment,
    USAGE: public's differ), the names replaced by ``SCHEMA`` and ``SCHEMA_internal`` (so two
    installs in different schemas compare equal), comment and SET lines dropped."""
    private = private_schema(schema)
    excluded = [arg for table in YOYO_TABLES for arg in ("--exclude-table", f'"{schema}".{table}')]
    out = subprocess.run(
        [pg_program("pg_dump"), "--schema-only", "--schema", f'"{schema}"', "--schema", f'"{private}"', *excluded,
         "--dbname", dsn],
        check=True, capture_output=True, text=True,
    ).stdout
    kept = [
        re.sub(rf"(?<![\w.]){schema}\.(?=[\w\"])", "SCHEMA.",
               re.sub(rf"(?<![\w.]){private}\.(?=[\w\"])", "SCHEMA_internal.", line))
        .replace(f"'{schema}'::text", "'SCHEMA'::text")
        .replace(f"'{private}', '{schema}'", "'SCHEMA_internal', 'SCHEMA'")
        .replace(f"'{schema}', '{private}'", "'SCHEMA', 'SCHEMA_internal'")
        .replace(f"''{private}'', ''{schema}''", "''SCHEMA_internal'', ''SCHEMA''")
        .replace(f"''{schema}'', ''{private}''", "''SCHEMA'', ''SCHEMA_internal''")
        .replace(f"''{schema}''::text", "''SCHEMA''::text")
        .replace(f"'{private}, {schema}, pg_temp'", "'SCHEMA_internal, SCHEMA, pg_temp'")
        .replace(f"'{schema}, {private}, pg_temp'", "'SCHEMA, SCHEMA_internal, pg_temp'")
        .replace(f"'search_path={schema}, {private}, pg_temp'", "'search_path=SCHEMA, SCHEMA_internal, pg_temp'")
        .replace(f"'{schema}'::pg_catalog.regnamespace", "'SCHEMA'::pg_catalog.regnamespace")
        .replace(f"search_path TO '{schema}'", "search_path TO 'SCHEMA'")
        for line in out.splitlines()
        if line.strip() and not line.startswith(("--", "SET ", "SELECT pg_catalog.set_config(", "\\"))
        and not re.match(rf"(CREATE|ALTER|COMMENT ON|GRANT [A-Z]+ ON) SCHEMA ({schema}|{private})\b", line)
    ]
    return "\n".join(kept) + "\n"


def test_two_schemas_hold_two_independent_installs(new_database) -> None:
    db = new_database()
    assert migrate(db) == schema_steps()
    assert migrate(db, schema=OTHER) == schema_steps()
    for schema in ("public", OTHER):
        assert migrate(db, schema=schema) == []  # again: nothing to do, nothing changed
    public, other = objects_in(db, "public"), objects_in(db, OTHER)
    assert public == other and other["functions"] >= 14 and other["yoyo"] == 4
    helpers = objects_in(db, private_schema(OTHER))
    assert helpers == objects_in(db, "public_internal") and helpers["functions"] > 40
    assert schema_dump_of(db, OTHER) == schema_dump_of(db, "public")
    funcs = functions(db)
    assert len(funcs) == 2 * (other["functions"] + helpers["functions"])
    assert migrate(db, schema=OTHER) == []
    assert functions(db) == funcs, "functions were re-created although sql/ did not change"

    with psycopg.connect(db, autocommit=True) as conn:
        # Each install's functions use its own tables, whatever the caller's search_path.
        conn.execute("SET search_path = public")
        conn.execute("SELECT other.dq_offer('jobs', 'k', 'x', now() - interval '1 second')")
        assert conn.execute("SELECT count(*) FROM public.dq_poll_many('jobs', 5, '1 minute')").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM public.dq_messages").fetchone() == (0,)
        assert conn.execute("SELECT key FROM other.dq_poll_many('jobs', 5, '1 minute')").fetchall() == [("k",)]
        conn.execute("SET search_path = other")
        assert conn.execute("SELECT count(*) FROM public.dq_get('jobs', 'k')").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM dq_get('jobs', 'k')").fetchone() == (1,)


def test_one_schema_is_rolled_back_without_touching_the_other(new_database) -> None:
    db = new_database()
    migrate(db)
    migrate(db, schema=OTHER)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT public.dq_offer('jobs', 'kept', 'x')")
    public_dump, public_steps = schema_dump_of(db, "public"), applied_migrations(db)

    assert rollback(db, schema_steps()[0], schema=OTHER) == schema_steps()[::-1]
    assert objects_in(db, OTHER) == {"functions": 0, "relations": 0, "types": 0, "yoyo": 4}
    assert query(db, f"SELECT to_regnamespace('{private_schema(OTHER)}')") == [(None,)]  # noqa: S608
    assert schema_dump_of(db, "public") == public_dump
    assert applied_migrations(db) == public_steps
    assert query(db, "SELECT key FROM public.dq_messages") == [("kept",)]

    assert migrate(db, schema=OTHER) == schema_steps()
    assert schema_dump_of(db, OTHER) == schema_dump_of(db, "public")


@pytest.mark.parametrize("parameter", ["schema={}", "options=-csearch_path%3D{}"])
def test_plain_yoyo_with_the_schema_in_the_url_equals_pyqueue_migrate(
    new_database, tmp_path, parameter: str
) -> None:
    by_pyqueue, by_yoyo = new_database(), new_database()
    out = pyqueue_cli("migrate", "--dsn", by_pyqueue, "--schema", OTHER)
    assert out.stdout.startswith("applied: " + ", ".join(schema_steps()))

    with psycopg.connect(by_yoyo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(OTHER)))
    url = yoyo_uri(by_yoyo)
    url += ("&" if "?" in url else "?") + parameter.format(OTHER)
    proc = subprocess.run(
        [yoyo_cli(), "apply", "--batch", "--no-config-file", "--database", url, str(PROJECT / "migrations")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, f"yoyo apply failed:\n{proc.stdout}\n{proc.stderr}"

    assert schema_dump(by_yoyo) == schema_dump(by_pyqueue)
    for dsn in (by_pyqueue, by_yoyo):
        assert objects_in(dsn, "public") == {"functions": 0, "relations": 0, "types": 0, "yoyo": 0}
        assert query(dsn, "SELECT migration_id FROM other._yoyo_migration ORDER BY 1") == [
            (s,) for s in schema_steps()]
    assert pyqueue_cli("migrate", "--dsn", by_yoyo, "--schema", OTHER, "--dry-run").stdout == "pending: nothing\n"


def test_an_install_outside_public_has_pg_cron_jobs_of_its_own(admin_dsn: str) -> None:
    """In the database where pg_cron runs (the test server's ``dq``): the jobs of an install in
    another schema are named and called as its dq__pg_cron_jobs() says; its rollback removes
    them, and the jobs of other installs stay."""
    schema = "dq_test_cron_jobs"

    def jobs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        return conn.execute("SELECT jobname, schedule, command FROM cron.job ORDER BY 1").fetchall()

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_cron'").fetchone() is None:
            pytest.skip("pg_cron is not installed in the test server's administrative database")
        for name in (schema, private_schema(schema)):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        before = jobs(conn)
    try:
        migrate(admin_dsn, schema=schema)
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            own = conn.execute(sql.SQL("SELECT * FROM {}.dq__pg_cron_jobs() ORDER BY 1").format(
                sql.Identifier(private_schema(schema)))).fetchall()
            assert [j[0] for j in own] == [f"dq-archive-prune@{schema}", f"dq-cron-prune-history@{schema}",
                                           f"dq-cron-tick@{schema}", f"dq-release@{schema}",
                                           f"dq-vacuum@{schema}"]
            assert sorted(before + own) == jobs(conn)
            conn.execute(sql.SQL("SELECT {}.dq_cron_tick()").format(sql.Identifier(schema)))
        rollback(admin_dsn, schema_steps()[0], schema=schema)
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            assert jobs(conn) == before
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname LIKE %s", (f"%@{schema}",))
            for name in (schema, private_schema(schema)):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
