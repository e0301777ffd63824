"""One commit attempt: what lands in the log (read back by deltalake), CAS, app transactions, evolution."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.delta_merge.commit.actions import (
    MERGE_ENGINE,
    attempt_commit,
    plan_commit,
)
from spark_jobs.delta_merge.errors import (
    ConcurrentModificationError,
    MergeAnalysisError,
    MergeExecutionError,
    MergeSpecError,
)
from spark_jobs.delta_merge.protocol.delta_log import find_app_transaction_commit, read_commit_info
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot, load_snapshot

PARAMS = {
    "predicate": '["(t.id = s.id)"]',
    "matchedPredicates": '[{"actionType":"update"}]',
    "notMatchedPredicates": '[{"actionType":"insert"}]',
    "notMatchedBySourcePredicates": "[]",
}
METRICS = {"numTargetRowsUpdated": 1, "numTargetRowsInserted": 1, "numTargetFilesRemoved": 1}


def _table(root: Path) -> TargetSnapshot:
    write_deltalake(root, pa.table({"id": pa.array([1, 2], pa.int64()), "p": ["a", "b"]}), partition_by=["p"])
    return load_snapshot(str(root))


def _write(root: Path, partition: str, rows: dict[str, list[Any]]) -> WrittenFile:
    path = f"p={partition}/part-{uuid.uuid4()}.parquet"
    data = pa.table({k: pa.array(v, pa.int64() if k == "id" else pa.string()) for k, v in rows.items()})
    pq.write_table(data, root / path)
    stats = {
        "numRecords": data.num_rows,
        "minValues": {"id": min(rows["id"])},
        "maxValues": {"id": max(rows["id"])},
        "nullCount": {"id": 0},
    }
    return WrittenFile(
        path=path,
        size=(root / path).stat().st_size,
        partition_values={"p": partition},
        stats_json=json.dumps(stats),
        num_records=data.num_rows,
        modification_time=1_700_000_000_000,
    )


def commit_on_snapshot(snapshot: TargetSnapshot, **kwargs: Any) -> int:
    """Plan the commit and attempt it on exactly ``snapshot.version`` (no conflict loop)."""
    storage_options = kwargs.pop("storage_options", None)
    return attempt_commit(plan_commit(snapshot, **kwargs), base_version=snapshot.version,
                          storage_options=storage_options)


def _commit(snapshot: TargetSnapshot, removes: list[LiveFile], adds: list[WrittenFile], **kwargs: Any) -> int:
    options: dict[str, Any] = {
        "new_schema": None,
        "operation_parameters": PARAMS,
        "operation_metrics": METRICS,
        "app_transaction": None,
        "commit_metadata": {},
    }
    return commit_on_snapshot(snapshot, removes=removes, adds=adds, **{**options, **kwargs})


def _rows(root: Path) -> list[dict[str, Any]]:
    # QueryBuilder (DataFusion) is an independent reader that avoids the pyarrow-dataset exit abort.
    reader = QueryBuilder().register("t", DeltaTable(root)).execute("SELECT * FROM t ORDER BY id")
    return pa.table(reader.read_all()).to_pylist()  # type: ignore[no-any-return]


def _log(root: Path, version: int) -> list[dict[str, Any]]:
    text = (root / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _file_in(snapshot: TargetSnapshot, partition: str) -> LiveFile:
    return next(f for f in snapshot.files if f.partition_values["p"] == partition)


def test_commit_removes_and_adds(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    old = _file_in(snapshot, "a")
    new = _write(tmp_path, "a", {"id": [1, 3]})
    metadata = {"airflow": {"dag_id": "d", "run_id": "r"}, "userMetadata": "nightly upsert"}
    version = _commit(snapshot, [old], [new], app_transaction=("dag.task", 7), commit_metadata=metadata)
    assert version == 1
    assert _rows(tmp_path) == [{"id": 1, "p": "a"}, {"id": 2, "p": "b"}, {"id": 3, "p": "a"}]
    assert {f.path for f in load_snapshot(str(tmp_path)).files} == {new.path, _file_in(snapshot, "b").path}

    actions = _log(tmp_path, 1)
    remove = next(a["remove"] for a in actions if "remove" in a)
    assert remove == {
        "path": old.path,
        "dataChange": True,
        "deletionTimestamp": remove["deletionTimestamp"],
        "extendedFileMetadata": True,
        "partitionValues": {"p": "a"},
        "size": old.size,
    }
    add = next(a["add"] for a in actions if "add" in a)
    assert (add["path"], add["dataChange"], json.loads(add["stats"])["numRecords"]) == (new.path, True, 2)
    txn = next(a["txn"] for a in actions if "txn" in a)
    assert (txn["appId"], txn["version"], txn["lastUpdated"]) == ("dag.task", 7, remove["deletionTimestamp"])
    assert not any("metaData" in a for a in actions)

    info = read_commit_info(str(tmp_path), 1)
    assert info == next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "MERGE"
    assert info["operationParameters"] == PARAMS
    assert info["operationMetrics"] == {k: str(v) for k, v in METRICS.items()}
    assert (info["readVersion"], info["isolationLevel"], info["isBlindAppend"]) == (
        0,
        "Serializable",
        False,
    )
    assert (info["mergeEngine"], info["mergeOperation"]) == (MERGE_ENGINE, "MERGE")
    assert info["airflow"] == {"dag_id": "d", "run_id": "r"}
    assert info["userMetadata"] == "nightly upsert"
    assert info["engineInfo"].startswith(f"{MERGE_ENGINE}/")
    assert info["txnId"] == info["mergeCommitToken"]
    assert isinstance(info["timestamp"], int)
    # Delta's order: commitInfo first, then txn, removes, adds.
    assert [next(iter(a)) for a in actions] == ["commitInfo", "txn", "remove", "add"]
    assert DeltaTable(tmp_path).history(1)[0]["operation"] == "MERGE"


def test_stale_snapshot_fails_as_compare_and_swap(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    write_deltalake(tmp_path, pa.table({"id": pa.array([9], pa.int64()), "p": ["a"]}), mode="append")
    new = _write(tmp_path, "a", {"id": [1]})
    with pytest.raises(
        ConcurrentModificationError,
        match=r"read version 0 and committed on version 0, but version 1 exists now\. Nothing",
    ):
        _commit(snapshot, [_file_in(snapshot, "a")], [new], app_transaction=("app", 1))
    assert DeltaTable(tmp_path).version() == 1
    assert DeltaTable(tmp_path).transaction_version("app") is None


def test_find_app_transaction_commit(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    assert find_app_transaction_commit(str(tmp_path), "app", 1) is None
    _commit(snapshot, [], [_write(tmp_path, "a", {"id": [5]})], app_transaction=("app", 1))
    snapshot = load_snapshot(str(tmp_path))
    _commit(snapshot, [], [_write(tmp_path, "b", {"id": [6]})], app_transaction=("other", 1))
    snapshot = load_snapshot(str(tmp_path))
    _commit(snapshot, [], [_write(tmp_path, "b", {"id": [7]})], app_transaction=("app", 2))

    found = find_app_transaction_commit(str(tmp_path), "app", 1)
    assert found is not None
    assert found[0] == 1
    assert found[1]["mergeEngine"] == MERGE_ENGINE
    assert find_app_transaction_commit(f"file://{tmp_path}", "app", 2) == (
        3,
        read_commit_info(str(tmp_path), 3),
    )
    assert find_app_transaction_commit(str(tmp_path), "app", 3) is None
    assert find_app_transaction_commit(str(tmp_path), "nobody", 1) is None


def test_read_commit_info_of_a_missing_version(tmp_path: Path) -> None:
    _table(tmp_path)
    with pytest.raises(MergeAnalysisError, match="has no commit file for version 4"):
        read_commit_info(str(tmp_path), 4)


def test_schema_evolution_is_one_commit_with_its_metadata(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    evolved = StructType(
        [*snapshot.schema.fields, StructField("extra", StringType(), True, {"comment": "new"})]
    )
    new = _write(tmp_path, "a", {"id": [3], "extra": ["x"]})
    version = _commit(snapshot, [_file_in(snapshot, "a")], [new], new_schema=evolved)
    assert version == 1
    after = load_snapshot(str(tmp_path))
    assert after.schema == evolved
    assert _rows(tmp_path) == [{"id": 2, "p": "b", "extra": None}, {"id": 3, "p": "a", "extra": "x"}]
    actions = _log(tmp_path, 1)
    assert [next(iter(a)) for a in actions] == ["commitInfo", "metaData", "remove", "add"]
    metadata = actions[1]["metaData"]
    before = DeltaTable(tmp_path, version=0).metadata()
    assert (metadata["id"], metadata["partitionColumns"], metadata["createdTime"]) == (
        before.id,
        ["p"],
        before.created_time,
    )
    assert metadata["format"] == {"provider": "parquet", "options": {}}
    assert after.metadata_id == snapshot.metadata_id


def test_property_updates_are_committed_with_the_data(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    new = _write(tmp_path, "a", {"id": [3]})
    updates = {"delta.checkpointInterval": "7"}
    assert _commit(snapshot, [], [new], configuration_updates=updates) == 1
    actions = _log(tmp_path, 1)
    assert [next(iter(a)) for a in actions] == ["commitInfo", "metaData", "add"]
    assert actions[1]["metaData"]["configuration"]["delta.checkpointInterval"] == "7"
    assert load_snapshot(str(tmp_path)).schema == snapshot.schema
    # A property that already has the value is no change: no metaData action.
    after = load_snapshot(str(tmp_path))
    assert _commit(after, [], [_write(tmp_path, "a", {"id": [4]})], configuration_updates=updates) == 2
    assert [next(iter(a)) for a in _log(tmp_path, 2)] == ["commitInfo", "add"]


def test_unchanged_schema_makes_one_commit(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    same = StructType([StructField("id", LongType()), StructField("p", StringType())])
    assert _commit(snapshot, [], [_write(tmp_path, "a", {"id": [3]})], new_schema=same) == 1


def test_plan_validation(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    ghost = LiveFile(
        path="p=a/ghost.parquet", size=1, partition_values={"p": "a"}, stats=None, modification_time=0
    )
    kwargs: dict[str, Any] = {
        "adds": [],
        "new_schema": None,
        "operation_parameters": {},
        "operation_metrics": {},
        "app_transaction": None,
        "commit_metadata": {},
    }
    with pytest.raises(MergeExecutionError, match="removes files that are not live at version 0"):
        plan_commit(snapshot, removes=[ghost], **kwargs)
    with pytest.raises(MergeSpecError, match="reserved commitInfo keys; found mergeEngine, operation"):
        plan_commit(
            snapshot, removes=[], **{**kwargs, "commit_metadata": {"operation": "x", "mergeEngine": "y"}}
        )
    with pytest.raises(MergeSpecError, match="isolation_level must be one of"):
        plan_commit(snapshot, removes=[], isolation_level="Chaos", **kwargs)
    with pytest.raises(MergeSpecError, match="must be JSON-serializable"):
        plan_commit(snapshot, removes=[], **{**kwargs, "commit_metadata": {"x": float("nan")}})
    bad_partition = WrittenFile("p=a/x.parquet", 1, {"q": "a"}, "{}", 0, 0)
    with pytest.raises(MergeExecutionError, match="partition values do not name"):
        plan_commit(snapshot, removes=[], **{**kwargs, "adds": [bad_partition]})


def test_process_exits_cleanly_after_snapshot_and_commit(tmp_path: Path) -> None:
    # deltalake's pyarrow-dataset path can abort at exit (rc 134); the paths used here must not.
    _table(tmp_path)
    script = textwrap.dedent(f"""
        from spark_jobs.delta_merge.commit.actions import attempt_commit, plan_commit
        from spark_jobs.delta_merge.protocol.delta_log import read_commit_info
        from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
        s = load_snapshot({str(tmp_path)!r})
        plan = plan_commit(s, removes=[s.files[0]], adds=[], new_schema=None, operation_parameters={{}},
                           operation_metrics={{}}, app_transaction=("x", 1), commit_metadata={{}})
        v = attempt_commit(plan, base_version=s.version)
        print(v, read_commit_info({str(tmp_path)!r}, v)["mergeEngine"])
    """)
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"1 {MERGE_ENGINE}"), done.stderr


def test_plan_commits_on_a_newer_base_keeping_its_read_version(tmp_path: Path) -> None:
    # The shape the conflict-checking loop uses: plan once, attempt on the latest checked version.
    snapshot = _table(tmp_path)
    plan = plan_commit(
        snapshot,
        removes=[],
        adds=[_write(tmp_path, "a", {"id": [3]})],
        new_schema=None,
        operation_parameters=PARAMS,
        operation_metrics=METRICS,
        app_transaction=None,
        commit_metadata={},
    )
    write_deltalake(tmp_path, pa.table({"id": pa.array([9], pa.int64()), "p": ["b"]}), mode="append")
    with pytest.raises(ConcurrentModificationError):
        attempt_commit(plan, base_version=0)
    assert attempt_commit(plan, base_version=1) == 2
    assert read_commit_info(str(tmp_path), 2)["readVersion"] == 0
    assert [r["id"] for r in _rows(tmp_path)] == [1, 2, 3, 9]


def test_a_lost_race_leaves_nothing_of_the_merge_even_with_a_schema_change(tmp_path: Path) -> None:
    snapshot = _table(tmp_path)
    evolved = StructType([*snapshot.schema.fields, StructField("extra", StringType())])
    plan = plan_commit(
        snapshot,
        removes=[],
        adds=[_write(tmp_path, "a", {"id": [3], "extra": [None]})],
        new_schema=evolved,
        operation_parameters=PARAMS,
        operation_metrics=METRICS,
        app_transaction=("app", 1),
        commit_metadata={},
    )
    write_deltalake(tmp_path, pa.table({"id": pa.array([9], pa.int64()), "p": ["b"]}), mode="append")
    with pytest.raises(ConcurrentModificationError, match=r"but version 1 exists now\. Nothing"):
        attempt_commit(plan, base_version=0)
    table = DeltaTable(tmp_path)
    assert (table.version(), table.transaction_version("app")) == (1, None)
    assert [f.name for f in table.schema().fields] == ["id", "p"]


def test_a_checkpoint_follows_every_interval(tmp_path: Path) -> None:
    write_deltalake(
        tmp_path,
        pa.table({"id": pa.array([1], pa.int64()), "p": ["a"]}),
        partition_by=["p"],
        configuration={"delta.checkpointInterval": "2"},
    )
    for n in (2, 3, 4):
        snapshot = load_snapshot(str(tmp_path))
        _commit(snapshot, [], [_write(tmp_path, "a", {"id": [n]})])
    checkpoints = sorted(p.name for p in (tmp_path / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints == ["00000000000000000002.checkpoint.parquet"]
    assert [r["id"] for r in _rows(tmp_path)] == [1, 2, 3, 4]
