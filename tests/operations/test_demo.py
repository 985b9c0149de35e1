"""The main job, small: real producer, the psql program, real consumer processes; and the
Makefile's targets on another port (``DQ_PGPORT``).

The demo's own summary is checked against the database: a ledger filled by row triggers on
``dq_messages`` (installed in the test's database before the demo starts, outside the demo's
reach) records every message inserted and deleted, with the statement that deleted it, so the test
recounts what was offered and acknowledged without trusting the program's arithmetic.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.py"

LEDGER = """
CREATE SCHEMA ledger;
CREATE TABLE ledger.events (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    op              text   NOT NULL,  -- INSERT or DELETE
    queue           text   NOT NULL,
    key             text   NOT NULL,
    payload         bytea  NOT NULL,
    payload_type    text   NOT NULL,
    delivery_count  integer NOT NULL,
    locked          boolean NOT NULL,
    statement       text   NOT NULL   -- the client's statement that caused it
);
CREATE FUNCTION ledger.record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r public.dq_messages := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
BEGIN
    INSERT INTO ledger.events (op, queue, key, payload, payload_type, delivery_count, locked, statement)
    VALUES (TG_OP, r.queue, r.key, r.payload, r.payload_type, r.delivery_count, r.lock_token IS NOT NULL,
            current_query());
    RETURN NULL;
END;
$$;
CREATE TRIGGER ledger_record AFTER INSERT OR DELETE ON public.dq_messages
    FOR EACH ROW EXECUTE FUNCTION ledger.record();
"""


def summary_value(out: str, label: str) -> str:
    """The value cell of one row of the demo's summary table."""
    match = re.search(re.escape(label) + r"\s*│\s*([^│]+?)\s*│", out)
    assert match, f"no {label!r} row in:\n{out}"
    return match.group(1)


@pytest.mark.slow
def test_demo_delivers_everything_once(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER)
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--dsn", dsn, "--messages", "600", "--spread", "2",
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

    # Recount from the database.
    (queue,) = re.findall(r"^queue (demo-\S+): ", out, re.MULTILINE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        events = conn.execute(
            "SELECT op, key, payload, payload_type, delivery_count, locked, statement FROM ledger.events "
            "WHERE queue = %s ORDER BY seq", (queue,)).fetchall()
        assert conn.execute("SELECT count(*) FROM ledger.events WHERE queue <> %s", (queue,)).fetchone() == (0,)
        left = conn.execute("SELECT count(*) FROM dq_messages WHERE queue = %s", (queue,)).fetchone()
        waiters = conn.execute("SELECT count(*) FROM dq_waiters WHERE queue = %s", (queue,)).fetchone()
    assert (left, waiters) == ((0,), (0,)), "the demo left messages or waiter rows behind"
    offered = Counter(e[1] for e in events if e[0] == "INSERT")
    gone = [e for e in events if e[0] == "DELETE"]
    expected = {f"py-{n}" for n in range(1, 601)} | {f"psql-{n}" for n in range(1, 51)}
    assert set(offered) == expected and set(offered.values()) == {1}, "every key offered exactly once"
    assert sorted(e[1] for e in gone) == sorted(expected), "every key left the queue exactly once"
    # Each left acknowledged by a consumer holding it (the summary's cleanup cancels nothing).
    not_acked = [e[1] for e in gone if not (e[5] and e[4] >= 1 and "dq_ack" in e[6] and "dq_cancel" not in e[6])]
    assert not_acked == [], not_acked[:5]
    inserts_by_key = {e[1]: e for e in events if e[0] == "INSERT"}
    assert all(json.loads(e[2]) == {"n": int(e[1].rsplit("-", 1)[1])} for e in gone), "payload matches its key"
    assert all(inserts_by_key[e[1]][2:4] == e[2:4] for e in gone), "acknowledged what was offered"
    assert {e[3] for e in gone if e[1].startswith("psql-")} == {"json"}
    # ... and the program printed those counts.
    python_n = sum(1 for k in offered if k.startswith("py-"))
    assert summary_value(out, "offered (python / psql)") == f"{python_n} / {len(offered) - python_n}"
    assert summary_value(out, "delivered (distinct keys)") == str(len({e[1] for e in gone}))
    assert summary_value(out, "redeliveries (delivery_count > 1)") == str(sum(1 for e in gone if e[4] > 1))
    assert summary_value(out, "payloads not matching their key") == "0"
    assert f"removed queue {queue} (0 leftover messages," in out, out


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
