"""What worker middleware costs: one worker drains a backlog with and without it, beside plain SQL.

    python -m bench.middleware_overhead --dsn ADMIN_DSN [--quick] [--repeat N] [--messages N] [--out PATH]

Everything runs in one database, ``dq_bench_middleware`` (dropped and recreated: the queue schema and
the baseline table, see bench/README.md "The baseline"). One run commits a backlog of due messages in
one transaction while its consumer waits idle, and measures messages/s from the commit until the
queue is empty (as bench.targets' worker rows): a :class:`pyqueue.Worker` (a no-op function) or a
:class:`pyqueue.aio.AsyncWorker` (a no-op coroutine) in this process, concurrency 100, batch 100, with
the middleware of one *variant*; or one plain-SQL baseline client draining the same backlog at batch
100. Every message of the backlog carries a W3C ``traceparent`` header, as the messages offered
through the tracing middleware do; every variant drains the same rows.

Variants (:data:`VARIANTS`): a name and a function that, given the worker's kind (``"sync"`` or
``"async"``), returns the worker's keyword arguments (its ``middleware`` list, or any other, such as
``metrics``); a row is one more entry:

* ``none``: no middleware;
* ``pass-through``: one middleware whose ``handle`` only calls ``call_next``: the worker's middleware
  path alone (the handler call as a :class:`pyqueue.HandlerCall`, timed, through the chain);
* ``metrics``: :class:`pyqueue.metrics.WorkerMetrics` (``metrics=``), in a registry of its own
  that nothing scrapes: the cost of its histograms on each handler call;
* ``tracing``: :class:`pyqueue.otel.TracingMiddleware` (or its asyncio twin) with an SDK
  ``TracerProvider`` that samples every span, its ``BatchSpanProcessor`` (default settings) handing
  them to an exporter that discards them: the cost of recording every span, without the export's;
* ``tracing not sampled``: the same with the ``ALWAYS_OFF`` sampler: the trace contexts read and
  written, no span recorded.

Each repeat runs, for each kind, the baseline and every variant, the order rotating between repeats.
A variant's figures are medians over the repeats: messages/s, the ratio to the baseline of the same
repeat, the change against ``none`` of the same repeat (the overhead), and the consumer's CPU per
message (this process's CPU, worker and driver, per message). ``other CPU`` is the share of the
machine other processes took during a run: on a shared host, compare ratios, not rates.
``--quick`` (a smaller backlog, one repeat) is a smoke test.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.handlers import noop, noop_async
from bench.lib.cpu import Window
from bench.lib.database import create_database, drain, fill_one_transaction, prepare_table, provenance, server_info
from bench.lib.report import arguments, console, machine_info, publish, rich_table
from bench.lib.sides import DQ, QUEUE, value
from bench.lib.workers import READY_TIMEOUT_S, Drain, interrupt_on_sigterm, run_baseline_side
from pyqueue import DelayedQueue, HandlerCall, Middleware, Worker
from pyqueue.aio import AsyncDelayedQueue, AsyncMiddleware, AsyncWorker

if TYPE_CHECKING:
    from rich.table import Table

DB_NAME = "dq_bench_middleware"
KINDS = ("sync", "async")
CONCURRENCY = 100
BATCH = 100


@dataclass(frozen=True)
class Config:
    mode: str
    repeat: int
    messages: int


FULL = Config("full", 3, 30_000)
QUICK = Config("quick", 1, 10_000)

#: The backlog: bench.lib.sides' DQ fill, each message with a W3C traceparent of its own.
TRACED_FILL = """
    SELECT count(*)
      FROM (SELECT array_agg(%(prefix)s || lpad(g::text, 9, '0')) AS k,
                   array_agg(%(payload)s::bytea) AS p,
                   array_agg(%(t0)s::timestamptz + g * interval '1 millisecond') AS s,
                   array_agg(jsonb_build_object('traceparent',
                       '00-' || md5(g::text) || '-' || left(md5('span' || g), 16) || '-01')) AS h
              FROM generate_series(%(lo)s::int, %(hi)s::int) AS g) AS a,
           LATERAL dq_offer_many(%(queue)s::text, a.k, a.p, a.s, headers => a.h)"""

#: Sessions of a consumer of QUEUE waiting on LISTEN (registered by dq_poll_or_wait).
WAITING = ("SELECT count(DISTINCT w.pid) FROM dq_waiters w JOIN pg_stat_activity a ON a.pid = w.pid"
           " WHERE w.queue = %s AND a.datname = current_database()")


# --------------------------------------------------------------------------- variants

#: TracerProviders the variants made during a run: shut down (their export threads ended) at its end.
_PROVIDERS: list[Any] = []


def _tracing(kind: str, *, sampled: bool) -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from pyqueue.otel import AsyncTracingMiddleware, TracingMiddleware

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider() if sampled else TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    _PROVIDERS.append(provider)
    layer = TracingMiddleware if kind == "sync" else AsyncTracingMiddleware
    return {"middleware": [layer(tracer_provider=provider)]}


def _metrics(kind: str) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from pyqueue.metrics import WorkerMetrics

    return {"metrics": WorkerMetrics(CollectorRegistry())}


class _PassThrough(Middleware):
    def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        return call_next(call)


class _AsyncPassThrough(AsyncMiddleware):
    async def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        return await call_next(call)


#: name -> function of the worker's kind ("sync", "async") returning the worker's keyword arguments.
VARIANTS: dict[str, Callable[[str], dict[str, Any]]] = {
    "none": lambda kind: {"middleware": []},
    "pass-through": lambda kind: {"middleware": [_PassThrough() if kind == "sync" else _AsyncPassThrough()]},
    "metrics": _metrics,
    "tracing": lambda kind: _tracing(kind, sampled=True),
    "tracing not sampled": lambda kind: _tracing(kind, sampled=False),
}


# --------------------------------------------------------------------------- one run


@contextmanager
def running(dsn: str, kind: str, options: dict[str, Any]) -> Iterator[Callable[[], dict[str, Any]]]:
    """A worker of ``kind`` on QUEUE in a thread of this process, with ``options``, until the block
    ends (then stopped and joined); yields a function returning its counters."""
    settings: dict[str, Any] = {"concurrency": CONCURRENCY, "batch_size": BATCH, **options}
    box: dict[str, Any] = {}
    if kind == "sync":
        queue = DelayedQueue(dsn, QUEUE, pool_size=CONCURRENCY + 3)
        worker = Worker(queue, noop, **settings)
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        stop: Callable[[], None] = worker.stop
        box["worker"] = worker
    else:
        started = threading.Event()

        async def main() -> None:
            async with AsyncDelayedQueue(dsn, QUEUE, pool_size=CONCURRENCY + 3) as aq:
                box["worker"] = AsyncWorker(aq, noop_async, **settings)
                box["loop"] = asyncio.get_running_loop()
                started.set()
                await box["worker"].run(install_signal_handlers=False)

        thread = threading.Thread(target=asyncio.run, args=(main(),))

        def stop() -> None:
            box["loop"].call_soon_threadsafe(box["worker"].stop)

    thread.start()
    try:
        if kind != "sync" and not started.wait(READY_TIMEOUT_S):
            raise RuntimeError("the asyncio worker did not start")
        yield lambda: box["worker"].stats.snapshot()
    finally:
        if "worker" in box:
            stop()
        thread.join(READY_TIMEOUT_S)
        # A sync worker that stops while idle leaves its last wait running on a thread of its own
        # (at most idle_check): once the queue is closed, what that wait still claims could not be
        # given back, and the next run would wait for those locks to expire.
        for waiting in [t for t in threading.enumerate() if t.name == "pyqueue-idle-wait"]:
            waiting.join(READY_TIMEOUT_S)
        if kind == "sync":
            queue.close()


def run_variant(admin: psycopg.Connection[Any], dsn: str, kind: str, variant: str, n: int) -> dict[str, Any]:
    """One worker of ``kind`` with ``variant``'s options drains a traced backlog of ``n`` messages."""
    prepare_table(admin, DQ)
    with (psycopg.connect(dsn, autocommit=True) as fill, psycopg.connect(dsn, autocommit=True) as counter,
          running(dsn, kind, VARIANTS[variant](kind)) as stats):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while value(admin, WAITING, (QUEUE,)) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind} worker ({variant}) not waiting after {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        window = Window(admin.info.dbname, counter.info.backend_pid)
        committed = fill_one_transaction(fill, replace(DQ, fill=TRACED_FILL), n, before_commit=window.start)
        elapsed, _, _ = drain(counter, DQ, committed, timeout=max(300.0, n / 200))
        measured = window.result(n)
        counters = stats()
    for provider in _PROVIDERS:
        provider.shutdown()
    _PROVIDERS.clear()
    return {"rows_per_s": n / elapsed, "other_cpu": measured["other_cpu"],
            "consumer_us_per_row": measured["consumer_us_per_row"], "server_us_per_row": measured["server_us_per_row"],
            "delivered": counters["delivered"]}


def run_baseline(admin: psycopg.Connection[Any], dsn: str, n: int) -> dict[str, Any]:
    res = run_baseline_side(admin, dsn, Drain(n, batch_size=BATCH), 1)
    return {"rows_per_s": res["rows_per_s"], "other_cpu": res["other_cpu"]}


# --------------------------------------------------------------------------- report


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def figures(runs: list[dict[str, Any]], variants: Sequence[str]) -> list[dict[str, Any]]:
    """Per kind and variant, the medians over the repeats (see the module's docstring)."""
    out = []
    for kind in KINDS:
        mine = [r for r in runs if r["kind"] == kind]
        if not mine:
            continue
        for variant in variants:
            rates = [r[variant]["rows_per_s"] for r in mine]
            out.append({
                "kind": kind, "variant": variant,
                "rows_per_s": median(rates),
                "ratio": median([r[variant]["rows_per_s"] / r["baseline"]["rows_per_s"] for r in mine]),
                "change": median([r[variant]["rows_per_s"] / r["none"]["rows_per_s"] - 1 for r in mine]),
                "consumer_us_per_row": median([r[variant]["consumer_us_per_row"] for r in mine]),
                "other_cpu_max": max(r[side]["other_cpu"] for r in mine for side in (variant, "baseline")),
                "repeats": len(mine),
            })
    return out


def tables(report: dict[str, Any]) -> list[Table]:
    rows = [(f["kind"], f["variant"], f"{f['rows_per_s']:,.0f}", f"{f['ratio']:.2f}",
             "" if f["variant"] == "none" else f"{f['change']:+.1%}", f"{f['consumer_us_per_row']:.1f}",
             f"{f['other_cpu_max']:.0%}") for f in report["figures"]]
    runs = [(r["kind"], str(r["repeat"]), f"{r['baseline']['rows_per_s']:,.0f}",
             *(f"{r[v]['rows_per_s']:,.0f} ({r[v]['other_cpu']:.0%})" for v in report["variants"]))
            for r in report["runs"]]
    return [
        rich_table(f"worker middleware overhead ({report['mode']}, {report['config']['messages']:,} messages, "
                   f"median of {report['config']['repeat']})",
                   ["worker", "middleware", "messages/s", "÷ baseline", "vs none", "consumer µs/msg", "other CPU"],
                   rows, left=("worker", "middleware")),
        rich_table("each run: messages/s (other CPU)", ["worker", "repeat", "baseline", *report["variants"]], runs,
                   left=("worker",)),
    ]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The report as it is (it is small): every run's rates stay."""
    return report


def run(admin_dsn: str, cfg: Config, variants: list[str], kinds: Sequence[str], out: Path | None,
        db_name: str) -> dict[str, Any]:
    started = time.perf_counter()
    console().log(f"[bold]bench.middleware_overhead[/] ({cfg.mode}): creating database {db_name}")
    dsn = create_database(admin_dsn, db_name)
    sides = ["baseline", *variants]
    runs = []
    with psycopg.connect(dsn, autocommit=True) as admin:
        server, source = server_info(admin), provenance(admin)
        for repeat in range(cfg.repeat):
            for kind in kinds:
                order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]
                one: dict[str, Any] = {"kind": kind, "repeat": repeat + 1, "order": order}
                for side in order:
                    one[side] = (run_baseline(admin, dsn, cfg.messages) if side == "baseline"
                                 else run_variant(admin, dsn, kind, side, cfg.messages))
                    console().log(f"{kind} repeat {repeat + 1} {side}: {one[side]['rows_per_s']:,.0f} messages/s, "
                                  f"other CPU {one[side]['other_cpu']:.0%}")
                runs.append(one)
    report = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": cfg.mode,
        "wall_time_s": round(time.perf_counter() - started, 1),
        "server": server,
        "source": source,
        "machine": machine_info(),
        "cpu_count": os.cpu_count(),
        "config": {"repeat": cfg.repeat, "messages": cfg.messages, "concurrency": CONCURRENCY, "batch_size": BATCH},
        "variants": variants,
        "figures": figures(runs, variants),
        "runs": runs,
    }
    publish("middleware_overhead", report, summary(report), tables(report), out, quick=cfg.mode == "quick")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.middleware_overhead", __doc__, quick="a smaller backlog, one repeat", db_name=DB_NAME)
    parser.add_argument("--repeat", type=int, default=None, help="repeats (default 3; 1 with --quick)")
    parser.add_argument("--messages", type=int, default=None, help="backlog per run (default 30000; 10000 quick)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="workers to run: sync,async (default both)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated variants (default all: {','.join(VARIANTS)}); none is always run")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.repeat is not None:
        cfg = replace(cfg, repeat=max(args.repeat, 1))
    if args.messages is not None:
        cfg = replace(cfg, messages=args.messages)
    variants = ["none", *(v.strip() for v in args.variants.split(",") if v.strip() and v.strip() != "none")]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [v for v in variants if v not in VARIANTS] + [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown variant(s) or kind(s): {', '.join(unknown)}")
    with interrupt_on_sigterm():
        run(args.dsn, cfg, variants, kinds, args.out, args.db_name)


if __name__ == "__main__":
    main()
