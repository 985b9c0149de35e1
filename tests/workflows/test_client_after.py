"""Offering after others from the Python clients: ``offer(after=...)``, ``offer_many`` requests with
parents, and the typed errors. Every test taking ``q`` runs against the sync and the asyncio client
(the blocking view of tests/support/blocking.py)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

import pyqueue
from pyqueue import DelayedQueue, OfferOutcome, OfferRequest, limits

LOCK = timedelta(minutes=5)


def polled(q: DelayedQueue, count: int = 100) -> dict[str, object]:
    """Poll everything deliverable now: {key: message}."""
    return {m.key: m for m in q.poll(count, LOCK)}


def test_offer_after_holds_the_child_until_its_parent_is_acknowledged(q: DelayedQueue) -> None:
    assert q.offer("parent", {"n": 1}) is OfferOutcome.CREATED
    assert q.offer("child", {"n": 2}, after=["parent"]) is OfferOutcome.CREATED
    got = polled(q)
    assert list(got) == ["parent"]
    assert polled(q) == {}  # the child is not due while its parent is in flight
    assert got["parent"].ack()  # type: ignore[attr-defined]
    assert list(polled(q)) == ["child"]


def test_after_takes_pairs_and_message_objects(q: DelayedQueue, dsn: str) -> None:
    with DelayedQueue(dsn, "other") as other:
        other.offer("a", "x")
        q.offer("b", "y")
        (b,) = q.poll(1, LOCK)
        # a (queue, key) pair of another queue, and the delivery being handled
        assert q.offer("c", "z", after=[("other", "a"), b]) is OfferOutcome.CREATED
        assert b.ack()
        assert polled(q) == {}
        (a,) = other.poll(1, LOCK)
        assert a.ack()
        assert list(polled(q)) == ["c"]


def test_a_missing_parent_counts_as_acknowledged(q: DelayedQueue) -> None:
    assert q.offer("child", 1, after=["never-offered"]) is OfferOutcome.CREATED
    assert list(polled(q)) == ["child"]


def test_on_parent_failure_proceed(q: DelayedQueue) -> None:
    q.offer("parent", 1)
    q.offer("child", 2, after=["parent"], on_parent_failure="proceed")
    assert q.cancel("parent")
    assert list(polled(q)) == ["child"]


def test_can_update_false_ignores_an_existing_key(q: DelayedQueue) -> None:
    q.offer("parent", 1)
    q.offer("child", 2)
    assert q.offer("child", 3, can_update=False, after=["parent"]) is OfferOutcome.IGNORED


BAD_AFTER = [
    # (after, on_parent_failure, exception, sqlstate, words in the message)
    (["child"], "wait", pyqueue.InvalidArgument, "22023", "names the message itself"),
    (["p"], "later", pyqueue.InvalidArgument, "22023", "on_parent_failure must be wait, dead_letter or proceed"),
    ([""], "wait", pyqueue.InvalidArgument, "22023", "after[1] key"),
    (["k" * (limits.KEY_CHARS + 1)], "wait", pyqueue.ValueTooLong, "22001", "after[1] key"),
    ([str(i) for i in range(limits.AFTER_PARENTS_MAX + 1)], "wait", pyqueue.LimitExceeded, "54000",
     f"more than {limits.AFTER_PARENTS_MAX}"),
]


@pytest.mark.parametrize(("after", "on_parent_failure", "exc", "sqlstate", "words"), BAD_AFTER,
                         ids=["itself", "on_parent_failure", "empty key", "long key", "too many"])
def test_bad_after_raises_the_typed_error(q: DelayedQueue, after: list[str], on_parent_failure: str,
                                          exc: type[Exception], sqlstate: str, words: str) -> None:
    with pytest.raises(exc) as info:
        q.offer("child", 1, after=after, on_parent_failure=on_parent_failure)
    assert info.value.sqlstate == sqlstate  # type: ignore[attr-defined]
    assert words in str(info.value)
    assert q.get("child") is None


@pytest.mark.parametrize("after", ["parent", [1], [("a", "b", "c")], [("a", 2)], {"a": "b"}],
                         ids=["a str", "an int", "a triple", "a pair with an int", "a mapping"])
def test_malformed_after_is_refused_before_any_io(after: object) -> None:
    q = DelayedQueue("host=/nonexistent dbname=none", "q")  # never connects: refused first
    with pytest.raises(pyqueue.InvalidArgument, match="after"):
        q.offer("child", 1, after=after)  # type: ignore[arg-type]


def test_after_on_an_existing_key_with_can_update_is_refused(q: DelayedQueue) -> None:
    q.offer("parent", 1)
    q.offer("child", 2)
    with pytest.raises(pyqueue.InvalidArgument, match="after applies to a new message") as info:
        q.offer("child", 3, after=["parent"])
    assert info.value.sqlstate == "22023"


def test_offer_many_offers_a_graph_in_one_call(q: DelayedQueue) -> None:
    items = [
        OfferRequest("extract", 1),
        OfferRequest("t1", 2, after=["extract"]),
        OfferRequest("t2", 3, after=[(q.queue, "extract")], on_parent_failure="proceed"),
        OfferRequest("load", 4, after=["t1", "t2"]),
        OfferRequest("plain", 5),
    ]
    assert q.offer_many(items) == dict.fromkeys(["extract", "t1", "t2", "load", "plain"], OfferOutcome.CREATED)
    for expected in (["extract", "plain"], ["t1", "t2"], ["load"]):
        got = polled(q)
        assert sorted(got) == expected
        assert q.ack_many(list(got.values())) == len(expected)  # type: ignore[arg-type]
    assert polled(q) == {}


def test_offer_many_counts_with_parents(q: DelayedQueue) -> None:
    q.offer("p", 0)
    items = [OfferRequest("a", 1, after=["p"]), OfferRequest("b", 2, after=["a"]), OfferRequest("c", 3)]
    assert q.offer_many_counts(items) == pyqueue.OfferCounts(3, 0, 0)
    assert sorted(polled(q)) == ["c", "p"]
    assert q.get("b") is not None


def test_offer_many_refuses_a_later_parent(q: DelayedQueue) -> None:
    items = [OfferRequest("a", 1, after=["b"]), OfferRequest("b", 2, after=["a"])]
    with pytest.raises(pyqueue.InvalidArgument, match=r"afters\[1\] names b \(keys\[2\]\), which comes later") as e:
        q.offer_many(items)
    assert e.value.sqlstate == "22023"
    assert q.get("a") is None


def test_offer_many_names_the_item_refused_before_any_io() -> None:
    q = DelayedQueue("host=/nonexistent dbname=none", "q")
    with pytest.raises(pyqueue.InvalidArgument, match=r"items\[1\]: after\[0\] must be a key"):
        q.offer_many([OfferRequest("a", 1), OfferRequest("b", 2, after=[3])])  # type: ignore[list-item]


def test_middleware_sees_and_may_change_the_parents(dsn: str) -> None:
    class NoParents(pyqueue.Middleware):
        def offer(self, call, call_next):  # type: ignore[no-untyped-def]
            seen.append([r.after for r in call.requests])
            call.requests = [dataclasses.replace(r, after=None) for r in call.requests]
            return call_next(call)

    seen: list[list[object]] = []
    with DelayedQueue(dsn, "mw", middleware=[NoParents()]) as q:
        q.offer("p", 1)
        q.offer("c", 2, after=["p"])
        assert seen[-1] == [("p",)]
        assert sorted(polled(q)) == ["c", "p"]
