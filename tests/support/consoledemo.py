"""A realistic data set for the web console's screenshots (``make console-screenshots``) and for the tests that
want a full database: several queues, messages in every state with JSON, text and bytes payloads, a dead-letter
queue holding dead letters from two source queues with different errors, an archiving queue with an hour of
acknowledgements (so the throughput chart has bars), a paused queue and cron schedules.

:func:`seed_demo` writes it through the public ``dq_*`` functions only. The hour of history is made by moving
the queue's clock back an hour (tests/support/clock.py: the DSN's user must own the install, as the test
databases' owner and the ``make up`` server's ``postgres`` do) and forward a minute at a time, offering,
polling and acknowledging at each step; the clock is restored before it returns. It first empties the demo's
own queues and schedules, so running it twice gives the same picture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
from clock import TestClock

#: The queue the screenshots show (archiving, every state) and its dead-letter queue.
DEMO_QUEUE = "emails"
DEMO_DEAD_LETTER_QUEUE = "dead-letters"
#: The message the screenshots show: JSON with headers, ready, a parent of DEMO_BLOCKED.
DEMO_MESSAGE = "order-10100"
#: The blocked message the screenshots show: it waits for DEMO_MESSAGE and another, and one waits for it.
DEMO_BLOCKED = "receipt-10100"
#: Every queue the demo writes, and its cron schedules.
DEMO_QUEUES = ("emails", "webhooks", "invoices", "reports", DEMO_DEAD_LETTER_QUEUE)
DEMO_SCHEDULES = ("nightly-report", "hourly-digest")
#: The errors of the dead letters (grouped by source queue and error on the dead-letter page).
SMTP_ERROR = "SMTP 550 5.1.1 <bob@example.org>: mailbox unavailable"
TIMEOUT_ERROR = "TimeoutError: SMTP server smtp.example.com did not answer within 30 s"
HTTP_ERROR = "HTTP 503 Service Unavailable from https://hooks.example.com/orders"


@dataclass
class Demo:
    """What :func:`seed_demo` made: keys by the state they are in, and counts."""

    keys: dict[str, list[str]] = field(default_factory=dict)
    acknowledged: int = 0
    dead: dict[tuple[str, str], int] = field(default_factory=dict)  # (source queue, error) -> dead letters


def _order(n: int) -> dict[str, object]:
    return {"order_id": 10_000 + n, "customer": {"id": 4_200 + n % 17, "email": f"customer{n}@example.org"},
            "template": "order-confirmation", "items": [{"sku": f"SKU-{n % 9:03d}", "quantity": 1 + n % 3}],
            "total": {"amount": f"{19.9 + n:.2f}", "currency": "EUR"}}


def _offer_json(conn: psycopg.Connection, queue: str, key: str, payload: object, *, delay: str = "0",
                headers: dict[str, str] | None = None, group: str | None = None, priority: int = 0,
                expires_in: str | None = None) -> None:
    conn.execute(
        "SELECT dq_offer(queue => %s, key => %s, payload => %s::jsonb, scheduled_at => dq_now() + %s::interval,"
        " priority => %s, message_group => %s,"
        " expires_at => dq_now() + %s::interval, headers => %s::jsonb)",
        (queue, key, json.dumps(payload), delay, priority, group, expires_in,
         None if headers is None else json.dumps(headers)))


def _poll(conn: psycopg.Connection, queue: str, n: int, lock_timeout: str = "5 minutes") -> list[str]:
    """Poll ``n`` messages; their lock tokens."""
    rows = conn.execute("SELECT lock_token::text FROM dq_poll_many(%s, %s, %s::interval)",
                        (queue, n, lock_timeout)).fetchall()
    return [r[0] for r in rows]


def _fail_until_dead(conn: psycopg.Connection, queue: str, n: int, error: str, max_deliveries: int) -> int:
    """Deliver the ``n`` ready messages of ``queue`` and fail each ``max_deliveries`` times with ``error``, so
    they die (the queue holds no other ready message). How many died."""
    died = 0
    for _ in range(max_deliveries):
        for token in _poll(conn, queue, n):
            row = conn.execute("SELECT outcome FROM dq_nack_outcome(%s::uuid, '0', %s)", (token, error)).fetchone()
            died += row is not None and row[0] == "dead_lettered"
    return died


def _reset(conn: psycopg.Connection) -> None:
    """Empty the demo's queues (messages, dead letters, archive) and remove its schedules."""
    for name in DEMO_SCHEDULES:
        conn.execute("SELECT dq_cron_uninstall(%s)", (name,))
    for queue in DEMO_QUEUES:
        conn.execute("SELECT dq_resume_queue(%s)", (queue,))
        # Limits left by an earlier run would throttle the history.
        conn.execute("SELECT dq_configure_queue(%s, clear => ARRAY['max_in_flight', 'rate_limit'])", (queue,))
        conn.execute("SELECT dq_purge(%s, confirm => true)", (queue,))
    conn.execute("DELETE FROM dq_archive WHERE queue = ANY(%s)", (list(DEMO_QUEUES),))
    conn.execute("DELETE FROM dq_audit_log")  # the screenshot of the audit log shows this run's actions only


