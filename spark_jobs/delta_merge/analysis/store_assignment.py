"""Casting a value to a target column type under Spark's store-assignment policies (ANSI, LEGACY, STRICT)."""

from __future__ import annotations

from typing import Literal

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CalendarIntervalType,
    CharType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
    YearMonthIntervalType,
)

from spark_jobs.delta_merge.errors import MergeAnalysisError

__all__ = ["Policy", "can_store", "find_field", "store_assign"]

Policy = Literal["ANSI", "LEGACY", "STRICT"]

# Spark's UpCastRule.numericPrecedence: a type may be up-cast to any type after it.
_NUMERIC_PRECEDENCE: tuple[type[DataType], ...] = (
    ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType,
)
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_NUMERIC = (*_INTEGRAL, FloatType, DoubleType, DecimalType)
_DATETIME = (DateType, TimestampType, TimestampNTZType)
_STRING = (StringType, CharType, VarcharType)
# Spark's AtomicType (any of them may be stored as STRING): not NULL, complex or CALENDAR INTERVAL.
_ATOMIC = (
    *_NUMERIC, *_DATETIME, *_STRING, BinaryType, BooleanType, DayTimeIntervalType, YearMonthIntervalType,
)
# DecimalType.forType: the integer digits of the decimal that holds every value of an integral type.
_INTEGRAL_DIGITS: dict[type[DataType], int] = {ByteType: 3, ShortType: 5, IntegerType: 10, LongType: 20}
_OVERFLOW_CLASS = "DELTA_CAST_OVERFLOW_IN_TABLE_WRITE"
_CANNOT_CAST_CLASS = {  # what Delta 4.4's MERGE raises for a type pair the policy refuses
    "ANSI": "INCOMPATIBLE_DATA_FOR_TABLE.CANNOT_SAFELY_CAST",
    # Delta casts with UpCast under STRICT: Spark's INSERT INTO says CANNOT_SAFELY_CAST, Delta's MERGE this.
    "STRICT": "CANNOT_UP_CAST_DATATYPE",
    "LEGACY": "DATATYPE_MISMATCH.CAST_WITHOUT_SUGGESTION",
}
_STRUCT_MISMATCH_CLASS = "DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION"


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
    if isinstance(a, _STRING) and isinstance(b, _STRING):
        return True  # CHAR/VARCHAR are STRING in a Delta schema
    return a == b


def _decimal_digits(t: DataType) -> tuple[int, int] | None:
    """(integer digits, scale) of a decimal, or of the decimal an integral type fits in."""
    if isinstance(t, DecimalType):
        return t.precision - t.scale, t.scale
    digits = _INTEGRAL_DIGITS.get(type(t))
    return None if digits is None else (digits, 0)


def _can_up_cast(src: DataType, dst: DataType) -> bool:
    """Spark's ``UpCastRule.canUpCast`` for atomic types: no truncation, precision loss or run-time failure
    is possible (except that integers may lose precision as FLOAT/DOUBLE, which Spark allows)."""
    wide, narrow = _decimal_digits(dst), _decimal_digits(src)
    if isinstance(dst, DecimalType) and isinstance(src, _NUMERIC):
        # DecimalType.isWiderThan: only decimals and integral types fit in a decimal.
        return wide is not None and narrow is not None and wide[0] >= narrow[0] and wide[1] >= narrow[1]
    if isinstance(src, DecimalType) and isinstance(dst, _NUMERIC):
        # DecimalType.isTighterThan: towards an integral type only.
        return wide is not None and narrow is not None and narrow[0] <= wide[0] and narrow[1] <= wide[1]
    if isinstance(src, _NUMERIC_PRECEDENCE) and isinstance(dst, _NUMERIC_PRECEDENCE):
        return _NUMERIC_PRECEDENCE.index(type(src)) < _NUMERIC_PRECEDENCE.index(type(dst))
    if isinstance(src, _DATETIME) and isinstance(dst, (TimestampType, TimestampNTZType)):
        return True  # DATE to either TIMESTAMP, and between the two TIMESTAMPs
    if isinstance(dst, _STRING):
        return isinstance(src, (*_ATOMIC, CalendarIntervalType))
    if (isinstance(src, TimestampType) and isinstance(dst, LongType)) or (
        isinstance(src, LongType) and isinstance(dst, TimestampType)
    ):
        return True
    return (isinstance(src, DayTimeIntervalType) and isinstance(dst, DayTimeIntervalType)) or (
        isinstance(src, YearMonthIntervalType) and isinstance(dst, YearMonthIntervalType)
    )


