"""Task rows spread over Spark partitions, built the same way on a classic and a Spark Connect session.

A classic session could parallelize a Python list into exactly one slice per task; Spark Connect has no
RDDs. Here ``range`` makes one row per partition and a broadcast join hangs each task row on the
partition of its slice: the join keeps the range's partitioning, so no shuffle moves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from spark_jobs.delta_merge.sql_names import quoted_name

__all__ = ["spread_tasks"]

_SLICE = "__merge_task_slice"


def spread_tasks(
    spark: SparkSession, slices: Sequence[Sequence[tuple[Any, ...]]], schema: StructType
) -> DataFrame:
    """A DataFrame of ``schema`` whose partition ``i`` holds exactly the task rows of ``slices[i]``."""
    rows = [(index, *task) for index, tasks in enumerate(slices) for task in tasks]
    tasks = spark.createDataFrame(
        rows, StructType([StructField(_SLICE, IntegerType(), False), *schema.fields])
    )
    partitions = spark.range(0, max(1, len(slices)), 1, max(1, len(slices))).select(
        F.col("id").cast("int").alias(_SLICE)
    )
    columns = [F.col(quoted_name(f.name)) for f in schema.fields]
    return partitions.join(F.broadcast(tasks), _SLICE).select(*columns)
