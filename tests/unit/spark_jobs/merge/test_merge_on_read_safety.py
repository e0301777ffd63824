"""Merge-on-read under failure and in less common tables: two merges marking rows of one file race (Delta's
conflict rules), a commit that fails after the deletion vector file was written (nothing referenced, the
re-run applies once), change data feed together with deletion vectors, partitioned tables with NOT MATCHED
BY SOURCE, and files left untouched or emptied. Every table is read back by deltalake and by DuckDB's
delta-kernel reader."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge import commit as commit_stage
from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import ConcurrentModificationError
from spark_jobs.delta_merge.protocol.deletion_vectors import z85_encode
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.table_feature_fixtures import enable_features
from tests.unit.spark_jobs.merge.test_merge_on_read import ENABLED, UPSERT, dv_table, rows, vector_rows
from tests.unit.spark_jobs.protocol.test_row_tracking import stable_ids
from tests.unit.spark_jobs.test_pipeline import kv, live_files, log_actions, parquet_source

PKV = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.int64())])
APP_ID = "merge-on-read-safety"


def pkv(rows_: Sequence[tuple[int, str, int]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(PKV.names, r, strict=True)) for r in rows_], schema=PKV)


def partitioned_dv_table(path: Path, files: Sequence[Sequence[tuple[int, str, int]]], **config: str) -> Path:
    """A deltalake-made table partitioned by ``p`` with deletion vectors enabled: one file per entry."""
    for file_rows in files:
        write_deltalake(str(path), pkv(file_rows), mode="append", partition_by=["p"],
                        configuration={**ENABLED, **config})  # fmt: skip
    return path


def partitioned_rows(path: Path) -> list[tuple[Any, ...]]:
    """Live (id, p, v) rows through deltalake, checked equal to DuckDB's (delta-kernel), sorted."""
    found = sorted(tuple(r) for r in read_rows(path, columns=PKV.names))
    assert sorted(tuple(r) for r in read_rows_with_kernel(path, columns=PKV.names)) == found
    return found


def spec(target: Path, source: dict[str, Any], sql: str, **run: Any) -> dict[str, Any]:
    return {"target": {"uri": str(target)}, "source": source, "merge_sql": sql, "run": run}


def vector_files(root: Path) -> set[str]:
    return {p.name for p in root.rglob("deletion_vector_*.bin")}


def log_text(root: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted((root / "_delta_log").glob("*.json")))


def readds_with_vectors(path: Path, version: int) -> dict[str, dict[str, Any]]:
    return {a["add"]["path"]: a["add"] for a in log_actions(path, version)
            if "add" in a and "deletionVector" in a["add"]}  # fmt: skip


# -- conflicts ------------------------------------------------------------------------------------------
def race_before_commit(monkeypatch: pytest.MonkeyPatch, winner: Callable[[], None]) -> list[bool]:
    """Run ``winner`` (itself a merge through the job) right before the merge under test commits; returns
    a list that gets an entry once the winner ran. The winner's own commit goes straight through."""
    real = commit_stage.commit_serializably  # type: ignore[attr-defined]
    raced: list[bool] = []
    winner_running = False

    def racing(*args: Any, **kwargs: Any) -> Any:
        nonlocal winner_running
        if not raced and not winner_running:
            winner_running = True  # the winner's run_merge comes back through here: let it commit
            try:
                winner()
            finally:
                winner_running = False
            raced.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(commit_stage, "commit_serializably", racing)
    return raced


WINNERS = [
    # The winner marks id 5 and writes its new version: files added where the loser read, which Delta's
    # ConflictChecker looks at first.
    ("marks-a-row", [(5, "winner")], "DELTA_CONCURRENT_APPEND.WITHOUT_HINT", {5: "winner"}, [5]),
    # The winner deletes every row of the loser's file: it removes the file and adds nothing, so the
    # conflict is a removed file the loser read.
    (
        "empties-the-file",
        [(i, "delete") for i in range(10)],
        "DELTA_CONCURRENT_DELETE_READ.WITHOUT_HINT",
        dict.fromkeys(range(10)),
        None,
    ),
]


