"""Worker metrics (pyqueue.metrics.WorkerMetrics) and the middleware's ``nacked`` notification,
against the real server: after a known workload (messages that succeed, fail and are retried, and
fail for good into a dead-letter queue) the exposition, parsed by prometheus_client's own parser,
holds exactly those counts, one handler duration and one lateness observation per handler call,
and series labelled only by queue whatever the number of keys; ``pyqueue worker --metrics-port``
serves them over HTTP from a real process."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from workerhandlers import HANG_S, run_until, run_until_async, start_worker, stop

from pyqueue import Backoff, DelayedQueue, HandlerCall, Middleware, NackOutcome, NackResult, Worker
from pyqueue.aio import AsyncDelayedQueue, AsyncMiddleware, AsyncWorker
from pyqueue.metrics import WorkerMetrics

#: Retries due at once: the test waits for the dead-lettering, not for a backoff.
BACKOFF = Backoff(base=timedelta(milliseconds=10), factor=1.0, cap=timedelta(milliseconds=10), jitter=0.0)
MODES = ["sync", "async", "async-thread"]


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's exposition, parsed back: {(name, sorted labels): value}."""
    text = generate_latest(registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


class NackRecorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, NackResult | None]] = []

    def nacked(self, call: HandlerCall[Any], result: NackResult | None) -> None:
        self.seen.append((call.message.key, call.message.delivery_count, result))


class Nacks(NackRecorder, Middleware):
    pass


class AsyncNacks(NackRecorder, AsyncMiddleware):
    pass


def drain(dsn: str, mode: str, keys: list[str], failing: set[str], done: Callable[[dict[str, Any]], bool],
          metrics: WorkerMetrics | None = None) -> tuple[dict[str, Any], list[Any]]:
    """Offer ``keys`` to queue 'jobs' (max_deliveries 2, dead-letter queue 'jobs_dlq'), run a worker
    of ``mode`` whose handler raises for ``failing`` until ``done(stats)``; returns the stats and
    what a ``nacked`` middleware heard."""
    settings: dict[str, Any] = {"concurrency": 2, "idle_check": 0.2, "backoff": BACKOFF, "shutdown_grace": 5,
                                "metrics": metrics}

    def handler(m: Any) -> None:
        if m.key in failing:
            raise ValueError(f"no {m.key}")

    async def coroutine_handler(m: Any) -> None:
        await asyncio.sleep(0)
        handler(m)

    if mode == "sync":
        nacks: Any = Nacks()
        with DelayedQueue(dsn, "jobs") as q:
            q.configure(max_deliveries=2, dead_letter_queue="jobs_dlq")
            q.offer_many([(k, {"k": k}) for k in keys])
            worker = Worker(q, handler, middleware=[nacks], **settings)
            run_until(worker, done)
        return worker.stats.snapshot(), nacks.seen

    async def main() -> tuple[dict[str, Any], list[Any]]:
        nacks = AsyncNacks()
        async with AsyncDelayedQueue(dsn, "jobs") as q:
            await q.configure(max_deliveries=2, dead_letter_queue="jobs_dlq")
            await q.offer_many([(k, {"k": k}) for k in keys])
            worker = AsyncWorker(q, coroutine_handler if mode == "async" else handler, middleware=[nacks],
                                 **settings)
            await run_until_async(worker, done)
            return worker.stats.snapshot(), nacks.seen

    return asyncio.run(main())


def settled(n_ok: int, n_bad: int) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s["acknowledged"] >= n_ok and s["dead_lettered"] >= n_bad


@pytest.mark.parametrize("mode", MODES)
def test_nacked_hears_each_retry_and_dead_lettering(dsn: str, mode: str) -> None:
    stats, seen = drain(dsn, mode, ["ok", "bad"], {"bad"}, settled(1, 1))
    assert stats["retried"] == 1 and stats["dead_lettered"] == 1 and stats["failed"] == 2
    assert [(key, count, r.outcome if r else None) for key, count, r in seen] == [
        ("bad", 1, NackOutcome.RETRIED), ("bad", 2, NackOutcome.DEAD_LETTERED)]
    assert seen[1][2] is not None and seen[1][2].dead_letter_queue == "jobs_dlq"
    assert seen[0][2] is not None and seen[0][2].due is not None


