"""Merges into a table with every feature a current Delta deployment combines: column mapping, deletion
vectors, row tracking, the change data feed, in-commit timestamps and an identity column, all at once.

deltalake creates the column-mapped table; the other features come from the fixtures' hand commits, and a
last commit states the protocol with all of them (each fixture writes only its own). Rows are read back
by deltalake and by DuckDB's delta-kernel extension; ids, marks and timestamps are checked against the log.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector, deleted_rows
from spark_jobs.delta_merge.storage.log_store import log_store
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.support.identity_fixture import identity_metadata, make_identity_column
from tests.support.table_feature_fixtures import (
    ROW_COMMIT_VERSION_COLUMN,
    ROW_ID_COLUMN,
    enable_features,
    replay,
)
from tests.unit.spark_jobs.commit.test_commit_protocol import _check_actions
from tests.unit.spark_jobs.test_pipeline import log_actions, merge, parquet_source

READER_FEATURES = ["columnMapping", "deletionVectors"]
WRITER_FEATURES = [
    "appendOnly", "changeDataFeed", "columnMapping", "deletionVectors", "domainMetadata", "identityColumns",
    "inCommitTimestamp", "invariants", "rowTracking",
]
MERGE = (
    "MERGE INTO t USING s ON t.id = s.id "
    "WHEN MATCHED AND s.v = 'x' THEN DELETE "
    "WHEN MATCHED THEN UPDATE SET v = s.v "
    "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
)
SOURCE_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _rows(values: list[tuple[int, str, int]]) -> pa.Table:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("seq", pa.int64())])
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in values], schema=schema)


@pytest.fixture(params=["name", "id"])
def table(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """ids 1-3 and 4-5 in two files, seq = 1..5 (mark 5); row 2 (index 1 of the first file) deleted by a
    deletion vector."""
    path = tmp_path / "t"
    write_deltalake(str(path), _rows([(1, "a", 1), (2, "b", 2), (3, "c", 3)]),
                    configuration={"delta.columnMapping.mode": request.param})
    write_deltalake(str(path), _rows([(4, "d", 4), (5, "e", 5)]), mode="append")
    make_identity_column(path, "seq", start=1, step=1, always=True, high_water_mark=5, table_features=True)
    first = next(p for p, add in replay(path)[1].items() if json.loads(add["stats"])["numRecords"] == 3)
    add_deletion_vectors(path, {first: ([1], "i")})
    enable_features(path, row_tracking=True, change_data_feed=True, in_commit_timestamps=True)
    _state_protocol(path)
    assert _read(path) == [(1, "a", 1), (3, "c", 3), (4, "d", 4), (5, "e", 5)]
    return path


def _state_protocol(path: Path) -> None:
    version, _, metadata, _, _ = replay(path)
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"inCommitTimestamp": now, "timestamp": now, "operation": "SET TBLPROPERTIES"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": READER_FEATURES,
                      "writerFeatures": WRITER_FEATURES}},
        {"metaData": metadata},
    ]  # fmt: skip
    text = "".join(json.dumps(a) + "\n" for a in actions)
    (path / "_delta_log" / f"{version + 1:020d}.json").write_text(text)


def _read(path: Path) -> list[tuple[Any, ...]]:
    """Live rows (id, v, seq) by deltalake, checked equal to DuckDB's delta-kernel reader, sorted."""
    rows = sorted(tuple(r) for r in read_rows(path, columns=["id", "v", "seq"]))
    assert sorted(tuple(r) for r in read_rows_with_kernel(path, columns=["id", "v", "seq"])) == rows
    return rows


def _physical(path: Path) -> dict[str, str]:
    schema = json.loads(replay(path)[2]["schemaString"])
    return {f["name"]: f["metadata"]["delta.columnMapping.physicalName"] for f in schema["fields"]}


def _stable_row_ids(path: Path) -> dict[int, int]:
    """Key -> stable row id of every live row, from the log and the files (materialized value, else
    baseRowId + row index), the rows deletion vectors delete left out."""
    _, adds, metadata, _, _ = replay(path)
    materialized = metadata["configuration"][ROW_ID_COLUMN]
    key = _physical(path)["id"]
    table_uri = path.resolve().as_uri()
    found: dict[int, int] = {}
    for add in adds.values():
        vector = add.get("deletionVector")
        deleted = set(deleted_rows(log_store(table_uri), table_uri, DeletionVector.from_action(vector))
                      if vector else ())  # fmt: skip
        for index, row in enumerate(pq.read_table(path / add["path"]).to_pylist()):
            if index in deleted:
                continue
            assert row[key] not in found, row[key]
            stable = row.get(materialized)
            found[row[key]] = stable if stable is not None else add["baseRowId"] + index
    assert len(set(found.values())) == len(found)
    return found


