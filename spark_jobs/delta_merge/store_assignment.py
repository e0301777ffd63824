"""Casting a value to a target column type under Spark's store-assignment policies (ANSI, LEGACY, STRICT)."""

from __future__ import annotations

from typing import Literal

from pyspark.sql import Column
from pyspark.sql import functions as F
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
    ShortType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs.delta_merge.errors import MergeAnalysisError

__all__ = ["Policy", "find_field", "store_assign"]

Policy = Literal["ANSI", "LEGACY", "STRICT"]

_DATETIME = (DateType, TimestampType, TimestampNTZType)
_INTEGRAL_ORDER = (ByteType, ShortType, IntegerType, LongType)
_NUMERIC = (*_INTEGRAL_ORDER, FloatType, DoubleType, DecimalType)


def find_field(struct: StructType, name: str) -> StructField | None:
    """A field by name, case-insensitively as Spark resolves by default."""
    lowered = name.lower()
    for field in struct.fields:
        if field.name.lower() == lowered:
            return field
    return None


def _same_type(a: DataType, b: DataType) -> bool:
    # Nullability and field metadata do not matter for assignment.
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and _same_type(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True)
        )
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return _same_type(a.elementType, b.elementType)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return _same_type(a.keyType, b.keyType) and _same_type(a.valueType, b.valueType)
    return a == b


def _can_up_cast(src: DataType, dst: DataType) -> bool:
    if isinstance(src, _INTEGRAL_ORDER) and isinstance(dst, _INTEGRAL_ORDER):
        order: list[type[DataType]] = list(_INTEGRAL_ORDER)
        return order.index(type(src)) <= order.index(type(dst))
    if isinstance(src, (*_INTEGRAL_ORDER, FloatType)) and isinstance(dst, DoubleType):
        return True
    if isinstance(src, (ByteType, ShortType, IntegerType)) and isinstance(dst, FloatType):
        return True
    if isinstance(src, DecimalType) and isinstance(dst, DecimalType):
        return dst.precision - dst.scale >= src.precision - src.scale and dst.scale >= src.scale
    return isinstance(src, DateType) and isinstance(dst, (TimestampType, TimestampNTZType))


def _atomic_allowed(src: DataType, dst: DataType, policy: Policy) -> bool:
    # Delta casts with an ANSI (or legacy) Cast and lets it fail at run time on bad values, as
    # UpdateExpressionsSupport.castIfNeeded does; only STRICT is checked statically (UpCast).
    if policy == "STRICT":
        return _can_up_cast(src, dst)
    return True


def _type_sql(t: DataType) -> str:
    return t.simpleString().upper()


def store_assign(
    value: Column,
    src: DataType,
    dst: DataType,
    *,
    policy: Policy,
    by_name: bool,
    column: str,
    allow_missing_fields: bool,
) -> Column:
    """``value`` (of type ``src``) as type ``dst``, the way a table write assigns it.

    Structs are matched by name (Delta's default) or by position; arrays and maps element-wise.
    A conversion the policy forbids raises :class:`MergeAnalysisError` before anything runs; a value
    that fails at run time (overflow under ANSI) fails the merge before it commits.
    """
    if _same_type(src, dst):
        return value
    if isinstance(src, NullType):
        return F.lit(None).cast(dst)
    if isinstance(src, StructType) and isinstance(dst, StructType):
        return _assign_struct(value, src, dst, policy, by_name, column, allow_missing_fields)
    if isinstance(src, ArrayType) and isinstance(dst, ArrayType):
        return F.transform(
            value,
            lambda x: store_assign(
                x, src.elementType, dst.elementType, policy=policy, by_name=by_name,
                column=f"{column}.element", allow_missing_fields=allow_missing_fields,
            ),
        )
    if isinstance(src, MapType) and isinstance(dst, MapType):
        keyed = F.transform_keys(
            value,
            lambda k, _v: store_assign(
                k, src.keyType, dst.keyType, policy=policy, by_name=by_name,
                column=f"{column}.key", allow_missing_fields=allow_missing_fields,
            ),
        )
        return F.transform_values(
            keyed,
            lambda _k, v: store_assign(
                v, src.valueType, dst.valueType, policy=policy, by_name=by_name,
                column=f"{column}.value", allow_missing_fields=allow_missing_fields,
            ),
        )
    complex_types = (StructType, ArrayType, MapType)
    if isinstance(src, complex_types) or isinstance(dst, complex_types):
        raise _cannot_cast(column, src, dst)
    if not _atomic_allowed(src, dst, policy):
        raise _cannot_cast(column, src, dst)
    narrowing = isinstance(src, _NUMERIC) and isinstance(dst, _NUMERIC) and not _can_up_cast(src, dst)
    if policy == "ANSI" and narrowing:
        return _overflow_checked(value, src, dst, column)
    return value.cast(dst)


