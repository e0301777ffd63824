"""Merges into tables with the change data feed on: ``_change_data/`` files and ``cdc`` actions as Delta's
MergeIntoCommand writes them, read back through deltalake's ``load_cdf`` and DuckDB's Delta extension.

Every merge is checked for the table's rows (two readers), the change rows of its version (``load_cdf``:
exactly the changed rows, none for copied rows), the ``cdc`` actions and their files, and the CDC metrics.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.unit.spark_jobs.test_pipeline import (
    KV,
    check_commit,
    expected_rows,
    kv,
    live_files,
    log_actions,
    merge,
    parquet_source,
    row_metrics,
)

CDF = {"delta.enableChangeDataFeed": "true"}
KVP = pa.schema([("id", pa.int64()), ("v", pa.string()), ("p", pa.string())])
UPSERT = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""


def cdf_target(path: Path, *batches: pa.Table, partition_by: Sequence[str] | None = None) -> Path:
    """A change-data-feed table written by deltalake: one version (and file) per batch."""
    for batch in batches:
        write_deltalake(str(path), batch, mode="append", partition_by=list(partition_by or []) or None,
                        configuration=CDF)
    return path


def table_rows(path: Path) -> list[tuple[Any, ...]]:
    """Live rows through deltalake, checked equal to DuckDB's (delta-kernel), sorted."""
    rows = sorted((tuple(r) for r in read_rows(path)), key=repr)
    names = [f.name for f in DeltaTable(str(path)).schema().fields]
    assert sorted((tuple(r) for r in read_rows_with_kernel(path, columns=names)), key=repr) == rows
    return rows


def changes(path: Path, version: int) -> list[tuple[Any, ...]]:
    """The change rows of one version (``load_cdf``): table columns then ``_change_type``, sorted."""
    feed = DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version)
    table = pa.table(feed.read_all())
    assert set(table.column("_commit_version").to_pylist()) <= {version}
    names = [n for n in table.column_names if n not in ("_commit_version", "_commit_timestamp")]
    assert "_change_type" in names
    ordered = [n for n in names if n != "_change_type"] + ["_change_type"]
    return sorted((tuple(r[n] for n in ordered) for r in table.to_pylist()), key=repr)


def check_change_files(
    path: Path, metrics: Mapping[str, Any], *, partition_columns: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The merge's cdc actions against their files and the CDC metrics; returns the actions."""
    actions = log_actions(path, metrics["tableVersion"])
    cdc = [a["cdc"] for a in actions if "cdc" in a]
    assert metrics["numTargetChangeFilesAdded"] == len(cdc)
    assert metrics["numTargetChangeFileBytes"] == sum(c["size"] for c in cdc)
    stored = next(a["commitInfo"] for a in actions if "commitInfo" in a)["operationMetrics"]
    assert stored["numTargetChangeFilesAdded"] == str(len(cdc))
    assert stored["numTargetChangeFileBytes"] == str(sum(c["size"] for c in cdc))
    for action in cdc:
        assert set(action) == {"path", "partitionValues", "size", "dataChange"}
        assert action["dataChange"] is False
        assert action["path"].startswith("_change_data/")
        file = path / unquote(action["path"])
        assert os.path.getsize(file) == action["size"]
        assert set(action["partitionValues"]) == set(partition_columns)
        directory = "/".join(f"{c}={action['partitionValues'][c]}" for c in partition_columns)
        assert Path(unquote(action["path"])).parent == Path("_change_data", directory)
        columns = pq.read_schema(file).names
        assert columns[-1] == "_change_type"
        assert not set(partition_columns) & set(columns)
    return cdc


# -- the classic merge writes its changes -----------------------------------------------------------------
def test_upsert_writes_pre_and_postimages_and_inserts_but_not_copied_rows(spark: Any, tmp_path: Path) -> None:
    target = cdf_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "c")]), kv([(4, "d")]))
    source = parquet_source(tmp_path / "s", kv([(2, "B"), (5, "e")]))
    before = live_files(target)

    metrics = merge(spark, target, source, UPSERT)

    assert table_rows(target) == [(1, "a"), (2, "B"), (3, "c"), (4, "d"), (5, "e")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=2)
    assert changes(target, metrics["tableVersion"]) == [
        (2, "B", "update_postimage"), (2, "b", "update_preimage"), (5, "e", "insert"),
    ]
    check_commit(target, before, metrics)
    cdc = check_change_files(target, metrics)
    assert len(cdc) == 1
    assert sorted(pq.read_table(target / cdc[0]["path"]).to_pylist(), key=repr) == [
        {"id": 2, "v": "B", "_change_type": "update_postimage"},
        {"id": 2, "v": "b", "_change_type": "update_preimage"},
        {"id": 5, "v": "e", "_change_type": "insert"},
    ]
    # The versions before the merge still read as deltalake's own inserts.
    assert changes(target, 1) == [(4, "d", "insert")]


