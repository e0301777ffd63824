"""Deletion vectors are honoured: deleted rows never come back; a rewritten file's remove carries its vector.

deltalake cannot write vectors: ``deletion_vector_fixture`` commits them, stored by the job's writer.
Each fixture is first read back through deltalake and DuckDB's Delta extension, so the test tables are
right before any merge runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge.protocol.deletion_vectors import (
    DeletionVector,
    deleted_rows,
    z85_decode,
    z85_encode,
)
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from spark_jobs.delta_merge.storage.log_store import log_store
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.unit.spark_jobs.test_pipeline import (
    check_commit,
    expected_rows,
    kv,
    live_files,
    log_actions,
    merge,
    parquet_source,
    row_metrics,
)

# Copy-on-write into tables with deletion vectors (merge-on-read: test_merge_on_read.py).
pytestmark = pytest.mark.usefixtures("copy_on_write")

# File a holds ids 1-5 (a "u" vector deletes rows 1 and 3: ids 2 and 4), file b ids 10-14 (an inline
# vector deletes row 0: id 10), file c ids 20-21 (no vector).
LIVE = [(1, "a"), (3, "a"), (5, "a"), (11, "b"), (12, "b"), (13, "b"), (14, "b"), (20, "c"), (21, "c")]


def rows(path: Path) -> list[tuple[Any, ...]]:
    """Live rows through deltalake, checked equal to DuckDB's (delta-kernel), sorted."""
    found = sorted(tuple(r) for r in read_rows(path, columns=["id", "v"]))
    assert sorted(tuple(r) for r in read_rows_with_kernel(path, columns=["id", "v"])) == found
    return found


def dv_target(path: Path) -> tuple[Path, dict[str, str], list[dict[str, Any]]]:
    """The table above; returns it, add.path by file letter, and the two descriptors (a's, b's)."""
    write_deltalake(str(path), kv([(i, "a") for i in range(1, 6)]))
    write_deltalake(str(path), kv([(i, "b") for i in range(10, 15)]), mode="append")
    write_deltalake(str(path), kv([(20, "c"), (21, "c")]), mode="append")
    by_letter = {json.loads(add["stats"])["minValues"]["v"]: name for name, add in live_files(path).items()}
    descriptors = add_deletion_vectors(
        path, {by_letter["a"]: ([1, 3], "u"), by_letter["b"]: ([0], "i")}, prefix="xy"
    )
    return path, by_letter, descriptors


@pytest.fixture
def target(tmp_path: Path) -> tuple[Path, dict[str, str], list[dict[str, Any]]]:
    made = dv_target(tmp_path / "t")
    assert rows(made[0]) == LIVE  # both independent readers apply the vectors
    return made


def test_z85_round_trip() -> None:
    data = bytes(range(256))
    assert z85_decode(z85_encode(data)) == data
    # ZeroMQ RFC 32's test vector.
    assert z85_encode(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"


def test_snapshot_exposes_descriptors_and_reads_the_deleted_rows(target: Any) -> None:
    path, by_letter, (dv_a, dv_b) = target
    snapshot = load_snapshot(str(path))
    vectors = {f.path: f.deletion_vector for f in snapshot.files}
    assert vectors == {
        by_letter["a"]: DeletionVector.from_action(dv_a),
        by_letter["b"]: DeletionVector.from_action(dv_b),
        by_letter["c"]: None,
    }
    assert vectors[by_letter["a"]].to_action() == dv_a  # type: ignore[union-attr]
    store = log_store(snapshot.table_uri)
    assert deleted_rows(store, snapshot.table_uri, DeletionVector.from_action(dv_a)) == [1, 3]
    assert deleted_rows(store, snapshot.table_uri, DeletionVector.from_action(dv_b)) == [0]
    # The same after a checkpoint: the descriptors come from its parquet then.
    DeltaTable(str(path)).create_checkpoint()
    assert {f.path: f.deletion_vector for f in load_snapshot(str(path)).files} == vectors


def _removes(path: Path, metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        r["path"]: r
        for r in (a["remove"] for a in log_actions(path, metrics["tableVersion"]) if "remove" in a)
    }


def _adds(path: Path, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    return [a["add"] for a in log_actions(path, metrics["tableVersion"]) if "add" in a]


def test_upsert_rewriting_a_file_with_a_vector(spark: Any, target: Any, tmp_path: Path) -> None:
    path, by_letter, (dv_a, _) = target
    before = live_files(path)
    # id 2 was deleted: it is inserted anew, never updated; id 3 is updated.
    source = parquet_source(tmp_path / "s", kv([(2, "X"), (3, "C")]))
    metrics = merge(
        spark,
        path,
        source,
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    )
    assert rows(path) == [
        (1, "a"), (2, "X"), (3, "C"), (5, "a"), (11, "b"), (12, "b"), (13, "b"), (14, "b"), (20, "c"),
        (21, "c"),
    ]  # fmt: skip
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=2
    )
    check_commit(path, before, metrics)
    removes = _removes(path, metrics)
    assert list(removes) == [by_letter["a"]]
    assert removes[by_letter["a"]]["deletionVector"] == dv_a
    assert all("deletionVector" not in a for a in _adds(path, metrics))
    assert live_files(path)[by_letter["b"]] == before[by_letter["b"]]  # untouched, vector and all


def test_merge_not_touching_the_files_with_vectors(spark: Any, target: Any, tmp_path: Path) -> None:
    path, by_letter, _ = target
    before = live_files(path)
    source = parquet_source(tmp_path / "s", kv([(20, "Z")]))
    metrics = merge(spark, path, source, "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *")
    assert rows(path) == [*LIVE[:-2], (20, "Z"), (21, "c")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=1, numTargetRowsMatchedUpdated=1, numTargetRowsCopied=1
    )
    check_commit(path, before, metrics)
    removes = _removes(path, metrics)
    assert list(removes) == [by_letter["c"]]
    assert "deletionVector" not in removes[by_letter["c"]]
    assert {k: live_files(path)[k] for k in (by_letter["a"], by_letter["b"])} == {
        k: before[k] for k in (by_letter["a"], by_letter["b"])
    }


def test_delete_from_a_file_with_an_inline_vector(spark: Any, target: Any, tmp_path: Path) -> None:
    path, by_letter, (_, dv_b) = target
    before = live_files(path)
    # id 10 is already deleted: it matches nothing.
    source = parquet_source(tmp_path / "s", kv([(10, "s"), (11, "s")]))
    metrics = merge(spark, path, source, "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE")
    assert rows(path) == [r for r in LIVE if r[0] != 11]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedDeleted=1, numTargetRowsCopied=3
    )
    check_commit(path, before, metrics)
    removes = _removes(path, metrics)
    assert list(removes) == [by_letter["b"]]
    assert removes[by_letter["b"]]["deletionVector"] == dv_b


