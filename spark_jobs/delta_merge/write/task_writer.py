"""The files one write task has open, one per partition value, rolled over at the target file size."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.delta_merge.protocol.file_stats import FileStatsCollector
from spark_jobs.delta_merge.protocol.partition_values import (
    encode_add_path,
    partition_directory,
    serialize_partition_value,
)
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem
from spark_jobs.delta_merge.write.task_plan import CHANGE_DATA_DIR, WriteTaskPlan

__all__ = ["TaskWriter"]

_MAX_ROW_GROUP_BYTES = 64 << 20  # Arrow (uncompressed) bytes per row group, at most

_MIN_ROW_GROUP_BYTES = 16 << 10

_TASK_BUFFER_BYTES = 256 << 20  # all partitions' buffered rows in one task, at most

_ROW_INDEX = "__delta_merge_row"

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
