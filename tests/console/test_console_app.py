"""The console app over HTTP (Starlette's TestClient, the real app on the test database): pages,
security headers, authentication, CSRF and Sec-Fetch-Site, permissions, escaping, keyset paging,
payload views, the audit log, the statement timeout, mounting, and the live updates' hub.
The real-browser tests are in test_browser.py."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from pyqueue.console import ACTIONS, Credentials, create_app
from pyqueue.console.security import CSP, CSRF_COOKIE

SAME = {"Sec-Fetch-Site": "same-origin"}
XSS = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"


@pytest.fixture
def seeded(dsn: str) -> str:
    """Queues with a message in each state the pages show."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT dq_configure_queue('jobs', max_deliveries => 2, dead_letter_queue => 'jobs_dlq', "
                  "archive => true)")
        # A message that dies after two failed deliveries, then one in flight, then the others.
        c.execute("SELECT dq_offer('jobs', 'dies-1', 'x'::text, now() - interval '1 hour')")
        for _ in range(2):
            token = c.execute("SELECT lock_token FROM dq_poll_many('jobs', 1)").fetchone()
            c.execute("SELECT dq_nack(%s, interval '0', 'boom: division by zero')", (token[0],))
        c.execute("SELECT dq_poll_many('jobs', 1)")  # dies-1 reached max_deliveries: dead-lettered
        c.execute("SELECT dq_offer('jobs', 'fly-1', 'x'::text)")
        assert c.execute("SELECT key FROM dq_poll_many('jobs', 1)").fetchone() == ("fly-1",)
        c.execute("SELECT dq_offer('jobs', 'ready-1', '{\"order\": 7, \"items\": [1, 2]}'::jsonb)")
        c.execute("SELECT dq_offer('jobs', 'later-1', 'plain text'::text, now() + interval '1 hour')")
        c.execute("SELECT dq_offer('jobs', 'bytes-1', '\\x00ff10'::bytea)")
    return dsn


def client_for(dsn: str, **options: Any) -> TestClient:
    return TestClient(create_app(dsn, statement_timeout=5, **options), follow_redirects=False)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


def post(client: TestClient, action: str, data: dict[str, Any], page: str = "/queues/jobs", **headers: str) -> Any:
    """POST an action the way the page's form does (its CSRF token, Sec-Fetch-Site same-origin)."""
    token = csrf_of(client.get(page).text)
    return client.post(f"/actions/{action}", data={"csrf_token": token, "back": page, **data},
                       headers={**SAME, **headers})


def scalar(dsn: str, query: str, *args: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(query, args).fetchone()
        return None if row is None else row[0]


@pytest.fixture
def actions(seeded: str) -> Iterator[TestClient]:
    with client_for(seeded, allow_actions=True) as client:
        yield client


def test_every_page_answers_with_the_security_headers(seeded: str) -> None:
    with client_for(seeded) as client:
        dead_id = scalar(seeded, "SELECT id FROM dq_browse_messages('jobs_dlq', 'dead')")
        ready_id = scalar(seeded, "SELECT id FROM dq_browse_messages('jobs', NULL, 'ready-1')")
        pages = ["/", "/fragments/overview", "/queues/jobs", "/queues/jobs?state=scheduled",
                 f"/queues/jobs/messages/{ready_id}", "/dead-letters", "/dead-letters/jobs_dlq",
                 f"/queues/jobs_dlq/messages/{dead_id}", "/schedules", "/health", "/audit", "/metrics",
                 "/static/htmx.min.js", "/static/console.js", "/static/console.css"]
        for page in pages:
            r = client.get(page)
            assert r.status_code == 200, (page, r.text[:500])
            assert r.headers["content-security-policy"] == CSP
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
        assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
        # No inline script or style anywhere: every <script> has a src, no style= or on*= attribute.
        for page in pages[:11]:
            html = client.get(page).text
            assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), page
            assert not re.search(r"\sstyle=|\son[a-z]+=", html), page


def test_the_overview_shows_every_queue_and_marks_the_dead_letter_queue(seeded: str) -> None:
    with client_for(seeded) as client:
        html = client.get("/").text
    assert 'data-queue="jobs"' in html and 'data-queue="jobs_dlq" data-dlq="true"' in html
    assert "dead-letter queue" in html
    assert 'id="throughput"' in html  # jobs archives: the chart of acknowledgements per minute


