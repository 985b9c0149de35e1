"""An install never lands in another install's private schema (rule 6 of the docstring of
pyqueue.migrate): the install in schema S keeps its helpers in ``S_internal``, so

* installing into ``S_internal`` while S holds an install is refused (it would drop S's helpers:
  every call of S then fails with 42883);
* installing into S while ``S_internal`` holds an install is refused (S's helpers would be created
  in, and bound to the tables of, the other install's schema);

each by ``pyqueue.migrate.migrate``, ``pyqueue.migrate.pending``, ``pyqueue migrate`` and ``pyqueue
migrate --dry-run`` with 22023 (``InvalidArgument``; exit status 2 for the CLI) and a message naming
both schemas, before anything is written: the database is byte for byte as before (``pg_dump``
with the rows, and every function's pg_proc row version), and the other install still works.
Plain ``yoyo apply`` is refused by the step ``9999_sql`` (after yoyo's numbered steps, which run
before any code of ours): the other install's helpers are kept, and the way back is tested.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from installhelpers import functions, objects_in, pyqueue_cli, query, yoyo_cli
from sqlhelpers import PROJECT, pg_program

from pyqueue import DelayedQueue, InvalidArgument
from pyqueue.migrate import migrate, pending, private_schema, yoyo_uri

INSTALL = "collide"
PRIVATE = private_schema(INSTALL)  # collide_internal
ENTRY_POINTS = ["migrate", "pending", "cli", "cli --dry-run"]


def database_state(dsn: str) -> tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What a refused run must leave as it was: ``pg_dump`` of the whole database (every schema,
    the rows of every table, yoyo's bookkeeping included), every dq_* function with its oid and
    the xmin of its pg_proc row (which a re-create changes), and the schemas. The dump's lines
    ``\\restrict KEY`` and ``\\unrestrict KEY`` (a new random key on each run) are left out."""
    dump = subprocess.run([pg_program("pg_dump"), "--dbname", dsn], check=True, capture_output=True, text=True).stdout
    kept = [line for line in dump.splitlines() if not line.startswith(("\\restrict ", "\\unrestrict "))]
    return "\n".join(kept), functions(dsn), query(dsn, "SELECT nspname, xmin::text FROM pg_namespace ORDER BY 1")


def refusal(dsn: str, schema: str, entry_point: str) -> str:
    """Run the installer (or its dry run) on ``schema`` through ``entry_point``; assert it is
    refused with 22023 and return the message."""
    if entry_point in ("migrate", "pending"):
        run = migrate if entry_point == "migrate" else pending
        with pytest.raises(InvalidArgument) as info:
            run(dsn, schema=schema)
        assert info.value.sqlstate == "22023"
        return info.value.message
    dry_run = ["--dry-run"] if entry_point == "cli --dry-run" else []
    proc = pyqueue_cli("migrate", "--dsn", dsn, "--schema", schema, *dry_run, returncode=2)
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()  # one line, no traceback
    assert line.startswith("pyqueue: migrate: ") and line.endswith(" (SQLSTATE 22023)")
    return line


def assert_works(dsn: str, schema: str) -> None:
    """A grouped offer/poll/ack round trip on the install in ``schema`` (the group's order is kept
    by the helpers of its private schema)."""
    with DelayedQueue(dsn, "jobs", pool_size=1, schema=schema) as q:
        q.offer("first", "1", group="g")
        q.offer("second", "2", group="g")
        for key in ("first", "second"):
            (message,) = q.poll(max_count=5)  # one at a time: the group's next waits for the ack
            assert message.key == key
            assert q.ack(message.lock_token)
        assert q.poll(max_count=5) == []


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_installing_into_the_private_schema_of_an_install_is_refused(new_database, entry_point):
    db = new_database()
    migrate(db, schema=INSTALL)
    helpers = objects_in(db, PRIVATE)
    assert helpers["functions"] > 40 and helpers["relations"] == helpers["yoyo"] == 0
    before = database_state(db)

    message = refusal(db, PRIVATE, entry_point)

    assert (f"migrate: schema {PRIVATE} is the private schema of the install in schema {INSTALL} "
            f"(it holds that install's dq__* helpers); choose another schema") in message
    assert database_state(db) == before
    assert objects_in(db, PRIVATE) == helpers
    assert_works(db, INSTALL)


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_installing_where_the_private_schema_is_an_install_is_refused(new_database, entry_point):
    db = new_database()
    migrate(db, schema=PRIVATE)  # an install in collide_internal, its helpers in collide_internal_internal
    before = database_state(db)

    message = refusal(db, INSTALL, entry_point)

    assert (f"migrate: schema {INSTALL} cannot hold an install: its private schema would be {PRIVATE}, "
            f"which holds another install; choose another schema") in message
    assert database_state(db) == before
    assert query(db, f"SELECT to_regnamespace('{INSTALL}')") == [(None,)]  # noqa: S608 (a test constant)
    assert_works(db, PRIVATE)


def test_plain_yoyo_is_refused_by_the_function_step_and_the_first_install_recovers(
    new_database, tmp_path
):
    """Plain ``yoyo apply`` runs the numbered steps before any code of ours (yoyo has no hook
    before them): into the private schema of an install, it creates their tables there, where that
    install's helpers find them first (its grouped messages are not delivered), and only the step
    ``9999_sql`` refuses, so the helpers are neither dropped nor replaced; re-applying the first
    install is refused too, instead of re-creating its helpers beside those tables. Rolling the
    refused install back and migrating the first install again repairs it (docs/operations.md)."""
    db = new_database()
    migrate(db, schema=INSTALL)
    helpers_before = [f for f in functions(db) if f[0].startswith(f"{PRIVATE}.dq__")]
    assert len(helpers_before) > 40

    def yoyo(command: str, schema: str, *options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [yoyo_cli(), command, "--batch", *options, "--no-config-file", "--database", yoyo_uri(db, schema),
             str(PROJECT / "migrations")],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )

    proc = yoyo("apply", PRIVATE)
    assert proc.returncode != 0
    assert (f"migrate: schema {PRIVATE} is the private schema of the install in schema {INSTALL}"
            in proc.stdout + proc.stderr)
    assert [f for f in functions(db) if f[0].startswith(f"{PRIVATE}.dq__")] == helpers_before
    assert objects_in(db, PRIVATE)["functions"] == len(helpers_before)  # no dq_* function of sql/ added

    proc = yoyo("apply", INSTALL)
    assert proc.returncode != 0
    assert (f"migrate: schema {INSTALL} cannot hold an install: its private schema would be {PRIVATE}"
            in proc.stdout + proc.stderr)
    assert [f for f in functions(db) if f[0].startswith(f"{PRIVATE}.dq__")] == helpers_before

    proc = yoyo("rollback", PRIVATE, "--all")  # as docs/operations.md says
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert query(db, f"SELECT count(*) FROM {PRIVATE}._yoyo_migration") == [(0,)]  # noqa: S608 (a test constant)
    assert query(db, f"SELECT to_regclass('{PRIVATE}.dq_messages')") == [(None,)]  # noqa: S608
    assert migrate(db, schema=INSTALL) == []
    assert objects_in(db, PRIVATE)["functions"] == len(helpers_before)
    assert_works(db, INSTALL)