def _can_ansi_cast(src: DataType, dst: DataType) -> bool:
    """Spark's ``Cast.canAnsiCast`` for atomic types: what an ANSI CAST accepts at analysis."""
    if isinstance(dst, _STRING):
        return True
    if isinstance(src, _STRING):
        return isinstance(dst, (BinaryType, BooleanType, *_DATETIME, *_NUMERIC))
    if isinstance(dst, BooleanType):
        return isinstance(src, _NUMERIC)
    if isinstance(dst, TimestampType):
        return isinstance(src, (*_NUMERIC, DateType, TimestampNTZType))
    if isinstance(dst, TimestampNTZType):
        return isinstance(src, (DateType, TimestampType))
    if isinstance(dst, DateType):
        return isinstance(src, (TimestampType, TimestampNTZType))
    if isinstance(dst, _NUMERIC):
        return isinstance(src, (*_NUMERIC, BooleanType, TimestampType))
    return False


def _can_cast(src: DataType, dst: DataType) -> bool:
    """Spark's ``Cast.canCast`` (the LEGACY policy) for atomic types."""
    if isinstance(dst, _STRING):
        return True
    if isinstance(dst, BinaryType):
        return isinstance(src, (*_STRING, *_INTEGRAL))
    if isinstance(dst, BooleanType):
        return isinstance(src, (*_STRING, *_NUMERIC, DateType, TimestampType))
    if isinstance(dst, TimestampType):
        return isinstance(src, (*_STRING, *_NUMERIC, BooleanType, DateType, TimestampNTZType))
    if isinstance(dst, TimestampNTZType):
        return isinstance(src, (*_STRING, DateType, TimestampType))
    if isinstance(dst, DateType):
        return isinstance(src, (*_STRING, TimestampType, TimestampNTZType))
    if isinstance(dst, _NUMERIC):
        return isinstance(src, (*_STRING, *_NUMERIC, BooleanType, DateType, TimestampType))
    return False


def can_store(src: DataType, dst: DataType, *, policy: Policy) -> bool:
    """Whether a MERGE may store a value of atomic type ``src`` in a column of type ``dst`` under ``policy``.

    Delta's MERGE casts as its UpdateExpressionsSupport does: STRICT with ``UpCast``, only casts that
    cannot lose anything (what Spark's INSERT INTO allows too); LEGACY with a legacy CAST, every cast
    Spark has (as INSERT INTO); ANSI with an ANSI CAST, checked at run time for malformed input and
    overflow. That is more than INSERT INTO's ANSI store assignment, which refuses STRING to INT,
    numbers to BOOLEAN or TIMESTAMP, BOOLEAN to numbers and TIMESTAMP to numbers at analysis.
    """
    if _same_type(src, dst) or isinstance(src, NullType):
        return True
    if policy == "STRICT":
        return _can_up_cast(src, dst)
    if policy == "ANSI":
        return _can_ansi_cast(src, dst)
    return _can_cast(src, dst)


def _type_sql(t: DataType) -> str:
    return t.simpleString().upper()


