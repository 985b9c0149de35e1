"""Command line: ``pyqueue migrate | offer | poll | ack | worker | stats | metrics | next-due | queue | cron``.

``pyqueue migrate --dsn DSN`` installs or upgrades the database (same as ``yoyo apply``).
The DSN defaults to the ``DQ_DSN`` environment variable. Every command takes ``--schema NAME``,
the schema of the install (default: the names are resolved by the connection's search_path).

Bad arguments end in one line on stderr and exit status 2, never a traceback: numbers and
durations are checked by the library's own checks (:func:`pyqueue.durations.as_timedelta`,
``check_int``) as the arguments are parsed, the rest by the library or the database
(:class:`pyqueue.PyQueueError`). Text that producers control (queue names, keys, error texts,
payloads, schedule names) is printed with its control characters escaped (:func:`shown`,
:func:`json_line`), so it cannot move the cursor, retitle or clear the operator's terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn

import psycopg

from . import cron as cron_api
from .core.checks import check_int
from .drivers.signals import stop_signals
from .durations import parse_duration
from .errors import InvalidArgument, PyQueueError, translating
from .limits import POLL_MAX_COUNT
from .migrate import migrate, pending
from .sync.client import DelayedQueue
from .sync.worker import Worker


class UsageError(Exception):
    """A command's argument the parser could not judge (a handler that does not import, a payload
    that is not JSON, no DSN): :func:`main` prints ``pyqueue COMMAND: message`` as one line and
    exits with 2."""

    def __init__(self, message: str, command: str | None = None) -> None:
        super().__init__(message)
        self.command = command


#: Characters a terminal acts on instead of showing (a regular expression's character class): the
#: C0 controls (ESC, BEL, CR, LF, ...), DEL, the C1 controls (U+0080 to U+009F: CSI U+009B and OSC
#: U+009D start escape sequences on their own), the line and paragraph separators, and the Unicode
#: bidirectional controls, which reorder the text after them (CVE-2021-42574, "Trojan Source").
_UNSAFE_CHARS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{_UNSAFE_CHARS}]")
_UNSAFE_OR_BACKSLASH = re.compile(f"[{_UNSAFE_CHARS}\\\\]")
_SHORT_ESCAPES = {"\n": r"\n", "\r": r"\r", "\t": r"\t", "\\": "\\\\"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    return _SHORT_ESCAPES.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) <= 0xFF else f"\\u{ord(ch):04x}")


def shown(text: str) -> str:
    """``text`` safe to print on a terminal, on one line: each character a terminal would act on
    (:data:`_UNSAFE_CHARS`) as a Python escape (``\\x1b``, ``\\r``, ``\\u202e``), and a backslash
    doubled, so an escape shown and the same characters typed stay apart. Every table and every
    error line of the CLI goes through it."""
    return _UNSAFE_OR_BACKSLASH.sub(_escape, text)


def json_line(value: object) -> str:
    """``value`` as one line of JSON for the CLI's listings: non-ASCII text as itself, but each
    character a terminal would act on as a JSON escape (``\\u001b``; JSON escapes most of them
    already, not DEL, the C1 controls or the bidirectional ones), so the line is safe on a
    terminal and parses back to the same value."""
    text = json.dumps(value, default=_json_default, ensure_ascii=False)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _dsn(args: argparse.Namespace) -> str:
    dsn: str | None = args.dsn or os.environ.get("DQ_DSN")
    if not dsn:
        raise UsageError("pass --dsn or set DQ_DSN")
    return dsn


def _cmd_migrate(args: argparse.Namespace) -> int:
    dsn = _dsn(args)
    if args.dry_run:
        print("pending:", ", ".join(pending(dsn, schema=args.schema or "public")) or "nothing")
        return 0
    applied = migrate(dsn, schema=args.schema or "public")
    print("applied:", ", ".join(applied) or "no schema step pending", "; functions of sql/ checked")
    return 0


def _payload(text: str, as_json: bool, as_text: bool, command: str) -> object:
    """The payload of ``--payload``: JSON (payload_type json) when the text parses as JSON, unless
    ``--text``; with ``--json`` text that is not JSON is an error."""
    if as_text:
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        if as_json:
            raise UsageError(f"--payload is not JSON ({exc}); drop --json to store it as text", command) from None
        return text


def _cmd_offer(args: argparse.Namespace) -> int:
    payload = _payload(args.payload, args.json, args.text, "offer")
    with DelayedQueue(_dsn(args), args.queue, pool_size=1, schema=args.schema) as q:
        outcome = q.offer(args.key, payload, delay=args.delay, can_update=not args.no_update)
    print(outcome.value)
    print(f"payload_type {q.serializers.infer_type(payload)}", file=sys.stderr)
    return 0


def _cmd_poll(args: argparse.Namespace) -> int:
    with DelayedQueue(_dsn(args), args.queue, pool_size=1, schema=args.schema) as q:
        messages = q.poll(args.max_count, lock_timeout=args.lock_timeout, wait=args.wait)
        for m in messages:
            print(json_line({"key": m.key, "payload_type": m.payload_type,
                             "payload": m.raw_payload.decode("utf-8", "backslashreplace"),
                             "scheduled_at": m.scheduled_at.isoformat(),
                             "delivery_count": m.delivery_count, "lock_token": str(m.lock_token),
                             "locked_until": m.locked_until.isoformat()}))
        if args.ack:
            q.ack_many(messages)
        elif messages:
            print(f"pyqueue poll: {len(messages)} message(s) stay locked until acknowledged "
                  f"(pyqueue ack --queue {shown(args.queue)} LOCK_TOKEN...) or until their lock expires "
                  f"(locked_until; then they are delivered again)", file=sys.stderr)
    return 0


def _cmd_ack(args: argparse.Namespace) -> int:
    """Acknowledge deliveries by lock token; exit 1 when some token no longer held its message."""
    with DelayedQueue(_dsn(args), args.queue, pool_size=1, schema=args.schema) as q:
        acked = q.ack_many(args.lock_tokens)
    print(f"acknowledged {acked} of {len(args.lock_tokens)}")
    if acked < len(args.lock_tokens):
        print("pyqueue ack: a token whose lock expired (or was acknowledged already) acknowledges nothing",
              file=sys.stderr)
        return 1
    return 0


def _cmd_next_due(args: argparse.Namespace) -> int:
    with DelayedQueue(_dsn(args), args.queue, pool_size=1, schema=args.schema) as q:
        due = q.next_due()
    print(due.isoformat() if due else "empty")
    return 0


def _load_handler(spec: str) -> Any:
    """Import ``package.module:function`` from the current directory or PYTHONPATH. Raises
    :class:`UsageError` (one line, exit 2) when the module does not import (missing, or raising
    while it is imported), lacks the attribute, or the attribute is not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"the handler must be package.module:function, got {spec!r}", "worker")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # the module's own import-time error, whatever it is, is the user's to fix
        raise UsageError(f"the handler's module {module_name!r} does not import: {type(exc).__name__}: {exc}",
                         "worker") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"the handler {spec!r} does not exist: {module_name} has no attribute {attr!r}",
                             "worker") from None
    if not callable(obj):
        raise UsageError(f"the handler {spec!r} is not callable (a {type(obj).__name__})", "worker")
    return obj


