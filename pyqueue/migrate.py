"""Install and upgrade the database side with yoyo-migrations: the rules, written once.

``migrate(dsn, schema=…)`` is exactly ``yoyo apply --batch --database URL migrations/`` with
``URL = yoyo_uri(dsn, schema)``; deploy pipelines may use either, and both reach the same state.
The two files of ``migrations/`` that are not numbered steps (``9999_sql.py`` and
``post-apply.py``) only call into this module.

1. **Schema.** The numbered steps of ``migrations/`` (``NNNN_name.sql`` and its
   ``NNNN_name.rollback.sql``) create tables, indexes and types. yoyo applies the pending ones in
   order, each in its own transaction, and records them in its table ``_yoyo_migration``. Steps are
   append-only: a change to the schema is a new step.

2. **Functions.** ``sql/`` holds the functions, procedures and views, with their comments and
   privileges, each file re-runnable (``CREATE OR REPLACE``). Its files are applied in name order,
   in one transaction, by the step ``9999_sql`` (sorted after every numbered step) on every
   ``yoyo apply`` and every ``pyqueue migrate``, even when no numbered step is pending. yoyo runs
   steps (and post-apply hooks) only when some migration is pending, so ``9999_sql`` always is:
   ``post-apply.py`` forgets its mark after each run (``yoyo list`` shows it as unapplied).

3. **Only on the latest schema.** The functions of ``sql/`` are written for the schema of the
   last numbered step. ``9999_sql`` applies them only when every numbered step of its
   ``migrations/`` is applied; otherwise it leaves the functions as they are (and logs which steps
   are missing). So ``migrate(up_to=…)`` (which does not run ``9999_sql`` at all), ``yoyo apply``
   of chosen steps, or an upgrade in several deploys keep the previous release's functions
   callable until the schema is complete; then one transaction replaces them all. For the same
   reason a step never changes the shape of a composite type that functions return (an old
   function fails with 42804 on it): ``sql/000_common.sql`` adds such attributes, in that one
   transaction (``tests/install/test_upgrade.py`` calls every old function after every step).

4. **Rollback.** Rolling a step back returns the schema to before that step; the functions stay
   those of the current ``sql/`` (an older release's functions come with that release's
   package), except those that cannot exist without what the step removes: its rollback drops
   them. Rolling back the first step removes everything of the install (functions included). The
   next full apply re-creates whatever is missing (rule 5 has nothing recorded that could
   disagree with the database).

5. **Compared with the database, not recorded.** ``9999_sql`` reads the definitions of every
   function, procedure and view of the install schema and of its private schema
   (``pg_get_functiondef``, ``pg_get_viewdef``, owner, privileges, comment), the schemas'
   privileges and the memberships of the ``dq_*`` roles; applies ``sql/`` inside a savepoint;
   reads them again. When nothing differs it rolls back to the savepoint, so a re-run touches no
   catalog row; otherwise the new definitions are committed with the schema step's transaction. A
   function dropped by a rollback or altered by hand is therefore repaired by the next apply.

6. **Install schema.** Everything (the tables, the public functions and views, and yoyo's own
   bookkeeping tables) lives in one schema, default ``public``; the internal helpers (``dq__*``)
   live beside it in its private schema ``<install schema>_internal`` (:func:`private_schema`,
   created by the step ``0012_private_schema``), so that psql's ``\\df`` lists only the API.
   ``migrate(schema=NAME)`` creates the schema when it is absent and runs yoyo with the URL
   parameter ``schema=NAME`` (yoyo's PostgreSQL backends then ``SET search_path TO NAME`` on each
   of their connections). For plain yoyo: ``CREATE SCHEMA NAME``, then ``yoyo apply --database
   'postgresql+psycopg://…/DB?schema=NAME' migrations/`` (libpq's
   ``?options=-csearch_path%3DNAME`` works as well). The install schema is the
   ``current_schema()`` of yoyo's connection; ``sql/`` is applied with it as the first schema of
   ``search_path``, and each file pins its functions' ``search_path`` to it and its private
   schema. Two schemas of one database hold two independent installs (four schemas in all),
   migrated and rolled back on their own; an install schema's name is at most 54 bytes, so that
   its private schema's fits PostgreSQL's 63.

7. **One install per pair of schemas.** The install in S owns two schemas, S and ``S_internal``,
   so an install into S is refused (22023, :class:`pyqueue.InvalidArgument`, exit status 2 for
   ``pyqueue migrate``) when S is the private schema of an install (S = ``T_internal`` and T holds
   one: the new install's ``sql/`` would drop T's helpers, and every call of T would fail with
   42883), or when ``S_internal`` holds an install (S's helpers would be created in it, beside its
   tables, which they would then use). An install is recognised by its table ``dq_messages``: the
   first step creates it and only that step's rollback drops it, so it marks an install of any
   release, also one migrated ``up_to`` an early step or older than the private schema, while
   yoyo's bookkeeping tables alone do not. :func:`migrate` and :func:`pending` check before they
   write anything (before creating the schema or yoyo's tables), so a refused run changes nothing;
   ``9999_sql`` checks again before it touches a function, which is the only check plain ``yoyo
   apply`` gets: yoyo runs the numbered steps before any code of ours, so there the refused run
   has already created the tables of those steps. The check reads the committed catalogs and takes
   no lock: it does not serialise two installers started at the same moment into S and
   ``S_internal``.

8. **An install schema the installer can trust.** The owner of a schema may drop and replace
   anything in it, and so run code of its own inside the queue's SECURITY DEFINER functions with
   the installing role's rights. ``sql/000_common.sql`` refuses (42501) an install schema owned by
   another role (``public`` under PostgreSQL 15 belongs to the database's owner) unless that role
   is a superuser or has the installing role's rights, or the session sets
   ``dq.allow_schema_owner = on``. :func:`migrate` and :func:`pending` run that same check (the
   block between its marker lines) before any step, so a refused run changes nothing.

The migration files import this module, so plain ``yoyo`` must run where ``pyqueue`` is
installed (it is: yoyo-migrations is one of its dependencies). Release snapshots of
``migrations/`` (``tests/upgrade/``) call :func:`apply_functions` and :data:`FORGET_FUNCTION_STEP`
by these names: keep them.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from yoyo import get_backend, read_migrations

from .errors import InvalidArgument, translating

__all__ = [
    "FUNCTION_STEP",
    "FORGET_FUNCTION_STEP",
    "apply_functions",
    "migrate",
    "migrations_dir",
    "pending",
    "private_schema",
    "resource_dir",
    "schema_steps",
    "sql_dir",
    "yoyo_uri",
]

logger = logging.getLogger("pyqueue.migrate")

FUNCTION_STEP = "9999_sql"
"""Id of the step that applies ``sql/`` (rule 2): always pending."""

FORGET_FUNCTION_STEP = "DELETE FROM _yoyo_migration WHERE migration_id = '9999_sql'"
"""The post-apply hook's statement: keeps :data:`FUNCTION_STEP` pending."""