@pytest.mark.parametrize(
    ("winner_rows", "rule", "winner_changes", "winner_vector"),
    [w[1:] for w in WINNERS],
    ids=[w[0] for w in WINNERS],
)
def test_two_merges_marking_rows_of_one_file_conflict_and_the_winner_stays(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    winner_rows: list[tuple[int, str]],
    rule: str,
    winner_changes: dict[int, str | None],
    winner_vector: list[int] | None,
) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=10)  # ids 0-9, 10-19; versions 0, 1
    winner_source = parquet_source(tmp_path / "winner", kv(winner_rows))
    loser_source = parquet_source(tmp_path / "loser", kv([(3, "loser"), (7, "delete")]))
    winner_metrics: list[dict[str, Any]] = []

    def winner() -> None:
        winner_metrics.append(run_merge(spark, spec(target, winner_source, UPSERT)).to_dict())

    race_before_commit(monkeypatch, winner)
    with pytest.raises(ConcurrentModificationError) as raised:
        run_merge(spark, spec(target, loser_source, UPSERT, app_id=APP_ID, app_version=1))

    assert raised.value.error_class == rule, str(raised.value)
    assert "version 2, committed after this merge read the table" in str(raised.value)
    assert "Nothing was committed" in str(raised.value)
    (won,) = winner_metrics
    assert won["tableVersion"] == table_version(target) == 2
    assert DeltaTable(str(target)).transaction_version(APP_ID) is None
    expected = {i: f"v{i}" for i in range(20)} | winner_changes
    assert rows(target) == sorted((i, v) for i, v in expected.items() if v is not None)
    vectors = [vector_rows(target, add["deletionVector"]) for add in live_files(target).values()
               if "deletionVector" in add]  # fmt: skip
    assert vectors == ([] if winner_vector is None else [winner_vector])
    assert not vector_files(target)  # the loser's one-row vectors went inline: nothing else was stored


