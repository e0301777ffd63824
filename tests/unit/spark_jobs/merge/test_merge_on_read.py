"""Merge-on-read: with deletion vectors enabled, a merge marks the rows it changed in the touched files'
vectors and writes only the updated and inserted rows, as Delta's MergeIntoCommand does with persistent
deletion vectors. Every table is read back by deltalake and by DuckDB's delta-kernel reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector, deleted_rows
from spark_jobs.delta_merge.storage.log_store import log_store
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.unit.spark_jobs.test_pipeline import kv, live_files, log_actions, merge, parquet_source

UPSERT = """MERGE INTO t USING s ON t.id = s.id
    WHEN MATCHED AND s.v = 'delete' THEN DELETE
    WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
ENABLED = {"delta.enableDeletionVectors": "true"}


def rows(path: Path) -> list[tuple[Any, ...]]:
    """Live rows through deltalake, checked equal to DuckDB's (delta-kernel), sorted."""
    found = sorted(tuple(r) for r in read_rows(path, columns=["id", "v"]))
    assert sorted(tuple(r) for r in read_rows_with_kernel(path, columns=["id", "v"])) == found
    return found


def dv_table(path: Path, files: int = 3, per_file: int = 100, **configuration: str) -> Path:
    """A deltalake-made table with deletion vectors enabled: ``files`` files of ids ``k*per_file ...``."""
    for k in range(files):
        write_deltalake(str(path), kv([(i, f"v{i}") for i in range(k * per_file, (k + 1) * per_file)]),
                        mode="append", configuration={**ENABLED, **configuration})  # fmt: skip
    return path


def vector_rows(path: Path, descriptor: dict[str, Any]) -> list[int]:
    table_uri = path.resolve().as_uri()
    return deleted_rows(log_store(table_uri), table_uri, DeletionVector.from_action(descriptor))


def test_updated_and_deleted_rows_are_marked_and_only_changed_rows_are_written(
    spark: Any, tmp_path: Path
) -> None:
    target = dv_table(tmp_path / "t")
    before = live_files(target)
    source = parquet_source(tmp_path / "s", kv([(5, "new5"), (150, "new150"), (250, "delete"), (1000, "n")]))

    metrics = merge(spark, target, source, UPSERT)

    expected = {i: f"v{i}" for i in range(300)} | {5: "new5", 150: "new150", 1000: "n"}
    del expected[250]
    assert rows(target) == sorted(expected.items())
    counts = {name: metrics[name] for name in (
        "numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted", "numTargetRowsCopied",
        "numOutputRows", "numTargetFilesRemoved", "numTargetFilesAdded", "numTargetDeletionVectorsAdded",
        "numTargetDeletionVectorsUpdated", "numTargetDeletionVectorsRemoved")}  # fmt: skip
    assert counts == {
        "numTargetRowsUpdated": 2, "numTargetRowsDeleted": 1, "numTargetRowsInserted": 1,
        "numTargetRowsCopied": 0, "numOutputRows": 3, "numTargetFilesRemoved": 0, "numTargetFilesAdded": 1,
        "numTargetDeletionVectorsAdded": 3, "numTargetDeletionVectorsUpdated": 0,
        "numTargetDeletionVectorsRemoved": 0,
    }  # fmt: skip
    actions = log_actions(target, 3)
    removes = {a["remove"]["path"]: a["remove"] for a in actions if "remove" in a}
    adds = [a["add"] for a in actions if "add" in a]
    readds = {a["path"]: a for a in adds if a["path"] in before}
    assert set(removes) == set(readds) == set(before)  # every file had a changed row
    assert all("deletionVector" not in r for r in removes.values())
    marked = {json.loads(before[p]["stats"])["minValues"]["id"]: vector_rows(target, a["deletionVector"])
              for p, a in readds.items()}  # fmt: skip
    assert marked == {0: [5], 100: [50], 200: [50]}
    for path, add in readds.items():  # the same file: size, row count, no longer tight bounds
        assert add["size"] == before[path]["size"]
        stats = json.loads(add["stats"])
        assert stats["numRecords"] == 100
        assert stats["tightBounds"] is False
        assert add["deletionVector"]["cardinality"] == 1
    (new_file,) = [a for a in adds if a["path"] not in before]
    assert json.loads(new_file["stats"])["numRecords"] == 3
    operation_metrics = next(a["commitInfo"] for a in actions if "commitInfo" in a)["operationMetrics"]
    assert operation_metrics["numTargetDeletionVectorsAdded"] == "3"


