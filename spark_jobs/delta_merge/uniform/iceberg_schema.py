"""A Delta snapshot's schema, partitioning and files in Iceberg's terms, as Delta's UniForm converter maps
them (its ``IcebergSchemaUtils``, ``IcebergTransactionUtils`` and ``IcebergStatsConverter``).

- Fields keep their logical names and take the column-mapping ids as Iceberg field ids; array elements and
  map keys and values take the ids in ``delta.columnMapping.nested.ids``.
- Types: byte, short and int become Iceberg's int; timestamp becomes ``timestamptz``, timestamp_ntz
  ``timestamp``; the rest keep their names.
- Partition columns become identity partition fields numbered from 1000.
- A file's record count, null counts and bounds come from its Delta statistics, by field id. Two bounds are
  left out: a string maximum that may have been truncated (Delta keeps 32 characters), and the bounds of a
  column whose type was widened. A timestamp's maximum, which Delta truncates to milliseconds, is moved to
  the millisecond's end.

pyiceberg's schema, partition and file classes are used as they are; only the mapping from Delta's is
written here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import types as T

from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.protocol.column_mapping import COLUMN_ID_KEY, NESTED_IDS_KEY, physical_name
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.partition_values import HIVE_DEFAULT_PARTITION, parse_partition_value
from spark_jobs.delta_merge.protocol.type_widening import TYPE_CHANGES

__all__ = ["data_file", "iceberg_partition_spec", "iceberg_schema"]

# Iceberg numbers partition fields from 1000 (PARTITION_DATA_ID_START), as Delta's converter does.
_FIRST_PARTITION_FIELD_ID = 1000
# Delta's default delta.dataSkippingStringPrefixLength: a longer maximum was truncated.
_STRING_PREFIX_LENGTH = 32
_ATOMIC: dict[type[T.DataType], PrimitiveType] = {
    T.ByteType: IntegerType(),
    T.ShortType: IntegerType(),
    T.IntegerType: IntegerType(),
    T.LongType: LongType(),
    T.FloatType: FloatType(),
    T.DoubleType: DoubleType(),
    T.StringType: StringType(),
    T.BinaryType: BinaryType(),
    T.BooleanType: BooleanType(),
    T.DateType: DateType(),
    T.TimestampType: TimestamptzType(),
    T.TimestampNTZType: TimestampType(),
}


def iceberg_schema(schema: T.StructType, *, schema_id: int = 0) -> Schema:
    """The Iceberg schema of a column-mapped Delta schema (ids from ``delta.columnMapping.id``).

    :raises MergeExecutionError: a field without a column-mapping id, or a type Iceberg has no match for.
    """
    return Schema(*(_nested_field(f) for f in schema.fields), schema_id=schema_id)


def iceberg_partition_spec(schema: Schema, partition_columns: tuple[str, ...]) -> PartitionSpec:
    """Identity partitioning on the partition columns, field ids from 1000, each named after its column."""
    fields = [
        PartitionField(
            source_id=schema.find_field(name).field_id,
            field_id=_FIRST_PARTITION_FIELD_ID + i,
            transform=IdentityTransform(),
            name=name,
        )
        for i, name in enumerate(partition_columns)
    ]
    return PartitionSpec(*fields, spec_id=0)


def data_file(
    live_file: LiveFile,
    *,
    file_path: str,
    schema: T.StructType,
    partition_columns: tuple[str, ...],
    mode: str,
) -> DataFile:
    """The Iceberg data file of a Delta ``add``: its absolute path, size, partition values, record count
    and, from its statistics, null counts and bounds by field id."""
    stats = live_file.stats
    by_name = {f.name: f for f in schema.fields}
    partition = Record(
        *(
            _partition_value(
                live_file.partition_values.get(physical_name(by_name[c], mode)), by_name[c].dataType
            )
            for c in partition_columns
        )
    )
    nulls: dict[int, int] = {}
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    if stats is not None:
        data_fields = [f for f in schema.fields if f.name not in partition_columns]
        for field, low, high, null_count in _stat_leaves(
            data_fields, stats.min_values, stats.max_values, stats.null_count, mode
        ):
            field_id = int(field.metadata[COLUMN_ID_KEY])
            if isinstance(null_count, int):
                nulls[field_id] = null_count
            if TYPE_CHANGES in field.metadata:
                continue
            bounds = _bounds(field.dataType, low, high)
            if bounds[0] is not None:
                lower[field_id] = bounds[0]
            if bounds[1] is not None:
                upper[field_id] = bounds[1]
    record_count = stats.num_records if stats is not None and stats.num_records is not None else -1
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=file_path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=record_count,
        file_size_in_bytes=live_file.size,
        null_value_counts=nulls,
        lower_bounds=lower,
        upper_bounds=upper,
    )


def _nested_field(field: T.StructField) -> NestedField:
    if COLUMN_ID_KEY not in field.metadata:
        raise MergeExecutionError(
            f"Column {field.name} has no column mapping id (delta.columnMapping.id), which its Iceberg field "
            "id must be: the IcebergCompatV2 table's schema is invalid."
        )
    nested = field.metadata.get(NESTED_IDS_KEY) or {}
    name = physical_name(field, "name")  # nested ids are keyed by the physical name in either mode
    return NestedField(
        field_id=int(field.metadata[COLUMN_ID_KEY]),
        name=field.name,
        field_type=_iceberg_type(field.dataType, nested, name, field.name),
        required=not field.nullable,
        doc=field.metadata.get("comment"),
    )


def _iceberg_type(data_type: T.DataType, nested: Mapping[str, Any], key: str, column: str) -> IcebergType:
    if isinstance(data_type, T.StructType):
        return StructType(*(_nested_field(f) for f in data_type.fields))
    if isinstance(data_type, T.ArrayType):
        element = f"{key}.element"
        return ListType(
            element_id=_nested_id(nested, element, column),
            element_type=_iceberg_type(data_type.elementType, nested, element, column),
            element_required=not data_type.containsNull,
        )
    if isinstance(data_type, T.MapType):
        map_key, value = f"{key}.key", f"{key}.value"
        return MapType(
            key_id=_nested_id(nested, map_key, column),
            key_type=_iceberg_type(data_type.keyType, nested, map_key, column),
            value_id=_nested_id(nested, value, column),
            value_type=_iceberg_type(data_type.valueType, nested, value, column),
            value_required=not data_type.valueContainsNull,
        )
    if isinstance(data_type, T.DecimalType):
        return DecimalType(data_type.precision, data_type.scale)
    atomic = _ATOMIC.get(type(data_type))
    if atomic is None:
        raise MergeExecutionError(
            f"Column {column} has type {data_type.simpleString()}, which Iceberg has no type for "
            "(IcebergCompatV2 allows byte, short, int, long, float, double, decimal, string, binary, "
            "boolean, timestamp, timestamp_ntz, date, array, map and struct)."
        )
    return atomic


def _nested_id(nested: Mapping[str, Any], key: str, column: str) -> int:
    if key not in nested:
        raise MergeExecutionError(
            f"Column {column} has no id for {key} in {NESTED_IDS_KEY}, which Iceberg needs for array "
            "elements and map keys and values: the IcebergCompatV2 table's schema is invalid."
        )
    return int(nested[key])


def _stat_leaves(
    fields: list[T.StructField], low: Any, high: Any, nulls: Any, mode: str
) -> Iterator[tuple[T.StructField, Any, Any, Any]]:
    """(field, minimum, maximum, null count) of each leaf the statistics may hold (structs walked by
    physical name; arrays and maps have no statistics)."""
    for field in fields:
        key = physical_name(field, mode)
        field_low, field_high, field_nulls = (
            part.get(key) if isinstance(part, Mapping) else None for part in (low, high, nulls)
        )
        if isinstance(field.dataType, T.StructType):
            yield from _stat_leaves(field.dataType.fields, field_low, field_high, field_nulls, mode)
        elif not isinstance(field.dataType, (T.ArrayType, T.MapType)):
            yield field, field_low, field_high, field_nulls


def _bounds(data_type: T.DataType, low: Any, high: Any) -> tuple[bytes | None, bytes | None]:
    iceberg = _ATOMIC.get(type(data_type))
    if isinstance(data_type, T.DecimalType):
        iceberg = DecimalType(data_type.precision, data_type.scale)
    if iceberg is None or isinstance(data_type, T.BinaryType):
        return None, None
    try:
        lower = None if low is None else to_bytes(iceberg, _stat_value(data_type, low, upper=False))
        upper = None if high is None else _upper_bound(data_type, iceberg, high)
    except (TypeError, ValueError, ArithmeticError):
        return None, None  # a bound Delta wrote in another form: left out, as Delta's converter does
    return lower, upper


def _upper_bound(data_type: T.DataType, iceberg: PrimitiveType, high: Any) -> bytes | None:
    if isinstance(data_type, T.StringType) and len(str(high)) >= _STRING_PREFIX_LENGTH:
        return None
    return to_bytes(iceberg, _stat_value(data_type, high, upper=True))


def _stat_value(data_type: T.DataType, value: Any, *, upper: bool) -> Any:
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        micros = _micros(str(value), zoned=isinstance(data_type, T.TimestampType))
        return micros + 999 if upper else micros  # Delta's timestamp statistics are in milliseconds
    if isinstance(data_type, T.DateType):
        return dt.date.fromisoformat(str(value))
    if isinstance(data_type, T.DecimalType):
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-data_type.scale))
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return float(value)
    if isinstance(data_type, T.BooleanType):
        if not isinstance(value, bool):
            raise TypeError(value)
        return value
    if isinstance(data_type, T.StringType):
        return str(value)
    return int(value)


def _micros(text: str, *, zoned: bool) -> int:
    stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    elif not zoned:
        raise ValueError(text)
    return (stamp - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


def _partition_value(text: str | None, data_type: T.DataType) -> Any:
    """A Delta partition value as Iceberg's identity partition holds it (NULL and Hive's default stay
    None): ints, decimals, days since the epoch for dates, microseconds for timestamps."""
    if text == HIVE_DEFAULT_PARTITION:
        return None
    value = parse_partition_value(text, data_type)
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        return (aware - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    return value
