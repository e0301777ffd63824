"""Type widening's rules without a JVM: which widenings schema evolution applies (Delta 4.4's, which
tests/unit/spark_jobs/test_type_widening.py checks against Delta's MERGE), how a change is recorded in
``delta.typeChanges``, and how a schema's widened columns are found."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
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
)

from spark_jobs.delta_merge.protocol.type_widening import (
    TYPE_CHANGES,
    has_type_changes,
    type_changed_columns,
    type_widening_enabled,
    widens_in_schema_evolution,
    with_recorded_type_changes,
)


@pytest.mark.parametrize(
    ("target", "source", "widens"),
    [
        (ByteType(), ShortType(), True), (ByteType(), LongType(), True), (IntegerType(), LongType(), True),
        (LongType(), IntegerType(), False), (FloatType(), DoubleType(), True),
        (IntegerType(), DoubleType(), True),
        (LongType(), DoubleType(), False), (DecimalType(5, 2), DecimalType(10, 4), True),
        (DecimalType(5, 2), DecimalType(6, 1), False), (DecimalType(5, 2), DecimalType(5, 3), False),
        (IntegerType(), DecimalType(12, 2), True), (IntegerType(), DecimalType(11, 2), False),
        (ShortType(), DecimalType(10, 0), True), (LongType(), DecimalType(20, 0), True),
        (LongType(), DecimalType(19, 0), False), (DateType(), TimestampNTZType(), False),
        (IntegerType(), StringType(), False), (IntegerType(), IntegerType(), False),
    ],
)  # fmt: skip
def test_the_widenings_schema_evolution_applies(target: DataType, source: DataType, widens: bool) -> None:
    assert widens_in_schema_evolution(target, source) is widens


def test_a_change_is_recorded_on_the_field_after_earlier_ones_with_its_path_inside_arrays_and_maps() -> None:
    earlier = {TYPE_CHANGES: [{"toType": "short", "fromType": "byte"}], "comment": "kept"}
    field = with_recorded_type_changes(StructField("b", ShortType(), True, earlier), IntegerType())
    assert field.dataType == IntegerType()
    assert field.metadata == {"comment": "kept", TYPE_CHANGES: [
        {"toType": "short", "fromType": "byte"}, {"toType": "integer", "fromType": "short"}]}
    nested = StructField("m", MapType(IntegerType(), ArrayType(FloatType())))
    widened = with_recorded_type_changes(nested, MapType(LongType(), ArrayType(DoubleType())))
    assert widened.metadata[TYPE_CHANGES] == [
        {"toType": "long", "fromType": "integer", "fieldPath": "key"},
        {"toType": "double", "fromType": "float", "fieldPath": "value.element"},
    ]
    decimal = with_recorded_type_changes(StructField("d", DecimalType(5, 2)), DecimalType(10, 4))
    assert decimal.metadata[TYPE_CHANGES] == [{"toType": "decimal(10,4)", "fromType": "decimal(5,2)"}]


def test_widened_columns_are_found_also_in_nested_fields() -> None:
    changed = {TYPE_CHANGES: [{"toType": "long", "fromType": "integer"}]}
    schema = StructType([
        StructField("id", LongType()),
        StructField("st", StructType([StructField("x", LongType(), True, changed)])),
        StructField("arr", ArrayType(StructType([StructField("y", LongType(), True, changed)]))),
        StructField("n", LongType(), True, changed),
    ])  # fmt: skip
    assert has_type_changes(schema)
    assert type_changed_columns(schema) == {"st", "arr", "n"}
    assert not has_type_changes(StructType([StructField("id", LongType())]))


def test_evolution_widens_only_on_a_table_with_the_feature_and_the_property() -> None:
    on = {"delta.enableTypeWidening": "true"}
    assert type_widening_enabled(frozenset({"typeWidening"}), on)
    assert type_widening_enabled(frozenset({"typeWidening-preview"}), on)
    assert not type_widening_enabled(frozenset({"typeWidening"}), {})
    assert not type_widening_enabled(frozenset(), on)
