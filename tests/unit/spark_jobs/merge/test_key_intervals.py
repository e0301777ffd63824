"""Which pieces of the target files' key intervals hold a source key (key_intervals), without Spark."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from spark_jobs.delta_merge.merge.key_intervals import intervals_marked, mark_pieces, merge_marks


def held(
    intervals: Sequence[tuple[Any, Any]], *batches_of_keys: list[Any], arrow_type: pa.DataType | None = None
) -> list[bool]:
    """Which of ``intervals`` hold one of the keys, each list of keys being one Spark task's batch."""
    endpoints = [sorted({v for interval in intervals for v in interval if v is not None})]
    rows: list[tuple[int, bytes]] = []
    for keys in batches_of_keys:
        batch = pa.RecordBatch.from_arrays([pa.array(keys, arrow_type or pa.int64())], names=["k"])
        for out in mark_pieces(endpoints, iter([batch])):
            rows += list(zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True))
    (marks,) = merge_marks(rows, endpoints)
    return intervals_marked(marks, endpoints[0], intervals)


def test_keys_mark_the_intervals_they_fall_in_and_not_those_between() -> None:
    files = [(0, 9), (10, 19), (20, 29), (30, 39)]
    assert held(files, [3, 25]) == [True, False, True, False]
    assert held(files, [100, -5]) == [False, False, False, False]
    assert held(files, [None, 10]) == [False, True, False, False]  # NULL keys match nothing


def test_endpoints_themselves_and_gaps_between_files() -> None:
    files = [(0, 9), (20, 29)]
    assert held(files, [9]) == [True, False]
    assert held(files, [20]) == [False, True]
    assert held(files, [15]) == [False, False]  # in the gap between the files


def test_overlapping_and_unbounded_intervals() -> None:
    files = [(0, 50), (10, 20), (40, None), (None, -1)]
    assert held(files, [15]) == [True, True, False, False]
    assert held(files, [45]) == [True, False, True, False]
    assert held(files, [1000]) == [False, False, True, False]
    assert held(files, [-7]) == [False, False, False, True]
    assert held([(None, None)], [1]) == [True]


def test_marks_of_several_tasks_add_up() -> None:
    files = [(0, 9), (10, 19), (20, 29)]
    assert held(files, [1], [], [22]) == [True, False, True]


def test_string_and_date_keys() -> None:
    files = [("a", "b"), ("m", "n")]
    assert held(files, ["a'b", "z"], arrow_type=pa.string()) == [True, False]
    assert held(files, ["n"], arrow_type=pa.large_string()) == [False, True]
    # Dates compare as days since 1970-01-01, as the statistics are given.
    day = dt.date(2024, 1, 10)
    days = (day - dt.date(1970, 1, 1)).days
    assert held([(days - 5, days - 1), (days, days + 5)], [day], arrow_type=pa.date32()) == [False, True]
