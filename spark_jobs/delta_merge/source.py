"""The merge source: read it, decide materialization as MergeIntoMaterializeSource does, materialize."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.spec import MergeOptions, SourceSpec

__all__ = ["PreparedSource", "SourceRead", "materialize_source", "read_source"]

_FILE_FORMATS = ("parquet", "csv", "json", "orc")


@dataclass(frozen=True)
class SourceRead:
    """The source as read, before pruning and materialization.

    :param pinned_delta: a Delta table read at one version (a deterministic scan).
    """

    df: DataFrame
    pinned_delta: bool


@dataclass(frozen=True)
class PreparedSource:
    """The source the merge joins with, and how it came to be."""

    df: DataFrame
    materialized: bool
    reason: str
    materialize_time_ms: int

    def release(self) -> None:
        """Drop the materialized blocks once the merge has read them (Delta unpersists them too)."""
        if self.materialized:
            # localCheckpoint persists an RDD under a LogicalRDD, which DataFrame.unpersist() does not reach;
            # left alone, every merge would keep its source in a long-lived session's block manager.
            self.df._jdf.queryExecution().logical().rdd().unpersist(False)


def read_source(spark: SparkSession, source: SourceSpec) -> SourceRead:
    """Read the source lazily; a missing path or a bad query fails here, before any target file is read."""
    if source.query is not None:
        try:
            return SourceRead(spark.sql(source.query), pinned_delta=False)
        except AnalysisException as exc:
            raise MergeAnalysisError(
                f"source.query does not analyze: {str(exc).splitlines()[0]}. Check the query's tables "
                "(paths are written as parquet.`/path`) and columns."
            ) from exc
    assert source.uri is not None
    fmt = (source.format or "parquet").lower()
    if fmt == "delta":
        from spark_jobs.delta_merge.snapshot import load_snapshot
        from spark_jobs.delta_merge.table_scan import scan_files

        try:
            snapshot = load_snapshot(source.uri, storage_options=dict(source.options), version=source.version)
        except MergeAnalysisError as exc:
            # load_snapshot words its messages for the target; say which table failed.
            raise MergeAnalysisError(f"Cannot read the Delta source (source.uri): {exc}") from exc
        return SourceRead(scan_files(spark, snapshot, snapshot.files), pinned_delta=True)
    if fmt not in _FILE_FORMATS:
        raise MergeAnalysisError(
            f"source.format: expected one of delta, {', '.join(_FILE_FORMATS)}; found {source.format!r}."
        )
    try:
        df = spark.read.format(fmt).options(**source.options).load(source.uri)
        return SourceRead(df, pinned_delta=False)
    except AnalysisException as exc:
        raise MergeAnalysisError(
            f"Cannot read the source {source.uri} as {fmt}: {str(exc).splitlines()[0]}. Check that the path "
            "exists and holds files of that format (and source.options such as header=true for CSV)."
        ) from exc


def _is_deterministic(df: DataFrame) -> bool:
    return bool(df._jdf.queryExecution().analyzed().deterministic())


def materialize_reason(source: SourceRead, *, mode: str, insert_only: bool) -> tuple[bool, str]:
    """Whether to materialize and Delta's name for why.

    The rules of MergeIntoMaterializeSource.shouldMaterializeSource.
    """
    if mode == "all":
        return True, "MATERIALIZE_ALL"
    if mode == "none":
        return False, "NOT_MATERIALIZED_NONE"
    if mode != "auto":
        return True, "INVALID_CONFIG"
    if insert_only:
        return False, "NOT_MATERIALIZED_AUTO_INSERT_ONLY"
    if not source.pinned_delta:
        return True, "NON_DETERMINISTIC_SOURCE_NON_DELTA"
    if not _is_deterministic(source.df):
        return True, "NON_DETERMINISTIC_SOURCE_OPERATORS"
    return False, "NOT_MATERIALIZED_AUTO"


def materialize_source(
    source: SourceRead, *, columns: Sequence[str], options: MergeOptions, insert_only: bool
) -> PreparedSource:
    """Prune the source to the columns the merge uses and checkpoint it when the rules say so.

    A materialized source is read once, so both scans of the merge see the same rows even when the
    source is a directory that gains files or a query with ``rand()``.
    """
    # With no referenced column (e.g. ON 1 = 1 and literal inserts) this keeps only the row count.
    pruned = source.df.select(*[source.df[c] for c in columns])
    materialize, reason = materialize_reason(source, mode=options.materialize_source, insert_only=insert_only)
    if not materialize:
        return PreparedSource(pruned, materialized=False, reason=reason, materialize_time_ms=0)
    level = _storage_level(options.materialize_storage_level)
    started = time.monotonic()
    checkpointed = pruned.localCheckpoint(eager=True, storageLevel=level)
    return PreparedSource(
        checkpointed, materialized=True, reason=reason,
        materialize_time_ms=int((time.monotonic() - started) * 1000),
    )


def _storage_level(name: str) -> StorageLevel:
    level = getattr(StorageLevel, name.upper(), None)
    if not isinstance(level, StorageLevel):
        raise MergeAnalysisError(
            f"options.materialize_storage_level: expected a Spark storage level such as MEMORY_AND_DISK or "
            f"DISK_ONLY; found {name!r}."
        )
    return level
