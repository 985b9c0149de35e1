"""The installer (rules: the docstring of pyqueue.migrate): yoyo's numbered schema steps, then
the functions of sql/ on every apply.

* a database built fresh equals one upgraded step by step (procrastinate's schema-diff test:
  ``pg_dump --schema-only``, normalised, see :func:`sqlhelpers.schema_dump`), and one rolled all the
  way down and up again, or rolled back over some steps and up again;
* running the installer again changes nothing;
* plain ``yoyo apply`` reaches the same state as ``pyqueue.migrate`` and ``pyqueue migrate``;
* a change to ``sql/`` alone reaches an installed database through ``yoyo apply`` and through
  ``pyqueue migrate``, and so does the repair of a function altered by hand.

The reference "fresh" database is the session template, which conftest builds with
``pyqueue.migrate.migrate`` on an empty database.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from installhelpers import applied_migrations, functions, pyqueue_cli, query, rollback, schema_steps, yoyo_cli
from sqlhelpers import PROJECT, schema_dump
from yoyo import get_backend, read_migrations

from pyqueue import testing
from pyqueue.migrate import FUNCTION_STEP, migrate, migrations_dir, pending, yoyo_uri


def yoyo_apply(dsn: str, migrations: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [yoyo_cli(), "apply", "--batch", "--no-config-file", "--database", yoyo_uri(dsn), str(migrations)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert proc.returncode == 0, f"yoyo apply failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def definitions(dsn: str) -> list[tuple[Any, ...]]:
    """Every dq_* function as the installer compares it: definition, privileges, comment."""
    return query(
        dsn,
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text, obj_description(p.oid) "
        "FROM pg_proc p WHERE p.proname LIKE 'dq\\_%' ORDER BY 1",
    )


def tables(dsn: str) -> set[str]:
    return {r[0] for r in query(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_dump_normalisation_keeps_the_schema_and_drops_yoyo(template_dsn):
    dump = schema_dump(template_dsn)
    assert "CREATE TABLE public.dq_messages" in dump
    assert "CREATE FUNCTION public.dq_offer_many(" in dump
    assert "yoyo" not in dump
    assert "\\restrict" not in dump
    assert "SET " not in dump.splitlines()[0]


def test_fresh_equals_upgraded_step_by_step_with_up_to(template_dsn, new_database):
    """Each schema step alone, in order (an older release's schema each time), then the installer."""
    steps = schema_steps()
    assert len(steps) >= 3
    stepwise = new_database()
    assert migrate(stepwise, up_to=steps[0]) == [steps[0]]
    assert not {"dq_waiters", "dq_meta"} & tables(stepwise)
    for step in steps[1:-1]:
        assert migrate(stepwise, up_to=step) == [step]
    assert migrate(stepwise) == [steps[-1]]
    assert schema_dump(stepwise) == schema_dump(template_dsn)
    assert definitions(stepwise) == definitions(template_dsn)


def test_fresh_equals_upgraded_step_by_step(template_dsn, new_database):
    """The same check without ``up_to``: yoyo applies 0001 alone, then the installer the rest."""
    stepwise = new_database()
    backend = get_backend(yoyo_uri(stepwise))
    try:
        only_first = read_migrations(str(migrations_dir())).filter(lambda m: m.id == "0001_messages")
        with backend.lock():
            backend.apply_migrations(backend.to_apply(only_first))
    finally:
        backend.connection.close()
    assert {"dq_messages"} <= tables(stepwise)
    assert not {"dq_waiters", "dq_meta"} & tables(stepwise)

    assert migrate(stepwise) == schema_steps()[1:]
    assert schema_dump(stepwise) == schema_dump(template_dsn)
    assert definitions(stepwise) == definitions(template_dsn)
    assert applied_migrations(stepwise) == applied_migrations(template_dsn)


def test_migrate_twice_changes_nothing(dsn):
    dump, funcs, meta = schema_dump(dsn), functions(dsn), query(dsn, "SELECT * FROM dq_meta ORDER BY name")
    assert len(funcs) >= 14 and meta == []  # nothing recorded: the installer compares definitions
    assert pending(dsn) == []

    assert migrate(dsn) == []
    assert migrate(dsn) == []

    assert schema_dump(dsn) == dump
    assert functions(dsn) == funcs, "functions were re-created although sql/ did not change"
    assert query(dsn, "SELECT * FROM dq_meta ORDER BY name") == meta
    assert applied_migrations(dsn) == [(m,) for m in schema_steps()]
    assert pending(dsn) == []


def test_yoyo_cli_equals_pyqueue_migrate(template_dsn, new_database, tmp_path):
    by_cli = new_database()
    yoyo_apply(by_cli, PROJECT / "migrations", tmp_path)
    assert schema_dump(by_cli) == schema_dump(template_dsn)
    assert definitions(by_cli) == definitions(template_dsn) != []
    assert applied_migrations(by_cli) == applied_migrations(template_dsn)
    # And the CLI run is as repeatable as migrate().
    funcs = functions(by_cli)
    yoyo_apply(by_cli, PROJECT / "migrations", tmp_path)
    assert functions(by_cli) == funcs


CHANNEL_BODY, CHANNEL_BODY_V2 = "    SELECT 'dq_' || md5(CASE", "    SELECT 'dqv2_' || md5(CASE"


@pytest.fixture
def release_with_changed_sql(tmp_path: Path) -> Path:
    """A copy of the tree (pyqueue/, migrations/, sql/) whose sql/ alone differs: dq_channel's body."""
    copy = tmp_path / "release"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(PROJECT / "sql", copy / "sql")
    shutil.copytree(PROJECT / "migrations", copy / "migrations", ignore=ignore)
    shutil.copytree(PROJECT / "pyqueue", copy / "pyqueue", ignore=ignore)
    common = copy / "sql" / "000_common.sql"
    text = common.read_text()
    assert text.count(CHANNEL_BODY) == 1
    common.write_text(text.replace(CHANNEL_BODY, CHANNEL_BODY_V2))
    return copy


def assert_only_channel_changed(dsn: str, dump_before: str, definitions_before: list[tuple[Any, ...]]) -> None:
    md5_q = query(dsn, "SELECT md5('q')")[0][0]
    assert query(dsn, "SELECT dq_channel('q')") == [("dqv2_" + md5_q,)]
    assert definitions(dsn) != definitions_before
    # Exactly that function body changed, nothing else.
    assert schema_dump(dsn) == dump_before.replace(CHANNEL_BODY, CHANNEL_BODY_V2)
    assert applied_migrations(dsn) == [(m,) for m in schema_steps()]


def test_changed_sql_reaches_an_installed_database_through_yoyo_apply(dsn, tmp_path, release_with_changed_sql):
    copy = release_with_changed_sql
    # No numbered migration is pending: only the always-pending 9999_sql.
    backend = get_backend(yoyo_uri(dsn))
    try:
        todo = backend.to_apply(read_migrations(str(copy / "migrations")))
    finally:
        backend.connection.close()
    assert [m.id for m in todo] == ["9999_sql"]

    dump_before, definitions_before = schema_dump(dsn), definitions(dsn)
    md5_q = query(dsn, "SELECT md5('q')")[0][0]
    assert query(dsn, "SELECT dq_channel('q')") == [("dq_" + md5_q,)]

    yoyo_apply(dsn, copy / "migrations", tmp_path)

    assert_only_channel_changed(dsn, dump_before, definitions_before)


def test_changed_sql_reaches_an_installed_database_through_pyqueue_migrate(dsn, release_with_changed_sql):
    dump_before, definitions_before = schema_dump(dsn), definitions(dsn)
    out = pyqueue_cli("migrate", "--dsn", dsn, pythonpath=release_with_changed_sql)
    assert "no schema step pending" in out.stdout
    assert_only_channel_changed(dsn, dump_before, definitions_before)


def test_migrate_repairs_functions_altered_by_hand(dsn):
    """The database is compared with sql/, nothing recorded is trusted: a function made SECURITY
    INVOKER, re-granted, or dropped by hand is put back by the next ``pyqueue migrate``."""
    dump = schema_dump(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], "
                     "integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) SECURITY INVOKER")
        conn.execute("GRANT EXECUTE ON FUNCTION dq_channel(text) TO PUBLIC")
        conn.execute("DROP VIEW dq_stats")
    assert schema_dump(dsn) != dump
    out = pyqueue_cli("migrate", "--dsn", dsn)
    assert "no schema step pending" in out.stdout
    assert schema_dump(dsn) == dump


