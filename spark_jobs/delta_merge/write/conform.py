"""Arrow batches made to fit the table's schema exactly: types, nullability and nested fields, checked."""

from __future__ import annotations

import json
from typing import NoReturn

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.delta_merge.errors import ConstraintViolationError
from spark_jobs.delta_merge.write.task_plan import VIOLATION_MARKER

__all__ = ["conform_batch"]

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