def _cmd_worker(args: argparse.Namespace) -> int:
    """Run a Worker (or with --async an AsyncWorker) until a signal. The first SIGTERM/SIGINT stops
    it (running handlers get --shutdown-grace); a second one exits the process at once with status
    1 (the messages of handlers still running are redelivered when their locks expire)."""
    logging.basicConfig(level=getattr(logging, args.log_level), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    handler = _load_handler(args.handler)
    settings: dict[str, Any] = {
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "prefetch": args.prefetch,
        "lock_timeout": args.lock_timeout,
        "idle_check": args.idle_check,
        "shutdown_grace": args.shutdown_grace,
        "cron_tick": args.cron_tick,
    }
    stop_metrics = None
    if args.metrics_port is not None:
        from .metrics import WorkerMetrics, serve

        settings["metrics"] = WorkerMetrics()
        stop_metrics = _serving(lambda: serve(_global_registry(), args.metrics_port, args.metrics_host), "worker")
    try:
        return _run_worker(args, handler, settings)
    finally:
        if stop_metrics is not None:
            stop_metrics()


def _global_registry() -> Any:
    from prometheus_client import REGISTRY

    return REGISTRY


def _serving(start: Callable[[], Callable[[], None]], command: str) -> Callable[[], None]:
    """Start a metrics server (``start()`` returns its stop function); a port that cannot be bound is
    a usage error of ``command``."""
    try:
        return start()
    except OSError as exc:
        raise UsageError(f"cannot serve metrics: {exc.strerror or exc}", command) from None


def _run_worker(args: argparse.Namespace, handler: Callable[..., Any], settings: dict[str, Any]) -> int:
    if args.use_async:
        from .aio import AsyncDelayedQueue, AsyncWorker

        async def main() -> None:
            pool_size = args.concurrency + 3
            aq = AsyncDelayedQueue(_dsn(args), args.queue, pool_size=pool_size, schema=args.schema)
            try:  # opened by the worker's first poll: see below
                worker = AsyncWorker(aq, handler, **settings)
                with stop_signals(_first_stops_second_exits(worker)):
                    await worker.run(install_signal_handlers=False)
            finally:
                await aq.close()

        asyncio.run(main())
        return 0
    # Not `with q`, which would open the queue here: the worker's first poll opens it, so that a
    # server not answering yet is waited for as the worker waits for one gone (a restart), while a
    # refusal for good (wrong password, role, database) ends the command at once (status 2).
    q = DelayedQueue(_dsn(args), args.queue, pool_size=args.concurrency + 3, schema=args.schema)
    try:
        worker = Worker(q, handler, **settings)
        with stop_signals(_first_stops_second_exits(worker)):
            worker.run(install_signal_handlers=False)
    finally:
        q.close()
    return 0


def _first_stops_second_exits(worker: Worker | Any) -> Callable[[int], None]:
    """The signal handler of ``pyqueue worker``: the first signal calls ``worker.stop()``, the next
    exits the process at once (status 1), even during the grace period."""
    log = logging.getLogger("pyqueue.worker")
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) > 1:
            log.warning("second signal %s: exiting now; locks of running messages will expire", signum)
            logging.shutdown()
            os._exit(1)
        log.info("signal %s: stopping (grace %.0f s)", signum, worker.shutdown_grace)
        worker.stop()

    return on_signal


