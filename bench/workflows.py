"""Dependencies: what a wide fan-out or fan-in costs the acknowledgement, and how soon children reach a worker.

    python -m bench.workflows --dsn ADMIN_DSN [--quick] [--size N] [--repeat N] [--out PATH]

Everything runs in one database, ``dq_bench_workflows`` (dropped and recreated: the queue schema and
the baseline table, see bench/README.md "The baseline"). One client at a time acknowledges, one
consumer waits: a raw connection idle in ``dq_poll_or_wait`` on the children's queue (LISTEN on its
channel), which polls batches of 100 and acknowledges each batch with ``dq_ack_many``, as a worker
does. Three shapes, ``size`` messages each (default 10,000):

* **fan-out**: one parent with ``size`` children. The parent's ``dq_ack`` (ms, commit included), then,
  from that commit: the first child delivered to the idle consumer, and the last (all released: an
  acknowledgement releases ``dq__limit_release_inline()`` children, the polls release the backlog). ``repeat`` runs.
* **fan-in**: one child after ``size`` parents. The child's ``dq_offer`` (ms), p50/p99 of the
  parents' ``dq_ack`` (each alone, commit included), and from the last one's commit to the child
  delivered.
* **plain**: ``size`` messages without dependencies: ``dq_ack`` p50/p99, the reference; beside it the
  plain-SQL baseline, ``DELETE`` of one row of ``bench_baseline`` (the same table shape) by its lock
  token, in the same run.

Times are the client's (``time.perf_counter``), on a host that may be shared: compare within one run.
The ``poll+ack`` rate of queues without dependencies is bench.core's.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from bench.lib.database import create_database, provenance, server_info
from bench.lib.report import arguments, console, machine_info, percentile, publish, rich_table

if TYPE_CHECKING:
    from rich.table import Table

DB_NAME = "dq_bench_workflows"
PARENTS = "wf_parents"
KIDS = "wf_kids"
PLAIN = "wf_plain"
BATCH = 100
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Config:
    mode: str
    size: int
    repeat: int


FULL = Config("full", 10_000, 5)
QUICK = Config("quick", 2_000, 1)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def stats(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of durations in seconds, in ms."""
    if len(values) < 2:
        return {"p50": ms(values[0]), "p99": ms(values[0]), "max": ms(values[0])}
    return {"p50": ms(statistics.median(values)), "p99": ms(percentile(values, 99)), "max": ms(max(values))}


class Consumer:
    """A raw consumer of one queue, idle in dq_poll_or_wait: records when each delivery arrived."""

    def __init__(self, dsn: str, queue: str, expect: int) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.queue = queue
        self.expect = expect
        self.times: list[float] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        channel = self.conn.execute("SELECT dq_channel(%s)", (queue,)).fetchone()[0]  # type: ignore[index]
        self.conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        self.thread = threading.Thread(target=self.run, name="bench-workflows-consumer")

    def run(self) -> None:
        try:
            while len(self.times) < self.expect and not self.stop.is_set():
                rows = self.conn.execute(
                    "SELECT lock_token, wake_in FROM dq_poll_or_wait(%s, %s, '5 minutes', '1 second')",
                    (self.queue, BATCH)).fetchall()
                now = time.perf_counter()
                tokens = [r[0] for r in rows if r[0] is not None]
                if tokens:
                    self.times.extend([now] * len(tokens))
                    self.conn.execute("SELECT dq_ack_many(%s)", (tokens,))
                else:
                    wait = rows[0][1].total_seconds() if rows and rows[0][1] is not None else 0.1
                    for _ in self.conn.notifies(timeout=min(wait, 1.0), stop_after=1):
                        pass
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            self.error = e

    def __enter__(self) -> Consumer:
        self.thread.start()
        deadline = time.monotonic() + TIMEOUT_S
        with psycopg.connect(self.conn.info.dsn, autocommit=True) as probe:
            while probe.execute("SELECT count(*) FROM dq_waiters WHERE queue = %s AND pid = %s",
                                (self.queue, self.conn.info.backend_pid)).fetchone() == (0,):
                if time.monotonic() > deadline:
                    raise RuntimeError("bench.workflows: the consumer is not waiting")
                time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(TIMEOUT_S)
        self.stop.set()
        self.thread.join(TIMEOUT_S)
        self.conn.close()
        if self.error is not None:
            raise self.error
        if len(self.times) < self.expect:
            raise RuntimeError(f"bench.workflows: {len(self.times)} of {self.expect} children delivered")


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("TRUNCATE dq_messages, dq_dependencies, dq_release_backlog, dq_waiters, bench_baseline")
    conn.execute("VACUUM ANALYZE dq_messages")


def poll_all(conn: psycopg.Connection[Any], queue: str, n: int) -> list[Any]:
    tokens: list[Any] = []
    while len(tokens) < n:
        rows = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 10000, '1 hour')", (queue,)).fetchall()
        if not rows:
            break
        tokens.extend(r[0] for r in rows)
    return tokens


