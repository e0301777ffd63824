"""Copy-on-write's unchanged rows, copied by row position: each touched file read and written again by
pyarrow in a Spark task, without the rows the merge changed.

A copy-on-write merge rewrites every file it touches, and most rows of a touched file are copied as
they are. Read by Spark's reader, each copied row would be handed from the JVM to the Python writer.
Here the merge finds the positions of the rows it changes as merge-on-read marks them, then Spark tasks
read each touched file with pyarrow where it is stored, leave those positions out (and the rows its
deletion vector already deletes) and write the rest as the write stage writes its files: the same
layout, Delta statistics, and row tracking's stable ids and commit versions materialized.
Written here: no library copies a Delta file's rows by position.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from spark_jobs.delta_merge.errors import (
    ConstraintViolationError,
    MergeExecutionError,
    spark_failure,
)
from spark_jobs.delta_merge.merge.rewrite import Action
from spark_jobs.delta_merge.protocol.column_mapping import physical_read_schema
from spark_jobs.delta_merge.protocol.deletion_vectors import deleted_rows
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.partition_values import parse_partition_value
from spark_jobs.delta_merge.protocol.table_features import TableConstraints, materializes_partition_columns
from spark_jobs.delta_merge.scan.arrow_scan import FileScan, file_scan, read_file
from spark_jobs.delta_merge.session_facts import default_parallelism
from spark_jobs.delta_merge.spark_confs import size_conf
from spark_jobs.delta_merge.storage.arrow_store import arrow_file_path, arrow_filesystem
from spark_jobs.delta_merge.task_frames import spread_tasks
from spark_jobs.delta_merge.write.conform import conform_batch
from spark_jobs.delta_merge.write.merge_output import (
    data_file_plan,
    failure_summary,
    task_violation,
    written_file,
)
from spark_jobs.delta_merge.write.task_plan import WriteTaskPlan
from spark_jobs.delta_merge.write.task_writer import TaskWriter
from spark_jobs.delta_merge.write.write_task import RESULT_ARROW_SCHEMA, RESULT_SCHEMA

if TYPE_CHECKING:
    from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = ["COPY_BY_POSITION_CONF", "CopiedRows", "copies_by_position", "copy_unchanged_rows"]

# Copy-on-write copies unchanged rows by position when the files it rewrites hold at least this many
# bytes; below, they go through Spark's reader and the merge's output, in the job that writes the changed
# rows: one Spark job less, and one file per partition rather than two (the copies and the changed rows).
COPY_BY_POSITION_CONF = "spark.delta_merge.copyByPosition.minFileBytes"
_DEFAULT_MIN_FILE_BYTES = 32 << 20
_T = TypeVar("_T")
_TASK_SCHEMA = StructType([
    StructField("path", StringType(), False), StructField("dropped", BinaryType(), False),
    StructField("partition_values", StringType(), False), StructField("base_row_id", LongType()),
    StructField("default_row_commit_version", LongType()),
])  # fmt: skip


def copies_by_position(spark: SparkSession, files: Sequence[LiveFile], constraints: TableConstraints) -> bool:
    """Whether copy-on-write rewriting ``files`` copies their unchanged rows by position: they hold at
    least :data:`COPY_BY_POSITION_CONF` bytes (a size such as ``32m``; ``-1`` never), and no CHECK
    constraint or generated column needs checking on them (Delta checks copied rows too, and a
    constraint may have been set without checking the rows already there)."""
    if constraints.checks or constraints.generated:
        return False
    minimum = size_conf(spark, COPY_BY_POSITION_CONF, _DEFAULT_MIN_FILE_BYTES, never="never copy by position")
    return minimum >= 0 and sum(f.size for f in files) >= minimum


@dataclass(frozen=True)
class CopiedRows:
    """The files the copies were written to, and how many rows they hold."""

    files: tuple[WrittenFile, ...]
    rows: int


@dataclass(frozen=True)
class _CopyPlan:
    scan: FileScan
    write: WriteTaskPlan
    # Row tracking's materialized row id and commit version end the rows read.
    tracked: bool
    # materializePartitionColumns: the file's partition values follow, as columns.
    materialized_partitions: bool = False


def copy_unchanged_rows(
    spark: SparkSession, snapshot: TargetSnapshot, files: Sequence[LiveFile], changed: Mapping[str, BitMap64],
    *, schema: StructType, hidden_columns: Sequence[str], target_file_size: int, num_indexed_cols: int,
) -> CopiedRows:
    """Write the rows of ``files`` that ``changed`` (file key -> physical row indexes) does not hold, in
    one Spark job of a few files per task.

    :param schema: the table's schema after the merge: its columns a file lacks are written as NULL.
    :param hidden_columns: row tracking's materialized row id and commit version columns, or none: each
        copied row keeps its stable row id and commit version in them.
    :raises MergeExecutionError: a copy failed; nothing is committed (files written are orphans).
    """
    partition_columns = list(snapshot.partition_columns)
    write_schema = StructType(schema.fields + [StructField(c, LongType()) for c in hidden_columns])
    materialized = materializes_partition_columns(snapshot) and bool(partition_columns)
    write = data_file_plan(
        table_root=snapshot.table_uri, schema=write_schema, partition_columns=partition_columns,
        hidden_columns=hidden_columns, target_file_size=target_file_size, num_indexed_cols=num_indexed_cols,
        column_mapping_mode=snapshot.column_mapping_mode, storage_options=snapshot.storage_options,
        materialize_partition_columns=materialized,
    )
    data_fields = [f for f in schema.fields if f.name not in partition_columns]
    read_schema = physical_read_schema(StructType(data_fields), snapshot.column_mapping_mode)
    read_schema = StructType(read_schema.fields + [StructField(c, LongType()) for c in hidden_columns])
    plan = _CopyPlan(
        scan=file_scan(snapshot.table_uri, read_schema, storage_options=snapshot.storage_options),
        write=write, tracked=bool(hidden_columns), materialized_partitions=materialized,
    )
    store = snapshot.log_store if any(
        f.deletion_vector is not None for f in files) else None  # fmt: skip
    tasks = []
    for f in files:
        dropped = BitMap64(changed.get(snapshot.file_key(f), BitMap64()))
        if f.deletion_vector is not None and store is not None:
            dropped.update(deleted_rows(store, snapshot.table_uri, f.deletion_vector,
                                        storage_options=snapshot.storage_options))  # fmt: skip
        values = {c: f.partition_values.get(c) for c in write.partition_columns}
        tasks.append((_store_path(snapshot.file_uri(f)), dropped.serialize(), json.dumps(values),
                      f.base_row_id, f.default_row_commit_version))  # fmt: skip
    if not tasks:
        return CopiedRows((), 0)
    # A few files per task, balanced by size: a task's start costs about as much as copying a small file.
    slices = min(len(tasks), 2 * default_parallelism(spark))
    groups = _balanced([(f.size, task) for f, task in zip(files, tasks, strict=True)], slices)
    frame = spread_tasks(spark, groups, _TASK_SCHEMA)
    try:
        results = frame.mapInArrow(functools.partial(_copy_task, plan), RESULT_SCHEMA).collect()
    except Exception as exc:
        violation = task_violation(exc)
        if violation is not None:
            # A copied row with NULL in a NOT NULL column (the only check a copy gets here).
            raise ConstraintViolationError.from_text(f"{violation}\nNothing was committed.") from exc
        orphans = (f"files already written under {snapshot.table_uri} are not in the Delta log; "
                   "VACUUM removes them")  # fmt: skip
        failure = spark_failure(exc)
        if failure is not None:
            message = f"{failure.bare_message} ({orphans}.)"
            raise type(failure)(message, error_class=failure.error_class) from exc
        raise MergeExecutionError(
            f"Copying the unchanged rows of {len(tasks)} touched files failed; nothing was committed "
            f"({orphans}). Cause: {failure_summary(exc)}"
        ) from exc
    written = sorted((written_file(r.asDict()) for r in results if r["kind"] == "file"), key=lambda f: f.path)
    copied = sum(int(r["count"]) for r in results if r["kind"] == "count")
    return CopiedRows(tuple(written), copied)


def _balanced(sized: Sequence[tuple[int, _T]], count: int) -> list[list[_T]]:
    """``sized`` items in ``count`` groups of about equal total size (largest first, each to the lightest
    group)."""
    groups: list[list[_T]] = [[] for _ in range(count)]
    totals = [0] * count
    for size, item in sorted(sized, key=lambda pair: -pair[0]):
        lightest = totals.index(min(totals))
        groups[lightest].append(item)
        totals[lightest] += size
    return [g for g in groups if g]


def _store_path(uri: str) -> str:
    """The path of a file URI in the pyarrow file system of its table root."""
    if uri[:5].lower() == "file:":
        # file:/path and file:///path alike; the path is decoded already, so not parsed as a URL.
        rest = uri[5:]
        return rest[2:] if rest.startswith("//") else rest
    return arrow_file_path(uri) if "://" in uri else uri


def _copy_task(plan: _CopyPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs on executors: copy each listed file's rows but the dropped ones; report files and the count."""
    from pyspark import TaskContext

    context = TaskContext.get()
    writer = TaskWriter(plan.write, context.partitionId() if context is not None else 0)
    fs, _ = arrow_filesystem(plan.scan.root, plan.scan.storage_options)
    copied = 0
    try:
        for batch in batches:
            for task in batch.to_pylist():
                bitmap = BitMap64.deserialize(task["dropped"])
                dropped = np.fromiter(bitmap, dtype=np.int64, count=len(bitmap))
                values = json.loads(task["partition_values"])
                for rows in read_file(plan.scan, fs, task["path"], "", dropped):
                    writer.write_partition(values, _written_rows(plan, rows, task))
                    copied += rows.num_rows
        results = writer.close()
    except BaseException:
        writer.abort()
        raise
    results.append({"kind": "count", "code": int(Action.COPY), "count": copied})
    yield pa.RecordBatch.from_pylist(results, schema=RESULT_ARROW_SCHEMA)


def _written_rows(plan: _CopyPlan, rows: pa.RecordBatch, task: Mapping[str, object]) -> pa.RecordBatch:
    """The read rows as the data files hold them; with row tracking, each row's stable id and commit
    version (the materialized value, else its file's default) materialized."""
    schema = plan.write.data_schema
    keys = plan.write.partition_columns if plan.materialized_partitions else ()
    width = len(schema) - len(keys)
    columns = list(rows.columns[:width])
    if plan.tracked:
        index = rows.column(width)  # read_file's row index follows the requested columns
        base, version = task["base_row_id"], task["default_row_commit_version"]
        columns[-2] = pc.coalesce(columns[-2], pc.add(index, pa.scalar(base, pa.int64())))
        columns[-1] = pc.coalesce(columns[-1], pa.scalar(version, pa.int64()))
    if keys:
        values = json.loads(str(task["partition_values"]))
        for key, spark_type in zip(keys, plan.write.partition_types, strict=True):
            value = pa.scalar(parse_partition_value(values.get(key), spark_type), schema.field(key).type)
            columns.append(pa.repeat(value, rows.num_rows))
    return conform_batch(pa.RecordBatch.from_arrays(columns, names=schema.names), schema)
