"""The JSON the binding writes is JSON: a payload (payload_type ``json``) or ``headers`` that
``json.dumps`` would turn into text no JSON reader takes (``NaN``, ``Infinity``, an object with the
same key twice) or cannot turn into text at all (a set, a key of another type, a container holding
itself) raises :class:`pyqueue.InvalidArgument` (22023) naming the parameter and where in it the
fault is, and nothing is written. Each case runs on a real server against
:class:`pyqueue.DelayedQueue` and :class:`pyqueue.aio.AsyncDelayedQueue` (through the blocking view
of ``tests/support/blocking.py``), one call at a time: ``offer``, ``offer_many`` and ``cron.install``."""

from __future__ import annotations

import json
import re
from collections import OrderedDict

import pytest

import pyqueue
from pyqueue import OfferRequest, testing
from pyqueue.serializers import registry


def _itself() -> dict[str, object]:
    d: dict[str, object] = {"a": 1}
    d["self"] = d
    return d


NO_NAN = "JSON has no NaN or Infinity"

# (call, the text the error must contain)
CASES = [
    (lambda q: q.offer("k", float("nan")), f"payload is nan, and {NO_NAN}"),
    (lambda q: q.offer("k", float("inf")), f"payload is inf, and {NO_NAN}"),
    (lambda q: q.offer("k", float("-inf")), f"payload is -inf, and {NO_NAN}"),
    (lambda q: q.offer("k", {"a": [1, {"b": float("nan")}]}), f"payload['a'][1]['b'] is nan, and {NO_NAN}"),
    (lambda q: q.offer("k", [(1.5, float("-inf"))]), f"payload[0][1] is -inf, and {NO_NAN}"),
    (lambda q: q.offer("k", {float("nan"): 1}), f"payload has the key nan, and {NO_NAN}"),
    (lambda q: q.offer("k", {1: "a", "1": "b"}), "payload has the keys 1 and '1', both \"1\" in JSON"),
    (lambda q: q.offer("k", {"x": [{True: 1, "true": 2}]}),
     "payload['x'][0] has the keys True and 'true', both \"true\" in JSON"),
    (lambda q: q.offer("k", {None: 1, "null": 2}), "payload has the keys None and 'null', both \"null\" in JSON"),
    (lambda q: q.offer("k", [{"ok": 1}, OrderedDict([(1, "a"), ("1", "b")])]), "payload[1] has the keys 1 and '1'"),
    (lambda q: q.offer("k", {1.0: 1, "1.0": 2}), "payload has the keys 1.0 and '1.0', both \"1.0\" in JSON"),
    (lambda q: q.offer("k", {"s": {1, 2}}), "payload['s'] is a set, which JSON cannot hold"),
    (lambda q: q.offer("k", {"b": b"x"}, payload_type="json"), "payload['b'] is a bytes, which JSON cannot hold"),
    (lambda q: q.offer("k", {(1, 2): "x"}),
     "payload has the key (1, 2), a tuple; JSON keys are str, int, float, bool or None"),
    (lambda q: q.offer("k", _itself()), "payload['self'] contains itself"),
    (lambda q: q.offer("k", {"a": ["ok", "\ud800"]}), "payload['a'][1] is a str with a lone surrogate, which UTF-8"),
    (lambda q: q.offer("k", "x", headers={"a": "\udfff"}), "headers['a'] is a str with a lone surrogate, which UTF-8"),
    (lambda q: q.offer("k", "x", headers={"a": float("nan")}), f"headers['a'] is nan, and {NO_NAN}"),
    (lambda q: q.offer("k", "x", headers={"t": [float("inf")]}), f"headers['t'][0] is inf, and {NO_NAN}"),
    (lambda q: q.offer("k", "x", headers={1: "a", "1": "b"}), "headers has the keys 1 and '1', both \"1\" in JSON"),
    (lambda q: q.offer("k", "x", headers={"s": {1}}), "headers['s'] is a set, which JSON cannot hold"),
    (lambda q: q.offer_many([("ok", 1), ("bad", float("nan"))]), f"items[1]: payload is nan, and {NO_NAN}"),
    (lambda q: q.offer_many([("ok", 1), ("bad", {2: 0, "2": 1})]), "items[1]: payload has the keys 2 and '2'"),
    (lambda q: q.offer_many([OfferRequest("ok", 1), OfferRequest("bad", 1, headers={"a": float("inf")})]),
     f"items[1]: headers['a'] is inf, and {NO_NAN}"),
    (lambda q: q.offer_many([("ok", 1), ("bad", {"s": frozenset()})]), "items[1]: payload['s'] is a frozenset"),
    (lambda q: q.cron.install("nightly", schedule="@daily", payload={"x": float("nan")}),
     f"payload['x'] is nan, and {NO_NAN}"),
]


@pytest.mark.parametrize(("call", "expected"), CASES, ids=[c[1][:50] for c in CASES])
def test_what_is_not_json_is_refused_and_nothing_is_written(q, dsn: str, call, expected: str) -> None:
    with pytest.raises(pyqueue.InvalidArgument, match=re.escape(expected)) as info:
        call(q)
    assert type(info.value) is pyqueue.InvalidArgument
    assert info.value.sqlstate == "22023"
    assert info.value.__cause__ is None  # raised by the binding, before any SQL
    assert testing.offered(dsn, "emails") == {}
    assert q.cron.list() == []


def test_keys_json_writes_as_strings_are_kept_when_they_do_not_collide(q, dsn: str) -> None:
    """The refusal is for collisions only: int, float, bool and None keys that stay distinct are
    written as json writes them (strings), finite floats as numbers, tuples as arrays."""
    payload = {1: "one", 2.5: "x", False: "f", None: "n", "s": (1, 2.5, -0.0)}
    q.offer("k", payload, headers={7: "seven"})
    stored = testing.offered(dsn, "emails")["k"]
    assert json.loads(stored["payload"]) == {"1": "one", "2.5": "x", "false": "f", "null": "n", "s": [1, 2.5, -0.0]}
    assert q.get("k").payload == {"1": "one", "2.5": "x", "false": "f", "null": "n", "s": [1, 2.5, -0.0]}
    assert q.get("k").headers == {"7": "seven"}


def test_the_json_serializer_itself_refuses_nan() -> None:
    """``pyqueue.serializers.registry`` (the encoder the queues use) refuses on its own, for code
    that encodes a payload without offering it."""
    with pytest.raises(pyqueue.InvalidArgument, match=re.escape(f"payload[2] is nan, and {NO_NAN}")):
        registry.encode([1, 2, float("nan")], "json")
    assert registry.encode({1: [1.5]}, "json") == (b'{"1":[1.5]}', "json")
