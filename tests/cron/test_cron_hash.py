"""One definition, one configuration hash: a JSON payload installed from SQL (jsonb, stored as
``{"a": 1, "b": [1, 2]}``) and from Python (compact bytes ``{"b":[1,2],"a":1}``) is the same
schedule, so installing it from the other side changes nothing. A NULL argument makes no hash."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pyqueue import cron


def test_sql_and_python_installs_of_equal_json_get_one_hash(conn: psycopg.Connection) -> None:
    from_sql = conn.execute(
        "SELECT dq_cron_install('digest', 'mail', '0 9 * * *', '{\"a\": 1, \"b\": [1, 2]}'::jsonb, 'Europe/Paris')"
    ).fetchone()[0]
    keys = conn.execute("SELECT array_agg(key ORDER BY key) FROM dq_messages WHERE queue = 'mail'").fetchone()[0]
    from_python = cron.install(conn, "digest", "mail", "0 9 * * *", {"b": [1, 2], "a": 1}, timezone="Europe/Paris")
    assert from_python == from_sql
    # Same definition: the installed occurrences were kept, not replaced.
    after = conn.execute("SELECT array_agg(key ORDER BY key) FROM dq_messages WHERE queue = 'mail'").fetchone()[0]
    assert after == keys
    assert conn.execute("SELECT dq_cron_config_hash('mail', '0 9 * * *', 'Europe/Paris', "
                        "convert_to('{\"b\":[1,2],\"a\":1}', 'UTF8'), 'json')").fetchone()[0] == from_sql
    # A different document is a different definition.
    assert cron.install(conn, "digest", "mail", "0 9 * * *", {"a": 2}, timezone="Europe/Paris") != from_sql


def test_payload_type_json_with_a_payload_that_is_not_json_is_refused(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        conn.execute("SELECT dq_cron_install('bad', 'mail', '@daily', convert_to('{not json', 'UTF8'), 'UTC', 'json')")
    assert info.value.diag.message_primary.startswith("dq_cron_install: payload is not valid JSON")
    assert conn.execute("SELECT count(*) FROM dq_cron").fetchone()[0] == 0


@pytest.mark.parametrize("null_at", range(5))
def test_cron_config_hash_is_null_when_an_argument_is_null(conn: psycopg.Connection[Any], null_at: int) -> None:
    args: list[Any] = ["q", "@daily", "UTC", b"x", "bytes"]
    (full,) = conn.execute("SELECT dq_cron_config_hash(%s, %s, %s, %s, %s)", args).fetchone()
    assert full is not None and len(full) == 16
    args[null_at] = None
    assert conn.execute("SELECT dq_cron_config_hash(%s::text, %s::text, %s::text, %s::bytea, %s::text)",
                        args).fetchone() == (None,)
