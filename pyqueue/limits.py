"""The size and count limits of the queue, in one place for the Python side.

The database enforces each of them (the ``dq_*`` functions raise the SQLSTATE given below, see
docs/api.md); the binding checks a few of them itself before any I/O (the queue name of a
:class:`pyqueue.DelayedQueue`, a payload type registered in a
:class:`pyqueue.SerializerRegistry`, a worker's batch size, an offer's priority) and names them
in its docstrings.
The database names each of them once, as ``dq__limit_<name>()`` in ``sql/003_limits.sql``;
``tests/install/test_parity.py`` checks that those are exactly these values and that the database enforces
them.

Lengths are in characters (``char_length``), counts in elements or messages, sizes in bytes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

__all__ = [
    "QUEUE_CHARS",
    "KEY_CHARS",
    "PAYLOAD_TYPE_CHARS",
    "ERROR_CHARS",
    "POLL_MAX_COUNT",
    "OFFER_MANY_MAX_ITEMS",
    "REDRIVE_MAX_COUNT",
    "DEAD_LETTERS_MAX_ROWS",
    "CRON_NAME_CHARS",
    "CRON_SCHEDULE_CHARS",
    "CRON_LOOKAHEAD_MAX",
    "OCCURRENCES_MAX_COUNT",
    "PAYLOAD_BYTES_DEFAULT",
    "PAYLOAD_BYTES_MIN",
    "PAYLOAD_BYTES_MAX",
    "WAIT_MAX",
    "PRIORITY_MIN",
    "PRIORITY_MAX",
    "GROUP_CHARS",
    "HEADERS_BYTES",
    "MAX_IN_FLIGHT_MAX",
    "RATE_LIMIT_MAX",
    "RATE_PERIOD_MAX",
    "AFTER_PARENTS_MAX",
]

#: A queue name (and a dead-letter queue name): 1 to 100 characters; longer raises 22001.
QUEUE_CHARS: Final = 100
#: A message key: 1 to 200 characters; longer raises 22001.
KEY_CHARS: Final = 200
#: A payload type tag: 1 to 100 characters; longer raises 22001.
PAYLOAD_TYPE_CHARS: Final = 100
#: The error text of a negative acknowledgement (``dq_nack``): at most 10,000 characters (22001).
ERROR_CHARS: Final = 10_000
#: Messages one poll acquires (``dq_poll_many``, ``dq_poll_or_wait``): 1 to 10,000 (22023).
POLL_MAX_COUNT: Final = 10_000
#: Items of one ``dq_offer_many`` call: at most 100,000 (54000).
OFFER_MANY_MAX_ITEMS: Final = 100_000
#: Dead letters one ``dq_redrive`` call moves: 1 to 100,000 (22023).
REDRIVE_MAX_COUNT: Final = 100_000
#: Dead letters one ``dq_dead_letters`` call returns: 1 to 100,000 (22023).
DEAD_LETTERS_MAX_ROWS: Final = 100_000
#: A cron schedule's name: 1 to 100 characters (22001).
CRON_NAME_CHARS: Final = 100
#: A cron schedule expression: at most 1,000 characters (22001).
CRON_SCHEDULE_CHARS: Final = 1_000
#: How far ahead a cron schedule installs its occurrences: more than 0, at most 366 days (22023).
CRON_LOOKAHEAD_MAX: Final = timedelta(days=366)
#: Instants one ``dq_cron_occurrences`` call returns: 1 to 10,000 (22023).
OCCURRENCES_MAX_COUNT: Final = 10_000
#: The payload limit of a queue never configured otherwise: 1 MiB (an offer over it raises 54000).
PAYLOAD_BYTES_DEFAULT: Final = 1_048_576
#: The smallest payload limit ``dq_configure_queue`` accepts (22023 below it).
PAYLOAD_BYTES_MIN: Final = 1_024
#: The largest payload limit ``dq_configure_queue`` accepts: 1 GiB (22023 above it).
PAYLOAD_BYTES_MAX: Final = 1_073_741_824
#: The longest wait one ``dq_wait`` / ``dq_poll_or_wait`` registers (22023 beyond it): longer waits
#: are made of several registrations.
WAIT_MAX: Final = timedelta(hours=1)
#: A message's priority: -32768 to 32767 (a smallint; 22023 outside), default 0, higher first.
PRIORITY_MIN: Final = -32_768
PRIORITY_MAX: Final = 32_767
#: A FIFO message group name: 1 to 200 characters; longer raises 22001, empty 22023.
GROUP_CHARS: Final = 200
#: A message's headers: a JSON object of at most 8192 bytes as text (54000 beyond).
HEADERS_BYTES: Final = 8_192
#: A queue's concurrency limit (``max_in_flight``): 0 (none) to 100,000 (22023 above).
MAX_IN_FLIGHT_MAX: Final = 100_000
#: A queue's rate limit (``rate_limit`` deliveries per ``rate_period``): 0 (none) to 100,000 (22023 above).
RATE_LIMIT_MAX: Final = 100_000
#: The longest ``rate_period``: 1 day (22023 above; it must also be positive).
RATE_PERIOD_MAX: Final = timedelta(days=1)
#: The parents one message is offered after (``after`` of ``dq_offer``/``dq_offer_many``): at most
#: 10,000 (54000 beyond).
AFTER_PARENTS_MAX: Final = 10_000
