"""The merge source: read it, decide materialization as MergeIntoMaterializeSource does, materialize."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.delta_merge.errors import MergeAnalysisError, MergeExecutionError
from spark_jobs.delta_merge.scan.arrow_scan import is_object_store
from spark_jobs.delta_merge.source.object_store import read_object_store_parquet
from spark_jobs.delta_merge.spec import MergeOptions, SourceSpec
from spark_jobs.delta_merge.statement.merge_sql import SOURCE_VIEW
from spark_jobs.delta_merge.storage.hadoop_connectors import connector_advice, missing_connector_scheme

# The row id of a materialized source (bookkeeping, never written).
SOURCE_ROW_ID_COLUMN = "__merge_source_row_id"

__all__ = [
    "MATERIALIZE_MAX_ATTEMPTS",
    "SOURCE_ROW_ID_COLUMN",
    "MaterializedSourceLostError",
    "PreparedSource",
    "SourceRead",
    "materialize_source",
    "read_source",
    "read_statement_source",
    "storage_level_for_attempt",
]

_FILE_FORMATS = ("parquet", "csv", "json", "orc")
# Delta's spark.databricks.delta.merge.materializeSource.maxAttempts.
MATERIALIZE_MAX_ATTEMPTS = 4
# Levels of the retries after the configured one: all on disk, then replicated (Delta's rddStorageLevel,
# rddStorageLevelFirstRetry and rddStorageLevelRetry defaults).
_RETRY_LEVELS = ("DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3")
_BLOCK_LOST_CONDITION = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"


class MaterializedSourceLostError(MergeExecutionError):
    """Blocks of the materialized source were lost (executor gone, blocks evicted) before the merge ended.

    Nothing was committed: the merge can run again from the start with a more durable storage level.
    """


@dataclass(frozen=True)
class SourceRead:
    """The source as read, before pruning and materialization.

    :param pinned_delta: a Delta table read at one version (a deterministic scan).
    """

    df: DataFrame
    pinned_delta: bool


@dataclass(frozen=True)
class PreparedSource:
    """The source the merge joins with, and how it came to be.

    :param row_id_column: a materialized source carries a row id (:data:`SOURCE_ROW_ID_COLUMN`), fixed in
        its blocks: a later stage can tell which source rows an earlier one matched.
    """

    df: DataFrame
    materialized: bool
    reason: str
    materialize_time_ms: int
    storage_level: str | None = None
    rdd_id: int | None = None
    row_id_column: str | None = None

    def fits_a_broadcast(self, spark: SparkSession) -> bool:
        """The materialized source is small enough to broadcast into the joins with the target's files.

        Spark's estimate for a checkpointed source comes from the files it was read from, which a source
        of a few hundred thousand rows exceeds (10 MB by default): the join then shuffles every row of
        every candidate file. The materialized blocks give its real size instead; it may be broadcast up
        to the larger of ``spark.sql.autoBroadcastJoinThreshold`` and a sixteenth of the driver's heap
        (which holds the broadcast). A threshold of -1 (broadcasts off) is respected.
        """
        if self.rdd_id is None:
            return False
        # Spark's own reading of the setting, which takes byte strings such as "10MB" or "-1".
        threshold = int(spark._jsparkSession.sessionState().conf().autoBroadcastJoinThreshold())
        if threshold < 0:
            return False
        context = spark.sparkContext._jsc.sc()
        held = [info for info in context.getRDDStorageInfo() if info.id() == self.rdd_id]
        if not held:
            return False
        size = int(held[0].memSize()) + int(held[0].diskSize())
        heap = int(spark._jvm.java.lang.Runtime.getRuntime().maxMemory())  # type: ignore[union-attr]
        return size <= max(threshold, heap // 16)

    def release(self) -> None:
        """Drop the materialized blocks once the merge has read them (Delta unpersists them too)."""
        if self.materialized:
            # localCheckpoint persists an RDD under a LogicalRDD, which DataFrame.unpersist() does not reach;
            # left alone, every merge would keep its source in a long-lived session's block manager.
            _checkpointed_rdd(self.df).unpersist(False)

    def raise_if_blocks_lost(self, error: BaseException) -> None:
        """Raise :class:`MaterializedSourceLostError` when ``error`` is Spark's "checkpoint block not found"
        for this source's materialized RDD (what Delta's runWithMaterializedSourceLostRetries catches)."""
        if self.rdd_id is None or not _lost_checkpoint_block(error, self.rdd_id):
            return
        raise MaterializedSourceLostError(
            f"Blocks of the materialized merge source (RDD {self.rdd_id}, storage level "
            f"{self.storage_level}) were lost before the merge finished: an executor died or the blocks "
            "were evicted. Nothing was committed."
        ) from error


def read_source(spark: SparkSession, source: SourceSpec) -> SourceRead:
    """Read the source lazily; a missing path or a bad query fails here, before any target file is read."""
    if source.query is not None:
        try:
            return SourceRead(spark.sql(source.query), pinned_delta=False)
        except AnalysisException as exc:
            scheme = missing_connector_scheme(exc)
            if scheme is not None:
                raise MergeAnalysisError(
                    f"source.query reads a {scheme}:// path: {connector_advice(spark, scheme)} Or give the "
                    "source as source.uri with format parquet or delta, which the job reads without a "
                    "connector."
                ) from exc
            raise MergeAnalysisError(
                f"source.query does not analyze: {str(exc).splitlines()[0]}. Check the query's tables "
                "(paths are written as parquet.`/path`) and columns."
            ) from exc
    assert source.uri is not None
    fmt = (source.format or "parquet").lower()
    if fmt == "delta":
        from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
        from spark_jobs.delta_merge.scan.table_scan import scan_files

        options = dict(source.options) | dict(source.storage_options)
        try:
            snapshot = load_snapshot(source.uri, storage_options=options, version=source.version)
        except MergeAnalysisError as exc:
            # load_snapshot words its messages for the target; say which table failed.
            raise MergeAnalysisError(f"Cannot read the Delta source (source.uri): {exc}") from exc
        return SourceRead(scan_files(spark, snapshot, snapshot.files), pinned_delta=True)
    if fmt not in _FILE_FORMATS:
        raise MergeAnalysisError(
            f"source.format: expected one of delta, {', '.join(_FILE_FORMATS)}; found {source.format!r}."
        )
    if is_object_store(source.uri) and fmt == "parquet":
        return SourceRead(read_object_store_parquet(spark, source), pinned_delta=False)
    try:
        # Other formats on an object store need the user's Hadoop connector (configured through Spark's
        # conf, not storage_options): with it they read as anywhere else.
        df = spark.read.format(fmt).options(**source.options).load(source.uri)
        return SourceRead(df, pinned_delta=False)
    except (AnalysisException, Py4JJavaError) as exc:
        scheme = missing_connector_scheme(exc)
        if scheme is not None:
            raise MergeAnalysisError(
                f"Cannot read the source {source.uri} as {fmt}: {connector_advice(spark, scheme)} Or give "
                "the source as Parquet or Delta, which the job reads without a connector."
            ) from exc
        # Schema inference reads the files: a file of another format fails there (FAILED_READ_FILE).
        raise MergeAnalysisError(
            f"Cannot read the source {source.uri} as {fmt}: {str(exc).splitlines()[0]}. Check that the path "
            "exists and holds files of that format (and source.options such as header=true for CSV)."
        ) from exc


def read_statement_source(spark: SparkSession, source: SourceRead, query: str) -> SourceRead:
    """The statement's USING subquery (or CTE), run over the spec's source under the name ``source``.

    The view is dropped as soon as the query is analyzed: the analyzed plan holds the source itself, so
    later scans (the second scan, a retry's re-read) never look the name up again.
    """
    source.df.createOrReplaceTempView(SOURCE_VIEW)
    try:
        df = spark.sql(query)
    except (AnalysisException, Py4JJavaError) as exc:
        scheme = missing_connector_scheme(exc)
        if scheme is not None:
            raise MergeAnalysisError(
                f"merge_sql: the USING query reads a {scheme}:// path: {connector_advice(spark, scheme)} "
                "Or give that data as the spec's source (source.uri, format parquet or delta), which the job "
                f"reads without a connector, and name it `{SOURCE_VIEW}` in the query."
            ) from exc
        first_line = next((line for line in str(exc).splitlines() if "[" in line), str(exc))
        condition = re.search(r"\[([A-Z_.]+)\]", first_line)
        raise MergeAnalysisError(
            f"merge_sql: the USING query does not analyze: {first_line.split(': ', 1)[-1]} In it, the "
            f"spec's source is named `{SOURCE_VIEW}`.",
            error_class=condition.group(1) if condition else None,
        ) from exc
    finally:
        spark.catalog.dropTempView(SOURCE_VIEW)
    return SourceRead(df, pinned_delta=source.pinned_delta)


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
    source: SourceRead, *, columns: Sequence[str], options: MergeOptions, insert_only: bool, attempt: int = 1
) -> PreparedSource:
    """Prune the source to the columns the merge uses and checkpoint it when the rules say so.

    A materialized source is read once, so both scans of the merge see the same rows even when the
    source is a directory that gains files or a query with ``rand()``.

    :param attempt: the merge's attempt (1-based); retries after lost blocks use more durable levels
        (:func:`storage_level_for_attempt`).
    """
    # With no referenced column (e.g. ON 1 = 1 and literal inserts) this keeps only the row count.
    # Quoted: a name with a dot (`value.a`) is one column, not the field a of a struct value.
    pruned = source.df.select(*[source.df[f"`{c.replace('`', '``')}`"] for c in columns])
    materialize, reason = materialize_reason(source, mode=options.materialize_source, insert_only=insert_only)
    if not materialize:
        return PreparedSource(pruned, materialized=False, reason=reason, materialize_time_ms=0)
    level_name = storage_level_for_attempt(options.materialize_storage_level, attempt)
    started = time.monotonic()
    with_ids = pruned.withColumn(SOURCE_ROW_ID_COLUMN, F.monotonically_increasing_id())
    checkpointed = with_ids.localCheckpoint(eager=True, storageLevel=_storage_level(level_name))
    rdd = _checkpointed_rdd(checkpointed)
    rdd.setName("mergeMaterializedSource")
    return PreparedSource(
        checkpointed,
        materialized=True,
        reason=reason,
        materialize_time_ms=int((time.monotonic() - started) * 1000),
        storage_level=level_name,
        rdd_id=int(rdd.id()),
        row_id_column=SOURCE_ROW_ID_COLUMN,
    )


def storage_level_for_attempt(configured: str, attempt: int) -> str:
    """The storage level of the materialized source on ``attempt`` (1-based).

    The configured level first, then DISK_ONLY, DISK_ONLY_2 and DISK_ONLY_3, skipping the configured
    level itself and any level with fewer replicas than it; the last level repeats.
    """
    base = configured.upper()
    replicas = _storage_level(base).replication
    ladder = [base, *(n for n in _RETRY_LEVELS if n != base and _storage_level(n).replication >= replicas)]
    return ladder[min(attempt, len(ladder)) - 1]


def _checkpointed_rdd(df: DataFrame) -> Any:
    """The JVM RDD holding a locally checkpointed DataFrame's blocks (under its LogicalRDD plan)."""
    return df._jdf.queryExecution().logical().rdd()


def _lost_checkpoint_block(error: BaseException, rdd_id: int) -> bool:
    block_prefix = f"rdd_{rdd_id}_"
    for java_error in _java_errors(error):
        try:
            condition = java_error.getCondition()
            block = java_error.getMessageParameters().get("rddBlockId")
        except Py4JError:  # not a SparkThrowable
            condition, block = None, None
        if condition == _BLOCK_LOST_CONDITION and str(block).startswith(block_prefix):
            return True
        # A task failure the driver could not deserialize keeps only the text; Delta matches it this way.
        if re.search(rf"Checkpoint block {block_prefix}[0-9]+ not found", str(java_error.getMessage())):
            return True
    return False


def _java_errors(error: BaseException) -> Iterator[Any]:
    """The JVM throwables behind a Python error: its causes/contexts, then each JVM cause chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # Py4JJavaError carries java_exception; pyspark's converted errors carry _origin.
        java_error = getattr(current, "java_exception", None) or getattr(current, "_origin", None)
        depth = 0
        while java_error is not None and depth < 20:
            yield java_error
            java_error = java_error.getCause()
            depth += 1
        current = current.__cause__ or current.__context__


def _storage_level(name: str) -> StorageLevel:
    level = getattr(StorageLevel, name.upper(), None)
    if not isinstance(level, StorageLevel):
        raise MergeAnalysisError(
            f"options.materialize_storage_level: expected a Spark storage level such as MEMORY_AND_DISK or "
            f"DISK_ONLY; found {name!r}."
        )
    return level
