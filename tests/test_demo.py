"""The main job, small: real producer, the psql program, real consumer processes; and the
Makefile's targets on another port (``DQ_PGPORT``)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_demo_delivers_everything_once(dsn: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pyqueue.demo", "--dsn", dsn, "--messages", "600", "--spread", "2",
         "--consumers", "2", "--psql-batch", "50"],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # exit status 0 already means lost == 0 and duplicates == 0; check the summary says so too
    assert re.search(r"offered \(python / psql\)\s*│\s*600 / 50", out), out
    assert re.search(r"delivered \(distinct keys\)\s*│\s*650\b", out), out
    assert re.search(r"duplicates \(keys received more than once\)\s*│\s*0\b", out), out
    assert re.search(r"lost \(offered, never received\)\s*│\s*0\b", out), out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_dq_pgport_moves_the_server_and_every_dsn_of_the_makefile(tmp_path: Path) -> None:
    """``DQ_PGPORT=… make …`` (the README's first screen): the private server and the DSN of every
    target follow the one variable; nothing is left on the default port 55432."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "DQ_"))}
    env |= {"DQ_PGPORT": str(port), "DQ_PGDATA": str(tmp_path / "pgdata")}
    # DOCKER_ENGINE= : the private local server, whatever this machine has (compose is another file)
    make = ["make", "--no-print-directory", "-C", str(ROOT), "DOCKER_ENGINE="]

    dry = subprocess.run([*make, "-n", "up", "psql", "migrate", "demo", "bench", "bench-latency", "bench-spark"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert dry.returncode == 0, dry.stderr
    dsns = re.findall(r"postgresql://[^\s\"]+", dry.stdout)
    assert len(dsns) >= 7, dry.stdout
    assert all(d == f"postgresql://postgres:postgres@127.0.0.1:{port}/dq" for d in dsns), dsns
    assert "55432" not in dry.stdout, dry.stdout

    # For real: `make psql` starts the private server on that port and connects to it there.
    query = "SELECT 'port=' || inet_server_port() || ' data=' || current_setting('data_directory');\n"
    try:
        proc = subprocess.run([*make, "psql"], input=query, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        datadir = subprocess.run([str(ROOT / "scripts" / "localpg.sh"), "datadir"], capture_output=True, text=True,
                                 env=env, check=True).stdout.strip()
        assert f"PostgreSQL with pg_cron: postgresql://postgres:postgres@127.0.0.1:{port}/dq" in proc.stdout
        assert f"port={port} data={datadir}" in proc.stdout, proc.stdout
    finally:
        subprocess.run([*make, "down"], capture_output=True, env=env, timeout=120)
        subprocess.run([str(ROOT / "scripts" / "localpg.sh"), "destroy"], capture_output=True, env=env, timeout=120)
    # `make down` stopped that server: nothing answers on the port any more
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
