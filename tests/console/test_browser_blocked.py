"""The web console shows blocked messages (offered after others) as a person sees them: a real ``pyqueue
console`` and a real Chromium (tests/support/consolebrowser.py). The overview and the queue page show a blocked
count only when there are blocked messages, the browser filters by state blocked, a message page lists the
parents a message waits for and the children waiting for it with links to their pages; every figure is checked
against SQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from consolebrowser import assert_no_browser_errors, browser_page, chromium, running_console
from playwright.sync_api import Browser, Page, expect

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def queue_url(queue: str) -> str:
    return f"/queues/{quote(queue, safe='')}"


def offer(conn: psycopg.Connection[Any], queue: str, key: str, *, after: list[Any] | None = None,
          delay: str = "0") -> None:
    conn.execute("SELECT dq_offer(%s, %s, %s::jsonb, dq_now() + %s::interval, after => %s::jsonb)",
                 (queue, key, json.dumps({"key": key}), delay, None if after is None else json.dumps(after)))


def poll(conn: psycopg.Connection[Any], queue: str) -> dict[str, Any]:
    return {r[0]: r[1] for r in conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100)", (queue,))}


def blocked_in_sql(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {r[0]: r[1] for r in conn.execute("SELECT queue, blocked FROM dq_stats WHERE blocked > 0")}


def header_cells(page: Page, selector: str) -> list[str]:
    return page.locator(selector).evaluate_all("cs => cs.map(c => c.textContent.trim())")  # type: ignore[no-any-return]


def overview_blocked(page: Page) -> dict[str, str]:
    """{queue: the text of its blocked cell} of the overview; {} when the column is not shown."""
    page.goto("/")
    headers = header_cells(page, "#queues thead th")
    if "blocked" not in headers:
        return {}
    column = headers.index("blocked")
    return {q: page.locator(f'#queues tr[data-queue="{q}"] td').nth(column).inner_text()
            for q in page.locator("#queues tbody tr[data-queue]").evaluate_all("rs => rs.map(r => r.dataset.queue)")}


def dependency_rows(page: Page) -> list[tuple[str, str, str, str]]:
    """(relation, queue, key, state) of the message page's dependencies table."""
    rows = page.locator("#dependencies tbody tr")
    found = []
    for i in range(rows.count()):
        cells = [c.strip() for c in rows.nth(i).locator("td").all_inner_texts()]
        found.append((rows.nth(i).get_attribute("data-relation") or "", cells[1], cells[2], cells[3]))
    return found


