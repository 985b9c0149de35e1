"""The command line facing bad input and hostile data.

Bad arguments end in one line on stderr and exit status 2, never a traceback: every numeric or
duration option of every command, found by walking the argparse parser itself (so an option
added later is covered without editing this test), is fed ``nan``, ``inf``, ``-inf``, ``1e400``,
a negative and two huge values; ``pyqueue worker`` refuses a handler it cannot import. The matrix
calls :func:`pyqueue.cli.main`, the function the ``pyqueue`` command runs (a subprocess per case
would cost minutes); the cases first reported run the real command as a subprocess.

Producer-controlled text (queue names, keys, error texts, payloads, schedule names) never reaches
the terminal raw: control characters (ESC, BEL, CR, C1 controls such as CSI U+009B) and the
Unicode bidirectional overrides are shown escaped in the stats table and in the JSON lines, and
rich markup in a queue name is shown, not interpreted.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import psycopg
import pytest
from commandline import cli, stored

from pyqueue.cli import Duration, Integer, build_parser, main

#: What every numeric or duration option is fed: not finite, negative, beyond any limit.
BAD_NUMBERS = ("nan", "inf", "-inf", "1e400", "-1", "1e300", "1" + "0" * 30)


def numeric_options() -> list[tuple[list[str], argparse.ArgumentParser, argparse.Action]]:
    """(the words of the command, its parser, the option) for every option of every command and
    subcommand that takes a number or a duration (a :class:`pyqueue.cli.Integer` or
    :class:`pyqueue.cli.Duration`, or a bare ``int`` or ``float``, which the next test refuses)."""
    found: list[tuple[list[str], argparse.ArgumentParser, argparse.Action]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif action.option_strings and (isinstance(action.type, (Duration, Integer))
                                            or action.type in (int, float)):
                found.append((words, parser, action))

    walk(build_parser(), [])
    return found


def required_arguments(parser: argparse.ArgumentParser) -> list[str]:
    """Valid values for the command's required options and positional arguments."""
    words: list[str] = []
    for action in parser._actions:
        if action.option_strings and action.required:
            words += [action.option_strings[0], "x"]
        elif not action.option_strings and not isinstance(action, argparse._SubParsersAction) \
                and action.nargs not in ("?", "*"):
            words.append({"handler": "json:dumps", "lock_tokens": str(uuid.uuid4())}.get(action.dest, "x"))
    return words


NUMERIC = numeric_options()


def test_the_walk_finds_the_numeric_options_of_every_command() -> None:
    named = {(" ".join(words), action.option_strings[0]) for words, _, action in NUMERIC}
    for expected in [("offer", "--delay"), ("poll", "--max-count"), ("poll", "--lock-timeout"), ("poll", "--wait"),
                     ("worker", "--concurrency"), ("worker", "--prefetch"), ("worker", "--shutdown-grace"),
                     ("worker", "--cron-tick"), ("stats", "--interval"), ("queue configure", "--max-in-flight"),
                     ("queue configure", "--rate-period"), ("queue redrive", "--max-count"),
                     ("queue dead-letters", "--max-rows"), ("cron tick", "--every"),
                     ("cron install", "--lookahead")]:
        assert expected in named, sorted(named)
    # No option converts with a bare int or float: those accept nan, inf and 1e400 (or overflow later).
    bare = [(" ".join(words), a.option_strings[0]) for words, _, a in NUMERIC if a.type in (int, float)]
    assert bare == []


@pytest.mark.parametrize(("words", "parser", "action"), NUMERIC,
                         ids=[f"{' '.join(w)} {a.option_strings[0]}" for w, _, a in NUMERIC])
def test_every_numeric_option_refuses_bad_numbers_in_one_line(dsn: str, conn, capsys, words: list[str],
                                                               parser: argparse.ArgumentParser,
                                                               action: argparse.Action) -> None:
    option = action.option_strings[0]
    before = conn.execute("SELECT (SELECT count(*) FROM dq_messages), (SELECT count(*) FROM dq_queues), "
                          "(SELECT count(*) FROM dq_cron)").fetchone()
    for value in BAD_NUMBERS:
        argv = [*words, *required_arguments(parser), f"{option}={value}", "--dsn", dsn]
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own exit
            status = exc.code
        out, err = capsys.readouterr()
        assert status == 2, (argv, out, err)
        assert out == "" and len(err.splitlines()) == 1, (argv, out, err)
        assert "Traceback" not in err and (option in err or action.dest in err), (argv, err)
    after = conn.execute("SELECT (SELECT count(*) FROM dq_messages), (SELECT count(*) FROM dq_queues), "
                         "(SELECT count(*) FROM dq_cron)").fetchone()
    assert after == before


@pytest.mark.parametrize("value", ["nan", "1e400", "-inf"])
def test_offer_delay_that_is_not_a_duration_is_one_line(dsn: str, conn, value: str) -> None:
    out = cli(dsn, "offer", "--queue", "jobs", "--key", "k", "--payload", "x", f"--delay={value}")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr and "--delay" in out.stderr, out.stderr
    assert stored(conn, "jobs", "k") is None
    ok = cli(dsn, "offer", "--queue", "jobs", "--key", "k", "--payload", "x", "--delay", "1.5m")
    assert ok.returncode == 0, ok.stderr  # the durations of the other options: 30s, 1.5m, 2h, 500ms
    assert conn.execute("SELECT scheduled_at - created_at BETWEEN interval '89 seconds' AND interval '91 seconds' "
                        "FROM dq_messages WHERE key = 'k'").fetchone() == (True,)


