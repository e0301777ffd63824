"""Build the tables of a MERGE scenario (Delta's own test cases as data), run it, read the result back."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StructType,
)

SCENARIOS_FILE = Path(__file__).resolve().parents[1] / "data" / "merge_scenarios.json"

# Delta / Spark confs of the original tests and the spec options that mean the same.
CONF_TO_OPTION: dict[str, tuple[str, Any]] = {
    "spark.databricks.delta.schema.autoMerge.enabled": ("schema_evolution", lambda v: v.lower() == "true"),
    "spark.sql.storeAssignmentPolicy": ("store_assignment_policy", lambda v: v.upper()),
    "spark.databricks.delta.resolveMergeUpdateStructsByName.enabled": (
        "resolve_structs_by_name", lambda v: v.lower() == "true"),
}


def load_scenarios() -> list[dict[str, Any]]:
    return list(json.loads(SCENARIOS_FILE.read_text(encoding="utf-8")))


def _to_json_value(value: Any, data_type: DataType) -> Any:
    """Scenario encoding -> what Spark's JSON reader parses into ``data_type``."""
    if value is None:
        return None
    if isinstance(data_type, StructType):
        return {f.name: _to_json_value(value.get(f.name), f.dataType) for f in data_type.fields}
    if isinstance(data_type, ArrayType):
        return [_to_json_value(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        return {k: _to_json_value(v, data_type.valueType) for k, v in value.items()}
    return value


def dataframe(spark: SparkSession, ddl: str, rows: list[list[Any]]) -> DataFrame:
    """Rows in the scenario encoding as a DataFrame of the DDL schema."""
    schema = spark.createDataFrame([], ddl).schema
    records = [
        json.dumps({f.name: _to_json_value(v, f.dataType) for f, v in zip(schema.fields, row, strict=True)})
        for row in rows
    ]
    if any(isinstance(f.dataType, BinaryType) for f in schema.fields):
        raise NotImplementedError("binary columns in scenarios")
    if not records:
        return spark.createDataFrame([], schema)
    # Spark's JSON parser through from_json: the same on a classic and a Spark Connect session (no RDD).
    lines = spark.createDataFrame([(r,) for r in records], "value string")
    parsed = F.from_json("value", schema, {"allowNonNumericNumbers": "true"}).alias("row")
    return lines.select(parsed).select("row.*")


def create_target(spark: SparkSession, path: Path, scenario: Mapping[str, Any]) -> None:
    """Write the scenario's target as a Delta table through deltalake (not through this project)."""
    from deltalake import write_deltalake

    df = dataframe(spark, scenario["target_schema"], scenario["target_rows"])
    write_deltalake(str(path), df.toArrow(), partition_by=scenario["target_partition_by"] or None)


def merge_spec(scenario: Mapping[str, Any], target: Path, source_view: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for conf, value in scenario.get("conf", {}).items():
        if conf in CONF_TO_OPTION:
            name, convert = CONF_TO_OPTION[conf]
            options[name] = convert(str(value))
    return {
        "target": {"uri": str(target)},
        "source": {"query": f"SELECT * FROM {source_view}"},
        "merge_sql": scenario["merge_sql"],
        "options": options,
    }


@contextmanager
def scenario_confs(spark: SparkSession, scenario: Mapping[str, Any], extra: Mapping[str, str] | None = None
                   ) -> Iterator[None]:  # fmt: skip
    """The scenario's confs that have no spec option (the job reads them from the session, as Delta does:
    skipRecordingEmptyCommits, ...), and ``extra``, set on ``spark`` for the block, then unset."""
    confs = {k: str(v) for k, v in scenario.get("conf", {}).items() if k not in CONF_TO_OPTION}
    confs.update(extra or {})
    with session_confs(spark, confs):
        yield


@contextmanager
def session_confs(spark: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """``confs`` set on ``spark`` for the block, then unset."""
    for name, value in confs.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name in confs:
            spark.conf.unset(name)


def normalize(value: Any) -> Any:
    """Values read back -> the scenario encoding, so both sides compare as plain JSON."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and value.is_integer():
        return value
    return value


def multiset(rows: list[list[Any]]) -> list[str]:
    return sorted(json.dumps(normalize(r), sort_keys=True, default=str) for r in rows)