def timed(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...]) -> tuple[float, Any]:
    start = time.perf_counter()
    row = conn.execute(query, params).fetchone()
    return time.perf_counter() - start, row[0] if row else None


def fan_out(dsn: str, conn: psycopg.Connection[Any], size: int) -> dict[str, Any]:
    reset(conn)
    conn.execute("SELECT dq_offer(%s, 'P', 'p'::text, now() - interval '1 hour')", (PARENTS,))
    conn.execute("SELECT count(dq_offer(%s, 'c' || i, 'x'::text, now() - interval '1 hour',"
                 " after => jsonb_build_array(jsonb_build_array(%s::text, 'P'))))"
                 " FROM generate_series(1, %s) i", (KIDS, PARENTS, size))
    conn.execute("VACUUM ANALYZE dq_messages")
    (token,) = poll_all(conn, PARENTS, 1)
    with Consumer(dsn, KIDS, size) as consumer:
        ack_s, acked = timed(conn, "SELECT dq_ack(%s)", (token,))
        committed = time.perf_counter()
        assert acked is True
    return {"ack_ms": ms(ack_s), "first_child_ms": ms(consumer.times[0] - committed),
            "all_children_ms": ms(consumer.times[-1] - committed)}


def fan_in(dsn: str, conn: psycopg.Connection[Any], size: int) -> dict[str, Any]:
    reset(conn)
    conn.execute("SELECT count(*) FROM dq_offer_many(%s, (SELECT array_agg('p' || i) FROM generate_series(1, %s) i),"
                 " array_fill('p'::bytea, ARRAY[%s]), array_fill(now() - interval '1 hour', ARRAY[%s]))",
                 (PARENTS, size, size, size))
    conn.execute("VACUUM ANALYZE dq_messages")
    after = conn.execute("SELECT jsonb_agg(jsonb_build_array(%s::text, 'p' || i)) FROM generate_series(1, %s) i",
                         (PARENTS, size)).fetchone()[0]  # type: ignore[index]
    offer_s, outcome = timed(conn, "SELECT dq_offer(%s, 'C', 'c'::text, now() - interval '1 hour', after => %s)",
                             (KIDS, psycopg.types.json.Jsonb(after)))
    assert outcome == "created"
    tokens = poll_all(conn, PARENTS, size)
    acks: list[float] = []
    with Consumer(dsn, KIDS, 1) as consumer:
        for token in tokens:
            ack_s, acked = timed(conn, "SELECT dq_ack(%s)", (token,))
            assert acked is True
            acks.append(ack_s)
        committed = time.perf_counter()
    return {"offer_ms": ms(offer_s), "ack": stats(acks), "child_ms": ms(consumer.times[0] - committed)}


def plain(conn: psycopg.Connection[Any], size: int) -> dict[str, Any]:
    reset(conn)
    conn.execute("SELECT count(*) FROM dq_offer_many(%s, (SELECT array_agg('m' || i) FROM generate_series(1, %s) i),"
                 " array_fill('p'::bytea, ARRAY[%s]), array_fill(now() - interval '1 hour', ARRAY[%s]))",
                 (PLAIN, size, size, size))
    conn.execute("INSERT INTO bench_baseline (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially,"
                 " lock_token) SELECT 'base', 'm' || i, 'p', 'bytes', now(), now(), gen_random_uuid()"
                 " FROM generate_series(1, %s) i", (size,))
    conn.execute("VACUUM ANALYZE dq_messages")
    conn.execute("VACUUM ANALYZE bench_baseline")
    tokens = poll_all(conn, PLAIN, size)
    base = [r[0] for r in conn.execute("SELECT lock_token FROM bench_baseline ORDER BY id").fetchall()]
    acks: list[float] = []
    deletes: list[float] = []
    for token, b in zip(tokens, base, strict=False):  # interleaved: both see the same host load
        acks.append(timed(conn, "SELECT dq_ack(%s)", (token,))[0])
        deletes.append(timed(conn, "DELETE FROM bench_baseline WHERE lock_token = %s RETURNING true", (b,))[0])
    return {"ack": stats(acks), "baseline_delete": stats(deletes)}


