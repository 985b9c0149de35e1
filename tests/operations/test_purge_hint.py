"""dq_purge without ``confirm`` refuses, and its hint is the statement that purges that queue, with
the queue's name quoted as a literal whatever it holds (a quote, a backslash, an injection)."""

from __future__ import annotations

import psycopg
import pytest
from sqlhelpers import message_count, value_of


@pytest.mark.parametrize(
    "queue",
    ["it's", "back\\slash'", "x', confirm => true); SELECT dq_purge('victim'"],
    ids=["quote", "backslash", "injection"],
)
def test_purge_hint_quotes_the_queue_name(conn, queue: str) -> None:
    conn.execute("SELECT dq_offer(%s, 'k', 'x'::text)", (queue,))
    conn.execute("SELECT dq_offer('victim', 'k', 'x'::text)")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_purge(%s)", (queue,))
    assert info.value.sqlstate == "22023"
    hint = info.value.diag.message_hint or ""
    literal = value_of(conn, "SELECT format('%%L', %s::text)", (queue,))
    assert hint == f"SELECT dq_purge({literal}, confirm => true)", hint
    if queue == "it's":
        assert hint == "SELECT dq_purge('it''s', confirm => true)"
    assert conn.execute(hint).fetchall() == [(1,)]  # the hint, run as it is, purges that queue only
    assert message_count(conn, queue) == 0 and message_count(conn, "victim") == 1