_NUMBERED_STEP = re.compile(r"^(\d{4})_[A-Za-z0-9_]+\.(sql|py)$")


def resource_dir(name: str) -> Path:
    """A directory of the project shipped with the package: ``pyqueue/_<name>`` in a wheel
    (``migrations``, ``sql``, ``docker``), else ``<name>/`` beside the package (a source checkout).

    :raises FileNotFoundError: when neither exists.
    """
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / f"_{name}", pkg.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pyqueue: cannot find the {name}/ directory")


def migrations_dir() -> Path:
    """The ``migrations/`` directory (in the source tree, or packaged as ``pyqueue/_migrations``)."""
    return resource_dir("migrations")


def sql_dir() -> Path:
    """The ``sql/`` directory of function definitions (packaged as ``pyqueue/_sql``)."""
    return resource_dir("sql")


def private_schema(schema: str) -> str:
    """The private schema of the install in ``schema``: ``<schema>_internal`` (rule 6).

    The migration step ``0012_private_schema`` and ``sql/000_common.sql`` derive the same name.
    """
    return f"{schema}_internal"


# Rule 7: for each name, its quoted form and whether the schema of that name holds an install
# (the table dq_messages, created by the first step; a name without a schema holds none).
_INSTALLS = """
SELECT u.name, pg_catalog.quote_ident(u.name),
       EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = u.name AND c.relname = 'dq_messages' AND c.relkind IN ('r', 'p'))
  FROM pg_catalog.unnest(%s::text[]) AS u(name)
"""


def _refuse_shared_schemas(cur: psycopg.Cursor[Any], schema: str) -> None:
    """Rule 7: refuse an install into ``schema`` when it is the private schema of an install, or
    when its own private schema holds an install. Reads the catalogs only.

    :raises InvalidArgument: (22023) naming both schemas.
    """
    suffix = private_schema("")
    owner = schema[: -len(suffix)] if schema.endswith(suffix) else None
    private = private_schema(schema)
    rows = cur.execute(_INSTALLS, ([schema, private, *([owner] if owner is not None else [])],)).fetchall()
    quoted = {name: q for name, q, _ in rows}
    installs = {name for name, _, is_install in rows if is_install}
    if owner in installs:
        raise InvalidArgument(
            f"migrate: schema {quoted[schema]} is the private schema of the install in schema {quoted[owner]} "
            "(it holds that install's dq__* helpers); choose another schema")
    if private in installs:
        raise InvalidArgument(
            f"migrate: schema {quoted[schema]} cannot hold an install: its private schema would be "
            f"{quoted[private]}, which holds another install; choose another schema")


