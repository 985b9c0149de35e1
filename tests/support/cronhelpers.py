"""Schedules for the cron tests, installed through SQL as an operator does."""

from __future__ import annotations

from typing import Any

import psycopg


def install(conn: psycopg.Connection[Any], name: str, schedule: str, payload: str = "x", *,
            queue: str = "q", zone: str = "UTC", lookahead: str = "1 hour") -> str:
    """``dq_cron_install`` of the schedule ``name`` (a text payload); its configuration hash."""
    row = conn.execute("SELECT dq_cron_install(%s, %s, %s, %s::text, %s, NULL, %s::interval)",
                       (name, queue, schedule, payload, zone, lookahead)).fetchone()
    assert row is not None
    return str(row[0])
