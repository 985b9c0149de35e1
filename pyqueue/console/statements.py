"""The console's reads and actions as :class:`~pyqueue.core.statements.Statement` values: SQL text
naming the install's ``dq_*`` functions (``{s}``, see :func:`~pyqueue.core.statements.qualified`)
and parameters, never SQL built from request input. The actions a client also has (pause,
resume, cancel, purge, configure, cron pause/resume) come from
:class:`~pyqueue.core.statements.QueueStatements`, so their checks are the client's."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from ..core.checks import check_int, check_queue_name, check_str
from ..core.statements import Statement, _records, _value, qualified

#: The most rows one page of the message browser or of the audit log shows.
PAGE_ROWS = 50
#: The largest part of a payload a message page shows (bytes); the size is shown in full.
PAYLOAD_SHOWN_BYTES = 64 * 1024
#: The states the message browser filters by (``dq_browse_messages``).
STATES = ("ready", "scheduled", "in_flight", "redelivered", "dead", "held", "expired", "blocked")
#: The most parents and children a message page lists (each); a fan-out may have thousands.
DEPENDENCY_ROWS = 100


@dataclass(frozen=True, slots=True)
class ConsoleTexts:
    """The SQL text of every console read and of the actions no client method has."""

    metrics: str = "SELECT * FROM {s}dq_metrics() ORDER BY queue"
    health: str = "SELECT * FROM {s}dq_table_health() ORDER BY component, name, figure"
    config: str = "SELECT * FROM {s}dq_queue_config(%(queue)s)"
    browse: str = ("SELECT * FROM {s}dq_browse_messages(%(queue)s, %(state)s, %(prefix)s, %(after_key)s, "
                   "%(after_id)s, %(max_rows)s)")
    detail: str = "SELECT * FROM {s}dq_message_detail(%(queue)s, %(id)s, %(max_payload_bytes)s)"
    dependencies: str = "SELECT * FROM {s}dq_dependencies(%(queue)s, %(key)s)"
    dead_letter_groups: str = "SELECT * FROM {s}dq_dead_letter_groups(%(queue)s, %(max_rows)s)"
    count_dead_letters: str = "SELECT {s}dq_count_dead_letters(%(queue)s, %(dead_from)s, %(last_error)s) AS n"
    redrive_ids: str = "SELECT {s}dq_redrive_messages(%(queue)s, %(ids)s::bigint[]) AS moved"
    redrive_matching: str = ("SELECT {s}dq_redrive_matching(%(queue)s, %(dead_from)s, %(last_error)s, "
                             "%(max_count)s) AS moved")
    make_due: str = "SELECT {s}dq_make_due(%(queue)s, %(key)s) AS done"
    throughput: str = "SELECT * FROM {s}dq_throughput(%(queue)s, %(since)s, %(bucket)s) ORDER BY bucket_start"
    audit: str = ("SELECT {s}dq_audit(%(actor)s, %(action)s, %(queue)s, %(target)s, %(details)s, %(outcome)s) "
                  "AS id")
    audit_entries: str = "SELECT * FROM {s}dq_audit_entries(%(before_id)s, %(max_rows)s)"
    schedules: str = "SELECT * FROM {s}dq_cron_list()"
    channels: str = "SELECT {s}dq_channel(q) AS channel FROM unnest(%(queues)s::text[]) AS q"


@functools.cache
def console_texts(schema: str | None) -> ConsoleTexts:
    """The console's statements naming the install in ``schema`` (None: the search_path's)."""
    return qualified(ConsoleTexts, schema)


def _rows(names: Sequence[str], rows: Any) -> list[dict[str, Any]]:
    return _records(dict)(names, rows)


def _first(names: Sequence[str], rows: Any) -> dict[str, Any] | None:
    found = _rows(names, rows)
    return found[0] if found else None


class ConsoleStatements:
    """The statements of the console for one install."""

    def __init__(self, schema: str | None) -> None:
        self.sql = console_texts(schema)

    def metrics(self) -> Statement[list[dict[str, Any]]]:
        return Statement(self.sql.metrics, {}, _rows)

    def health(self) -> Statement[list[dict[str, Any]]]:
        return Statement(self.sql.health, {}, _rows)

    def config(self, queue: str) -> Statement[dict[str, Any] | None]:
        return Statement(self.sql.config, {"queue": check_queue_name(queue)}, _first)

    def browse(self, queue: str, state: str | None, prefix: str | None, after_key: str | None,
               after_id: int | None, max_rows: int = PAGE_ROWS) -> Statement[list[dict[str, Any]]]:
        """One page of ``dq_browse_messages``, by (key, id) after the given ones; one row more than
        ``max_rows`` is asked for, to know whether a next page exists."""
        params = {"queue": check_queue_name(queue), "state": state, "prefix": prefix or None,
                  "after_key": after_key, "after_id": after_id, "max_rows": max_rows + 1}
        return Statement(self.sql.browse, params, _rows)

    def detail(self, queue: str, message_id: int) -> Statement[dict[str, Any] | None]:
        params = {"queue": check_queue_name(queue), "id": message_id, "max_payload_bytes": PAYLOAD_SHOWN_BYTES}
        return Statement(self.sql.detail, params, _first)

    def dependencies(self, queue: str, key: str) -> Statement[list[dict[str, Any]]]:
        """``dq_dependencies``: the parents the message of ``key`` waits for, then its waiting children."""
        return Statement(self.sql.dependencies, {"queue": check_queue_name(queue), "key": check_str(key, "key")},
                         _rows)

    def dead_letter_groups(self, queue: str, max_rows: int = 100) -> Statement[list[dict[str, Any]]]:
        return Statement(self.sql.dead_letter_groups, {"queue": check_queue_name(queue), "max_rows": max_rows},
                         _rows)

    def count_dead_letters(self, queue: str, dead_from: str | None, last_error: str | None) -> Statement[int]:
        params = {"queue": check_queue_name(queue), "dead_from": dead_from or None, "last_error": last_error}
        return Statement(self.sql.count_dead_letters, params, _value("n", int, 0))

    def redrive_ids(self, queue: str, ids: list[int]) -> Statement[int]:
        return Statement(self.sql.redrive_ids, {"queue": check_queue_name(queue), "ids": ids}, _value("moved", int, 0))

    def redrive_matching(self, queue: str, dead_from: str | None, last_error: str | None,
                         max_count: int) -> Statement[int]:
        params = {"queue": check_queue_name(queue), "dead_from": dead_from or None, "last_error": last_error,
                  "max_count": check_int(max_count, "max_count", 1)}
        return Statement(self.sql.redrive_matching, params, _value("moved", int, 0))

    def make_due(self, queue: str, key: str) -> Statement[bool]:
        params = {"queue": check_queue_name(queue), "key": check_str(key, "key")}
        return Statement(self.sql.make_due, params, _value("done", bool, False))

    def throughput(self, queue: str, since: timedelta = timedelta(hours=1),
                   bucket: timedelta = timedelta(minutes=1)) -> Statement[list[dict[str, Any]]]:
        params = {"queue": check_queue_name(queue), "since": since, "bucket": bucket}
        return Statement(self.sql.throughput, params, _rows)

    def audit(self, actor: str, action: str, queue: str | None, target: str | None, details: dict[str, Any],
              outcome: str) -> Statement[int]:
        params = {"actor": actor, "action": action, "queue": queue, "target": target, "details": Jsonb(details),
                  "outcome": outcome}
        return Statement(self.sql.audit, params, _value("id", int))

    def audit_entries(self, before_id: int | None, max_rows: int = PAGE_ROWS) -> Statement[list[dict[str, Any]]]:
        return Statement(self.sql.audit_entries, {"before_id": before_id, "max_rows": max_rows + 1}, _rows)

    def schedules(self) -> Statement[list[dict[str, Any]]]:
        """Every cron schedule (``dq_cron_list()``): next occurrences, last tick, last error."""
        return Statement(self.sql.schedules, {}, _rows)

    def channels(self, queues: list[str]) -> Statement[list[str]]:
        return Statement(self.sql.channels, {"queues": queues}, _records(lambda r: r["channel"]))