def test_merges_marking_rows_of_different_partitions_both_commit_with_their_vectors(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = partitioned_dv_table(tmp_path / "t", [[(i, "a", 0) for i in range(1, 6)],
                                                   [(i, "b", 0) for i in range(11, 16)]])  # fmt: skip
    # The target-only predicate on p keeps each merge's reads in its own partition.
    sql = "MERGE INTO t USING s ON t.id = s.id AND t.p = '{p}' WHEN MATCHED THEN UPDATE SET v = s.v"
    winner_source = parquet_source(tmp_path / "winner", pkv([(12, "b", 200)]))
    loser_source = parquet_source(tmp_path / "loser", pkv([(2, "a", 100), (4, "a", 100)]))

    def winner() -> None:
        run_merge(spark, spec(target, winner_source, sql.format(p="b")))

    raced = race_before_commit(monkeypatch, winner)
    metrics = run_merge(spark, spec(target, loser_source, sql.format(p="a"))).to_dict()

    assert raced
    assert (metrics["readVersion"], metrics["tableVersion"]) == (1, 3)
    assert metrics["numTargetDeletionVectorsAdded"] == 1
    expected = [(i, "a", 100 if i in (2, 4) else 0) for i in range(1, 6)]
    expected += [(i, "b", 200 if i == 12 else 0) for i in range(11, 16)]
    assert partitioned_rows(target) == sorted(expected)
    vectors = {add["partitionValues"]["p"]: vector_rows(target, add["deletionVector"])
               for add in live_files(target).values() if "deletionVector" in add}  # fmt: skip
    assert vectors == {"a": [1, 3], "b": [1]}


# -- crash safety ---------------------------------------------------------------------------------------
def test_commit_failing_after_the_vector_file_was_written_leaves_it_unreferenced_and_reruns_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = dv_table(tmp_path / "t", files=1, per_file=200)
    # 40 scattered rows: too big a vector to go inline, so it goes to a deletion_vector_*.bin file.
    updated = range(0, 200, 5)
    source = parquet_source(tmp_path / "s", kv([(i, "new") for i in updated]))
    merge_spec = spec(target, source, UPSERT, app_id=APP_ID, app_version=3)
    rows_before = rows(target)

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated crash before the commit")

    monkeypatch.setattr(commit_stage, "commit_serializably", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_merge(spark, merge_spec)
    monkeypatch.undo()

    assert table_version(target) == 0
    assert rows(target) == rows_before
    (orphan,) = vector_files(target)
    orphan_id = uuid.UUID(orphan.removeprefix("deletion_vector_").removesuffix(".bin"))
    assert z85_encode(orphan_id.bytes) not in log_text(target)

    first = run_merge(spark, merge_spec).to_dict()
    again = run_merge(spark, merge_spec).to_dict()

    expected = sorted(({i: f"v{i}" for i in range(200)} | dict.fromkeys(updated, "new")).items())
    assert (first["skipped"], first["tableVersion"]) == (False, 1)
    assert (again["skipped"], again["tableVersion"]) == (True, 1)
    assert table_version(target) == 1
    assert rows(target) == expected
    assert DeltaTable(str(target)).transaction_version(APP_ID) == 3
    (readd,) = readds_with_vectors(target, 1).values()
    assert readd["deletionVector"]["storageType"] == "u"
    assert vector_rows(target, readd["deletionVector"]) == list(updated)
    assert len(vector_files(target)) == 2  # the re-run wrote its own; the orphan stays unreferenced
    assert z85_encode(orphan_id.bytes) not in log_text(target)


# -- change data feed -----------------------------------------------------------------------------------
def changes(path: Path, version: int) -> list[tuple[Any, ...]]:
    """(id, v, _change_type) rows of one version's change data feed (deltalake), sorted."""
    table = pa.table(
        DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version).read_all()
    )
    assert set(table.column("_commit_version").to_pylist()) == {version}
    return sorted((r["id"], r["v"], r["_change_type"]) for r in table.to_pylist())


def test_change_data_feed_of_a_merge_on_read_gives_exactly_the_changed_rows(
    spark: Any, tmp_path: Path
) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=10, **{"delta.enableChangeDataFeed": "true"})
    protocol = DeltaTable(str(target)).protocol()
    assert "deletionVectors" in (protocol.writer_features or [])
    assert "changeDataFeed" in (protocol.writer_features or [])
    source = parquet_source(tmp_path / "s", kv([(3, "new3"), (12, "delete"), (50, "n50")]))

    metrics = run_merge(spark, spec(target, source, UPSERT)).to_dict()

    assert (metrics["numTargetRowsCopied"], metrics["numTargetFilesRemoved"]) == (0, 0)
    assert metrics["numTargetDeletionVectorsAdded"] == 2
    assert metrics["numTargetChangeFilesAdded"] >= 1
    expected = {i: f"v{i}" for i in range(20)} | {3: "new3", 50: "n50"}
    del expected[12]
    assert rows(target) == sorted(expected.items())
    assert changes(target, 2) == [
        (3, "new3", "update_postimage"), (3, "v3", "update_preimage"), (12, "v12", "delete"),
        (50, "n50", "insert"),
    ]  # fmt: skip
    assert any("cdc" in a for a in log_actions(target, 2))

    # Again over the vectors: 12 is deleted by one (an insert now, no preimage from the hidden row), 4 is in
    # a file with a vector (updated), 3 lives in the file the first merge wrote.
    again = parquet_source(tmp_path / "s2", kv([(12, "back"), (4, "again4"), (3, "again3")]))
    metrics = run_merge(spark, spec(target, again, UPSERT)).to_dict()

    assert (metrics["numTargetRowsInserted"], metrics["numTargetRowsUpdated"]) == (1, 2)
    assert metrics["numTargetDeletionVectorsUpdated"] == 1
    merged_twice = expected | {12: "back", 4: "again4", 3: "again3"}
    assert rows(target) == sorted(merged_twice.items())
    assert changes(target, 3) == [
        (3, "again3", "update_postimage"), (3, "new3", "update_preimage"), (4, "again4", "update_postimage"),
        (4, "v4", "update_preimage"), (12, "back", "insert"),
    ]  # fmt: skip

    # Deleting the rest of the second file's rows empties it: its hidden row 12 is no change of this one.
    rest = [(i, "delete") for i in range(10, 20) if i != 12]
    run_merge(spark, spec(target, parquet_source(tmp_path / "s3", kv(rest)), UPSERT))

    assert changes(target, 4) == [(i, f"v{i}", "delete") for i in range(10, 20) if i != 12]
    assert rows(target) == sorted((i, v) for i, v in merged_twice.items() if i == 12 or not 10 <= i < 20)