#: The install schema owner check of sql/000_common.sql, between its marker lines (rule 8).
_OWNER_CHECK = re.compile(r"^-- install schema owner check: begin\n(.*?)^-- install schema owner check: end$",
                          re.S | re.M)


def _refuse_untrusted_owner(conn: psycopg.Connection[Any], schema: str) -> None:
    """Rule 8: run the install schema owner check of ``sql/000_common.sql`` for ``schema``, if it
    exists (a schema :func:`migrate` creates belongs to the installing role).

    :raises InsufficientPrivilege: (42501) another role owns ``schema``.
    """
    match = _OWNER_CHECK.search((_sql_dir_beside(migrations_dir()) / "000_common.sql").read_text(encoding="utf-8"))
    assert match is not None, "sql/000_common.sql: the install schema owner check's markers are missing"
    with translating(), conn.transaction():
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
            return
        conn.execute("SELECT pg_catalog.set_config('search_path', pg_catalog.quote_ident(%s), true)", (schema,))
        conn.execute(match.group(1))


def _sql_dir_beside(migrations: Path) -> Path:
    for candidate in (migrations.parent / "sql", migrations.parent / "_sql"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pyqueue: no sql/ directory beside {migrations}")


def schema_steps(migrations: Path | None = None) -> list[str]:
    """Ids of the numbered schema steps of ``migrations`` (default :func:`migrations_dir`), in order."""
    directory = migrations or migrations_dir()
    return sorted(
        p.name.rsplit(".", 1)[0]
        for p in directory.iterdir()
        if _NUMBERED_STEP.match(p.name) and not p.name.endswith(".rollback.sql") and p.stem != FUNCTION_STEP
    )


def yoyo_uri(dsn: str, schema: str | None = None) -> str:
    """Turn a libpq DSN (URL or ``key=value``) into the URL yoyo's psycopg 3 backend expects.

    :param schema: the install schema (rule 6), passed as yoyo's ``schema`` parameter (quoted, so
        any name works); ``None`` leaves the connection's own ``search_path``.
    """
    params = conninfo_to_dict(dsn)
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    host = str(params.pop("host", "") or "")
    port = params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "") or ""), safe="")
    if schema is not None:
        params["schema"] = sql.Identifier(schema).as_string(None)
    auth = user + (":" + quote(str(password), safe="") if password is not None else "")
    netloc = (auth + "@" if auth else "") + (quote(host, safe="") if host.startswith("/") else host)
    if port:
        netloc += f":{port}"
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"postgresql+psycopg://{netloc}/{dbname}" + (f"?{query}" if query else "")


