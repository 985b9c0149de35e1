"""One rule for a queue's settings, in SQL and in Python: a setting not named
keeps its value; clearing one is explicit (``clear => ARRAY['max_in_flight', ...]`` in SQL,
``clear=[...]`` in Python; ``0`` still clears ``max_in_flight`` and ``rate_limit``). Each setting
is checked both ways: set every setting, then each one alone, the others kept; clear each one,
the others kept. Bad uses of ``clear`` raise 22004/22023 naming the parameter and change nothing.
The command line's ``pyqueue queue configure`` is tested in tests/operations/test_cli.py; two concurrent
calls in tests/isolation/configure_configure.spec."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pyqueue import DelayedQueue, InvalidArgument

SETTINGS = ("max_deliveries", "dead_letter_queue", "archive", "retention", "notify", "max_payload_bytes",
            "max_in_flight", "rate_limit", "rate_period")

#: Every setting away from its default ...
FIRST: dict[str, Any] = {
    "max_deliveries": 3, "dead_letter_queue": "q.dlq", "archive": True, "retention": timedelta(days=2),
    "notify": False, "max_payload_bytes": 4096, "max_in_flight": 4, "rate_limit": 5,
    "rate_period": timedelta(seconds=10),
}
#: ... then each one changed alone ...
SECOND: dict[str, Any] = {
    "max_deliveries": 7, "dead_letter_queue": "q.other", "archive": False, "retention": timedelta(hours=3),
    "notify": True, "max_payload_bytes": 8192, "max_in_flight": 9, "rate_limit": 6,
    "rate_period": timedelta(seconds=20),
}
#: ... or cleared: its default (an unconfigured queue's value).
CLEARED: dict[str, Any] = {
    "max_deliveries": None, "dead_letter_queue": None, "archive": False, "retention": None, "notify": True,
    "max_payload_bytes": None, "max_in_flight": None, "rate_limit": None, "rate_period": None,
}


COLUMNS = sql.SQL(", ").join(sql.Identifier(name) for name in SETTINGS)


def settings(conn: psycopg.Connection, queue: str = "q") -> dict[str, Any]:
    row = conn.execute(sql.SQL("SELECT {} FROM dq_queues WHERE queue = %s").format(COLUMNS), (queue,)).fetchone()
    assert row is not None, f"queue {queue!r} has no configuration row"
    return dict(zip(SETTINGS, row, strict=True))


def configure(conn: psycopg.Connection, queue: str = "q", **named: Any) -> dict[str, Any]:
    """``dq_configure_queue`` in named notation with exactly ``named``; the returned row's settings."""
    args = sql.SQL("").join(sql.SQL(", {} => {}").format(sql.Identifier(name), sql.Placeholder(name))
                            for name in named)
    query = sql.SQL("SELECT {} FROM dq_configure_queue({}{})").format(COLUMNS, sql.Placeholder("queue"), args)
    row = conn.execute(query, {"queue": queue, **named}).fetchone()
    return dict(zip(SETTINGS, row, strict=True))


# -- SQL ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SETTINGS)
def test_sql_a_setting_given_alone_keeps_every_other(conn, name: str) -> None:
    assert configure(conn, **FIRST) == FIRST
    assert configure(conn, **{name: SECOND[name]}) == {**FIRST, name: SECOND[name]}
    assert settings(conn) == {**FIRST, name: SECOND[name]}


def test_sql_old_positional_forms_keep_what_they_leave_null(conn) -> None:
    """The 0.1 form (queue, max_deliveries, dead_letter_queue) and a bare call change nothing
    they do not name: ``dq_configure_queue('q')`` no longer removes the delivery limit."""
    assert configure(conn, **FIRST) == FIRST
    conn.execute("SELECT dq_configure_queue('q')")
    conn.execute("SELECT dq_configure_queue('q', NULL, NULL)")
    conn.execute("SELECT dq_configure_queue('q', NULL, NULL, NULL, NULL, NULL, 8192)")
    assert settings(conn) == {**FIRST, "max_payload_bytes": 8192}
    conn.execute("SELECT dq_configure_queue('q', 9, NULL)")  # the dead-letter queue set before is kept
    assert settings(conn) == {**FIRST, "max_payload_bytes": 8192, "max_deliveries": 9}


@pytest.mark.parametrize("name", [s for s in SETTINGS if s not in ("dead_letter_queue", "rate_period")])
def test_sql_clear_resets_one_setting_and_keeps_every_other(conn, name: str) -> None:
    configure(conn, **FIRST)
    # Clearing rate_limit takes its rate_period with it (a period alone limits nothing).
    also = {"rate_period": None} if name == "rate_limit" else {}
    assert configure(conn, clear=[name]) == {**FIRST, name: CLEARED[name], **also}
    assert settings(conn) == {**FIRST, name: CLEARED[name], **also}


def test_sql_clear_pairs_and_everything(conn) -> None:
    configure(conn, **FIRST)
    both = ["max_deliveries", "dead_letter_queue"]
    assert configure(conn, clear=both) == {**FIRST, "max_deliveries": None, "dead_letter_queue": None}
    configure(conn, **FIRST)
    assert configure(conn, clear=["rate_limit", "rate_period"]) == {**FIRST, "rate_limit": None, "rate_period": None}
    configure(conn, **FIRST)
    assert configure(conn, clear=list(SETTINGS)) == CLEARED
    # clear and a new value of another setting in one call; a repeated name is one name
    configure(conn, **FIRST)
    assert configure(conn, max_in_flight=2, clear=["archive", "archive"]) == {**FIRST, "max_in_flight": 2,
                                                                            "archive": False}
    # one setting given, another cleared
    assert configure(conn, rate_period=timedelta(seconds=30), clear=["max_in_flight"])["rate_period"] == \
        timedelta(seconds=30)


