"""A PostgreSQL server of a benchmark run's own (bench.chaos, bench.soak): a new data directory
and a free loopback port, started by ``scripts/localpg.sh``, never the test or demo server, because
the run restarts it (``pg_ctl restart -m immediate``); :meth:`PrivateServer.destroy` stops it and
removes its data directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from glob import glob
from pathlib import Path

from bench.lib.report import PROJECT, console


def _pg_bindir() -> Path:
    found = sorted(glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]), reverse=True)
    if found:
        return Path(found[0]).parent
    which = shutil.which("pg_ctl")
    if which:
        return Path(which).parent
    raise SystemExit("bench.chaos: no PostgreSQL server binaries; run scripts/install-os-deps.sh")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """A PostgreSQL server of this run only: ``scripts/localpg.sh`` with its own data directory
    and port (as the postgres user when run as root); :meth:`destroy` stops it and removes the
    data directory."""

    def __init__(self, pgdata: str | None, workdir: Path, port: int | None = None, *, db: str = "chaos") -> None:
        self.port = port if port is not None else _free_port()
        if pgdata is not None and Path(pgdata).exists() and any(Path(pgdata).iterdir()):
            raise SystemExit(f"bench.chaos: --pgdata {pgdata} is not empty; give a new or empty directory")
        self.workdir = workdir
        self.parent = Path(pgdata).parent if pgdata else workdir
        self.intended = Path(pgdata) if pgdata else workdir / "pgdata"
        self.bindir = _pg_bindir()
        self.env = dict(os.environ, DQ_PGDATA=str(self.intended), DQ_PGPORT=str(self.port), DQ_PGDB=db)
        self.datadir: Path | None = None
        self.dsn = ""

    def _as_pg(self, *cmd: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)

    def _localpg(self, action: str) -> str:
        out = subprocess.run([str(PROJECT / "scripts" / "localpg.sh"), action], env=self.env, capture_output=True,
                             text=True, timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/localpg.sh {action} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout.strip()

    def up(self) -> str:
        if os.geteuid() == 0 and self.parent == self.workdir:  # the postgres user must reach the data directory
            os.chmod(self.parent, 0o711)
        self.datadir = Path(self._localpg("datadir"))
        self.dsn = self._localpg("up").splitlines()[-1]
        return self.dsn

    def restart_immediate(self) -> None:
        assert self.datadir is not None
        subprocess.run(self._as_pg(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w",
                                   "-t", "60", "-l", str(self.datadir / "server.log"), "-o", f"-p {self.port}",
                                   "restart"), check=True, capture_output=True, timeout=90)

    def log_tail(self, n: int = 40) -> str:
        try:
            out = subprocess.run(self._as_pg("tail", "-n", str(n), str(self.datadir) + "/server.log"),
                                 capture_output=True, text=True, timeout=10)
            return out.stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    def destroy(self) -> None:
        if self.datadir is None:
            return
        try:
            self._localpg("destroy")
        except (RuntimeError, subprocess.SubprocessError) as exc:
            console().log(f"[red]stopping the private server failed ({exc}); stopping it immediately[/]")
            subprocess.run(self._as_pg(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                                       "stop"), capture_output=True, timeout=60)
            shutil.rmtree(self.datadir, ignore_errors=True)
        self.datadir = None