#: The columns of ``pyqueue stats`` in display order: header, and the cell of a row (a QueueStats).
#: "blocked" is shown only when some queue shown has blocked messages (:data:`_STATS_WHEN_ANY`).
_STATS_COLUMNS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("ready", lambda r: f"{'~' if r.approximate else ''}{r.ready:,}"),
    ("scheduled", lambda r: f"{'~' if r.approximate else ''}{r.scheduled:,}"),
    ("in flight", lambda r: f"{r.in_flight:,}"),
    ("blocked", lambda r: f"{r.blocked:,}"),
    ("redelivered", lambda r: f"{r.redelivered:,}"),
    ("dead", lambda r: f"{r.dead:,}"),
    ("held", lambda r: f"{'~' if r.approximate else ''}{r.held:,}"),
    ("expired", lambda r: f"{'~' if r.approximate else ''}{r.expired:,}"),
    ("oldest ready", lambda r: "-" if r.oldest_ready_age is None else str(r.oldest_ready_age).split(".")[0]),
    ("next due", lambda r: r.next_due.isoformat(timespec="seconds") if r.next_due else "-"),
    ("acked/min", lambda r: "-" if r.acked_last_minute is None else f"{r.acked_last_minute:,}"),
    ("acked/h", lambda r: "-" if r.acked_last_hour is None else f"{r.acked_last_hour:,}"),
    ("paused", lambda r: "yes" if r.paused else "no"),
)
#: Which columns a narrow terminal loses first (the queue, ready, scheduled, in flight and dead stay).
_STATS_DROP_ORDER = ("acked/h", "next due", "held", "expired", "acked/min", "redelivered", "oldest ready",
                     "paused", "blocked")
#: Columns shown only when some row's figure of that name (a QueueStats attribute) is not 0.
_STATS_WHEN_ANY = ("blocked",)


def _stats_title(rows: list[Any]) -> str:
    """The title of ``pyqueue stats``: the time, and ``(~ estimated)`` only when a figure is."""
    estimated = " (~ estimated)" if any(r.approximate for r in rows) else ""
    return f"dq_stats at {datetime.now().astimezone().isoformat(timespec='seconds')}{estimated}"


