"""The web console as a person uses it: a real ``pyqueue console`` process and a real Chromium (Debian's
``chromium``, installed by scripts/install-os-deps.sh) driven by Playwright, for the console's tests and for
``make console-screenshots``.

* :func:`running_console` starts ``python -m pyqueue console --dsn DSN --port <free port>`` as a subprocess,
  waits until it serves and yields its base URL (``http://127.0.0.1:PORT``); it stops the process when the
  block ends and fails with the process's stderr when it died on its own.
* :func:`chromium` launches the browser (Playwright's own browser download is never used: it cannot be
  fetched here, and CI installs Debian's package instead).
* :func:`browser_page` opens a page in a new browser context and records what a person would see go wrong:
  console messages of type error, uncaught page errors, failed requests and responses of status 400 and
  above; :func:`browser_problems` lists them and :func:`assert_no_browser_errors` fails on any.
* :func:`take_screenshots` follows the console's links from the overview to a queue, a message, a dead-letter
  queue, the schedules, health and the audit log, and writes one PNG of each; the tests call it and so does
  ``python tests/support/consolebrowser.py screenshots`` (``make console-screenshots``).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Response, sync_playwright

#: Debian's Chromium (scripts/install-os-deps.sh installs it).
CHROMIUM = os.environ.get("PGDELAYQ_CHROMIUM", "/usr/bin/chromium")
#: Flags for a headless, quiet Chromium as root in a container: no sandbox (it needs user namespaces or the
#: setuid helper), no GPU, no QUIC, and none of the background traffic to Google (component updates, sync,
#: first-run pages) that would fail offline and show up as failed requests.
CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
#: How long to wait for the console to serve, and for a page to load or an element to appear.
START_TIMEOUT_S = 30.0
#: The line the console prints on stderr once it serves.
LISTENING = re.compile(r"pgdelayq console listening on (http://\S+)")
#: The environment variables that configure the console's authentication: removed from the environment a
#: test console inherits, so only what a test passes counts.
AUTH_VARIABLES = ("PGDELAYQ_CONSOLE_TOKEN", "PGDELAYQ_CONSOLE_USER", "PGDELAYQ_CONSOLE_PASSWORD")
#: The pages of :func:`take_screenshots`, in order: file name (without .png) and what it shows.
SCREENSHOTS = {
    "overview": "every queue, the throughput chart",
    "queue": "a queue's settings and its messages",
    "message": "one message: payload, headers, times, the messages that wait for it",
    "blocked": "a blocked message: the parents it waits for and its waiting children",
    "dead-letters": "a dead-letter queue's groups and dead letters",
    "schedules": "the cron schedules",
    "health": "table health and advice",
    "audit": "the audit log",
}
#: A viewport an operator's laptop has.
VIEWPORT = {"width": 1280, "height": 800}


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ConsoleProcess:
    """A running ``pyqueue console``: its base URL, the process, and its stderr so far."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="console-stderr", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self._lines.append(line)

    @property
    def stderr(self) -> str:
        """Everything the console wrote on stderr so far."""
        with self._lock:
            return "".join(self._lines)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until the console prints that it listens and the port accepts connections.

        :raises RuntimeError: the process exited first (with its status and stderr), or ``timeout``
            seconds passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._reader.join(timeout=5)
                raise RuntimeError(f"pyqueue console exited with status {self.process.returncode} before "
                                   f"serving; its stderr:\n{self.stderr}")
            if any(LISTENING.search(line) for line in self.stderr.splitlines()):
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"pyqueue console did not serve within {timeout:g} s; its stderr:\n{self.stderr}")

    def stop(self) -> int | None:
        """Terminate the console (SIGTERM, then SIGKILL after 10 s). The exit status it had before, or None
        when it was still running."""
        died = self.process.poll()
        if died is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return died