def pending(dsn: str, *, schema: str = "public") -> list[str]:
    """Ids of the numbered schema steps not yet applied in ``schema``, in order (``[]``: up to date).

    :raises InvalidArgument: (22023) ``schema`` cannot hold an install (rule 7); nothing is written.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        _refuse_shared_schemas(conn.cursor(), schema)
        _refuse_untrusted_owner(conn, schema)
    backend = get_backend(yoyo_uri(dsn, schema))
    try:
        migrations = read_migrations(str(migrations_dir()))
        return [m.id for m in backend.to_apply(migrations) if m.id != FUNCTION_STEP]
    finally:
        backend.connection.close()


def migrate(dsn: str, *, schema: str = "public", up_to: str | None = None) -> list[str]:
    """Apply the pending schema steps, then the functions of ``sql/`` (rules in the module docstring).

    :param dsn: libpq connection string or URL of the target database.
    :param schema: the install schema (created when absent); each schema holds its own install.
    :param up_to: apply only the schema steps whose id sorts at or before this one, and not the
        functions (they need the latest schema, rule 3): leaves the database as an older
        release's schema, for upgrade tests. ``None`` applies everything.
    :returns: the ids of the schema steps applied, in order (``[]`` when the schema was up to date;
        the functions are checked on every call all the same).
    :raises InvalidArgument: (22023) ``schema`` is the private schema of an install, or its own
        private schema holds an install (rule 7); raised before anything is written.
    :raises InsufficientPrivilege: (42501) another role owns ``schema`` and the
        session does not set ``dq.allow_schema_owner = on`` (rule 8); raised before anything is written.
    :raises yoyo.exceptions.LockTimeout: another migration holds yoyo's lock for 10 s.
    :raises psycopg.Error: on a failing step (that step's transaction is rolled back), or when the
        schema is absent and the user may not create it (42501).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        _refuse_shared_schemas(conn.cursor(), schema)
        _refuse_untrusted_owner(conn, schema)
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    backend = get_backend(yoyo_uri(dsn, schema))
    migrations = read_migrations(str(migrations_dir()))
    if up_to is not None:
        migrations = migrations.filter(lambda m: m.id <= up_to and m.id != FUNCTION_STEP)
    try:
        with backend.lock():
            todo = backend.to_apply(migrations)
            backend.apply_migrations(todo)
    finally:
        backend.connection.close()
    return [m.id for m in todo if m.id != FUNCTION_STEP]


# Everything sql/ defines, as the database holds it (rule 5). %(schema)s: the install schema's oid,
# %(private)s: its private schema's (NULL before 0012_private_schema).
_DEFINITIONS = """
SELECT 'function ' || p.pronamespace::regnamespace::text || '.' || p.oid::regprocedure::text,
       pg_get_functiondef(p.oid), p.proowner::regrole::text, p.proacl::text, obj_description(p.oid, 'pg_proc')
  FROM pg_proc p WHERE p.pronamespace IN (%(schema)s::oid, %(private)s::oid)
UNION ALL
SELECT 'relation ' || c.relname, CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END,
       c.relowner::regrole::text, c.relacl::text, obj_description(c.oid, 'pg_class')
  FROM pg_class c WHERE c.relnamespace = %(schema)s::oid AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
UNION ALL
SELECT 'schema ' || n.nspname, NULL, n.nspowner::regrole::text, n.nspacl::text, obj_description(n.oid, 'pg_namespace')
  FROM pg_namespace n WHERE n.oid IN (%(schema)s::oid, %(private)s::oid)
UNION ALL
SELECT 'member ' || r.rolname || ' ' || m.member::regrole::text, NULL, NULL, NULL, NULL
  FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid WHERE r.rolname LIKE 'dq\\_%%'
ORDER BY 1
"""


def apply_functions(conn: psycopg.Connection[Any], migrations: Path) -> bool:
    """The step ``9999_sql``: apply ``sql/`` (beside ``migrations``) in the current transaction.

    Follows rules 3, 5, 6 and 7 of the module docstring.

    :param conn: yoyo's connection, inside the step's transaction; its ``current_schema()`` is the
        install schema.
    :param migrations: the directory of the ``9999_sql.py`` being run.
    :returns: True when the definitions changed, False when they were already current (nothing
        kept) or some schema step is not applied (nothing done).
    :raises psycopg.Error: from a failing ``sql/`` file (yoyo rolls the transaction back); 3F000
        when the connection has no current schema (the install schema does not exist).
    :raises InvalidArgument: (22023) the install schema is the private schema of another install,
        or its private schema holds another install (rule 7); no function is touched.
    """
    cur = conn.cursor()
    applied = {r[0] for r in cur.execute("SELECT migration_id FROM _yoyo_migration").fetchall()}
    missing = [s for s in schema_steps(migrations) if s not in applied]
    if missing:
        logger.warning("the functions of sql/ need the latest schema; not applied (steps pending: %s)", missing)
        return False
    row = cur.execute("SELECT n.oid, n.nspname FROM pg_namespace n WHERE n.nspname = current_schema()").fetchone()
    if row is None:
        raise psycopg.errors.InvalidSchemaName("pyqueue: the install schema does not exist (no current_schema())")
    schema_oid, schema = row
    _refuse_shared_schemas(cur, schema)
    private = cur.execute("SELECT to_regnamespace(quote_ident(%s))::oid", (private_schema(schema),)).fetchone()
    names = {"schema": schema_oid, "private": private[0] if private else None}
    texts = [path.read_text(encoding="utf-8") for path in sorted(_sql_dir_beside(migrations).glob("*.sql"))]
    search_path = sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema))
    cur.execute(search_path)
    before = cur.execute(_DEFINITIONS, names).fetchall()
    cur.execute("SAVEPOINT pyqueue_sql")
    for text in texts:
        cur.execute(text)
    cur.execute(search_path)
    if cur.execute(_DEFINITIONS, names).fetchall() == before:
        cur.execute("ROLLBACK TO SAVEPOINT pyqueue_sql")
        return False
    cur.execute("RELEASE SAVEPOINT pyqueue_sql")
    return True
