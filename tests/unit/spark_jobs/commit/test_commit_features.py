"""In-commit timestamps and liquid clustering: what a merge commit must carry, and leave alone.

The tables get the features from a hand commit (``table_feature_fixtures``); rows are read back with
deltalake and DuckDB's Delta extension (delta-kernel), which must agree.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from spark_jobs.delta_merge.commit.actions import commit_actions, plan_commit
from spark_jobs.delta_merge.errors import UnsupportedTableFeatureError
from spark_jobs.delta_merge.protocol.files import WrittenFile
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from tests.support.table_feature_fixtures import enable_features, replay
from tests.unit.spark_jobs.commit.test_commit_protocol import _check_actions
from tests.unit.spark_jobs.test_pipeline import kv, log_actions, make_target, merge, sorted_rows
from tests.unit.spark_jobs.test_pipeline import parquet_source as source

UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
DAY_MS = 24 * 3600 * 1000


def in_commit_timestamp(table: Path, version: int) -> int:
    """The version's in-commit timestamp; a merge's commit is also checked against the protocol."""
    actions = log_actions(table, version)
    if actions[0]["commitInfo"]["operation"] == "MERGE":
        _check_actions(actions)
    assert "inCommitTimestamp" in actions[0]["commitInfo"]  # commitInfo comes first and carries it
    return int(actions[0]["commitInfo"]["inCommitTimestamp"])


@pytest.fixture
def ict_target(tmp_path: Path) -> Path:
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]), kv([(3, "c")]))
    enable_features(table, in_commit_timestamps=True)
    return table


def test_in_commit_timestamps_follow_the_clock(spark: Any, ict_target: Path, tmp_path: Path) -> None:
    started = int(time.time() * 1000)
    first = merge(spark, ict_target, source(tmp_path / "s1", kv([(2, "B")])), UPSERT)["tableVersion"]
    second = merge(spark, ict_target, source(tmp_path / "s2", kv([(4, "d")])), UPSERT)["tableVersion"]
    stamps = [in_commit_timestamp(ict_target, v) for v in (first - 1, first, second)]
    assert stamps[0] < stamps[1] < stamps[2]
    assert stamps[1] >= started
    config = replay(ict_target)[2]["configuration"]
    assert config["delta.inCommitTimestampEnablementVersion"] == str(first - 1)
    assert sorted_rows(ict_target) == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]


def test_in_commit_timestamps_stay_monotonic_when_the_previous_is_ahead_of_the_clock(
    spark: Any, tmp_path: Path
) -> None:
    table = make_target(tmp_path / "t", kv([(1, "a")]))
    ahead = int(time.time() * 1000) + DAY_MS  # a writer with a fast clock enabled the feature
    enabled = enable_features(table, in_commit_timestamps=True, in_commit_timestamp=ahead)
    first = merge(spark, table, source(tmp_path / "s1", kv([(1, "A")])), UPSERT)["tableVersion"]
    second = merge(spark, table, source(tmp_path / "s2", kv([(2, "b")])), UPSERT)["tableVersion"]
    assert (first, second) == (enabled + 1, enabled + 2)
    assert in_commit_timestamp(table, first) == ahead + 1
    assert in_commit_timestamp(table, second) == ahead + 2
    assert sorted_rows(table) == [(1, "A"), (2, "b")]


def test_in_commit_timestamp_follows_the_version_the_commit_lands_on(
    spark: Any, tmp_path: Path
) -> None:
    table = make_target(tmp_path / "t", kv([(1, "a")]))
    enable_features(table, in_commit_timestamps=True)
    snapshot = load_snapshot(str(table))
    pq.write_table(kv([(9, "i")]), table / "extra.parquet")
    extra = WrittenFile(
        path="extra.parquet", size=os.path.getsize(table / "extra.parquet"), partition_values={},
        stats_json='{"numRecords":1}', num_records=1, modification_time=0,
    )  # fmt: skip
    plan = plan_commit(
        snapshot, removes=(), adds=(extra,), new_schema=None, operation_parameters={},
        operation_metrics={}, app_transaction=None, commit_metadata={},
    )  # fmt: skip
    # Another writer lands the next version with a timestamp ahead of this clock.
    landed = snapshot.version + 1
    ahead = int(time.time() * 1000) + DAY_MS
    actions = [{"commitInfo": {"inCommitTimestamp": ahead, "timestamp": ahead, "operation": "WRITE"}}]
    (table / "_delta_log" / f"{landed:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    on_read = commit_actions(plan, base_version=snapshot.version)[0]["commitInfo"]["inCommitTimestamp"]
    on_landed = commit_actions(plan, base_version=landed)[0]["commitInfo"]["inCommitTimestamp"]
    assert on_read < ahead
    assert on_landed == ahead + 1


def test_clustered_table_keeps_its_clustering_domain(spark: Any, tmp_path: Path) -> None:
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]), kv([(3, "c")]))
    enable_features(table, clustering_columns=["id"])
    domains = replay(table)[4]
    metrics = merge(spark, table, source(tmp_path / "s", kv([(2, "B"), (4, "d")])), UPSERT)
    actions = log_actions(table, metrics["tableVersion"])
    _check_actions(actions)
    assert not [a for a in actions if "domainMetadata" in a]
    assert replay(table)[4] == domains
    clustering = load_snapshot(str(table)).domains["delta.clustering"]
    assert json.loads(clustering) == {"clusteringColumns": [["id"]]}
    for add in (a["add"] for a in actions if "add" in a):
        stats = json.loads(add["stats"])  # PROTOCOL.md: statistics on the clustering columns
        assert {"id"} <= set(stats["minValues"]) & set(stats["maxValues"]) & set(stats["nullCount"])
        assert "clusteringProvider" not in add  # the merge does not cluster
    assert sorted_rows(table) == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]


def test_clustering_column_without_statistics_is_refused(spark: Any, tmp_path: Path) -> None:
    table = make_target(tmp_path / "t", kv([(1, "a")]))
    version = enable_features(
        table, clustering_columns=["v"], configuration={"delta.dataSkippingNumIndexedCols": "1"}
    )
    with pytest.raises(UnsupportedTableFeatureError, match="clustering \\(columns v\\)"):
        merge(spark, table, source(tmp_path / "s", kv([(1, "A")])), UPSERT)
    assert replay(table)[0] == version
    assert sorted_rows(table) == [(1, "a")]


def test_all_three_features_through_a_checkpoint(spark: Any, tmp_path: Path) -> None:
    table = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]), kv([(3, "c")]))
    enable_features(
        table, row_tracking=True, in_commit_timestamps=True, clustering_columns=["id"],
        configuration={"delta.checkpointInterval": "4"},
    )  # fmt: skip
    stamps = []
    for step, rows in enumerate([[(1, "A"), (4, "d")], [(2, "B")], [(5, "e")]]):
        version = merge(spark, table, source(tmp_path / f"s{step}", kv(rows)), UPSERT)["tableVersion"]
        stamps.append(in_commit_timestamp(table, version))
    assert version == 5
    assert (table / "_delta_log" / f"{4:020d}.checkpoint.parquet").exists()  # deltalake checkpointed v4
    assert stamps == sorted(set(stamps))
    snapshot = load_snapshot(str(table))
    assert set(snapshot.domains) == {"delta.rowTracking", "delta.clustering"}
    assert all(f.base_row_id is not None and f.default_row_commit_version is not None for f in snapshot.files)
    assert sorted_rows(table) == [(1, "A"), (2, "B"), (3, "c"), (4, "d"), (5, "e")]


def test_a_checkpoint_deltalake_refuses_leaves_the_commit_standing(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # deltalake 1.6.6 reads clusteringColumns only as lists of name parts: with PROTOCOL.md's flat names
    # it reads the table but cannot checkpoint it. The merge's commit stands; the checkpoint is skipped.
    table = make_target(tmp_path / "t", kv([(1, "a")]), kv([(2, "b")]))
    enable_features(
        table, clustering_columns=["id"], flat_clustering_columns=True,
        configuration={"delta.checkpointInterval": "3"},
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="delta_merge"):
        version = merge(spark, table, source(tmp_path / "s", kv([(2, "B")])), UPSERT)["tableVersion"]
    assert version == 3
    assert any("checkpoint of" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)
    assert not list((table / "_delta_log").glob("*.checkpoint.parquet"))
    assert sorted_rows(table) == [(1, "a"), (2, "B")]
