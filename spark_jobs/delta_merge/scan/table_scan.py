"""Read exactly a given set of a table's live files with Spark: partition values from the log, deleted rows
(deletion vectors) left out. Files on object stores, and the files of a table whose column types were
widened (Spark's Parquet reader does not up-cast every narrower type Delta allows, INT32 to a DECIMAL with a
scale say), are read by pyarrow in Spark tasks (arrow_scan), which casts each file's columns to the
schema's types."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.delta_merge.protocol.column_mapping import (
    logical_column,
    partition_keys,
    physical_read_schema,
)
from spark_jobs.delta_merge.protocol.deletion_vectors import deleted_rows
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.partition_values import parse_partition_value
from spark_jobs.delta_merge.protocol.row_tracking import ROW_COMMIT_VERSION_COLUMN, ROW_ID_COLUMN, RowTracking
from spark_jobs.delta_merge.protocol.type_widening import has_type_changes
from spark_jobs.delta_merge.scan.arrow_scan import (
    FILE_PATH,
    ROW_INDEX,
    ArrowScanFile,
    is_object_store,
    read_parquet_files,
)
from spark_jobs.delta_merge.sql_names import quoted_name
from spark_jobs.delta_merge.storage.arrow_store import arrow_file_path

if TYPE_CHECKING:
    from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = ["FILE_KEY_COLUMN", "ROW_INDEX_COLUMN", "JoinScan", "scan_files", "scan_for_join"]

# Identifies the file a target row came from, in the form `TargetSnapshot.file_key` gives for a LiveFile.
FILE_KEY_COLUMN = "__merge_file"
ROW_INDEX_COLUMN = "__merge_row_index"
# Spark's `_metadata.file_path` of a scanned row, turned into its file key once the row has joined.
_FILE_URI_COLUMN = "__merge_file_uri"
_BASE_ROW_ID_COLUMN = "__merge_base_row_id"
_DEFAULT_VERSION_COLUMN = "__merge_default_version"


def _file_key_column(file_path: Column | None = None) -> Column:
    """The ``TargetSnapshot.file_key`` of Spark's ``_metadata.file_path`` (or of ``file_path``, a column
    holding it)."""
    # `_metadata.file_path` is a URI (spaces as %20, '%' as %25). url_decode would also turn '+'
    # into a space, so protect '+' first; then drop the scheme as `TargetSnapshot.file_key` does.
    path = F.col("_metadata.file_path") if file_path is None else file_path
    decoded = F.url_decode(F.replace(path, F.lit("+"), F.lit("%2B")))
    return F.regexp_replace(decoded, r"^[a-zA-Z][a-zA-Z0-9+.-]*:/*", "/")


def _deleted_rows_frame(
    spark: SparkSession, snapshot: TargetSnapshot, files: Sequence[LiveFile]
) -> DataFrame:
    """The rows the deletion vectors of ``files`` delete, as (:data:`FILE_KEY_COLUMN`,
    :data:`ROW_INDEX_COLUMN`); built as Arrow columns, not Python tuples: a table merged on read holds
    millions of deleted rows."""
    store = snapshot.log_store
    keys: list[pa.Array] = []
    indexes: list[pa.Array] = []
    for f in files:
        if f.deletion_vector is None:
            continue
        rows = deleted_rows(
            store, snapshot.table_uri, f.deletion_vector, storage_options=snapshot.storage_options
        )
        keys.append(pa.repeat(pa.scalar(snapshot.file_key(f), pa.string()), len(rows)))
        indexes.append(pa.array(rows, pa.int64()))
    deleted = pa.table({
        FILE_KEY_COLUMN: pa.chunked_array(keys, pa.string()),
        ROW_INDEX_COLUMN: pa.chunked_array(indexes, pa.int64()),
    })  # fmt: skip
    return spark.createDataFrame(deleted)


def _read_live_rows(
    spark: SparkSession,
    snapshot: TargetSnapshot,
    files: Sequence[LiveFile],
    data_schema: StructType,
    *,
    with_file_key: bool,
    with_row_index: bool = False,
) -> DataFrame:
    """The Parquet rows of ``files`` minus the rows their deletion vectors delete (with their physical
    index in the file as ``ROW_INDEX_COLUMN`` when ``with_row_index``).

    Files without a vector are read as they are; only files with one pay for the anti join on
    (file, ``_metadata.row_index``) against their deleted rows, which are few and broadcast.
    """
    if _reads_with_arrow(snapshot):
        return _read_live_rows_with_arrow(
            spark, snapshot, files, data_schema, with_file_key=with_file_key, with_row_index=with_row_index
        )
    plain = [f for f in files if f.deletion_vector is None]
    with_dv = [f for f in files if f.deletion_vector is not None]
    parts: list[DataFrame] = []
    if plain:
        df = spark.read.schema(data_schema).parquet(*[snapshot.file_uri(f) for f in plain])
        if with_row_index:
            df = df.withColumn(ROW_INDEX_COLUMN, F.col("_metadata.row_index"))
        parts.append(df.withColumn(FILE_KEY_COLUMN, _file_key_column()) if with_file_key else df)
    if with_dv:
        df = (
            spark.read.schema(data_schema)
            .parquet(*[snapshot.file_uri(f) for f in with_dv])
            .withColumn(FILE_KEY_COLUMN, _file_key_column())
            .withColumn(ROW_INDEX_COLUMN, F.col("_metadata.row_index"))
            .join(
                F.broadcast(_deleted_rows_frame(spark, snapshot, with_dv)),
                [FILE_KEY_COLUMN, ROW_INDEX_COLUMN],
                "left_anti",
            )
        )
        df = df if with_row_index else df.drop(ROW_INDEX_COLUMN)
        parts.append(df if with_file_key else df.drop(FILE_KEY_COLUMN))
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


def _reads_with_arrow(snapshot: TargetSnapshot) -> bool:
    """Whether the table's files are read by pyarrow: on an object store, or with widened column types."""
    return is_object_store(snapshot.table_uri) or has_type_changes(snapshot.schema)


