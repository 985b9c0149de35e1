"""Internals stay out of the user's way.

* The install schema holds only the public API: every function there is one of
  :data:`installhelpers.ROLE_OF` and carries a COMMENT ON FUNCTION that starts with its own name
  (its documentation in ``\\df+``); the internal ``dq__*`` helpers live in the private schema
  ``<install>_internal``, each commented ``Internal: …``, and no application role may use that
  schema. psql's ``\\df dq_*`` and ``\\df``, run by the real ``psql``, list exactly the API.
* A bad argument is raised by the function the user called: the error's CONTEXT names no helper.
  :func:`sqlhelpers.check_context_names_only` is applied to every case of ``test_sql_bad_input`` and
  ``test_cron_bad_input`` (one or more bad calls of every public function that checks its input).
"""

from __future__ import annotations

from typing import Any

import psycopg
from installhelpers import ROLE_OF, ROLES, check_only_the_api, install_functions, psql_names

from pyqueue.migrate import private_schema


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


def test_psql_df_lists_only_the_api(dsn: str) -> None:
    assert psql_names(dsn, "\\df dq_*") == set(ROLE_OF)
    assert psql_names(dsn, "\\df") == set(ROLE_OF)
    assert psql_names(dsn, "\\df dq__*") == set()
