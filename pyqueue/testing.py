"""Helpers for tests against a real PostgreSQL server (ours, and our users').

Everything here works from an installed wheel; only the third way of :func:`server_dsn` needs a
source checkout.

* :func:`server_dsn` finds or starts a server: ``DQ_TEST_DSN`` if set; else a testcontainers
  PostgreSQL with pg_cron (the image of ``docker/Dockerfile``, shipped in the wheel as
  ``pyqueue/_docker``) when a Docker engine answers; else, in a source checkout, the private local
  server of ``scripts/localpg.sh`` (data in ``.pgdata-test``, port 55433, or ``DQ_TEST_PGPORT``:
  two checkouts testing at once each need their own port). Otherwise it raises ``RuntimeError``.
* :func:`create_template` builds a database with the real installer (:func:`pyqueue.migrate.migrate`).
* :func:`clone_database` / :func:`drop_database` give each test its own copy
  (``CREATE DATABASE … TEMPLATE``), so tests with several sessions (NOTIFY, SKIP LOCKED, workers)
  do not see each other.
* :func:`offered` lists what a queue holds, to assert on what code under test offered.
* :func:`pgbouncer` runs a real PgBouncer in front of a test server (session or transaction
  pooling), to test code the way it runs behind one in production.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .migrate import migrate, resource_dir

__all__ = [
    "server_dsn",
    "with_dbname",
    "create_template",
    "clone_database",
    "drop_database",
    "offered",
    "docker_available",
    "pgbouncer",
]

PROJECT = Path(__file__).resolve().parent.parent
"""The source checkout, when the package is run from one (``scripts/localpg.sh`` is there)."""


def with_dbname(dsn: str, dbname: str) -> str:
    """The same DSN pointing at another database."""
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def docker_available() -> bool:
    """True when a Docker engine answers (not just a docker client on PATH)."""
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


_container: Any = None


def server_dsn() -> str:
    """DSN of an administrative database on a server with pg_cron that the tests may use.

    :raises RuntimeError: no ``DQ_TEST_DSN``, no Docker engine, and not in a source checkout.
    :raises subprocess.CalledProcessError: ``scripts/localpg.sh`` failed.
    """
    global _container
    env = os.environ.get("DQ_TEST_DSN")
    if env:
        return env
    if docker_available():
        from testcontainers.core.image import DockerImage

        try:  # testcontainers >= 4.14 moved the module (the old path warns)
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:  # pragma: no cover - older testcontainers
            from testcontainers.postgres import PostgresContainer

        image = DockerImage(path=str(resource_dir("docker")), tag="pgdelayq-postgres:test")
        image.build()
        _container = PostgresContainer(
            str(image), username="postgres", password="postgres", dbname="dq", driver=None
        )
        _container.with_command("postgres -c shared_preload_libraries=pg_cron -c cron.database_name=dq")
        _container.start()
        host = _container.get_container_host_ip()
        port = _container.get_exposed_port(5432)
        return f"postgresql://postgres:postgres@{host}:{port}/dq"
    localpg = PROJECT / "scripts" / "localpg.sh"
    if not localpg.is_file():
        raise RuntimeError(
            "pyqueue.testing: no test server: set DQ_TEST_DSN to a PostgreSQL 15 server with pg_cron "
            "(shared_preload_libraries = pg_cron), or start a Docker engine"
        )
    port = os.environ.get("DQ_TEST_PGPORT", "55433")
    env_vars = dict(os.environ, DQ_PGDATA=str(PROJECT / ".pgdata-test"), DQ_PGPORT=port, DQ_PGDB="dq")
    out = subprocess.run(
        [str(localpg), "up"], env=env_vars, check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def create_template(admin_dsn: str, name: str = "dq_template") -> str:
    """(Re)create database ``name`` with the installer and return its DSN."""
    drop_database(admin_dsn, name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_dbname(admin_dsn, name)
    migrate(dsn)
    return dsn


def clone_database(admin_dsn: str, template: str = "dq_template", name: str | None = None) -> str:
    """Create a fresh copy of ``template`` and return its DSN."""
    name = name or f"dq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )
    return with_dbname(admin_dsn, name)


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting its sessions."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def offered(conn_or_dsn: psycopg.Connection[Any] | str, queue: str) -> dict[str, dict[str, Any]]:
    """What ``queue`` holds now: ``{key: {payload, payload_type, scheduled_at, delivery_count}}``."""
    query = (
        "SELECT key, payload, payload_type, scheduled_at_initially, delivery_count "
        "FROM dq_messages WHERE queue = %s ORDER BY key"
    )
    if isinstance(conn_or_dsn, str):
        with psycopg.connect(conn_or_dsn) as conn:
            rows = conn.execute(query, (queue,)).fetchall()
    else:
        rows = conn_or_dsn.execute(query, (queue,)).fetchall()
    return {
        r[0]: {"payload": bytes(r[1]), "payload_type": r[2], "scheduled_at": r[3], "delivery_count": r[4]}
        for r in rows
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def pgbouncer(dsn: str, pool_mode: str = "transaction") -> Iterator[str]:
    """Run PgBouncer (``/usr/sbin/pgbouncer``) in front of the server of ``dsn`` and yield ``dsn``
    rewritten to go through it. PgBouncer refuses to run as root: as root it runs as the
    ``postgres`` user. The server's password comes from ``dsn``.

    :param pool_mode: ``transaction`` (a server connection per transaction: LISTEN/NOTIFY and
        session state do not work) or ``session``.
    """
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    params = conninfo_to_dict(dsn)
    user = str(params.get("user", "postgres"))
    password = str(params.get("password", ""))
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="dq-pgbouncer-"))
    (workdir / "userlist.txt").write_text(f'"{user}" "{password}"\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={params.get('host', '127.0.0.1')} port={params.get('port', 5432)}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir}/userlist.txt\n"
        f"pool_mode = {pool_mode}\nmax_client_conn = 200\ndefault_pool_size = 20\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {workdir}/pgbouncer.log\n"
    )
    command = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, pw.pw_uid, pw.pw_gid)
        command = ["runuser", "-u", "postgres", "--", *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    through = make_conninfo(dsn, host="127.0.0.1", port=str(port))
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(through, autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (workdir / "pgbouncer.log").read_text() if (workdir / "pgbouncer.log").exists() else ""
                    raise RuntimeError(
                        f"pgbouncer did not start (exit {proc.poll()}): {log}"
                    ) from exc
                time.sleep(0.1)
        yield through
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
