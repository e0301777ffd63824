"""Read Parquet files on object stores in Spark tasks with pyarrow, one file per task.

pip's pyspark has no Hadoop S3 connector, so Spark's own Parquet reader cannot open ``s3://``. This
reader gives the rows Spark's reader would (columns by the name or field id of the requested schema,
missing columns as NULL), through the pyarrow file system the storage options describe.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, DataType, LongType, MapType, StringType, StructField, StructType

from spark_jobs.delta_merge.protocol.column_mapping import ARROW_FIELD_ID_KEY
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem
from spark_jobs.delta_merge.task_frames import spread_tasks

__all__ = [
    "FILE_PATH", "ROW_INDEX", "ArrowScanFile", "FileScan", "file_scan", "is_object_store", "read_file",
    "read_parquet_files",
]

# The columns a scan adds after the requested ones.
FILE_PATH = "__merge_file"
ROW_INDEX = "__merge_row_index"
# Spark's Parquet reader matches a requested field by this id in column mapping's id mode.
_SPARK_FIELD_ID_KEY = "parquet.field.id"
_TASK_SCHEMA = StructType([
    StructField("index", LongType(), False), StructField("path", StringType(), False),
    StructField("key", StringType(), False), StructField("deleted", ArrayType(LongType(), False), False),
])  # fmt: skip


@dataclass(frozen=True)
class ArrowScanFile:
    """One file to read.

    :param path: the file's path in the table root's file system (``bucket/key`` on S3), decoded.
    :param key: the string reported in :data:`FILE_PATH` for its rows.
    :param deleted_rows: physical row indexes to leave out (a deletion vector's rows).
    """

    path: str
    key: str
    deleted_rows: Sequence[int] = ()


@dataclass(frozen=True)
class FileScan:
    """How to read files as ``read_schema`` (see :func:`read_parquet_files`): ``output`` is the Arrow
    schema of the batches :func:`read_file` yields, ``root`` picks the file system."""

    root: str
    read_schema: StructType
    output: pa.Schema
    storage_options: Mapping[str, str] = field(repr=False, compare=False)


# Object stores, which pip's pyspark has no Hadoop connector for; HDFS and local paths stay with Spark.
_OBJECT_STORE_SCHEMES = frozenset(
    {"s3", "s3a", "s3n", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl", "wasb", "wasbs"}
)


def is_object_store(uri: str) -> bool:
    """Whether ``uri`` names an object store (S3, GCS, Azure), read here without Spark's readers."""
    scheme, sep, _ = uri.partition("://")
    return bool(sep) and scheme.lower() in _OBJECT_STORE_SCHEMES


def read_parquet_files(
    spark: SparkSession,
    root: str,
    files: Sequence[ArrowScanFile],
    read_schema: StructType,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The rows of ``files`` as ``read_schema`` (all nullable), then :data:`ROW_INDEX` (the row's index
    in its file) and :data:`FILE_PATH` (the file's ``key``), deleted rows left out.

    A field of ``read_schema`` with a ``parquet.field.id`` (column mapping's id mode) is matched by that
    id, as Spark does with ``spark.sql.parquet.fieldId.read.enabled``; other fields by name.

    :param root: the table root (or any URI on the files' store) that picks the file system.
    """
    plan = file_scan(root, read_schema, storage_options=storage_options)
    out_fields = [StructField(f.name, _nullable(f.dataType), True) for f in read_schema.fields]
    out_fields += [StructField(ROW_INDEX, LongType()), StructField(FILE_PATH, StringType())]
    out_schema = StructType(out_fields)
    rows = [(i, f.path, f.key, [int(r) for r in f.deleted_rows]) for i, f in enumerate(files)]
    # One slice per file: each task reads one file, and a large table spreads over the executors.
    tasks = spread_tasks(spark, [[row] for row in rows], _TASK_SCHEMA)
    # mapInArrow looks output columns up by bare name, so a dotted name would read as a struct field.
    positional = StructType([StructField(f"_c{i}", f.dataType, True) for i, f in enumerate(out_fields)])
    return tasks.mapInArrow(functools.partial(_read_task, plan), positional).toDF(*out_schema.names)


def file_scan(
    root: str, read_schema: StructType, *, storage_options: Mapping[str, str] | None = None
) -> FileScan:
    """The plan of reading files of ``root``'s store as ``read_schema`` with :func:`read_file`."""
    from spark_jobs.delta_merge.protocol.delta_schema import arrow_schema

    out_fields = [StructField(f.name, _nullable(f.dataType), True) for f in read_schema.fields]
    out_fields += [StructField(ROW_INDEX, LongType()), StructField(FILE_PATH, StringType())]
    return FileScan(root=root, read_schema=read_schema, output=arrow_schema(StructType(out_fields)),
                    storage_options=dict(storage_options or {}))  # fmt: skip


def _read_task(plan: FileScan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs on executors: read each listed file batch by batch."""
    fs, _ = arrow_filesystem(plan.root, plan.storage_options)
    for batch in batches:
        for task in batch.to_pylist():
            yield from read_file(plan, fs, task["path"], task["key"], task["deleted"])


def read_file(
    plan: FileScan, fs: Any, path: str, key: str, deleted: Sequence[int] | np.ndarray
) -> Iterator[pa.RecordBatch]:
    """The rows of one file as ``plan.output`` (``read_schema``'s columns, then the row's index in the
    file and ``key``), batch by batch, the ``deleted`` row indexes left out."""
    parquet = pq.ParquetFile(path, filesystem=fs)
    file_schema = parquet.schema_arrow
    sources = [_file_field(file_schema, f) for f in plan.read_schema.fields]
    wanted = sorted({file_schema.get_field_index(s.name) for s in sources if s is not None})
    dropped = np.sort(np.asarray(deleted, dtype=np.int64))
    offset = 0
    names = [file_schema.field(i).name for i in wanted]
    # A file none of whose columns are requested still has rows (e.g. a table of partition columns only).
    batches = parquet.iter_batches(columns=names) if names else _row_counts(parquet)
    for data in batches:
        count, start = data.num_rows, offset
        index = np.arange(start, start + count, dtype=np.int64)
        offset += count
        columns = [
            _conformed(data.column(s.name) if s is not None else None, target, count, out.type)
            for s, target, out in zip(sources, plan.read_schema.fields, plan.output, strict=False)
        ]
        columns += [pa.array(index), pa.repeat(pa.scalar(key, pa.string()), count)]
        out = pa.RecordBatch.from_arrays(columns, names=[f"_c{i}" for i in range(len(columns))])
        # The sorted deleted rows of this batch, by position: no set lookup per row.
        first, last = np.searchsorted(dropped, [start, start + count])
        if last > first:
            keep = np.ones(count, dtype=bool)
            keep[dropped[first:last] - start] = False
            out = out.filter(pa.array(keep))
        if out.num_rows:
            yield out


def _row_counts(parquet: pq.ParquetFile) -> Iterator[pa.RecordBatch]:
    for group in range(parquet.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        yield pa.RecordBatch.from_pydict({"_": pa.nulls(rows)})


def _file_field(file_fields: Any, wanted: StructField) -> pa.Field | None:
    """The file's field for ``wanted``: by field id when it has one, else by name."""
    fields = list(file_fields)
    if _SPARK_FIELD_ID_KEY in wanted.metadata:
        wanted_id = str(int(wanted.metadata[_SPARK_FIELD_ID_KEY])).encode()
        return next((f for f in fields if (f.metadata or {}).get(ARROW_FIELD_ID_KEY) == wanted_id), None)
    return next((f for f in fields if f.name == wanted.name), None)


def _conformed(
    array: pa.Array | pa.ChunkedArray | None, wanted: StructField, count: int, out: pa.DataType
) -> pa.Array:
    """``array`` in the output type; nested struct fields matched as top-level columns are."""
    if array is None:
        return pa.nulls(count, out)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(wanted.dataType, StructType) and pa.types.is_struct(array.type):
        children = []
        for child, child_out in zip(wanted.dataType.fields, out, strict=True):
            source = _file_field(array.type, child)
            values = array.field(array.type.get_field_index(source.name)) if source is not None else None
            children.append(_conformed(values, child, count, child_out.type))
        return pa.StructArray.from_arrays(children, fields=list(out), mask=pc.is_null(array))
    return array.cast(out) if array.type != out else array


def _nullable(data_type: DataType) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in data_type])
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type
