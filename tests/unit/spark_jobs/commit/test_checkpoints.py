"""Merges across the checkpoints the job has deltalake write: V2 checkpoints (``v2Checkpoint`` tables) and
column-mapped tables, read back by the job's own snapshot and by both readers after each checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake

from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from tests.support.delta_reader import read_rows
from tests.support.table_feature_fixtures import replay
from tests.unit.spark_jobs.commit.test_commit_protocol import _check_actions
from tests.unit.spark_jobs.test_pipeline import (
    kv,
    log_actions,
    make_target,
    merge,
    parquet_source,
    sorted_rows,
)

UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def _set_properties(
    table: Path, properties: dict[str, str], *, protocol: dict[str, Any] | None = None
) -> None:
    """Commit the next version with ``properties`` added to metaData (and a new protocol, if given)."""
    version, _, metadata, _, _ = replay(table)
    metadata = {**metadata, "configuration": {**metadata["configuration"], **properties}}
    actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": int(time.time() * 1000),
                                                     "operation": "SET TBLPROPERTIES"}}]
    actions += [{"protocol": protocol}] if protocol is not None else []
    actions.append({"metaData": metadata})
    text = "".join(json.dumps(a) + "\n" for a in actions)
    (table / "_delta_log" / f"{version + 1:020d}.json").write_text(text)


def _checkpoint_actions(table: Path, version: int) -> list[dict[str, Any]]:
    rows = pq.read_table(table / "_delta_log" / f"{version:020d}.checkpoint.parquet").to_pylist()
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


def test_v2_checkpoint_tables_merge_across_their_checkpoints(spark: Any, tmp_path: Path) -> None:
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]))
    v2 = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["v2Checkpoint"],
          "writerFeatures": ["v2Checkpoint"]}  # fmt: skip
    _set_properties(table, {"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "2"}, protocol=v2)
    expected = {1: "a", 2: "b"}
    for step, rows in enumerate([[(1, "A"), (3, "c")], [(2, "B")], [(4, "d"), (3, "C")]]):
        version = merge(spark, table, parquet_source(tmp_path / f"s{step}", kv(rows)), UPSERT)["tableVersion"]
        expected.update(dict(rows))
        _check_actions(log_actions(table, version))
        assert sorted_rows(table) == sorted(expected.items())
    assert version == 4
    # A V2 checkpoint (checkpointMetadata, here under the classic name), written at each even version.
    for checkpointed in (2, 4):
        actions = _checkpoint_actions(table, checkpointed)
        assert {"checkpointMetadata": {"version": checkpointed}} in actions
        assert {a["protocol"]["minReaderVersion"] for a in actions if "protocol" in a} == {3}
    snapshot = load_snapshot(str(table))
    assert snapshot.version == 4
    assert sum(f.stats.num_records for f in snapshot.files if f.stats is not None) == 4


def test_column_mapped_tables_merge_across_their_checkpoints(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "t"
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"], "p": ["x", "y"]})
    write_deltalake(str(table), data, partition_by=["p"],
                    configuration={"delta.columnMapping.mode": "name", "delta.checkpointInterval": "2"})
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("p", pa.string())])
    expected = {1: ("a", "x"), 2: ("b", "y")}
    steps = [[(1, "A", "x"), (3, "c", "y")], [(2, "B", "y")], [(3, "C", "y"), (4, "d", "x")]]
    for step, rows in enumerate(steps):
        source = parquet_source(tmp_path / f"s{step}", kv(rows, schema))
        version = merge(spark, table, source, UPSERT)["tableVersion"]
        expected.update({r[0]: r[1:] for r in rows})
        # Read by the job's snapshot too: after a checkpoint, partition values still come keyed physically.
        snapshot = load_snapshot(str(table))
        (physical,) = {key for f in snapshot.files for key in f.partition_values}
        assert physical != "p"
        assert {f.partition_values[physical] for f in snapshot.files} == {r[1][1] for r in expected.items()}
        # DuckDB's delta extension reads the partition column of mapped tables as NULL: compare the rest.
        assert sorted_rows(table, ["id", "v"]) == sorted((k, v[0]) for k, v in expected.items())
    assert version == 3
    assert (table / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    assert sorted(tuple(r) for r in read_rows(table, columns=["id", "v", "p"])) == sorted(
        (k, *v) for k, v in expected.items()
    )