def seed_demo(dsn: str) -> Demo:
    """Write the demo data set into the install at ``dsn`` (see the module's docstring) and return what it
    made. Takes about a second."""
    demo = Demo()
    with psycopg.connect(dsn, autocommit=True) as conn:
        _reset(conn)
        conn.execute("SELECT dq_configure_queue('emails', max_deliveries => 5, dead_letter_queue => %s,"
                     " archive => true, retention => '7 days')", (DEMO_DEAD_LETTER_QUEUE,))
        conn.execute("SELECT dq_configure_queue('webhooks', max_deliveries => 3, dead_letter_queue => %s)",
                     (DEMO_DEAD_LETTER_QUEUE,))
        _history(conn, dsn, demo)
        # The limits come after the history: a rate limit would have throttled it.
        conn.execute("SELECT dq_configure_queue('emails', max_in_flight => 20, rate_limit => 50,"
                     " rate_period => '1 second')")
        _present(conn, demo)
    return demo


def _history(conn: psycopg.Connection, dsn: str, demo: Demo) -> None:
    """An hour of traffic on ``emails`` (acknowledgements every minute, dead letters now and then) and the
    dead letters of ``webhooks``, with the queue's clock moved back."""
    clock = TestClock(dsn)
    try:
        clock.advance(timedelta(minutes=-61))
        for minute in range(60):
            clock.advance(timedelta(minutes=1))
            n = 4 + (minute * 7) % 13 + (10 if 20 <= minute < 30 else 0)
            for i in range(n):
                _offer_json(conn, "emails", f"order-{minute:02d}-{i:02d}", _order(minute * 100 + i))
            for token in _poll(conn, "emails", n):
                conn.execute("SELECT dq_ack(%s::uuid)", (token,))
            demo.acknowledged += n
            if minute in (12, 41, 55):
                bad = 3 if minute != 41 else 2
                error = TIMEOUT_ERROR if minute == 41 else SMTP_ERROR
                for i in range(bad):
                    _offer_json(conn, "emails", f"welcome-{minute:02d}-{i}",
                                {"template": "welcome", "to": f"bob{i}@example.org"})
                died = _fail_until_dead(conn, "emails", bad, error, 5)
                demo.dead[("emails", error)] = demo.dead.get(("emails", error), 0) + died
            if minute in (30, 50):
                for i in range(3):
                    _offer_json(conn, "webhooks", f"order-created-{minute}-{i}",
                                {"event": "order.created", "order_id": 20_000 + minute * 10 + i},
                                headers={"content-type": "application/json"})
                died = _fail_until_dead(conn, "webhooks", 3, HTTP_ERROR, 3)
                demo.dead[("webhooks", HTTP_ERROR)] = demo.dead.get(("webhooks", HTTP_ERROR), 0) + died
            if minute == 59:  # expired by now, not yet removed: no poll of webhooks comes after it
                _offer_json(conn, "webhooks", "flash-sale-started", {"event": "sale.started"},
                            expires_in="90 seconds")
                demo.keys["expired"] = ["flash-sale-started"]
    finally:
        clock.uninstall()
        clock.close()