def console_command(dsn: str, *, port: int, allow_actions: bool = False, host: str = "127.0.0.1",
                    extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of ``pyqueue console`` as :func:`running_console` runs it."""
    return [sys.executable, "-m", "pyqueue", "console", "--dsn", dsn, "--host", host, "--port", str(port),
            *(["--allow-actions"] if allow_actions else []), *extra_args]


def console_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the console's authentication variables, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in AUTH_VARIABLES}
    base.update(env or {})
    return base


@contextmanager
def running_console(dsn: str, *, allow_actions: bool = False, host: str = "127.0.0.1",
                    env: Mapping[str, str] | None = None, extra_args: Sequence[str] = ()) -> Iterator[str]:
    """Run ``pyqueue console`` on a free port for the duration of the block and yield its base URL
    (``http://127.0.0.1:PORT``, without a trailing slash, also when ``host`` is another interface).

    :param dsn: the database the console shows (``--dsn``).
    :param allow_actions: pass ``--allow-actions``.
    :param host: ``--host``; the URL still connects through 127.0.0.1.
    :param env: environment variables added to this process's own, from which the console's authentication
        variables (:data:`AUTH_VARIABLES`) are removed first.
    :param extra_args: more arguments for the command.
    :raises RuntimeError: the console exited before serving, did not serve within
        :data:`START_TIMEOUT_S`, or exited on its own during the block (each with its stderr).
    """
    port = free_port()
    process = subprocess.Popen(console_command(dsn, port=port, allow_actions=allow_actions, host=host,
                                               extra_args=extra_args),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=console_environment(env))
    console = ConsoleProcess(process, port)
    try:
        console.wait_ready()
        yield console.url
    except BaseException as error:
        died = console.stop()
        if console.stderr not in str(error):
            state = "running" if died is None else f"exited with status {died}"
            error.add_note(f"pyqueue console ({state}), its stderr:\n{console.stderr}")
        raise
    died = console.stop()
    if died is not None:
        raise RuntimeError(f"pyqueue console exited on its own with status {died}; its stderr:\n{console.stderr}")


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium (:data:`CHROMIUM` with :data:`CHROMIUM_ARGS`) under Playwright, closed when the
    block ends."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS),
                                             timeout=START_TIMEOUT_S * 1000)
        try:
            yield browser
        finally:
            browser.close()


#: What each page recorded (see :func:`browser_problems`), while its :func:`browser_page` block runs.
_problems: dict[int, list[str]] = {}


def _expected_failure(request: Request) -> bool:
    """A request that fails because the page moved on: the browser aborts the event stream and any request in
    progress when it navigates (``net::ERR_ABORTED``). Nothing else is expected to fail."""
    return request.failure == "net::ERR_ABORTED"


@contextmanager
def browser_page(browser: Browser, *, base_url: str | None = None,
                 extra_http_headers: Mapping[str, str] | None = None,
                 http_credentials: Mapping[str, str] | None = None) -> Iterator[Page]:
    """A new page in a new browser context (its own cookies), closed when the block ends, that records the
    problems :func:`browser_problems` lists.

    :param base_url: relative URLs of ``page.goto`` and ``page.request`` resolve against it.
    :param extra_http_headers: sent with every request (``Authorization`` for a console behind a token).
    :param http_credentials: ``{"username": ..., "password": ...}`` for HTTP basic authentication.
    """
    options: dict[str, Any] = {"viewport": VIEWPORT}
    if base_url is not None:
        options["base_url"] = base_url
    if extra_http_headers is not None:
        options["extra_http_headers"] = dict(extra_http_headers)
    if http_credentials is not None:
        options["http_credentials"] = dict(http_credentials)
    context = browser.new_context(**options)
    context.set_default_timeout(START_TIMEOUT_S * 1000)
    page = context.new_page()
    problems: list[str] = []
    _problems[id(page)] = problems

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console error on {page.url}: {message.text} ({message.location})")

    def on_failed(request: Request) -> None:
        if not _expected_failure(request):
            problems.append(f"request failed: {request.method} {request.url}: {request.failure}")

    def on_response(response: Response) -> None:
        if response.status >= 400:
            problems.append(f"status {response.status}: {response.request.method} {response.url}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"page error on {page.url}: {error}"))
    page.on("requestfailed", on_failed)
    page.on("response", on_response)
    try:
        yield page
    finally:
        _problems.pop(id(page), None)
        context.close()


def browser_problems(page: Page) -> list[str]:
    """What went wrong in ``page`` so far (a page of :func:`browser_page`): console errors, page errors,
    failed requests, responses of status 400 and above. A live list: clear it to start afresh."""
    return _problems[id(page)]


def assert_no_browser_errors(page: Page) -> None:
    """Fail with the list when :func:`browser_problems` is not empty."""
    problems = browser_problems(page)
    assert not problems, "the browser saw problems:\n" + "\n".join(problems)


def _follow(page: Page, selector: str, what: str) -> None:
    """Click the first link ``selector`` and wait for the page it opens."""
    link = page.locator(selector).first
    if link.count() == 0:
        raise AssertionError(f"no {what} on {page.url} ({selector})")
    with page.expect_navigation():
        link.click()
    page.wait_for_load_state("load")


def _nav(page: Page, label: str) -> None:
    """Follow the ``<nav>`` link named ``label``."""
    with page.expect_navigation():
        page.locator("nav").get_by_role("link", name=label, exact=True).click()
    page.wait_for_load_state("load")


def take_screenshots(base_url: str, out_dir: Path, *, browser: Browser | None = None, queue: str | None = None,
                     message: str | None = None, dead_letter_queue: str | None = None) -> dict[str, Path]:
    """Screenshots (full-page PNGs, :data:`VIEWPORT` wide) of the console at ``base_url``, reached the way a
    person reaches them: the overview, then its link to ``queue`` (default: the first queue that is not a
    dead-letter queue), the queue's message ``message`` (a key; default: the first), a blocked message (a child
    waiting for ``message``, else the queue's first blocked one; no "blocked" screenshot when it has none), the
    nav link "Dead letters" and its link to ``dead_letter_queue`` (default: the first), then the nav links
    Schedules, Health and Audit log.

    :param out_dir: created if needed; the files are ``<name>.png`` for each name of :data:`SCREENSHOTS`.
    :param browser: a browser of :func:`chromium`; one is launched for the call when None.
    :returns: name -> path of each file written.
    :raises AssertionError: a page lacked the link to follow, or the browser saw a problem
        (:func:`assert_no_browser_errors`).
    """
    if browser is None:
        with chromium() as launched:
            return take_screenshots(base_url, out_dir, browser=launched, queue=queue, message=message,
                                    dead_letter_queue=dead_letter_queue)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    with browser_page(browser, base_url=base_url) as page:

        def shoot(name: str) -> None:
            page.wait_for_load_state("load")
            path = out_dir / f"{name}.png"
            page.screenshot(path=str(path), full_page=True, animations="disabled")
            written[name] = path

        page.goto("/")
        page.wait_for_selector("#queues")
        shoot("overview")
        row = (f'#queues tr[data-queue="{_css_string(queue)}"]' if queue is not None
               else '#queues tr[data-queue]:not([data-dlq="true"])')
        _follow(page, f"{row} a", "queue link")
        shoot("queue")
        queue_page = page.url.split("?", 1)[0]
        row = f'#messages tr[data-key="{_css_string(message)}"]' if message is not None else "#messages tr[data-key]"
        _follow(page, f"{row} a", "message link")
        shoot("message")
        # A blocked message: a child waiting for this message, else the queue's first blocked message.
        child = '#dependencies tr[data-relation="child"] td.key a'
        if page.locator(child).count() == 0:
            page.goto(queue_page + "?state=blocked")
            child = "#messages tr[data-key] a"
        if page.locator(child).count():
            _follow(page, child, "blocked message link")
            shoot("blocked")
        _nav(page, "Dead letters")
        row = (f'#dead-letter-queues tr[data-queue="{_css_string(dead_letter_queue)}"]'
               if dead_letter_queue is not None else "#dead-letter-queues tr[data-queue]")
        _follow(page, f"{row} a", "dead-letter queue link")
        shoot("dead-letters")
        _nav(page, "Schedules")
        shoot("schedules")
        _nav(page, "Health")
        shoot("health")
        _nav(page, "Audit log")
        shoot("audit")
        assert_no_browser_errors(page)
    return written


def _css_string(value: str) -> str:
    """``value`` inside a double-quoted CSS attribute selector."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def main(argv: Sequence[str] | None = None) -> int:
    """``python tests/support/consolebrowser.py screenshots --dsn DSN [--out docs/console] [--no-seed]``:
    seed the demo data set (consoledemo.seed_demo) into DSN, start the console on it with actions allowed
    and write the screenshots."""
    parser = argparse.ArgumentParser(prog="consolebrowser.py")
    sub = parser.add_subparsers(dest="command", required=True)
    shots = sub.add_parser("screenshots", help="seed the demo data and write the console's screenshots")
    shots.add_argument("--dsn", required=True)
    shots.add_argument("--out", type=Path, default=Path("docs/console"))
    shots.add_argument("--no-seed", action="store_true", help="show the database as it is")
    args = parser.parse_args(argv)
    from consoledemo import DEMO_DEAD_LETTER_QUEUE, DEMO_MESSAGE, DEMO_QUEUE, seed_demo

    if not args.no_seed:
        seed_demo(args.dsn)
    with running_console(args.dsn, allow_actions=True) as url, chromium() as browser:
        if not args.no_seed:
            # Actions for the audit log: resume the paused queue "invoices" and pause it again.
            with browser_page(browser, base_url=url) as page:
                page.goto("/queues/invoices")
                for form in ("#resume-form", "#pause-form"):
                    with page.expect_navigation():
                        page.locator(f"{form} button").click()
                    page.wait_for_selector("p.notice")
                assert_no_browser_errors(page)
        demo = not args.no_seed
        written = take_screenshots(url, args.out, browser=browser, queue=DEMO_QUEUE if demo else None,
                                   message=DEMO_MESSAGE if demo else None,
                                   dead_letter_queue=DEMO_DEAD_LETTER_QUEUE if demo else None)
    for name, path in written.items():
        print(f"{path}  {SCREENSHOTS[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
