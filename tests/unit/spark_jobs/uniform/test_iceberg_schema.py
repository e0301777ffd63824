"""A Delta schema, its partitioning and its files' statistics in Iceberg's terms (pure mapping)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.types import (
    DateType,
    DecimalType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.protocol.delta_schema import spark_schema_from_delta
from spark_jobs.delta_merge.protocol.files import FileStats, LiveFile
from spark_jobs.delta_merge.uniform.iceberg_schema import data_file, iceberg_partition_spec, iceberg_schema


def _field(
    name: str,
    type_json: Any,
    field_id: int,
    *,
    nested: dict[str, int] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    metadata = {
        "delta.columnMapping.id": field_id,
        "delta.columnMapping.physicalName": f"col-{name}",
        "delta.columnMapping.nested.ids": nested or {},
        **(extra or {}),
    }
    return {"name": name, "type": type_json, "nullable": True, "metadata": metadata}


def _schema(*fields: dict[str, Any]) -> Any:
    return spark_schema_from_delta(json.dumps({"type": "struct", "fields": list(fields)}))


SCHEMA = _schema(
    _field("id", "long", 1),
    _field("small", "byte", 2),
    _field("ts", "timestamp", 3),
    _field("local", "timestamp_ntz", 4),
    _field("price", "decimal(10,2)", 5),
    _field(
        "tags",
        {"type": "array", "elementType": "string", "containsNull": True},
        6,
        nested={"col-tags.element": 20},
    ),
    _field(
        "m",
        {
            "type": "map",
            "keyType": "string",
            "valueType": {"type": "array", "elementType": "integer", "containsNull": False},
            "valueContainsNull": True,
        },
        7,
        nested={"col-m.key": 21, "col-m.value": 22, "col-m.value.element": 23},
    ),
    _field("st", {"type": "struct", "fields": [_field("a", "integer", 9)]}, 8),
    _field("name", "string", 10),
    _field("day", "date", 11),
)


def test_fields_take_their_column_mapping_ids_logical_names_and_icebergs_types() -> None:
    schema = iceberg_schema(SCHEMA)
    by_name = {f.name: f for f in schema.fields}
    assert [f.field_id for f in schema.fields] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]
    assert by_name["id"].field_type == LongType()
    assert by_name["small"].field_type == IntegerType()  # Iceberg has no byte
    assert by_name["ts"].field_type == TimestamptzType()
    assert by_name["local"].field_type == TimestampType()
    assert by_name["price"].field_type == DecimalType(10, 2)
    assert by_name["tags"].field_type == ListType(
        element_id=20, element_type=StringType(), element_required=False
    )
    m = by_name["m"].field_type
    assert isinstance(m, MapType)
    assert (m.key_id, m.value_id, m.value_required) == (21, 22, False)
    assert m.value_type == ListType(element_id=23, element_type=IntegerType(), element_required=True)
    st = by_name["st"].field_type
    assert isinstance(st, StructType)
    assert [(f.field_id, f.name) for f in st.fields] == [(9, "a")]
    assert by_name["day"].field_type == DateType()


def test_a_field_without_its_ids_is_refused_by_name() -> None:
    with pytest.raises(MergeExecutionError, match="Column n has no column mapping id"):
        iceberg_schema(_schema({"name": "n", "type": "long", "nullable": True, "metadata": {}}))
    with pytest.raises(MergeExecutionError, match=r"Column tags has no id for col-tags\.element"):
        iceberg_schema(
            _schema(_field("tags", {"type": "array", "elementType": "long", "containsNull": True}, 1))
        )


def test_partition_fields_are_identity_transforms_numbered_from_1000() -> None:
    spec = iceberg_partition_spec(iceberg_schema(SCHEMA), ("day", "name"))
    assert [(f.source_id, f.field_id, f.name, str(f.transform)) for f in spec.fields] == [
        (11, 1000, "day", "identity"),
        (10, 1001, "name", "identity"),
    ]


def _live(stats: FileStats | None, partition: dict[str, str | None] | None = None) -> LiveFile:
    return LiveFile(
        path="f.parquet", size=123, partition_values=partition or {}, stats=stats, modification_time=0
    )


def test_bounds_and_null_counts_come_from_delta_statistics_by_field_id() -> None:
    stats = FileStats(
        num_records=4,
        min_values={
            "col-id": 1,
            "col-ts": "2024-01-01T00:00:00.000Z",
            "col-local": "2024-01-01T00:00:00.000",
            "col-price": 1.5,
            "col-name": "a" * 40,
            "col-st": {"col-a": 7},
        },
        max_values={
            "col-id": 9,
            "col-ts": "2024-01-02T00:00:00.123Z",
            "col-local": "2024-01-01T00:00:00.000",
            "col-price": 99.99,
            "col-name": "b" * 32 + "\uffff",
            "col-st": {"col-a": 8},
        },
        null_count={"col-id": 0, "col-name": 2, "col-st": {"col-a": 1}, "col-tags": 3},
    )
    written = data_file(
        _live(stats, {"col-day": "2024-03-01"}),
        file_path="file:///t/f.parquet",
        schema=SCHEMA,
        partition_columns=("day",),
        mode="name",
    )
    assert (written.file_path, written.record_count, written.file_size_in_bytes) == (
        "file:///t/f.parquet",
        4,
        123,
    )
    assert written.partition[0] == (dt.date(2024, 3, 1) - dt.date(1970, 1, 1)).days
    assert dict(written.null_value_counts) == {1: 0, 10: 2, 9: 1}  # arrays have no Delta statistics
    lower, upper = written.lower_bounds, written.upper_bounds
    assert (from_bytes(LongType(), lower[1]), from_bytes(LongType(), upper[1])) == (1, 9)
    assert (from_bytes(IntegerType(), lower[9]), from_bytes(IntegerType(), upper[9])) == (7, 8)
    assert from_bytes(DecimalType(10, 2), upper[5]) == Decimal("99.99")
    day = dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)
    # Delta truncates timestamp statistics to milliseconds: the maximum covers the whole millisecond.
    assert from_bytes(TimestamptzType(), upper[3]) == int(day.timestamp() * 1_000_000) + 123_999
    assert from_bytes(TimestampType(), lower[4]) == int(
        dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1_000_000
    )
    # A string maximum at Delta's 32-character prefix may have been truncated: only the minimum is kept.
    assert from_bytes(StringType(), lower[10]) == "a" * 40
    assert 10 not in upper


def test_widened_columns_keep_null_counts_but_no_bounds_and_partition_values_convert() -> None:
    widened = _schema(
        _field("n", "long", 1, extra={"delta.typeChanges": [{"fromType": "integer", "toType": "long"}]}),
        _field("at", "timestamp", 2),
        _field("p", "integer", 3),
    )
    stats = FileStats(
        num_records=1, min_values={"col-n": 1}, max_values={"col-n": 1}, null_count={"col-n": 0}
    )
    written = data_file(
        _live(stats, {"col-at": "2024-01-01 00:00:01", "col-p": None}),
        file_path="file:///t/f.parquet",
        schema=widened,
        partition_columns=("at", "p"),
        mode="name",
    )
    assert dict(written.null_value_counts) == {1: 0}
    assert dict(written.lower_bounds) == {}
    assert dict(written.upper_bounds) == {}
    assert (written.partition[0], written.partition[1]) == (
        int(dt.datetime(2024, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc).timestamp() * 1_000_000),
        None,
    )
    hive_default = data_file(
        _live(None, {"col-at": None, "col-p": "__HIVE_DEFAULT_PARTITION__"}),
        file_path="x",
        schema=widened,
        partition_columns=("at", "p"),
        mode="name",
    )
    assert (hive_default.partition[1], hive_default.record_count) == (None, -1)