def test_not_matched_by_source_rewrites_every_file_without_resurrecting(
    spark: Any, target: Any, tmp_path: Path
) -> None:
    path, by_letter, (dv_a, dv_b) = target
    before = live_files(path)
    source = parquet_source(tmp_path / "s", kv([(1, "s")]))
    metrics = merge(
        spark,
        path,
        source,
        "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED BY SOURCE THEN UPDATE SET v = 'gone'",
    )
    assert rows(path) == [(1, "a")] + [(i, "gone") for i, _ in LIVE[1:]]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=1, numTargetRowsNotMatchedBySourceUpdated=8, numTargetRowsCopied=1
    )
    check_commit(path, before, metrics)
    removes = _removes(path, metrics)
    assert set(removes) == set(by_letter.values())
    assert removes[by_letter["a"]]["deletionVector"] == dv_a
    assert removes[by_letter["b"]]["deletionVector"] == dv_b
    assert "deletionVector" not in removes[by_letter["c"]]
    assert all("deletionVector" not in a for a in _adds(path, metrics))


def _move_vector_to_an_absolute_path(path: Path, folder: Path, spelling: str) -> dict[str, Any]:
    """Move file a's vector file to ``folder`` under a name with a space and a percent sign, and give its
    descriptor storage type ``p`` and that absolute path, spelled as ``spelling`` says: ``hadoop`` as
    Delta writes it (Hadoop's Path.toUri: ``file:/...``, ``&`` kept), ``rfc8089`` as ``file:///...`` with
    every reserved character percent-encoded."""
    (dv_file,) = list(path.rglob("*.bin"))
    folder.mkdir(parents=True)
    moved = folder / "deletion_vector_a b%.bin"
    dv_file.rename(moved)
    uri = "file:" + quote(str(moved), safe="/&") if spelling == "hadoop" else moved.as_uri()
    commit = sorted((path / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in commit.read_text(encoding="utf-8").splitlines()]
    for action in actions:
        vector = action.get("add", {}).get("deletionVector")
        if vector is not None and vector["storageType"] == "u":
            vector.update(storageType="p", pathOrInlineDv=uri)
            descriptor = dict(vector)
    commit.write_text("".join(json.dumps(a) + "\n" for a in actions), encoding="utf-8")
    return descriptor


@pytest.mark.parametrize("spelling", ["hadoop", "rfc8089"])
def test_a_vector_at_an_absolute_percent_encoded_path_is_read_and_honoured(
    spark: Any, target: Any, tmp_path: Path, spelling: str
) -> None:
    path, by_letter, _ = target
    descriptor = _move_vector_to_an_absolute_path(path, tmp_path / "folder&with%special char", spelling)
    assert "%25" in descriptor["pathOrInlineDv"]
    assert "%20" in descriptor["pathOrInlineDv"]
    assert rows(path) == LIVE  # deltalake and DuckDB's Delta extension apply it

    snapshot = load_snapshot(str(path))
    assert deleted_rows(log_store(snapshot.table_uri), snapshot.table_uri,
                        DeletionVector.from_action(descriptor)) == [1, 3]  # fmt: skip
    source = parquet_source(tmp_path / "s", kv([(2, "X"), (3, "C")]))
    metrics = merge(
        spark, path, source,
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    )  # fmt: skip
    # id 2 stays deleted (inserted anew), id 4 stays deleted, id 3 is updated.
    assert rows(path) == sorted([(1, "a"), (2, "X"), (3, "C"), (5, "a"), *LIVE[3:]])
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=2
    )
    assert _removes(path, metrics)[by_letter["a"]]["deletionVector"] == descriptor
