"""The README's first examples run as written: its psql block through a real ``psql`` process
(as pasted into ``make psql``), its Python block through a real Python interpreter, each read
from README.md (the one copy) and run twice, as a new user does, against a fresh database."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from typing import Any

import psycopg
from docblocks import ROOT, block_after, run_psql, run_python
from sqlhelpers import message

README = ROOT / "README.md"


def run_psql_block(dsn: str) -> subprocess.CompletedProcess[str]:
    return run_psql(block_after(README, "From psql (`make psql`)", "sql"), dsn, "-v", "ON_ERROR_STOP=1")


def test_readme_psql_example_runs_top_to_bottom(conn: psycopg.Connection[Any], dsn: str) -> None:
    first = run_psql_block(dsn)
    assert first.returncode == 0, first.stdout + first.stderr
    assert 'received welcome-42 {"to": "a@example.com"}' in first.stdout, first.stdout
    words = first.stdout.split()
    # offer, ack, offer: the results in order
    assert [w for w in words if w in ("created", "updated", "t", "f")] == ["created", "t", "created"], first.stdout
    assert message(conn, "emails", "welcome-42") is None  # acknowledged: deleted
    reminder = message(conn, "emails", "reminder-42")
    assert reminder is not None and reminder["delivery_count"] == 0
    assert reminder["scheduled_at"] - reminder["created_at"] == timedelta(minutes=10)

    # The second run, as the README says: the welcome is created anew, the reminder updated.
    second = run_psql_block(dsn)
    assert second.returncode == 0, second.stdout + second.stderr
    assert 'received welcome-42 {"to": "a@example.com"}' in second.stdout, second.stdout
    assert [w for w in second.stdout.split() if w in ("created", "updated", "t", "f")] == ["created", "t", "updated"]
    assert message(conn, "emails", "welcome-42") is None


def test_readme_python_example_prints_what_it_received(conn: psycopg.Connection[Any], dsn: str) -> None:
    block = block_after(README, "From Python (", "python")
    for run in (1, 2):  # the comments hold on the first and the second run
        proc = run_python(block, dsn, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert lines == ["OfferOutcome.CREATED", "received welcome-43 {'to': 'b@example.com'} delivery 1"], (run, lines)
        assert message(conn, "emails", "welcome-43") is None  # acknowledged
        reminder = message(conn, "emails", "reminder-43")
        assert reminder is not None and reminder["delivery_count"] == 0
        assert timedelta(minutes=9) < reminder["scheduled_at"] - reminder["created_at"] <= timedelta(minutes=10)

    # "UPDATED if still queued": the welcome offered before and not yet consumed.
    conn.execute("SELECT dq_offer('emails', 'welcome-43', %s::jsonb, now() + interval '1 hour')",
                 ('{"to": "b@example.com"}',))
    proc = run_python(block, dsn, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "OfferOutcome.UPDATED", "received welcome-43 {'to': 'b@example.com'} delivery 1"]


def test_readme_examples_one_after_the_other(conn: psycopg.Connection[Any], dsn: str) -> None:
    """psql first, then Python, in one database as a new user does: the Python poll receives only
    its own welcome (psql acknowledged its one; both reminders are not due)."""
    assert run_psql_block(dsn).returncode == 0
    proc = run_python(block_after(README, "From Python (", "python"), dsn, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    received = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("received ")]
    assert received == ["welcome-43"], proc.stdout
    left = {r[0] for r in conn.execute("SELECT key FROM dq_messages WHERE queue = 'emails'")}
    assert left == {"reminder-42", "reminder-43"}
