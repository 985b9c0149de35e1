"""Code blocks of the README and docs/, read as they appear there, for the tests that run them.

A fenced block (```` ```python ````, ```` ```sql ````…) may be preceded, on the line just above its
fence, by an HTML comment that tells the tests how to run it and what it must print (invisible on
GitHub)::

    <!-- test: expect "received welcome-1" -->
    <!-- test: worker; expect "handled welcome-1" -->

``expect "TEXT"`` (repeatable): the block's standard output must contain TEXT. ``worker``: the block
runs until it is stopped (a worker's ``run()``): the test waits for every expected text, then
sends SIGTERM, and the process must exit with status 0 (the worker stops cleanly on that signal).
``skip "REASON"``: the block is not run, for the reason given (the tests keep such marks few).

Run as a program (``python docblocks.py BLOCKS.json TIMEOUT``), this module runs the blocks listed in
the file one after the other in its own interpreter, as a reader pastes a page's examples into one
Python session: see :func:`run_python_in_order`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*test:(.*?)-->\s*$")
EXPECT = re.compile(r'expect\s+"([^"]*)"')
SKIP = re.compile(r'\bskip\s+"([^"]*)"')
#: Printed before each block's output by :func:`run_python_in_order`, followed by the block's name.
SEPARATOR = "=== docblock "


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
    def skip(self) -> str | None:
        """Why the block is not run (``skip "REASON"``), or None: it runs."""
        found = SKIP.search(self.marker or "")
        return found.group(1) if found else None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a markdown file: the heading's text without its links'
    targets, lower case, without punctuation other than ``-`` and ``_``, spaces as ``-``; a repeated
    heading gets ``-1``, ``-2`` …"""
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip()).lower()
            anchor = base = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
            n = 0
            while anchor in found:
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


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


def run_python_in_order(blocks: list[Block], dsn: str, *, timeout: float = 120) -> dict[str, str]:
    """Run ``blocks`` one after the other in one new interpreter and one namespace against ``dsn``, as
    a reader pastes them into one Python session; a ``worker`` block is stopped with SIGINT (Ctrl-C)
    once it has printed what it expects (or after ``timeout`` seconds). Returns each block's
    standard output by name; raises AssertionError, with the output, when the process failed."""
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "blocks.json"
        listing.write_text(json.dumps([{"name": b.name, "text": b.text, "worker": b.worker, "expect": b.expect}
                                       for b in blocks]), encoding="utf-8")
        proc = subprocess.run([sys.executable, "-u", __file__, str(listing), str(timeout)], capture_output=True,
                              text=True, timeout=timeout * (len(blocks) + 1), env=child_env(dsn))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    outputs: dict[str, str] = {}
    for part in proc.stdout.split(SEPARATOR)[1:]:
        name, _, output = part.partition("\n")
        outputs[name] = output
    return outputs


class _Tee:
    """Standard output that also keeps what was written, for the thread that waits for a worker's
    expected output."""

    def __init__(self, out: Any) -> None:
        self.out, self.written, self.lock = out, [], threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.written.append(text)
        return int(self.out.write(text))

    def flush(self) -> None:
        self.out.flush()

    def text(self) -> str:
        with self.lock:
            return "".join(self.written)


def _stop_when_printed(tee: _Tee, start: int, expect: list[str], timeout: float, ended: threading.Event) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(e in tee.text()[start:] for e in expect):
        if ended.wait(0.2):
            return
    os.kill(os.getpid(), signal.SIGINT)


def _main(listing: str, timeout: float) -> int:
    tee = _Tee(sys.stdout)
    sys.stdout = tee  # type: ignore[assignment]
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for block in json.loads(Path(listing).read_text(encoding="utf-8")):
        print(SEPARATOR + block["name"], flush=True)
        ended = threading.Event()
        if block["worker"]:
            threading.Thread(target=_stop_when_printed, daemon=True,
                             args=(tee, len(tee.text()), block["expect"], timeout, ended)).start()
        try:
            exec(compile(block["text"], block["name"], "exec"), namespace)  # noqa: S102
        except BaseException:
            traceback.print_exc()
            print(f"{block['name']} failed", file=sys.stderr)
            return 1
        finally:
            ended.set()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], float(sys.argv[2])))
