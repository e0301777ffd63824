"""Merge-on-read without NOT MATCHED BY SOURCE joins the source with the touched files' rows (inner) and the
source with the matched target rows (anti, for inserts), and applies the files' deletion vectors, file keys
and stable row ids to the joined pairs rather than to every scanned row. These tests pin what that must
keep: a deleted row never matches, a clause still sees every target column it names, and Delta's rules on
several source rows matching one target row hold. Every table is read back by deltalake and DuckDB."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from spark_jobs.delta_merge.errors import MultipleSourceRowMatchesError
from spark_jobs.delta_merge.protocol.column_mapping import mapping_mode
from spark_jobs.delta_merge.protocol.snapshot import TableProtocol, load_snapshot
from spark_jobs.delta_merge.source.materialize import SOURCE_ROW_ID_COLUMN, SourceRead, materialize_source
from spark_jobs.delta_merge.spec import MergeOptions
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.unit.spark_jobs.merge.test_merge_on_read import ENABLED, UPSERT, dv_table, rows, vector_rows
from tests.unit.spark_jobs.merge.test_merge_on_read_safety import changes
from tests.unit.spark_jobs.test_pipeline import kv, live_files, merge, parquet_source

WIDE = pa.schema([("id", pa.int64()), ("v", pa.string()), ("w", pa.int64())])


def wide_rows(path: Path) -> list[tuple[Any, ...]]:
    found = sorted(tuple(r) for r in read_rows(path, columns=WIDE.names))
    assert sorted(tuple(r) for r in read_rows_with_kernel(path, columns=WIDE.names)) == found
    return found


# A materialized source (auto, for a Parquet source) carries row ids: the inserts are the source rows the
# touched-files scan did not match. Without materialization they come from an anti join with the matched rows.
@pytest.mark.parametrize("materialize", ["auto", "none"])
def test_rows_deleted_by_a_vector_match_nothing_even_when_two_source_rows_name_them(
    spark: Any, tmp_path: Path, materialize: str
) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=10)
    merge(spark, target, parquet_source(tmp_path / "s1", kv([(5, "delete"), (15, "delete")])), UPSERT)
    assert all("deletionVector" in f for f in live_files(target).values())

    # Two source rows for the deleted id 5 would be a multiple match if the hidden row still joined.
    source = kv([(5, "back-a"), (5, "back-b"), (6, "six"), (15, "back15")])
    source_dir = parquet_source(tmp_path / "s2", source)
    metrics = merge(spark, target, source_dir, UPSERT, materialize_source=materialize)

    assert metrics["materializeSourceReason"] == (
        "NON_DETERMINISTIC_SOURCE_NON_DELTA" if materialize == "auto" else "NOT_MATERIALIZED_NONE"
    )
    assert (metrics["numTargetRowsInserted"], metrics["numTargetRowsUpdated"]) == (3, 1)
    # Each source row counted once in each scan, whichever way the inserts are found.
    assert (metrics["numSourceRows"], metrics["numSourceRowsInSecondScan"]) == (4, 4)
    assert metrics["numTargetDeletionVectorsUpdated"] == 1  # only file 0 had a matched row (id 6)
    expected = sorted(
        [(i, f"v{i}") for i in range(20) if i not in (5, 6, 15)]
        + [(5, "back-a"), (5, "back-b"), (6, "six"), (15, "back15")]
    )
    assert rows(target) == expected


@pytest.mark.parametrize("materialize", ["auto", "none"])
def test_clauses_see_the_target_columns_they_name_and_unassigned_columns_keep_their_values(
    spark: Any, tmp_path: Path, materialize: str
) -> None:
    target = tmp_path / "t"
    table = pa.Table.from_pylist([{"id": i, "v": f"v{i}", "w": i * 10} for i in range(8)], schema=WIDE)
    write_deltalake(str(target), table, configuration=ENABLED)
    source = kv([(1, "a"), (2, "b"), (3, "c"), (100, "n")])
    sql = """MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED AND t.w >= 20 AND t.v <> 'v3' THEN UPDATE SET v = concat(t.v, '+', s.v)
        WHEN MATCHED AND t.w < 20 THEN DELETE
        WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"""

    metrics = merge(spark, target, parquet_source(tmp_path / "s", source), sql,
                    materialize_source=materialize)  # fmt: skip

    # id 1 deleted (w 10); id 2 updated, w kept; id 3 matched but no clause acts: stays where it was.
    assert (metrics["numTargetRowsDeleted"], metrics["numTargetRowsUpdated"]) == (1, 1)
    assert (metrics["numTargetRowsInserted"], metrics["numTargetRowsCopied"]) == (1, 0)
    assert metrics["numTargetDeletionVectorsAdded"] == 1
    unchanged = [(i, f"v{i}", i * 10) for i in range(3, 8)]
    assert wide_rows(target) == [(0, "v0", 0), (2, "v2+b", 20), *unchanged, (100, "n", None)]


def test_a_target_row_deleted_by_several_source_rows_is_one_delete_change(spark: Any, tmp_path: Path) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=5, **{"delta.enableChangeDataFeed": "true"})
    source = kv([(1, "x"), (1, "y"), (7, "z"), (99, "none")])

    metrics = merge(spark, target, parquet_source(tmp_path / "s", source),
                    "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE")  # fmt: skip

    assert metrics["numTargetRowsDeleted"] == 2  # target rows, not joined pairs
    assert metrics["numTargetDeletionVectorsAdded"] == 2
    assert changes(target, 2) == [(1, "v1", "delete"), (7, "v7", "delete")]
    assert rows(target) == [(i, f"v{i}") for i in range(10) if i not in (1, 7)]


def test_two_source_rows_updating_one_target_row_fail_before_anything_is_written(
    spark: Any, tmp_path: Path
) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=5)
    files_before = sorted(p.name for p in target.rglob("*") if p.is_file())
    version = DeltaTable(str(target)).version()

    with pytest.raises(MultipleSourceRowMatchesError, match="multiple source rows matched"):
        merge(spark, target, parquet_source(tmp_path / "s", kv([(3, "a"), (3, "b")])), UPSERT)

    assert DeltaTable(str(target)).version() == version
    assert sorted(p.name for p in target.rglob("*") if p.is_file()) == files_before
    assert rows(target) == [(i, f"v{i}") for i in range(10)]


def test_a_mapping_mode_the_protocol_does_not_support_leaves_the_files_with_logical_names(
    spark: Any, tmp_path: Path
) -> None:
    # deltalake creates this table on protocol 3/7 with the deletionVectors feature but not columnMapping:
    # the property has no effect (PROTOCOL.md), and deltalake writes logical names.
    target = tmp_path / "t"
    table = pa.Table.from_pylist([{"id": i, "v": f"v{i}", "w": i} for i in range(4)], schema=WIDE)
    write_deltalake(str(target), table, configuration={**ENABLED, "delta.columnMapping.mode": "name"})
    protocol = DeltaTable(str(target)).protocol()
    assert "columnMapping" not in (protocol.writer_features or [])
    assert load_snapshot(str(target)).column_mapping_mode == "none"

    source = pa.Table.from_pylist([{"id": 1, "v": "x", "w": 10}, {"id": 9, "v": "n", "w": 90}], schema=WIDE)
    metrics = merge(spark, target, parquet_source(tmp_path / "s", source), UPSERT)

    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    # deltalake only: delta-kernel refuses this table as deltalake made it (fields annotated with physical
    # names while column mapping is not enabled), before the merge as after it.
    found = sorted(tuple(r) for r in read_rows(target, columns=WIDE.names))
    assert found == [(0, "v0", 0), (1, "x", 10), (2, "v2", 2), (3, "v3", 3), (9, "n", 90)]
    for data_file in target.glob("*.parquet"):
        assert pq.read_schema(data_file).names == ["id", "v", "w"]


@pytest.mark.parametrize(
    ("writer_version", "writer_features", "supported"),
    [(4, (), False), (5, (), True), (6, (), True), (7, ("deletionVectors",), False),
     (7, ("columnMapping", "deletionVectors"), True)],
)  # fmt: skip
def test_column_mapping_takes_effect_only_where_the_protocol_supports_it(
    writer_version: int, writer_features: tuple[str, ...], supported: bool
) -> None:
    reader_version = 3 if writer_version == 7 else 2
    protocol = TableProtocol(reader_version, writer_version, frozenset(), frozenset(writer_features))
    assert protocol.supports_column_mapping is supported
    configuration = {"delta.columnMapping.mode": "Name"}
    assert mapping_mode(configuration, supported=protocol.supports_column_mapping) == (
        "name" if supported else "none"
    )


def test_a_materialized_source_is_broadcast_by_its_real_size_unless_broadcasts_are_off(spark: Any) -> None:
    rows = SourceRead(spark.range(1000).withColumn("v", F.col("id") * 2), pinned_delta=False)
    options = MergeOptions()
    materialized = materialize_source(rows, columns=["id", "v"], options=options, insert_only=False)
    try:
        assert materialized.row_id_column == SOURCE_ROW_ID_COLUMN
        assert materialized.df.select(SOURCE_ROW_ID_COLUMN).distinct().count() == 1000
        assert materialized.fits_a_broadcast(spark)
        try:
            # A byte string, read as Spark reads it; below the heap's share, which then decides.
            spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "1KB")
            assert materialized.fits_a_broadcast(spark)
            spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
            assert not materialized.fits_a_broadcast(spark)
        finally:
            spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
    finally:
        materialized.release()
    as_read = MergeOptions(materialize_source="none")
    kept_as_read = materialize_source(rows, columns=["id", "v"], options=as_read, insert_only=False)
    assert (kept_as_read.row_id_column, kept_as_read.fits_a_broadcast(spark)) == (None, False)
    assert kept_as_read.df.columns == ["id", "v"]


# A broadcast join names a joined row's file with input_file_name() in the task that read it; a shuffled
# join carries `_metadata.file_path` on every row. Both must give the file key of the log's path, under a
# root whose URI is percent-encoded (not with a "%" itself: DuckDB's delta extension cannot open such a path).
@pytest.mark.parametrize("broadcasts", ["on", "off"])
def test_matched_rows_are_marked_in_their_own_files_whether_the_join_is_broadcast_or_not(
    spark: Any, tmp_path: Path, broadcasts: str
) -> None:
    target = dv_table(tmp_path / "root with space, + and ü" / "t", files=3, per_file=5)
    source = parquet_source(tmp_path / "s", kv([(1, "a"), (7, "delete"), (13, "c"), (99, "n")]))
    try:
        if broadcasts == "off":
            spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
        metrics = merge(spark, target, source, UPSERT)
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")

    assert metrics["numTargetDeletionVectorsAdded"] == 3
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"]) == (2, 1)
    marked = {}
    for add in live_files(target).values():
        if "deletionVector" in add:
            first_id = pq.read_table(target / unquote(add["path"]), columns=["id"])["id"][0].as_py()
            marked[first_id] = vector_rows(target, add["deletionVector"])
    assert marked == {0: [1], 5: [2], 10: [3]}  # ids 1, 7 and 13: the row index within each file
    assert rows(target) == sorted(
        [(i, f"v{i}") for i in range(15) if i not in (1, 7, 13)] + [(1, "a"), (13, "c"), (99, "n")]
    )