def test_a_read_only_console_shows_no_form_and_refuses_every_post(seeded: str) -> None:
    with client_for(seeded) as client:
        for page in ["/", "/queues/jobs", "/dead-letters/jobs_dlq", "/schedules"]:
            assert 'method="post"' not in client.get(page).text, page
        app_console = client.app.state.console  # type: ignore[attr-defined]
        cookie = client.cookies.get(CSRF_COOKIE)
        assert cookie
        forged = app_console.csrf.token(cookie)  # a valid token: still refused, the console is read-only
        for action in sorted(ACTIONS):
            r = client.post(f"/actions/{action}", data={"csrf_token": forged, "queue": "jobs", "key": "ready-1",
                                                        "confirm": "jobs", "name": "x"}, headers=SAME)
            assert r.status_code == 403, action
    assert scalar(seeded, "SELECT paused FROM dq_queue_config('jobs')") is False
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('jobs')") == 4


@pytest.mark.parametrize("headers", [{}, {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}])
def test_a_post_from_another_site_is_refused_even_with_a_token(actions: TestClient, seeded: str,
                                                               headers: dict[str, str]) -> None:
    token = csrf_of(actions.get("/queues/jobs").text)
    r = actions.post("/actions/pause", data={"csrf_token": token, "queue": "jobs"}, headers=headers)
    assert r.status_code == 403
    assert "cross-site" in r.text
    assert scalar(seeded, "SELECT paused FROM dq_queue_config('jobs')") is False


@pytest.mark.parametrize("token", [None, "", "0" * 64])
def test_a_post_without_the_right_csrf_token_is_refused(actions: TestClient, seeded: str, token: str | None) -> None:
    actions.get("/")
    data = {"queue": "jobs"} if token is None else {"queue": "jobs", "csrf_token": token}
    r = actions.post("/actions/pause", data=data, headers=SAME)
    assert r.status_code == 403 and "CSRF" in r.text
    assert scalar(seeded, "SELECT paused FROM dq_queue_config('jobs')") is False


def test_a_token_of_another_cookie_is_refused(seeded: str) -> None:
    with client_for(seeded, allow_actions=True) as first, client_for(seeded, allow_actions=True) as second:
        stolen = csrf_of(first.get("/queues/jobs").text)
        second.get("/")
        r = second.post("/actions/pause", data={"csrf_token": stolen, "queue": "jobs"}, headers=SAME)
    assert r.status_code == 403
    assert scalar(seeded, "SELECT paused FROM dq_queue_config('jobs')") is False


def test_pause_and_resume_change_the_queue_and_are_audited(actions: TestClient, seeded: str) -> None:
    r = post(actions, "pause", {"queue": "jobs"}, page="/queues/jobs")
    assert r.status_code == 303 and r.headers["location"].startswith("/queues/jobs?notice=")
    assert scalar(seeded, "SELECT paused FROM dq_queue_config('jobs')") is True
    assert "Paused jobs." in actions.get(r.headers["location"]).text
    post(actions, "resume", {"queue": "jobs"}, page="/queues/jobs")
    assert scalar(seeded, "SELECT paused FROM dq_queue_config('jobs')") is False
    with psycopg.connect(seeded, autocommit=True) as c:
        rows = c.execute("SELECT action, queue, outcome, actor FROM dq_audit_entries() ORDER BY id").fetchall()
    assert [(a, q, o) for a, q, o, _ in rows] == [("pause", "jobs", "ok"), ("resume", "jobs", "ok")]
    assert rows[0][3] == "anonymous@testclient"
    audit = actions.get("/audit").text
    assert 'data-action="pause"' in audit and 'data-action="resume"' in audit


def test_purge_needs_the_queue_name_typed(actions: TestClient, seeded: str) -> None:
    r = post(actions, "purge", {"queue": "jobs", "confirm": "job"}, page="/queues/jobs")
    assert r.status_code == 303 and "error=" in r.headers["location"]
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('jobs')") == 4
    post(actions, "purge", {"queue": "jobs", "confirm": "jobs"}, page="/queues/jobs")
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('jobs')") == 0