def test_partitioned_update_moves_rows_and_deletes(spark: Any, tmp_path: Path) -> None:
    target = cdf_target(
        tmp_path / "t",
        pa.Table.from_pylist([
            {"id": 1, "v": "a", "p": "x"}, {"id": 2, "v": "b", "p": "x"}, {"id": 3, "v": "c", "p": "y y"},
            {"id": 4, "v": "d", "p": "z"},
        ], schema=KVP),
        partition_by=["p"],
    )
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 1, "v": "A", "p": "y y"}, {"id": 3, "v": None, "p": None}, {"id": 6, "v": "f", "p": "x"},
    ], schema=KVP))
    before = live_files(target)

    metrics = merge(spark, target, source, """MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED AND s.v IS NULL THEN DELETE
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *""")

    assert table_rows(target) == [(1, "A", "y y"), (2, "b", "x"), (4, "d", "z"), (6, "f", "x")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=3, numTargetRowsMatchedUpdated=1, numTargetRowsMatchedDeleted=1,
        numTargetRowsInserted=1, numTargetRowsCopied=1)
    assert changes(target, metrics["tableVersion"]) == [
        (1, "A", "y y", "update_postimage"), (1, "a", "x", "update_preimage"), (3, "c", "y y", "delete"),
        (6, "f", "x", "insert"),
    ]
    check_commit(target, before, metrics, partition_columns=["p"])
    cdc = check_change_files(target, metrics, partition_columns=["p"])
    assert sorted(c["partitionValues"]["p"] for c in cdc) == ["x", "y y"]
    assert all(c["path"].startswith(("_change_data/p=x/", "_change_data/p=y%20y/")) for c in cdc)


def test_not_matched_by_source_update_and_delete(spark: Any, tmp_path: Path) -> None:
    target = cdf_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "c"), (4, "keep")]))
    source = parquet_source(tmp_path / "s", kv([(1, "A")]))
    before = live_files(target)

    metrics = merge(spark, target, source, """MERGE INTO t USING s ON t.id = s.id
        WHEN NOT MATCHED BY SOURCE AND t.id = 2 THEN DELETE
        WHEN NOT MATCHED BY SOURCE AND t.id = 3 THEN UPDATE SET v = 'C'""")

    assert table_rows(target) == [(1, "a"), (3, "C"), (4, "keep")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=1, numTargetRowsNotMatchedBySourceDeleted=1, numTargetRowsNotMatchedBySourceUpdated=1,
        numTargetRowsCopied=2)
    assert changes(target, metrics["tableVersion"]) == [
        (2, "b", "delete"), (3, "C", "update_postimage"), (3, "c", "update_preimage"),
    ]
    check_commit(target, before, metrics)
    assert len(check_change_files(target, metrics)) == 1


def test_a_target_row_deleted_by_several_matches_gives_one_delete(spark: Any, tmp_path: Path) -> None:
    target = cdf_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "c")]))
    source = parquet_source(tmp_path / "s", kv([(2, "x"), (2, "y"), (3, "z"), (9, "n")]))
    before = live_files(target)

    metrics = merge(spark, target, source, "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE")

    assert table_rows(target) == [(1, "a")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=4, numTargetRowsMatchedDeleted=2, numTargetRowsCopied=1)
    assert changes(target, metrics["tableVersion"]) == [(2, "b", "delete"), (3, "c", "delete")]
    check_commit(target, before, metrics)
    check_change_files(target, metrics)


