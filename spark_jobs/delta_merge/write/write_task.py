"""Executor side of the write stage: Spark's Arrow batches -> Parquet files with Delta statistics."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64
from pyspark.sql.types import DataType

from spark_jobs.delta_merge.errors import ConstraintViolationError, MergeExecutionError
from spark_jobs.delta_merge.protocol.file_stats import FileStatsCollector, StatsLeaf
from spark_jobs.delta_merge.protocol.partition_values import (
    encode_add_path,
    partition_directory,
    serialize_partition_value,
)
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem

__all__ = [
    "CHANGE_DATA_DIR",
    "CHANGE_TYPE_COLUMN",
    "COMPRESSION",
    "RESULT_ARROW_SCHEMA",
    "RESULT_SCHEMA",
    "VIOLATION_MARKER",
    "TaskWriter",
    "WriteTaskPlan",
    "conform_batch",
    "write_empty_file",
    "write_task",
]

COMPRESSION = "zstd"
_MAX_ROW_GROUP_BYTES = 64 << 20  # Arrow (uncompressed) bytes per row group, at most
_MIN_ROW_GROUP_BYTES = 16 << 10
_TASK_BUFFER_BYTES = 256 << 20  # all partitions' buffered rows in one task, at most
RESULT_ARROW_SCHEMA = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("size", pa.int64()), ("num_records", pa.int64()),
    ("modification_time", pa.int64()), ("partition_values", pa.string()), ("stats", pa.string()),
    ("code", pa.int64()), ("count", pa.int64()), ("marks", pa.binary()),
])
# One row per written data file (kind "file"), per change data file (kind "cdc"), per action code a
# task saw (kind "count") and per target file some of whose rows a task marked (kind "marks": the file's
# key in ``path``, the rows' indexes as a serialized 64-bit roaring bitmap in ``marks``).
_DDL_TYPES = {pa.string(): "string", pa.int64(): "long", pa.binary(): "binary"}
RESULT_SCHEMA = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in RESULT_ARROW_SCHEMA)
_ROW_INDEX = "__delta_merge_row"
# A task reports a constraint violation as this marker and the message as one JSON string: Spark hands
# the driver only the text of a task's error, and the message has several lines.
VIOLATION_MARKER = "DELTA_MERGE_CONSTRAINT_VIOLATION:"
# PROTOCOL.md "Change Data Files": under _change_data/, partitioned like the table, with _change_type.
CHANGE_DATA_DIR = "_change_data"
CHANGE_TYPE_COLUMN = "_change_type"


@dataclass(frozen=True)
class WriteTaskPlan:
    """Everything a write task needs; pickled into the closure of every task.

    :param root: absolute local path or URI of the table root.
    :param input_schema: Arrow schema of the table columns in the batches (after the action code).
    :param data_schema: the files' schema: ``input_schema`` without partition columns.
    :param check_violations: the batches carry a violation column after the action code: a task
        fails on its first non-NULL value, before writing that batch.
    :param change_types: change data feed: the ``_change_type`` of the written row, by action code.
    :param preimage_change_types: the ``_change_type`` of the preimage, by action code; the preimage
        columns (``input_schema``'s, in its order) follow the action code and violation columns.
    :param file_kind: ``file`` for data files, ``cdc`` for change data files (``cdc-`` names).
    :param hidden_count: the last this many columns of ``input_schema`` are written to data files but
        are no table columns (row tracking's materialized columns): change data files leave them out.
    :param storage_options: how to reach the table's store (keys and endpoint for object stores); kept
        out of ``repr`` so no log or error message carries a secret.
    :param mark_codes: rows of these action codes are not written but marked: their target file's key and
        physical row index (the last two columns of the batches) are reported, for deletion vectors.
    """

    root: str
    input_schema: pa.Schema
    data_schema: pa.Schema
    partition_columns: tuple[str, ...]
    partition_types: tuple[DataType, ...]
    leaves: tuple[StatsLeaf, ...]
    drop_codes: tuple[int, ...]
    target_file_size: int
    compression: str = COMPRESSION
    check_violations: bool = False
    change_types: tuple[tuple[int, str], ...] = ()
    preimage_change_types: tuple[tuple[int, str], ...] = ()
    file_kind: str = "file"
    hidden_count: int = 0
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    mark_codes: tuple[int, ...] = ()

    @property
    def table_width(self) -> int:
        """How many leading columns of ``input_schema`` are the table's."""
        return len(self.input_schema) - self.hidden_count

    @property
    def writes_change_data(self) -> bool:
        return bool(self.change_types or self.preimage_change_types)

    def change_data_plan(self) -> WriteTaskPlan:
        """The plan of the change data files: the data files' layout plus ``_change_type``, no stats."""
        change_type = pa.field(CHANGE_TYPE_COLUMN, pa.string())
        hidden = set(self.input_schema.names[self.table_width :])
        table_columns = pa.schema(list(self.input_schema)[: self.table_width])
        return replace(
            self, input_schema=table_columns.append(change_type),
            data_schema=pa.schema([f for f in self.data_schema if f.name not in hidden]).append(change_type),
            leaves=(), drop_codes=(), change_types=(), preimage_change_types=(), file_kind="cdc",
            hidden_count=0, mark_codes=(),
        )


def write_task(plan: WriteTaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs on executors: count, drop, split by partition, write; then report files and counts."""
    from pyspark import TaskContext

    context = TaskContext.get()
    task_id = context.partitionId() if context is not None else 0
    writer = TaskWriter(plan, task_id)
    changes = TaskWriter(plan.change_data_plan(), task_id) if plan.writes_change_data else None
    counts: Counter[int] = Counter()
    marks: dict[str, BitMap64] = {}
    width = len(plan.input_schema)
    try:
        for batch in batches:
            codes = batch.column(width)
            if codes.null_count:
                raise MergeExecutionError(f"{codes.null_count} merge output rows carry no action code")
            if plan.check_violations:
                _raise_violation(batch.column(width + 1))
            for entry in pc.value_counts(codes).to_pylist():
                counts[int(entry["values"])] += int(entry["counts"])
            data = batch.select(list(range(width)))
            if plan.drop_codes:
                dropped = pc.is_in(codes, value_set=pa.array(plan.drop_codes, codes.type))
                data = data.filter(pc.invert(dropped))
            if changes is not None:
                _write_changes(changes, plan, batch, codes)
            if plan.mark_codes:
                _mark(marks, batch, codes, plan.mark_codes)
            if data.num_rows:
                writer.write(conform_batch(data, plan.input_schema))
        rows = writer.close() + (changes.close() if changes is not None else [])
    except BaseException:
        writer.abort()
        if changes is not None:
            changes.abort()
        raise
    rows += [{"kind": "count", "code": code, "count": n} for code, n in sorted(counts.items())]
    rows += [{"kind": "marks", "path": key, "marks": bitmap.serialize()}
             for key, bitmap in sorted(marks.items())]  # fmt: skip
    yield pa.RecordBatch.from_pylist(rows, schema=RESULT_ARROW_SCHEMA)


def _mark(
    marks: dict[str, BitMap64], batch: pa.RecordBatch, codes: pa.Array, mark_codes: tuple[int, ...]
) -> None:
    """Add the batch's rows of ``mark_codes`` to their file's bitmap (file key and row index: the
    batch's last two columns)."""
    marked = pc.is_in(codes, value_set=pa.array(mark_codes, codes.type))
    if not pc.any(marked).as_py():
        return
    keys = batch.column(batch.num_columns - 2).filter(marked)
    indexes = batch.column(batch.num_columns - 1).filter(marked)
    if keys.null_count or indexes.null_count:
        raise MergeExecutionError("a merge output row to mark in a deletion vector has no target file or row")
    encoded = pc.dictionary_encode(keys)
    for position, key in enumerate(encoded.dictionary.to_pylist()):
        rows = indexes.filter(pc.equal(encoded.indices, position)).to_numpy(zero_copy_only=False)
        marks.setdefault(key, BitMap64()).update(rows.astype(np.uint64))


def write_empty_file(plan: WriteTaskPlan, partition_values: dict[str, str | None]) -> dict[str, Any]:
    """Runs on the driver: one file of ``plan``'s kind without rows, as a result row of :func:`write_task`."""
    return TaskWriter(plan, 0).write_empty(partition_values)[0]


def _write_changes(
    changes: TaskWriter, plan: WriteTaskPlan, batch: pa.RecordBatch, codes: pa.Array
) -> None:
    """The batch's change rows: preimages (update_preimage, delete), then written rows (insert,
    update_postimage); copied rows give none. Preimages are of the table columns only."""
    width = len(plan.input_schema)
    table_width = plan.table_width
    table_columns = pa.schema(list(plan.input_schema)[:table_width])
    first_preimage = width + 1 + int(plan.check_violations)
    change_schema = changes.schema
    for columns, types in (
        (list(range(first_preimage, first_preimage + table_width)), plan.preimage_change_types),
        (list(range(table_width)), plan.change_types),
    ):
        for code, change_type in types:
            rows = batch.select(columns).filter(pc.equal(codes, pa.scalar(code, codes.type)))
            if not rows.num_rows:
                continue
            conformed = conform_batch(rows, table_columns)
            kind = pa.array([change_type] * rows.num_rows, pa.string())
            changes.write(pa.RecordBatch.from_arrays([*conformed.columns, kind], schema=change_schema))


def _raise_violation(violations: pa.Array) -> None:
    if violations.null_count == len(violations):
        return
    first = violations.drop_null()[0].as_py()
    raise ConstraintViolationError(VIOLATION_MARKER + json.dumps(str(first)))


def conform_batch(data: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``data`` with exactly ``schema``'s types: UTC timestamps (Spark hands the session time zone),
    plain strings, the table's nullability and field names. NULL in a NOT NULL field is an error."""
    columns = []
    for column, target in zip(data.columns, schema, strict=True):
        if not target.nullable and column.null_count:
            _raise_null((target.name,), f"{column.null_count} row(s)")
        columns.append(_conform_array(column, target.type, None, (target.name,)))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _raise_null(path: tuple[str, ...], rows: str) -> NoReturn:
    # As a violation the write stage reports in Delta's words; the constraint rules catch these first.
    message = (f"[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column: "
               f"{'.'.join(path)}. The merge produced NULL in {rows}.")
    raise ConstraintViolationError(VIOLATION_MARKER + json.dumps(message))


def _conform_array(
    array: pa.Array, target: pa.DataType, live: pa.Array | None, path: tuple[str, ...]
) -> pa.Array:
    """``array`` as ``target``; ``live`` marks the rows whose ancestors are all non-NULL (None: all).

    Not Array.cast for nested types: it (and the Parquet writer) refuses a NOT NULL field whose
    child array holds nulls under NULL parents, which is how Spark's Arrow batches look. Those
    nulls are dropped from the child's validity (the parent hides them); any other is an error.
    """
    if pa.types.is_struct(target):
        valid = pc.is_valid(array) if live is None else pc.and_(live, pc.is_valid(array))
        children = []
        for i, child_field in enumerate(target):
            child = array.field(i)
            if not child_field.nullable and child.null_count:
                if pc.any(pc.and_(pc.is_null(child), valid)).as_py():
                    _raise_null((*path, child_field.name), "rows whose parent is not NULL")
                child = _without_nulls(child)
            children.append(_conform_array(child, child_field.type, valid, (*path, child_field.name)))
        mask = pc.is_null(array) if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if array.type == target and not _has_struct(target):
        return array
    if pa.types.is_map(target) or pa.types.is_list(target):
        array = pa.concat_arrays([array]) if array.offset else array  # from_arrays wants unsliced offsets
        mask = pc.is_null(array) if array.null_count else None
        if pa.types.is_map(target):
            keys = _conform_array(array.keys, target.key_type, None, (*path, "key"))
            items = _conform_array(array.items, target.item_type, None, (*path, "value"))
            return pa.MapArray.from_arrays(array.offsets, keys, items, type=target, mask=mask)
        values = _conform_array(array.values, target.value_type, None, (*path, "element"))
        return pa.ListArray.from_arrays(array.offsets, values, type=target, mask=mask)
    return array.cast(target)


def _without_nulls(array: pa.Array) -> pa.Array:
    """``array`` with every slot valid (the values under its nulls are whatever Spark left there)."""
    if pa.types.is_struct(array.type):
        return pa.StructArray.from_arrays([array.field(i) for i in range(array.type.num_fields)],
                                          fields=list(array.type))
    if pa.types.is_map(array.type) or pa.types.is_list(array.type):
        array = pa.concat_arrays([array]) if array.offset else array
        if pa.types.is_map(array.type):
            return pa.MapArray.from_arrays(array.offsets, array.keys, array.items, type=array.type)
        return pa.ListArray.from_arrays(array.offsets, array.values, type=array.type)
    return pa.Array.from_buffers(array.type, len(array), [None, *array.buffers()[1:]], 0, array.offset)


def _has_struct(arrow_type: pa.DataType) -> bool:
    if pa.types.is_struct(arrow_type):
        return True
    if pa.types.is_map(arrow_type):
        return _has_struct(arrow_type.key_type) or _has_struct(arrow_type.item_type)
    return pa.types.is_list(arrow_type) and _has_struct(arrow_type.value_type)


class TaskWriter:
    """The files one task has open, one per partition value, rolled over at the target size."""

    def __init__(self, plan: WriteTaskPlan, task_id: int) -> None:
        self._plan = plan
        self._task_id = task_id
        self._fs, self._base = arrow_filesystem(plan.root, plan.storage_options)
        self._row_group_bytes = min(_MAX_ROW_GROUP_BYTES, max(_MIN_ROW_GROUP_BYTES, plan.target_file_size))
        self._open: dict[tuple[str | None, ...], _OpenFile] = {}
        self._buffered = 0
        self._created: list[str] = []
        self._directories: set[str] = set()
        self._results: list[dict[str, Any]] = []
        self._statistics = _footer_statistics_columns(plan.data_schema)

    @property
    def schema(self) -> pa.Schema:
        """The rows :meth:`write` takes: partition columns included."""
        return self._plan.input_schema

    def write(self, data: pa.RecordBatch) -> None:
        for values, part in _split_by_partition(data, self._plan):
            self.write_partition(values, part.select(self._plan.data_schema.names))

    def write_partition(self, values: dict[str, str | None], rows: pa.RecordBatch) -> None:
        """Write ``rows`` (``data_schema``'s columns) in the partition of serialized ``values``."""
        key = tuple(values.values())
        target = self._open.get(key)
        if target is None:
            directory = partition_directory(self._plan.partition_columns, values)
            target = self._open[key] = _OpenFile(values, directory)
        size = rows.nbytes
        target.buffers.append(rows)
        target.buffered += size
        self._buffered += size
        if target.buffered >= self._row_group_bytes:
            self._flush(target)
        while self._buffered > _TASK_BUFFER_BYTES:
            largest = max(self._open.values(), key=lambda f: f.buffered)
            if not largest.buffered:
                break
            self._flush(largest)

    def write_empty(self, values: dict[str, str | None]) -> list[dict[str, Any]]:
        """Write one file without rows in the partition of serialized ``values``; report it."""
        target = _OpenFile(values, partition_directory(self._plan.partition_columns, values))
        self._start(target)
        self._finish(target)
        return self._results

    def close(self) -> list[dict[str, Any]]:
        for target in self._open.values():
            self._flush(target)
            if target.writer is not None:
                self._finish(target)
        return self._results

    def abort(self) -> None:
        """Best effort: close and delete this attempt's files so a failed task leaves less behind."""
        for target in self._open.values():
            for closable in (target.writer, target.stream):
                with contextlib.suppress(Exception):  # cleanup must not mask the task's error
                    if closable is not None:
                        closable.close()
        for path in self._created:
            with contextlib.suppress(Exception):
                self._fs.delete_file(path)

    def _flush(self, target: _OpenFile) -> None:
        if not target.buffers:
            return
        table = pa.Table.from_batches(target.buffers, schema=self._plan.data_schema)
        self._buffered -= target.buffered
        target.buffers, target.buffered = [], 0
        step = max(1, int(table.num_rows * self._row_group_bytes / max(table.nbytes, 1)))
        for offset in range(0, table.num_rows, step):
            piece = table.slice(offset, step)
            if target.writer is None:
                self._start(target)
            writer, stream, stats = _opened(target)
            writer.write_table(piece, row_group_size=piece.num_rows)
            stats.update(piece)
            if stream.tell() >= self._plan.target_file_size:
                self._finish(target)

    def _start(self, target: _OpenFile) -> None:
        prefix = "cdc" if self._plan.file_kind == "cdc" else "part"
        name = f"{prefix}-{self._task_id:05d}-{uuid.uuid4()}-c000.{self._plan.compression}.parquet"
        parent = "/".join(p for p in (
            CHANGE_DATA_DIR if self._plan.file_kind == "cdc" else "", target.directory) if p)
        target.relative_path = f"{parent}/{name}" if parent else name
        full_path = f"{self._base}/{target.relative_path}"
        directory = full_path.rsplit("/", 1)[0]
        if self._fs.type_name == "local" and directory not in self._directories:
            self._fs.create_dir(directory, recursive=True)  # object stores need no directories
            self._directories.add(directory)
        self._created.append(full_path)
        # compression=None: the default "detect" would look at the file name's extension.
        target.stream = self._fs.open_output_stream(full_path, compression=None)
        target.writer = pq.ParquetWriter(
            target.stream, self._plan.data_schema, compression=self._plan.compression,
            coerce_timestamps="us", allow_truncated_timestamps=False, write_statistics=self._statistics,
        )
        target.stats = FileStatsCollector(self._plan.leaves)

    def _finish(self, target: _OpenFile) -> None:
        writer, stream, stats = _opened(target)
        writer.close()  # writes the footer; the stream stays open, so tell() is the file size
        size = stream.tell()
        stream.close()
        # Size and time from the stream, not a stat: on object stores that is a request per file.
        self._results.append({
            "kind": self._plan.file_kind, "path": encode_add_path(target.relative_path), "size": size,
            "num_records": stats.num_records, "modification_time": int(time.time() * 1000),
            "partition_values": json.dumps(target.values), "stats": stats.to_json(),
        })
        target.writer = target.stream = target.stats = None


@dataclass
class _OpenFile:
    values: dict[str, str | None]
    directory: str
    buffers: list[pa.RecordBatch] = field(default_factory=list)
    buffered: int = 0
    relative_path: str = ""
    writer: pq.ParquetWriter | None = None
    stream: pa.NativeFile | None = None
    stats: FileStatsCollector | None = None


def _footer_statistics_columns(schema: pa.Schema) -> list[str]:
    """Parquet leaf columns that get footer min/max: all but FLOAT/DOUBLE.

    Parquet writers leave NaN out of float min/max, while readers such as DataFusion (delta-rs)
    order NaN above every number: a row group of NaNs and 0.5 would be skipped for ``f > 0.9``.
    """
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    parquet_schema = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    leaves = (parquet_schema.column(i) for i in range(len(parquet_schema)))
    return [c.path for c in leaves if c.physical_type not in ("FLOAT", "DOUBLE")]


def _opened(target: _OpenFile) -> tuple[pq.ParquetWriter, pa.NativeFile, FileStatsCollector]:
    if target.writer is None or target.stream is None or target.stats is None:
        raise RuntimeError("internal: the file is not open")
    return target.writer, target.stream, target.stats


def _split_by_partition(
    data: pa.RecordBatch, plan: WriteTaskPlan,
) -> Iterator[tuple[dict[str, str | None], pa.RecordBatch]]:
    """(serialized partition values, rows) groups of ``data``: one hash pass, no per-row Python."""
    columns = plan.partition_columns
    if not columns:
        yield {}, data
        return
    keys = pa.Table.from_batches([data.select(list(columns))])
    keys = keys.append_column(_ROW_INDEX, pa.array(np.arange(data.num_rows, dtype=np.int64)))
    groups = keys.group_by(list(columns), use_threads=False).aggregate([(_ROW_INDEX, "list")])
    texts = [[serialize_partition_value(v, t) for v in groups.column(c).to_pylist()]
             for c, t in zip(columns, plan.partition_types, strict=True)]
    if groups.num_rows == 1:
        yield dict(zip(columns, (t[0] for t in texts), strict=True)), data
        return
    rows = groups.column(f"{_ROW_INDEX}_list").combine_chunks()
    offsets = rows.offsets.to_pylist()
    for i in range(groups.num_rows):
        values = dict(zip(columns, (t[i] for t in texts), strict=True))
        # A take per group, not slices of one sorted copy: a buffered slice would keep its whole
        # batch alive, and the task's buffer limit would count only the slice.
        yield values, data.take(rows.values.slice(offsets[i], offsets[i + 1] - offsets[i]))