@pytest.mark.parametrize("mode", MODES)
def test_worker_metrics_count_a_known_workload(dsn: str, mode: str) -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    ok = [f"ok-{i}" for i in range(20)]
    bad = [f"bad-{i}" for i in range(3)]
    stats, _ = drain(dsn, mode, ok + bad, set(bad), settled(20, 3), metrics)
    q = (("queue", "jobs"),)
    found = samples(registry)
    assert found[("pgdelayq_worker_delivered_messages_total", q)] == 26 == stats["delivered"]  # 20 + 3 x 2
    assert found[("pgdelayq_worker_acknowledged_messages_total", q)] == 20
    assert found[("pgdelayq_worker_failed_messages_total", q)] == 6
    assert found[("pgdelayq_worker_retried_messages_total", q)] == 3
    assert found[("pgdelayq_worker_dead_lettered_messages_total", q)] == 3
    assert found[("pgdelayq_worker_lock_lost_messages_total", q)] == 0
    # One observation per handler call, each in a finite bucket.
    assert found[("pgdelayq_worker_handler_duration_seconds_count", q)] == 26
    assert found[("pgdelayq_worker_lateness_seconds_count", q)] == 26
    assert found[("pgdelayq_worker_handler_duration_seconds_bucket", (("le", "300.0"), *q))] == 26
    assert 0 < found[("pgdelayq_worker_handler_duration_seconds_sum", q)] < 26 * 5
    assert found[("pgdelayq_worker_running_handlers", q)] == 0
    assert found[("pgdelayq_worker_prefetched_messages", q)] == 0


