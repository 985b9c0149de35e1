"""The README's first examples run as written: its psql block through a real ``psql`` process
(as pasted into ``make psql``), its Python block through a real Python interpreter, each read
from README.md (the one copy) and run twice, as a new user does, against a fresh database."""

from __future__ import annotations

import re
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


def test_the_first_screen_says_what_it_is_and_how_to_run_it() -> None:
    """The two commands on the first screen are real Makefile targets; the README then says what you
    get, how to install it elsewhere, where the docs are, and stays short (details live in docs/)."""
    text = README.read_text(encoding="utf-8")
    first_screen = text.splitlines()[:30]
    commands = [line.split("#")[0].strip() for line in first_screen if line.startswith("make ")]
    assert commands == ["make demo", "make test"], first_screen
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))
    assert {"demo", "test"} <= targets
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings == ["What you get", "Install", "Documentation", "License"], headings
    install = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    for step in ("pip install \"pgdelayq @ git+https://", "pip wheel", "dist/pgdelayq-*.whl", "[spark]",
                 "pyqueue migrate --dsn"):
        assert step in install, f"the install section does not show {step!r}"
    assert "docs/development.md" in text and (ROOT / "LICENSE").exists()
    assert len(text.splitlines()) <= 150, "the README is a first screen and a summary; details go to docs/"