def _stats_table(rows: list[Any], title: str, width: int | None = None) -> Any:
    """The stats as a rich table that fits ``width`` terminal columns (None: no limit): the least
    needed columns are left out (and named in the caption) until it fits; a queue name never
    loses characters: one longer than the room left folds onto the next line. A queue name is
    shown with its control characters escaped (:func:`shown`) and its brackets as they are."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    # Left out: first the columns of figures no row has (not named in the caption), then to fit.
    dropped: list[str] = [name for name in _STATS_WHEN_ANY if not any(getattr(r, name) for r in rows)]
    hidden = len(dropped)

    def build() -> Table:
        caption = f"left out to fit {width} columns: {', '.join(dropped[hidden:])}" if dropped[hidden:] else None
        table = Table(title=title, caption=caption)
        table.add_column("queue", justify="left", overflow="fold")
        kept = [(name, cell) for name, cell in _STATS_COLUMNS if name not in dropped]
        for name, _ in kept:
            table.add_column(name, justify="right", no_wrap=True)
        for r in rows:
            # Text, not a str: a queue name is data, never rich markup; shown() escapes its controls.
            table.add_row(Text(shown(r.queue)), *(cell(r) for _, cell in kept))
        return table

    table = build()
    if width is None:
        return table
    console = Console(width=width)
    unbounded = console.options.update_width(1_000_000)  # measured without the terminal's limit
    for name in (n for n in _STATS_DROP_ORDER if n not in dropped):
        # It fits when its natural width (every name and figure whole, on one line) is within the width.
        if Measurement.get(console, unbounded, table).maximum <= width:
            break
        dropped.append(name)
        table = build()
    return table


def _cmd_stats(args: argparse.Namespace) -> int:
    """The dq_stats view as a table; with --watch, refreshed in place until Ctrl-C."""
    import psycopg
    from rich.console import Console
    from rich.live import Live

    from .sync.client import all_stats

    console = Console()
    with translating(), psycopg.connect(_dsn(args), autocommit=True) as conn:
        def render() -> Any:
            rows = [r for r in all_stats(conn, schema=args.schema) if args.queue is None or r.queue == args.queue]
            return _stats_table(rows, _stats_title(rows), console.width)

        if not args.watch:
            console.print(render())
            return 0
        # Ctrl-C / SIGTERM only set a flag that the loop checks between refreshes: a KeyboardInterrupt
        # raised inside a query or a redraw could leave either half done (a CI run once hung there).
        stop = threading.Event()
        with stop_signals(lambda _: stop.set()), Live(render(), console=console, auto_refresh=False) as live:
            while not stop.wait(args.interval.total_seconds()):
                live.update(render(), refresh=True)
        return 0


def _cmd_metrics(args: argparse.Namespace) -> int:
    """Serve the queues' and tables' figures for Prometheus at http://HOST:PORT/metrics until
    SIGTERM/SIGINT (:class:`pyqueue.metrics.QueueMetricsCollector`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from .metrics import queue_registry, serve

    registry = queue_registry(_dsn(args), schema=args.schema, statement_timeout=args.statement_timeout)
    stop = threading.Event()
    stop_server = _serving(lambda: serve(registry, args.port, args.host), "metrics")
    logging.getLogger("pyqueue.metrics").info("serving http://%s:%d/metrics", args.host, args.port)
    try:
        with stop_signals(lambda _: stop.set()):
            stop.wait()
    finally:
        stop_server()
    return 0


def _cmd_console(args: argparse.Namespace) -> int:
    """Serve the web console (:func:`pyqueue.console.create_app`) with uvicorn until SIGTERM/SIGINT.
    Off loopback it refuses to start without credentials from the environment."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from .console.security import PASSWORD_ENV, TOKEN_ENV, USER_ENV, Credentials, is_loopback

    try:
        credentials = Credentials.from_environment()
    except ValueError as exc:
        print(f"pyqueue console: {exc}", file=sys.stderr)
        return 2
    if credentials is None and not is_loopback(args.host):
        print(f"pyqueue console: refusing to listen on {args.host} without authentication: set {TOKEN_ENV} "
              f"(clients send 'Authorization: Bearer <token>'), or {USER_ENV} and {PASSWORD_ENV} (HTTP basic), "
              "or listen on 127.0.0.1", file=sys.stderr)
        return 2
    import asyncio
    import socket

    import uvicorn

    from .console import create_app
    app = create_app(_dsn(args), schema=args.schema, allow_actions=args.allow_actions, authenticate=credentials,
                     statement_timeout=args.statement_timeout)
    console = app.state.console
    try:
        asyncio.run(console.check())
    except PyQueueError as exc:
        hint = (f" (the login must be granted {console.role}: GRANT {console.role} TO <login>)"
                if exc.sqlstate in ("42501", "22023") else "")
        print(f"pyqueue console: cannot read the queues as {console.role}: {exc.message}{hint}", file=sys.stderr)
        return 2
    # The socket is bound here, so the line below names the port (0: a free one) and is printed
    # only once connections are accepted (they wait in the backlog until uvicorn serves them).
    host = args.host.strip("[]")
    sock = socket.create_server((host, args.port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, proxy_headers=False, server_header=False,
                            timeout_graceful_shutdown=5)
    print(f"pgdelayq console listening on http://{args.host}:{port}/"
          f" ({'actions allowed' if args.allow_actions else 'read-only'}"
          f"{', authentication required' if credentials else ''})", file=sys.stderr, flush=True)
    with sock:
        uvicorn.Server(config).run(sockets=[sock])
    return 0


def _cmd_queue(args: argparse.Namespace) -> int:
    """``pyqueue queue pause|resume|configure NAME``: a queue's delivery controls (role dq_admin)."""
    with DelayedQueue(_dsn(args), args.name, pool_size=1, schema=args.schema) as q:
        if args.queue_command == "pause":
            print("paused" if q.pause() else "already paused")
        elif args.queue_command == "resume":
            print("resumed" if q.resume() else "was not paused")
        elif args.queue_command == "redrive":
            moved = q.redrive(args.max_count)
            print(f"moved {moved} dead letter(s) back to the queues they died in")
        elif args.queue_command == "dead-letters":
            rows = q.dead_letters(args.max_rows)
            for row in rows:
                print(json_line(row))
            print(f"{len(rows)} dead letter(s) in {args.name!r}, oldest first"
                  + (f" (the first {args.max_rows}; --max-rows for more)" if len(rows) == args.max_rows else ""),
                  file=sys.stderr)
        else:  # configure
            settings = {name: getattr(args, name) for name in _CONFIGURE}
            clear = [name.replace("-", "_") for name in args.clear or ()]
            if all(v is None for v in settings.values()) and not clear:
                print("pyqueue queue configure: give at least one of "
                      + ", ".join("--" + name.replace("_", "-") for name in (*_CONFIGURE, "clear")), file=sys.stderr)
                return 2
            q.configure(**settings, clear=clear)
            print("ok")
    return 0


#: The settings of ``pyqueue queue configure``: the parameters of ``DelayedQueue.configure``.
_CONFIGURE = ("max_deliveries", "dead_letter_queue", "archive", "retention", "notify", "max_payload_bytes",
              "max_in_flight", "rate_limit", "rate_period")


def _json_default(value: object) -> str:
    """Timestamps in ISO 8601 for the JSON lines of the CLI."""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class Duration:
    """The argparse type of a duration option: seconds (``30``, ``1.5``) or a number with a unit
    (``500ms``, ``30s``, ``2m``, ``1h``), checked by the library's own rule
    (:func:`pyqueue.durations.as_timedelta`: finite, not negative, within what a timedelta holds;
    positive unless ``allow_zero``) and at most ``maximum`` when given."""

    def __init__(self, *, allow_zero: bool = False, maximum: timedelta | None = None) -> None:
        self.allow_zero = allow_zero
        self.maximum = maximum

    def __call__(self, text: str) -> timedelta:
        try:
            value = parse_duration(text, "the duration", allow_zero=self.allow_zero)
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}" if "not a duration" not in str(exc)
                                             else f"not a duration: {text!r} (seconds, or a number with ms, s, m "
                                             "or h: 500ms, 30s, 2m, 1h)") from None
        if self.maximum is not None and value > self.maximum:
            raise argparse.ArgumentTypeError(f"{text!r}: the duration is at most {self.maximum}")
        return value