def _column_sql(column: str) -> str:
    return ".".join(f"`{part}`" for part in column.split("."))


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

    Which types may be stored where is decided as Delta's MERGE decides it under ``policy``
    (:func:`can_store`). Structs are matched by name (Delta's default) or by position; arrays and maps
    element-wise. A conversion the policy forbids raises :class:`MergeAnalysisError` (with Spark's error
    class for it) before anything runs. Under ANSI a malformed string (CAST_INVALID_INPUT) or a value too
    large for an integral or decimal column (Delta's DELTA_CAST_OVERFLOW_IN_TABLE_WRITE) fails the merge
    at run time, before it commits, naming the column.

    :param column: the target column, dotted for a nested field (``addr.zip``), for messages.
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
        raise _cannot_cast(column, src, dst, policy)
    if not can_store(src, dst, policy=policy):
        raise _cannot_cast(column, src, dst, policy)
    may_fail_by_column = isinstance(src, _STRING) or isinstance(dst, (*_INTEGRAL, DecimalType))
    if policy == "ANSI" and may_fail_by_column and not _cannot_fail(src, dst):
        return _checked_ansi_cast(value, src, dst, column)
    # STRICT up-casts cannot fail; LEGACY casts never fail (the pipeline turns spark.sql.ansi.enabled off
    # for them: overflow wraps, malformed input becomes NULL). An ANSI cast of a number to TIMESTAMP may
    # overflow: Spark's CAST_OVERFLOW then, without the column, as in Delta.
    return value.cast(dst)


def _cannot_fail(src: DataType, dst: DataType) -> bool:
    return (
        _can_up_cast(src, dst)
        or isinstance(dst, _STRING)
        or (isinstance(src, _DATETIME) and isinstance(dst, _DATETIME))
        or (isinstance(src, _NUMERIC) and isinstance(dst, BooleanType))
        or (isinstance(src, _STRING) and isinstance(dst, BinaryType))
    )


def _checked_ansi_cast(value: Column, src: DataType, dst: DataType, column: str) -> Column:
    """An ANSI cast whose failure names the column: Delta's CheckOverflowInTableWrite does so for overflow
    into integral and decimal columns (DELTA_CAST_OVERFLOW_IN_TABLE_WRITE); a malformed string keeps
    Spark's error class (CAST_INVALID_INPUT) and text.

    try_cast is the ANSI cast with NULL for a failure, so a non-NULL value that becomes NULL failed.
    raise_error's leading "[CLASS]" is how errors.spark_failure learns the error class.
    """
    cast = value.try_cast(dst)
    source, target, name = _type_sql(src), _type_sql(dst), _column_sql(column)
    overflow = F.lit(
        f'[{_OVERFLOW_CLASS}] Failed to write a value of "{source}" type into the "{target}" type column '
        f"{name} due to an overflow. Use `try_cast` on the input value to tolerate overflow and return NULL "
        'instead. If necessary, set options.store_assignment_policy to "LEGACY" to bypass this error.'
    )
    if isinstance(src, _STRING):
        malformed = F.concat(
            F.lit("[CAST_INVALID_INPUT] The value '"), value, F.lit(
                f"' of the type \"{source}\" cannot be cast to \"{target}\" because it is malformed. "
                "Correct the value as per the syntax, or change its target type. Use `try_cast` to tolerate "
                f"malformed input and return NULL instead. The column: {name}. If necessary, set "
                'options.store_assignment_policy to "LEGACY" to bypass this error.'
            ),
        )
        # A number too large for a DECIMAL column overflows (Spark: NUMERIC_VALUE_OUT_OF_RANGE, which
        # Delta reports as the overflow); anything else that does not cast is malformed.
        is_number = value.try_cast(DoubleType()).isNotNull() if isinstance(dst, DecimalType) else F.lit(False)
        message = F.when(is_number, overflow).otherwise(malformed)
    else:
        message = overflow
    return F.when(value.isNotNull() & cast.isNull(), F.raise_error(message).cast(dst)).otherwise(cast)


def _cannot_cast(column: str, src: DataType, dst: DataType, policy: Policy) -> MergeAnalysisError:
    # In the words of Spark's INSERT INTO for the same policy.
    source, target, name = _type_sql(src), _type_sql(dst), _column_sql(column)
    if policy == "LEGACY":
        refusal = f'Cannot resolve {name} due to data type mismatch: cannot cast "{source}" to "{target}".'
    elif policy == "STRICT":
        refusal = f'Cannot up cast {name} from "{source}" to "{target}".'
    else:
        refusal = (f"Cannot write incompatible data for the table the MERGE writes: Cannot safely cast "
                   f'{name} "{source}" to "{target}".')
    allowed = {
        "STRICT": "STRICT allows only casts that cannot lose information",
        "ANSI": "ANSI allows the casts of Spark's ANSI CAST",
        "LEGACY": "LEGACY allows every cast Spark has",
    }[policy]
    return MergeAnalysisError(
        f"{refusal} options.store_assignment_policy is {policy}: {allowed}. Cast the value explicitly in the "
        f"MERGE statement (e.g. CAST(... AS {target})) or choose another store_assignment_policy.",
        error_class=_CANNOT_CAST_CLASS[policy],
    )


def _struct_mismatch(column: str, src: StructType, dst: StructType, detail: str) -> MergeAnalysisError:
    return MergeAnalysisError(
        f"Cannot cast {src.simpleString()} to {dst.simpleString()}. All nested columns must match. "
        f"Assigning {_column_sql(column)}: {detail}",
        error_class=_STRUCT_MISMATCH_CLASS,
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
            raise _struct_mismatch(
                column, src, dst, f"the source struct has fields {extra} that the target struct does not "
                "have. Enable options.schema_evolution to add them, or select only the target's fields.",
            )
        for target_field in dst.fields:
            source_field = find_field(src, target_field.name)
            if source_field is None:
                if not allow_missing_fields:
                    raise _struct_mismatch(
                        column, src, dst, f"the source struct lacks the field `{target_field.name}`.",
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
            raise _struct_mismatch(
                column, src, dst,
                f"by position, {len(src.fields)} source fields for {len(dst.fields)} target fields.",
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