# -- partitioned, NOT MATCHED BY SOURCE -----------------------------------------------------------------
def test_not_matched_by_source_marks_the_right_rows_across_partitions(spark: Any, tmp_path: Path) -> None:
    files = [[(i, p, i % 10) for i in range(start, start + 10)]
             for p, start in (("a", 0), ("a", 10), ("b", 20), ("b", 30))]  # fmt: skip
    target = partitioned_dv_table(tmp_path / "t", files)
    # Id 5 moves from partition a to b: marked in its file, written to the other partition.
    source_rows = [(5, "b", 100), (25, "b", 100), (40, "b", 100)]
    source = parquet_source(tmp_path / "s", pkv(source_rows))
    sql = """MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET v = s.v, p = s.p
        WHEN NOT MATCHED THEN INSERT *
        WHEN NOT MATCHED BY SOURCE AND t.v < 2 THEN DELETE
        WHEN NOT MATCHED BY SOURCE AND t.v >= 8 AND t.p = 'b' THEN UPDATE SET v = -t.v"""

    metrics = run_merge(spark, spec(target, source, sql)).to_dict()

    original: dict[int, tuple[str, int]] = {i: (p, v) for f in files for i, p, v in f}
    model = dict(original)
    by_source = {i: (p, v) for i, p, v in source_rows}
    for i, (p, v) in list(model.items()):
        if i in by_source:
            model[i] = by_source[i]
        elif v < 2:
            del model[i]
        elif v >= 8 and p == "b":
            model[i] = (p, -v)
    model |= {i: pv for i, pv in by_source.items() if i not in original}
    assert partitioned_rows(target) == sorted((i, p, v) for i, (p, v) in model.items())
    # Every file has a row deleted (v 0 and 1): four vectors, nothing copied, no file rewritten.
    assert (metrics["numTargetRowsCopied"], metrics["numTargetDeletionVectorsAdded"]) == (0, 4)
    assert (metrics["numTargetRowsDeleted"], metrics["numTargetRowsUpdated"]) == (8, 1 + 1 + 4)
    vectors = sorted((add["partitionValues"]["p"], vector_rows(target, add["deletionVector"]))
                     for add in live_files(target).values() if "deletionVector" in add)  # fmt: skip
    assert vectors == [("a", [0, 1]), ("a", [0, 1, 5]), ("b", [0, 1, 5, 8, 9]), ("b", [0, 1, 8, 9])]


# -- emptied and untouched files ------------------------------------------------------------------------
def test_an_emptied_file_is_removed_and_an_untouched_file_stays_out_of_the_commit(
    spark: Any, tmp_path: Path
) -> None:
    target = dv_table(tmp_path / "t", files=3, per_file=4)  # ids 0-3, 4-7, 8-11
    before = live_files(target)
    by_first_id = {json.loads(add["stats"])["minValues"]["id"]: path for path, add in before.items()}
    emptied, marked, untouched = by_first_id[0], by_first_id[4], by_first_id[8]
    source = kv([(0, "delete"), (1, "delete"), (2, "delete"), (3, "delete"), (6, "six")])

    metrics = run_merge(spark, spec(target, parquet_source(tmp_path / "s", source), UPSERT)).to_dict()

    actions = log_actions(target, 3)
    removed = {a["remove"]["path"] for a in actions if "remove" in a}
    added = {a["add"]["path"]: a["add"] for a in actions if "add" in a}
    assert removed == {emptied, marked}
    assert emptied not in added
    assert untouched not in added
    assert vector_rows(target, added[marked]["deletionVector"]) == [2]
    assert set(live_files(target)) == {marked, untouched} | (set(added) - {marked})
    assert live_files(target)[untouched] == before[untouched]
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetDeletionVectorsAdded"]) == (1, 1)
    expected = {i: f"v{i}" for i in range(4, 12)} | {6: "six"}
    assert rows(target) == sorted(expected.items())


