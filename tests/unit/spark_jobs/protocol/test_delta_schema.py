"""Delta schema JSON <-> pyspark StructType <-> deltalake Schema round trips (no JVM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.protocol.delta_schema import (
    delta_schema_json,
    deltalake_schema,
    normalized_schema_json,
    spark_schema_from_delta,
)

PRIMITIVES: dict[str, DataType] = {
    "byte": ByteType(),
    "short": ShortType(),
    "integer": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
    "decimal(10,2)": DecimalType(10, 2),
    "decimal(38,0)": DecimalType(38, 0),
}


def _field(name: str, type_json: Any, *, nullable: bool = True, metadata: Any = None) -> dict[str, Any]:
    return {"name": name, "type": type_json, "nullable": nullable, "metadata": metadata or {}}


NESTED_SCHEMA = {
    "type": "struct",
    "fields": [
        _field("id", "long", nullable=False, metadata={"comment": "key"}),
        _field(
            "s",
            {
                "type": "struct",
                "fields": [_field("a", "integer"), _field("b", "decimal(5,3)", nullable=False)],
            },
        ),
        _field(
            "arr",
            {
                "type": "array",
                "elementType": {"type": "struct", "fields": [_field("x", "timestamp_ntz")]},
                "containsNull": False,
            },
        ),
        _field(
            "m",
            {
                "type": "map",
                "keyType": "string",
                "valueType": {"type": "array", "elementType": "date", "containsNull": True},
                "valueContainsNull": False,
            },
        ),
        _field("g", "date", metadata={"delta.generationExpression": "CAST(`ts` AS DATE)"}),
        _field(
            "ident",
            "long",
            metadata={
                "delta.identity.start": 1,
                "delta.identity.step": 2,
                "delta.identity.allowExplicitInsert": True,
            },
        ),
        _field(
            "mapped",
            "string",
            metadata={"delta.columnMapping.id": 7, "delta.columnMapping.physicalName": "col-x"},
        ),
        _field("vc", "string", metadata={"__CHAR_VARCHAR_TYPE_STRING": "varchar(10)"}),
        _field("inv", "integer", metadata={"delta.invariants": '{"expression":{"expression":"inv > 0"}}'}),
    ],
}


@pytest.mark.parametrize(("type_json", "spark_type"), list(PRIMITIVES.items()))
def test_every_primitive_round_trips(type_json: str, spark_type: DataType) -> None:
    schema_json = json.dumps({"type": "struct", "fields": [_field("c", type_json, nullable=False)]})
    schema = spark_schema_from_delta(schema_json)
    assert schema == StructType([StructField("c", spark_type, False)])
    assert json.loads(delta_schema_json(schema)) == json.loads(schema_json)
    assert normalized_schema_json(deltalake_schema(schema).to_json()) == normalized_schema_json(schema_json)


def test_nested_types_nullability_and_metadata_round_trip() -> None:
    schema = spark_schema_from_delta(NESTED_SCHEMA)
    assert json.loads(delta_schema_json(schema)) == NESTED_SCHEMA
    assert spark_schema_from_delta(delta_schema_json(schema)) == schema
    assert schema["ident"].metadata["delta.identity.start"] == 1
    assert schema["arr"].dataType == ArrayType(StructType([StructField("x", TimestampNTZType())]), False)
    assert schema["m"].dataType == MapType(StringType(), ArrayType(DateType(), True), False)
    # deltalake keeps every field, type and metadata value (it reorders metadata keys only)
    assert normalized_schema_json(deltalake_schema(schema).to_json()) == NESTED_SCHEMA


def test_json_keys_in_delta_order() -> None:
    text = delta_schema_json(StructType([StructField("a", LongType(), True)]))
    assert text == '{"type":"struct","fields":[{"name":"a","type":"long","nullable":true,"metadata":{}}]}'


def test_reads_schema_string_written_by_deltalake(tmp_path: Path) -> None:
    data = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "ts": pa.array([0], pa.timestamp("us", tz="UTC")),
            "s": pa.array([{"x": 1}], pa.struct([("x", pa.int16())])),
            "l": pa.array([[1.5]], pa.list_(pa.float32())),
        }
    )
    write_deltalake(tmp_path / "t", data)
    log = (tmp_path / "t" / "_delta_log" / "00000000000000000000.json").read_text().splitlines()
    schema_string = next(json.loads(line)["metaData"]["schemaString"] for line in log if "metaData" in line)
    schema = spark_schema_from_delta(schema_string)
    assert schema.fieldNames() == ["id", "ts", "s", "l"]
    assert schema["ts"].dataType == TimestampType()
    assert schema["s"].dataType == StructType([StructField("x", ShortType())])
    assert schema == spark_schema_from_delta(DeltaTable(tmp_path / "t").schema().to_json())


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        '"long"',
        '{"type": "array", "elementType": "long"}',
        '{"type": "struct", "fields": [{"name": "a", "type": "interval-ish"}]}',
    ],
)
def test_invalid_schema_json_is_an_analysis_error(bad: str) -> None:
    with pytest.raises(MergeAnalysisError, match="schema"):
        spark_schema_from_delta(bad)


def _types(depth: int) -> st.SearchStrategy[Any]:
    leaves = st.sampled_from(sorted(PRIMITIVES))
    if depth == 0:
        return leaves
    inner = _types(depth - 1)
    names = st.lists(st.text("abcxyz_ é.", min_size=1, max_size=5), min_size=1, max_size=3, unique=True)
    structs = names.flatmap(
        lambda ns: st.tuples(*[st.tuples(inner, st.booleans()) for _ in ns]).map(
            lambda ts: {
                "type": "struct",
                "fields": [_field(n, t, nullable=b) for n, (t, b) in zip(ns, ts, strict=True)],
            }
        )
    )
    arrays = st.tuples(inner, st.booleans()).map(
        lambda t: {"type": "array", "elementType": t[0], "containsNull": t[1]}
    )
    maps = st.tuples(leaves, inner, st.booleans()).map(
        lambda t: {"type": "map", "keyType": t[0], "valueType": t[1], "valueContainsNull": t[2]}
    )
    return st.one_of(leaves, structs, arrays, maps)


@settings(max_examples=60, deadline=None)
@given(field_type=_types(2), nullable=st.booleans())
def test_random_schemas_round_trip(field_type: Any, nullable: bool) -> None:
    schema_json = {
        "type": "struct",
        "fields": [_field("c", field_type, nullable=nullable, metadata={"k": [1, "v"]})],
    }
    schema = spark_schema_from_delta(schema_json)
    assert json.loads(delta_schema_json(schema)) == schema_json
    assert normalized_schema_json(deltalake_schema(schema).to_json()) == schema_json