def test_sql_clear_on_a_new_queue_gives_the_defaults(conn) -> None:
    assert configure(conn, "fresh", clear=list(SETTINGS)) == CLEARED
    assert configure(conn, "fresh2", clear=[]) == CLEARED


def test_sql_zero_still_clears_the_two_limits(conn) -> None:
    configure(conn, **FIRST)
    assert configure(conn, max_in_flight=0, rate_limit=0) == {**FIRST, "max_in_flight": None, "rate_limit": None,
                                                             "rate_period": None}


CLEAR_REFUSED = [
    pytest.param(["max_inflight"], "22023", ("dq_configure_queue:", "clear", "max_inflight", "max_in_flight"),
                 id="unknown-name"),
    pytest.param(["archive", None], "22004", ("dq_configure_queue:", "clear", "NULL"), id="null-element"),
    pytest.param([""], "22023", ("dq_configure_queue:", "clear"), id="empty-name"),
    pytest.param(["dead_letter_queue"], "22023",
                 ("dq_configure_queue:", "clear", "dead_letter_queue", "max_deliveries"), id="dlq-under-a-limit"),
    pytest.param(["rate_period"], "22023", ("dq_configure_queue:", "clear", "rate_limit", "rate_period"),
                 id="period-under-a-rate-limit"),
]


@pytest.mark.parametrize(("clear", "sqlstate", "contains"), CLEAR_REFUSED)
def test_sql_bad_clear_is_refused_and_changes_nothing(conn, clear: list[str | None], sqlstate: str,
                                                      contains: tuple[str, ...]) -> None:
    configure(conn, **FIRST)
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_configure_queue('q', max_in_flight => 2, clear => %s::text[])", (clear,))
    assert info.value.sqlstate == sqlstate, str(info.value)
    for text in contains:
        assert text in str(info.value), str(info.value)
    assert settings(conn) == FIRST


@pytest.mark.parametrize("name", SETTINGS)
def test_sql_a_setting_given_and_cleared_at_once_is_refused(conn, name: str) -> None:
    configure(conn, **FIRST)
    with pytest.raises(psycopg.Error) as info:
        configure(conn, **{name: SECOND[name]}, clear=[name])
    assert info.value.sqlstate == "22023", str(info.value)
    assert "dq_configure_queue:" in str(info.value) and "clear" in str(info.value) and name in str(info.value)
    assert settings(conn) == FIRST


def test_sql_refused_clear_on_a_new_queue_writes_no_row(conn) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_configure_queue('never', clear => ARRAY['nope'])")
    assert info.value.sqlstate == "22023"
    assert conn.execute("SELECT count(*) FROM dq_queues WHERE queue = 'never'").fetchone() == (0,)


def test_sql_max_deliveries_needs_a_dead_letter_queue_given_or_kept(conn) -> None:
    with pytest.raises(psycopg.Error) as info:
        configure(conn, max_deliveries=3)
    assert info.value.sqlstate == "22023" and "needs a dead_letter_queue" in str(info.value)
    configure(conn, max_deliveries=3, dead_letter_queue="q.dlq")
    assert configure(conn, max_deliveries=5)["max_deliveries"] == 5  # the kept dead-letter queue serves


# -- Python ------------------------------------------------------------------------------------------

def test_python_configure_keeps_what_it_does_not_name_and_clears_explicitly(q: DelayedQueue, conn) -> None:
    q.configure(max_deliveries=3, dead_letter_queue="emails.dlq")
    q.configure(max_in_flight=4)
    assert settings(conn, "emails") == {**CLEARED, "max_deliveries": 3, "dead_letter_queue": "emails.dlq",
                                        "max_in_flight": 4}
    q.configure(rate_limit=2, rate_period=10, archive=True)
    q.configure(clear=["max_deliveries", "dead_letter_queue"])
    assert settings(conn, "emails") == {**CLEARED, "max_in_flight": 4, "rate_limit": 2,
                                        "rate_period": timedelta(seconds=10), "archive": True}
    q.configure(clear=("rate_limit", "archive"), max_payload_bytes=2048)
    assert settings(conn, "emails") == {**CLEARED, "max_in_flight": 4, "max_payload_bytes": 2048}


@pytest.mark.parametrize("clear", ["max_in_flight", [1], ["archive", None], {"archive": 1}.items()])
def test_python_clear_must_be_a_collection_of_names(q: DelayedQueue, conn, clear: object) -> None:
    q.configure(max_in_flight=4)
    with pytest.raises(InvalidArgument) as info:
        q.configure(clear=clear)  # type: ignore[arg-type]
    assert "clear" in str(info.value)
    assert settings(conn, "emails")["max_in_flight"] == 4


def test_python_unknown_or_conflicting_clear_raises_invalid_argument(q: DelayedQueue, conn) -> None:
    q.configure(max_in_flight=4)
    with pytest.raises(InvalidArgument) as info:
        q.configure(clear=["max_in_flights"])
    assert info.value.sqlstate == "22023" and "clear" in str(info.value)
    with pytest.raises(InvalidArgument) as info:
        q.configure(max_in_flight=5, clear=["max_in_flight"])
    assert info.value.sqlstate == "22023" and "max_in_flight" in str(info.value)
    assert settings(conn, "emails")["max_in_flight"] == 4