def test_down_every_step_then_up_equals_fresh(template_dsn, new_database):
    db = new_database()
    migrate(db)
    assert rollback(db, schema_steps()[0]) == schema_steps()[::-1]
    assert applied_migrations(db) == []
    assert query(db, "SELECT count(*) FROM pg_proc WHERE proname LIKE 'dq\\_%'") == [(0,)]
    assert query(db, "SELECT count(*) FROM pg_class WHERE relname LIKE 'dq\\_%'") == [(0,)]
    assert query(db, "SELECT count(*) FROM pg_type WHERE typname LIKE 'dq\\_%'") == [(0,)]

    assert migrate(db) == schema_steps()
    assert schema_dump(db) == schema_dump(template_dsn)
    assert definitions(db) == definitions(template_dsn)


def test_rollback_from_operations_and_reapply_keeps_dq_stats(dsn, template_dsn):
    """0006_operations' rollback drops dq_stats (it needs the step's row type): the next migrate,
    with the same steps and the same sql/ as before, re-creates it."""
    steps = [s for s in schema_steps() if s >= "0006_operations"]
    assert rollback(dsn, "0006_operations") == steps[::-1]
    assert query(dsn, "SELECT to_regclass('dq_stats'), to_regprocedure('dq_queue_stats(text)')") == [(None, None)]

    assert migrate(dsn) == steps
    assert query(dsn, "SELECT to_regclass('dq_stats')::text, to_regprocedure('dq_queue_stats(text)')::text") == [
        ("dq_stats", "dq_queue_stats(text)")]
    assert query(dsn, "SELECT count(*) FROM dq_stats") == [(0,)]
    assert schema_dump(dsn) == schema_dump(template_dsn)


