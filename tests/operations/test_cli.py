"""The command line as a new user runs it: real ``python -m pyqueue`` processes against the test
server. ``--version``; ``offer --payload`` storing JSON text as JSON; ``poll`` printing the lock
token and what keeps the message locked, ``ack`` by token; ``queue configure | redrive |
dead-letters`` for the operator's tasks without SQL; ``stats`` fitting 80 columns; ``next-due``;
``cron uninstall``."""

from __future__ import annotations

import importlib.metadata
import json
from datetime import timedelta
from typing import Any

import psycopg
from commandline import cli, stored


def test_version_is_the_installed_distribution() -> None:
    out = cli(None, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"pyqueue (pgdelayq) {importlib.metadata.version('pgdelayq')}"


def test_offer_stores_json_text_as_json_unless_told(dsn: str, conn) -> None:
    out = cli(dsn, "offer", "--queue", "jobs", "--key", "a", "--payload", '{"x": 1}')
    assert (out.returncode, out.stdout.strip(), out.stderr.strip()) == (0, "created", "payload_type json"), out.stderr
    assert stored(conn, "jobs", "a") == ("json", b'{"x":1}')
    out = cli(dsn, "offer", "--queue", "jobs", "--key", "b", "--payload", '{"x": 1}', "--text")
    assert out.returncode == 0 and out.stderr.strip() == "payload_type text", out.stderr
    assert stored(conn, "jobs", "b") == ("text", b'{"x": 1}')
    out = cli(dsn, "offer", "--queue", "jobs", "--key", "c", "--payload", "hello world")
    assert out.returncode == 0 and stored(conn, "jobs", "c") == ("text", b"hello world"), out.stderr
    out = cli(dsn, "offer", "--queue", "jobs", "--key", "d", "--payload", "hello", "--json")
    assert out.returncode != 0 and "--payload is not JSON" in out.stderr and stored(conn, "jobs", "d") is None
    out = cli(dsn, "offer", "--queue", "jobs", "--key", "e", "--payload", "[]", "--json", "--text")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr


def test_poll_prints_the_lock_token_and_ack_takes_it(dsn: str, conn) -> None:
    assert cli(dsn, "offer", "--queue", "jobs", "--key", "a", "--payload", '{"x": 1}').returncode == 0
    out = cli(dsn, "poll", "--queue", "jobs", "--lock-timeout", "60")
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    polled = json.loads(line)
    assert polled["key"] == "a" and polled["payload"] == '{"x":1}' and polled["delivery_count"] == 1
    assert "locked_until" in polled
    assert ("stay locked until acknowledged (pyqueue ack --queue jobs LOCK_TOKEN...) or until their lock "
            "expires") in out.stderr
    token = polled["lock_token"]
    assert conn.execute("SELECT lock_token::text FROM dq_messages WHERE key = 'a'").fetchone() == (token,)
    assert cli(dsn, "poll", "--queue", "jobs").stdout == ""  # still locked: nothing due
    out = cli(dsn, "ack", "--queue", "jobs", token)
    assert (out.returncode, out.stdout.strip()) == (0, "acknowledged 1 of 1"), out.stderr
    assert stored(conn, "jobs", "a") is None
    stale = cli(dsn, "ack", "--queue", "jobs", token)
    assert stale.returncode == 1 and stale.stdout.strip() == "acknowledged 0 of 1"
    bad = cli(dsn, "ack", "--queue", "jobs", "not-a-uuid")
    assert bad.returncode == 2 and "lock_token" in bad.stderr and "messages[0] must be a UUID" in bad.stderr


def test_queue_configure_sets_every_setting(dsn: str, conn) -> None:
    out = cli(dsn, "queue", "configure", "jobs", "--max-deliveries", "2", "--dead-letter-queue", "jobs-dead",
              "--archive", "--retention", "2h", "--no-notify", "--max-payload-bytes", "4096")
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr
    row = conn.execute("SELECT max_deliveries, dead_letter_queue, archive, retention, notify, max_payload_bytes "
                       "FROM dq_queues WHERE queue = 'jobs'").fetchone()
    assert row == (2, "jobs-dead", True, timedelta(hours=2), False, 4096)
    bad = cli(dsn, "queue", "configure", "jobs", "--max-deliveries", "3", "--dead-letter-queue", "jobs")
    assert bad.returncode == 2 and "SQLSTATE 22023" in bad.stderr, bad.stderr
    nothing = cli(dsn, "queue", "configure", "jobs")
    assert nothing.returncode == 2 and "--max-deliveries" in nothing.stderr and "--rate-period" in nothing.stderr


#: Each setting of ``pyqueue queue configure``: its column, the options that change it alone (from
#: the values of CONFIGURED), the value they set, and the options that clear it.
CONFIGURE_SETTINGS: list[tuple[str, list[str], Any, list[str]]] = [
    ("max_deliveries", ["--max-deliveries", "7"], 7, ["--clear", "max-deliveries"]),
    ("dead_letter_queue", ["--dead-letter-queue", "jobs.other"], "jobs.other", ["--clear", "dead-letter-queue"]),
    ("archive", ["--no-archive"], False, ["--clear", "archive"]),
    ("retention", ["--retention", "3h"], timedelta(hours=3), ["--clear", "retention"]),
    ("notify", ["--notify"], True, ["--clear", "notify"]),
    ("max_payload_bytes", ["--max-payload-bytes", "8192"], 8192, ["--clear", "max_payload_bytes"]),
    ("max_in_flight", ["--max-in-flight", "9"], 9, ["--clear", "max-in-flight"]),
    ("rate_limit", ["--rate-limit", "6"], 6, ["--clear", "rate-limit"]),
    ("rate_period", ["--rate-period", "20s"], timedelta(seconds=20), ["--clear", "rate-period"]),
]
CONFIGURED = {"max_deliveries": 3, "dead_letter_queue": "jobs.dlq", "archive": True, "retention": timedelta(hours=2),
              "notify": False, "max_payload_bytes": 4096, "max_in_flight": 4, "rate_limit": 5,
              "rate_period": timedelta(seconds=10)}
DEFAULTS = {"max_deliveries": None, "dead_letter_queue": None, "archive": False, "retention": None, "notify": True,
            "max_payload_bytes": None, "max_in_flight": None, "rate_limit": None, "rate_period": None}


def queue_row(conn: psycopg.Connection, queue: str = "jobs") -> dict[str, Any]:
    row = conn.execute("SELECT max_deliveries, dead_letter_queue, archive, retention, notify, max_payload_bytes, "
                       "max_in_flight, rate_limit, rate_period FROM dq_queues WHERE queue = %s", (queue,)).fetchone()
    return dict(zip(DEFAULTS, row, strict=True))


def test_queue_configure_keeps_what_it_does_not_name_and_clears_explicitly(dsn: str, conn) -> None:
    """The rule of dq_configure_queue: an option left out keeps its value, ``--clear
    SETTING`` (repeatable, with - or _) resets one to its default; a bad --clear changes nothing."""
    out = cli(dsn, "queue", "configure", "jobs", "--max-deliveries", "3", "--dead-letter-queue", "jobs.dlq",
              "--archive", "--retention", "2h", "--no-notify", "--max-payload-bytes", "4096", "--max-in-flight", "4",
              "--rate-limit", "5", "--rate-period", "10s")
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr
    expected = dict(CONFIGURED)
    assert queue_row(conn) == expected
    for column, options, value, _ in CONFIGURE_SETTINGS:  # each alone: every other setting kept
        out = cli(dsn, "queue", "configure", "jobs", *options)
        assert out.returncode == 0, (options, out.stderr)
        expected[column] = value
        assert queue_row(conn) == expected, options

    refused = [["--clear", "max-inflight"],                            # not a setting: the parser's error
               ["--max-in-flight", "3", "--clear", "max-in-flight"],   # given and cleared
               ["--clear", "dead-letter-queue"],                       # max_deliveries stays
               ["--clear", "rate-period"]]                             # rate_limit stays
    for options in refused:
        bad = cli(dsn, "queue", "configure", "jobs", *options)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, (options, bad.stderr)
        assert "clear" in bad.stderr and "Traceback" not in bad.stderr, (options, bad.stderr)
        assert queue_row(conn) == expected, options

    for column, _, _, clear in CONFIGURE_SETTINGS:
        if column in ("dead_letter_queue", "rate_period"):
            continue  # cleared with max_deliveries and rate_limit below
        if column == "max_deliveries":
            clear = [*clear, "--clear", "dead_letter_queue"]
        out = cli(dsn, "queue", "configure", "jobs", *clear)
        assert out.returncode == 0, (clear, out.stderr)
        expected[column] = DEFAULTS[column]
        if column == "max_deliveries":
            expected["dead_letter_queue"] = None
        if column == "rate_limit":
            expected["rate_period"] = None  # a rate limit cleared takes its period with it
        assert queue_row(conn) == expected, clear
    assert expected == DEFAULTS


def test_queue_dead_letters_and_redrive(dsn: str, conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', max_deliveries => 1, dead_letter_queue => 'jobs-dead')")
    assert cli(dsn, "offer", "--queue", "jobs", "--key", "doomed", "--payload", '{"x": 1}').returncode == 0
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('jobs', 1, interval '1 minute')").fetchone()
    assert conn.execute("SELECT dq_nack(%s, interval '0', 'boom')", (token,)).fetchone() == (True,)
    out = cli(dsn, "queue", "dead-letters", "jobs-dead")
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    dead = json.loads(line)
    assert (dead["key"], dead["dead_from"], dead["last_error"], dead["payload_type"]) == (
        "doomed", "jobs", "boom", "json")
    assert dead["payload_text"] == '{"x":1}' and "dead_at" in dead
    assert "1 dead letter(s) in 'jobs-dead', oldest first" in out.stderr
    out = cli(dsn, "queue", "redrive", "jobs-dead", "--max-count", "10")
    assert (out.returncode, out.stdout.strip()) == (0, "moved 1 dead letter(s) back to the queues they died in")
    assert stored(conn, "jobs", "doomed") == ("json", b'{"x":1}')
    out = cli(dsn, "queue", "dead-letters", "jobs-dead")
    assert out.returncode == 0 and out.stdout == "" and "0 dead letter(s)" in out.stderr


STATS_QUEUES = ("email-notifications", "billing.invoices.retry", "webhooks-outbound-partner-acme", "sms",
                "reports-nightly-export")


def test_stats_fits_80_columns_with_whole_queue_names(dsn: str, conn) -> None:
    """At 80 columns every queue name is printed whole (never ``emai…``), no line is wider than the
    terminal, the columns left out are named, and the title claims no estimate when every figure is
    exact; wide terminals keep every column."""
    for name in STATS_QUEUES:
        conn.execute("SELECT dq_offer(%s, 'k', 'x'::text)", (name,))
    out = cli(dsn, "stats", columns=80)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout
    assert "…" not in out.stdout, out.stdout
    body = [line.split("│")[1].strip() for line in lines if line.startswith("│")]
    assert sorted(body) == sorted(STATS_QUEUES), out.stdout
    assert "~" not in out.stdout and "estimated" not in out.stdout, out.stdout
    assert "ready" in lines[2] and "dead" in lines[2], out.stdout
    assert "left out to fit 80 columns:" in out.stdout, out.stdout
    wide = cli(dsn, "stats", columns=220)
    assert wide.returncode == 0 and "left out" not in wide.stdout and "…" not in wide.stdout, wide.stdout
    header = wide.stdout.splitlines()[2]
    for column in ("ready", "scheduled", "in flight", "redelivered", "dead", "held", "expired", "oldest ready",
                   "next due", "acked/min", "acked/h", "paused"):
        assert column in header, wide.stdout


def test_stats_title_says_estimated_only_when_a_figure_is(dsn: str, conn) -> None:
    """Past dq_queue_stats' exact limit (20,000 rows of a queue) the figures are estimated: the
    title says so then, and the estimated figures carry ``~``."""
    from pyqueue import DelayedQueue

    with DelayedQueue(dsn, "bulk") as q:
        q.offer_many([(f"k{i}", "x") for i in range(20_001)])
    conn.execute("ANALYZE dq_messages")
    out = cli(dsn, "stats", "--queue", "bulk", columns=80)
    assert out.returncode == 0, out.stderr
    assert "(~ estimated)" in out.stdout.splitlines()[0], out.stdout
    assert "~" in out.stdout.split("bulk", 1)[1], out.stdout
    out = cli(dsn, "stats", "--queue", "sms-none", columns=80)
    assert out.returncode == 0 and "estimated" not in out.stdout, out.stdout


def test_next_due_prints_when_the_next_message_is_visible(dsn: str, conn) -> None:
    empty = cli(dsn, "next-due", "--queue", "later")
    assert empty.returncode == 0, empty.stderr
    at = conn.execute("SELECT date_trunc('second', now()) + interval '1 hour'").fetchone()[0]
    conn.execute("SELECT dq_offer('later', 'k', 'x', %s)", (at,))
    out = cli(dsn, "next-due", "--queue", "later")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() != empty.stdout.strip()
    assert conn.execute("SELECT dq_next_due('later')").fetchone()[0] == at
    assert at.isoformat()[:19] in out.stdout.replace(" ", "T"), out.stdout


def test_cron_uninstall_removes_the_schedule_and_its_future_messages(dsn: str, conn) -> None:
    conn.execute("SELECT dq_cron_install('nightly', 'reports', 'daily at 03:00', 'x'::text)")
    assert conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'reports'").fetchone()[0] >= 1
    out = cli(dsn, "cron", "uninstall", "--name", "nightly")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert conn.execute("SELECT count(*) FROM dq_cron").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'reports'").fetchone()[0] == 0
    again = cli(dsn, "cron", "uninstall", "--name", "nightly")  # nothing left to remove: said, exit 1
    assert again.returncode == 1 and "no schedule named 'nightly'" in again.stderr, again.stderr


def test_stats_shows_blocked_only_when_some_queue_has_blocked_messages(dsn: str, conn) -> None:
    conn.execute("SELECT dq_offer('etl', 'extract', 'x'::text)")
    out = cli(dsn, "stats", columns=220)
    assert out.returncode == 0 and "blocked" not in out.stdout, out.stdout
    conn.execute("""SELECT dq_offer('etl', 'load', 'x'::text, after => '["extract"]')""")
    conn.execute("""SELECT dq_offer('etl', 'report', 'x'::text, after => '["load"]')""")
    out = cli(dsn, "stats", columns=220)
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[2].split("┃")
    row = next(line for line in out.stdout.splitlines() if line.startswith("│ etl")).split("│")
    cells = dict(zip((h.strip() for h in header), (c.strip() for c in row), strict=True))
    assert (cells["ready"], cells["scheduled"], cells["blocked"]) == ("1", "0", "2"), out.stdout
    narrow = cli(dsn, "stats", columns=80)
    assert "blocked" in narrow.stdout.splitlines()[2], narrow.stdout  # the last column left out to fit
    assert "blocked" not in narrow.stdout.split("left out", 1)[1], narrow.stdout
