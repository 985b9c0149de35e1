"""Internals stay out of the user's way.

* The install schema holds only the public API: every function there is one of
  :data:`test_sql_install.ROLE_OF` and carries a COMMENT ON FUNCTION that starts with its own name
  (its documentation in ``\\df+``); the internal ``dq__*`` helpers live in the private schema
  ``<install>_internal``, each commented ``Internal: …``, and no application role may use that
  schema. psql's ``\\df dq_*`` and ``\\df``, run by the real ``psql``, list exactly the API.
* A bad argument is raised by the function the user called: the error's CONTEXT names no helper.
  :func:`check_context_names_only` is applied to every case of ``test_sql_bad_input`` and
  ``test_cron_bad_input`` (one or more bad calls of every public function that checks its input).
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import psycopg
from sqlhelpers import pg_program
from test_sql_install import ROLE_OF, ROLES

from pyqueue.migrate import private_schema


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


def test_the_install_schema_holds_only_the_documented_api(conn: psycopg.Connection[Any]) -> None:
    check_only_the_api(conn)


def test_the_helpers_live_in_the_private_schema(conn: psycopg.Connection[Any]) -> None:
    helpers = install_functions(conn, private_schema("public"))
    assert len(helpers) > 40
    for sig, comment in helpers.items():
        assert sig.startswith("public_internal.dq__"), sig
        assert comment and comment.startswith("Internal: "), sig
    # Only the owner reaches the helpers (through the SECURITY DEFINER functions).
    for role in ("public", *ROLES):
        assert conn.execute("SELECT has_schema_privilege(%s, 'public_internal', 'USAGE')", (role,)).fetchone() == (
            False,), role
    comment = conn.execute("SELECT obj_description('public_internal'::regnamespace, 'pg_namespace')").fetchone()
    assert comment is not None and "installed in schema public" in comment[0]


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


def test_psql_df_lists_only_the_api(dsn: str) -> None:
    assert psql_names(dsn, "\\df dq_*") == set(ROLE_OF)
    assert psql_names(dsn, "\\df") == set(ROLE_OF)
    assert psql_names(dsn, "\\df dq__*") == set()


def check_context_names_only(err: psycopg.Error, function: str) -> None:
    """The error's CONTEXT (psycopg ``diag.context``) names no internal helper, no private schema,
    and no function but ``function`` (the one the user called; its overloads share its name)."""
    context = err.diag.context or ""
    assert "dq__" not in context and "_internal" not in context, context
    named = set(re.findall(r'function "?([\w.]+)', context))
    assert named <= {function}, context
