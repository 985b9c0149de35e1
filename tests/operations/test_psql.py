"""The README's psql one-liner, through the real ``psql`` program.

An untyped string literal as payload resolves to the text overload of dq_offer (text is the
preferred type of the string category), so the JSON-looking literal is stored as text.
"""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta

from sqlhelpers import message, pg_program

OFFER = """SELECT dq_offer('emails', 'welcome-42', '{"to": "a@example.com"}', now() + interval '10 minutes');"""


def run_psql(dsn: str, command: str, *options: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.run(
        [pg_program("psql"), dsn, "-X", "-v", "ON_ERROR_STOP=1", *options, "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_untyped_literal_offer_through_psql(conn, dsn):
    proc = run_psql(dsn, OFFER)
    assert proc.returncode == 0, proc.stderr
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert lines == ["dq_offer", "----------", "created", "(1 row)", ""], proc.stdout

    row = message(conn, "emails", "welcome-42")
    assert row is not None
    assert row["payload_type"] == "text"
    assert bytes(row["payload"]) == b'{"to": "a@example.com"}'
    # scheduled_at and created_at were both computed from the same now().
    assert row["scheduled_at"] - row["created_at"] == timedelta(minutes=10)
    assert row["scheduled_at_initially"] == row["scheduled_at"]
    assert row["delivery_count"] == 0 and row["lock_token"] is None

    again = run_psql(dsn, OFFER)
    assert again.returncode == 0, again.stderr
    assert "updated" in again.stdout.split()  # a new now(): another scheduled_at


def test_psql_reports_bad_input_with_its_sqlstate(conn, dsn):
    proc = run_psql(dsn, "SELECT dq_offer('emails', '', 'x');", "-v", "VERBOSITY=verbose")
    assert proc.returncode != 0
    assert "22023" in proc.stderr and "dq_offer: key must not be empty" in proc.stderr
    assert conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0