def test_a_second_merge_updates_the_vectors_and_a_file_left_without_rows_is_removed(
    spark: Any, tmp_path: Path
) -> None:
    # A checkpoint every 2 versions: the later merges read the vectors and stats back from checkpoints.
    target = dv_table(tmp_path / "t", files=2, per_file=4, **{"delta.checkpointInterval": "2"})
    merge(spark, target, parquet_source(tmp_path / "s1", kv([(1, "x"), (2, "delete")])), UPSERT)
    first = live_files(target)

    # ids 0 and 3 are the rows of file 0 still there: deleting them empties it; id 5 is in file 1.
    source = kv([(0, "delete"), (3, "delete"), (5, "y")])
    metrics = merge(spark, target, parquet_source(tmp_path / "s2", source), UPSERT)

    assert rows(target) == [(1, "x"), (4, "v4"), (5, "y"), (6, "v6"), (7, "v7")]
    names = ("numTargetDeletionVectorsAdded", "numTargetDeletionVectorsUpdated",
             "numTargetDeletionVectorsRemoved", "numTargetFilesRemoved")  # fmt: skip
    dv = {name: metrics[name] for name in names}
    # File 0 had a vector and loses its last rows: removed, vector and all; file 1 gets its first vector.
    assert dv == {"numTargetDeletionVectorsAdded": 1, "numTargetDeletionVectorsUpdated": 0,
                  "numTargetDeletionVectorsRemoved": 1, "numTargetFilesRemoved": 1}  # fmt: skip
    actions = log_actions(target, 3)
    removes = [a["remove"] for a in actions if "remove" in a]
    assert len(removes) == 2
    assert all(r.get("deletionVector") == first[r["path"]].get("deletionVector") for r in removes)
    (readd,) = [a["add"] for a in actions if "add" in a and a["add"]["path"] in first]
    assert vector_rows(target, readd["deletionVector"]) == [1]  # id 5, the second row of file 1

    # A third merge updates file 1's vector, joining the new row to the old one.
    metrics = merge(spark, target, parquet_source(tmp_path / "s3", kv([(7, "z")])), UPSERT)
    # Delta 4.4 counts the replaced vector as removed and the new one as added, besides updated.
    assert (metrics["numTargetDeletionVectorsUpdated"], metrics["numTargetDeletionVectorsAdded"],
            metrics["numTargetDeletionVectorsRemoved"]) == (1, 1, 1)  # fmt: skip
    (readd,) = [a["add"] for a in log_actions(target, 4) if "add" in a and a["add"]["path"] in first]
    assert vector_rows(target, readd["deletionVector"]) == [1, 3]
    assert rows(target) == [(1, "x"), (4, "v4"), (5, "y"), (6, "v6"), (7, "z")]
    assert (target / "_delta_log" / f"{4:020d}.checkpoint.parquet").exists()


def test_copy_on_write_when_the_conf_turns_deletion_vectors_off(
    spark: Any, tmp_path: Path, copy_on_write: None
) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=10)

    metrics = merge(spark, target, parquet_source(tmp_path / "s", kv([(3, "x")])), UPSERT)

    assert (metrics["numTargetRowsCopied"], metrics["numTargetFilesRemoved"]) == (9, 1)
    assert metrics["numTargetDeletionVectorsAdded"] == 0
    assert all("deletionVector" not in add for add in live_files(target).values())
    assert rows(target) == sorted(({i: f"v{i}" for i in range(20)} | {3: "x"}).items())


def test_copy_on_write_when_the_table_does_not_enable_deletion_vectors(spark: Any, tmp_path: Path) -> None:
    target = dv_table(tmp_path / "t", files=1, per_file=10)
    DeltaTable(str(target)).alter.set_table_properties({"delta.enableDeletionVectors": "false"})
    assert "deletionVectors" in (DeltaTable(str(target)).protocol().writer_features or [])

    metrics = merge(spark, target, parquet_source(tmp_path / "s", kv([(3, "x")])), UPSERT)

    assert (metrics["numTargetRowsCopied"], metrics["numTargetDeletionVectorsAdded"]) == (9, 0)
    assert all("deletionVector" not in add for add in live_files(target).values())


def test_merge_on_read_table_is_compacted_and_vacuumed_by_deltalake(spark: Any, tmp_path: Path) -> None:
    target = dv_table(tmp_path / "t", files=3, per_file=20)
    merge(spark, target, parquet_source(tmp_path / "s1", kv([(i, "u") for i in range(0, 60, 7)])), UPSERT)
    deletes = kv([(i, "delete") for i in range(1, 60, 9)])
    merge(spark, target, parquet_source(tmp_path / "s2", deletes), UPSERT)
    expected = rows(target)
    assert any("deletionVector" in add for add in live_files(target).values())

    table = DeltaTable(str(target))
    table.optimize.compact()
    assert rows(target) == expected
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert rows(target) == expected
    # And merged into again after deltalake rewrote it.
    again = kv([(2, "again"), (500, "n")])
    merge(spark, target, parquet_source(tmp_path / "s3", again), UPSERT)
    assert rows(target) == sorted((dict(expected) | {2: "again", 500: "n"}).items())


def test_dry_run_counts_without_writing_vectors(spark: Any, tmp_path: Path) -> None:
    target = dv_table(tmp_path / "t", files=1, per_file=10)
    files_before = sorted(p.name for p in target.iterdir())

    metrics = merge(spark, target, parquet_source(tmp_path / "s", kv([(3, "x"), (4, "delete")])), UPSERT,
                    dry_run=True)  # fmt: skip

    names = ("numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsCopied")
    assert [metrics[name] for name in names] == [1, 1, 0]
    assert sorted(p.name for p in target.iterdir()) == files_before
    assert DeltaTable(str(target)).version() == 0