def _read_live_rows_with_arrow(
    spark: SparkSession,
    snapshot: TargetSnapshot,
    files: Sequence[LiveFile],
    data_schema: StructType,
    *,
    with_file_key: bool,
    with_row_index: bool,
) -> DataFrame:
    """What :func:`_read_live_rows` gives, read by pyarrow in Spark tasks: Spark's readers here have no
    connector for object stores. Deleted rows are found on the driver, as for Spark's reader."""
    options = snapshot.storage_options
    store = snapshot.log_store if any(f.deletion_vector for f in files) else None
    scan = []
    for f in files:
        deleted: list[int] = []
        if f.deletion_vector is not None and store is not None:
            deleted = deleted_rows(
                store, snapshot.table_uri, f.deletion_vector, storage_options=snapshot.storage_options
            )
        path = arrow_file_path(snapshot.file_uri(f))
        scan.append(ArrowScanFile(path=path, key=snapshot.file_key(f), deleted_rows=deleted))
    df = read_parquet_files(spark, snapshot.table_uri, scan, data_schema, storage_options=options)
    df = df.withColumnRenamed(ROW_INDEX, ROW_INDEX_COLUMN).withColumnRenamed(FILE_PATH, FILE_KEY_COLUMN)
    df = df if with_row_index else df.drop(ROW_INDEX_COLUMN)
    return df if with_file_key else df.drop(FILE_KEY_COLUMN)


