"""Row tracking: new files get fresh row ids above the high-water mark, rewritten rows keep their stable ids.

The tables get row tracking from a hand commit (``table_feature_fixtures``). Expected row ids are computed
here independently of the job, per PROTOCOL.md "Reader Requirements for Row Tracking", from the JSON log
and the Parquet files: the materialized value when not NULL, else the file's ``baseRowId`` plus the row's
index (ids) or its ``defaultRowCommitVersion`` (commit versions).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import StructType

from spark_jobs.delta_merge.commit.actions import commit_actions, plan_commit
from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector, deleted_rows
from spark_jobs.delta_merge.protocol.files import WrittenFile
from spark_jobs.delta_merge.protocol.row_tracking import RowTracking, assign_row_ids, row_tracking
from spark_jobs.delta_merge.protocol.row_tracking import high_water_mark as high_water_mark_of
from spark_jobs.delta_merge.protocol.snapshot import TableProtocol, TargetSnapshot, load_snapshot
from spark_jobs.delta_merge.storage.log_store import log_store
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.support.table_feature_fixtures import (
    ROW_COMMIT_VERSION_COLUMN,
    ROW_ID_COLUMN,
    enable_features,
    replay,
)
from tests.unit.spark_jobs.commit.test_commit_protocol import _check_actions
from tests.unit.spark_jobs.test_pipeline import check_commit, kv, live_files, log_actions, make_target, merge
from tests.unit.spark_jobs.test_pipeline import parquet_source as source

UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def stable_ids(table: Path) -> dict[int, tuple[int, int]]:
    """Row key ``id`` -> (stable row id, stable row commit version) of every live row."""
    _, adds, metadata, _, _ = replay(table)
    config = metadata["configuration"]
    names = (config.get(ROW_ID_COLUMN), config.get(ROW_COMMIT_VERSION_COLUMN))
    found: dict[int, tuple[int, int]] = {}
    table_uri = table.resolve().as_uri()
    for path, add in adds.items():
        vector = add.get("deletionVector")
        deleted = set(deleted_rows(log_store(table_uri), table_uri, DeletionVector.from_action(vector))
                      if vector else ())  # fmt: skip
        for index, row in enumerate(pq.read_table(table / path).to_pylist()):
            if index in deleted:
                continue
            row_id, version = (row.get(name) if name else None for name in names)
            stable = (
                row_id if row_id is not None else add["baseRowId"] + index,
                version if version is not None else add["defaultRowCommitVersion"],
            )
            assert row["id"] not in found
            found[row["id"]] = stable
    return found


def high_water_mark(table: Path) -> int:
    return int(json.loads(replay(table)[4]["delta.rowTracking"]["configuration"])["rowIdHighWaterMark"])


def rows(table: Path) -> list[tuple[Any, ...]]:
    """Live rows through deltalake, checked equal to DuckDB's (delta-kernel), sorted."""
    found = sorted(tuple(r) for r in read_rows(table, columns=["id", "v"]))
    assert sorted(tuple(r) for r in read_rows_with_kernel(table, columns=["id", "v"])) == found
    return found


def check_row_ids(table: Path, before: dict[int, tuple[int, int]], mark: int, version: int,
                  *, kept: set[int], updated: set[int], inserted: set[int]) -> None:
    """After the merge at ``version``: copied rows (``kept``) keep id and version, updated rows keep
    their id at the new version, inserted rows have fresh ids above the old mark; no id twice."""
    after = stable_ids(table)
    assert set(after) == kept | updated | inserted
    for key in kept:
        assert after[key] == before[key], key
    for key in updated:
        assert after[key] == (before[key][0], version), key
    for key in inserted:
        assert after[key][0] > mark, key
        assert after[key][1] == version, key
    assert len({row_id for row_id, _ in after.values()}) == len(after)
    assert high_water_mark(table) >= max(row_id for row_id, _ in after.values())


