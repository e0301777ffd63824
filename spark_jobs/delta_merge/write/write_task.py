"""Executor side of the write stage: Spark's Arrow batches -> Parquet files with Delta statistics."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from spark_jobs.delta_merge.errors import ConstraintViolationError, MergeExecutionError
from spark_jobs.delta_merge.write.conform import conform_batch
from spark_jobs.delta_merge.write.task_plan import VIOLATION_MARKER, WriteTaskPlan
from spark_jobs.delta_merge.write.task_writer import TaskWriter

__all__ = ["RESULT_ARROW_SCHEMA", "RESULT_SCHEMA", "write_empty_file", "write_task"]

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