def test_worker_metrics_series_do_not_grow_with_keys(dsn: str) -> None:
    """1,000 distinct keys, failing and succeeding: the series are those of one queue label."""
    registry = CollectorRegistry()
    keys = [f"key-{i}" for i in range(1000)]
    drain(dsn, "sync", keys, set(keys[:10]), settled(990, 10), WorkerMetrics(registry))
    found = samples(registry)
    worker_series = [k for k in found if k[0].startswith("pgdelayq_worker_")]
    assert {label for _, labels in worker_series for label in labels} <= {("queue", "jobs")} | {
        ("le", le) for _, labels in worker_series for name, le in labels if name == "le"}
    assert len(worker_series) < 80  # 6 counters (+ created), 2 gauges, 2 histograms of <= 16 buckets
    assert found[("pgdelayq_worker_delivered_messages_total", (("queue", "jobs"),))] == 1010


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("use_async", [False, True])
def test_pyqueue_worker_serves_its_metrics(dsn: str, use_async: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT dq_offer_many('jobs', ARRAY['a','b','c'], ARRAY['x','y','z']::bytea[])")
    port = free_port()
    proc = start_worker(dsn, "workerhandlers:noop", "--idle-check", "0.2", "--metrics-port", str(port),
                        *(["--async"] if use_async else []))
    try:
        deadline = time.monotonic() + HANG_S
        while True:
            text = scrape(f"http://127.0.0.1:{port}/metrics")
            values = {(s.name, s.labels.get("queue")): s.value
                      for f in text_string_to_metric_families(text) for s in f.samples}
            if values.get(("pgdelayq_worker_acknowledged_messages_total", "jobs")) == 3:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        assert values[("pgdelayq_worker_delivered_messages_total", "jobs")] == 3
        assert values[("pgdelayq_worker_handler_duration_seconds_count", "jobs")] == 3
        assert ("process_cpu_seconds_total", None) in values  # prometheus_client's process collector
    finally:
        code, out = stop(proc)
    assert code == 0, out


def test_pyqueue_worker_refuses_a_port_it_cannot_bind(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = stop(start_worker(dsn, "workerhandlers:noop", "--metrics-port", str(port)), 0)
    assert code == 2, out
    assert "cannot serve metrics" in out


def test_pyqueue_imports_no_metrics_library() -> None:
    """Without pyqueue.metrics imported, prometheus_client is not loaded (the extra stays optional)."""
    import subprocess
    import sys

    code = ("import sys, pyqueue, pyqueue.aio, pyqueue.cli; "
            "assert 'prometheus_client' not in sys.modules, 'prometheus_client imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=HANG_S)


def test_running_and_prefetched_while_a_handler_blocks(dsn: str) -> None:
    """One handler slot busy, messages polled ahead: the gauges say so, and drop to 0 once done."""
    registry = CollectorRegistry()
    release = threading.Event()

    def handler(m: Any) -> None:
        release.wait(HANG_S)

    q_label = (("queue", "jobs"),)
    with DelayedQueue(dsn, "jobs") as q:
        q.offer_many([(f"k{i}", "x") for i in range(3)])
        worker = Worker(q, handler, concurrency=1, batch_size=3, prefetch=3, idle_check=0.2,
                        metrics=WorkerMetrics(registry))
        t = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        t.start()
        try:
            deadline = time.monotonic() + HANG_S
            while worker.handler_counts() != (1, 2) and time.monotonic() < deadline:
                time.sleep(0.02)
            found = samples(registry)
            assert found[("pgdelayq_worker_running_handlers", q_label)] == 1
            assert found[("pgdelayq_worker_prefetched_messages", q_label)] == 2
            release.set()
            while worker.stats.snapshot()["acknowledged"] < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            release.set()
            worker.stop()
            t.join(HANG_S)
    found = samples(registry)
    assert found[("pgdelayq_worker_running_handlers", q_label)] == 0
    assert found[("pgdelayq_worker_prefetched_messages", q_label)] == 0
    assert found[("pgdelayq_worker_lateness_seconds_count", q_label)] == 3
    assert found[("pgdelayq_worker_lateness_seconds_bucket", (("le", "+Inf"), *q_label))] == 3


class EndedRecorder:
    """Records each ``ended`` notification; with ``fail``, raises from it."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[tuple[str, str | None, float | None]] = []
        self.fail = fail

    def ended(self, call: HandlerCall[Any]) -> None:
        self.seen.append((call.message.key, call.outcome, call.seconds))
        if self.fail:
            raise RuntimeError("ended broke")


class Ended(EndedRecorder, Middleware):
    pass


class AsyncEnded(EndedRecorder, AsyncMiddleware):
    pass


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fail", [False, True])
def test_ended_hears_each_handler_call_and_cannot_break_it(dsn: str, mode: str, fail: bool,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """``ended(call)`` comes once per handler call with its outcome and duration; one that raises is
    logged, and the delivery is settled as the handler's outcome says."""
    def handler(m: Any) -> None:
        time.sleep(0.005)
        if m.key == "bad":
            raise ValueError("no")

    async def coroutine_handler(m: Any) -> None:
        await asyncio.sleep(0.005)
        if m.key == "bad":
            raise ValueError("no")

    hour = timedelta(hours=1)
    settings: dict[str, Any] = {"concurrency": 1, "idle_check": 0.2, "backoff": Backoff(base=hour, cap=hour)}
    done = settled_counts(1, 1)
    if mode == "sync":
        ended: Any = Ended(fail)
        with DelayedQueue(dsn, "jobs") as q:
            q.offer_many([("ok", "x"), ("bad", "x")])
            stats = run_until(Worker(q, handler, middleware=[ended], **settings), done)
    else:
        ended = AsyncEnded(fail)

        async def main() -> dict[str, Any]:
            async with AsyncDelayedQueue(dsn, "jobs") as q:
                await q.offer_many([("ok", "x"), ("bad", "x")])
                return await run_until_async(AsyncWorker(q, coroutine_handler if mode == "async" else handler,
                                                         middleware=[ended], **settings), done)
        stats = asyncio.run(main())
    assert stats["acknowledged"] == 1 and stats["retried"] == 1
    assert sorted((key, outcome) for key, outcome, _ in ended.seen) == [("bad", "raised"), ("ok", "returned")]
    assert all(seconds is not None and seconds >= 0.004 for _, _, seconds in ended.seen)
    logged = [r.getMessage() for r in caplog.records if "middleware ended() raised" in r.getMessage()]
    assert len(logged) == (2 if fail else 0)


def settled_counts(acked: int, retried: int) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s["acknowledged"] >= acked and s["retried"] >= retried


def test_a_registry_takes_one_worker_metrics_and_one_exporter() -> None:
    """A second collector of the same series in one registry is refused at registration, rather than
    served as duplicate series that Prometheus would reject at every scrape."""
    from pyqueue.metrics import QueueMetricsCollector

    registry = CollectorRegistry()
    WorkerMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        WorkerMetrics(registry)
    registry.register(QueueMetricsCollector("postgresql://nobody@127.0.0.1:1/none"))  # no query at registration
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(QueueMetricsCollector("postgresql://nobody@127.0.0.1:1/none"))