def test_cancel_and_due_now(actions: TestClient, seeded: str) -> None:
    post(actions, "due_now", {"queue": "jobs", "key": "later-1"})
    assert scalar(seeded, "SELECT state FROM dq_browse_messages('jobs', NULL, 'later-1')") == "ready"
    # Due-now of a message in flight changes nothing and says so.
    r = post(actions, "due_now", {"queue": "jobs", "key": "fly-1"})
    assert "not+scheduled+for+later" in r.headers["location"]
    assert scalar(seeded, "SELECT state FROM dq_browse_messages('jobs', NULL, 'fly-1')") == "in_flight"
    post(actions, "cancel", {"queue": "jobs", "key": "ready-1"})
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('jobs', NULL, 'ready-1')") == 0


def test_limits_change_through_the_form_and_bad_values_are_refused(actions: TestClient, seeded: str) -> None:
    post(actions, "configure", {"queue": "jobs", "rate_limit": "10", "rate_period": "1 second",
                                "max_in_flight": "3"}, page="/queues/jobs")
    row = scalar(seeded, "SELECT row(rate_limit, rate_period, max_in_flight)::text FROM dq_queue_config('jobs')")
    assert row == "(10,00:00:01,3)"
    r = post(actions, "configure", {"queue": "jobs", "max_in_flight": "-1"}, page="/queues/jobs")
    assert "error=" in r.headers["location"] and "22023" in actions.get(r.headers["location"]).text
    post(actions, "configure", {"queue": "jobs", "max_in_flight": "none"}, page="/queues/jobs")
    assert scalar(seeded, "SELECT max_in_flight FROM dq_queue_config('jobs')") is None
    with psycopg.connect(seeded, autocommit=True) as c:
        outcomes = [r[0] for r in c.execute("SELECT outcome FROM dq_audit_entries() ORDER BY id")]
    assert outcomes == ["ok", "error 22023", "ok"]


def test_redrive_one_selected_and_matching_with_the_typed_count(actions: TestClient, seeded: str) -> None:
    with psycopg.connect(seeded, autocommit=True) as c:
        c.execute("SELECT dq_configure_queue('other', max_deliveries => 1, dead_letter_queue => 'jobs_dlq')")
        for i in range(3):
            c.execute("SELECT dq_offer('other', %s, 'x'::text, now() - interval '1 minute')", (f"o{i}",))
        for token, in c.execute("SELECT lock_token FROM dq_poll_many('other', 10)").fetchall():
            c.execute("SELECT dq_nack(%s, interval '0', 'timeout')", (token,))
        c.execute("SELECT dq_poll_many('other', 10)")
    with psycopg.connect(seeded, autocommit=True) as c:
        ids = [r for r, in c.execute("SELECT id FROM dq_browse_messages('jobs_dlq', 'dead') ORDER BY key")]
    assert len(ids) == 4
    page = "/dead-letters/jobs_dlq"
    html = actions.get(page).text
    assert 'id="dead-letter-groups"' in html and "timeout" in html and "boom: division by zero" in html
    post(actions, "redrive", {"queue": "jobs_dlq", "id": str(ids[0])}, page=page)  # dies-1 back to jobs
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('jobs', NULL, 'dies-1')") == 1
    # All matching, with a wrong count first: refused, nothing moves.
    r = post(actions, "redrive", {"queue": "jobs_dlq", "mode": "matching", "dead_from": "other",
                                  "last_error": "timeout", "confirm_count": "2"}, page=page)
    assert "error=" in r.headers["location"]
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('jobs_dlq', 'dead')") == 3
    post(actions, "redrive", {"queue": "jobs_dlq", "mode": "matching", "dead_from": "other",
                              "last_error": "timeout", "confirm_count": "3"}, page=page)
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('jobs_dlq', 'dead')") == 0
    assert scalar(seeded, "SELECT count(*) FROM dq_browse_messages('other')") == 3


def test_an_action_redirects_only_within_the_console(actions: TestClient) -> None:
    for back in ["https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:alert(1)"]:
        r = post(actions, "pause", {"queue": "jobs", "back": back})
        assert r.headers["location"].startswith("/?"), back


