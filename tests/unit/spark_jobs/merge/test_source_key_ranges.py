"""The join reads only the target files the source's key ranges can match (source_key_ranges)."""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType

from spark_jobs.delta_merge.merge.source_key_ranges import join_keys
from tests.unit.spark_jobs.test_pipeline import (
    kv,
    live_files,
    make_target,
    merge,
    parquet_source,
    sorted_rows,
)

TARGET = StructType([
    StructField("id", LongType()), StructField("v", StringType()), StructField("d", DateType()),
])
SOURCE = StructType([
    StructField("key", LongType()), StructField("v", StringType()), StructField("d", StringType()),
])
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
INSERT = "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *"


def keys(condition: str) -> list[tuple[str, str]]:
    return join_keys(condition, target_alias="t", source_alias="s",
                     target_schema=TARGET, source_schema=SOURCE)  # fmt: skip


def test_equi_join_keys_of_the_condition() -> None:
    assert keys("t.id = s.key") == [("id", "key")]
    assert keys("(s.KEY = t.ID) AND t.v = 'x'") == [("id", "key")]
    assert keys("t.id = s.key AND t.v = s.v AND t.id > 0") == [("id", "key"), ("v", "v")]
    # Unqualified names that only one side has.
    assert keys("id = key") == [("id", "key")]


@pytest.mark.parametrize("condition", [
    "t.id = s.key OR t.v = s.v",  # a disjunction bounds nothing
    "t.id = s.key + 1",  # an expression, not a column
    "t.d = s.d",  # date against string: compared after a cast
    "t.id <=> s.key",  # NULL-safe: NULL keys match
    "t.v = t.v",  # one side only
    "v = s.v",  # ambiguous: both sides have v
])  # fmt: skip
def test_what_bounds_no_key(condition: str) -> None:
    assert keys(condition) == []


def _joinable(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    pattern = re.compile(r"(\d+) of (\d+) candidate files may hold keys")
    found = [pattern.search(r.getMessage()) for r in caplog.records]
    (match,) = [m for m in found if m]
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(autouse=True)
def key_ranges_on_small_tables(request: pytest.FixtureRequest) -> Iterator[None]:
    """The tables here are far below the default size from which key ranges prune."""
    if "spark" not in request.fixturenames:
        yield
        return
    from spark_jobs.delta_merge.merge.source_key_ranges import KEY_RANGES_CONF

    spark = request.getfixturevalue("spark")
    spark.conf.set(KEY_RANGES_CONF, "0")
    yield
    spark.conf.unset(KEY_RANGES_CONF)


@pytest.fixture
def three_files(tmp_path: Path) -> Path:
    """ids 0-9, 10-19 and 20-29, one file each."""
    return make_target(tmp_path / "t", *[kv([(i, f"v{i}") for i in range(k, k + 10)]) for k in (0, 10, 20)])
def test_an_upsert_joins_only_the_files_its_keys_fall_in(
    spark: Any, three_files: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = parquet_source(tmp_path / "s", kv([(12, "new"), (15, "new"), (None, "null key")]))
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, three_files, source, UPSERT)

    assert _joinable(caplog) == (1, 3)
    # The metrics and the conflict check still count the files Delta's skipping leaves.
    assert (metrics["numTargetFilesAfterSkipping"], metrics["numTargetFilesRemoved"]) == (3, 1)
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 1)
    rows = sorted_rows(three_files)
    assert len(rows) == 31
    assert (12, "new") in rows
    assert (None, "null key") in rows
def test_an_insert_only_merge_of_new_keys_reads_no_target_file(
    spark: Any, three_files: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = live_files(three_files)
    source = parquet_source(tmp_path / "s", kv([(100, "a"), (101, "b")]))
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, three_files, source, INSERT)
    assert _joinable(caplog) == (0, 3)
    assert metrics["numTargetRowsInserted"] == 2
    assert set(before) <= set(live_files(three_files))
    # Keys that overlap the table's range are joined, and an existing key is not inserted again.
    caplog.clear()
    source = parquet_source(tmp_path / "s2", kv([(9, "dup"), (10, "dup"), (200, "c")]))
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, three_files, source, INSERT)
    # The first merge added a file (ids 100-101); keys 9 and 10 fall in the first two files, 200 in none.
    assert _joinable(caplog) == (2, 4)
    assert metrics["numTargetRowsInserted"] == 1
    assert [r for r in sorted_rows(three_files) if r[1] == "dup"] == []
