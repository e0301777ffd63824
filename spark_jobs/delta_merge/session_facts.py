"""Facts of the Spark session the merge runs in, asked the same way of a classic session and of a Spark
Connect session: through SQL, the session conf and the DataFrame API, never the JVM gateway (``_jvm``,
``_jsparkSession``, ``_jdf``, ``sparkContext``), which a Connect client does not have.

Facts only the JVM gateway knows were dropped: the Spark jobs a merge ran (the status tracker; see
:mod:`spark_jobs.delta_merge.stage_timing`) and the real size of the materialized source's blocks (the
block manager; ``source/materialize.py`` counts it from its rows instead).
"""

from __future__ import annotations

import re
import weakref
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NullType,
    ShortType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs.delta_merge.spark_confs import size_conf

__all__ = [
    "broadcast_limit_bytes",
    "default_parallelism",
    "estimated_row_bytes",
    "hadoop_version",
]

_SPLITS = re.compile(r"Range \(0, \d+, step=1, splits=(\d+)\)")
_parallelism: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# Spark's defaultSize of a string, binary, array or map value (DataType.defaultSize), per value.
_VARIABLE_SIZE = 20
_FIXED_SIZES: dict[type, int] = {
    BooleanType: 1, ByteType: 1, NullType: 1, ShortType: 2, IntegerType: 4, FloatType: 4, DateType: 4,
    LongType: 8, DoubleType: 8, TimestampType: 8, TimestampNTZType: 8,
}  # fmt: skip
# The driver heap Spark starts with when spark.driver.memory is unset.
_DEFAULT_DRIVER_HEAP = 1 << 30


def default_parallelism(spark: SparkSession) -> int:
    """The session's default parallelism (the cores of its executors).

    Read from the plan of ``range()``, which Spark splits into that many partitions: the one source the
    classic and the Connect API share (no job runs). Asked once per session.
    """
    cached = _parallelism.get(spark)
    if cached is not None:
        return cached
    plan = str(spark.sql("EXPLAIN SELECT * FROM range(8)").collect()[0][0])
    match = _SPLITS.search(plan)
    value = int(match.group(1)) if match else 2
    _parallelism[spark] = value
    return value


def broadcast_limit_bytes(spark: SparkSession) -> int:
    """How large a relation the merge broadcasts: the larger of ``spark.sql.autoBroadcastJoinThreshold``
    and a sixteenth of the driver's heap (``spark.driver.memory``, which holds the broadcast); -1 when the
    threshold turns broadcasts off."""
    threshold = size_conf(spark, "spark.sql.autoBroadcastJoinThreshold", 10 << 20, never="no broadcasts")
    if threshold < 0:
        return -1
    heap = size_conf(spark, "spark.driver.memory", _DEFAULT_DRIVER_HEAP, never="the default heap")
    return max(threshold, heap // 16)


def estimated_row_bytes(schema: StructType) -> int:
    """Spark's estimate of a row's size (EstimationUtils.getSizePerRow: 8 bytes plus each field's
    default size)."""
    return 8 + sum(_default_size(f.dataType) for f in schema.fields)


def _default_size(data_type: DataType) -> int:
    if isinstance(data_type, StructType):
        return sum(_default_size(f.dataType) for f in data_type.fields)
    if isinstance(data_type, DecimalType):
        return 8 if data_type.precision <= 18 else 16
    return _FIXED_SIZES.get(type(data_type), _VARIABLE_SIZE)


def hadoop_version(spark: SparkSession) -> str | None:
    """The Hadoop version the session's Spark was built with (a connector must match it), or None."""
    try:
        row = spark.sql("SELECT java_method('org.apache.hadoop.util.VersionInfo', 'getVersion')").collect()
    except Exception:  # reflection disabled or refused: the advice then names no version
        return None
    return str(row[0][0]) if row and row[0][0] else None
