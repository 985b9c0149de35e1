"""Code blocks of the README and docs/, read as they appear there, for the tests that run them.

A fenced block (```` ```python ````, ```` ```sql ````…) may be preceded, on the line just above its
fence, by an HTML comment that tells the tests how to run it and what it must print (invisible on
GitHub)::

    <!-- test: expect "received welcome-1" -->
    <!-- test: worker; expect "handled welcome-1" -->

``expect "TEXT"`` (repeatable): the block's standard output must contain TEXT. ``worker``: the block
runs until it is stopped (a worker's ``run()``): the test waits for every expected text, then
sends SIGTERM, and the process must exit with status 0 (the worker stops cleanly on that signal).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*test:(.*?)-->\s*$")
EXPECT = re.compile(r'expect\s+"([^"]*)"')


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, its text, the line of its opening fence (1-based) and
    the test marker above it (None without one)."""

    path: Path
    lang: str
    text: str
    line: int
    marker: str | None
    expect: tuple[str, ...] = field(default=())

    @property
    def worker(self) -> bool:
        return self.marker is not None and re.search(r"\bworker\b", self.marker) is not None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path, lang: str | None = None) -> list[Block]:
    """The fenced blocks of the markdown file ``path`` (of language ``lang`` if given), in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        text = "\n".join(lines[start + 1 : end]) + "\n"
        if lang is None or m.group(1) == lang:
            blocks.append(Block(path, m.group(1), text, start + 1, marker.group(1).strip() if marker else None,
                                tuple(EXPECT.findall(marker.group(1))) if marker else ()))
        i = end + 1
    return blocks


def block_after(path: Path, heading: str, lang: str) -> Block:
    """The first ``lang`` block after the first line containing ``heading``."""
    text = path.read_text(encoding="utf-8")
    at = text.index(heading)
    line = text.count("\n", 0, at) + 1
    for block in code_blocks(path, lang):
        if block.line > line:
            return block
    raise AssertionError(f"{path.name}: no {lang} block after {heading!r}")


def child_env(dsn: str) -> dict[str, str]:
    """The environment of a block's process: ours, with ``DQ_DSN`` (what the examples read) set to
    the test database, and no libpq variables that could redirect the connection."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["DQ_DSN"] = dsn
    return env


def run_psql(block: Block, dsn: str, *options: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run an sql block through a real ``psql`` (``-X``, its text on stdin) against ``dsn``, with
    ``options`` (e.g. ``-v ON_ERROR_STOP=1``). Returns the finished process."""
    from sqlhelpers import pg_program

    return subprocess.run([pg_program("psql"), dsn, "-X", *options, "-f", "-"], input=block.text,
                          capture_output=True, text=True, timeout=timeout, env=child_env(dsn))


def run_python(block: Block, dsn: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a python block in a new interpreter (its text on stdin) against ``dsn``; for a ``worker``
    block, wait for its expected output, then SIGTERM it. Returns the finished process."""
    args = [sys.executable, "-u", "-"]
    if not block.worker:
        return subprocess.run(args, input=block.text, capture_output=True, text=True, timeout=timeout,
                              env=child_env(dsn))
    assert block.expect, f"{block.name}: a worker block needs an expect to know when to stop it"
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with open(out_path, "w", encoding="utf-8") as out, open(err_path, "w", encoding="utf-8") as err:
            proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=out, stderr=err, text=True,
                                    env=child_env(dsn))
        assert proc.stdin is not None
        try:
            proc.stdin.write(block.text)
            proc.stdin.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and proc.poll() is None:
                if all(e in out_path.read_text(encoding="utf-8") for e in block.expect):
                    break
                time.sleep(0.2)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(args, proc.returncode, out_path.read_text(encoding="utf-8"),
                                           err_path.read_text(encoding="utf-8"))
