"""``aenqueue`` from async code (an async view served by Django's AsyncClient, a coroutine) against the
real test server: it runs ``enqueue`` on Django's thread-sensitive executor (the base class's), so the
message and the row are committed and visible to another connection when it returns."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from tasksapp import tasks

from pyqueue import testing


@pytest.fixture(autouse=True)
def executor_connections(django_dsn: str) -> Iterator[None]:
    """Close the Django connections of asgiref's thread-sensitive executor thread before and after each
    test: it outlives the test's database (an ASGI server's requests close theirs at their end)."""
    close = sync_to_async(connections.close_all, thread_sensitive=True)
    asyncio.run(close())
    yield
    asyncio.run(close())


def test_an_async_view_enqueues_committed_and_visible(django_dsn: str) -> None:
    async def call() -> dict[str, str]:
        response = await AsyncClient().get("/enqueue-async/", {"a": 2, "b": 3})
        assert response.status_code == 200
        return response.json()  # type: ignore[no-any-return]

    body = asyncio.run(call())
    assert body["status"] == TaskResultStatus.READY
    assert list(testing.offered(django_dsn, "default")) == [body["id"]]
    with psycopg.connect(django_dsn) as other:
        assert other.execute("SELECT status FROM pyqueue_django_task_result WHERE id = %s",
                             (body["id"],)).fetchone() == ("READY",)
    assert task_backends["default"].get_result(body["id"]).args == [2, 3]


def test_aenqueue_in_a_coroutine_is_committed_when_it_returns(django_dsn: str) -> None:
    async def call() -> str:
        result = await tasks.add.aenqueue(1, 1)
        with psycopg.connect(django_dsn) as other:  # committed before aenqueue returned
            assert other.execute("SELECT count(*) FROM dq_messages WHERE key = %s", (result.id,)).fetchone() == (1,)
        return result.id

    result_id = asyncio.run(call())
    assert list(testing.offered(django_dsn, "default")) == [result_id]
