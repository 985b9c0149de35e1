"""The console as an ASGI application (Starlette, Jinja2 templates, htmx): :func:`create_app`.

Every page is rendered on the server from the ``dq_*`` functions (granted to ``dq_viewer``; the
actions to ``dq_admin``), on a pool of connections that run as the least of those roles the
console needs and under a ``statement_timeout``. Actions are POSTed forms, each one function call
written to the audit log in the same transaction (``dq_audit``) and to the ``pyqueue.console.audit``
logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode
from zoneinfo import ZoneInfo

import psycopg
from jinja2 import Environment, PackageLoader, select_autoescape
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..core.statements import QueueStatements, Statement, Statements
from ..drivers.aio import run
from ..durations import Seconds, as_timedelta, parse_duration
from ..errors import InvalidArgument, PyQueueError, translate
from ..serializers import SerializerRegistry
from .live import LiveHub
from .render import chart as chart_svg
from .render import health_view, payload_view
from .security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SECURITY_HEADERS,
    Authenticate,
    Csrf,
    Permissions,
    Unauthorized,
    allowed_actions,
    authenticated_user,
    describe,
    same_origin,
    unauthorized,
)
from .statements import DEPENDENCY_ROWS, PAGE_ROWS, STATES, ConsoleStatements

log = logging.getLogger("pyqueue.console")
#: The queries of the request being served: [count, seconds], for its Server-Timing header.
_queries: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("pyqueue_console_queries",
                                                                             default=None)
audit_log = logging.getLogger("pyqueue.console.audit")
T = TypeVar("T")

STATIC = Path(__file__).with_name("static")
#: How many samples of each queue's counts the overview keeps for queues that do not archive.
SAMPLES = 120


@dataclass
class Console:
    """The state of one console app: its pool, statements, CSRF secret, live hub and samples."""

    dsn: str
    schema: str | None
    allow_actions: bool
    authenticate: Authenticate | None
    permissions: Permissions | None
    statement_timeout: timedelta
    role: str | None
    title: str
    pool_size: int
    csrf: Csrf
    statements: ConsoleStatements = field(init=False)
    common: Statements = field(init=False)
    hub: LiveHub = field(init=False)
    samples: dict[str, deque[tuple[float, int, int]]] = field(default_factory=dict)
    _pool: AsyncConnectionPool | None = None
    _opening: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.statements = ConsoleStatements(self.schema)
        self.common = Statements(self.schema)
        self.hub = LiveHub(self.connect, self.statements)

    def conninfo_options(self) -> dict[str, Any]:
        timeout_ms = max(int(self.statement_timeout.total_seconds() * 1000), 1)
        return {"options": f"-c statement_timeout={timeout_ms}", "application_name": "pyqueue console",
                "autocommit": True}

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self.role:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.role)))

    async def pool(self) -> AsyncConnectionPool:
        """The pool, opened on first use (a mounted app's lifespan may never run)."""
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=self.pool_size, open=False,
                                               kwargs=self.conninfo_options(), configure=self._configure,
                                               name="pyqueue-console")
                    await pool.open(wait=False)
                    self._pool = pool
        return self._pool

    async def read(self, op: Statement[T]) -> T:
        """Run one read on a pooled connection (autocommit).

        :raises PyQueueError: the database refused it (its SQLSTATE kept).
        """
        pool = await self.pool()
        started = time.perf_counter()
        try:
            async with pool.connection(timeout=self.statement_timeout.total_seconds() + 5) as conn:
                return await run(conn, op)
        except psycopg.Error as exc:
            raise translate(exc) from exc
        finally:
            _count_query(time.perf_counter() - started)

    async def act(self, actor: str, action: str, queue: str | None, target: str | None,
                  details: dict[str, Any], op: Statement[T]) -> T:
        """Run one action and its audit entry in one transaction; a refused action is audited as such.

        :raises PyQueueError: the database refused the action.
        """
        pool = await self.pool()
        _count_query(0.0)
        try:
            async with pool.connection(timeout=self.statement_timeout.total_seconds() + 5) as conn:
                async with conn.transaction():
                    result = await run(conn, op)
                    await run(conn, self.statements.audit(actor, action, queue, target,
                                                          {**details, "result": _jsonable(result)}, "ok"))
        except psycopg.Error as exc:
            err = translate(exc)
            audit_log.warning("%s %s queue=%r target=%r details=%r refused: %s %s", actor, action, queue, target,
                              details, err.sqlstate, err.message)
            try:
                await self.read(self.statements.audit(actor, action, queue, target,
                                                      {**details, "error": err.message}, f"error {err.sqlstate}"))
            except PyQueueError as again:
                log.warning("could not write the audit entry of a refused action: %s", again.message)
            raise err from exc
        audit_log.info("%s %s queue=%r target=%r details=%r result=%r", actor, action, queue, target, details, result)
        return result

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own (autocommit, the role and timeout of the pool's)."""
        conn = await psycopg.AsyncConnection.connect(self.dsn, **self.conninfo_options())
        try:
            await self._configure(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def check(self) -> None:
        """Connect, take the role and read the queues once: what ``pyqueue console`` does before it
        listens, so a wrong DSN, role or install fails at start and not on every page.

        :raises PyQueueError: the database refused (its SQLSTATE kept).
        """
        try:
            async with await self.connect() as conn:
                await run(conn, self.statements.metrics())
        except psycopg.Error as exc:
            raise translate(exc) from exc

    async def close(self) -> None:
        """Close the pool and the live updates' connection."""
        await self.hub.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def sample(self, rows: Sequence[dict[str, Any]]) -> None:
        """Keep (time, ready, in flight) of each queue that does not archive, for its chart."""
        now = time.time()
        for row in rows:
            if row.get("archive"):
                continue
            kept = self.samples.setdefault(row["queue"], deque(maxlen=SAMPLES))
            if not kept or now - kept[-1][0] >= 1.0:
                kept.append((now, int(row["ready"] or 0), int(row["in_flight"] or 0)))


def _count_query(seconds: float) -> None:
    counted = _queries.get()
    if counted is not None:
        counted[0] += 1
        counted[1] += seconds


class ResponseHeaders:
    """ASGI middleware adding to every HTTP response :data:`~pyqueue.console.security.SECURITY_HEADERS`
    and a ``Server-Timing`` header (W3C Server Timing) giving the database queries the request ran
    and their time: ``db;dur=12.5;desc="3 queries"``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = [0, 0.0]
        reset = _queries.set(counted)

        async def send_with_timing(message: Any) -> None:
            if message["type"] == "http.response.start":
                value = f'db;dur={counted[1] * 1000:.1f};desc="{int(counted[0])} queries"'
                names = {name for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in SECURITY_HEADERS if h[0] not in names),
                                      (b"server-timing", value.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_timing)
        finally:
            _queries.reset(reset)


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def create_app(
    dsn: str,
    *,
    schema: str | None = None,
    allow_actions: bool = False,
    authenticate: Authenticate | None = None,
    permissions: Permissions | None = None,
    statement_timeout: Seconds = timedelta(seconds=5),
    role: str | None = "",
    title: str = "pgdelayq console",
    pool_size: int = 4,
    csrf_secret: bytes | None = None,
) -> Starlette:
    """The console as an ASGI app, to serve with uvicorn or mount in a Starlette/FastAPI app.

    :param dsn: libpq connection string of the install; best a login holding only ``dq_viewer``
        (read-only) or ``dq_admin`` (with actions).
    :param schema: the install's schema (None: the connection's search_path).
    :param allow_actions: offer the actions (pause, resume, cancel, due now, redrive, purge,
        limits, schedule pause/resume); without it every POST is refused (403) and no form shown.
    :param authenticate: ``authenticate(request) -> user name | None`` (sync or async); None answers
        401. Without it every request is anonymous (the embedding app may authenticate itself).
    :param permissions: ``permissions(user) -> "all" | "read-only" | set of action names``
        (:data:`pyqueue.console.security.ACTIONS`); without it every action is allowed when
        ``allow_actions``.
    :param statement_timeout: the longest any query of the console may run (timedelta or seconds).
    :param role: the role every connection takes with SET ROLE; the default ``""`` takes
        ``dq_admin`` with actions and ``dq_viewer`` without; None keeps the login's role.
    :param csrf_secret: the key of the CSRF tokens (random per process by default; set it when
        several processes serve one console).
    :raises InvalidArgument: a bad statement_timeout or pool_size.
    """
    timeout = as_timedelta(statement_timeout, "statement_timeout")
    if timeout <= timedelta(0):
        raise InvalidArgument(f"statement_timeout must be positive, got {timeout}")
    if pool_size < 1:
        raise InvalidArgument(f"pool_size must be at least 1, got {pool_size}")
    chosen_role = role if role != "" else ("dq_admin" if allow_actions else "dq_viewer")
    console = Console(dsn, schema, allow_actions, authenticate, permissions, timeout, chosen_role, title,
                      pool_size, Csrf(csrf_secret))
    views = Views(console)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await console.close()

    routes = [
        Route("/", views.overview, name="overview"),
        Route("/fragments/overview", views.overview_fragment, name="overview_fragment"),
        Route("/events", views.events, name="events"),
        Route("/metrics", views.metrics, name="metrics"),
        Route("/dead-letters", views.dead_letter_queues, name="dead_letter_queues"),
        Route("/dead-letters/{queue:path}", views.dead_letters, name="dead_letters"),
        Route("/schedules", views.schedules, name="schedules"),
        Route("/health", views.health, name="health"),
        Route("/audit", views.audit, name="audit"),
        Route("/queues/{queue:path}/messages/{id:int}", views.message, name="message"),
        Route("/message", views.message_by_key, name="message_by_key"),
        Route("/queues/{queue:path}", views.queue, name="queue"),
        Route("/actions/{action}", views.action, methods=["POST"], name="action"),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(ResponseHeaders)],
                    lifespan=lifespan)
    app.state.console = console
    return app


def _templates() -> Environment:
    env = Environment(loader=PackageLoader("pyqueue.console", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["ago"] = _ago
    env.filters["at"] = _at
    env.filters["seconds"] = _seconds
    env.filters["count"] = _count
    env.filters["duration"] = _duration
    env.filters["epoch_ago"] = lambda epoch, now: _ago(datetime.fromtimestamp(epoch, UTC), now)
    return env


def _duration(value: timedelta | None) -> str:
    """An interval as people write it: ``1 s``, ``500 ms``, ``7 d``, ``1.5 h``."""
    if value is None:
        return "—"
    s = value.total_seconds()
    if 0 < s < 1:
        return f"{s * 1000:g} ms"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size and (s / size).is_integer():
            return f"{s / size:g} {unit}"
    return f"{s:g} s" if s < 3600 else _seconds(s)


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "—"
    delta = (value - (now or datetime.now(UTC))).total_seconds()
    words = _seconds(abs(delta))
    return f"in {words}" if delta > 0 else f"{words} ago"


def _at(value: datetime | None, zone: str | None = None) -> str:
    if value is None:
        return "—"
    if zone:
        try:
            value = value.astimezone(ZoneInfo(zone))
        except (KeyError, ValueError):
            pass
    else:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S %Z")


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    s = float(value)
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400 * 2:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _count(value: int | None, approximate: bool = False) -> str:
    if value is None:
        return "—"
    text = f"{int(value):,}"
    return f"≈{text}" if approximate and value > 20000 else text


def quoted(value: Any) -> str:
    """A path parameter quoted whole (a queue name may hold ``/``, ``?``, ``#``)."""
    return quote(str(value), safe="")


class Views:
    """The request handlers of one console."""

    def __init__(self, console: Console) -> None:
        self.c = console
        self.env = _templates()

    # -- plumbing --------------------------------------------------------------------------------
    async def _user(self, request: Request) -> str | None:
        return await authenticated_user(self.c.authenticate, request)

    def _url(self, request: Request, name: str, query: dict[str, Any] | None = None, **params: Any) -> str:
        path = request.url_for(name, **{k: quoted(v) if k == "queue" else v for k, v in params.items()}).path
        kept = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        return path + ("?" + urlencode(kept) if kept else "")

    def _csrf_cookie(self, request: Request) -> tuple[str, bool]:
        cookie = request.cookies.get(CSRF_COOKIE)
        if cookie and len(cookie) >= 32:
            return cookie, False
        return Csrf.new_cookie(), True

    async def _page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        try:
            user = await self._user(request)
        except Unauthorized:
            return unauthorized(getattr(self.c.authenticate, "challenge", None))
        cookie, new = self._csrf_cookie(request)
        actions = allowed_actions(self.c.allow_actions, self.c.permissions, user)

        def url(name: str, query: dict[str, Any] | None = None, **params: Any) -> str:
            return self._url(request, name, query, **params)

        html = self.env.get_template(template).render(
            request=request, url=url, title=self.c.title, user=user, actions=actions,
            csrf_token=self.c.csrf.token(cookie), csrf_field=CSRF_FIELD, read_only=not actions,
            notice=request.query_params.get("notice"), error=request.query_params.get("error"),
            static=lambda path: request.url_for("static", path=path).path, now=datetime.now(UTC),
            **context)
        response = HTMLResponse(html, status_code=status)
        if new:
            response.set_cookie(CSRF_COOKIE, cookie, httponly=True, samesite="strict",
                                path=request.scope.get("root_path") or "/", secure=request.url.scheme == "https")
        return response

    async def _guarded(self, request: Request, render: Callable[[], Awaitable[Response]]) -> Response:
        """``render()``, or the error page of a database error (and 401 for a failed login)."""
        try:
            await self._user(request)
        except Unauthorized:
            return unauthorized(getattr(self.c.authenticate, "challenge", None))
        try:
            return await render()
        except PyQueueError as exc:
            status = _status_of(exc)
            return await self._page(request, "error.html", status=status, failure=exc, http_status=status)

    # -- pages -----------------------------------------------------------------------------------
    async def _overview_context(self) -> dict[str, Any]:
        rows = await self.c.read(self.c.statements.metrics())
        self.c.sample(rows)
        archiving = [r["queue"] for r in rows if r.get("archive")]
        buckets: dict[datetime, int] = {}
        for queue in archiving[:20]:
            for b in await self.c.read(self.c.statements.throughput(queue)):
                buckets[b["bucket_start"]] = buckets.get(b["bucket_start"], 0) + int(b["acked"] or 0)
        chart = chart_svg(_minute_series(buckets), "acknowledged per minute, last hour (archiving queues)",
                          element_id="throughput") if archiving else None
        return {"queues": rows, "chart": chart, "archiving": archiving,
                "sampled": {q: list(s) for q, s in self.c.samples.items()}}

    async def overview(self, request: Request) -> Response:
        async def render() -> Response:
            return await self._page(request, "overview.html", **await self._overview_context())
        return await self._guarded(request, render)

    async def overview_fragment(self, request: Request) -> Response:
        async def render() -> Response:
            return await self._page(request, "overview_live.html", **await self._overview_context())
        return await self._guarded(request, render)

    async def queue(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        state = request.query_params.get("state") or None
        prefix = request.query_params.get("prefix") or None
        after_key = request.query_params.get("after_key")
        after_id = _int_or_none(request.query_params.get("after_id"))

        async def render() -> Response:
            if state is not None and state not in STATES:
                raise InvalidArgument(f"state is {state!r}: it must be one of {', '.join(STATES)} or empty")
            rows = [r for r in await self.c.read(self.c.statements.metrics()) if r["queue"] == queue]
            config = await self.c.read(self.c.statements.config(queue))
            page = await self.c.read(self.c.statements.browse(queue, state, prefix, after_key, after_id))
            more = len(page) > PAGE_ROWS
            page = page[:PAGE_ROWS]
            next_query = ({"state": state, "prefix": prefix, "after_key": page[-1]["key"],
                           "after_id": page[-1]["id"]} if more else None)
            stats = rows[0] if rows else None
            chart = None
            if stats and stats.get("archive"):
                series = {b["bucket_start"]: int(b["acked"] or 0)
                          for b in await self.c.read(self.c.statements.throughput(queue))}
                chart = chart_svg(_minute_series(series), "acknowledged per minute, last hour",
                                  element_id="throughput")
            elif queue in self.c.samples and len(self.c.samples[queue]) > 1:
                chart = chart_svg([(datetime.fromtimestamp(t, UTC), ready)
                                   for t, ready, _ in self.c.samples[queue]],
                                  "ready messages, sampled by this console", element_id="throughput")
            return await self._page(request, "queue.html", queue=queue, stats=stats, config=config,
                                    messages=page, next_query=next_query, state=state, prefix=prefix,
                                    states=STATES, chart=chart, first_page=after_key is None)
        return await self._guarded(request, render)

    async def message(self, request: Request) -> Response:
        queue, message_id = request.path_params["queue"], request.path_params["id"]

        async def render() -> Response:
            row = await self.c.read(self.c.statements.detail(queue, message_id))
            if row is None:
                return await self._page(request, "missing.html", status=404, queue=queue, message_id=message_id)
            # Its parents and waiting children (a dead letter has none: dq_dependencies names ordinary
            # messages), at most DEPENDENCY_ROWS of each.
            deps = [] if row["dead_from"] else await self.c.read(self.c.statements.dependencies(queue, row["key"]))
            parents = [d for d in deps if d["relation"] == "parent"]
            children = [d for d in deps if d["relation"] == "child"]
            return await self._page(request, "message.html", queue=queue, m=row, payload=payload_view(row),
                                    parents=parents[:DEPENDENCY_ROWS], children=children[:DEPENDENCY_ROWS],
                                    more_parents=max(len(parents) - DEPENDENCY_ROWS, 0),
                                    more_children=max(len(children) - DEPENDENCY_ROWS, 0))
        return await self._guarded(request, render)

    async def message_by_key(self, request: Request) -> Response:
        """``/message?queue=…&key=…`` (the links of a message's parents and children): redirects to the
        page of the ordinary message with this key in the queue, else of its dead letter (in the queue's
        dead-letter queue); "missing" when there is neither."""
        queue = request.query_params.get("queue") or ""
        key = request.query_params.get("key") or ""

        async def render() -> Response:
            page = await self.c.read(self.c.statements.browse(queue, None, key, None, None, max_rows=1))
            found = next((r for r in page if r["key"] == key and not r["dead_from"]), None)
            where = queue
            if found is None:
                config = await self.c.read(self.c.statements.config(queue))
                where = (config or {}).get("dead_letter_queue") or ""
                if where:
                    dead = await self.c.read(self.c.statements.browse(where, "dead", key, None, None))
                    found = next((r for r in dead if r["key"] == key and r["dead_from"] == queue), None)
            if found is None:
                return await self._page(request, "missing.html", status=404, queue=queue, key=key)
            return RedirectResponse(self._url(request, "message", queue=where, id=found["id"]), status_code=302)
        return await self._guarded(request, render)

    async def dead_letter_queues(self, request: Request) -> Response:
        async def render() -> Response:
            rows = [r for r in await self.c.read(self.c.statements.metrics()) if r.get("is_dead_letter_queue")]
            return await self._page(request, "dead_letter_queues.html", queues=rows)
        return await self._guarded(request, render)

    async def dead_letters(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        dead_from = request.query_params.get("dead_from") or None
        last_error = request.query_params.get("last_error")
        after_key = request.query_params.get("after_key")
        after_id = _int_or_none(request.query_params.get("after_id"))

        async def render() -> Response:
            groups = await self.c.read(self.c.statements.dead_letter_groups(queue))
            page = await self.c.read(self.c.statements.browse(queue, "dead", None, after_key, after_id))
            more = len(page) > PAGE_ROWS
            page = page[:PAGE_ROWS]
            matching = await self.c.read(self.c.statements.count_dead_letters(queue, dead_from, last_error))
            next_query = ({"dead_from": dead_from, "last_error": last_error, "after_key": page[-1]["key"],
                           "after_id": page[-1]["id"]} if more else None)
            return await self._page(request, "dead_letters.html", queue=queue, groups=groups, letters=page,
                                    next_query=next_query, dead_from=dead_from, last_error=last_error,
                                    matching=matching)
        return await self._guarded(request, render)

    async def schedules(self, request: Request) -> Response:
        async def render() -> Response:
            rows = await self.c.read(self.c.statements.schedules())
            tick: dict[str, Any] = {}
            for r in await self.c.read(self.c.statements.health()):
                if r["component"] == "cron_job" and "cron-tick" in (r["name"] or ""):
                    tick = {**tick, "name": r["name"], r["figure"]: r}
            return await self._page(request, "schedules.html", schedules=rows, tick=tick)
        return await self._guarded(request, render)

    async def health(self, request: Request) -> Response:
        async def render() -> Response:
            rows = await self.c.read(self.c.statements.health())
            return await self._page(request, "health.html", health=health_view(rows, datetime.now(UTC)))
        return await self._guarded(request, render)

    async def audit(self, request: Request) -> Response:
        before_id = _int_or_none(request.query_params.get("before_id"))

        async def render() -> Response:
            rows = await self.c.read(self.c.statements.audit_entries(before_id))
            more = len(rows) > PAGE_ROWS
            rows = rows[:PAGE_ROWS]
            return await self._page(request, "audit.html", entries=rows,
                                    next_query={"before_id": rows[-1]["id"]} if more else None)
        return await self._guarded(request, render)

    async def metrics(self, request: Request) -> Response:
        """The queue and table figures in the Prometheus text format (as ``pyqueue metrics``)."""
        try:
            await self._user(request)
        except Unauthorized:
            return unauthorized(getattr(self.c.authenticate, "challenge", None))
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from ..metrics import scrape_families

        started = time.perf_counter()
        queues = health = None
        try:
            queues = await self.c.read(self.c.statements.metrics())
            health = await self.c.read(self.c.statements.health())
        except PyQueueError as exc:
            log.warning("metrics: %s", exc.message)
            queues = None
        families = list(scrape_families(queues, health, time.perf_counter() - started))

        class _Once:
            def collect(self) -> Any:
                return families

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Once())
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def events(self, request: Request) -> Response:
        """Server-sent events: ``refresh`` when the queues changed (debounced), a comment as keep-alive."""
        try:
            await self._user(request)
        except Unauthorized:
            return unauthorized(getattr(self.c.authenticate, "challenge", None))
        from sse_starlette.sse import EventSourceResponse

        return EventSourceResponse(self.c.hub.subscribe(request), ping=15)

    # -- actions ---------------------------------------------------------------------------------
    async def action(self, request: Request) -> Response:
        action = request.path_params["action"]
        try:
            user = await self._user(request)
        except Unauthorized:
            return unauthorized(getattr(self.c.authenticate, "challenge", None))
        if not same_origin(request.headers):
            return PlainTextResponse("403 Forbidden: a cross-site request (Sec-Fetch-Site) is refused.\n", 403)
        form = await request.form()
        if not self.c.csrf.valid(request.cookies.get(CSRF_COOKIE), _field(form, CSRF_FIELD)):
            return PlainTextResponse("403 Forbidden: missing or wrong CSRF token; reload the page.\n", 403)
        allowed = allowed_actions(self.c.allow_actions, self.c.permissions, user)
        if action not in allowed:
            return PlainTextResponse(f"403 Forbidden: this console does not allow {action!r}"
                                     + (" for you" if self.c.allow_actions else " (read-only)") + ".\n", 403)
        actor = f"{user or 'anonymous'}@{request.client.host if request.client else '?'}"
        back = _back(request, _field(form, "back"))
        try:
            notice = await self._do(action, actor, form, request)
        except PyQueueError as exc:
            return RedirectResponse(_with(back, error=f"{action} refused: {exc.message} (SQLSTATE {exc.sqlstate})"),
                                    303)
        except _Refused as exc:
            await self._audit_refusal(actor, action, form, str(exc))
            return RedirectResponse(_with(back, error=str(exc)), 303)
        return RedirectResponse(_with(back, notice=notice), 303)

    async def _audit_refusal(self, actor: str, action: str, form: FormData, reason: str) -> None:
        """Record an action the console refused before calling the database (a confirmation that
        did not match): the audit log shows attempts too."""
        queue, target = _field(form, "queue"), _field(form, "key") or _field(form, "name")
        audit_log.warning("%s %s queue=%r target=%r refused: %s", actor, action, queue, target, reason)
        try:
            await self.c.read(self.c.statements.audit(actor, action, queue, target, {"reason": reason}, "refused"))
        except PyQueueError as exc:
            log.warning("could not write the audit entry of a refused action: %s", exc.message)

    async def _do(self, action: str, actor: str, form: FormData, request: Request) -> str:
        c = self.c
        queue = _field(form, "queue")
        key = _field(form, "key")
        qs = QueueStatements(queue, c.schema, _SERIALIZERS) if queue else None

        def need_queue() -> QueueStatements:
            if qs is None:
                raise _Refused(f"{action}: no queue given")
            return qs

        if action == "pause":
            changed = await c.act(actor, action, queue, None, {}, need_queue().pause())
            return f"Paused {queue}." if changed else f"{queue} was already paused."
        if action == "resume":
            changed = await c.act(actor, action, queue, None, {}, need_queue().resume())
            return f"Resumed {queue}." if changed else f"{queue} was not paused."
        if action == "cancel":
            done = await c.act(actor, action, queue, key, {}, need_queue().cancel(key or ""))
            return f"Cancelled {key} in {queue}." if done else f"No message {key} in {queue} any more."
        if action == "due_now":
            done = await c.act(actor, action, queue, key, {}, c.statements.make_due(need_queue().queue, key or ""))
            return (f"{key} in {queue} is due now." if done
                    else f"{key} in {queue} was not scheduled for later (in flight, due, dead or gone): unchanged.")
        if action == "purge":
            if _field(form, "confirm") != queue:
                raise _Refused(f"purge refused: type the queue's name ({queue}) exactly to confirm")
            n = await c.act(actor, action, queue, None, {}, need_queue().purge(True))
            return f"Purged {n:,} messages from {queue}."
        if action == "configure":
            settings = _limits(form)
            if not settings["settings"] and not settings["clear"]:
                raise _Refused("configure: change at least one setting")
            await c.act(actor, action, queue, None, {k: describe(v) for k, v in settings["settings"].items()}
                        | {"clear": settings["clear"]}, need_queue().configure(**_configure_args(settings)))
            return f"Changed the settings of {queue}."
        if action == "redrive":
            ids = [int(v) for v in form.getlist("id") if isinstance(v, str) and v.isdigit()]
            if _field(form, "mode") == "matching":
                dead_from = _field(form, "dead_from") or None
                last_error = _field(form, "last_error")
                counted = await c.read(c.statements.count_dead_letters(need_queue().queue, dead_from, last_error))
                if _field(form, "confirm_count") != str(counted):
                    raise _Refused(f"redrive refused: {counted:,} dead letters match now; type that number to "
                                   "confirm")
                n = await c.act(actor, action, queue, None, {"dead_from": dead_from, "last_error": last_error,
                                                             "confirmed": counted},
                                c.statements.redrive_matching(need_queue().queue, dead_from, last_error,
                                                              max(counted, 1)))
                return f"Redrove {n:,} dead letters."
            if not ids:
                raise _Refused("redrive: select at least one dead letter")
            n = await c.act(actor, action, queue, ",".join(map(str, ids[:20])), {"ids": len(ids)},
                            c.statements.redrive_ids(need_queue().queue, ids))
            return f"Redrove {n:,} of {len(ids):,} dead letters."
        if action in ("schedule_pause", "schedule_resume"):
            name = _field(form, "name") or ""
            op = c.common.cron_pause(name) if action == "schedule_pause" else c.common.cron_resume(name)
            done = await c.act(actor, action, None, name, {}, op)
            verb = "Paused" if action == "schedule_pause" else "Resumed"
            return f"{verb} schedule {name}." if done else f"No schedule named {name}."
        raise _Refused(f"unknown action {action!r}")


_SERIALIZERS = SerializerRegistry.default()


class _Refused(Exception):
    """An action refused before it reached the database (a confirmation that does not match)."""


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _back(request: Request, back: str | None) -> str:
    """Where an action redirects: the path the form names when it is one of this console's pages
    (never another site: no scheme, no host, no ``//``), else the overview."""
    root = (request.scope.get("root_path") or "").rstrip("/") + "/"
    path = (back or "").split("?", 1)[0]
    if back and path.startswith(root) and not path.startswith("//") and "\\" not in path and ":" not in path:
        return back
    return root


def _with(url: str, **query: str) -> str:
    """``url`` with ``query`` in place of any earlier notice or error."""
    path, _, old = url.partition("?")
    kept = [(k, v) for k, v in parse_qsl(old) if k not in ("notice", "error")]
    return path + "?" + urlencode([*kept, *query.items()])


#: The limits the queue page's form may change, and how each is read.
LIMIT_FIELDS = ("max_deliveries", "max_in_flight", "rate_limit", "rate_period", "max_payload_bytes")


def _limits(form: FormData) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    clear: list[str] = []
    for name in LIMIT_FIELDS:
        text = (_field(form, name) or "").strip()
        if not text:
            continue
        if text.lower() in ("none", "clear", "default"):
            clear.append(name)
        elif name == "rate_period":
            settings[name] = text
        else:
            try:
                settings[name] = int(text)
            except ValueError:
                raise _Refused(f"configure: {name} must be a whole number, got {describe(text)!r}") from None
    return {"settings": settings, "clear": clear}


def _configure_args(parsed: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {"max_deliveries": None, "dead_letter_queue": None, "archive": None, "retention": None,
                            "notify": None, "max_payload_bytes": None, "max_in_flight": None, "rate_limit": None,
                            "rate_period": None, "clear": parsed["clear"]}
    for name, value in parsed["settings"].items():
        args[name] = parse_duration(value, "rate_period") if name == "rate_period" else value
    return args


def _minute_series(buckets: dict[datetime, int]) -> list[tuple[datetime, int]]:
    """Sixty one-minute buckets ending now, zero where the archive has none."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    by_minute = {b.astimezone(UTC).replace(second=0, microsecond=0): n for b, n in buckets.items()}
    return [(t, by_minute.get(t, 0)) for t in (now - timedelta(minutes=59 - i) for i in range(60))]


def _status_of(exc: PyQueueError) -> int:
    state = exc.sqlstate or ""
    if state == "42501":
        return 403
    if state.startswith("22") or state.startswith("54"):
        return 400
    if state == "57014":
        return 504
    return 503 if state.startswith("08") or state == "" else 500