class Integer:
    """The argparse type of a count option: a whole number from ``lo`` to ``hi`` (by default those
    of a PostgreSQL integer: a value the library or the database then checks against the
    option's own limit), checked by the library's ``check_int``."""

    def __init__(self, lo: int = -2**31, hi: int = 2**31 - 1) -> None:
        self.lo, self.hi = lo, hi

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        try:
            return int(check_int(value, "the number", self.lo, self.hi))
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``pyqueue offer: error: argument --delay: ...``),
    the value it echoes escaped (:func:`shown`); exit status 2 as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {shown(message)} (see {self.prog} --help)\n")


def _cmd_cron(args: argparse.Namespace) -> int:
    dsn = _dsn(args)
    schema = args.schema
    if args.cron_command == "tick" and args.every is not None:
        return _cron_tick_loop(dsn, args.every, schema)
    with translating(), psycopg.connect(dsn, autocommit=True) as conn:
        if args.cron_command == "tick":
            print(cron_api.tick(conn, schema=schema))
        elif args.cron_command == "install":
            payload: object = _payload(args.payload, args.json, False, "cron install") if args.json else args.payload
            print(cron_api.install(conn, args.name, args.queue, args.schedule, payload, timezone=args.timezone,
                                   payload_type=args.payload_type, lookahead=args.lookahead, schema=schema))
        elif args.cron_command in ("uninstall", "pause", "resume"):
            done = getattr(cron_api, args.cron_command)(conn, args.name, schema=schema)
            if not done:
                print(f"pyqueue cron {args.cron_command}: no schedule named {args.name!r}", file=sys.stderr)
                return 1
            print("ok")
        else:  # list
            for s in cron_api.schedules(conn, schema=schema):
                print(json_line({"name": s.name, "queue": s.queue, "schedule": s.schedule, "timezone": s.timezone,
                                 "payload_type": s.payload_type, "lookahead_s": s.lookahead.total_seconds(),
                                 "config_hash": s.config_hash, "paused": s.paused,
                                 "next": [t.isoformat() for t in s.next_occurrences]}))
    return 0