def test_partial_yoyo_apply_leaves_the_functions_alone(new_database, tmp_path):
    """Rule 3: sql/ is applied only on the latest schema. yoyo apply of the first steps only (with
    the function step) creates no function; the next full apply does."""
    db = new_database()
    first = schema_steps()[:2]
    proc = subprocess.run(
        [yoyo_cli(), "apply", "--batch", "--no-config-file", "--database", yoyo_uri(db),
         "--match", "^(" + "|".join([*first, FUNCTION_STEP]) + ")$", str(PROJECT / "migrations")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert applied_migrations(db) == [(s,) for s in first]
    assert definitions(db) == []
    assert migrate(db) == schema_steps()[2:]
    assert len(definitions(db)) >= 14


WHEEL_SCRIPT = """
import sys
import psycopg
from psycopg.conninfo import conninfo_to_dict
from pyqueue import testing
from pyqueue.migrate import migrations_dir, sql_dir
site, name = sys.argv[1:]
assert str(migrations_dir()).startswith(site) and str(sql_dir()).startswith(site), (migrations_dir(), sql_dir())
admin = testing.server_dsn()
testing.create_template(admin, name)
dsn = testing.clone_database(admin, name)
with psycopg.connect(dsn, autocommit=True) as conn:
    conn.execute("SELECT dq_offer('q', 'k', 'x')")
print(sorted(testing.offered(dsn, "q")))
testing.drop_database(admin, conninfo_to_dict(dsn)["dbname"])
testing.drop_database(admin, name)
"""


def test_installer_and_test_helpers_work_from_the_wheel_layout(admin_dsn, tmp_path):
    """The package as the wheel lays it out (pyproject's force-include: migrations/, sql/ and docker/
    inside the package as _migrations, _sql, _docker), without the source checkout around it."""
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(PROJECT / "pyqueue", site / "pyqueue", ignore=ignore)
    for name in ("migrations", "sql", "docker"):
        shutil.copytree(PROJECT / name, site / "pyqueue" / f"_{name}", ignore=ignore)
    env = {k: v for k, v in os.environ.items() if k not in ("DQ_TEST_DSN", "PYTHONPATH")}
    run = [sys.executable, "-c", WHEEL_SCRIPT, str(site), f"dq_wheel_{uuid.uuid4().hex[:12]}"]

    proc = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=site,
                          env=dict(env, PYTHONPATH=str(site), DQ_TEST_DSN=admin_dsn))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['k']\n"

    if not testing.docker_available():  # and no checkout: nothing to start a server with
        proc = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=site,
                              env=dict(env, PYTHONPATH=str(site)))
        assert proc.returncode == 1
        assert "RuntimeError: pyqueue.testing: no test server: set DQ_TEST_DSN" in proc.stderr


def test_rollback_of_dependencies_frees_blocked_children_into_their_groups(dsn):
    """0017's rollback (and 0018's, with a backlog) makes blocked children ordinary messages, due when
    they would have been released and in their FIFO group behind the messages already there: the groups
    are queued for a settle, and after the next migrate a poll delivers them in group order."""
    query(dsn, "SELECT dq_offer('q', 'parent', 'p'::bytea)")
    query(dsn, "SELECT dq_offer('q', 'head', 'h'::bytea, now() - interval '1 minute', message_group => 'g')")
    query(dsn, "SELECT dq_offer('q', 'child', 'c'::bytea, now() - interval '2 minutes', message_group => 'g',"
               " after => '[\"parent\"]')")
    assert query(dsn, "SELECT parents_pending FROM dq_messages WHERE key = 'child'") == [(1,)]
    steps = [s for s in schema_steps() if s >= "0017_dependencies"]
    assert rollback(dsn, "0017_dependencies") == steps[::-1]
    assert query(dsn, "SELECT message_group, scheduled_at < now() FROM dq_messages WHERE key = 'child'") == [
        ("g", True)]
    assert query(dsn, "SELECT queue, message_group FROM dq_group_settles") == [("q", "g")]
    assert migrate(dsn) == steps
    polled = query(dsn, "SELECT key FROM dq_poll_many('q', 10, interval '1 minute')")
    # The child was due first (2 minutes ago) and joins its group by that time, ahead of the head.
    assert sorted(polled) == [("child",), ("parent",)]