def scan_files(
    spark: SparkSession,
    snapshot: TargetSnapshot,
    files: Sequence[LiveFile],
    *,
    with_file_key: bool = False,
    with_row_index: bool = False,
    row_tracking: RowTracking | None = None,
) -> DataFrame:
    """The rows of ``files`` in the snapshot's schema (partition columns from the log, not the path).

    :param with_file_key: each row also carries its file (:data:`FILE_KEY_COLUMN`).
    :param with_row_index: each row also carries its physical index in its file
        (:data:`ROW_INDEX_COLUMN`), the position a deletion vector marks.

    Columns of column-mapped tables are read by physical name or field id and renamed to logical names.

    :param row_tracking: with row tracking enabled, each row also carries its stable row id and row
        commit version (:data:`ROW_ID_COLUMN`, :data:`ROW_COMMIT_VERSION_COLUMN`).
    """
    schema: StructType = snapshot.schema
    partition_columns = list(snapshot.partition_columns)
    mode = snapshot.column_mapping_mode
    keys = partition_keys(schema, partition_columns, mode)
    data_fields = [f for f in schema.fields if f.name not in partition_columns]
    data_schema = physical_read_schema(StructType(data_fields), mode)
    out_fields = list(schema.fields) + ([StructField(FILE_KEY_COLUMN, StringType())] if with_file_key else [])
    out_fields += [StructField(ROW_INDEX_COLUMN, LongType())] if with_row_index else []
    tracked = row_tracking.materialized_columns if row_tracking is not None else ()
    if tracked:
        data_schema = StructType(data_schema.fields + [StructField(c, LongType()) for c in tracked])
        out_fields += [StructField(c, LongType()) for c in (ROW_ID_COLUMN, ROW_COMMIT_VERSION_COLUMN)]
    if not files:
        return spark.createDataFrame([], StructType(out_fields))
    df = _read_live_rows(
        spark, snapshot, files, data_schema,
        with_file_key=with_file_key or bool(partition_columns or tracked),
        with_row_index=with_row_index or bool(tracked),
    )
    if tracked:
        df = _with_stable_row_ids(spark, snapshot, files, df, tracked)
    if partition_columns:
        part_schema = StructType(
            [StructField(FILE_KEY_COLUMN, StringType())]
            + [StructField(c, schema[c].dataType) for c in partition_columns]
        )
        part_rows = [
            (
                snapshot.file_key(f),
                *[parse_partition_value(f.partition_values.get(keys[c]), schema[c].dataType)
                  for c in partition_columns],
            )
            for f in files
        ]
        values = spark.createDataFrame(part_rows, part_schema)
        df = df.join(F.broadcast(values), on=FILE_KEY_COLUMN, how="inner")
    # Quoted: a name with a dot (`value.a`) is one column, not the field a of a struct value.
    return df.select(*[
        logical_column(f, mode) if f in data_fields else F.col(quoted_name(f.name))
        for f in out_fields
    ])


def _with_stable_row_ids(
    spark: SparkSession, snapshot: TargetSnapshot, files: Sequence[LiveFile], df: DataFrame,
    materialized: tuple[str, ...],
) -> DataFrame:
    """PROTOCOL.md "Reader Requirements for Row Tracking": the materialized value when not NULL, else
    the default (``baseRowId`` + physical index; ``defaultRowCommitVersion``)."""
    defaults_schema = StructType([
        StructField(FILE_KEY_COLUMN, StringType()), StructField(_BASE_ROW_ID_COLUMN, LongType()),
        StructField(_DEFAULT_VERSION_COLUMN, LongType()),
    ])  # fmt: skip
    defaults = spark.createDataFrame(
        [(snapshot.file_key(f), f.base_row_id, f.default_row_commit_version) for f in files], defaults_schema
    )
    row_id, commit_version = (F.col(quoted_name(c)) for c in materialized)
    return (
        df.join(F.broadcast(defaults), on=FILE_KEY_COLUMN, how="inner")
        .withColumn(ROW_ID_COLUMN, F.coalesce(row_id, F.col(_BASE_ROW_ID_COLUMN) + F.col(ROW_INDEX_COLUMN)))
        .withColumn(ROW_COMMIT_VERSION_COLUMN, F.coalesce(commit_version, F.col(_DEFAULT_VERSION_COLUMN)))
    )


