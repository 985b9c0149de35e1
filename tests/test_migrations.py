"""The installer: yoyo's numbered migrations plus the always-pending step 9999_sql (sql/).

* a database built fresh equals one upgraded step by step (procrastinate's schema-diff test:
  ``pg_dump --schema-only``, normalised, see :func:`sqlhelpers.schema_dump`);
* running the installer again changes nothing;
* plain ``yoyo apply`` reaches the same state as ``pyqueue.migrate``;
* a change to ``sql/`` alone reaches an installed database through ``yoyo apply``.

The reference "fresh" database is the session template, which conftest builds with
``pyqueue.migrate.migrate`` on an empty database.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlhelpers import PROJECT, schema_dump
from yoyo import get_backend, read_migrations

from pyqueue import testing
from pyqueue.migrate import migrate, migrations_dir, pending, yoyo_uri


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


def yoyo_cli() -> str:
    candidate = Path(sys.executable).parent / "yoyo"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("yoyo")
    assert found is not None, "the yoyo CLI is not installed"
    return found


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


def query(dsn: str, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(text).fetchall()  # type: ignore[arg-type]


def checksum(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT value FROM dq_meta WHERE name = 'sql_checksum'")


def functions(dsn: str) -> list[tuple[Any, ...]]:
    """Every dq_* function with its oid and the xmin of its pg_proc row (changes on re-create)."""
    return query(
        dsn,
        "SELECT p.oid::regprocedure::text, p.oid::bigint, p.xmin::text, md5(p.prosrc) FROM pg_proc p "
        "WHERE p.proname LIKE 'dq\\_%' ORDER BY 1",
    )


def applied_migrations(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT migration_id FROM _yoyo_migration ORDER BY migration_id")


def tables(dsn: str) -> set[str]:
    return {r[0] for r in query(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_dump_normalisation_keeps_the_schema_and_drops_yoyo(template_dsn):
    dump = schema_dump(template_dsn)
    assert "CREATE TABLE public.dq_messages" in dump
    assert "CREATE FUNCTION public.dq_offer_many(" in dump
    assert "yoyo" not in dump
    assert "\\restrict" not in dump
    assert "SET " not in dump.splitlines()[0]


def schema_steps() -> list[str]:
    """The numbered schema migrations, in order (everything but the function step 9999_sql)."""
    return sorted(m.id for m in read_migrations(str(migrations_dir())) if m.id != "9999_sql")


def test_fresh_equals_upgraded_step_by_step_with_up_to(template_dsn, new_database):
    """Each schema step alone, in order (an older release's schema each time), then the installer."""
    steps = schema_steps()
    assert len(steps) >= 3
    stepwise = new_database()
    assert migrate(stepwise, up_to=steps[0]) == [steps[0]]
    assert not {"dq_waiters", "dq_meta"} & tables(stepwise)
    for step in steps[1:-1]:
        assert migrate(stepwise, up_to=step) == [step]
    assert migrate(stepwise) == [steps[-1], "9999_sql"]
    assert schema_dump(stepwise) == schema_dump(template_dsn)
    assert checksum(stepwise) == checksum(template_dsn)


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

    assert migrate(stepwise) == [*schema_steps()[1:], "9999_sql"]
    assert schema_dump(stepwise) == schema_dump(template_dsn)
    assert checksum(stepwise) == checksum(template_dsn)
    assert applied_migrations(stepwise) == applied_migrations(template_dsn)


def test_migrate_twice_changes_nothing(dsn):
    dump, funcs, meta = schema_dump(dsn), functions(dsn), query(dsn, "SELECT * FROM dq_meta ORDER BY name")
    assert len(funcs) >= 14 and len(meta) == 1
    assert pending(dsn) == ["9999_sql"]  # by design: it re-checks sql/ on every run

    assert migrate(dsn) == ["9999_sql"]
    assert migrate(dsn) == ["9999_sql"]

    assert schema_dump(dsn) == dump
    assert functions(dsn) == funcs, "functions were re-created although sql/ did not change"
    assert query(dsn, "SELECT * FROM dq_meta ORDER BY name") == meta
    assert applied_migrations(dsn) == [(m,) for m in schema_steps()]
    assert pending(dsn) == ["9999_sql"]


def test_yoyo_cli_equals_pyqueue_migrate(template_dsn, new_database, tmp_path):
    by_cli = new_database()
    yoyo_apply(by_cli, PROJECT / "migrations", tmp_path)
    assert schema_dump(by_cli) == schema_dump(template_dsn)
    assert checksum(by_cli) == checksum(template_dsn) != []
    assert applied_migrations(by_cli) == applied_migrations(template_dsn)
    # And the CLI run is as repeatable as migrate().
    funcs = functions(by_cli)
    yoyo_apply(by_cli, PROJECT / "migrations", tmp_path)
    assert functions(by_cli) == funcs


def test_changed_sql_reaches_an_installed_database_through_yoyo_apply(dsn, tmp_path):
    copy = tmp_path / "release"
    shutil.copytree(PROJECT / "sql", copy / "sql")
    shutil.copytree(PROJECT / "migrations", copy / "migrations", ignore=shutil.ignore_patterns("__pycache__"))
    common = copy / "sql" / "000_common.sql"
    old_body, new_body = "AS $$ SELECT 'dq_' || md5(queue) $$;", "AS $$ SELECT 'dqv2_' || md5(queue) $$;"
    text = common.read_text()
    assert text.count(old_body) == 1
    common.write_text(text.replace(old_body, new_body))

    # No numbered migration is pending: only the always-pending 9999_sql.
    backend = get_backend(yoyo_uri(dsn))
    try:
        todo = backend.to_apply(read_migrations(str(copy / "migrations")))
    finally:
        backend.connection.close()
    assert [m.id for m in todo] == ["9999_sql"]

    dump_before, sum_before = schema_dump(dsn), checksum(dsn)
    md5_q = query(dsn, "SELECT md5('q')")[0][0]
    assert query(dsn, "SELECT dq_channel('q')") == [("dq_" + md5_q,)]

    yoyo_apply(dsn, copy / "migrations", tmp_path)

    assert query(dsn, "SELECT dq_channel('q')") == [("dqv2_" + md5_q,)]
    assert checksum(dsn) != sum_before
    # Exactly that function body changed, nothing else.
    assert schema_dump(dsn) == dump_before.replace("SELECT 'dq_' || md5(queue) $$", "SELECT 'dqv2_' || md5(queue) $$")
    assert applied_migrations(dsn) == [(m,) for m in schema_steps()]
