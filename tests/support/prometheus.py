"""A real Prometheus (Debian's ``prometheus`` package, installed by scripts/install-os-deps.sh) for the
tests that scrape our endpoints or check our PromQL, and the list of metric names pgdelayq serves.

``running_prometheus(targets, tmp_path)`` starts ``prometheus`` on a free port of 127.0.0.1 with its own
storage under ``tmp_path``, scraping every second one job per key of ``targets`` (``"host:port"``
addresses), and yields a :class:`Prometheus` whose ``query`` and ``wait_for`` read its HTTP API
(https://prometheus.io/docs/prometheus/latest/querying/api/) with the standard library only. It stops the
server when the block ends.

``METRIC_NAMES`` is every metric name of the exporter, the health figures and the workers, as a scrape
shows them (counters with ``_total``); ``SERIES_NAMES`` adds the series Prometheus stores for each
histogram (``_bucket``, ``_sum``, ``_count``). ``LABELS`` is every label name those series carry.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyqueue import metrics

# --- the metric names -----------------------------------------------------------------------------

#: Per queue (label ``queue``), from ``dq_metrics()``: gauges.
QUEUE_METRICS = frozenset({
    "pgdelayq_queue_ready_messages",
    "pgdelayq_queue_scheduled_messages",
    "pgdelayq_queue_in_flight_messages",
    "pgdelayq_queue_redelivered_messages",
    "pgdelayq_queue_dead_messages",
    "pgdelayq_queue_expired_messages",
    "pgdelayq_queue_held_messages",
    "pgdelayq_queue_blocked_messages",
    "pgdelayq_queue_paused",
    "pgdelayq_queue_oldest_ready_age_seconds",
    "pgdelayq_queue_next_due_timestamp_seconds",
    "pgdelayq_queue_estimated",
    "pgdelayq_queue_is_dead_letter_queue",
    "pgdelayq_queue_max_in_flight",
    "pgdelayq_queue_rate_limit_messages",
    "pgdelayq_queue_rate_limit_period_seconds",
    "pgdelayq_queue_rate_limit_used_messages",
    "pgdelayq_queue_acknowledged_last_minute_messages",
    "pgdelayq_queue_archived_messages",  # and label ``outcome``
})

#: The figures of ``dq_table_health()`` by component: the metric is ``pgdelayq_<component>_<figure>``.
HEALTH_FIGURES: dict[str, tuple[str, ...]] = {
    "table": ("live_tuples", "dead_tuples", "dead_tuple_ratio", "last_vacuum_timestamp_seconds",
              "last_autovacuum_timestamp_seconds", "last_autoanalyze_timestamp_seconds", "size_bytes"),
    "index": ("size_bytes", "estimated_minimum_bytes"),
    "xmin_horizon": ("age_seconds", "age_transactions"),
    "cron_job": ("last_start_timestamp_seconds", "last_run_failed", "failures_last_hour"),
}
#: The label each health component's metrics carry (the xmin horizon has none): the exporter's own.
HEALTH_LABEL = metrics.HEALTH_LABEL
HEALTH_METRICS = frozenset(f"pgdelayq_{component}_{figure}"
                           for component, figures in HEALTH_FIGURES.items() for figure in figures)

#: The exporter's own.
EXPORTER_METRICS = frozenset({"pgdelayq_up", "pgdelayq_scrape_duration_seconds"})

#: A worker's (label ``queue``).
WORKER_COUNTERS = frozenset({
    "pgdelayq_worker_delivered_messages_total",
    "pgdelayq_worker_acknowledged_messages_total",
    "pgdelayq_worker_failed_messages_total",
    "pgdelayq_worker_retried_messages_total",
    "pgdelayq_worker_dead_lettered_messages_total",
    "pgdelayq_worker_lock_lost_messages_total",
    "pgdelayq_worker_released_messages_total",
})
WORKER_HISTOGRAMS = frozenset({"pgdelayq_worker_handler_duration_seconds", "pgdelayq_worker_lateness_seconds"})
WORKER_GAUGES = frozenset({"pgdelayq_worker_running_handlers", "pgdelayq_worker_prefetched_messages"})

METRIC_NAMES = (QUEUE_METRICS | HEALTH_METRICS | EXPORTER_METRICS
                | WORKER_COUNTERS | WORKER_HISTOGRAMS | WORKER_GAUGES)
SERIES_NAMES = (METRIC_NAMES - WORKER_HISTOGRAMS) | frozenset(
    f"{name}{suffix}" for name in WORKER_HISTOGRAMS for suffix in ("_bucket", "_sum", "_count"))

#: Label names of our series: ours, ``le`` of the histogram buckets, and the target labels Prometheus
#: adds (``job``, ``instance``).
LABELS = frozenset({"queue", "outcome", "table", "index", "cron_job", "le", "job", "instance"})


# --- the server -----------------------------------------------------------------------------------

READY_TIMEOUT_S = 60.0


class PromQLError(Exception):
    """Prometheus refused a query (``errorType`` ``bad_data`` for an expression it cannot parse)."""

    def __init__(self, expr: str, status: int, error_type: str, error: str) -> None:
        super().__init__(f"{error_type} (HTTP {status}): {error}\n  in: {expr}")
        self.expr, self.status, self.error_type, self.error = expr, status, error_type, error


class Prometheus:
    """A running Prometheus: ``url`` (``http://127.0.0.1:PORT``) and its HTTP API."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.process, self.log = url, process, log

    def get(self, path: str, **params: str) -> Any:
        """The ``data`` of the API's answer to ``GET path?params``; :class:`PromQLError` on an error."""
        address = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(address, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
            raise PromQLError(params.get("query", path), e.code, body.get("errorType", "?"),
                              body.get("error", "?")) from None
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now: ``[{"metric": {labels}, "value": [time, "text"]}, …]``; a
        scalar or string result comes as one element without labels. :class:`PromQLError` when
        Prometheus refuses the expression (HTTP 400 for a parse error)."""
        data = self.get("/api/v1/query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def wait_for(self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool],
                 timeout: float = 30.0) -> list[dict[str, Any]]:
        """``query(expr)`` again until ``predicate`` accepts its result, which it returns; AssertionError
        with the last result after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout} s, {expr} is still {result}\n{self.targets_health()}")
            time.sleep(0.2)

    def targets_health(self) -> str:
        """One line per scrape target: job, address, health and last error (for failure messages)."""
        active = self.get("/api/v1/targets")["activeTargets"]
        return "\n".join(f"{t['labels'].get('job')} {t['scrapeUrl']}: {t['health']} {t['lastError']}"
                         for t in active)

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing (``/api/v1/alerts``) for the rules given to ``running_prometheus``."""
        return list(self.get("/api/v1/alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        """Every rule loaded, as ``/api/v1/rules`` lists them (``name``, ``query``, ``type`` …)."""
        return [rule for group in self.get("/api/v1/rules")["groups"] for rule in group["rules"]]


def free_port() -> int:
    """A TCP port of 127.0.0.1 free when asked (the caller retries if someone takes it first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(targets: dict[str, list[str]], rule_files: Sequence[Path]) -> str:
    # JSON is YAML: no YAML library needed.
    return json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(Path(f).resolve()) for f in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(addresses)}]}
                           for job, addresses in targets.items()],
    }, indent=1)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    """True once ``/-/ready`` answers 200; False if the process ended first (its port was taken)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"prometheus not ready after {READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def running_prometheus(targets: dict[str, list[str]], tmp_path: Path, *,
                       rule_files: Sequence[Path] = ()) -> Iterator[Prometheus]:
    """A real ``prometheus`` scraping ``targets`` (job name → ``["127.0.0.1:PORT", …]``, ``/metrics`` of
    each, every second) and evaluating ``rule_files`` every second, with its configuration, storage and
    log under ``tmp_path``; ready (``/-/ready``) when yielded, stopped (SIGTERM, then SIGKILL after
    20 s) at the end of the block."""
    binary = shutil.which("prometheus")
    assert binary, "no prometheus on PATH: run scripts/install-os-deps.sh (Debian's prometheus package)"
    home = tmp_path / "prometheus"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "prometheus.yml"
    config.write_text(_config(targets, rule_files), encoding="utf-8")
    log = home / "prometheus.log"
    for _ in range(5):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={home / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            ready = _wait_ready(url, process, log)
        except BaseException:
            _stop(process)
            raise
        if ready:
            break
    else:
        raise AssertionError(f"prometheus did not start:\n{log.read_text()[-3000:]}")
    try:
        yield Prometheus(url, process, log)
    finally:
        _stop(process)


# --- reading PromQL -------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{([^{}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"})


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names ``expr`` uses (in matchers and in ``by``/``on``/… lists):
    what remains, once strings, matchers, grouping lists, ranges and numbers are set aside, besides
    functions (a name before ``(``) and keywords, is a metric name. Enough for our own expressions, not a
    PromQL parser (Prometheus itself checks them: :meth:`Prometheus.query`)."""
    text = _STRING.sub('""', expr)
    labels: set[str] = set()
    for matchers in _MATCHERS.findall(text):
        labels.update(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    for grouping in _GROUPING.findall(text):
        labels.update(name.strip() for name in grouping.split(",") if name.strip())
    text = _NUMBER.sub(" ", _RANGE.sub(" ", _GROUPING.sub(" ", _MATCHERS.sub(" ", text))))
    metrics = {m.group() for m in _IDENTIFIER.finditer(text)
               if m.group() not in _KEYWORDS and not re.match(r"\s*\(", text[m.end():])}
    return metrics, labels