def test_files_between_the_source_keys_are_skipped(
    spark: Any, three_files: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Keys 3 and 25 span all three files' range, but none falls in the middle file (10-19).
    source = parquet_source(tmp_path / "s", kv([(3, "new"), (25, "new"), (15_000, "far")]))
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, three_files, source, UPSERT)
    assert _joinable(caplog) == (2, 3)
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 1)
    assert (metrics["numTargetFilesAfterSkipping"], metrics["numTargetFilesRemoved"]) == (3, 2)
    rows = sorted_rows(three_files)
    assert len(rows) == 31
    assert {(3, "new"), (25, "new"), (15, "v15"), (15_000, "far")} <= set(rows)
def test_date_keys_bound_the_join(spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    schema = pa.schema([("id", pa.date32()), ("v", pa.string())])
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=n) for n in range(30)]
    target = make_target(tmp_path / "t", *[kv([(d, "old") for d in days[k : k + 10]], schema)
                                           for k in (0, 10, 20)])  # fmt: skip
    source = parquet_source(tmp_path / "s", kv([(days[2], "new"), (days[27], "new")], schema))
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, target, source, UPSERT)
    assert _joinable(caplog) == (2, 3)
    assert metrics["numTargetRowsUpdated"] == 2
    assert [r for r in sorted_rows(target) if r[1] == "new"] == [(days[2], "new"), (days[27], "new")]
def test_a_source_whose_keys_are_all_null_matches_nothing(
    spark: Any, three_files: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = parquet_source(tmp_path / "s", kv([(None, "x"), (None, "y")]))
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, three_files, source, UPSERT)
    assert _joinable(caplog) == (0, 3)
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (0, 2)
    assert len(sorted_rows(three_files)) == 32
def test_small_tables_are_joined_whole_by_default(
    spark: Any, three_files: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from spark_jobs.delta_merge.merge.source_key_ranges import KEY_RANGES_CONF

    spark.conf.unset(KEY_RANGES_CONF)
    source = parquet_source(tmp_path / "s", kv([(12, "new")]))
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, three_files, source, UPSERT)
    assert _joinable(caplog) == (3, 3)
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetFilesRemoved"]) == (1, 1)
def test_string_keys_bound_the_join(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    schema = pa.schema([("id", pa.string()), ("v", pa.string())])
    target = make_target(tmp_path / "t", kv([("a", "1"), ("b", "2")], schema),
                         kv([("m", "3"), ("n", "4")], schema))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        merge(spark, target, parquet_source(tmp_path / "s", kv([("n", "N")], schema)), UPSERT)
    assert _joinable(caplog) == (1, 2)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        merge(spark, target, parquet_source(tmp_path / "s2", kv([("a'b", "Q"), ("b", "B")], schema)), UPSERT)
    assert _joinable(caplog) == (1, 2)  # between "a" and "b": the first file only
    assert sorted_rows(target) == [("a", "1"), ("a'b", "Q"), ("b", "B"), ("m", "3"), ("n", "N")]
def test_a_key_column_with_a_dot_in_its_name(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    schema = pa.schema([("a.b", pa.int64()), ("v", pa.string())])
    target = make_target(tmp_path / "t", *[kv([(i, "old") for i in range(k, k + 10)], schema)
                                           for k in (0, 10)])  # fmt: skip
    source = parquet_source(tmp_path / "s", kv([(12, "new")], schema))
    statement = UPSERT.replace("t.id = s.id", "t.`a.b` = s.`a.b`")
    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, target, source, statement)
    assert _joinable(caplog) == (1, 2)
    assert metrics["numTargetRowsUpdated"] == 1
    assert (12, "new") in sorted_rows(target)
