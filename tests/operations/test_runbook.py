"""docs/operations.md, the runbook, runs as written: each of its sql blocks through a real ``psql``
as a ``dq_admin`` login (the role the page tells operators to use), on a database holding what the
runbook talks about (queues, a dead letter, messages in flight, a schedule). A block marked
``<!-- test: as owner -->`` must need more than ``dq_admin`` (it fails with 42501 for it) and run
as the tables' owner; ``<!-- test: as owner; pg_cron -->`` runs as the owner in the database that
holds pg_cron (test databases are clones without it), where it must list the queue's pg_cron jobs;
``<!-- test: errors "22023" -->`` lists the SQLSTATEs the block shows on purpose. Any other error
fails the test."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from docblocks import ROOT, Block, code_blocks, run_psql

from pyqueue.migrate import migrate

RUNBOOK = ROOT / "docs" / "operations.md"
BLOCKS = code_blocks(RUNBOOK, "sql")
ERROR = re.compile(r"ERROR:\s+([0-9A-Z]{5}):")


def expected_errors(block: Block) -> list[str]:
    return re.findall(r'errors\s+"([^"]*)"', block.marker or "")


def marked(block: Block, word: str) -> bool:
    return block.marker is not None and re.search(rf"\b{word}\b", block.marker) is not None


def as_owner(block: Block) -> bool:
    return marked(block, "as owner")


def errors_of(proc: Any) -> list[str]:
    return ERROR.findall(proc.stderr)


@pytest.fixture
def runbook_database(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """What the runbook's queries look at, written by the owner."""
    conn.execute("SELECT * FROM dq_configure_queue('emails', max_deliveries => 1, dead_letter_queue => 'emails.dead')")
    conn.execute("SELECT dq_offer('emails', 'welcome/42', '{\"to\": \"a@example.com\"}'::jsonb), "
                 "dq_offer('emails', 'order-8', 'x'), dq_offer('emails', 'later', 'x', now() + interval '1 hour')")
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('emails', 1, '1 minute')").fetchone()
    conn.execute("SELECT dq_nack(%s, '0', 'SMTP 550')", (token,))  # max_deliveries 1: a dead letter
    conn.execute("SELECT lock_token FROM dq_poll_many('emails', 1, '1 hour')")  # one in flight
    conn.execute("SELECT dq_cron_install('nightly-report', 'reports', 'daily at 03:00', 'x'::text)")
    return conn


def test_the_runbook_has_blocks_of_each_kind() -> None:
    assert len(BLOCKS) >= 8
    assert any(as_owner(b) for b in BLOCKS) and any(expected_errors(b) for b in BLOCKS)
    assert any(marked(b, "pg_cron") for b in BLOCKS)


@pytest.mark.parametrize("block", [b for b in BLOCKS if marked(b, "pg_cron")], ids=lambda b: f"line{b.line}")
def test_runbook_pg_cron_block_runs_in_the_pg_cron_database(block: Block, admin_dsn: str) -> None:
    migrate(admin_dsn)  # the database of cron.database_name, with the queue's jobs registered
    proc = run_psql(block, admin_dsn, "-v", "VERBOSITY=verbose")
    assert proc.returncode == 0 and errors_of(proc) == [], proc.stderr
    assert "dq-cron-tick" in proc.stdout and "dq-archive-prune" in proc.stdout, proc.stdout


@pytest.mark.parametrize("block", [b for b in BLOCKS if not marked(b, "pg_cron")], ids=lambda b: f"line{b.line}")
def test_runbook_block_runs_as_written(block: Block, runbook_database: psycopg.Connection[Any], dsn: str,
                                       login: Callable[[str], str]) -> None:
    admin = login("dq_admin")
    proc = run_psql(block, admin, "-v", "VERBOSITY=verbose")
    assert proc.returncode == 0, proc.stderr
    if as_owner(block):
        assert "42501" in errors_of(proc), f"{block.name} is marked 'as owner' but dq_admin runs it:\n{proc.stderr}"
        proc = run_psql(block, dsn, "-v", "VERBOSITY=verbose")
    assert sorted(errors_of(proc)) == sorted(expected_errors(block)), f"{block.name}:\n{proc.stderr}"
    assert proc.stdout.strip(), f"{block.name}: printed nothing"