def _present(conn: psycopg.Connection, demo: Demo) -> None:
    """Messages in every state now, on each queue. The order matters: each poll takes the oldest due
    message, so whatever a poll should take is the only one ready when it runs."""
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
               "content-language": "en", "x-request-id": "req-7f3a9c"}
    # In flight: delivered, locked for 10 minutes.
    for i in range(3):
        _offer_json(conn, "emails", f"order-live-{i}", _order(9_000 + i), headers=headers)
    _poll(conn, "emails", 3, "10 minutes")
    demo.keys["in_flight"] = [f"order-live-{i}" for i in range(3)]
    # Held: the second message of a FIFO group waits behind its head, which is in flight.
    _offer_json(conn, "emails", "customer-42-step-1", {"template": "onboarding", "step": 1}, group="customer-42")
    _offer_json(conn, "emails", "customer-42-step-2", {"template": "onboarding", "step": 2}, group="customer-42")
    _poll(conn, "emails", 1, "10 minutes")
    demo.keys["held"] = ["customer-42-step-2"]
    # Redelivered: failed twice, ready again.
    _offer_json(conn, "emails", "password-reset-77", {"template": "password-reset", "user_id": 77},
                headers=headers)
    for _ in range(2):
        for token in _poll(conn, "emails", 1):
            conn.execute("SELECT dq_nack(%s::uuid, '0', 'SMTP 451 4.7.1 try again later')", (token,))
    demo.keys["redelivered"] = ["password-reset-77"]
    # Ready: JSON (with headers and priorities), text and bytes payloads.
    for i in range(8):
        _offer_json(conn, "emails", f"order-{10_100 + i}", _order(10_100 + i), headers=headers,
                    priority=5 if i < 2 else 0)
    conn.execute("SELECT dq_offer('emails', 'plain-text-note', %s::text)",
                 ("Hello Alice,\nyour parcel left our warehouse today.\n-- The shop",))
    pdf = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" + bytes(range(64))
    conn.execute("SELECT dq_offer('emails', 'invoice-pdf-2291', %s::bytea, payload_type => 'application/pdf')",
                 (pdf,))
    _offer_json(conn, "emails", "newsletter-2026-05", {"template": "newsletter", "sections": [
        {"title": f"Section {i}", "body": "Lorem ipsum dolor sit amet. " * 40} for i in range(80)]})
    demo.keys["ready"] = [f"order-{10_100 + i}" for i in range(8)] + [
        "plain-text-note", "invoice-pdf-2291", "newsletter-2026-05"]
    # Scheduled: due later.
    for key, delay in (("reminder-cart-311", "10 minutes"), ("reminder-cart-312", "2 hours"),
                       ("renewal-notice-88", "3 days")):
        _offer_json(conn, "emails", key, {"template": key.rsplit("-", 1)[0]}, delay=delay)
    demo.keys["scheduled"] = ["reminder-cart-311", "reminder-cart-312", "renewal-notice-88"]
    # Blocked: a receipt after the order and its invoice, a review request a week after the receipt.
    for key, payload, delay, after in (
            ("receipt-10100", {"template": "receipt", "order_id": 10100}, "0", ["order-10100", "invoice-pdf-2291"]),
            ("review-request-10100", {"template": "review", "order_id": 10100}, "7 days", ["receipt-10100"])):
        conn.execute("SELECT dq_offer('emails', %s, %s::jsonb, dq_now() + %s::interval, after => %s::jsonb)",
                     (key, json.dumps(payload), delay, json.dumps(after)))
    demo.keys["blocked"] = ["receipt-10100", "review-request-10100"]
    # webhooks: a few ready and scheduled.
    for i in range(5):
        _offer_json(conn, "webhooks", f"order-paid-{30_000 + i}", {"event": "order.paid", "order_id": 30_000 + i},
                    delay="0" if i < 3 else "15 minutes", headers={"content-type": "application/json"})
    # invoices: paused, with a backlog.
    for i in range(12):
        conn.execute("SELECT dq_offer('invoices', %s, %s::text, payload_type => 'text/csv')",
                     (f"invoice-{2026_0500 + i}", f"invoice,{2026_0500 + i},customer,{4200 + i},total,{99 + i}.00\n"))
    conn.execute("SELECT dq_pause_queue('invoices')")
    # reports: cron schedules, one paused.
    conn.execute("SELECT dq_cron_install('nightly-report', 'reports', '0 2 * * *', %s::jsonb,"
                 " timezone => 'Europe/Paris')", (json.dumps({"report": "sales", "period": "day"}),))
    conn.execute("SELECT dq_cron_install('hourly-digest', 'reports', '0 * * * *', 'digest', timezone => 'UTC')")
    conn.execute("SELECT dq_cron_pause('hourly-digest')")
