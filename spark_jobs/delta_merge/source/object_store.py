"""A Parquet source on an object store, read without a Hadoop connector: files (Hive-partitioned directories
included) through pyarrow in Spark tasks. Other formats go to Spark's readers and the user's connector."""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Mapping
from urllib.parse import unquote

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.scan.arrow_scan import FILE_PATH, ROW_INDEX, ArrowScanFile, read_parquet_files
from spark_jobs.delta_merge.spec import SourceSpec
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem
from spark_jobs.delta_merge.storage.storage_errors import storage_failure

__all__ = ["read_object_store_parquet"]

# The directory name Hive and Spark give a NULL partition value.
_HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def read_object_store_parquet(spark: SparkSession, source: SourceSpec) -> DataFrame:
    """The rows of the Parquet file or directory ``source.uri`` names on an object store.

    The schema is the first file's, as Spark's reader takes it without ``mergeSchema``; files and
    directories whose names start with ``_`` or ``.`` are skipped, as Spark skips them.

    A Hive-partitioned directory (``day=2024-01-01/part-0.parquet``) gains its partition columns, typed
    and valued as Spark's reader would.

    :raises MergeAnalysisError: Spark reader options are given, the path holds no Parquet file, or its
        directories are not a partition layout Spark reads.
    :raises TableStorageError: the store refused or failed the listing (secrets masked).
    """
    assert source.uri is not None
    if source.options:
        raise MergeAnalysisError(
            f"source.options {sorted(source.options)}: these are Spark reader options, and a Parquet source "
            "on an object store is read without Spark's reader (it has no connector here). Leave "
            "source.options empty, or give the source as a Delta table."
        )
    options = source.storage_options
    fs, base = arrow_filesystem(source.uri, options)
    try:
        paths = _parquet_paths(fs, base)
        schema = pq.read_schema(paths[0], filesystem=fs) if paths else None
    except OSError as exc:
        raise storage_failure(source.uri, "listing the source's Parquet files", exc, options) from exc
    if schema is None:
        raise MergeAnalysisError(
            f"Cannot read the source {source.uri} as parquet: no Parquet file there. Check source.uri."
        )
    read_schema = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    relative_dirs = {p: posixpath.dirname(p.removeprefix(base).lstrip("/")) for p in paths}
    if not any("=" in directory for directory in relative_dirs.values()):
        files = [ArrowScanFile(path=p, key=p) for p in paths]
        return read_parquet_files(spark, source.uri, files, read_schema, storage_options=options).drop(
            ROW_INDEX, FILE_PATH
        )
    partition_names = [name for name, _ in _partition_parts(max(relative_dirs.values(), key=len))]
    data_schema = StructType([f for f in read_schema.fields if f.name not in partition_names])
    inferred = _partition_schema_as_spark_infers(spark, source.uri, base, relative_dirs, data_schema)
    partition_schema = StructType([inferred[name] for name in partition_names])
    # Spark reads the files of partition directories only: one beside them (at the root) is left out.
    files = [
        ArrowScanFile(path=p, key=directory) for p, directory in relative_dirs.items()
        if [name for name, _ in _partition_parts(directory)] == partition_names
    ]  # fmt: skip
    data = read_parquet_files(spark, source.uri, files, data_schema, storage_options=options)
    values = _partition_values(spark, set(relative_dirs.values()), partition_schema)
    # Spark's order: the files' columns (one that is also a partition column stays where the files have it,
    # with the directory's value), then the other partition columns.
    names = [*read_schema.names, *(name for name in partition_names if name not in read_schema.names)]
    return data.join(F.broadcast(values), FILE_PATH).select(*names)


def _partition_schema_as_spark_infers(
    spark: SparkSession, uri: str, base: str, relative_dirs: Mapping[str, str], data_schema: StructType
) -> StructType:
    """The schema Spark's reader gives a Hive-partitioned directory, partition columns typed from the
    directory names (spark.sql.sources.partitionColumnTypeInference.*).

    Spark decides from the names alone, so the job lets Spark's own file index look at an empty local
    copy of the layout: the types and the refusals of a bad layout are Spark's.
    """
    with tempfile.TemporaryDirectory(prefix="merge-source-layout-") as mirror:
        for path, directory in relative_dirs.items():
            folder = os.path.join(mirror, *directory.split("/")) if directory else mirror
            os.makedirs(folder, exist_ok=True)
            open(os.path.join(folder, posixpath.basename(path)), "wb").close()
        try:
            return spark.read.schema(data_schema).parquet(mirror).schema
        except (PySparkException, Py4JJavaError) as exc:
            # Spark's first lines name the condition and the conflicting columns; the rest is advice.
            lines = [line.strip() for line in str(exc).split("For partitioned")[0].splitlines()]
            cause = " ".join(line for line in lines if line)
            raise MergeAnalysisError(
                f"Cannot read the source {uri}: its directories are not a partition layout Spark reads "
                f"({cause.replace(mirror, base)}). Point source.uri at the directory whose subdirectories "
                "are the partitions (name=value), with the same partition columns in every path."
            ) from exc


def _partition_parts(directory: str) -> list[tuple[str, str]]:
    """The (column, raw value) pairs of a relative directory such as ``day=2024-01-01/hour=03``."""
    return [(name, value) for name, _, value in (part.partition("=") for part in directory.split("/"))]


def _partition_values(spark: SparkSession, directories: set[str], partition_schema: StructType) -> DataFrame:
    """One row per partition directory: its relative path (as the scan reports it) and its typed values,
    cast from the unescaped directory names as Spark's reader casts them."""
    rows = []
    for directory in sorted(directories):
        raw = dict(_partition_parts(directory))
        rows.append([directory, *(_unescaped(raw.get(f.name)) for f in partition_schema.fields)])
    names = [FILE_PATH, *(f"raw_{i}" for i in range(len(partition_schema.fields)))]
    strings = spark.createDataFrame(rows, StructType([StructField(n, StringType()) for n in names]))
    typed = [F.col(f"raw_{i}").cast(f.dataType).alias(f.name) for i, f in enumerate(partition_schema.fields)]
    return strings.select(FILE_PATH, *typed)


def _unescaped(value: str | None) -> str | None:
    """A directory name's value as Spark reads it: ``%XX`` escapes decoded, Hive's default partition NULL."""
    if value is None or value == _HIVE_DEFAULT_PARTITION:
        return None
    return unquote(value)


def _parquet_paths(fs: pafs.FileSystem, base: str) -> list[str]:
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.File:
        return [base]
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no object or prefix {base}")
    listed = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted(
        f.path for f in listed
        if f.type == pafs.FileType.File and not _hidden(f.path.removeprefix(base))
    )  # fmt: skip


def _hidden(relative: str) -> bool:
    return any(part.startswith(("_", ".")) for part in relative.strip("/").split("/"))