def test_worker_handler_that_cannot_be_loaded_is_one_line(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "broken_handlers.py").write_text("raise RuntimeError('configuration missing')\n")
    (tmp_path / "fine_handlers.py").write_text("NOT_CALLABLE = 42\n")
    cases = {
        "missing.module:fn": "missing",
        "fine_handlers:absent": "absent",
        "fine_handlers:NOT_CALLABLE": "not callable",
        "broken_handlers:fn": "configuration missing",
        "no_colon": "package.module:function",
    }
    for spec, says in cases.items():
        out = cli(dsn, "worker", "--queue", "jobs", spec, cwd=tmp_path)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, (spec, out.stderr)
        assert "Traceback" not in out.stderr and says in out.stderr and "handler" in out.stderr, (spec, out.stderr)


# -- control characters ------------------------------------------------------------------------------

#: Producer-controlled names: an OSC title change ending in BEL, a clear screen, and rich markup,
#: a right-to-left override, a C1 CSI, a carriage return and a DEL.
HOSTILE = ("\x1b]0;pwn\x07", "\x1b[2J", "[/x][bold]q \u202eevil\x9b31m\r\x7f")
#: None of these may reach the terminal.
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r", "\x7f")


def assert_no_raw_controls(out) -> None:
    for stream in (out.stdout, out.stderr):
        found = [ch for ch in RAW if ch in stream]
        assert not found, (found, stream)


def test_listings_show_producer_controlled_text_escaped(dsn: str, conn) -> None:
    for name in HOSTILE:
        conn.execute("SELECT dq_offer(%s, %s, %s::text)", (name, name, name))
    # a dead letter of HOSTILE[0] in HOSTILE[1], with a hostile error text
    conn.execute("SELECT dq_configure_queue(%s, max_deliveries => 1, dead_letter_queue => %s)", HOSTILE[:2])
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 1, interval '1 minute')",
                            (HOSTILE[0],)).fetchone()
    conn.execute("SELECT dq_nack(%s, interval '0', %s)", (token, HOSTILE[2]))
    conn.execute("SELECT dq_cron_install(%s, %s, '@daily', 'x'::text)", (HOSTILE[2], HOSTILE[2]))

    stats = cli(dsn, "stats", columns=200)
    assert stats.returncode == 0, stats.stderr
    assert_no_raw_controls(stats)
    for shown in ("\\x1b]0;pwn\\x07", "\\x1b[2J", "[/x][bold]q \\u202eevil\\x9b31m\\r\\x7f"):
        assert shown in stats.stdout, stats.stdout
    one = cli(dsn, "stats", "--queue", HOSTILE[1], columns=200)
    assert one.returncode == 0 and "\\x1b[2J" in one.stdout, one.stdout
    assert_no_raw_controls(one)

    dead = cli(dsn, "queue", "dead-letters", HOSTILE[1])
    assert dead.returncode == 0, dead.stderr
    assert_no_raw_controls(dead)
    (line,) = dead.stdout.splitlines()
    letter = json.loads(line)  # escaped the JSON way: the values round-trip
    assert (letter["key"], letter["dead_from"], letter["last_error"], letter["payload_text"]) == (
        HOSTILE[0], HOSTILE[0], HOSTILE[2], HOSTILE[0])

    polled = cli(dsn, "poll", "--queue", HOSTILE[2])
    assert polled.returncode == 0, polled.stderr
    assert_no_raw_controls(polled)
    assert [json.loads(line)["key"] for line in polled.stdout.splitlines()] == [HOSTILE[2]]

    schedules = cli(dsn, "cron", "list")
    assert schedules.returncode == 0, schedules.stderr
    assert_no_raw_controls(schedules)
    (line,) = schedules.stdout.splitlines()
    assert (json.loads(line)["name"], json.loads(line)["queue"]) == (HOSTILE[2], HOSTILE[2])

    # An error naming producer-controlled text: the cycle of dead-letter queues names both queues.
    cycle = cli(dsn, "queue", "configure", HOSTILE[1], "--max-deliveries", "1", "--dead-letter-queue", HOSTILE[0])
    assert cycle.returncode == 2 and "cycle" in cycle.stderr and len(cycle.stderr.splitlines()) == 1, cycle.stderr
    assert_no_raw_controls(cycle)
    # And the argument parser's errors, which echo the value.
    parse = cli(dsn, "queue", "configure", HOSTILE[1], "--clear", HOSTILE[1])
    assert parse.returncode == 2 and len(parse.stderr.splitlines()) == 1, parse.stderr
    assert_no_raw_controls(parse)


def test_a_queue_name_with_markup_is_not_interpreted(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT dq_offer('[red]alert[/red]', 'k', 'x'::text)")
    out = cli(dsn, "stats", columns=200)
    assert out.returncode == 0, out.stderr
    assert "[red]alert[/red]" in out.stdout, out.stdout
