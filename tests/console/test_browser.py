"""The web console as a person uses it: a real ``pyqueue console`` process on this test's database and a real
Chromium (tests/support/consolebrowser.py). Each test clicks through the pages, performs the actions through
the forms, and checks the database with SQL afterwards (never the page alone), the audit log, and that the
browser saw no console error, page error or failed request."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from consolebrowser import (
    SCREENSHOTS,
    assert_no_browser_errors,
    browser_page,
    browser_problems,
    chromium,
    console_command,
    console_environment,
    free_port,
    running_console,
    take_screenshots,
)
from consoledemo import DEMO_DEAD_LETTER_QUEUE, DEMO_QUEUE, HTTP_ERROR, SMTP_ERROR, seed_demo
from playwright.sync_api import Browser, Locator, Page, expect

pytestmark = pytest.mark.browser

NAV = {"Overview": "/", "Dead letters": "/dead-letters", "Schedules": "/schedules", "Health": "/health",
       "Audit log": "/audit"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def queue_url(queue: str) -> str:
    return f"/queues/{quote(queue, safe='')}"


def css(value: str) -> str:
    """``value`` inside a double-quoted CSS attribute selector."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def submit(page: Page, form: Locator | str, *, fields: dict[str, str] | None = None) -> tuple[int, str]:
    """Fill ``fields`` of ``form`` (inputs or selects, by name), press its button, and wait for the page the
    console answers with. The POST's status and the text of the page's ``p.notice`` or ``p.error``; fails when
    the page shows neither."""
    if isinstance(form, str):
        form = page.locator(form)
    expect(form).to_have_count(1)
    for name, value in (fields or {}).items():
        field = form.locator(f'[name="{name}"]')
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        form.locator("button, input[type=submit]").first.click()
    page.wait_for_load_state("load")
    message = page.locator("p.notice, p.error").first
    expect(message).to_be_visible()
    return posted.value.status, message.inner_text()


def notice(page: Page, form: Locator | str, **fields: str) -> str:
    """:func:`submit`, which must succeed: the console answers 303 and shows ``p.notice``."""
    status, text = submit(page, form, fields=fields)
    assert status == 303, text
    expect(page.locator("p.error")).to_have_count(0)
    expect(page.locator("p.notice")).to_be_visible()
    return text


def refused(page: Page, form: Locator | str, **fields: str) -> str:
    """:func:`submit`, which the console must refuse with ``p.error``."""
    _, text = submit(page, form, fields=fields)
    expect(page.locator("p.error")).to_be_visible()
    return page.locator("p.error").inner_text()


def audit_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT action, queue, target, outcome FROM dq_audit_log ORDER BY id DESC").fetchall()


def check_audit_page(page: Page, conn: psycopg.Connection[Any], at_least: int) -> list[tuple[Any, ...]]:
    """Follow the nav link to the audit log: it lists every row of dq_audit_log, newest first, each with its
    action and queue. The rows, newest first."""
    page.locator("nav").get_by_role("link", name="Audit log", exact=True).click()
    page.wait_for_url(re.compile(r"/audit$"))
    rows = audit_rows(conn)
    assert len(rows) >= at_least, rows
    shown = page.locator("#audit tbody tr")
    expect(shown).to_have_count(len(rows))
    for i, (action, queue, _target, _outcome) in enumerate(rows):
        text = shown.nth(i).inner_text()
        assert action in text, (i, action, text)
        if queue is not None:
            assert queue in text, (i, queue, text)
    return rows


def offer(conn: psycopg.Connection[Any], queue: str, key: str, payload: object = None, *,
          delay: str = "0") -> None:
    conn.execute("SELECT dq_offer(%s, %s, %s::jsonb, dq_now() + %s::interval)",
                 (queue, key, json.dumps(payload if payload is not None else {"key": key}), delay))


def kill(conn: psycopg.Connection[Any], queue: str, error: str, count: int) -> None:
    """Deliver ``count`` ready messages of ``queue`` (max_deliveries 1) and fail them with ``error``."""
    for (token,) in conn.execute("SELECT lock_token FROM dq_poll_many(%s, %s)", (queue, count)).fetchall():
        conn.execute("SELECT dq_nack(%s, '0', %s)", (token, error))