def _cron_tick_loop(dsn: str, every: timedelta, schema: str | None) -> int:
    """Tick every ``every`` with a CronTicker until SIGINT or SIGTERM; exit 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    with stop_signals(lambda _: stop.set()):
        ticker = cron_api.CronTicker(dsn, every=every, on_tick=lambda n: print(n, flush=True), schema=schema)
        ticker.start()
        while not stop.wait(0.5):
            if not ticker.is_alive():  # pragma: no cover - the thread only ends when stopped
                return 1
        ticker.stop(timeout=30)
    return 0


def _version() -> str:
    """The installed version of the distribution pgdelayq (its package metadata)."""
    try:
        return importlib.metadata.version("pgdelayq")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (pgdelayq is not installed; running from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pyqueue", description="Delayed message queue in PostgreSQL")
    parser.add_argument("--version", action="version", version=f"pyqueue (pgdelayq) {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    # The options of every command (the cron subcommands included).
    common = _Parser(add_help=False)
    common.add_argument("--dsn", help="libpq connection string (default: $DQ_DSN)")
    common.add_argument("--schema", default=None,
                        help="schema of the install (default: names resolved by the connection's search_path)")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, parents=[common])

    p = add("migrate", "install or upgrade the schema and functions")
    p.add_argument("--dry-run", action="store_true", help="list pending schema steps only")
    p.set_defaults(func=_cmd_migrate)

    p = add("offer", "offer one message")
    p.add_argument("--queue", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--payload", required=True)
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--json", action="store_true", help="the payload must be JSON (an error otherwise)")
    kind.add_argument("--text", action="store_true",
                      help="store the payload as text even when it is JSON (default: JSON text is stored as "
                           "payload_type json, anything else as text)")
    p.add_argument("--delay", type=Duration(allow_zero=True), default=timedelta(0),
                   help="seconds from now (database clock), or 500ms, 30s, 2m, 1h")
    p.add_argument("--no-update", action="store_true", help="ignore if the key exists")
    p.set_defaults(func=_cmd_offer)

    p = add("poll", "poll due messages and print them as JSON lines (with their lock_token); they stay locked "
                    "until acknowledged (--ack, or pyqueue ack) or until --lock-timeout passes")
    p.add_argument("--queue", required=True)
    p.add_argument("--max-count", type=Integer(), default=1, help=f"1 to {POLL_MAX_COUNT} (default 1)")
    p.add_argument("--lock-timeout", type=Duration(), default=timedelta(seconds=300),
                   help="seconds, or 30s, 5m, ... (default 300)")
    p.add_argument("--wait", type=Duration(allow_zero=True), default=None,
                   help="seconds to wait for a message, or 500ms, 30s, ...")
    p.add_argument("--ack", action="store_true", help="acknowledge what was printed")
    p.set_defaults(func=_cmd_poll)

    p = add("ack", "acknowledge (delete) polled messages by their lock tokens; exit 1 when one was stale")
    p.add_argument("--queue", required=True)
    p.add_argument("lock_tokens", nargs="+", metavar="LOCK_TOKEN", help="a lock_token printed by pyqueue poll")
    p.set_defaults(func=_cmd_ack)

    p = add("worker", "consume a queue with a handler until SIGTERM/SIGINT")
    p.add_argument("--queue", required=True)
    # --concurrency is bounded here: the worker opens concurrency + 3 connections, and its default
    # batch size (the concurrency) must fit one poll.
    p.add_argument("--concurrency", type=Integer(1, POLL_MAX_COUNT), default=4,
                   help=f"handler threads, 1 to {POLL_MAX_COUNT} (default 4)")
    p.add_argument("--batch-size", type=Integer(), default=None, help="max messages per poll (default: concurrency)")
    p.add_argument("--prefetch", type=Integer(), default=None,
                   help="messages polled ahead while every handler is busy (default: batch size; 0: none)")
    p.add_argument("--lock-timeout", type=Duration(), default=timedelta(seconds=30),
                   help="seconds (default 30); extended while running")
    p.add_argument("--idle-check", type=Duration(), default=timedelta(seconds=5),
                   help="seconds between checks while idle (default 5)")
    p.add_argument("--shutdown-grace", type=Duration(), default=timedelta(seconds=30),
                   help="seconds handlers get on stop (default 30)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--cron-tick", type=Duration(), default=None,
                   help="also call dq_cron_tick() every this many seconds (one worker per database at a time)")
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="run the asyncio worker (a coroutine handler is awaited, a plain one runs in a thread)")
    p.add_argument("--metrics-port", type=Integer(0, 65535), default=None,
                   help="serve the worker's Prometheus metrics on this port (needs pgdelayq[metrics])")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics server (default 127.0.0.1)")
    p.add_argument("handler", help="package.module:function, imported from the current directory or PYTHONPATH")
    p.set_defaults(func=_cmd_worker)

    p = add("metrics", "serve every queue's figures and the tables' health for Prometheus (pgdelayq[metrics])")
    p.add_argument("--port", type=Integer(0, 65535), default=9187, help="default 9187")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--statement-timeout", type=Duration(), default=timedelta(seconds=5),
                   help="the most a scrape's queries may run (default 5s)")
    p.set_defaults(func=_cmd_metrics)

    p = add("console", "serve the web console: queues, messages, dead letters, schedules, health (pgdelayq[console])")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs $PGDELAYQ_CONSOLE_TOKEN or "
                        "$PGDELAYQ_CONSOLE_USER and $PGDELAYQ_CONSOLE_PASSWORD)")
    p.add_argument("--port", type=Integer(0, 65535), default=8080, help="default 8080; 0 picks a free port")
    p.add_argument("--allow-actions", action="store_true",
                   help="offer pause, resume, cancel, due now, redrive, purge and limits (connects as dq_admin; "
                        "default: read-only, as dq_viewer)")
    p.add_argument("--statement-timeout", type=Duration(), default=timedelta(seconds=5),
                   help="the most any query of the console may run (default 5s)")
    p.set_defaults(func=_cmd_console)

    p = add("stats", "show the dq_stats view (one row per queue) as a table")
    p.add_argument("--queue", default=None, help="only this queue")
    p.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    p.add_argument("--interval", type=Duration(maximum=timedelta(days=1)), default=timedelta(seconds=2),
                   help="seconds between refreshes (default 2, at most 1 day)")
    p.set_defaults(func=_cmd_stats)

    p = add("next-due", "print when the next message becomes visible")
    p.add_argument("--queue", required=True)
    p.set_defaults(func=_cmd_next_due)

    p = sub.add_parser("queue", help="operate a queue (role dq_admin): pause, resume, configure, redrive, "
                                     "dead-letters")
    queue_sub = p.add_subparsers(dest="queue_command", required=True)

    def add_queue(name: str, help_: str) -> argparse.ArgumentParser:
        c = queue_sub.add_parser(name, help=help_, parents=[common])
        c.add_argument("name", help="the queue")
        c.set_defaults(func=_cmd_queue)
        return c

    add_queue("pause", "stop deliveries (offers, acks and nacks keep working); prints paused or already paused")
    add_queue("resume", "deliver again and wake waiting consumers; prints resumed or was not paused")
    c = add_queue("configure", "set the queue's settings (dq_configure_queue): an option left out keeps its "
                               "value; --clear SETTING resets one to its default")
    c.add_argument("--max-deliveries", type=Integer(), default=None,
                   help="deliveries before a message goes to --dead-letter-queue (give both)")
    c.add_argument("--dead-letter-queue", default=None, help="where messages go after --max-deliveries")
    c.add_argument("--archive", action=argparse.BooleanOptionalAction, default=None,
                   help="keep acknowledged, dead and cancelled messages in the archive")
    c.add_argument("--retention", type=Duration(), default=None,
                   help="how long archive rows are kept: seconds, or 30s, 2h, ...")
    c.add_argument("--notify", action=argparse.BooleanOptionalAction, default=None,
                   help="wake idle consumers by NOTIFY (on by default)")
    c.add_argument("--max-payload-bytes", type=Integer(), default=None, help="the largest payload an offer may carry")
    c.add_argument("--max-in-flight", type=Integer(), default=None,
                   help="at most N messages of the queue locked at once, across all consumers (0: no limit)")
    c.add_argument("--rate-limit", type=Integer(), default=None,
                   help="at most N deliveries start in any window of --rate-period (0: no limit)")
    c.add_argument("--rate-period", type=Duration(), default=None,
                   help="the window of --rate-limit: seconds, or 500ms, 30s, 1m, 1h (at most 1 day)")
    c.add_argument("--clear", action="append", metavar="SETTING", type=lambda text: text.replace("_", "-"),
                   choices=[name.replace("_", "-") for name in _CONFIGURE],
                   help="reset SETTING to its default (repeatable): " + ", ".join(
                       name.replace("_", "-") for name in _CONFIGURE) + "; clearing rate-limit clears rate-period")

    c = add_queue("redrive", "send up to --max-count dead letters of this dead-letter queue back to the queues "
                             "they died in (dq_redrive); prints how many moved")
    c.add_argument("--max-count", type=Integer(), default=1000, help="default 1000")
    c = add_queue("dead-letters", "print the dead letters of this dead-letter queue as JSON lines, oldest first "
                                  "(dq_dead_letters: key, dead_from, last_error, payload_text, ...)")
    c.add_argument("--max-rows", type=Integer(), default=100, help="default 100")

    p = sub.add_parser("cron", help="recurring messages: tick, install, uninstall, pause, resume, list")
    cron_sub = p.add_subparsers(dest="cron_command", required=True)

    def add_cron(name: str, help_: str) -> argparse.ArgumentParser:
        c = cron_sub.add_parser(name, help=help_, parents=[common])
        c.set_defaults(func=_cmd_cron)
        return c

    c = add_cron("tick", "install due occurrences once (prints the count), or every --every until SIGINT/SIGTERM")
    c.add_argument("--every", type=Duration(), default=None, help="loop with this period (30s, 1m, ...)")
    c = add_cron("install", "create or replace a named schedule; prints its config hash")
    c.add_argument("--name", required=True)
    c.add_argument("--queue", required=True)
    c.add_argument("--schedule", required=True, help="'*/5 * * * *', '@daily', 'every 15 minutes', 'daily at 09:00'")
    c.add_argument("--payload", required=True)
    c.add_argument("--json", action="store_true", help="the payload is JSON (payload_type json)")
    c.add_argument("--payload-type", default=None)
    c.add_argument("--timezone", default="UTC", help="IANA zone name (default UTC)")
    c.add_argument("--lookahead", type=Duration(), default=timedelta(hours=1), help="default 1h")
    for name, help_ in (("uninstall", "remove a schedule and its future messages"),
                        ("pause", "pause a schedule (its future messages are removed)"),
                        ("resume", "resume a paused schedule")):
        c = add_cron(name, help_)
        c.add_argument("--name", required=True)
    add_cron("list", "print the schedules as JSON lines")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success, 2 after a one-line error about an argument (the parser's,
    a :class:`UsageError`, or a :class:`pyqueue.PyQueueError` from the library or the database)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"pyqueue{' ' + exc.command if exc.command else ''}: {shown(str(exc))}", file=sys.stderr)
        return 2
    except PyQueueError as exc:
        print(f"pyqueue: {shown(str(exc))} (SQLSTATE {exc.sqlstate})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
