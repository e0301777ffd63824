"""Delta schema JSON (``metaData.schemaString``) <-> pyspark StructType <-> deltalake Schema, and the
Arrow schema the job writes for a StructType."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import deltalake
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import ArrayType, CharType, DataType, MapType, StructType, VarcharType, VariantType

from spark_jobs.delta_merge.errors import MergeAnalysisError

__all__ = [
    "arrow_schema",
    "delta_schema_json",
    "deltalake_schema",
    "normalized_schema_json",
    "spark_schema_from_delta",
    "variant_paths",
]


def spark_schema_from_delta(schema_json: str | Mapping[str, Any]) -> StructType:
    """The pyspark StructType of a Delta ``schemaString`` (Spark's own StructType JSON format).

    Field metadata is kept as is: it carries generation expressions, identity and column-mapping
    information and legacy invariants, which later stages read.

    :raises MergeAnalysisError: the text is not a struct schema pyspark can parse.
    """
    try:
        value = json.loads(schema_json) if isinstance(schema_json, str) else dict(schema_json)
    except (TypeError, ValueError) as exc:
        raise MergeAnalysisError(
            f"Delta schema is not valid JSON: {exc}. Check the table's metaData."
        ) from exc
    if not isinstance(value, dict) or value.get("type") != "struct":
        found = value.get("type") if isinstance(value, dict) else type(value).__name__
        raise MergeAnalysisError(
            f'Delta schema must be a JSON object with "type": "struct"; found {found!r}.'
        )
    try:
        return StructType.fromJson(value)
    except Exception as exc:  # pyspark raises assorted ValueError/KeyError/PySparkValueError
        raise MergeAnalysisError(f"Cannot read the Delta schema as a Spark StructType: {exc}") from exc


def delta_schema_json(schema: StructType) -> str:
    """The ``schemaString`` form of a StructType: compact JSON, keys in Delta's usual order.

    pyspark's ``StructType.json()`` sorts keys; Delta and delta-rs write ``name, type, nullable,
    metadata``, which this keeps so the log reads like other writers' logs.
    """
    if not isinstance(schema, StructType):
        raise TypeError(f"expected a pyspark StructType, found {type(schema).__name__}")
    return json.dumps(schema.jsonValue(), separators=(",", ":"), ensure_ascii=False)


def deltalake_schema(schema: StructType) -> deltalake.Schema:
    """The ``deltalake.Schema`` of a StructType (for commits through delta-rs)."""
    return deltalake.Schema.from_json(delta_schema_json(schema))


def normalized_schema_json(schema: StructType | str) -> Any:
    """A comparable form of a schema: delta-rs's reading of it, as parsed JSON.

    Two schemas are the same table schema when these compare equal (dict equality ignores key and
    metadata order, which delta-rs does not keep; field order matters).
    """
    text = schema if isinstance(schema, str) else delta_schema_json(schema)
    return json.loads(deltalake.Schema.from_json(text).to_json())

def variant_paths(schema: StructType, base: tuple[str, ...] = ()) -> tuple[tuple[str, ...], ...]:
    """The paths (through structs) of ``schema``'s VARIANT columns and fields: in files, a struct of the
    ``value`` and ``metadata`` binaries (PROTOCOL.md, "Variant Data Type")."""
    paths: list[tuple[str, ...]] = []
    for f in schema.fields:
        if isinstance(f.dataType, VariantType):
            paths.append((*base, f.name))
        elif isinstance(f.dataType, StructType):
            paths += variant_paths(f.dataType, (*base, f.name))
    return tuple(paths)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema of ``schema``: nullability from Spark, UTC timestamps, no field metadata."""
    return pa.schema([pa.field(f.name, _arrow_type(f.dataType), nullable=f.nullable) for f in schema])


def _arrow_type(spark_type: DataType) -> pa.DataType:
    if isinstance(spark_type, StructType):
        return pa.struct([pa.field(f.name, _arrow_type(f.dataType), nullable=f.nullable) for f in spark_type])
    if isinstance(spark_type, ArrayType):
        element = _arrow_type(spark_type.elementType)
        return pa.list_(pa.field("element", element, nullable=spark_type.containsNull))
    if isinstance(spark_type, MapType):
        key, value = _arrow_type(spark_type.keyType), _arrow_type(spark_type.valueType)
        return pa.map_(pa.field("key", key, nullable=False),
                       pa.field("value", value, nullable=spark_type.valueContainsNull))
    if isinstance(spark_type, (CharType, VarcharType)):
        return pa.string()
    return to_arrow_type(spark_type, timezone="UTC")