def test_a_rewrite_that_only_copies_rows_commits_an_empty_change_data_file(
    spark: Any, tmp_path: Path
) -> None:
    target = cdf_target(
        tmp_path / "t", pa.Table.from_pylist([{"id": 1, "v": "a", "p": "x"}, {"id": 2, "v": "b", "p": "x"}],
                                             schema=KVP),
        partition_by=["p"])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([{"id": 2, "v": "B", "p": "x"}], schema=KVP))
    before = live_files(target)

    metrics = merge(spark, target, source, """MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED AND s.v = 'never' THEN UPDATE SET *
        WHEN NOT MATCHED BY SOURCE AND t.id > 5 THEN DELETE""")

    assert table_rows(target) == [(1, "a", "x"), (2, "b", "x")]
    assert row_metrics(metrics) == expected_rows(numSourceRows=1, numTargetRowsCopied=2)
    # Without a cdc action, readers would take the rewritten copies as deletes and inserts.
    assert changes(target, metrics["tableVersion"]) == []
    removes, _ = check_commit(target, before, metrics, partition_columns=["p"])
    assert len(removes) == 1
    cdc = check_change_files(target, metrics, partition_columns=["p"])
    assert len(cdc) == 1
    assert pq.read_metadata(target / cdc[0]["path"]).num_rows == 0


def test_schema_evolution_preimages_have_null_new_columns(spark: Any, tmp_path: Path) -> None:
    target = cdf_target(tmp_path / "t", kv([(1, "a"), (2, "b")]))
    wide = pa.schema([*KV, ("w", pa.int32())])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": 2, "v": "B", "w": 7}, {"id": 3, "v": "C", "w": 8}], schema=wide))
    before = live_files(target)

    metrics = merge(spark, target, source, UPSERT, schema_evolution=True)

    assert table_rows(target) == [(1, "a", None), (2, "B", 7), (3, "C", 8)]
    assert changes(target, metrics["tableVersion"]) == [
        (2, "B", 7, "update_postimage"), (2, "b", None, "update_preimage"), (3, "C", 8, "insert"),
    ]
    check_commit(target, before, metrics)
    cdc = check_change_files(target, metrics)
    assert pq.read_schema(target / cdc[0]["path"]).names == ["id", "v", "w", "_change_type"]


# -- inserts only: no change data files, readers take the adds as inserts (as Delta) ----------------------
@pytest.mark.parametrize(
    "sql",
    [
        "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *",
        # Nothing matches: Delta's writeInsertsOnlyWhenNoMatches, no file rewritten.
        UPSERT,
    ],
    ids=["insert_only_merge", "classic_merge_without_matches"],
)
def test_inserts_only_write_no_change_data_files(spark: Any, tmp_path: Path, sql: str) -> None:
    target = cdf_target(tmp_path / "t", kv([(1, "a")]))
    source = parquet_source(tmp_path / "s", kv([(5, "e"), (6, "f")]))
    before = live_files(target)

    metrics = merge(spark, target, source, sql)

    assert table_rows(target) == [(1, "a"), (5, "e"), (6, "f")]
    assert changes(target, metrics["tableVersion"]) == [(5, "e", "insert"), (6, "f", "insert")]
    removes, _ = check_commit(target, before, metrics)
    assert removes == []
    assert check_change_files(target, metrics) == []
    assert not (target / "_change_data").exists()
    assert (metrics["numTargetChangeFilesAdded"], metrics["numTargetChangeFileBytes"]) == (0, 0)


def test_tables_without_the_feed_get_no_change_data(spark: Any, tmp_path: Path) -> None:
    target = tmp_path / "t"
    write_deltalake(str(target), kv([(1, "a"), (2, "b")]))
    source = parquet_source(tmp_path / "s", kv([(2, "B")]))

    metrics = merge(spark, target, source, UPSERT)

    actions = log_actions(target, metrics["tableVersion"])
    assert not [a for a in actions if "cdc" in a]
    assert not (target / "_change_data").exists()
    assert (metrics["numTargetChangeFilesAdded"], metrics["numTargetChangeFileBytes"]) == (0, 0)
    assert metrics["numTargetRowsUpdated"] == 1
    assert table_rows(target) == [(1, "a"), (2, "B")]