# --- every page, the nav links, the headers ---------------------------------------------------------------


def test_every_page_loads_and_the_nav_links_lead_to_each(dsn: str, browser: Browser) -> None:
    demo = seed_demo(dsn)
    with running_console(dsn) as url, browser_page(browser, base_url=url) as page:
        response = page.goto("/")
        assert response is not None and response.status == 200
        headers = response.headers
        assert headers["content-security-policy"] == CSP
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "same-origin"
        # The overview lists every queue; dead-letter queues are marked; the chart is there.
        for queue in ("emails", "webhooks", "invoices", "reports", DEMO_DEAD_LETTER_QUEUE):
            expect(page.locator(f'#queues tr[data-queue="{queue}"]')).to_have_count(1)
        dlq_row = page.locator(f'#queues tr[data-queue="{DEMO_DEAD_LETTER_QUEUE}"]')
        expect(dlq_row).to_have_attribute("data-dlq", "true")
        expect(dlq_row).to_contain_text("dead-letter queue")
        expect(page.locator("svg#throughput")).to_have_count(1)
        expect(page.locator("#live-status")).to_have_text("live")
        # Each nav link, from each page.
        for start in NAV.values():
            page.goto(start)
            for label, path in NAV.items():
                page.locator("nav").get_by_role("link", name=label, exact=True).click()
                page.wait_for_url(re.compile(re.escape(path) + "$"))
                page.goto(start)
        # The queue page through its link, a message through the table, back.
        page.goto("/")
        page.locator(f'#queues tr[data-queue="{DEMO_QUEUE}"] a').first.click()
        page.wait_for_url(re.compile(re.escape(queue_url(DEMO_QUEUE)) + "$"))
        expect(page.locator("dl#settings")).to_contain_text(DEMO_DEAD_LETTER_QUEUE)
        key = demo.keys["redelivered"][0]
        page.locator(f'#messages tr[data-key="{key}"] a').first.click()
        page.wait_for_url(re.compile(r"/messages/\d+$"))
        expect(page.locator("dl#message")).to_contain_text(key)
        expect(page.locator("pre#payload")).to_contain_text('"template": "password-reset"')
        expect(page.locator("table#headers")).to_contain_text("traceparent")
        # Dead letters: the dead-letter queue, its groups by source queue and error.
        page.goto("/dead-letters")
        page.locator(f'#dead-letter-queues tr[data-queue="{DEMO_DEAD_LETTER_QUEUE}"] a').first.click()
        page.wait_for_url(re.compile(r"/dead-letters/.+$"))
        groups = page.locator("#dead-letter-groups")
        for (source, error), count in demo.dead.items():
            row = groups.locator("tr", has_text=error).filter(has_text=source)
            expect(row).to_have_count(1)
            expect(row).to_contain_text(str(count))
        expect(page.locator("#dead-letters tr[data-key]")).to_have_count(sum(demo.dead.values()))
        # Schedules, health.
        page.goto("/schedules")
        expect(page.locator('#schedules tr[data-schedule="nightly-report"]')).to_contain_text("02:00")
        expect(page.locator('#schedules tr[data-schedule="hourly-digest"]')).to_contain_text("paused")
        page.goto("/health")
        assert page.locator("#health tr[data-component]").count() > 0
        # A read-only console shows no action form anywhere.
        for path in (*NAV.values(), queue_url(DEMO_QUEUE), f"/dead-letters/{DEMO_DEAD_LETTER_QUEUE}"):
            page.goto(path)
            expect(page.locator('form[method="post"], form[method="POST"]')).to_have_count(0)
        # The metrics and the static files.
        metrics = page.request.get("/metrics")
        assert metrics.status == 200
        assert 'pgdelayq_queue_ready_messages{queue="emails"}' in metrics.text()
        for name in ("htmx.min.js", "console.js", "console.css"):
            assert page.request.get(f"/static/{name}").status == 200
        assert_no_browser_errors(page)


