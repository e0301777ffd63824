"""Touched files: a task's joined (file, row, acts) pairs counted per target row, then per file
(count_pairs_per_file), and merges whose source is broadcast or shuffled finding the same files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_jobs.delta_merge.errors import MultipleSourceRowMatchesError
from spark_jobs.delta_merge.merge.touched_files import ACTS_COLUMN, count_pairs_per_file
from spark_jobs.delta_merge.scan.table_scan import FILE_KEY_COLUMN, ROW_INDEX_COLUMN
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.unit.spark_jobs.test_pipeline import kv, live_files, make_target, merge, parquet_source


def _pairs(rows: list[tuple[str, int, int]]) -> pa.RecordBatch:
    files, indexes, acts = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(files), pa.array(indexes, pa.int64()), pa.array(acts, pa.int32())],
        names=[FILE_KEY_COLUMN, ROW_INDEX_COLUMN, ACTS_COLUMN],
    )


def test_counts_target_rows_multiple_matches_and_acting_clauses_per_file() -> None:
    batches = [
        _pairs([("a", 0, 1), ("a", 1, 0), ("b", 5, 0)]),
        # Row a/1 is matched again in a later batch of the same task: two pairs of one target row.
        _pairs([("a", 1, 0), ("b", 6, 0), ("b", 5, 0), ("b", 5, 0)]),
    ]
    out = pa.Table.from_batches(list(count_pairs_per_file(iter(batches)))).sort_by(FILE_KEY_COLUMN)
    assert out.to_pylist() == [
        {FILE_KEY_COLUMN: "a", "max_matches": 2, "rows": 2, "acts": 1, "extra_matches": 1},
        {FILE_KEY_COLUMN: "b", "max_matches": 3, "rows": 2, "acts": 0, "extra_matches": 2},
    ]


def test_a_task_without_pairs_yields_nothing() -> None:
    assert list(count_pairs_per_file(iter([]))) == []
    empty = _pairs([("a", 0, 1)]).slice(0, 0)
    assert list(count_pairs_per_file(iter([empty]))) == []


# The same merges, the source broadcast (pairs counted in the tasks that join them) or not (grouped by
# target row with Spark's aggregation): the same touched files, counts and multiple-match error.
UPSERT_SQL = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED AND s.v = 'keep' THEN UPDATE SET v = t.v
WHEN MATCHED AND s.v = 'gone' THEN DELETE
WHEN MATCHED THEN UPDATE SET v = s.v
WHEN NOT MATCHED THEN INSERT *"""


@pytest.fixture(params=["broadcast", "shuffled"])
def broadcasts(request: pytest.FixtureRequest, spark: Any) -> Iterator[str]:
    if request.param == "shuffled":
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        yield str(request.param)
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")


def test_touched_files_and_counts_are_the_same_broadcast_or_shuffled(
    spark: Any, tmp_path: Path, broadcasts: str
) -> None:
    target = make_target(tmp_path / "t", *(kv([(i, f"v{i}") for i in range(f * 10, f * 10 + 10)])
                                           for f in range(4)))  # fmt: skip
    before = set(live_files(target))
    source = parquet_source(tmp_path / "s", kv([(3, "keep"), (14, "gone"), (15, "new"), (99, "in")]))

    metrics = merge(spark, target, source, UPSERT_SQL)

    # Files 0 and 1 hold matches; files 2 and 3 match nothing and stay.
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsCopied"]) == (2, 17)
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"]) == (2, 1)
    assert (metrics["numTargetRowsInserted"], metrics["numSourceRows"]) == (1, 4)
    assert len(before - set(live_files(target))) == 2
    expected = [(i, f"v{i}") for i in range(40) if i != 14]
    expected = sorted([*(r if r[0] != 15 else (15, "new") for r in expected), (99, "in")])
    assert sorted(tuple(r) for r in read_rows(target, columns=["id", "v"])) == expected
    assert sorted(tuple(r) for r in read_rows_with_kernel(target, columns=["id", "v"])) == expected
    by_delta = spark.read.format("delta").load(str(target)).select("id", "v").collect()
    assert sorted(tuple(r) for r in by_delta) == expected


def test_two_source_rows_on_one_target_row_fail_broadcast_or_shuffled(
    spark: Any, tmp_path: Path, broadcasts: str
) -> None:
    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]), kv([(3, "c")]))
    version = table_version(target)
    source = parquet_source(tmp_path / "s", kv([(2, "x"), (3, "y"), (2, "z")]))

    with pytest.raises(MultipleSourceRowMatchesError):
        merge(spark, target, source, UPSERT_SQL)
    assert table_version(target) == version