@dataclass(frozen=True)
class JoinScan:
    """Target rows for an inner join with the source, and what completes the joined rows: after
    ``complete``, every joined row carries its target row's :data:`FILE_KEY_COLUMN` and
    :data:`ROW_INDEX_COLUMN` (and, with row tracking, its stable row id and commit version), and pairs
    whose target row a deletion vector deletes are gone.

    ``rows`` carry their file's URI for ``complete``; ``rows_without_file_uri``, when given, are the
    same rows without it, for a broadcast join: its stream side is read in the task that joins it, so
    ``input_file_name()`` names the file of a joined row there.
    """

    rows: DataFrame
    complete: Callable[[DataFrame], DataFrame]
    rows_without_file_uri: DataFrame | None = None

    def matches(
        self, source: DataFrame, *, source_alias: str, target_alias: str, condition: str,
        broadcast_source: bool,
    ) -> DataFrame:
        """The completed inner join of ``source`` (as ``source_alias``, broadcast when
        ``broadcast_source``) with these rows (as ``target_alias``) on ``condition``."""
        left = F.broadcast(source) if broadcast_source else source
        if broadcast_source and self.rows_without_file_uri is not None:
            # A broadcast join reads the target's rows in the same task as it joins them: the file being
            # read is known there for the few rows that match, where `_metadata.file_path` would be built
            # as a string on every row read (half the scan's time on a key-only read).
            rows = self.rows_without_file_uri.alias(target_alias)
            joined = left.alias(source_alias).join(rows, on=F.expr(condition), how="inner")
            return self.complete(joined.withColumn(_FILE_URI_COLUMN, F.input_file_name()))
        rows = self.rows.alias(target_alias)
        return self.complete(left.alias(source_alias).join(rows, on=F.expr(condition), how="inner"))


def scan_for_join(
    spark: SparkSession, snapshot: TargetSnapshot, files: Sequence[LiveFile], *,
    row_tracking: RowTracking | None = None,
) -> JoinScan:
    """The rows of ``files`` to join with the source (inner joins only).

    On an unpartitioned table read by Spark's own reader, the per-row work of :func:`scan_files` (the
    file key, a decoded string per row, which costs more than reading the key column; the anti join
    with deleted rows; the stable row ids) is done on the joined pairs instead: an inner join keeps
    only the target rows that match, and a deleted row's pairs leave with it. Partitioned tables need
    their partition values (joined by file key) before the join's condition can use them, and tables
    in object stores are read by pyarrow, which gives the key for free: both are completed at the scan.
    """
    tracked = row_tracking.materialized_columns if row_tracking is not None else ()
    if _reads_with_arrow(snapshot) or snapshot.partition_columns or not files:
        rows = scan_files(spark, snapshot, files, with_file_key=True, with_row_index=True,
                          row_tracking=row_tracking)  # fmt: skip
        return JoinScan(rows, lambda joined: joined)
    schema: StructType = snapshot.schema
    mode = snapshot.column_mapping_mode
    data_schema = physical_read_schema(schema, mode)
    data_schema = StructType(data_schema.fields + [StructField(c, LongType()) for c in tracked])
    read = spark.read.schema(data_schema).parquet(*[snapshot.file_uri(f) for f in files])
    columns = [
        *[logical_column(f, mode) for f in schema.fields],
        *[F.col(quoted_name(c)) for c in tracked],
        F.col("_metadata.row_index").alias(ROW_INDEX_COLUMN),
    ]
    with_vectors = [f for f in files if f.deletion_vector is not None]

    def complete(joined: DataFrame) -> DataFrame:
        key = _file_key_column(F.col(_FILE_URI_COLUMN))
        keyed = joined.withColumn(FILE_KEY_COLUMN, key).drop(_FILE_URI_COLUMN)
        if with_vectors:
            deleted = F.broadcast(_deleted_rows_frame(spark, snapshot, with_vectors))
            keyed = keyed.join(deleted, [FILE_KEY_COLUMN, ROW_INDEX_COLUMN], "left_anti")
        if tracked:
            keyed = _with_stable_row_ids(spark, snapshot, files, keyed, tracked).drop(
                _BASE_ROW_ID_COLUMN, _DEFAULT_VERSION_COLUMN, *tracked
            )
        return keyed

    return JoinScan(
        rows=read.select(*columns, F.col("_metadata.file_path").alias(_FILE_URI_COLUMN)),
        complete=complete,
        rows_without_file_uri=read.select(*columns),
    )
