"""A graph of messages offered at once: :class:`Graph` collects nodes (a message named by its queue
and key) and the edges between them, and orders them into the ``offer_many`` batches that one
transaction runs (:meth:`pyqueue.DelayedQueue.offer_graph`, and its asyncio twin).

No I/O here. The database keeps the rules (lengths, the number of parents, cycles through messages
already stored, ``after`` on an existing key): the graph checks only what it must to order its
batches, that its nodes are distinct and that its own edges form no cycle.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidArgument
from ..model import OfferOutcome, OfferRequest, ParentRef
from .checks import check_queue_name, check_str, described
from .middleware import OfferCall

__all__ = ["Graph", "Node"]


@dataclass(frozen=True, slots=True)
class Node:
    """A message of a :class:`Graph`, named by its queue and key (what :meth:`Graph.add` returns).
    It may be named as a parent anywhere a message may (``after=[node]``), and keys the outcomes
    :meth:`pyqueue.DelayedQueue.offer_graph` returns."""

    queue: str
    key: str


@dataclass
class _Entry:
    request: OfferRequest
    parents: list[ParentRef] = field(default_factory=list)


class Graph:
    """Messages and the order between them, offered in one transaction by
    :meth:`pyqueue.DelayedQueue.offer_graph` (or :meth:`pyqueue.aio.AsyncDelayedQueue.offer_graph`).

    Build it with :meth:`add` (a node, with its parents if known), then say who waits for whom with
    :meth:`after`, :meth:`chain`, :meth:`fan_out` and :meth:`fan_in`, in any order::

        g = Graph()
        extract = g.add("etl", "extract/2024-06-01", {"day": "2024-06-01"})
        transforms = [g.add("etl", f"transform/{t}/2024-06-01", {"table": t}) for t in ("a", "b", "c")]
        load = g.add("etl", "load/2024-06-01", {})
        report = g.add("reports", "report/2024-06-01", {})
        g.fan_out(extract, transforms)
        g.fan_in(transforms, load)
        g.chain(load, report)
        outcomes = q.offer_graph(g)        # {Node: OfferOutcome}

    A parent may also be a message outside the graph (a key of the child's queue, a ``(queue,
    key)`` pair, a delivery): it is passed to the database as it is.
    """

    def __init__(self) -> None:
        self._entries: dict[Node, _Entry] = {}

    def add(
        self, queue: str, key: str, payload: Any, *, after: Iterable[ParentRef] = (),
        on_parent_failure: str = "wait", at: datetime | None = None, delay: timedelta | float | None = None,
        payload_type: str | None = None, priority: int = 0, group: str | None = None,
        expires_at: datetime | None = None, ttl: timedelta | float | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> Node:
        """Add the message ``key`` of ``queue``; the other parameters are those of
        :meth:`pyqueue.DelayedQueue.offer` (``at``/``delay`` is the due time once released).

        :param after: its parents: nodes of this graph (added before or after), or messages
            outside it (a key of ``queue``, a ``(queue, key)`` pair, a message object).
        :returns: the :class:`Node` naming it.
        :raises InvalidArgument: a queue name that is not a non-empty str, a key that is not a str,
            a (queue, key) added twice.
        """
        node = Node(check_queue_name(queue), check_str(key, "key"))
        if node in self._entries:
            raise InvalidArgument(f"the graph has a node {key!r} of queue {queue!r} already")
        request = OfferRequest(key, payload, at, delay, payload_type, priority, group, expires_at, ttl, headers,
                               None, on_parent_failure)
        self._entries[node] = _Entry(request)
        self.after(node, *after)
        return node

    def after(self, child: Node, *parents: ParentRef) -> Node:
        """Make ``child`` wait for each of ``parents`` as well; returns ``child``."""
        entry = self._entry(child, "child")
        for parent in parents:
            if parent not in entry.parents:
                entry.parents.append(parent)
        return child

    def chain(self, *nodes: Node) -> list[Node]:
        """Each node after the one before it (``a`` then ``b`` then ``c``); returns the nodes."""
        for parent, child in zip(nodes, nodes[1:], strict=False):
            self.after(child, parent)
        return list(nodes)

    def fan_out(self, parent: ParentRef, children: Iterable[Node]) -> list[Node]:
        """Every one of ``children`` after ``parent`` (they may then run in parallel)."""
        children = list(children)
        for child in children:
            self.after(child, parent)
        return children

    def fan_in(self, parents: Iterable[ParentRef], child: Node) -> Node:
        """``child`` after every one of ``parents``."""
        return self.after(child, *parents)

    @property
    def nodes(self) -> list[Node]:
        """The nodes, in the order they were added."""
        return list(self._entries)

    def parents(self, node: Node) -> list[ParentRef]:
        """The parents of ``node``, as given."""
        return list(self._entry(node, "node").parents)

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, node: object, name: str) -> _Entry:
        if not isinstance(node, Node) or node not in self._entries:
            raise InvalidArgument(f"{name} must be a node of this graph (what Graph.add returned), got "
                                  f"{described(node)}")
        return self._entries[node]

    def _in_graph(self, ref: ParentRef, queue: str) -> Node | None:
        """The node of this graph that ``ref`` (a parent of a child of ``queue``) names, if any."""
        if isinstance(ref, str):
            node = Node(queue, ref)
        elif isinstance(ref, (tuple, list)) and len(ref) == 2:
            node = Node(str(ref[0]), str(ref[1]))
        elif isinstance(ref, Node):
            node = ref
        else:
            node = Node(str(getattr(ref, "queue", "")), str(getattr(ref, "key", "")))
        return node if node in self._entries else None

    def batches(self) -> list[tuple[str, list[OfferRequest]]]:
        """The ``offer_many`` calls that offer the graph, in order: ``(queue, requests)``, each
        request after its parents in the graph (in an earlier call, or earlier in the same call),
        as few calls as this greedy order finds (one for a graph in one queue).

        :raises InvalidArgument: the graph's own edges form a cycle (it names its nodes).
        """
        graph_parents = {node: {p for ref in e.parents if (p := self._in_graph(ref, node.queue)) is not None}
                         for node, e in self._entries.items()}
        order = _topological(list(self._entries), graph_parents)
        batches: list[tuple[str, list[OfferRequest]]] = []
        sent: set[Node] = set()
        remaining = order
        while remaining:
            queue = remaining[0].queue
            batch: list[Node] = []
            taken: set[Node] = set()
            rest: list[Node] = []
            for node in remaining:  # in topological order: a node's parents come before it
                if node.queue == queue and graph_parents[node] <= sent | taken:
                    batch.append(node)
                    taken.add(node)
                else:
                    rest.append(node)
            sent |= taken
            remaining = rest
            batches.append((queue, [self._request(n) for n in batch]))
        return batches

    def offer_calls(self, can_update: bool) -> tuple[list[tuple[str, list[OfferRequest]]], list[OfferCall]]:
        """:meth:`batches`, and each as the ``offer_many`` call a middleware sees
        (:class:`pyqueue.OfferCall`, ``batch`` True) with ``can_update``.

        :raises InvalidArgument: as :meth:`batches`.
        """
        batches = self.batches()
        return batches, [OfferCall(queue, requests, can_update, True) for queue, requests in batches]

    def _request(self, node: Node) -> OfferRequest:
        entry = self._entries[node]
        after = [p.key if isinstance(p, Node) and p.queue == node.queue else p for p in entry.parents]
        return dataclasses.replace(entry.request, after=after or None)

    def outcomes(self, batches: Sequence[tuple[str, Sequence[OfferRequest]]],
                 results: Sequence[Mapping[str, OfferOutcome]]) -> dict[Node, OfferOutcome]:
        """``{node: outcome}`` in the order the nodes were added, from ``batches`` (what
        :meth:`batches` returned) and the result of each (``{key: outcome}``, in the same order)."""
        by_node = {Node(queue, key): outcome
                   for (queue, _), result in zip(batches, results, strict=True) for key, outcome in result.items()}
        return {node: by_node[node] for node in self._entries if node in by_node}


def _topological(nodes: list[Node], parents: Mapping[Node, set[Node]]) -> list[Node]:
    """``nodes`` ordered parents first, ties in the given order (Kahn's algorithm); a cycle raises
    :class:`InvalidArgument` naming the nodes on it."""
    waiting = {n: len(parents[n]) for n in nodes}
    children: dict[Node, list[Node]] = {n: [] for n in nodes}
    for n in nodes:
        for p in parents[n]:
            children[p].append(n)
    position = {n: i for i, n in enumerate(nodes)}
    ready = [(position[n], n) for n in nodes if waiting[n] == 0]  # a heap by position
    order: list[Node] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for c in children[node]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (position[c], c))
    if len(order) < len(nodes):
        cycle = [f"({n.queue}, {n.key})" for n in nodes if waiting[n] > 0]
        raise InvalidArgument(f"the graph's edges form a cycle among {', '.join(cycle[:10])}"
                              f"{' …' if len(cycle) > 10 else ''}")
    return order
