"""A file source on an object store, read without a Hadoop connector: Parquet through pyarrow in Spark tasks;
other formats refused with what to install."""

from __future__ import annotations

import posixpath

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.delta_merge.arrow_scan import FILE_PATH, ROW_INDEX, ArrowScanFile, read_parquet_files
from spark_jobs.delta_merge.arrow_store import arrow_filesystem
from spark_jobs.delta_merge.azure_options import AZURE_SCHEMES
from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.log_store import storage_failure
from spark_jobs.delta_merge.spec import SourceSpec

__all__ = ["read_object_store_files"]


def read_object_store_files(spark: SparkSession, source: SourceSpec, fmt: str) -> DataFrame:
    """The rows of the Parquet file or directory ``source.uri`` names on an object store.

    The schema is the first file's, as Spark's reader takes it without ``mergeSchema``; files and
    directories whose names start with ``_`` or ``.`` are skipped, as Spark skips them.

    :raises MergeAnalysisError: the format is not Parquet (Spark would need the Hadoop connector), Spark
        reader options are given, the path holds no Parquet file, or it is a Hive-partitioned directory.
    :raises TableStorageError: the store refused or failed the listing (secrets masked).
    """
    assert source.uri is not None
    if fmt != "parquet" and source.uri.partition("://")[0].lower() in AZURE_SCHEMES:
        raise MergeAnalysisError(
            f"Cannot read the source {source.uri} as {fmt}: Spark reads {fmt} files in Azure Blob Storage "
            "only through Hadoop's Azure connector (hadoop-azure), and the job reads sources on object "
            "stores without Spark's readers. Give the source as Parquet or Delta, which the job reads with "
            "pyarrow, or copy it to a path Spark reads (HDFS or local)."
        )
    if fmt != "parquet":
        raise MergeAnalysisError(
            f"Cannot read the source {source.uri} as {fmt}: Spark reads {fmt} files on object stores only "
            f"through Hadoop's connector (S3AFileSystem), which this Spark has not. Add "
            f"org.apache.hadoop:hadoop-aws:{_hadoop_version(spark)} with --packages (spark.jars.packages), "
            "or give the source as Parquet or Delta, which the job reads without it."
        )
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
    partitioned = [p for p in paths if "=" in posixpath.dirname(p.removeprefix(base))]
    if partitioned:
        raise MergeAnalysisError(
            f"Cannot read the source {source.uri}: it is a Hive-partitioned directory (e.g. "
            f"{partitioned[0]}), which the job reads on object stores only as a Delta table. "
            "Give the source as format delta, "
            "or point source.uri at one partition."
        )
    read_schema = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    files = [ArrowScanFile(path=p, key=p) for p in paths]
    return read_parquet_files(spark, source.uri, files, read_schema, storage_options=options).drop(
        ROW_INDEX, FILE_PATH
    )


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


def _hadoop_version(spark: SparkSession) -> str:
    """The Hadoop version Spark was built with: hadoop-aws must match it."""
    try:
        return str(spark.sparkContext._jvm.org.apache.hadoop.util.VersionInfo.getVersion())  # type: ignore[union-attr]
    except Exception:
        return "<the Hadoop version of your Spark build>"
