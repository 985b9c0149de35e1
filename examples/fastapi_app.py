"""A FastAPI application that offers messages and consumes them in the same process.

    DQ_DSN=postgresql://postgres:postgres@127.0.0.1:55432/dq uvicorn examples.fastapi_app:app --port 8000
    curl -X POST localhost:8000/signups -H 'content-type: application/json' \
         -d '{"user_id": 42, "email": "a@example.com"}'

``POST /signups`` stores the signup and offers its welcome email in one transaction (the outbox: a
signup that fails to store offers nothing). The worker, started by the lifespan beside uvicorn,
"sends" each email by recording it in ``sent_emails``. uvicorn keeps SIGTERM and Ctrl-C: on either
it stops taking requests, then the lifespan stops the worker (running handlers get their grace,
prefetched messages go back to the queue) and closes the pool. docs/fastapi.md explains each part.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from pyqueue.aio import AsyncDelayedQueue, AsyncMessage
from pyqueue.contrib.asgi import QueueLifespan, get_queue

# One pool for the application's own tables and the queue (the queue shares it).
pool = AsyncConnectionPool(os.environ["DQ_DSN"], open=False, min_size=1, max_size=8)
#: Seconds each email takes to "send" (the tests make it longer to stop the app mid-handler).
SEND_SECONDS = float(os.environ.get("EXAMPLE_SEND_SECONDS", "0.05"))


async def send_email(message: AsyncMessage) -> None:
    """The worker's handler: send the email (here: wait, then record it)."""
    await asyncio.sleep(SEND_SECONDS)
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO sent_emails (key, email) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
                           (message.key, message.payload["email"]))


emails = QueueLifespan(pool, "emails", handler=send_email, concurrency=4, shutdown_grace=10)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    await pool.open(wait=True)
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS signups (user_id bigint PRIMARY KEY, email text NOT NULL)")
        await conn.execute("CREATE TABLE IF NOT EXISTS sent_emails (key text PRIMARY KEY, email text NOT NULL, "
                           "sent_at timestamptz NOT NULL DEFAULT now())")
    try:
        async with emails(app) as state:  # the queue and its worker, for as long as the server runs
            yield state
    finally:
        await pool.close()


app = FastAPI(lifespan=lifespan)
#: A request handler's parameter of this type gets the queue of the lifespan.
EmailQueue = Annotated[AsyncDelayedQueue, Depends(get_queue)]


class Signup(BaseModel):
    user_id: int
    email: str


@app.post("/signups", status_code=201)
async def create_signup(signup: Signup, queue: EmailQueue) -> dict[str, Any]:
    """Offer the welcome email and store the signup in one transaction: both or neither (a second
    signup of a user fails on the primary key, and its offer is rolled back with it)."""
    async with pool.connection() as conn:
        try:
            async with conn.transaction():
                outcome = await queue.offer(f"welcome-{signup.user_id}", {"email": signup.email}, conn=conn)
                await conn.execute("INSERT INTO signups (user_id, email) VALUES (%s, %s)",
                                   (signup.user_id, signup.email))
        except psycopg.errors.UniqueViolation:
            raise HTTPException(409, f"user {signup.user_id} has signed up already") from None
    return {"user_id": signup.user_id, "welcome_email": str(outcome)}


@app.get("/sent/{user_id}")
async def sent(user_id: int) -> dict[str, Any]:
    """Whether the welcome email of ``user_id`` was sent."""
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT sent_at FROM sent_emails WHERE key = %s",
                                        (f"welcome-{user_id}",))).fetchone()
    return {"sent": row is not None}
