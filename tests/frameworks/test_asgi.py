"""The queue and its worker in an ASGI application (pyqueue.contrib.asgi): in-process through
Starlette's TestClient, and examples/fastapi_app.py under a real uvicorn process stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from pyqueue.aio import AsyncMessage
from pyqueue.contrib.asgi import QueueLifespan, get_queue

ROOT = Path(__file__).resolve().parents[2]


def scalar(dsn: str, query: str, *args: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(query, args).fetchone()
        return None if row is None else row[0]


def wait_until(check: Any, limit: float = 20.0) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    return check()


def test_the_lifespan_runs_a_worker_and_gives_the_queue_to_requests(dsn: str) -> None:
    handled: list[str] = []

    async def handle(message: AsyncMessage) -> None:
        handled.append(message.key)

    async def offer(request: Request) -> JSONResponse:
        outcome = await get_queue(request).offer(request.path_params["key"], {"n": 1})
        return JSONResponse({"outcome": str(outcome)})

    lifespan = QueueLifespan(dsn, "asgi", handle, concurrency=2, idle_check=0.5)
    app = Starlette(routes=[Route("/offer/{key}", offer, methods=["POST"])], lifespan=lifespan)
    with TestClient(app) as client:
        assert lifespan.worker is not None and app.state.pgdelayq is not None
        for i in range(5):
            assert client.post(f"/offer/k{i}").status_code == 200
        assert wait_until(lambda: len(handled) == 5)
    assert sorted(handled) == [f"k{i}" for i in range(5)]
    assert lifespan.worker is None  # stopped and forgotten at shutdown
    assert scalar(dsn, "SELECT count(*) FROM dq_browse_messages('asgi')") == 0


def test_without_a_handler_the_application_only_offers(dsn: str) -> None:
    async def offer(request: Request) -> JSONResponse:
        await get_queue(request).offer("only", "x")
        return JSONResponse({})

    lifespan = QueueLifespan(dsn, "offers-only", state_key="pgdelayq")
    with TestClient(Starlette(routes=[Route("/", offer, methods=["POST"])], lifespan=lifespan)) as client:
        client.post("/")
        assert lifespan.worker is None
    assert scalar(dsn, "SELECT state FROM dq_browse_messages('offers-only')") == "ready"


def test_get_queue_without_the_lifespan_says_what_is_missing() -> None:
    async def offer(request: Request) -> JSONResponse:
        get_queue(request)
        return JSONResponse({})

    with TestClient(Starlette(routes=[Route("/", offer)]), raise_server_exceptions=True) as client:
        with pytest.raises(RuntimeError, match="lifespan=QueueLifespan"):
            client.get("/")


def test_a_bad_worker_option_stops_the_application_at_startup(dsn: str) -> None:
    async def handle(message: AsyncMessage) -> None:
        return None

    app = Starlette(lifespan=QueueLifespan(dsn, "bad", handle, concurrency=0))
    with pytest.raises(ValueError, match="concurrency"), TestClient(app):
        pass


# --------------------------------------------------------------------------- the FastAPI example


@contextmanager
def uvicorn_example(dsn: str, **env: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """examples/fastapi_app.py under ``python -m uvicorn`` (its own signal handling), until it ends."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env={**os.environ, "DQ_DSN": dsn, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/openapi.json", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"uvicorn did not start: {proc.communicate()[0]}") from None
                time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_stopped_gracefully(proc: subprocess.Popen[str], output: str) -> None:
    """uvicorn ran the lifespan's shutdown and ended; after a graceful shutdown it raises the
    signal it caught again, so the process ends killed by SIGTERM (or 0 on older versions)."""
    assert "Application shutdown complete." in output and "Finished server process" in output, output
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert "Traceback" not in output and "ERROR" not in output, output


def request(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_fastapi_example_offers_in_the_request_transaction_and_handles_in_process(dsn: str) -> None:
    with uvicorn_example(dsn) as (proc, url):
        assert request(f"{url}/signups", "POST", {"user_id": 1, "email": "a@example.com"})[0] == 201
        assert wait_until(lambda: request(f"{url}/sent/1")[1]["sent"])
        assert wait_until(lambda: scalar(dsn, "SELECT count(*) FROM dq_browse_messages('emails')") == 0)
        # A second signup of the same user fails on its primary key: its offer is rolled back with it.
        status, body = request(f"{url}/signups", "POST", {"user_id": 1, "email": "b@example.com"})
        assert status == 409 and "already" in body["detail"]
        time.sleep(0.5)
        assert scalar(dsn, "SELECT count(*) FROM dq_browse_messages('emails')") == 0
        assert scalar(dsn, "SELECT email FROM sent_emails WHERE key = 'welcome-1'") == "a@example.com"
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
    assert_stopped_gracefully(proc, output)


def test_sigterm_stops_uvicorn_and_the_worker_together_leaving_nothing_locked(dsn: str) -> None:
    """Each email takes 3 s (the example's grace is 10 s); SIGTERM while 4 run and more are prefetched:
    uvicorn and the worker stop together once the 4 running handlers finish (one round, not the whole
    grace); those 4 are acknowledged, the prefetched ones are released at once (ready, their delivery not
    counted), nothing is left locked."""
    with uvicorn_example(dsn, EXAMPLE_SEND_SECONDS="3") as (proc, url):
        for user in range(1, 9):
            assert request(f"{url}/signups", "POST", {"user_id": user, "email": f"u{user}@example.com"})[0] == 201
        # Four handlers running and at least one message prefetched beside them (its lock is 30 s).
        in_flight = "SELECT count(*) FROM dq_browse_messages('emails', 'in_flight')"
        assert wait_until(lambda: scalar(dsn, in_flight) >= 5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
        stopped_in = time.monotonic() - started
    assert_stopped_gracefully(proc, output)
    assert stopped_in < 8, (stopped_in, output)  # one round of 3 s handlers, not the 10 s grace
    sent = scalar(dsn, "SELECT count(*) FROM sent_emails")
    left = scalar(dsn, "SELECT count(*) FROM dq_browse_messages('emails')")
    assert scalar(dsn, "SELECT count(*) FROM dq_browse_messages('emails', 'in_flight')") == 0, output
    assert (sent, left) == (4, 4), (sent, left, output)
    assert scalar(dsn, "SELECT count(*) FROM dq_messages WHERE queue = 'emails' AND delivery_count = 0") == 4
    assert scalar(dsn, "SELECT count(*) FROM dq_browse_messages('emails', 'ready')") == left
