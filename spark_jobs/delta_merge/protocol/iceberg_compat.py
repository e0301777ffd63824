"""Delta's ``icebergCompatV2`` table feature (PROTOCOL.md "Iceberg Compatibility V2"): the rules writers of
such a table follow, so that its files stay readable as an Iceberg table (UniForm).

Where each rule is kept: column mapping in ``name`` or ``id`` mode, IcebergCompatV1 and deletion vectors not
active (:func:`iceberg_compat_problems`, before anything is read); ids for array elements and map keys and
values, in the schema and the Parquet files (``column_mapping``); partition values materialized in the data
files (``write.merge_output``, as for ``materializePartitionColumns``); ``numRecords`` in every new file's
statistics and timestamps as INT64 (the job's file writer does both on every table); only the types of the
allow-list in the merged schema (:func:`check_iceberg_compat_schema`); type widening only where Iceberg
allows it (``type_widening.widens_for_iceberg``). Hand-written: the rules are Delta's (its
``IcebergCompatV2`` checks), and no library on this job's path keeps them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

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
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs.delta_merge.errors import MergeAnalysisError

__all__ = [
    "ICEBERG_COMPAT_V2",
    "check_iceberg_compat_schema",
    "iceberg_compat_problems",
    "iceberg_compat_v2",
]

ICEBERG_COMPAT_V2 = "icebergCompatV2"
_ENABLE_V2 = "delta.enableicebergcompatv2"
_ENABLE_V1 = "delta.enableicebergcompatv1"
# PROTOCOL.md's allow-list for IcebergCompatV2 (arrays, maps and structs are checked inside).
_ALLOWED_TYPES = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType, StringType,
                  BinaryType, BooleanType, TimestampType, TimestampNTZType, DateType)  # fmt: skip


def iceberg_compat_v2(writer_features: frozenset[str], configuration: Mapping[str, str]) -> bool:
    """IcebergCompatV2 is active: the protocol supports the feature and ``delta.enableIcebergCompatV2``
    is true (PROTOCOL.md: only then must writers keep its rules)."""
    return ICEBERG_COMPAT_V2 in writer_features and _enabled(configuration, _ENABLE_V2)


def iceberg_compat_problems(
    writer_features: frozenset[str], configuration: Mapping[str, str], *, column_mapping_mode: str
) -> Iterator[tuple[str, str]]:
    """(feature, why and what to do) for each IcebergCompatV2 rule the table itself breaks, which no
    merge could keep (Delta refuses such tables as ``DELTA_ICEBERG_COMPAT_VIOLATION``)."""
    if not iceberg_compat_v2(writer_features, configuration):
        return
    if column_mapping_mode not in ("name", "id"):
        yield ICEBERG_COMPAT_V2, (
            f"{ICEBERG_COMPAT_V2}: requires column mapping in 'name' or 'id' mode, but "
            f"delta.columnMapping.mode is '{column_mapping_mode}'; the table is invalid as it is."
        )
    if "icebergCompatV1" in writer_features and _enabled(configuration, _ENABLE_V1):
        yield ICEBERG_COMPAT_V2, (
            f"{ICEBERG_COMPAT_V2}: IcebergCompatV1 is active too, and only one version may be; unset "
            "delta.enableIcebergCompatV1."
        )
    if "deletionVectors" in writer_features and _enabled(configuration, "delta.enabledeletionvectors"):
        yield ICEBERG_COMPAT_V2, (
            f"{ICEBERG_COMPAT_V2}: requires deletion vectors to be disabled, but delta.enableDeletionVectors "
            "is true; set it to false and purge the table's deletion vectors (REORG TABLE ... APPLY (PURGE))."
        )


def check_iceberg_compat_schema(schema: StructType, *, table_uri: str) -> None:
    """Refuse a merged schema holding a type outside IcebergCompatV2's allow-list (a column schema
    evolution would add), as Delta does before it writes.

    :raises MergeAnalysisError: ``DELTA_ICEBERG_COMPAT_VIOLATION.UNSUPPORTED_DATA_TYPE``, naming the column.
    """
    for path, data_type in _leaves(schema, ()):
        if not isinstance(data_type, _ALLOWED_TYPES):
            raise MergeAnalysisError(
                "The validation of IcebergCompatV2 has failed. IcebergCompatV2 does not support the data "
                f"type {data_type.simpleString()} in your schema (column {'.'.join(path)}). Target "
                f"{table_uri} stays as it was: cast the source column to a supported type, or leave it out "
                "of the merge.",
                error_class="DELTA_ICEBERG_COMPAT_VIOLATION.UNSUPPORTED_DATA_TYPE",
            )


def _leaves(data_type: DataType, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], DataType]]:
    if isinstance(data_type, StructType):
        for field in data_type.fields:
            yield from _leaves(field.dataType, (*path, field.name))
    elif isinstance(data_type, ArrayType):
        yield from _leaves(data_type.elementType, (*path, "element"))
    elif isinstance(data_type, MapType):
        yield from _leaves(data_type.keyType, (*path, "key"))
        yield from _leaves(data_type.valueType, (*path, "value"))
    else:
        yield path, data_type


def _enabled(configuration: Mapping[str, str], key: str) -> bool:
    config = {k.lower(): v for k, v in configuration.items()}
    return config.get(key, "false").strip().lower() == "true"
