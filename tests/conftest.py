"""Shared fixtures: one local SparkSession and one standalone cluster per test session, temp table roots."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.standalone_cluster import StandaloneCluster


def _spark_builder() -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName("airflow-merge-provider-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test session (a cold start costs ~8 s, so it is shared)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = _spark_builder().getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
    # py4j closes its last connections at interpreter exit, logging at INFO through handlers whose streams
    # pytest has closed by then ("--- Logging error ---"): nothing of it is worth a line.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One Spark standalone master with two workers for the test session's cluster tests (three JVM
    daemons: started once). A test that kills a worker starts a replacement before it returns."""
    from tests.standalone_cluster import StandaloneCluster

    with StandaloneCluster(tmp_path_factory.mktemp("standalone")) as cluster:
        yield cluster


@pytest.fixture
def table_root(tmp_path: Path) -> Path:
    """A fresh directory for one Delta table."""
    path = tmp_path / "table"
    path.mkdir()
    return path


@pytest.fixture
def copy_on_write(spark: SparkSession) -> Iterator[None]:
    """Merges rewrite touched files even where the table enables deletion vectors (Delta's conf off)."""
    from spark_jobs.delta_merge.merge.deletion_vector_updates import PERSISTENT_DELETION_VECTORS_CONF

    spark.conf.set(PERSISTENT_DELETION_VECTORS_CONF, "false")
    yield
    spark.conf.unset(PERSISTENT_DELETION_VECTORS_CONF)


@pytest.fixture
def copy_by_position(spark: SparkSession) -> Iterator[None]:
    """Copy-on-write merges copy the unchanged rows of touched files by position, however small they are."""
    from spark_jobs.delta_merge.merge.copy_by_position import COPY_BY_POSITION_CONF

    spark.conf.set(COPY_BY_POSITION_CONF, "0")
    yield
    spark.conf.unset(COPY_BY_POSITION_CONF)
