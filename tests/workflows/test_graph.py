"""The graph builder (:class:`pyqueue.Graph`) and ``offer_graph`` in both clients: the ETL shape
offered in one transaction, then worked through with real polls and acknowledgements; the order of
its batches; what it refuses itself (before any I/O) and what the database refuses."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from blocking import Blocking

import pyqueue
from pyqueue import DelayedQueue, Graph, Node, OfferOutcome, OfferRequest

LOCK = timedelta(minutes=5)


def etl(day: str, *, report_queue: str = "etl") -> tuple[Graph, dict[str, Node]]:
    """extract -> three transforms in parallel -> load after all three -> report after load."""
    g = Graph()
    n = {"extract": g.add("etl", f"extract/{day}", {"day": day})}
    transforms = [g.add("etl", f"transform/{t}/{day}", {"table": t}) for t in ("a", "b", "c")]
    n |= {f"t{t}": node for t, node in zip("abc", transforms, strict=True)}
    n["load"] = g.add("etl", f"load/{day}", {})
    n["report"] = g.add(report_queue, f"report/{day}", {})
    g.fan_out(n["extract"], transforms)
    g.fan_in(transforms, n["load"])
    g.chain(n["load"], n["report"])
    return g, n


def work_through(q: DelayedQueue, dsn: str, g: Graph) -> list[list[str]]:
    """Poll every queue of the graph and acknowledge what came, round after round, checking that
    nothing is delivered before each of its parents in the graph is acknowledged. Returns the keys
    delivered in each round."""
    queues = sorted({n.queue for n in g.nodes})
    clients = {name: q if name == q.queue else DelayedQueue(dsn, name) for name in queues}
    acked: set[Node] = set()
    rounds: list[list[str]] = []
    try:
        while len(acked) < len(g):
            messages = [m for name in queues for m in clients[name].poll(100, LOCK)]
            assert messages, f"stuck: {sorted(n.key for n in g.nodes if n not in acked)} never delivered"
            for m in messages:
                node = Node(m.queue, m.key)
                missing = [p for p in g.parents(node) if p not in acked]
                assert not missing, f"{m.key} delivered before its parents {missing} were acknowledged"
            for m in messages:
                assert m.ack()
                acked.add(Node(m.queue, m.key))
            rounds.append(sorted(m.key for m in messages))
    finally:
        for client in clients.values():
            if client is not q:
                client.close()
    return rounds


def test_the_etl_graph_in_one_call_then_worked_through(q: DelayedQueue, dsn: str) -> None:
    g, n = etl("2024-06-01")
    assert g.batches()[0][0] == "etl" and len(g.batches()) == 1  # one queue: one dq_offer_many call
    outcomes = q.offer_graph(g)
    assert outcomes == dict.fromkeys(g.nodes, OfferOutcome.CREATED)
    assert work_through(q, dsn, g) == [
        ["extract/2024-06-01"],
        ["transform/a/2024-06-01", "transform/b/2024-06-01", "transform/c/2024-06-01"],
        ["load/2024-06-01"],
        ["report/2024-06-01"],
    ]


def test_a_graph_across_queues_in_one_transaction(q: DelayedQueue, dsn: str) -> None:
    g, n = etl("2024-06-02", report_queue="reports")
    assert [queue for queue, _ in g.batches()] == ["etl", "reports"]
    q.offer_graph(g)
    assert len(work_through(q, dsn, g)) == 4


def test_a_graph_half_acknowledged_holds_the_rest(q: DelayedQueue, dsn: str) -> None:
    g, n = etl("2024-06-03")
    q.offer_graph(g)
    with DelayedQueue(dsn, "etl") as etlq:
        (extract,) = etlq.poll(10, LOCK)
        assert extract.ack()
        transforms = etlq.poll(10, LOCK)
        assert len(transforms) == 3
        for m in transforms[:2]:
            assert m.ack()
        assert etlq.poll(10, LOCK) == []  # load waits for the third transform
        stored = etlq.get(n["load"].key)
        assert stored is not None
        assert transforms[2].ack()
        assert [m.key for m in etlq.poll(10, LOCK)] == [n["load"].key]


def test_offer_graph_is_all_or_nothing(q: DelayedQueue, dsn: str) -> None:
    """A node the database refuses (a payload type too long) rolls back the whole graph, across queues."""
    g = Graph()
    a = g.add("etl", "a", 1)
    g.add("other", "b", b"2", after=[a], payload_type="t" * (pyqueue.limits.PAYLOAD_TYPE_CHARS + 1))
    with pytest.raises(pyqueue.ValueTooLong):
        q.offer_graph(g)
    with DelayedQueue(dsn, "etl") as etlq:
        assert etlq.get("a") is None


def test_offer_graph_again_ignores_what_is_there(q: DelayedQueue) -> None:
    g, _ = etl("2024-06-04")
    q.offer_graph(g)
    assert set(q.offer_graph(g).values()) == {OfferOutcome.IGNORED}
    with pytest.raises(pyqueue.InvalidArgument, match="after applies to a new message") as e:
        q.offer_graph(g, can_update=True)
    assert e.value.sqlstate == "22023"


def app_connection(q: DelayedQueue, dsn: str):  # type: ignore[no-untyped-def]
    """The application's own connection (not autocommit) of the kind ``q`` takes as ``conn=``."""
    if isinstance(q, Blocking):
        return Blocking(q._runner.run(psycopg.AsyncConnection.connect(dsn)), q._runner)
    return psycopg.connect(dsn)