def test_producer_controlled_values_are_escaped(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT dq_configure_queue(%s, max_deliveries => 1, dead_letter_queue => %s)", (XSS, XSS + "dlq"))
        c.execute("SELECT dq_offer(%s, %s, %s::text, now() - interval '1 s', headers => %s::jsonb)",
                  (XSS, IMG, "<b>bold</b>" + XSS, json.dumps({IMG: XSS})))
        token = c.execute("SELECT lock_token FROM dq_poll_many(%s, 1)", (XSS,)).fetchone()[0]
        c.execute("SELECT dq_nack(%s, interval '0', %s)", (token, XSS))
        c.execute("SELECT dq_offer(%s, %s, %s::jsonb)", (XSS, "json-" + IMG, json.dumps({"html": XSS})))
        c.execute("SELECT dq_poll_many(%s, 10)", (XSS,))
    with client_for(dsn, allow_actions=True) as client:
        queue_path = "/queues/" + "%3Cscript%3Ealert%281%29%3C%2Fscript%3E"
        json_id = scalar(dsn, "SELECT id FROM dq_browse_messages(%s, NULL, 'json-')", XSS)
        dead_id = scalar(dsn, "SELECT id FROM dq_browse_messages(%s, 'dead')", XSS + "dlq")
        pages = ["/", queue_path, f"{queue_path}/messages/{json_id}", "/dead-letters",
                 "/dead-letters/%3Cscript%3Ealert%281%29%3C%2Fscript%3Edlq",
                 f"/queues/%3Cscript%3Ealert%281%29%3C%2Fscript%3Edlq/messages/{dead_id}"]
        for page in pages:
            r = client.get(page)
            assert r.status_code == 200, (page, r.text[:300])
            assert XSS not in r.text and IMG not in r.text and "<b>bold" not in r.text, page
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text, page


def test_token_and_basic_authentication(seeded: str) -> None:
    with client_for(seeded, authenticate=Credentials(token="s3cret-token")) as client:
        r = client.get("/")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/metrics").status_code == 401 and client.get("/events").status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
    basic = Credentials.from_environment({"PGDELAYQ_CONSOLE_USER": "ops", "PGDELAYQ_CONSOLE_PASSWORD": "pw:1"})
    with client_for(seeded, authenticate=basic) as client:
        def auth(user: str, password: str) -> dict[str, str]:
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

        assert client.get("/").headers["www-authenticate"].startswith("Basic")
        assert client.get("/", headers=auth("ops", "pw")).status_code == 401
        assert client.get("/", headers=auth("root", "pw:1")).status_code == 401
        assert client.get("/", headers={"Authorization": "Basic !!!"}).status_code == 401
        r = client.get("/", headers=auth("ops", "pw:1"))
        assert r.status_code == 200 and "ops" in r.text


def test_credentials_from_the_environment() -> None:
    assert Credentials.from_environment({}) is None
    assert Credentials.from_environment({"PGDELAYQ_CONSOLE_TOKEN": "t"}) == Credentials(token="t")
    for env in [{"PGDELAYQ_CONSOLE_USER": "u"}, {"PGDELAYQ_CONSOLE_PASSWORD": "p"}, {"PGDELAYQ_CONSOLE_TOKEN": ""}]:
        with pytest.raises(ValueError):
            Credentials.from_environment(env)


def test_a_permission_hook_grants_actions_per_user(seeded: str) -> None:
    users = {"Bearer a": "alice", "Bearer b": "bob"}
    grants = {"alice": {"pause", "resume"}, "bob": "read-only"}

    def authenticate(request: Any) -> str | None:
        return users.get(request.headers.get("authorization", ""))

    with client_for(seeded, allow_actions=True, authenticate=authenticate,
                    permissions=lambda user: grants[user or ""]) as client:
        as_alice = {"Authorization": "Bearer a"}
        html = client.get("/queues/jobs", headers=as_alice).text
        assert 'id="pause-form"' in html and 'id="purge-form"' not in html
        token = csrf_of(html)
        r = client.post("/actions/purge", data={"csrf_token": token, "queue": "jobs", "confirm": "jobs"},
                        headers={**SAME, **as_alice})
        assert r.status_code == 403
        r = client.post("/actions/pause", data={"csrf_token": token, "queue": "jobs"}, headers={**SAME, **as_alice})
        assert r.status_code == 303
        as_bob = {"Authorization": "Bearer b"}
        assert 'method="post"' not in client.get("/queues/jobs", headers=as_bob).text
        r = client.post("/actions/resume", data={"csrf_token": token, "queue": "jobs"}, headers={**SAME, **as_bob})
        assert r.status_code == 403
    assert scalar(seeded, "SELECT paused FROM dq_queue_config('jobs')") is True
    assert scalar(seeded, "SELECT actor FROM dq_audit_entries()") == "alice@testclient"


def test_the_message_browser_pages_by_keyset_and_filters(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT dq_offer_many('big', ARRAY(SELECT 'k' || lpad(i::text, 4, '0') "
                  "FROM generate_series(1, 120) i), "
                  "array_fill('x'::bytea, ARRAY[120]))")
        c.execute("SELECT dq_offer('big', 'other-1', 'x'::text, now() + interval '1 day')")
    seen: list[str] = []
    with client_for(dsn) as client:
        url: str | None = "/queues/big?prefix=k"
        while url:
            html = client.get(url).text
            seen += re.findall(r'<tr data-key="([^"]+)"', html)
            found = re.search(r'id="next-page" href="([^"]+)"', html)
            url = found.group(1).replace("&amp;", "&") if found else None
        assert seen == [f"k{i:04d}" for i in range(1, 121)]
        scheduled = re.findall(r'<tr data-key="([^"]+)"', client.get("/queues/big?state=scheduled").text)
        assert scheduled == ["other-1"]
        assert client.get("/queues/big?state=nonsense").status_code == 400


def test_the_message_page_shows_each_payload_kind(seeded: str) -> None:
    with psycopg.connect(seeded, autocommit=True) as c:
        c.execute("SELECT dq_offer('jobs', 'huge-1', repeat('y', 200000)::text)")
    with client_for(seeded) as client:
        def page(key: str) -> str:
            message_id = scalar(seeded, "SELECT id FROM dq_browse_messages('jobs', NULL, %s)", key)
            return client.get(f"/queues/jobs/messages/{message_id}").text

        assert '{\n  &#34;items&#34;: [\n    1,\n    2\n  ],\n  &#34;order&#34;: 7\n}' in page("ready-1")
        assert "plain text" in page("later-1")
        assert "00000000  00 ff 10" in page("bytes-1")
        huge = page("huge-1")
        assert "200,000 bytes, truncated" in huge and huge.count("y") < 70000
        assert client.get("/queues/jobs/messages/999999999").status_code == 404


def test_the_message_page_shows_when_parents_released_the_message(seeded: str) -> None:
    with psycopg.connect(seeded, autocommit=True) as c:
        c.execute("SELECT dq_offer('jobs', 'child-1', 'x'::text, after => '[\"parent-1\"]')")
        c.execute("SELECT dq_offer('stage', 'parent', 'x'::text)")
        c.execute("SELECT dq_offer('jobs', 'child-2', 'x'::text, after => '[[\"stage\", \"parent\"]]')")
        (token,) = c.execute("SELECT lock_token FROM dq_poll_many('stage', 1)").fetchone() or (None,)
        assert c.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)
    with client_for(seeded) as client:
        def page(key: str) -> str:
            message_id = scalar(seeded, "SELECT id FROM dq_browse_messages('jobs', NULL, %s)", key)
            return client.get(f"/queues/jobs/messages/{message_id}").text

        released = page("child-2")
        assert 'id="released-at"' in released and "released by its parents" in released
        assert 'id="released-at"' not in page("ready-1")
        assert 'id="released-at"' not in page("child-1")  # its parent never existed: it never waited


def test_a_query_past_the_statement_timeout_shows_an_error_page(seeded: str) -> None:
    with psycopg.connect(seeded) as locker:
        locker.execute("LOCK TABLE dq_queues IN ACCESS EXCLUSIVE MODE")
        with TestClient(create_app(seeded, statement_timeout=0.3)) as client:
            r = client.get("/queues/jobs")
        locker.rollback()
    assert r.status_code == 504 and "57014" in r.text and "statement timeout" in r.text


def test_mounted_under_a_path_in_an_application_with_its_own_authentication(seeded: str) -> None:
    console = create_app(seeded, allow_actions=True, authenticate=lambda request: request.headers.get("x-user"))
    parent = Starlette(routes=[Mount("/ops/queues", app=console)])
    with TestClient(parent, follow_redirects=False) as client:
        assert client.get("/ops/queues/").status_code == 401
        user = {"x-user": "carol"}
        html = client.get("/ops/queues/", headers=user).text
        assert 'href="/ops/queues/queues/jobs"' in html and 'src="/ops/queues/static/htmx.min.js"' in html
        assert client.get("/ops/queues/static/console.css", headers=user).status_code == 200
        token = csrf_of(client.get("/ops/queues/queues/jobs", headers=user).text)
        r = client.post("/ops/queues/actions/pause", data={"csrf_token": token, "queue": "jobs",
                                                           "back": "/ops/queues/queues/jobs"}, headers={**SAME, **user})
        assert r.status_code == 303 and r.headers["location"].startswith("/ops/queues/queues/jobs?")
    assert scalar(seeded, "SELECT actor FROM dq_audit_entries()") == "carol@testclient"


def test_metrics_page_serves_the_queue_figures(seeded: str) -> None:
    with client_for(seeded) as client:
        r = client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    assert 'pgdelayq_queue_ready_messages{queue="jobs"} 2.0' in r.text and "pgdelayq_up 1.0" in r.text


def test_the_live_hub_is_woken_by_the_queue_channel_and_sends_a_refresh(seeded: str) -> None:
    """The hub reads the figures every 30 s here: a refresh within 10 s came from the NOTIFY on
    dq_channel('jobs') (as an offer sends it while a consumer waits), read as dq_viewer."""
    app = create_app(seeded)
    hub = app.state.console.hub
    hub.interval, hub.debounce = 30.0, 0.05

    def offer_and_notify() -> None:
        with psycopg.connect(seeded, autocommit=True) as c, c.transaction():
            c.execute("SELECT dq_offer('jobs', 'new-1', 'x'::text)")
            c.execute("SELECT pg_notify(dq_channel('jobs'), 'jobs')")

    async def scenario() -> list[str]:
        stream = hub.subscribe(None)
        events = [(await stream.__anext__())["event"]]  # hello
        offer = threading.Timer(1.5, offer_and_notify)
        offer.start()
        events.append((await asyncio.wait_for(stream.__anext__(), 10))["event"])
        await stream.aclose()
        offer.join()
        assert hub.subscribers == 0
        await app.state.console.close()
        return events

    assert asyncio.run(scenario()) == ["hello", "refresh"]


def test_each_page_reports_its_queries_in_server_timing(seeded: str) -> None:
    with client_for(seeded) as client:
        timing = client.get("/queues/jobs").headers["server-timing"]
        static = client.get("/static/console.css").headers["server-timing"]
    found = re.fullmatch(r'db;dur=([0-9.]+);desc="(\d+) queries"', timing)
    assert found and int(found.group(2)) >= 3 and float(found.group(1)) > 0, timing
    assert static == 'db;dur=0.0;desc="0 queries"'


def test_the_vendored_htmx_is_the_one_recorded() -> None:
    import hashlib
    from pathlib import Path

    import pyqueue.console

    static = Path(pyqueue.console.__file__).with_name("static")
    recorded = re.search(r"\| htmx\.min\.js \| htmx\.org \| ([0-9.]+) \|.*\| ([0-9a-f]{64}) \|",
                         (static / "VENDORED.md").read_text())
    assert recorded, "VENDORED.md lists htmx.min.js with its version and sha256"
    assert hashlib.sha256((static / "htmx.min.js").read_bytes()).hexdigest() == recorded.group(2)
    assert f'version:"{recorded.group(1)}"' in (static / "htmx.min.js").read_text()
    assert "Zero-Clause BSD" in (static / "htmx.LICENSE").read_text()