def check_actions(table: Path, version: int, *, mark: int) -> list[dict[str, Any]]:
    """The commit's actions are the protocol's; adds have fresh, disjoint id ranges above ``mark`` and
    the commit's version; removes repeat their add's row tracking fields; the mark moved past all."""
    actions = log_actions(table, version)
    _check_actions(actions)
    removes = {a["remove"]["path"]: a["remove"] for a in actions if "remove" in a}
    # A file added again with a deletion vector keeps the ids and version of its rows.
    for readd in (a["add"] for a in actions if "add" in a and a["add"]["path"] in removes):
        kept = removes[readd["path"]]
        assert (readd["baseRowId"], readd["defaultRowCommitVersion"]) == (
            kept["baseRowId"], kept["defaultRowCommitVersion"])  # fmt: skip
    adds = [a["add"] for a in actions if "add" in a and a["add"]["path"] not in removes]
    ranges = sorted(
        (a["baseRowId"], a["baseRowId"] + json.loads(a["stats"])["numRecords"] - 1) for a in adds
    )
    assert all(a["defaultRowCommitVersion"] == version for a in adds)
    assert ranges[0][0] == mark + 1
    assert all(prev[1] < cur[0] for prev, cur in itertools.pairwise(ranges))
    (domain,) = [a["domainMetadata"] for a in actions if "domainMetadata" in a]
    assert (domain["domain"], domain["removed"]) == ("delta.rowTracking", False)
    assert json.loads(domain["configuration"]) == {"rowIdHighWaterMark": ranges[-1][1]}
    for remove in (a["remove"] for a in actions if "remove" in a):
        assert {"baseRowId", "defaultRowCommitVersion"} <= set(remove)
    return actions


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """ids 1-3 in one file, 4-5 in another; row tracking enabled (ids 0-4, commit version 2)."""
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "c")]), kv([(4, "d"), (5, "e")]))
    assert enable_features(table, row_tracking=True) == 2
    assert rows(table) == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]
    assert sorted(stable_ids(table).values()) == [(i, 2) for i in range(5)]
    return table


@pytest.mark.parametrize("by_position", [False, True], ids=["through-spark", "by-position"])
def test_upsert_keeps_ids_of_updated_and_copied_rows(
    spark: Any, target: Path, tmp_path: Path, by_position: bool, request: pytest.FixtureRequest
) -> None:
    if by_position:
        request.getfixturevalue("copy_by_position")
    before, mark, files = stable_ids(target), high_water_mark(target), live_files(target)
    metrics = merge(spark, target, source(tmp_path / "s", kv([(2, "B"), (6, "f"), (7, "g")])), UPSERT)
    version = metrics["tableVersion"]
    check_commit(target, files, metrics)
    assert rows(target) == [(1, "a"), (2, "B"), (3, "c"), (4, "d"), (5, "e"), (6, "f"), (7, "g")]
    check_row_ids(target, before, mark, version, kept={1, 3, 4, 5}, updated={2}, inserted={6, 7})
    actions = check_actions(target, version, mark=mark)
    assert actions[0]["commitInfo"]["tags"] == {"delta.rowTracking.preserved": "true"}


def test_change_data_files_hold_the_table_columns_only(spark: Any, tmp_path: Path) -> None:
    # Row tracking with the change data feed: the materialized columns go into data files only.
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "c")]), kv([(4, "d"), (5, "e")]))
    enable_features(table, row_tracking=True, change_data_feed=True)
    before, mark = stable_ids(table), high_water_mark(table)
    sql = UPSERT.replace("WHEN MATCHED THEN", "WHEN MATCHED AND s.v = 'x' THEN DELETE WHEN MATCHED THEN")
    metrics = merge(spark, table, source(tmp_path / "s", kv([(2, "B"), (4, "x"), (6, "f")])), sql)
    version = metrics["tableVersion"]
    assert rows(table) == [(1, "a"), (2, "B"), (3, "c"), (5, "e"), (6, "f")]
    check_row_ids(table, before, mark, version, kept={1, 3, 5}, updated={2}, inserted={6})
    actions = check_actions(table, version, mark=mark)
    changes = [pq.read_table(table / a["cdc"]["path"]) for a in actions if "cdc" in a]
    assert changes
    assert all(c.column_names == ["id", "v", "_change_type"] for c in changes)
    assert sorted(tuple(r.values()) for c in changes for r in c.to_pylist()) == [
        (2, "B", "update_postimage"), (2, "b", "update_preimage"), (4, "d", "delete"), (6, "f", "insert"),
    ]
    metadata = DeltaTable(table).metadata().configuration
    materialized = {metadata[ROW_ID_COLUMN], metadata[ROW_COMMIT_VERSION_COLUMN]}
    data_files = [pq.read_schema(table / a["add"]["path"]).names for a in actions if "add" in a]
    assert any(materialized <= set(names) for names in data_files)


def test_two_merges_in_a_row_keep_ids_of_inserted_and_copied_rows(
    spark: Any, target: Path, tmp_path: Path
) -> None:
    merge(spark, target, source(tmp_path / "s1", kv([(2, "B"), (6, "f")])), UPSERT)
    before, mark = stable_ids(target), high_water_mark(target)
    # 6 was inserted and 1 copied by the first merge: their ids are now materialized or defaults.
    metrics = merge(spark, target, source(tmp_path / "s2", kv([(6, "F"), (1, "A"), (8, "h")])), UPSERT)
    version = metrics["tableVersion"]
    assert rows(target) == [(1, "A"), (2, "B"), (3, "c"), (4, "d"), (5, "e"), (6, "F"), (8, "h")]
    check_row_ids(target, before, mark, version, kept={2, 3, 4, 5}, updated={1, 6}, inserted={8})
    check_actions(target, version, mark=mark)


