"""Partition values as the Delta log spells them, and the Hive-style paths of partitioned files."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import quote, unquote

from pyspark.sql.types import (
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
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

__all__ = [
    "HIVE_DEFAULT_PARTITION",
    "decode_add_path",
    "encode_add_path",
    "escape_path_name",
    "parse_partition_value",
    "partition_directory",
    "serialize_partition_value",
    "unescape_path_name",
]

HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# Spark's ExternalCatalogUtils.escapePathName set (read off the 4.3 JVM), plus NUL, which no file
# system accepts in a name.
_ESCAPED = frozenset([chr(c) for c in range(0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))
_UTC = dt.timezone.utc
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_TIMESTAMP = re.compile(
    r"^(\d{4,})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?$"
)


def serialize_partition_value(value: Any, spark_type: DataType) -> str | None:
    """``add.partitionValues`` text for ``value`` of ``spark_type`` per PROTOCOL.md (None for NULL).

    Empty strings and empty binaries become NULL: the protocol reads an empty value as NULL, so
    writing one would silently change the row (Spark's writer does the same, with Empty2Null).
    Timestamps are written in UTC as ``YYYY-MM-DD HH:MM:SS.ffffff``, the form delta-rs writes.
    """
    if value is None:
        return None
    if isinstance(spark_type, StringType):
        return str(_require(value, str, spark_type)) or None
    if isinstance(spark_type, BooleanType):
        return "true" if _require(value, bool, spark_type) else "false"
    if isinstance(spark_type, _INTEGRAL):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"partition value {value!r} is not an integer ({spark_type.simpleString()})")
        return str(value)
    if isinstance(spark_type, (FloatType, DoubleType)):
        number = float(value)
        if math.isnan(number):
            return "NaN"
        if math.isinf(number):
            return "Infinity" if number > 0 else "-Infinity"
        return repr(number)
    if isinstance(spark_type, DecimalType):
        return format(_require(value, Decimal, spark_type), "f")
    if isinstance(spark_type, TimestampType):
        stamp = _require(value, dt.datetime, spark_type)
        # A naive value for a zoned type is taken as UTC already (what Arrow hands over as_py).
        stamp = stamp.astimezone(_UTC).replace(tzinfo=None) if stamp.tzinfo is not None else stamp
        return _format_timestamp(stamp)
    if isinstance(spark_type, TimestampNTZType):
        stamp = _require(value, dt.datetime, spark_type)
        if stamp.tzinfo is not None:
            raise TypeError(f"partition value {value!r} has a time zone; timestamp_ntz has none")
        return _format_timestamp(stamp)
    if isinstance(spark_type, DateType):
        if isinstance(value, dt.datetime):
            raise TypeError(f"partition value {value!r} is a timestamp, not a date")
        return str(_require(value, dt.date, spark_type).isoformat())
    if isinstance(spark_type, BinaryType):
        # Delta-Spark and delta-kernel read a binary partition value as the UTF-8 bytes of the text;
        # bytes that are not UTF-8 cannot survive that round trip, so refuse rather than corrupt.
        raw = bytes(_require(value, (bytes, bytearray, memoryview), spark_type))
        try:
            return raw.decode("utf-8") or None
        except UnicodeDecodeError as exc:
            raise ValueError(f"binary partition value {raw!r} is not UTF-8: Delta cannot store it") from exc
    raise TypeError(f"type {spark_type.simpleString()} cannot be a Delta partition column")


def parse_partition_value(text: str | None, spark_type: DataType) -> Any:
    """The Python value of an ``add.partitionValues`` entry (None for NULL or the empty string).

    Timestamps come back as UTC-aware datetimes (naive for timestamp_ntz); both the protocol's
    ``YYYY-MM-DD HH:MM:SS[.ffffff]`` and the ISO form ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z`` are read.
    """
    if text is None or text == "":
        return None
    if isinstance(spark_type, StringType):
        return text
    if isinstance(spark_type, BooleanType):
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise ValueError(f"partition value {text!r} is not a boolean")
        return lowered == "true"
    if isinstance(spark_type, _INTEGRAL):
        return int(text)
    if isinstance(spark_type, (FloatType, DoubleType)):
        return float(text)  # also reads Spark's "NaN", "Infinity", "-Infinity"
    if isinstance(spark_type, DecimalType):
        return Decimal(text)
    if isinstance(spark_type, DateType):
        return dt.date.fromisoformat(text)
    if isinstance(spark_type, (TimestampType, TimestampNTZType)):
        return _parse_timestamp(text, zoned=isinstance(spark_type, TimestampType))
    if isinstance(spark_type, BinaryType):
        return text.encode("utf-8")
    raise TypeError(f"type {spark_type.simpleString()} cannot be a Delta partition column")


def escape_path_name(name: str) -> str:
    """Spark's ``escapePathName``: ``%XX`` for the characters a Hive directory name cannot hold."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in name)


def unescape_path_name(name: str) -> str:
    """Inverse of :func:`escape_path_name` (Spark's ``unescapePathName``)."""
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), name)


def partition_directory(partition_columns: Sequence[str], values: Mapping[str, str | None]) -> str:
    """The relative directory ``col=value/...`` for serialized partition ``values`` (no trailing slash)."""
    parts = []
    for column in partition_columns:
        text = values.get(column)
        shown = HIVE_DEFAULT_PARTITION if text is None else escape_path_name(text)
        parts.append(f"{escape_path_name(column)}={shown}")
    return "/".join(parts)


def encode_add_path(relative_path: str) -> str:
    """``add.path`` for a file at ``relative_path`` (real characters, ``/``-separated) under the root.

    Byte for byte what deltalake writes to the log when it commits an ``AddAction`` (measured on
    1.6.6): RFC 3986 path characters stay, except ``*``; everything else is ``%XX`` of its UTF-8
    bytes. So the ``%`` of a Hive escape becomes ``%25`` (``p=a%3Db`` -> ``p=a%253Db``) and a space
    ``%20``; one URI decode gives the name back. Note that deltalake's ``AddAction`` /
    ``RemoveAction`` take the decoded path (:func:`decode_add_path`) and encode it themselves.
    """
    return quote(relative_path, safe="/!$&'()+,:;=@")


def decode_add_path(add_path: str) -> str:
    """The relative path (real characters) that a relative ``add.path`` names."""
    return unquote(add_path)


def _require(value: Any, kind: type | tuple[type, ...], spark_type: DataType) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"partition value {value!r} does not fit type {spark_type.simpleString()}")
    return value


def _format_timestamp(s: dt.datetime) -> str:
    # Not strftime: %Y does not zero-pad years before 1000.
    return (f"{s.year:04d}-{s.month:02d}-{s.day:02d} "
            f"{s.hour:02d}:{s.minute:02d}:{s.second:02d}.{s.microsecond:06d}")


def _parse_timestamp(text: str, *, zoned: bool) -> dt.datetime:
    match = _TIMESTAMP.match(text.strip())
    if match is None:
        raise ValueError(f"partition value {text!r} is not a timestamp")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    stamp = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micros)
    if not zoned:
        if zone not in (None, "Z"):
            raise ValueError(f"partition value {text!r} has a time zone; timestamp_ntz has none")
        return stamp
    if zone not in (None, "Z"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        stamp -= sign * offset
    return stamp.replace(tzinfo=_UTC)
