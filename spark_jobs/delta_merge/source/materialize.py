"""The merge source: read it, decide materialization as MergeIntoMaterializeSource does, materialize."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructType

from spark_jobs.delta_merge.errors import MergeAnalysisError, MergeExecutionError
from spark_jobs.delta_merge.scan.arrow_scan import is_object_store
from spark_jobs.delta_merge.session_facts import broadcast_limit_bytes, estimated_row_bytes
from spark_jobs.delta_merge.source.object_store import read_object_store_parquet
from spark_jobs.delta_merge.spec import MergeOptions, SourceSpec
from spark_jobs.delta_merge.sql_names import quoted_name
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
    "statement_source",
    "storage_level_for_attempt",
]

_FILE_FORMATS = ("parquet", "csv", "json", "orc")
# Delta's spark.databricks.delta.merge.materializeSource.maxAttempts.
MATERIALIZE_MAX_ATTEMPTS = 4
# Levels of the retries after the configured one: all on disk, then replicated (Delta's rddStorageLevel,
# rddStorageLevelFirstRetry and rddStorageLevelRetry defaults).
_RETRY_LEVELS = ("DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3")
_BLOCK_LOST_CONDITION = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"
_BLOCK_LOST_TEXT = re.compile(rf"{_BLOCK_LOST_CONDITION}|Checkpoint block rdd_[0-9]+_[0-9]+ not found")


class MaterializedSourceLostError(MergeExecutionError):
    """Blocks of the materialized source were lost (executor gone, blocks evicted) before the merge ended.

    Nothing was committed: the merge can run again from the start with a more durable storage level.
    """


@dataclass(frozen=True)
class SourceRead:
    """The source as read, before pruning and materialization.

    :param pinned_delta: a Delta table read at one version (a deterministic scan).
    :param query_operators: a query (the statement's USING subquery) runs over what was read.
    """

    df: DataFrame
    pinned_delta: bool
    query_operators: bool = False


@dataclass(frozen=True)
class PreparedSource:
    """The source the merge joins with, and how it came to be.

    :param size_bytes: the materialized rows' size (:func:`_row_bytes`) as observed while materializing;
        None when the session reports no observed metrics for a checkpoint (Spark Connect does not).
    :param row_id_column: a materialized source carries a row id (:data:`SOURCE_ROW_ID_COLUMN`), fixed in
        its blocks: a later stage can tell which source rows an earlier one matched.
    """

    df: DataFrame
    materialized: bool
    reason: str
    materialize_time_ms: int
    storage_level: str | None = None
    size_bytes: int | None = None
    row_id_column: str | None = None

    def fits_a_broadcast(self, spark: SparkSession) -> bool:
        """The materialized source is small enough to broadcast into the joins with the target's files.

        Spark's estimate for a checkpointed source comes from the files it was read from, which a source
        of a few hundred thousand rows exceeds (10 MB by default): the join then shuffles every row of
        every candidate file. The materialized rows give a real size instead (their string and binary
        bytes, Spark's default sizes for the rest: the block manager's own figure is not visible through
        Spark Connect); it may be broadcast up to :func:`broadcast_limit_bytes`. A threshold of -1
        (broadcasts off) is respected.
        """
        if not self.materialized:
            return False
        limit = broadcast_limit_bytes(spark)
        if limit < 0:
            return False
        size = self.size_bytes if self.size_bytes is not None else _row_bytes(self.df, self.df.schema)
        return size <= limit

    def release(self) -> None:
        """Let go of the materialized blocks once the merge has read them (Delta unpersists them too).

        Through Spark Connect, dropping the checkpointed DataFrame releases it on the server; in a classic
        session Spark's context cleaner unpersists the checkpointed RDD once nothing refers to it (the
        RDD itself is reachable only through the JVM gateway, which this job does not use).
        """
        if self.materialized:
            object.__setattr__(self, "df", None)

    def raise_if_blocks_lost(self, error: BaseException) -> None:
        """Raise :class:`MaterializedSourceLostError` when ``error`` is Spark's "checkpoint block not found"
        (what Delta's runWithMaterializedSourceLostRetries catches); the merge checkpoints nothing else."""
        if not self.materialized or not _lost_checkpoint_block(error):
            return
        raise MaterializedSourceLostError(
            f"Blocks of the materialized merge source (storage level {self.storage_level}) were lost "
            "before the merge finished: an executor died or the blocks were evicted. Nothing was committed."
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
        # A classic session plans the read in load(); Spark Connect only when asked: the schema, here, so
        # that a read Spark cannot plan fails inside this try on both.
        df.schema  # noqa: B018
        return SourceRead(df, pinned_delta=False)
    except (Py4JJavaError, PySparkException) as exc:
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


@contextmanager
def statement_source(spark: SparkSession, source: SourceRead, query: str) -> Iterator[SourceRead]:
    """The statement's USING subquery (or CTE), run over the spec's source under the name ``source``.

    The view lives as long as the block: a Spark Connect DataFrame of ``spark.sql`` keeps the query's text
    and is analyzed again each time it runs (materializing it, scanning it a second time), so the name must
    still resolve then; a classic session's analyzed plan holds the source itself.
    """
    source.df.createOrReplaceTempView(SOURCE_VIEW)
    try:
        yield SourceRead(_analyzed_statement_source(spark, query), pinned_delta=source.pinned_delta,
                         query_operators=True)  # fmt: skip
    finally:
        spark.catalog.dropTempView(SOURCE_VIEW)


def _analyzed_statement_source(spark: SparkSession, query: str) -> DataFrame:
    try:
        df = spark.sql(query)
        # A classic session analyzes in sql(); Spark Connect only when asked: the schema, here, so that a
        # query that does not analyze fails inside this try on both.
        df.schema  # noqa: B018
    except (Py4JJavaError, PySparkException) as exc:
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
    return df


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
    if source.query_operators:
        # A plan's determinism is not visible through Spark Connect: a query over a pinned Delta source
        # is materialized as if it were not deterministic (it may hold rand() or a UDF).
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
    pruned = source.df.select(*[source.df[quoted_name(c)] for c in columns])
    materialize, reason = materialize_reason(source, mode=options.materialize_source, insert_only=insert_only)
    if not materialize:
        return PreparedSource(pruned, materialized=False, reason=reason, materialize_time_ms=0)
    level_name = storage_level_for_attempt(options.materialize_storage_level, attempt)
    started = time.monotonic()
    with_ids = pruned.withColumn(SOURCE_ROW_ID_COLUMN, F.monotonically_increasing_id())
    observation = Observation("mergeMaterializedSource")
    size = F.sum(_row_bytes_column(with_ids.schema, with_ids)).alias("bytes")
    observed = with_ids.observe(observation, size)
    checkpointed = observed.localCheckpoint(eager=True, storageLevel=_storage_level(level_name))
    observed_metrics = observation.get  # empty through Spark Connect, whose checkpoint reports none
    return PreparedSource(
        checkpointed,
        materialized=True,
        reason=reason,
        materialize_time_ms=int((time.monotonic() - started) * 1000),
        storage_level=level_name,
        size_bytes=int(observed_metrics.get("bytes") or 0) if observed_metrics else None,
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


def _lost_checkpoint_block(error: BaseException) -> bool:
    """Whether ``error`` (or a cause of it) is Spark's CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND: by its condition,
    or by its text when the task failure reached the driver only as text (Delta matches it this way)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        condition = current.getCondition() if isinstance(current, PySparkException) else None
        if condition == _BLOCK_LOST_CONDITION or _BLOCK_LOST_TEXT.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def _row_bytes_column(schema: StructType, df: DataFrame) -> Any:
    """A row's size: its string and binary bytes, Spark's default size for the other fields."""
    variable = [f.name for f in schema.fields if isinstance(f.dataType, (StringType, BinaryType))]
    fixed = estimated_row_bytes(StructType([f for f in schema.fields if f.name not in variable]))
    size = F.lit(fixed)
    for name in variable:
        size = size + F.coalesce(F.octet_length(df[quoted_name(name)]), F.lit(0))
    return size


def _row_bytes(df: DataFrame, schema: StructType) -> int:
    """The size of ``df``'s rows (:func:`_row_bytes_column`), counted by one aggregate."""
    row = df.agg(F.coalesce(F.sum(_row_bytes_column(schema, df)), F.lit(0)).alias("bytes")).collect()[0]
    return int(row["bytes"])


def _storage_level(name: str) -> StorageLevel:
    level = getattr(StorageLevel, name.upper(), None)
    if not isinstance(level, StorageLevel):
        raise MergeAnalysisError(
            f"options.materialize_storage_level: expected a Spark storage level such as MEMORY_AND_DISK or "
            f"DISK_ONLY; found {name!r}."
        )
    return level