@pytest.mark.parametrize("by_position", [False, True], ids=["through-spark", "by-position"])
def test_deletes_drop_ids_and_copies_keep_theirs(
    spark: Any, target: Path, tmp_path: Path, by_position: bool, request: pytest.FixtureRequest
) -> None:
    if by_position:
        request.getfixturevalue("copy_by_position")
    before, mark = stable_ids(target), high_water_mark(target)
    sql = (
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED AND s.v = 'x' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET *"
    )
    metrics = merge(spark, target, source(tmp_path / "s", kv([(1, "x"), (4, "x"), (5, "E")])), sql)
    version = metrics["tableVersion"]
    assert rows(target) == [(2, "b"), (3, "c"), (5, "E")]
    check_row_ids(target, before, mark, version, kept={2, 3}, updated={5}, inserted=set())
    check_actions(target, version, mark=mark)


def test_insert_only_merge_assigns_fresh_ids(spark: Any, target: Path, tmp_path: Path) -> None:
    before, mark = stable_ids(target), high_water_mark(target)
    sql = "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *"
    metrics = merge(spark, target, source(tmp_path / "s", kv([(1, "z"), (9, "i")])), sql)
    version = metrics["tableVersion"]
    assert rows(target) == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"), (9, "i")]
    check_row_ids(target, before, mark, version, kept={1, 2, 3, 4, 5}, updated=set(), inserted={9})
    check_actions(target, version, mark=mark)


def test_supported_but_not_enabled_assigns_fresh_ids_without_preserving(spark: Any, tmp_path: Path) -> None:
    # PROTOCOL.md: "When Row Tracking is supported but not yet enabled writers cannot preserve Row IDs".
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]))
    enable_features(table, row_tracking=True, row_tracking_enabled=False)
    mark = high_water_mark(table)
    metrics = merge(spark, table, source(tmp_path / "s", kv([(2, "B"), (3, "c")])), UPSERT)
    version = metrics["tableVersion"]
    assert rows(table) == [(1, "a"), (2, "B"), (3, "c")]
    actions = check_actions(table, version, mark=mark)
    assert "tags" not in actions[0]["commitInfo"]
    for add in (a["add"] for a in actions if "add" in a):
        assert pq.read_schema(table / add["path"]).names == ["id", "v"]  # nothing materialized
    after = stable_ids(table)
    assert all(row_id > mark and commit == version for row_id, commit in after.values())


def test_ids_survive_a_checkpoint(spark: Any, target: Path, tmp_path: Path) -> None:
    merge(spark, target, source(tmp_path / "s1", kv([(2, "B")])), UPSERT)
    DeltaTable(str(target)).create_checkpoint()
    snapshot = load_snapshot(str(target))
    mark = high_water_mark(target)
    assert json.loads(snapshot.domains["delta.rowTracking"]) == {"rowIdHighWaterMark": mark}
    assert {f.path: (f.base_row_id, f.default_row_commit_version) for f in snapshot.files} == {
        p: (a["baseRowId"], a["defaultRowCommitVersion"]) for p, a in live_files(target).items()
    }
    before, mark = stable_ids(target), high_water_mark(target)
    metrics = merge(spark, target, source(tmp_path / "s2", kv([(3, "C"), (7, "g")])), UPSERT)
    check_row_ids(target, before, mark, metrics["tableVersion"], kept={1, 2, 4, 5}, updated={3}, inserted={7})


def test_ids_are_assigned_for_the_version_the_commit_lands_on(
    spark: Any, target: Path, tmp_path: Path
) -> None:
    # The plan is made on version 2; another merge lands version 3 first; the commit then goes on 3.
    snapshot = load_snapshot(str(target))
    pq.write_table(kv([(9, "i"), (10, "j")]), target / "extra.parquet")
    extra = WrittenFile(
        path="extra.parquet", size=os.path.getsize(target / "extra.parquet"), partition_values={},
        stats_json='{"numRecords":2}', num_records=2, modification_time=0,
    )  # fmt: skip
    plan = plan_commit(
        snapshot, removes=(), adds=(extra,), new_schema=None, operation_parameters={},
        operation_metrics={}, app_transaction=None, commit_metadata={},
    )  # fmt: skip
    assert commit_actions(plan, base_version=2)[-1]["add"]["baseRowId"] == high_water_mark(target) + 1
    merge(spark, target, source(tmp_path / "s", kv([(6, "f")])), UPSERT)
    mark = high_water_mark(target)
    actions = commit_actions(plan, base_version=3)
    _check_actions(actions)
    assert actions[-1]["add"]["baseRowId"] == mark + 1
    assert actions[-1]["add"]["defaultRowCommitVersion"] == 4
    (domain,) = [a["domainMetadata"] for a in actions if "domainMetadata" in a]
    assert json.loads(domain["configuration"]) == {"rowIdHighWaterMark": mark + 2}