def run(admin_dsn: str, cfg: Config, db_name: str) -> dict[str, Any]:
    started = time.monotonic()
    dsn = create_database(admin_dsn, db_name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT dq_configure_queue(%s)", (KIDS,))
        # A warm session, as a worker's: the functions compiled and their plans cached by one run of
        # each shape at a small size, not measured.
        fan_out(dsn, conn, 10)
        fan_in(dsn, conn, 10)
        limit = conn.execute("SELECT public_internal.dq__limit_release_inline()").fetchone()[0]  # type: ignore[index]
        outs = [fan_out(dsn, conn, cfg.size) for _ in range(cfg.repeat)]
        ins = [fan_in(dsn, conn, cfg.size) for _ in range(cfg.repeat)]
        plains = [plain(conn, cfg.size) for _ in range(cfg.repeat)]
        server = server_info(conn)
        source = provenance(conn)
    return {"benchmark": "workflows", "mode": cfg.mode, "size": cfg.size, "repeat": cfg.repeat,
            "release_inline": limit, "at": datetime.now(UTC).isoformat(), "machine": machine_info(),
            "server": server, **source, "fan_out": outs, "fan_in": ins, "plain": plains,
            "wall_time_s": round(time.monotonic() - started, 1)}


def med(runs: list[dict[str, Any]], *path: str) -> float:
    values = []
    for r in runs:
        v: Any = r
        for p in path:
            v = v[p]
        values.append(v)
    return round(statistics.median(values), 3)


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repeats of every figure the tables show, with the configuration (a summary
    is returned as it is: summarizing it changes nothing)."""
    if isinstance(report["fan_out"], dict):
        return {k: v for k, v in report.items() if k != "benchmark"}
    out, fin, pl = report["fan_out"], report["fan_in"], report["plain"]
    keep = {k: report[k] for k in ("mode", "size", "repeat", "release_inline", "at", "machine", "server")
            if k in report}
    keep.update({k: v for k, v in report.items() if k in ("functions_md5", "git_head", "uncommitted_changes")})
    return {**keep,
            "fan_out": {"ack_ms": med(out, "ack_ms"), "ack_max_ms": max(r["ack_ms"] for r in out),
                        "first_child_ms": med(out, "first_child_ms"), "all_children_ms": med(out, "all_children_ms")},
            "fan_in": {"offer_ms": med(fin, "offer_ms"), "ack_p50_ms": med(fin, "ack", "p50"),
                       "ack_p99_ms": med(fin, "ack", "p99"), "ack_max_ms": max(r["ack"]["max"] for r in fin),
                       "child_ms": med(fin, "child_ms")},
            "plain": {"ack_p50_ms": med(pl, "ack", "p50"), "ack_p99_ms": med(pl, "ack", "p99"),
                      "baseline_p50_ms": med(pl, "baseline_delete", "p50"),
                      "baseline_p99_ms": med(pl, "baseline_delete", "p99")}}


def tables(report: dict[str, Any]) -> list[Table]:
    """The tables of a full report or of its summary (the same figures)."""
    s = report if "fan_out" in report and isinstance(report["fan_out"], dict) else summary(report)
    n = f"{s['size']:,}"
    o, i, p = s["fan_out"], s["fan_in"], s["plain"]
    return [rich_table(
        f"Dependencies: {n} children or parents, medians of {s['repeat']} runs (ms)",
        ["shape", "figure", "ms", "beside"],
        [("fan-out", "the parent's dq_ack", f"{o['ack_ms']:.2f}", f"max {o['ack_max_ms']:.2f}"),
         ("fan-out", "ack commit -> first child delivered", f"{o['first_child_ms']:.2f}", "idle consumer"),
         ("fan-out", f"ack commit -> all {n} delivered", f"{o['all_children_ms']:.1f}",
          f"{s['release_inline']:,} inline, then the polls"),
         ("fan-in", "the child's dq_offer", f"{i['offer_ms']:.1f}", f"after {n} parents"),
         ("fan-in", "a parent's dq_ack p50 / p99", f"{i['ack_p50_ms']:.3f} / {i['ack_p99_ms']:.3f}",
          f"max {i['ack_max_ms']:.2f}"),
         ("fan-in", "last ack commit -> child delivered", f"{i['child_ms']:.2f}", "idle consumer"),
         ("plain", "dq_ack p50 / p99", f"{p['ack_p50_ms']:.3f} / {p['ack_p99_ms']:.3f}", "no dependencies"),
         ("baseline", "DELETE by lock token p50 / p99", f"{p['baseline_p50_ms']:.3f} / {p['baseline_p99_ms']:.3f}",
          "plain SQL, same run")],
        left=("shape", "figure", "beside"))]


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.workflows", __doc__, quick="2,000 children or parents, one run", db_name=DB_NAME)
    parser.add_argument("--size", type=int, default=None, help="children of the fan-out, parents of the fan-in")
    parser.add_argument("--repeat", type=int, default=None, help="runs of each shape (default 5; 1 with --quick)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.size is not None:
        cfg = replace(cfg, size=max(args.size, 2))
    if args.repeat is not None:
        cfg = replace(cfg, repeat=max(args.repeat, 1))
    console().log(f"bench.workflows: {cfg.mode}, {cfg.size:,} children or parents, {cfg.repeat} runs")
    report = run(args.dsn, cfg, args.db_name)
    publish("workflows", report, summary(report), tables(report), args.out, quick=cfg.mode == "quick")


if __name__ == "__main__":
    main()