# -- the log written by other writers -------------------------------------------------------------------
def test_a_vector_added_before_its_files_remove_in_the_log_is_still_the_files_vector(
    spark: Any, tmp_path: Path
) -> None:
    target = dv_table(tmp_path / "t", files=1, per_file=10)
    run_merge(spark, spec(target, parquet_source(tmp_path / "s1", kv([(3, "x")])), UPSERT))
    # The same commit with its adds first: as valid (Delta reconciles by path and vector id), as other
    # writers may order it. A replay by path alone dropped the file's vector: row 3 came back, and the next
    # merge committed a second live entry for the file, duplicating every row.
    commit_file = target / "_delta_log" / f"{1:020d}.json"
    lines = commit_file.read_text(encoding="utf-8").splitlines()
    commit_file.write_text("\n".join(sorted(lines, key=lambda line: '"add"' not in line)) + "\n")
    assert json.loads(commit_file.read_text(encoding="utf-8").splitlines()[0]).keys() == {"add"}
    assert rows(target) == sorted(({i: f"v{i}" for i in range(10)} | {3: "x"}).items())

    metrics = run_merge(
        spark, spec(target, parquet_source(tmp_path / "s2", kv([(5, "y")])), UPSERT)
    ).to_dict()

    assert metrics["numTargetDeletionVectorsUpdated"] == 1
    assert rows(target) == sorted(({i: f"v{i}" for i in range(10)} | {3: "x", 5: "y"}).items())
    (readd,) = readds_with_vectors(target, 2).values()
    assert vector_rows(target, readd["deletionVector"]) == [3, 5]


def test_vectors_survive_the_checkpoint_a_merge_writes(spark: Any, tmp_path: Path) -> None:
    target = dv_table(tmp_path / "t", files=1, per_file=10, **{"delta.checkpointInterval": "2"})
    run_merge(spark, spec(target, parquet_source(tmp_path / "s1", kv([(3, "x")])), UPSERT))
    run_merge(spark, spec(target, parquet_source(tmp_path / "s2", kv([(5, "y")])), UPSERT))
    assert (target / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    expected = {i: f"v{i}" for i in range(10)} | {3: "x", 5: "y"}
    assert rows(target) == sorted(expected.items())

    # The next merge reads the file's vector from the checkpoint and joins its new row to it.
    metrics = run_merge(
        spark, spec(target, parquet_source(tmp_path / "s3", kv([(7, "z")])), UPSERT)
    ).to_dict()

    assert metrics["numTargetDeletionVectorsUpdated"] == 1
    assert rows(target) == sorted((expected | {7: "z"}).items())
    (readd,) = readds_with_vectors(target, 3).values()
    assert vector_rows(target, readd["deletionVector"]) == [3, 5, 7]


def test_row_tracking_keeps_stable_row_ids_of_marked_files_and_moved_rows(spark: Any, tmp_path: Path) -> None:
    target = dv_table(tmp_path / "t", files=1, per_file=5)
    assert enable_features(target, row_tracking=True) == 1
    before = stable_ids(target)

    source = parquet_source(tmp_path / "s", kv([(2, "new2"), (4, "delete"), (9, "n9")]))
    run_merge(spark, spec(target, source, UPSERT))

    after = stable_ids(target)
    assert rows(target) == [(0, "v0"), (1, "v1"), (2, "new2"), (3, "v3"), (9, "n9")]
    # The file's untouched rows keep their ids and commit versions; the updated row keeps its id and
    # takes the merge's version; the inserted row gets a new id.
    assert {i: after[i] for i in (0, 1, 3)} == {i: before[i] for i in (0, 1, 3)}
    assert after[2] == (before[2][0], 2)
    assert after[9][0] not in {row_id for row_id, _ in before.values()}
    assert after[9][1] == 2
