"""IcebergCompatV2's writer rules that are pure logic: the type allow-list, Iceberg's widenings, and the ids
of array elements and map keys and values (assigned to new fields, written into the Parquet schema)."""

from __future__ import annotations

import pyarrow as pa
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
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    VariantType,
)

from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.protocol.column_mapping import (
    ARROW_FIELD_ID_KEY,
    NESTED_IDS_KEY,
    map_new_fields,
    max_column_id_update,
    physical_arrow_schema,
)
from spark_jobs.delta_merge.protocol.iceberg_compat import check_iceberg_compat_schema, iceberg_compat_v2
from spark_jobs.delta_merge.protocol.type_widening import schema_evolution_widening

WIDENING = {"delta.enableTypeWidening": "true"}


@pytest.mark.parametrize(
    "data_type",
    [
        VariantType(),
        NullType(),
        ArrayType(VariantType()),
        MapType(StringType(), StructType([StructField("v", VariantType())])),
    ],
)
def test_types_outside_the_allow_list_are_refused_wherever_they_are(data_type: DataType) -> None:
    schema = StructType([StructField("id", LongType()), StructField("x", data_type)])
    with pytest.raises(
        MergeAnalysisError, match=r"IcebergCompatV2 does not support the data type .* \(column x"
    ) as err:
        check_iceberg_compat_schema(schema, table_uri="file:///t")
    assert err.value.error_class == "DELTA_ICEBERG_COMPAT_VIOLATION.UNSUPPORTED_DATA_TYPE"


def test_allowed_types_pass() -> None:
    check_iceberg_compat_schema(
        StructType(
            [
                StructField("a", ArrayType(MapType(StringType(), DecimalType(10, 2)))),
                StructField(
                    "b", StructType([StructField("c", TimestampNTZType()), StructField("d", ByteType())])
                ),
                StructField("e", DateType()),
            ]
        ),
        table_uri="file:///t",
    )


def test_active_means_the_feature_and_the_property() -> None:
    assert iceberg_compat_v2(frozenset({"icebergCompatV2"}), {"delta.enableIcebergCompatV2": "true"})
    assert not iceberg_compat_v2(frozenset({"icebergCompatV2"}), {})
    assert not iceberg_compat_v2(frozenset(), {"delta.enableIcebergCompatV2": "true"})


@pytest.mark.parametrize(
    ("target", "source", "delta", "iceberg"),
    [
        (IntegerType(), LongType(), True, True),
        (ByteType(), IntegerType(), True, True),
        (FloatType(), DoubleType(), True, True),
        (DecimalType(10, 2), DecimalType(12, 2), True, True),
        (DecimalType(10, 2), DecimalType(12, 3), True, False),  # Iceberg keeps a decimal's scale
        (IntegerType(), DoubleType(), True, False),
        (IntegerType(), DecimalType(12, 0), True, False),
        (LongType(), IntegerType(), False, False),
    ],
)
def test_iceberg_compatible_tables_widen_only_as_iceberg_can(
    target: DataType, source: DataType, delta: bool, iceberg: bool
) -> None:
    features = frozenset({"typeWidening"})
    plain = schema_evolution_widening(features, WIDENING, iceberg_compatible=False)
    compatible = schema_evolution_widening(features, WIDENING, iceberg_compatible=True)
    assert plain is not None
    assert compatible is not None
    assert (plain(target, source), compatible(target, source)) == (delta, iceberg)
    assert schema_evolution_widening(features, {}, iceberg_compatible=True) is None


def _mapped(
    name: str, field_id: int, data_type: DataType, nested: dict[str, int] | None = None
) -> StructField:
    metadata: dict[str, object] = {
        "delta.columnMapping.id": field_id,
        "delta.columnMapping.physicalName": f"col-{name}",
    }
    if nested is not None:
        metadata[NESTED_IDS_KEY] = nested
    return StructField(name, data_type, True, metadata)


def test_new_arrays_and_maps_get_nested_ids_after_the_field_ids_and_the_max_id_counts_them() -> None:
    old = StructType(
        [
            _mapped("id", 1, LongType(), {}),
            _mapped("tags", 2, ArrayType(StringType()), {"col-tags.element": 3}),
        ]
    )
    new = StructType(
        [
            *old.fields,
            StructField("m", MapType(StringType(), ArrayType(LongType()))),
            StructField("s", StructType([StructField("xs", ArrayType(LongType()))])),
        ]
    )
    config = {"delta.columnMapping.maxColumnId": "3"}
    mapped = map_new_fields(config, old, new, mode="name", nested_ids=True)
    m, s = mapped["m"], mapped["s"]
    physical_m = m.metadata["delta.columnMapping.physicalName"]
    assert m.metadata["delta.columnMapping.id"] == 4
    assert s.metadata["delta.columnMapping.id"] == 5
    xs = s.dataType["xs"]  # type: ignore[index]
    assert xs.metadata["delta.columnMapping.id"] == 6
    nested_m = m.metadata[NESTED_IDS_KEY]
    assert nested_m == {f"{physical_m}.key": 7, f"{physical_m}.value": 8, f"{physical_m}.value.element": 9}
    assert list(xs.metadata[NESTED_IDS_KEY].values()) == [10]
    assert mapped["tags"].metadata[NESTED_IDS_KEY] == {"col-tags.element": 3}  # old fields keep theirs
    assert max_column_id_update(config, mapped, mode="name") == {"delta.columnMapping.maxColumnId": "10"}
    assert NESTED_IDS_KEY not in map_new_fields(config, old, new, mode="name")["m"].metadata


def test_nested_ids_are_written_as_parquet_field_ids_of_elements_keys_and_values() -> None:
    schema = StructType(
        [
            _mapped(
                "m",
                1,
                MapType(StringType(), ArrayType(LongType())),
                {"col-m.key": 2, "col-m.value": 3, "col-m.value.element": 4},
            )
        ]
    )
    arrow = physical_arrow_schema(
        schema, pa.schema([("m", pa.map_(pa.string(), pa.list_(pa.int64())))]), "name"
    )
    field = arrow.field("col-m")
    map_type = field.type
    assert field.metadata[ARROW_FIELD_ID_KEY] == b"1"
    assert map_type.key_field.metadata[ARROW_FIELD_ID_KEY] == b"2"
    assert map_type.item_field.metadata[ARROW_FIELD_ID_KEY] == b"3"
    assert map_type.item_field.type.value_field.metadata[ARROW_FIELD_ID_KEY] == b"4"
