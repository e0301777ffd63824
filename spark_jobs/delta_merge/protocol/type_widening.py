"""Delta's type widening (the ``typeWidening`` table feature): columns whose type was widened after files
were written, and the widening a MERGE with schema evolution applies.

A widened column or field carries the ``delta.typeChanges`` metadata: a list of ``{"fromType", "toType"}``
(with ``"fieldPath"`` ``element``/``key``/``value`` for a change inside an array or a map, on the nearest
enclosing field). Files written before a change still hold the narrower type, so readers up-cast them, as
Delta's Parquet reader does; their statistics are in the narrower type too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructField,
    StructType,
)

__all__ = [
    "TYPE_CHANGES",
    "WideningRule",
    "has_type_changes",
    "schema_evolution_widening",
    "type_changed_columns",
    "type_widening_enabled",
    "widens_for_iceberg",
    "widens_in_schema_evolution",
    "with_recorded_type_changes",
]

TYPE_CHANGES = "delta.typeChanges"
_FEATURES = frozenset({"typeWidening", "typeWidening-preview"})
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
# Digits before the decimal point an integral type needs (Delta: an int fits DECIMAL(10, 0), a long
# DECIMAL(20, 0); byte and short are stored as Parquet's INT32 and count as int).
_INTEGRAL_DIGITS = {ByteType: 10, ShortType: 10, IntegerType: 10, LongType: 20}


def has_type_changes(schema: StructType) -> bool:
    """Whether some column or nested field of ``schema`` was widened: older files may hold narrower types."""
    return any(True for _ in _changed_fields(schema))


def type_changed_columns(schema: StructType) -> frozenset[str]:
    """The top-level columns with a widened type in them (their files' statistics may be narrower)."""
    return frozenset(f.name for f in schema.fields if any(True for _ in _changed_fields(StructType([f]))))


def type_widening_enabled(protocol_features: frozenset[str], configuration: Mapping[str, str]) -> bool:
    """``delta.enableTypeWidening`` is on, on a protocol with the feature: schema evolution may widen."""
    config = {key.lower(): value for key, value in configuration.items()}
    enabled = config.get("delta.enabletypewidening", "false").lower() == "true"
    return enabled and bool(protocol_features & _FEATURES)


# Whether a MERGE with schema evolution widens a column of the first type to the second.
WideningRule = Callable[[DataType, DataType], bool]


def schema_evolution_widening(
    protocol_features: frozenset[str], configuration: Mapping[str, str], *, iceberg_compatible: bool
) -> WideningRule | None:
    """The rule schema evolution widens types by on this table: None without ``delta.enableTypeWidening``;
    on an Iceberg-compatible table only the changes Iceberg's schema evolution allows (Delta's
    ``isTypeChangeSupportedByIceberg``), so that the Iceberg schema can follow."""
    if not type_widening_enabled(protocol_features, configuration):
        return None
    return widens_for_iceberg if iceberg_compatible else widens_in_schema_evolution


def widens_for_iceberg(target: DataType, source: DataType) -> bool:
    """The widenings Iceberg v2 allows among Delta's: integral to a wider integral (Iceberg's int to long),
    FLOAT to DOUBLE, a DECIMAL to more digits at the same scale."""
    if isinstance(target, DecimalType) and isinstance(source, DecimalType):
        return source.scale == target.scale and source.precision > target.precision
    if (isinstance(target, _INTEGRAL) and isinstance(source, _INTEGRAL)) or isinstance(target, FloatType):
        return widens_in_schema_evolution(target, source)
    return False


def widens_in_schema_evolution(target: DataType, source: DataType) -> bool:
    """Whether a MERGE with schema evolution on a type-widening table widens ``target`` to ``source``, as
    Delta 4.4 does: a wider integral type, FLOAT to DOUBLE, BYTE/SHORT/INT to DOUBLE, a DECIMAL with at
    least as many digits on both sides of the point, an integral type to such a DECIMAL. (DATE to
    TIMESTAMP_NTZ, which ALTER TABLE may apply, Delta 4.4's MERGE does not.)"""
    if target == source:
        return False
    if isinstance(target, _INTEGRAL) and isinstance(source, _INTEGRAL):
        return _INTEGRAL.index(type(source)) > _INTEGRAL.index(type(target))
    if isinstance(target, FloatType):
        return isinstance(source, DoubleType)
    if isinstance(target, (ByteType, ShortType, IntegerType)) and isinstance(source, DoubleType):
        return True
    if isinstance(source, DecimalType):
        if isinstance(target, DecimalType):
            return _digits(source) >= _digits(target) and source.scale >= target.scale
        if isinstance(target, _INTEGRAL):
            return _digits(source) >= _INTEGRAL_DIGITS[type(target)]
    return False


def with_recorded_type_changes(field: StructField, widened: DataType) -> StructField:
    """``field`` with type ``widened`` and, for each atomic type that changed (in it, or in its arrays'
    elements and maps' keys and values; struct fields record their own), an entry appended to its
    ``delta.typeChanges``."""
    entries = [_entry(path, old, new) for path, old, new in _atomic_changes(field.dataType, widened)]
    metadata = dict(field.metadata)
    if entries:
        metadata[TYPE_CHANGES] = [*metadata.get(TYPE_CHANGES, []), *entries]
    return StructField(field.name, widened, field.nullable, metadata)


def _digits(decimal: DecimalType) -> int:
    return int(decimal.precision) - int(decimal.scale)


def _entry(path: str, old: DataType, new: DataType) -> dict[str, Any]:
    entry: dict[str, Any] = {"toType": new.jsonValue(), "fromType": old.jsonValue()}
    return {**entry, "fieldPath": path} if path else entry


def _atomic_changes(old: DataType, new: DataType, path: str = "") -> Iterator[tuple[str, DataType, DataType]]:
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        yield from _atomic_changes(old.elementType, new.elementType, _joined(path, "element"))
    elif isinstance(old, MapType) and isinstance(new, MapType):
        yield from _atomic_changes(old.keyType, new.keyType, _joined(path, "key"))
        yield from _atomic_changes(old.valueType, new.valueType, _joined(path, "value"))
    elif not isinstance(old, StructType) and old != new:
        yield path, old, new


def _joined(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def _changed_fields(data_type: DataType) -> Iterator[StructField]:
    if isinstance(data_type, StructType):
        for f in data_type.fields:
            if f.metadata.get(TYPE_CHANGES):
                yield f
            yield from _changed_fields(f.dataType)
    elif isinstance(data_type, ArrayType):
        yield from _changed_fields(data_type.elementType)
    elif isinstance(data_type, MapType):
        yield from _changed_fields(data_type.keyType)
        yield from _changed_fields(data_type.valueType)
