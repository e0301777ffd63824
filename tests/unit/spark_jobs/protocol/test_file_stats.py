"""Delta file statistics from Arrow data: which columns, which bounds, and that bounds really bound."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.delta_merge.protocol.file_stats import (
    FileStatsCollector,
    indexed_leaves,
    split_column_name,
    truncate_max_string,
    truncate_min_string,
)

UTC = dt.timezone.utc
MAX_CHAR = "\U0010ffff"


def _stats(table: pa.Table, **options: Any) -> dict[str, Any]:
    collector = FileStatsCollector(indexed_leaves(table.schema, **options))
    collector.update(table)
    parsed: dict[str, Any] = json.loads(collector.to_json(), parse_float=Decimal)
    return parsed


NESTED = pa.schema([
    ("a", pa.int64()),
    ("s", pa.struct([("x", pa.int32()), ("t", pa.struct([("y", pa.string()), ("z", pa.float64())]))])),
    ("arr", pa.list_(pa.int64())),
    ("m", pa.map_(pa.string(), pa.int64())),
    ("b", pa.bool_()),
])


@pytest.mark.parametrize(
    ("num_indexed_cols", "paths"),
    [
        (0, []),
        (1, [("a",)]),
        (2, [("a",), ("s", "x")]),
        (3, [("a",), ("s", "x"), ("s", "t", "y")]),
        (5, [("a",), ("s", "x"), ("s", "t", "y"), ("s", "t", "z"), ("arr",)]),
        (32, [("a",), ("s", "x"), ("s", "t", "y"), ("s", "t", "z"), ("arr",), ("m",), ("b",)]),
        (-1, [("a",), ("s", "x"), ("s", "t", "y"), ("s", "t", "z"), ("arr",), ("m",), ("b",)]),
    ],
)
def test_num_indexed_cols_counts_leaves(num_indexed_cols: int, paths: list[tuple[str, ...]]) -> None:
    leaves = indexed_leaves(NESTED, num_indexed_cols=num_indexed_cols)
    assert [leaf.path for leaf in leaves] == paths


def test_stats_columns_win_and_match_like_delta() -> None:
    leaves = indexed_leaves(NESTED, num_indexed_cols=1, stats_columns=["B", "s.T", "nope", "a.x"])
    # Schema order; case-insensitive; a struct takes all its leaves; unknown names are ignored.
    assert [leaf.path for leaf in leaves] == [("s", "t", "y"), ("s", "t", "z"), ("b",)]
    assert indexed_leaves(NESTED, stats_columns=[]) == ()


def test_split_column_name() -> None:
    assert split_column_name("a.b") == ["a", "b"]
    assert split_column_name("`a.b`.c") == ["a.b", "c"]
    assert split_column_name("`x``y` ") == ["x`y"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a" * 32, "a" * 32),
        ("a" * 33, "a" * 32 + "\x7f"),
        ("a" * 32 + "é", "a" * 32 + MAX_CHAR),
        ("a" * 32 + "\x7f", "a" * 32 + MAX_CHAR),
        ("a" * 32 + MAX_CHAR * 2 + "b", "a" * 32 + MAX_CHAR * 2 + "\x7f"),
        ("a" * 32 + MAX_CHAR * 2, "a" * 32 + MAX_CHAR * 2),
        ("a" * 32 + MAX_CHAR * 40, None),
    ],
)
def test_truncate_max_string_is_deltas(value: str, expected: str | None) -> None:
    assert truncate_max_string(value) == expected
    if expected is not None:
        assert value <= expected  # code point order is UTF-8 byte order


def test_truncate_min_string() -> None:
    assert truncate_min_string("é" * 40) == "é" * 32


def test_all_types_to_exact_json() -> None:
    table = pa.table({
        "i8": pa.array([1, -2, None], pa.int8()),
        "f": pa.array([1.5, -0.25, None], pa.float32()),
        "dec": pa.array([Decimal("12345678901234567890123456789012345.67"), Decimal("-0.01"), None],
                        pa.decimal128(38, 2)),
        "s": pa.array(["b", "a" * 40, None]),
        "d": pa.array([dt.date(2024, 1, 2), dt.date(1969, 12, 31), None], pa.date32()),
        "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
                        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), None],
                       pa.timestamp("us", "UTC")),
        "ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 123000), None, None], pa.timestamp("us")),
        "b": pa.array([True, None, None]),
        "bin": pa.array([b"x", None, None]),
        "st": pa.array([{"x": 1}, None, {"x": None}], pa.struct([("x", pa.int64())])),
        "arr": pa.array([[1], None, None], pa.list_(pa.int64())),
        "allnull": pa.array([None, None, None], pa.int64()),
    })
    collector = FileStatsCollector(indexed_leaves(table.schema))
    collector.update(table)
    assert collector.to_json() == (
        '{"numRecords":3,'
        '"minValues":{"i8":-2,"f":-0.25,"dec":-0.01,"s":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","d":"1969-12-31",'
        '"ts":"1969-12-31T23:59:59.999Z","ntz":"2024-01-02T03:04:05.123","st":{"x":1}},'
        '"maxValues":{"i8":1,"f":1.5,"dec":12345678901234567890123456789012345.67,"s":"b","d":"2024-01-02",'
        '"ts":"2024-01-02T03:04:05.124Z","ntz":"2024-01-02T03:04:05.123","st":{"x":1}},'
        '"nullCount":{"i8":1,"f":1,"dec":1,"s":1,"d":1,"ts":1,"ntz":2,"b":2,"bin":2,"st":{"x":2},"arr":2,'
        '"allnull":3}}'
    )


def test_nan_and_infinity_drop_bounds_not_null_counts() -> None:
    table = pa.table({
        "nan": pa.array([1.0, math.nan, None]),
        "inf": pa.array([1.0, math.inf, None]),
    })
    stats = _stats(table)
    assert stats["minValues"] == {"inf": Decimal("1.0")}  # max is +inf: JSON has no such number
    assert "maxValues" not in stats
    assert stats["nullCount"] == {"nan": 1, "inf": 1}


def test_chunks_merge_and_partition_free_schema() -> None:
    collector = FileStatsCollector(indexed_leaves(pa.schema([("x", pa.int64())])))
    collector.update(pa.table({"x": [5, 7]}))
    collector.update(pa.record_batch({"x": pa.array([None, 2], pa.int64())}))
    collector.update(pa.table({"x": pa.chunked_array([[9], [None]], pa.int64())}))
    assert json.loads(collector.to_json()) == {
        "numRecords": 6, "minValues": {"x": 2}, "maxValues": {"x": 9}, "nullCount": {"x": 2}}


def test_no_indexed_columns_keeps_num_records() -> None:
    assert _stats(pa.table({"x": [1]}), num_indexed_cols=0) == {"numRecords": 1}


# --- bounds really bound: random data, random chunking ---------------------------------------------

_CHARS = ["a", "b", "\x7e", "\x7f", "é", "\uffff", MAX_CHAR, "😀"]
_TEXT = st.text(alphabet=st.sampled_from(_CHARS), max_size=40)
_ROWS = st.lists(
    st.tuples(
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | st.floats(allow_nan=True, allow_infinity=True),
        st.none() | _TEXT,
        st.none() | st.integers(-(10**17), 10**17),  # timestamp micros
        st.none() | st.tuples(st.none() | st.integers(-5, 5)),
        st.none() | st.decimals(min_value=Decimal("-1e30"), max_value=Decimal("1e30"), places=3),
    ),
    min_size=1, max_size=60,
)


def _ms(text: str) -> int:
    stamp = dt.datetime.fromisoformat(text.rstrip("Z"))
    return (stamp - dt.datetime(1970, 1, 1)) // dt.timedelta(milliseconds=1)


@settings(max_examples=100, deadline=None)
@given(_ROWS, st.integers(1, 7))
def test_bounds_bound_random_data(rows: list[tuple[Any, ...]], chunk: int) -> None:
    schema = pa.schema([("i", pa.int64()), ("f", pa.float64()), ("s", pa.string()),
                        ("ts", pa.timestamp("us", "UTC")), ("st", pa.struct([("x", pa.int8())])),
                        ("dec", pa.decimal128(38, 3))])
    columns = list(zip(*rows, strict=True))
    table = pa.table({
        "i": pa.array(columns[0], pa.int64()), "f": pa.array(columns[1], pa.float64()),
        "s": pa.array(columns[2], pa.string()),
        "ts": pa.array(columns[3], pa.int64()).cast(schema.field("ts").type),
        "st": pa.array([None if v is None else {"x": v[0]} for v in columns[4]], schema.field("st").type),
        "dec": pa.array(columns[5], pa.decimal128(38, 3)),
    })
    collector = FileStatsCollector(indexed_leaves(schema))
    for offset in range(0, len(table), chunk):
        collector.update(table.slice(offset, chunk))
    text = collector.to_json()
    stats = json.loads(text)
    assert stats["numRecords"] == len(rows)
    low, high, nulls = stats.get("minValues", {}), stats.get("maxValues", {}), stats["nullCount"]
    exact = json.loads(text, parse_float=Decimal)  # decimals compared digit for digit
    for bounds, exact_bounds in ((low, exact.get("minValues", {})), (high, exact.get("maxValues", {}))):
        if "dec" in exact_bounds:
            bounds["dec"] = exact_bounds["dec"]
    values = {
        "i": [v for v in columns[0] if v is not None],
        "f": [v for v in columns[1] if v is not None],
        "s": [v for v in columns[2] if v is not None],
        "ts": [v // 1000 for v in columns[3] if v is not None],  # millis, floored
        "dec": [v for v in columns[5] if v is not None],
    }
    for name, present in values.items():
        assert nulls[name] == len(rows) - len(present)
        lo, hi = low.get(name), high.get(name)
        if name == "ts":
            lo, hi = (None if lo is None else _ms(lo)), (None if hi is None else _ms(hi))
            present = present + [-(-v // 1000) for v in columns[3] if v is not None]  # and ceilinged
        if name == "f" and any(math.isnan(v) for v in present):
            assert lo is None
            assert hi is None
            continue
        if present and name in ("i", "dec"):
            # Strings may lose the max, floats an infinite bound, timestamps one outside year 1-9999.
            assert lo is not None
            assert hi is not None
        for v in present:
            assert lo is None or lo <= v, (name, lo, v)
            assert hi is None or v <= hi, (name, hi, v)
    struct_values = [None if v is None else v[0] for v in columns[4]]
    assert nulls["st"]["x"] == sum(v is None for v in struct_values)
    for v in (v for v in struct_values if v is not None):
        assert low["st"]["x"] <= v <= high["st"]["x"]