def test_the_message_browser_filters_by_state_and_prefix_and_pages_by_key(
        dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    keys = [f"batch-{i:03d}" for i in range(120)]
    conn.execute("SELECT dq_offer('bulk', k, 'x'::text) FROM unnest(%s::text[]) AS k", (keys,))
    for key in ("later-a", "later-b"):
        offer(conn, "bulk", key, delay="1 hour")
    with running_console(dsn) as url, browser_page(browser, base_url=url) as page:
        page.goto(queue_url("bulk"))
        seen: list[str] = []
        while True:
            seen += page.locator("#messages tr[data-key]").evaluate_all("rs => rs.map(r => r.dataset.key)")
            following = page.locator("a#next-page")
            if following.count() == 0:
                break
            following.click()
            page.wait_for_load_state("load")
        assert seen == sorted(keys + ["later-a", "later-b"])  # every message once, in key order
        page.goto(queue_url("bulk"))
        submit_filter(page, state="scheduled")
        assert row_keys(page) == ["later-a", "later-b"]
        submit_filter(page, state="", prefix="batch-11")
        assert row_keys(page) == [f"batch-11{i}" for i in range(10)]
        assert_no_browser_errors(page)


def submit_filter(page: Page, **fields: str) -> None:
    form = page.locator("form#browse")
    for name, value in fields.items():
        field = form.locator(f'[name="{name}"]')
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    form.locator("button, input[type=submit]").first.click()
    page.wait_for_load_state("load")


def row_keys(page: Page) -> list[str]:
    return page.locator("#messages tr[data-key]").evaluate_all(  # type: ignore[no-any-return]
        "rs => rs.map(r => r.dataset.key)")


# --- actions -------------------------------------------------------------------------------------------------


def test_queue_actions_pause_resume_limits_purge(dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    conn.execute("SELECT dq_configure_queue('orders', max_deliveries => 3, dead_letter_queue => 'orders-dead')")
    for i in range(3):
        offer(conn, "orders", f"order-{i}")

    def config() -> tuple[Any, ...]:
        row = conn.execute("SELECT paused, max_in_flight, rate_limit, rate_period, max_deliveries FROM dq_queues"
                           " WHERE queue = 'orders'").fetchone()
        assert row is not None
        return tuple(row)

    with running_console(dsn, allow_actions=True) as url, browser_page(browser, base_url=url) as page:
        page.goto("/")
        page.locator('#queues tr[data-queue="orders"] a').first.click()
        page.wait_for_url(re.compile(re.escape(queue_url("orders")) + "$"))

        notice(page, "#pause-form")
        assert config()[0] is True
        expect(page.locator("#pause-form")).to_have_count(0)
        notice(page, "#resume-form")
        assert config()[0] is False

        notice(page, "#limits-form", max_in_flight="7", rate_limit="30", rate_period="1 minute",
               max_deliveries="4")
        assert config() == (False, 7, 30, timedelta(minutes=1), 4)
        # A limit the database refuses: the error with its SQLSTATE, nothing changed.
        error = refused(page, "#limits-form", max_in_flight="-1", rate_limit="30", rate_period="1 minute",
                        max_deliveries="4")
        assert "22023" in error and "max_in_flight" in error
        assert config() == (False, 7, 30, timedelta(minutes=1), 4)

        # Purge: a wrong confirmation is refused and purges nothing; the queue's name purges.
        refused(page, "#purge-form", confirm="order")
        assert conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'orders'").fetchone() == (3,)
        notice(page, "#purge-form", confirm="orders")
        assert conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'orders'").fetchone() == (0,)

        problems = browser_problems(page)
        rows = check_audit_page(page, conn, at_least=4)
        assert all(r[3] for r in rows), rows  # every row says how it ended
        assert {r[1] for r in rows} == {"orders"}
        assert not problems, problems


def test_message_actions_due_now_and_cancel(dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    offer(conn, "orders", "later-1", delay="1 hour")
    offer(conn, "orders", "later-2", delay="1 hour")
    with running_console(dsn, allow_actions=True) as url, browser_page(browser, base_url=url) as page:
        page.goto(queue_url("orders"))
        page.locator('#messages tr[data-key="later-1"] a').first.click()
        page.wait_for_url(re.compile(r"/messages/\d+$"))
        notice(page, "#due-now-form")
        due = conn.execute("SELECT scheduled_at <= now() FROM dq_messages WHERE key = 'later-1'").fetchone()
        assert due == (True,)
        # Now due: no "due now" for it any more.
        page.goto(page.url.split("?")[0])
        expect(page.locator("#due-now-form")).to_have_count(0)

        page.goto(queue_url("orders"))
        page.locator('#messages tr[data-key="later-2"] a').first.click()
        page.wait_for_url(re.compile(r"/messages/\d+$"))
        notice(page, "#cancel-form")
        assert conn.execute("SELECT key FROM dq_messages ORDER BY key").fetchall() == [("later-1",)]
        browser_problems(page).clear()
        rows = check_audit_page(page, conn, at_least=2)
        assert {r[2] for r in rows} >= {"later-1", "later-2"}
        assert_no_browser_errors(page)


def test_dead_letter_actions_redrive_one_selected_and_all_matching(
        dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    for source in ("emails", "webhooks"):
        conn.execute("SELECT dq_configure_queue(%s, max_deliveries => 1, dead_letter_queue => 'dead')", (source,))
    for i in range(5):
        offer(conn, "emails", f"smtp-{i}")
    kill(conn, "emails", SMTP_ERROR, 5)
    for i in range(2):
        offer(conn, "emails", f"timeout-{i}")
    kill(conn, "emails", "timeout", 2)
    for i in range(3):
        offer(conn, "webhooks", f"hook-{i}")
    kill(conn, "webhooks", HTTP_ERROR, 3)

    def where(key: str) -> tuple[str, str | None]:
        row = conn.execute("SELECT queue, dead_from FROM dq_messages WHERE key = %s", (key,)).fetchone()
        assert row is not None
        return row[0], row[1]

    with running_console(dsn, allow_actions=True) as url, browser_page(browser, base_url=url) as page:
        page.goto("/dead-letters")
        page.locator('#dead-letter-queues tr[data-queue="dead"] a').first.click()
        page.wait_for_url(re.compile(r"/dead-letters/dead$"))
        expect(page.locator("#dead-letters tr[data-key]")).to_have_count(10)

        # One.
        with page.expect_response(lambda r: r.request.method == "POST") as posted:
            page.locator('#dead-letters tr[data-key="hook-0"] button.redrive-one').click()
        assert posted.value.status == 303
        page.wait_for_load_state("load")
        expect(page.locator("p.notice")).to_be_visible()
        assert where("hook-0") == ("webhooks", None)
        assert where("hook-1") == ("dead", "webhooks")

        # The selected.
        for key in ("smtp-0", "smtp-1"):
            page.locator(f'#dead-letters tr[data-key="{key}"] input[type=checkbox][name=id]').check()
        notice(page, "#redrive-selected-form")
        assert where("smtp-0") == ("emails", None) and where("smtp-1") == ("emails", None)
        assert where("smtp-2") == ("dead", "emails")

        # All matching a filter, after its count is confirmed: the group of SMTP letters from emails (3 left).
        group = page.locator("#dead-letter-groups tr", has_text=SMTP_ERROR).filter(has_text="emails")
        expect(group).to_contain_text("3")
        group.locator("a.filter-group").click()
        page.wait_for_load_state("load")
        form = page.locator("#redrive-matching-form")
        expect(form.locator('[name="dead_from"]')).to_have_value("emails")
        expect(form.locator('[name="last_error"]')).to_have_value(SMTP_ERROR)
        expect(page.locator("#matching-count")).to_have_text("3")
        refused(page, form, confirm_count="2")
        assert conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'dead'").fetchone() == (7,)
        notice(page, "#redrive-matching-form", confirm_count="3")
        remaining = conn.execute("SELECT key FROM dq_messages WHERE queue = 'dead' ORDER BY key").fetchall()
        assert remaining == [("hook-1",), ("hook-2",), ("timeout-0",), ("timeout-1",)]
        assert conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'emails'").fetchone() == (5,)

        browser_problems(page).clear()
        check_audit_page(page, conn, at_least=3)  # the three redrives (the refused one is not an action)
        assert_no_browser_errors(page)


def test_schedule_actions_pause_and_resume(dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    conn.execute("SELECT dq_cron_install('nightly', 'reports', '0 2 * * *', 'x', timezone => 'Europe/Paris')")

    def paused() -> bool:
        row = conn.execute("SELECT paused FROM dq_cron_list() WHERE name = 'nightly'").fetchone()
        assert row is not None
        return bool(row[0])

    with running_console(dsn, allow_actions=True) as url, browser_page(browser, base_url=url) as page:
        page.goto("/")
        page.locator("nav").get_by_role("link", name="Schedules", exact=True).click()
        row = page.locator('#schedules tr[data-schedule="nightly"]')
        expect(row).to_contain_text("02:00")  # next occurrences in the schedule's own time zone
        notice(page, row.locator("form.pause-schedule"))
        assert paused()
        notice(page, page.locator('#schedules tr[data-schedule="nightly"] form.resume-schedule'))
        assert not paused()
        check_audit_page(page, conn, at_least=2)
        assert_no_browser_errors(page)


# --- read-only, CSRF, cross-site ---------------------------------------------------------------------------


def test_a_read_only_console_shows_no_action_and_refuses_posts(
        dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    offer(conn, "orders", "order-1")
    # The forms and their tokens, as a console with actions renders them.
    with running_console(dsn, allow_actions=True) as url, browser_page(browser, base_url=url) as page:
        page.goto(queue_url("orders"))
        action = page.locator("#pause-form").get_attribute("action") or queue_url("orders")
        fields: dict[str, str] = page.locator("#pause-form").evaluate("f => Object.fromEntries(new FormData(f))")
        token = fields["csrf_token"]
        # Same origin with its token: accepted (what makes the refusals below meaningful) ...
        ok = page.request.post(action, form=fields, headers={"Sec-Fetch-Site": "same-origin"}, max_redirects=0)
        assert ok.status == 303
        assert conn.execute("SELECT (dq_queue_config('orders')).paused").fetchone() == (True,)
        conn.execute("SELECT dq_resume_queue('orders')")
        # ... but not from another site, nor without the token or with another.
        without = {k: v for k, v in fields.items() if k != "csrf_token"}
        for headers, form in (({"Sec-Fetch-Site": "cross-site"}, fields),
                              ({"Sec-Fetch-Site": "same-site"}, fields),
                              ({}, without),
                              ({}, {**without, "csrf_token": token[::-1]})):
            answer = page.request.post(action, form=form, headers=headers, max_redirects=0)
            assert answer.status == 403, (headers, form, answer.status)
        assert conn.execute("SELECT (dq_queue_config('orders')).paused").fetchone() == (False,)
    with running_console(dsn) as url, browser_page(browser, base_url=url) as page:
        for path in (*NAV.values(), queue_url("orders")):
            page.goto(path)
            expect(page.locator("form[method=post], form[method=POST], button.redrive-one")).to_have_count(0)
        assert_no_browser_errors(page)
        for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "cross-site"}):
            answer = page.request.post(action, form=fields, headers=headers, max_redirects=0)
            assert answer.status == 403, (headers, answer.status)
        assert conn.execute("SELECT (dq_queue_config('orders')).paused").fetchone() == (False,)


# --- live updates ------------------------------------------------------------------------------------------


def test_the_overview_updates_live_without_a_reload_and_not_while_paused(
        dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    offer(conn, "orders", "order-1")
    with running_console(dsn) as url, browser_page(browser, base_url=url) as page:
        page.goto("/")
        row = page.locator('#queues tr[data-queue="orders"]')
        expect(row).to_have_count(1)
        page.evaluate("window.notReloaded = true")
        before = row.inner_text()
        for i in range(2, 5):
            offer(conn, "orders", f"order-{i}")
        expect(row).not_to_have_text(before, timeout=15_000)
        assert page.evaluate("window.notReloaded") is True
        assert "4" in row.inner_text()

        page.locator("button#live-toggle").click()
        expect(page.locator("#live-status")).to_have_text("paused")
        expect(page.locator("button#live-toggle")).to_have_text("Resume live updates")
        paused_text = row.inner_text()
        for i in range(5, 9):
            offer(conn, "orders", f"order-{i}")
        time.sleep(4)  # longer than the console's debounce: an update would have arrived
        assert row.inner_text() == paused_text

        page.locator("button#live-toggle").click()
        expect(page.locator("#live-status")).to_have_text("live")
        offer(conn, "orders", "order-9")
        expect(row).not_to_have_text(paused_text, timeout=15_000)
        assert page.evaluate("window.notReloaded") is True
        assert_no_browser_errors(page)


# --- security ----------------------------------------------------------------------------------------------


def test_another_interface_without_credentials_is_refused(dsn: str) -> None:
    done = subprocess.run(console_command(dsn, port=free_port(), host="0.0.0.0"), env=console_environment(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "PGDELAYQ_CONSOLE_TOKEN" in done.stderr, done.stderr


def status_of(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_a_token_is_required_on_another_interface(dsn: str, browser: Browser) -> None:
    token = "s3cret-token-for-the-test"
    with running_console(dsn, host="0.0.0.0", env={"PGDELAYQ_CONSOLE_TOKEN": token}) as url:
        assert status_of(url + "/", {}) == 401
        assert status_of(url + "/", {"Authorization": "Bearer wrong"}) == 401
        assert status_of(url + "/", {"Authorization": f"Bearer {token}x"}) == 401
        assert status_of(url + "/metrics", {}) == 401
        assert status_of(url + "/", {"Authorization": f"Bearer {token}"}) == 200
        with browser_page(browser, base_url=url, extra_http_headers={"Authorization": f"Bearer {token}"}) as page:
            page.goto("/")
            expect(page.locator("#queues")).to_have_count(1)
            page.wait_for_timeout(500)  # the event stream connects with the same header
            assert_no_browser_errors(page)


def test_basic_credentials_are_required_on_another_interface(dsn: str, browser: Browser) -> None:
    env = {"PGDELAYQ_CONSOLE_USER": "oncall", "PGDELAYQ_CONSOLE_PASSWORD": "correct horse"}

    def basic(user: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    with running_console(dsn, host="0.0.0.0", env=env) as url:
        assert status_of(url + "/", {}) == 401
        assert status_of(url + "/", basic("oncall", "wrong")) == 401
        assert status_of(url + "/", basic("someone", "correct horse")) == 401
        assert status_of(url + "/", basic("oncall", "correct horse")) == 200
        with browser_page(browser, base_url=url,
                          http_credentials={"username": "oncall", "password": "correct horse"}) as page:
            page.goto("/")
            expect(page.locator("#queues")).to_have_count(1)
            # Playwright answers the first 401 challenge of each origin; that response is expected.
            problems = [p for p in browser_problems(page) if not p.startswith("status 401")]
            assert not problems, problems


HOSTILE_QUEUE = "<script>alert(1)</script>"
HOSTILE_DLQ = "<b>dead</b><img src=x onerror=alert(9)>"
HOSTILE_KEY = "<img src=x onerror=alert(2)>"
HOSTILE_DEAD_KEY = '"><script>alert(8)</script>'
HOSTILE_PAYLOAD = {"html": "<script>alert(3)</script>", "link": "<a href='javascript:alert(4)'>x</a>"}
HOSTILE_TEXT = "<b>bold</b><script>alert(5)</script>"
HOSTILE_HEADER = "<svg onload=alert(6)>"
HOSTILE_ERROR = "<iframe src=javascript:alert(7)></iframe>"


def test_html_and_script_from_the_database_render_as_text(
        dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    conn.execute("SELECT dq_configure_queue(%s, max_deliveries => 2, dead_letter_queue => %s)",
                 (HOSTILE_QUEUE, HOSTILE_DLQ))
    conn.execute("SELECT dq_offer(%s, %s, %s::jsonb, headers => %s::jsonb)",
                 (HOSTILE_QUEUE, HOSTILE_KEY, json.dumps(HOSTILE_PAYLOAD), json.dumps({"x-html": HOSTILE_HEADER})))
    token = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 1)", (HOSTILE_QUEUE,)).fetchone()
    assert token is not None
    conn.execute("SELECT dq_nack(%s, '0', %s)", (token[0], HOSTILE_ERROR))
    conn.execute("SELECT dq_offer(%s, %s, %s::text)", (HOSTILE_QUEUE, HOSTILE_DEAD_KEY, HOSTILE_TEXT))
    for _ in range(2):
        for (t,) in conn.execute("SELECT lock_token FROM dq_poll_many(%s, 5)", (HOSTILE_QUEUE,)).fetchall():
            conn.execute("SELECT dq_nack(%s, '0', %s)", (t, HOSTILE_ERROR))
    dead = conn.execute("SELECT id FROM dq_messages WHERE queue = %s", (HOSTILE_DLQ,)).fetchall()
    assert len(dead) == 2  # both died after two deliveries

    with running_console(dsn, allow_actions=True) as url, browser_page(browser, base_url=url) as page:
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        body = page.locator("body")

        def inert() -> None:
            assert not dialogs, dialogs
            assert page.locator("img[src=x], iframe, svg[onload], b:text('dead'), b:text('bold')").count() == 0
            scripts = page.locator("script").evaluate_all("ss => ss.map(s => s.src + '|' + s.textContent)")
            assert all("alert" not in s for s in scripts), scripts

        page.goto("/")
        expect(page.locator("#queues")).to_contain_text(HOSTILE_QUEUE)
        expect(page.locator("#queues")).to_contain_text(HOSTILE_DLQ)
        inert()
        page.locator("#queues tr[data-queue] a", has_text=HOSTILE_QUEUE).first.click()
        page.wait_for_load_state("load")
        expect(body).to_contain_text(HOSTILE_QUEUE)
        expect(body).to_contain_text(HOSTILE_DLQ)
        inert()
        page.goto("/dead-letters")
        expect(body).to_contain_text(HOSTILE_DLQ)
        inert()
        page.locator("#dead-letter-queues tr[data-queue] a").first.click()
        page.wait_for_load_state("load")
        for text in (HOSTILE_QUEUE, HOSTILE_KEY, HOSTILE_DEAD_KEY, HOSTILE_ERROR):
            expect(body).to_contain_text(text)
        inert()
        for key in (HOSTILE_KEY, HOSTILE_DEAD_KEY):
            page.locator(f'#dead-letters tr[data-key="{css(key)}"] a').first.click()
            page.wait_for_load_state("load")
            expect(page.locator("dl#message")).to_contain_text(key)
            expect(body).to_contain_text(HOSTILE_ERROR)
            inert()
            page.go_back()
        page.locator(f'#dead-letters tr[data-key="{css(HOSTILE_KEY)}"] a').first.click()
        page.wait_for_load_state("load")
        expect(page.locator("pre#payload")).to_contain_text(HOSTILE_PAYLOAD["html"])
        expect(page.locator("pre#payload")).to_contain_text(HOSTILE_PAYLOAD["link"])
        expect(page.locator("table#headers")).to_contain_text(HOSTILE_HEADER)
        page.go_back()
        page.locator(f'#dead-letters tr[data-key="{css(HOSTILE_DEAD_KEY)}"] a').first.click()
        page.wait_for_load_state("load")
        expect(page.locator("pre#payload")).to_contain_text(HOSTILE_TEXT)
        inert()
        # An action on the hostile queue: its audit entry renders as text too.
        page.goto(queue_url(HOSTILE_QUEUE))
        notice(page, "#pause-form")
        expect(page.locator("p.notice")).to_contain_text(HOSTILE_QUEUE)
        page.goto("/audit")
        expect(page.locator("#audit")).to_contain_text(HOSTILE_QUEUE)
        inert()
        assert_no_browser_errors(page)


# --- screenshots -------------------------------------------------------------------------------------------


def test_screenshots_of_every_page(dsn: str, browser: Browser, tmp_path: Path) -> None:
    seed_demo(dsn)
    with running_console(dsn, allow_actions=True) as url:
        written = take_screenshots(url, tmp_path, browser=browser, queue=DEMO_QUEUE,
                                   dead_letter_queue=DEMO_DEAD_LETTER_QUEUE)
    assert set(written) == set(SCREENSHOTS)
    for path in written.values():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 10_000, (path, len(data))  # a page with content, not a blank
