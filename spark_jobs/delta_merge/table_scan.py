"""Read exactly a given set of a table's live files with Spark, partition values attached from the log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from spark_jobs.delta_merge.files import LiveFile
from spark_jobs.delta_merge.partition_values import parse_partition_value
from spark_jobs.delta_merge.snapshot import file_uri

if TYPE_CHECKING:
    from spark_jobs.delta_merge.snapshot import TargetSnapshot

__all__ = ["FILE_KEY_COLUMN", "file_key", "scan_files"]

# Identifies the file a target row came from, in the form `file_key` gives for a LiveFile.
FILE_KEY_COLUMN = "__merge_file"


def file_key(snapshot: TargetSnapshot, live_file: LiveFile) -> str:
    """A scheme-less, decoded absolute path: the same string `_file_key_column` computes in Spark."""
    path = file_uri(snapshot, live_file)
    without_scheme = path.split(":", 1)[1] if "://" in path else path
    return "/" + without_scheme.lstrip("/")


def _file_key_column() -> Column:
    # `_metadata.file_path` is a URI (spaces as %20, '%' as %25). url_decode would also turn '+'
    # into a space, so protect '+' first; then drop the scheme as `file_key` does.
    decoded = F.url_decode(F.replace(F.col("_metadata.file_path"), F.lit("+"), F.lit("%2B")))
    return F.regexp_replace(decoded, r"^[a-zA-Z][a-zA-Z0-9+.-]*:/*", "/")


def scan_files(
    spark: SparkSession,
    snapshot: TargetSnapshot,
    files: Sequence[LiveFile],
    *,
    with_file_key: bool = False,
) -> DataFrame:
    """The rows of ``files`` in the snapshot's schema (partition columns from the log, not the path)."""
    schema: StructType = snapshot.schema
    partition_columns = list(snapshot.partition_columns)
    data_schema = StructType([f for f in schema.fields if f.name not in partition_columns])
    out_fields = list(schema.fields) + ([StructField(FILE_KEY_COLUMN, StringType())] if with_file_key else [])
    if not files:
        return spark.createDataFrame([], StructType(out_fields))
    paths = [file_uri(snapshot, f) for f in files]
    df = spark.read.schema(data_schema).parquet(*paths)
    if with_file_key or partition_columns:
        df = df.withColumn(FILE_KEY_COLUMN, _file_key_column())
    if partition_columns:
        part_schema = StructType(
            [StructField(FILE_KEY_COLUMN, StringType())]
            + [StructField(c, schema[c].dataType) for c in partition_columns]
        )
        part_rows = [
            (
                file_key(snapshot, f),
                *[parse_partition_value(f.partition_values.get(c), schema[c].dataType)
                  for c in partition_columns],
            )
            for f in files
        ]
        values = spark.createDataFrame(part_rows, part_schema)
        df = df.join(F.broadcast(values), on=FILE_KEY_COLUMN, how="inner")
    # Quoted: a name with a dot (`value.a`) is one column, not the field a of a struct value.
    return df.select(*[F.col(f"`{f.name.replace('`', '``')}`") for f in out_fields])
