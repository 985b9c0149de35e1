"""The Spark session the tests of this folder share: one local session (``local[2,2]``: two cores,
a failed task is tried once more, which the retry test needs) with the Python workers' logs enabled
(the tests read the data source's log lines there) and the ``delayedqueue`` source registered.
pyspark is imported only when a test asks for the session, so that without it the tests of this
folder are skipped (each module calls ``pytest.importorskip("pyspark")``) instead of failing here."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    import pyqueue.spark

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark needs a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("pyqueue-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.pyspark.worker.logging.enabled", "true")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pyqueue.spark.register(session)
    yield session
    session.stop()