def _overflow_checked(value: Column, src: DataType, dst: DataType, column: str) -> Column:
    # Delta wraps narrowing ANSI casts in CheckOverflowInTableWrite, so the error names the column
    # (DELTA_CAST_OVERFLOW_IN_TABLE_WRITE) rather than only the value, as Spark's CAST_OVERFLOW does.
    cast = value.try_cast(dst)
    message = (
        f'Failed to write a value of "{_type_sql(src)}" type into the "{_type_sql(dst)}" type column '
        f"`{column}` due to an overflow. Use `try_cast` on the input value to tolerate overflow and return "
        'NULL instead. If necessary, set options.store_assignment_policy to "LEGACY" to bypass this error.'
    )
    return F.when(value.isNotNull() & cast.isNull(), F.raise_error(F.lit(message)).cast(dst)).otherwise(cast)


def _cannot_cast(column: str, src: DataType, dst: DataType) -> MergeAnalysisError:
    return MergeAnalysisError(
        f"Cannot safely cast `{column}`: {_type_sql(src)} to {_type_sql(dst)}. Cast the value explicitly "
        f"in the MERGE statement (e.g. CAST(... AS {_type_sql(dst)})) or relax "
        "options.store_assignment_policy."
    )


def _assign_struct(
    value: Column,
    src: StructType,
    dst: StructType,
    policy: Policy,
    by_name: bool,
    column: str,
    allow_missing_fields: bool,
) -> Column:
    fields: list[Column] = []
    if by_name:
        extra = [f.name for f in src.fields if find_field(dst, f.name) is None]
        if extra and not allow_missing_fields:
            raise MergeAnalysisError(
                f"Cannot assign `{column}`: the source struct has fields {extra} that the target struct "
                f"{_type_sql(dst)} does not have. Enable options.schema_evolution to add them, or select "
                "only the target's fields."
            )
        for target_field in dst.fields:
            source_field = find_field(src, target_field.name)
            if source_field is None:
                if not allow_missing_fields:
                    raise MergeAnalysisError(
                        f"Cannot assign `{column}`: the source struct {_type_sql(src)} lacks the field "
                        f"`{target_field.name}` of the target struct {_type_sql(dst)}."
                    )
                fields.append(F.lit(None).cast(target_field.dataType).alias(target_field.name))
                continue
            fields.append(
                store_assign(
                    value.getField(source_field.name), source_field.dataType, target_field.dataType,
                    policy=policy, by_name=by_name, column=f"{column}.{target_field.name}",
                    allow_missing_fields=allow_missing_fields,
                ).alias(target_field.name)
            )
    else:
        if len(src.fields) != len(dst.fields):
            raise MergeAnalysisError(
                f"Cannot assign `{column}` by position: the source struct {_type_sql(src)} has "
                f"{len(src.fields)} fields, the target struct {_type_sql(dst)} has {len(dst.fields)}."
            )
        for source_field, target_field in zip(src.fields, dst.fields, strict=True):
            fields.append(
                store_assign(
                    value.getField(source_field.name), source_field.dataType, target_field.dataType,
                    policy=policy, by_name=by_name, column=f"{column}.{target_field.name}",
                    allow_missing_fields=allow_missing_fields,
                ).alias(target_field.name)
            )
    # A NULL struct stays NULL rather than becoming a struct of NULLs.
    return F.when(value.isNull(), F.lit(None).cast(dst)).otherwise(F.struct(*fields))