@pytest.mark.parametrize("open_first", [False, True], ids=["no transaction open", "a transaction open"])
def test_offer_graph_in_the_callers_transaction(q: DelayedQueue, dsn: str, open_first: bool) -> None:
    """On the caller's connection the graph goes or stays with the caller's transaction."""
    g, n = etl("2024-06-05")
    conn = app_connection(q, dsn)
    try:
        if open_first:
            conn.execute("SELECT 1")
        q.offer_graph(g, conn=conn)
        conn.rollback()
        with DelayedQueue(dsn, "etl") as etlq:
            assert etlq.get(n["extract"].key) is None
        q.offer_graph(g, conn=conn)
        conn.commit()
        with DelayedQueue(dsn, "etl") as etlq:
            assert etlq.get(n["extract"].key) is not None
    finally:
        conn.close()


def test_parents_outside_the_graph(q: DelayedQueue, dsn: str) -> None:
    q.offer("upstream", 0)
    g = Graph()
    child = g.add(q.queue, "child", 1, after=["upstream"])
    other = g.add("other", "other-child", 2)
    g.fan_in([(q.queue, "upstream"), child], other)
    q.offer_graph(g)
    (m,) = q.poll(10, LOCK)
    assert m.key == "upstream"
    assert m.ack()
    (m,) = q.poll(10, LOCK)
    assert m.key == "child"


# -- the builder alone (no I/O) ------------------------------------------------------------------

def test_batches_put_parents_first_whatever_the_order_of_adding() -> None:
    g = Graph()
    c = g.add("q", "c", 3)
    b = g.add("q", "b", 2)
    a = g.add("q", "a", 1)
    g.chain(a, b, c)
    ((queue, requests),) = g.batches()
    assert queue == "q"
    assert [(r.key, r.after) for r in requests] == [("a", None), ("b", ["a"]), ("c", ["b"])]


def test_batches_group_each_queue_as_far_as_the_order_allows() -> None:
    g = Graph()
    a1 = g.add("A", "a1", 0)
    b1 = g.add("B", "b1", 0, after=[a1])
    a2 = g.add("A", "a2", 0, after=[b1])
    a3 = g.add("A", "a3", 0, after=[a1])
    assert [(q, [r.key for r in rs]) for q, rs in g.batches()] == [("A", ["a1", "a3"]), ("B", ["b1"]), ("A", ["a2"])]
    assert dict(zip(["a2", "a3"], [g.parents(a2), g.parents(a3)], strict=True)) == {"a2": [b1], "a3": [a1]}
    # a parent in another queue goes out as a node (queue and key), one in the same queue as its key
    ((_, (b,)),) = [(q, rs) for q, rs in g.batches() if q == "B"]
    assert b.after == [a1]


def test_a_cycle_in_the_graph_is_refused_before_any_io() -> None:
    g = Graph()
    a = g.add("q", "a", 0)
    b = g.add("other", "b", 0, after=[a])
    g.after(a, b)
    q = DelayedQueue("host=/nonexistent dbname=none", "q")
    with pytest.raises(pyqueue.InvalidArgument, match=r"cycle among \(q, a\), \(other, b\)"):
        q.offer_graph(g)


@pytest.mark.parametrize(("build", "words"), [
    (lambda g: [g.add("q", "a", 0), g.add("q", "a", 1)], "has a node 'a' of queue 'q' already"),
    (lambda g: g.after(Node("q", "nowhere"), "x"), "child must be a node of this graph"),
    (lambda g: g.add("", "a", 0), "queue"),
    (lambda g: g.add("q", 5, 0), "key"),
], ids=["twice", "a foreign node", "an empty queue", "a key not a str"])
def test_the_builder_refuses(build, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pyqueue.InvalidArgument, match=words):
        build(Graph())


def test_a_request_of_the_builder_is_an_offer_request() -> None:
    g = Graph()
    g.add("q", "a", {"x": 1}, priority=3, on_parent_failure="proceed", headers={"h": "v"})
    ((_, (r,)),) = g.batches()
    assert r == OfferRequest("a", {"x": 1}, priority=3, headers={"h": "v"}, on_parent_failure="proceed")
