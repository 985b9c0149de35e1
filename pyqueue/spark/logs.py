"""The ``pyqueue.spark`` logger, in the Python processes Spark starts (docs/spark.md, "Outcome
counts"): they have no logging configuration of their own."""

from __future__ import annotations

import logging

__all__ = ["log", "driver_logger", "task_logger"]

log = logging.getLogger("pyqueue.spark")


def driver_logger() -> logging.Logger:
    """The ``pyqueue.spark`` logger, made to show INFO in the Python process Spark starts for
    commit/abort on the driver (it has no logging configuration of its own): level INFO unless
    set, and a stderr handler when nothing in the process handles records (with
    ``spark.sql.pyspark.worker.logging.enabled`` Spark installs one, and the records appear in
    ``spark.tvf.python_worker_logs()``)."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    return log


def task_logger() -> logging.Logger:
    """The ``pyqueue.spark`` logger in a task: level INFO unless set, so that the queries a read
    runs reach ``spark.tvf.python_worker_logs()`` when Spark's worker logging is on."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    return log
