"""count_pairs_per_file: a task's joined (file, row, acts) pairs counted per target row, then per file."""

from __future__ import annotations

import pyarrow as pa

from spark_jobs.delta_merge.merge.touched_files import ACTS_COLUMN, count_pairs_per_file
from spark_jobs.delta_merge.scan.table_scan import FILE_KEY_COLUMN, ROW_INDEX_COLUMN


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
