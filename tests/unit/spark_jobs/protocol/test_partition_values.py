"""Partition value text and Hive/add.path encoding, checked against PROTOCOL.md and delta-rs itself."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
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
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs.delta_merge.protocol.partition_values import (
    HIVE_DEFAULT_PARTITION,
    decode_add_path,
    encode_add_path,
    escape_path_name,
    parse_partition_value,
    partition_directory,
    serialize_partition_value,
    unescape_path_name,
)

UTC = dt.timezone.utc
TRICKY = ["a b", "x=y", "50%", "a/b", "héllo", "ü€😀", "c:d", "q?#", '{}[]^*<>|\\"', "+&'", "%2F",
          "tab\tnl\n"]

ROUND_TRIPS: list[tuple[DataType, Any, str]] = [
    (StringType(), "a b=c%/é", "a b=c%/é"),
    (BooleanType(), True, "true"),
    (BooleanType(), False, "false"),
    (ByteType(), -7, "-7"),
    (ShortType(), 300, "300"),
    (IntegerType(), -2147483648, "-2147483648"),
    (LongType(), 9223372036854775807, "9223372036854775807"),
    (DoubleType(), 1.5, "1.5"),
    (DoubleType(), float("inf"), "Infinity"),
    (FloatType(), -float("inf"), "-Infinity"),
    (DecimalType(5, 2), Decimal("1.50"), "1.50"),
    (DecimalType(38, 2), Decimal("-123456789012345678901234567890123456.78"),
     "-123456789012345678901234567890123456.78"),
    (DateType(), dt.date(2024, 2, 29), "2024-02-29"),
    (DateType(), dt.date(1, 1, 1), "0001-01-01"),
    (TimestampType(), dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC), "2024-01-02 03:04:05.123456"),
    (TimestampType(), dt.datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC), "0999-01-02 03:04:05.000000"),
    (TimestampNTZType(), dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02 03:04:05.000000"),
    (BinaryType(), b"ab\x01", "ab\x01"),
]


@pytest.mark.parametrize(("spark_type", "value", "text"), ROUND_TRIPS)
def test_serialize_and_parse_round_trip(spark_type: DataType, value: Any, text: str) -> None:
    assert serialize_partition_value(value, spark_type) == text
    assert parse_partition_value(text, spark_type) == value


@pytest.mark.parametrize("spark_type", [StringType(), IntegerType(), DateType(), TimestampType(),
                                        BinaryType()])
def test_null_and_empty_are_null(spark_type: DataType) -> None:
    assert serialize_partition_value(None, spark_type) is None
    assert parse_partition_value(None, spark_type) is None
    assert parse_partition_value("", spark_type) is None  # PROTOCOL.md: empty string means NULL


def test_empty_string_and_binary_serialize_as_null() -> None:
    # A "" partition value would read back as NULL, so it is written as NULL (Spark's Empty2Null).
    assert serialize_partition_value("", StringType()) is None
    assert serialize_partition_value(b"", BinaryType()) is None


def test_nan_serializes_as_spark_spells_it() -> None:
    assert serialize_partition_value(float("nan"), DoubleType()) == "NaN"
    assert str(parse_partition_value("NaN", DoubleType())) == "nan"


def test_zoned_timestamps_are_written_in_utc() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    value = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=plus_two)
    assert serialize_partition_value(value, TimestampType()) == "2024-01-02 01:04:05.000000"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-02 03:04:05", dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2024-01-02 03:04:05.1", dt.datetime(2024, 1, 2, 3, 4, 5, 100000, tzinfo=UTC)),
        ("2024-01-02T03:04:05.123456Z", dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        ("2024-01-02T03:04:05.123456789Z", dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        ("2024-01-02T05:04:05+02:00", dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ],
)
def test_parse_timestamp_forms(text: str, expected: dt.datetime) -> None:
    assert parse_partition_value(text, TimestampType()) == expected


def test_parse_timestamp_ntz_forms() -> None:
    expected = dt.datetime(2024, 1, 2, 3, 4, 5, 120000)
    assert parse_partition_value("2024-01-02 03:04:05.12", TimestampNTZType()) == expected
    assert parse_partition_value("2024-01-02T03:04:05.12", TimestampNTZType()) == expected
    with pytest.raises(ValueError, match="time zone"):
        parse_partition_value("2024-01-02T03:04:05+01:00", TimestampNTZType())


@pytest.mark.parametrize(
    ("value", "spark_type", "error"),
    [
        (b"\xff\xfe", BinaryType(), ValueError),  # not UTF-8: no reader would get the bytes back
        ("1", IntegerType(), TypeError),
        (True, IntegerType(), TypeError),
        (dt.datetime(2024, 1, 1), DateType(), TypeError),
        (dt.datetime(2024, 1, 1, tzinfo=UTC), TimestampNTZType(), TypeError),
        ([1], ArrayType(IntegerType()), TypeError),
    ],
)
def test_serialize_rejects_what_delta_cannot_hold(value: Any, spark_type: DataType, error: type) -> None:
    with pytest.raises(error):
        serialize_partition_value(value, spark_type)


def test_escape_path_name_is_sparks_set() -> None:
    # The set ExternalCatalogUtils.escapePathName escapes in Spark 4.3 (probed through the JVM), plus NUL.
    spark_escaped = "".join(chr(c) for c in range(0x01, 0x20)) + "\"#%'*/:=?[\\]^{\x7f"
    for c in map(chr, range(0x100)):
        expected = f"%{ord(c):02X}" if c in spark_escaped or c == "\x00" else c
        assert escape_path_name(c) == expected, repr(c)
    assert escape_path_name("a b/é%😀") == "a b%2Fé%25😀"  # what the JVM returns for the same input


@given(st.text())
def test_unescape_inverts_escape(text: str) -> None:
    assert unescape_path_name(escape_path_name(text)) == text


@given(st.text())
def test_decode_inverts_encode(text: str) -> None:
    assert decode_add_path(encode_add_path(text)) == text


def test_partition_directory() -> None:
    values = {"p": "a/b=c", "d": None, "e": "x y"}
    assert partition_directory(["p", "d", "e"], values) == f"p=a%2Fb%3Dc/d={HIVE_DEFAULT_PARTITION}/e=x y"
    assert partition_directory(["a=b"], {"a=b": "1"}) == "a%3Db=1"
    assert partition_directory([], {}) == ""


def test_add_path_encoding() -> None:
    assert encode_add_path("p=a%3Db/part-0.parquet") == "p=a%253Db/part-0.parquet"
    assert encode_add_path("p=a b/f") == "p=a%20b/f"
    assert encode_add_path("p=é+*/f") == "p=%C3%A9+%2A/f"


def _delta_rs_adds(root: Path) -> list[dict[str, Any]]:
    adds = []
    for log in sorted((root / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds.append(action["add"])
    return adds


def test_matches_what_delta_rs_writes(tmp_path: Path) -> None:
    """delta-rs is the reader and committer here: our texts and add.path encoding must be its own."""
    from deltalake import write_deltalake

    n = len(TRICKY) + 1
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "s": pa.array([*TRICKY, None], pa.string()),
        "d": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)], pa.date32()),
        "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, i * 1000, tzinfo=UTC) for i in range(n)],
                       pa.timestamp("us", "UTC")),
        "ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 7) for _ in range(n)], pa.timestamp("us")),
        "b": pa.array([i % 2 == 0 for i in range(n)]),
        "i": pa.array([i - 3 for i in range(n)], pa.int32()),
        # delta-rs 1.6.6 cannot read back negative decimals with a fraction ("-1.25" -> "-1.-25").
        "dec": pa.array([Decimal(i) / 4 for i in range(n)], pa.decimal128(6, 2)),
    })
    columns = ["s", "d", "ts", "ntz", "b", "i", "dec"]
    types = [StringType(), DateType(), TimestampType(), TimestampNTZType(), BooleanType(), IntegerType(),
             DecimalType(6, 2)]
    write_deltalake(str(tmp_path), table, partition_by=columns)
    by_id = {row["id"]: row for row in table.to_pylist()}
    adds = _delta_rs_adds(tmp_path)
    assert len(adds) == n
    for add in adds:
        # The directory delta-rs chose, encoded our way, is exactly its add.path.
        assert encode_add_path(decode_add_path(add["path"])) == add["path"]
        values = add["partitionValues"]
        row = next(r for r in by_id.values() if all(
            serialize_partition_value(r[c], t) == values[c] for c, t in zip(columns, types, strict=True)))
        for column, spark_type in zip(columns, types, strict=True):
            assert parse_partition_value(values[column], spark_type) == row[column]