@pytest.mark.parametrize(("persistent", "by_position"), [(True, False), (False, False), (False, True)],
                         ids=["merge-on-read", "copy-on-write", "copy-on-write-by-position"])
def test_rows_of_a_file_with_a_deletion_vector_keep_their_physical_ids(
    spark: Any, tmp_path: Path, persistent: bool, by_position: bool, request: pytest.FixtureRequest
) -> None:
    if not persistent:
        request.getfixturevalue("copy_on_write")
    if by_position:
        request.getfixturevalue("copy_by_position")
    # Row 1 (id 2) of the first file is deleted: id 3, at index 2, must keep baseRowId + 2, not + 1.
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "c")]), kv([(4, "d")]))
    files = live_files(table)
    first = min(files, key=lambda p: json.loads(files[p]["stats"])["minValues"]["id"])
    add_deletion_vectors(table, {first: ([1], "i")})
    enable_features(table, row_tracking=True)
    assert rows(table) == [(1, "a"), (3, "c"), (4, "d")]
    before = {k: v for k, v in stable_ids(table).items() if k != 2}
    assert before[3][0] == live_files(table)[first]["baseRowId"] + 2
    mark = high_water_mark(table)
    metrics = merge(spark, table, source(tmp_path / "s", kv([(3, "C"), (5, "e")])), UPSERT)
    version = metrics["tableVersion"]
    assert rows(table) == [(1, "a"), (3, "C"), (4, "d"), (5, "e")]
    check_row_ids(table, before, mark, version, kept={1, 4}, updated={3}, inserted={5})
    (remove,) = [a["remove"] for a in check_actions(table, version, mark=mark) if "remove" in a]
    assert "deletionVector" in remove


def test_partitioned_table_keeps_ids_across_partitions(spark: Any, tmp_path: Path) -> None:
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "a"), (4, "b")]), partition_by=["v"])
    enable_features(table, row_tracking=True)
    before, mark = stable_ids(table), high_water_mark(table)
    sql = (
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET id = s.id * 10 "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    metrics = merge(spark, table, source(tmp_path / "s", kv([(1, "x"), (5, "b")])), sql)
    version = metrics["tableVersion"]
    assert rows(table) == [(2, "b"), (3, "a"), (4, "b"), (5, "b"), (10, "a")]
    before[10] = before.pop(1)  # the updated row's key changed with it
    check_row_ids(table, before, mark, version, kept={2, 3, 4}, updated={10}, inserted={5})
    check_actions(table, version, mark=mark)


def _written(records: int) -> WrittenFile:
    return WrittenFile(path=f"f{records}", size=1, partition_values={}, stats_json="{}", num_records=records,
                       modification_time=0)  # fmt: skip


def test_assign_row_ids_gives_disjoint_ranges_above_the_mark() -> None:
    fields, domain = assign_row_ids([_written(3), _written(0), _written(2)], high_water_mark=10, version=7)
    assert [f["baseRowId"] for f in fields] == [11, 14, 14]
    assert {f["defaultRowCommitVersion"] for f in fields} == {7}
    assert domain == {
        "domain": "delta.rowTracking", "configuration": '{"rowIdHighWaterMark":15}', "removed": False
    }
    no_rows = assign_row_ids([_written(0)], high_water_mark=-1, version=1)
    assert no_rows == ([{"baseRowId": 0, "defaultRowCommitVersion": 1}], None)


@pytest.mark.parametrize(
    ("features", "configuration", "expected"),
    [
        ({"domainMetadata"}, {"delta.enableRowTracking": "true"}, None),
        ({"rowTracking", "domainMetadata"}, {"delta.rowTrackingSuspended": "true"}, None),
        ({"rowTracking", "domainMetadata"}, {}, RowTracking()),
        (
            {"rowTracking", "domainMetadata"},
            {"delta.enableRowTracking": "TRUE", ROW_ID_COLUMN: "_id", ROW_COMMIT_VERSION_COLUMN: "_version"},
            RowTracking(row_id_column="_id", commit_version_column="_version"),
        ),
    ],
)
def test_row_tracking_is_assigned_when_supported_and_preserved_when_enabled(
    features: set[str], configuration: dict[str, str], expected: RowTracking | None
) -> None:
    snapshot = TargetSnapshot(
        table_uri="file:///t", version=1, schema=StructType(), schema_json='{"type":"struct","fields":[]}',
        partition_columns=(), configuration=configuration, metadata_id="m", files=(),
        protocol=TableProtocol(1, 7, writer_features=frozenset(features)),
    )  # fmt: skip
    assert row_tracking(snapshot) == expected
    assert high_water_mark_of({}) == -1