def test_blocked_counts_filter_and_dependencies(dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    offer(conn, "etl", "extract")
    offer(conn, "etl", "other")
    with running_console(dsn) as url, browser_page(browser, base_url=url) as page:
        # No blocked message anywhere: no blocked column, no blocked figure, no dependencies table.
        assert overview_blocked(page) == {}
        page.goto(queue_url("etl"))
        assert "blocked" not in header_cells(page, "#counts th")
        page.locator('#messages tr[data-key="extract"] a').click()
        page.wait_for_url(re.compile(r"/messages/\d+$"))
        expect(page.locator("#dependencies")).to_have_count(0)

        # A workflow across two queues: load after extract and a report of queue "reports"; report after load.
        offer(conn, "reports", "daily", delay="1 hour")
        offer(conn, "etl", "load", after=["extract", ["reports", "daily"]], delay="2 hours")
        offer(conn, "reports", "summary", after=[["etl", "load"]])
        assert blocked_in_sql(conn) == {"etl": 1, "reports": 1}
        assert overview_blocked(page) == {"etl": "1", "reports": "1"}
        expect(page.locator("p.hint").first).to_contain_text("blocked: waiting for its parents")

        # The queue page: the count, the blocked row with its parents, the state filter.
        page.goto(queue_url("etl"))
        expect(page.locator("#blocked-count")).to_have_text("1")
        row = page.locator('#messages tr[data-key="load"]')
        expect(row).to_contain_text("blocked")
        expect(row).to_contain_text("2 parents")
        expect(row).to_contain_text("in 2.0 h, once released")
        page.locator("form#browse select[name=state]").select_option("blocked")
        page.locator("form#browse button").click()
        page.wait_for_load_state("load")
        keys = page.locator("#messages tr[data-key]").evaluate_all("rs => rs.map(r => r.dataset.key)")
        assert keys == [r[0] for r in conn.execute("SELECT key FROM dq_list_messages('etl', 'blocked')")] == ["load"]

        # The blocked message's page: its pending parents, due time once released, parents and child.
        page.locator('#messages tr[data-key="load"] a').click()
        page.wait_for_url(re.compile(r"/messages/\d+$"))
        expect(page.locator("h1 .state-blocked")).to_have_text("blocked")
        expect(page.locator("#parents-pending")).to_have_text("2 parents not yet acknowledged")
        expect(page.locator("dl#message")).to_contain_text("due once released")
        in_sql = [(r[0], r[1], r[2], r[3]) for r in conn.execute(
            "SELECT relation, related_queue, related_key, state FROM dq_dependencies('etl', 'load')")]
        assert dependency_rows(page) == in_sql == [
            ("parent", "etl", "extract", "ready"), ("parent", "reports", "daily", "scheduled"),
            ("child", "reports", "summary", "blocked")]
        load_page = page.url

        # Each link leads to that message's page.
        page.locator('#dependencies tr[data-relation="child"] a', has_text="summary").click()
        page.wait_for_url(re.compile(r"/queues/reports/messages/\d+$"))
        expect(page.locator("dl#message")).to_contain_text("summary")
        assert dependency_rows(page) == [("parent", "etl", "load", "blocked")]
        page.locator('#dependencies tr[data-relation="parent"] td.key a').click()
        page.wait_for_url(load_page)
        page.locator('#dependencies tr[data-key="daily"] td.key a').click()
        page.wait_for_url(re.compile(r"/queues/reports/messages/\d+$"))
        expect(page.locator("h1 .state-scheduled")).to_have_count(1)
        assert dependency_rows(page) == [("child", "etl", "load", "blocked")]

        # extract acknowledged: load waits for one parent; cancelled "daily" (wait): absent, no link.
        conn.execute("SELECT dq_ack(%s)", (poll(conn, "etl")["extract"],))
        conn.execute("SELECT dq_cancel('reports', 'daily')")
        page.goto(load_page)
        expect(page.locator("#parents-pending")).to_have_text("1 parent not yet acknowledged")
        assert dependency_rows(page) == [("parent", "reports", "daily", "absent"),
                                         ("child", "reports", "summary", "blocked")]
        expect(page.locator('#dependencies tr[data-key="daily"] a[href*="message?"]')).to_have_count(0)
        missing = page.request.get("/message?queue=reports&key=daily")
        assert missing.status == 404 and "no message with key" in missing.text()

        # Cancelled: the blocked counts go, and with them the column.
        conn.execute("SELECT dq_cancel('etl', 'load')")
        conn.execute("SELECT dq_cancel('reports', 'summary')")
        assert blocked_in_sql(conn) == {}
        assert overview_blocked(page) == {}
        assert_no_browser_errors(page)


def test_a_dead_lettered_parent_links_to_its_dead_letter(
        dsn: str, conn: psycopg.Connection[Any], browser: Browser) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', max_deliveries => 1, dead_letter_queue => 'jobs-dead')")
    offer(conn, "jobs", "parent")
    offer(conn, "jobs", "child", after=["parent"])
    conn.execute("SELECT dq_nack(%s, '0', 'boom')", (poll(conn, "jobs")["parent"],))
    dead_id = conn.execute("SELECT id FROM dq_messages WHERE queue = 'jobs-dead' AND key = 'parent'").fetchone()
    assert dead_id is not None
    with running_console(dsn) as url, browser_page(browser, base_url=url) as page:
        page.goto(queue_url("jobs") + "?state=blocked")
        page.locator('#messages tr[data-key="child"] a').click()
        page.wait_for_url(re.compile(r"/messages/\d+$"))
        assert dependency_rows(page) == [("parent", "jobs", "parent", "dead")]
        page.locator('#dependencies tr[data-key="parent"] td.key a').click()
        page.wait_for_url(re.compile(rf"/queues/jobs-dead/messages/{dead_id[0]}$"))
        expect(page.locator("h1 .state-dead")).to_have_count(1)
        assert_no_browser_errors(page)
