"""Install and upgrade the database side with yoyo-migrations.

``migrate(dsn)`` applies the numbered schema steps of ``migrations/`` and then the step
``9999_sql``, which (re)creates the functions of ``sql/`` when their checksum changed. It is
exactly what ``yoyo apply --batch --database postgresql+psycopg://… migrations/`` does, so
deploy pipelines may use either. Running it again changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict
from yoyo import get_backend, read_migrations

__all__ = ["migrate", "migrations_dir", "sql_dir", "yoyo_uri", "pending"]


def _resource_dir(name: str) -> Path:
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg / f"_{name}", pkg.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pyqueue: cannot find the {name}/ directory")


def migrations_dir() -> Path:
    """The ``migrations/`` directory (in the source tree, or packaged as ``pyqueue/_migrations``)."""
    return _resource_dir("migrations")


def sql_dir() -> Path:
    """The ``sql/`` directory of function definitions."""
    return _resource_dir("sql")


def yoyo_uri(dsn: str) -> str:
    """Turn a libpq DSN (URL or ``key=value``) into the URL yoyo's psycopg 3 backend expects."""
    params = conninfo_to_dict(dsn)
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    host = str(params.pop("host", "") or "")
    port = params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "") or ""), safe="")
    auth = user + (":" + quote(str(password), safe="") if password is not None else "")
    netloc = (auth + "@" if auth else "") + (quote(host, safe="") if host.startswith("/") else host)
    if port:
        netloc += f":{port}"
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"postgresql+psycopg://{netloc}/{dbname}" + (f"?{query}" if query else "")


def pending(dsn: str) -> list[str]:
    """Ids of the migrations not yet applied (``9999_sql`` is always listed: it re-checks ``sql/``)."""
    backend = get_backend(yoyo_uri(dsn))
    try:
        migrations = read_migrations(str(migrations_dir()))
        return [m.id for m in backend.to_apply(migrations)]
    finally:
        backend.connection.close()


def migrate(dsn: str, *, up_to: str | None = None) -> list[str]:
    """Apply pending migrations and the current ``sql/`` functions; return the ids applied.

    :param dsn: libpq connection string or URL of the target database.
    :param up_to: apply only the schema migrations whose id sorts at or before this one, and not
        ``9999_sql`` (the current functions need the current schema): leaves the database as an
        older release's schema, for the upgrade test. ``None`` applies everything.
    :raises yoyo.exceptions.MigrationConflict, psycopg.Error: on a failing step (the step is rolled back).
    """
    backend = get_backend(yoyo_uri(dsn))
    migrations = read_migrations(str(migrations_dir()))
    if up_to is not None:
        migrations = migrations.filter(lambda m: m.id <= up_to and m.id != "9999_sql")
    try:
        with backend.lock():
            todo = backend.to_apply(migrations)
            backend.apply_migrations(todo)
    finally:
        backend.connection.close()
    return [m.id for m in todo]