def test_upsert_into_a_table_with_every_feature(spark: Any, table: Path, tmp_path: Path) -> None:
    ids_before = _stable_row_ids(table)
    previous_ict = replay_ict(table)
    source = parquet_source(tmp_path / "s", pa.table({"id": [1, 4, 6, 7], "v": ["A", "x", "f", "g"]},
                                                       schema=SOURCE_SCHEMA))
    metrics = merge(spark, table, source, MERGE)
    version = metrics["tableVersion"]
    counts = ("numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted")
    assert [metrics[name] for name in counts] == [1, 1, 2]
    rows = _read(table)
    assert [r[:2] for r in rows] == [(1, "A"), (3, "c"), (5, "e"), (6, "f"), (7, "g")]
    # The deleted row 2 never comes back; identity values drawn beyond the old mark, unique, mark moved.
    seq_of = {r[0]: r[2] for r in rows}
    new_seq = sorted(seq_of[k] for k in (6, 7))
    assert new_seq[0] > 5
    assert len(set(new_seq)) == 2
    assert identity_metadata(table, "seq")["delta.identity.highWaterMark"] == new_seq[-1]
    # Updated and copied rows keep their row ids; inserted rows get fresh ones above every old id.
    ids_after = _stable_row_ids(table)
    for key in (1, 3, 5):
        assert ids_after[key] == ids_before[key], key
    assert min(ids_after[6], ids_after[7]) > max(ids_before.values())

    actions = log_actions(table, version)
    _check_actions(actions)
    commit_info = actions[0]["commitInfo"]
    assert commit_info["operation"] == "MERGE"
    assert commit_info["inCommitTimestamp"] > previous_ict
    assert sum("metaData" in a for a in actions) == 1  # the moved identity mark, in the same commit
    physical = _physical(table)
    materialized = {replay(table)[2]["configuration"][c] for c in (ROW_ID_COLUMN, ROW_COMMIT_VERSION_COLUMN)}
    removes = {a["remove"]["path"]: a["remove"] for a in actions if "remove" in a}
    # Merge-on-read (deletion vectors are enabled): touched files come back with a vector, keeping their
    # row ids and commit version; only the changed rows are in new files.
    assert removes
    assert metrics["numTargetRowsCopied"] == 0
    for add in (a["add"] for a in actions if "add" in a):
        names = pq.read_schema(table / add["path"]).names
        assert set(physical.values()) <= set(names)
        assert "baseRowId" in add
        if add["path"] in removes:
            assert "deletionVector" in add
            assert add["defaultRowCommitVersion"] == removes[add["path"]]["defaultRowCommitVersion"]
        else:
            assert add["defaultRowCommitVersion"] == version
        assert set(json.loads(add["stats"])["minValues"]) <= set(physical.values())
    changes = [pq.read_table(table / a["cdc"]["path"]) for a in actions if "cdc" in a]
    assert changes
    by_physical = {v: k for k, v in physical.items()}
    change_rows = sorted(
        (r[physical["id"]], r[physical["v"]], r["_change_type"]) for c in changes for r in c.to_pylist()
    )
    assert change_rows == [(1, "A", "update_postimage"), (1, "a", "update_preimage"), (4, "d", "delete"),
                           (6, "f", "insert"), (7, "g", "insert")]
    for change in changes:
        assert not materialized & set(change.column_names)
        assert {by_physical.get(n, n) for n in change.column_names} == {"id", "v", "seq", "_change_type"}

    # The job's own output merges again: materialized ids, physical names and the new mark carry over.
    again = parquet_source(tmp_path / "s2", pa.table({"id": [6, 8], "v": ["F", "h"]}, schema=SOURCE_SCHEMA))
    merge(spark, table, again, MERGE)
    rows = _read(table)
    assert [r[:2] for r in rows] == [(1, "A"), (3, "c"), (5, "e"), (6, "F"), (7, "g"), (8, "h")]
    assert {r[0]: r[2] for r in rows}[6] == seq_of[6]  # updates keep identity values
    assert rows[-1][2] > new_seq[-1]
    final_ids = _stable_row_ids(table)
    assert all(final_ids[k] == ids_after[k] for k in (1, 3, 5, 6, 7))


def replay_ict(path: Path) -> int:
    version = replay(path)[0]
    return int(log_actions(path, version)[0]["commitInfo"]["inCommitTimestamp"])
