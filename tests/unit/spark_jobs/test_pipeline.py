"""run_merge end to end on the shared local Spark session: rows and commits read back through deltalake.

Every merge is checked twice: the rows, through deltalake's query engine (an implementation independent
of the job), and the commit, through the commit JSON in ``_delta_log/`` and ``DeltaTable.history()``
(the files removed and added, their sizes and record counts against the merge's metrics).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import MergeJobError
from spark_jobs.delta_merge.metrics import DELTA_METRIC_NAMES, MergeMetrics
from spark_jobs.delta_merge.protocol.delta_log import read_commit_info
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.scenario_harness import multiset

UTC = dt.timezone.utc
METRIC_FIELDS = {f.name for f in fields(MergeMetrics)}
ROW_METRICS = (
    "numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
    "numTargetRowsMatchedUpdated", "numTargetRowsMatchedDeleted", "numTargetRowsNotMatchedBySourceUpdated",
    "numTargetRowsNotMatchedBySourceDeleted", "numTargetRowsCopied", "numOutputRows",
)  # fmt: skip
KV = pa.schema([("id", pa.int64()), ("v", pa.string())])


# -- building tables ------------------------------------------------------------------------------------
def kv(rows: Sequence[Sequence[Any]], schema: pa.Schema = KV) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)


def make_target(path: Path, *batches: pa.Table, partition_by: Sequence[str] | None = None) -> Path:
    """A Delta table written by deltalake: one version (and at least one file) per batch."""
    partitions = list(partition_by) if partition_by else None
    for batch in batches:
        write_deltalake(str(path), batch, mode="append", partition_by=partitions)
    return path


def parquet_source(directory: Path, table: pa.Table) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / "part-0.parquet")
    return {"uri": str(directory), "format": "parquet"}


def sorted_rows(path: Path, columns: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
    """Live rows (deltalake), NULL ids first, then by id and the remaining values; checked equal, as a
    multiset, to what the delta-kernel reader (DuckDB's Delta extension) reads."""
    names = list(columns) if columns else [f.name for f in DeltaTable(str(path)).schema().fields]
    listed = read_rows(path, columns=names)
    assert multiset(read_rows_with_kernel(path, columns=names)) == multiset(listed)
    rows = [tuple(r) for r in listed]
    return sorted(rows, key=lambda r: (r[0] is not None, r[0] if r[0] is not None else 0, repr(r)))


def merge(spark: Any, target: Path, source: Mapping[str, Any], sql: str, **options: Any) -> dict[str, Any]:
    spec = {"target": {"uri": str(target)}, "source": dict(source), "merge_sql": sql, "options": options}
    metrics: dict[str, Any] = run_merge(spark, spec).to_dict()
    return metrics


# -- reading the log back -------------------------------------------------------------------------------
def log_actions(path: Path, version: int) -> list[dict[str, Any]]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def live_files(path: Path) -> dict[str, dict[str, Any]]:
    """add.path -> add action, replaying the commit JSONs (tests never checkpoint)."""
    live: dict[str, dict[str, Any]] = {}
    for version in range(table_version(path) + 1):
        for action in log_actions(path, version):
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return live


def all_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def check_commit(
    path: Path, before: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Any], *,
    partition_columns: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The merge's commit against its metrics and the live files before it; returns (removes, adds)."""
    assert set(metrics) == METRIC_FIELDS
    assert metrics["dryRun"] is False
    version = metrics["tableVersion"]
    assert version == table_version(path)
    assert metrics["readVersion"] < version
    actions = log_actions(path, version)
    removes = [a["remove"] for a in actions if "remove" in a]
    adds = [a["add"] for a in actions if "add" in a]
    after = live_files(path)
    assert {r["path"] for r in removes} == set(before) - set(after)
    assert {a["path"] for a in adds} == set(after) - set(before)
    assert all(r["dataChange"] and r["size"] == before[r["path"]]["size"] for r in removes)

    assert metrics["numTargetFilesBeforeSkipping"] == len(before)
    assert metrics["numTargetBytesBeforeSkipping"] == sum(a["size"] for a in before.values())
    assert metrics["numTargetFilesRemoved"] == len(removes)
    assert metrics["numTargetBytesRemoved"] == sum(r["size"] for r in removes)
    assert metrics["numTargetFilesAdded"] == len(adds)
    assert metrics["numTargetBytesAdded"] == sum(a["size"] for a in adds)
    for add in adds:
        assert add["dataChange"] is True
        assert os.path.getsize(_decoded(path, add["path"])) == add["size"]
    # Every row written (copied, updated, inserted) lands in exactly one added file.
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == metrics["numOutputRows"]
    assert metrics["numOutputRows"] == (
        metrics["numTargetRowsCopied"] + metrics["numTargetRowsInserted"] + metrics["numTargetRowsUpdated"]
    )
    assert metrics["numTargetRowsUpdated"] == (
        metrics["numTargetRowsMatchedUpdated"] + metrics["numTargetRowsNotMatchedBySourceUpdated"]
    )
    assert metrics["numTargetRowsDeleted"] == (
        metrics["numTargetRowsMatchedDeleted"] + metrics["numTargetRowsNotMatchedBySourceDeleted"]
    )
    if partition_columns:
        def partitions(actions: list[dict[str, Any]]) -> int:
            return len({tuple(a["partitionValues"].get(c) for c in partition_columns) for a in actions})
        assert metrics["numTargetPartitionsRemovedFrom"] == partitions(removes)
        assert metrics["numTargetPartitionsAddedTo"] == partitions(adds)
    else:
        assert metrics["numTargetPartitionsRemovedFrom"] == metrics["numTargetPartitionsAddedTo"] == 0

    info = read_commit_info(str(path), version)
    assert (info["operation"], info["mergeOperation"]) == ("MERGE", "MERGE")
    assert info["readVersion"] == metrics["readVersion"]
    stored = info["operationMetrics"]
    assert all(isinstance(v, str) for v in stored.values())
    for name in (*DELTA_METRIC_NAMES, "numOutputRows", "materializeSourceTimeMs"):
        assert stored[name] == str(metrics[name]), name
    history = DeltaTable(str(path)).history(1)[0]
    assert history["version"] == version
    assert history["operationMetrics"] == stored
    assert history["operationParameters"]["predicate"] == info["operationParameters"]["predicate"]
    return removes, adds


def _decoded(root: Path, add_path: str) -> Path:
    from urllib.parse import unquote

    return root / unquote(add_path)


def row_metrics(metrics: Mapping[str, Any]) -> dict[str, int]:
    return {name: metrics[name] for name in ROW_METRICS}


def expected_rows(**values: int) -> dict[str, int]:
    """Row metrics with the given values, the rest 0; numOutputRows derived as Delta does."""
    out = dict.fromkeys(ROW_METRICS, 0) | values
    out["numTargetRowsUpdated"] = (
        out["numTargetRowsMatchedUpdated"] + out["numTargetRowsNotMatchedBySourceUpdated"])
    out["numTargetRowsDeleted"] = (
        out["numTargetRowsMatchedDeleted"] + out["numTargetRowsNotMatchedBySourceDeleted"])
    out["numOutputRows"] = (
        out["numTargetRowsCopied"] + out["numTargetRowsInserted"] + out["numTargetRowsUpdated"])
    return out


# -- clauses --------------------------------------------------------------------------------------------
CLAUSES_TARGET = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int64())])
CLAUSES_SOURCE = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int64()), ("op", pa.string())])
ALL_CLAUSES_SQL = """
MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED AND s.op = 'delete' THEN DELETE
WHEN MATCHED AND s.op LIKE 'upd%' THEN UPDATE SET t.v = s.v, t.n = t.n + 100
WHEN MATCHED AND s.op <> 'keep' THEN UPDATE SET *
WHEN NOT MATCHED AND s.op = 'cols' THEN INSERT (id, v) VALUES (s.id, upper(s.v))
WHEN NOT MATCHED THEN INSERT *
WHEN NOT MATCHED BY SOURCE AND t.n > 50 THEN DELETE
WHEN NOT MATCHED BY SOURCE AND t.n > 5 THEN UPDATE SET v = concat(t.v, '?'), n = -t.n
"""


def test_every_clause_kind_conditional_first_match_wins(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", kv(
        [(1, "a", 1), (2, "b", 2), (3, "c", 3), (4, "d", 4), (5, "e", 60), (6, "f", 10), (7, "g", 3)],
        CLAUSES_TARGET))
    source = parquet_source(tmp_path / "s", kv([
        (1, "A", 11, "delete"),  # would also satisfy the 2nd UPDATE: the first clause that holds acts
        (2, "B", 12, "update"),  # ditto: explicit SET, not SET *
        (3, "C", 13, "star"),
        (4, "D", 14, "keep"),    # no MATCHED clause holds: copied unchanged
        (8, "h", 18, "cols"),    # INSERT (cols): n is NULL
        (9, "i", 19, "other"),   # INSERT *: the extra source column op is ignored
    ], CLAUSES_SOURCE))
    before = live_files(target)

    metrics = merge(spark, target, source, ALL_CLAUSES_SQL)

    assert sorted_rows(target) == [
        (2, "B", 102), (3, "C", 13), (4, "d", 4), (6, "f?", -10), (7, "g", 3), (8, "H", None), (9, "i", 19),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=6, numTargetRowsInserted=2, numTargetRowsMatchedUpdated=2,
        numTargetRowsMatchedDeleted=1, numTargetRowsNotMatchedBySourceUpdated=1,
        numTargetRowsNotMatchedBySourceDeleted=1, numTargetRowsCopied=2,
    )
    assert metrics["numSourceRowsInSecondScan"] == 6
    assert metrics["materializeSourceReason"] == "NON_DETERMINISTIC_SOURCE_NON_DELTA"
    removes, _ = check_commit(target, before, metrics)
    assert len(removes) == 1

    params = read_commit_info(str(target), metrics["tableVersion"])["operationParameters"]
    assert json.loads(params["predicate"]) == ["t.id = s.id"]
    assert json.loads(params["matchedPredicates"]) == [
        {"predicate": "s.op = 'delete'", "actionType": "delete"},
        {"predicate": "s.op LIKE 'upd%'", "actionType": "update"},
        {"predicate": "s.op <> 'keep'", "actionType": "update"},
    ]
    assert json.loads(params["notMatchedPredicates"]) == [
        {"predicate": "s.op = 'cols'", "actionType": "insert"}, {"actionType": "insert"},
    ]
    assert json.loads(params["notMatchedBySourcePredicates"]) == [
        {"predicate": "t.n > 50", "actionType": "delete"}, {"predicate": "t.n > 5", "actionType": "update"},
    ]
    # Delta writes each parameter as compact JSON, "predicate" before "actionType".
    assert params["notMatchedPredicates"] == '[{"predicate":"s.op = \'cols\'","actionType":"insert"},' \
        '{"actionType":"insert"}]'


def test_unconditional_clauses_in_the_structural_form(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b"), (3, "c")]))
    source = parquet_source(tmp_path / "s", kv([(2, "x"), (4, "y")]))
    before = live_files(target)
    spec = {
        "target": {"uri": str(target)},
        "source": source,
        "target_alias": "tgt",
        "source_alias": "src",
        "condition": "tgt.id = src.id",
        "clauses": [
            {"when": "matched", "action": "delete"},
            {"when": "not_matched", "action": "insert",
             "values": {"id": "src.id", "v": "concat('new-', src.v)"}},
            {"when": "not_matched_by_source", "action": "update", "set": {"v": "concat(tgt.v, '!')"}},
        ],
    }

    metrics = run_merge(spark, spec).to_dict()

    assert sorted_rows(target) == [(1, "a!"), (3, "c!"), (4, "new-y")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsInserted=1, numTargetRowsMatchedDeleted=1,
        numTargetRowsNotMatchedBySourceUpdated=2,
    )
    check_commit(target, before, metrics)
    params = read_commit_info(str(target), metrics["tableVersion"])["operationParameters"]
    assert params["matchedPredicates"] == '[{"actionType":"delete"}]'
    assert params["notMatchedPredicates"] == '[{"actionType":"insert"}]'
    assert params["notMatchedBySourcePredicates"] == '[{"actionType":"update"}]'


def test_matched_only_merge_rewrites_only_files_a_clause_acts_on(spark: Any, tmp_path: Path) -> None:
    # Two files; the source matches a row in each, but only the row in the second satisfies the clause.
    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]), kv([(3, "c"), (4, "d")]))
    source = parquet_source(tmp_path / "s", kv([(1, "keep"), (3, "change")]))
    before = live_files(target)

    sql = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED AND s.v = 'change' THEN UPDATE SET v = s.v"
    metrics = merge(spark, target, source, sql, materialize_source="all")

    assert sorted_rows(target) == [(1, "a"), (2, "b"), (3, "change"), (4, "d")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsCopied=1)
    assert metrics["materializeSourceReason"] == "MATERIALIZE_ALL"
    removes, _ = check_commit(target, before, metrics)
    assert [r["path"] for r in removes] == [
        p for p, a in before.items() if json.loads(a["stats"])["minValues"]["id"] == 3]


# -- NULL keys ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("operator", "expected", "counts"),
    [
        ("=", [(None, "s"), (None, "t?"), (1, "b")],
         {"numTargetRowsMatchedUpdated": 1, "numTargetRowsInserted": 1,
          "numTargetRowsNotMatchedBySourceUpdated": 1}),
        ("<=>", [(None, "s"), (1, "b")], {"numTargetRowsMatchedUpdated": 2}),
    ],
)
def test_null_keys(
    spark: Any, tmp_path: Path, operator: str, expected: list[Any], counts: dict[str, int]
) -> None:
    target = make_target(tmp_path / "t", kv([(None, "t"), (1, "a")]))
    source = parquet_source(tmp_path / "s", kv([(None, "s"), (1, "b")]))
    before = live_files(target)

    metrics = merge(spark, target, source, f"""
        MERGE INTO t USING s ON t.id {operator} s.id
        WHEN MATCHED THEN UPDATE SET v = s.v
        WHEN NOT MATCHED THEN INSERT *
        WHEN NOT MATCHED BY SOURCE THEN UPDATE SET v = concat(t.v, '?')""")

    assert sorted_rows(target) == expected
    assert row_metrics(metrics) == expected_rows(numSourceRows=2, **counts)
    check_commit(target, before, metrics)


# -- empty tables ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sql", "expected", "counts"),
    [
        ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
         [(1, "a"), (2, "b")], {}),
        ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
         "WHEN NOT MATCHED BY SOURCE THEN DELETE",
         [], {"numTargetRowsNotMatchedBySourceDeleted": 2}),
    ],
    ids=["upsert", "delete-not-matched-by-source"],
)
def test_empty_source(
    spark: Any, tmp_path: Path, sql: str, expected: list[Any], counts: dict[str, int]
) -> None:
    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]))
    source = parquet_source(tmp_path / "s", KV.empty_table())
    before = live_files(target)

    metrics = merge(spark, target, source, sql)

    assert sorted_rows(target) == expected
    assert row_metrics(metrics) == expected_rows(**counts)
    if not expected:
        removes, adds = check_commit(target, before, metrics)
        assert (len(removes), adds) == (1, [])
    else:
        # Nothing changed: no version recorded, as Delta skips empty commits.
        assert metrics["tableVersion"] == metrics["readVersion"] == table_version(target) == 0
        assert set(live_files(target)) == set(before)


@pytest.mark.parametrize("source_rows", [[(1, "a"), (2, "b")], []], ids=["empty-target", "both-empty"])
def test_empty_target(spark: Any, tmp_path: Path, source_rows: list[tuple[int, str]]) -> None:
    target = make_target(tmp_path / "t", KV.empty_table())
    source = parquet_source(tmp_path / "s", kv(source_rows))

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *
        WHEN NOT MATCHED BY SOURCE THEN DELETE""")

    assert sorted_rows(target) == source_rows
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=len(source_rows), numTargetRowsInserted=len(source_rows))
    if source_rows:
        _, adds = check_commit(target, {}, metrics)
        assert adds
    else:  # nothing changed: no version recorded
        assert metrics["tableVersion"] == table_version(target) == 0


NO_MATCH = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE"


def test_a_merge_that_changes_nothing_records_no_version_unless_told_or_keyed(
    spark: Any, tmp_path: Path
) -> None:
    # Delta's skipRecordingEmptyCommits: on by default, off by its conf.
    target = make_target(tmp_path / "t", kv([(1, "a")]))
    source = parquet_source(tmp_path / "s", kv([(9, "z")]))

    skipped = merge(spark, target, source, NO_MATCH)
    assert (skipped["readVersion"], skipped["tableVersion"], table_version(target)) == (0, 0, 0)
    assert skipped["numSourceRows"] == 1

    spark.conf.set("spark.databricks.delta.skipRecordingEmptyCommits", "false")
    try:
        recorded = merge(spark, target, source, NO_MATCH)
    finally:
        spark.conf.unset("spark.databricks.delta.skipRecordingEmptyCommits")
    assert (recorded["tableVersion"], table_version(target)) == (1, 1)
    assert [a for a in log_actions(target, 1) if "add" in a or "remove" in a] == []

    # An app transaction is recorded even when nothing changed: a rerun must find it applied.
    spec = {"target": {"uri": str(target)}, "source": source, "merge_sql": NO_MATCH,
            "run": {"app_id": "nightly", "app_version": 3}}  # fmt: skip
    keyed = run_merge(spark, spec).to_dict()
    assert (keyed["tableVersion"], table_version(target)) == (2, 2)
    (txn,) = [a["txn"] for a in log_actions(target, 2) if "txn" in a]
    assert (txn["appId"], txn["version"]) == ("nightly", 3)
    assert run_merge(spark, spec).to_dict()["skipped"] is True


SKIP_EMPTY = "spark.databricks.delta.skipRecordingEmptyCommits"


@pytest.mark.parametrize(
    ("source_rows", "clauses", "confs"),
    [
        ([(9, "z")], "WHEN MATCHED THEN DELETE", {}),
        ([(9, "z")], "WHEN MATCHED THEN DELETE", {SKIP_EMPTY: "false"}),
        ([], "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *", {}),
        ([(9, "z")], "WHEN NOT MATCHED AND s.v = 'never' THEN INSERT *", {}),
        ([(1, "a")], "WHEN MATCHED THEN UPDATE SET *", {}),
    ],
    ids=["no-match", "no-match-recorded", "empty-source", "insert-condition-never-true", "same-values"],
)
def test_a_merge_records_a_version_exactly_when_delta_s_merge_does(
    spark: Any, tmp_path: Path, source_rows: list[tuple[int, str]], clauses: str, confs: dict[str, str]
) -> None:
    """Empty commits against Delta 4.4's own MERGE on a copy of the same table, not a transcription."""
    import shutil

    from tests.support.delta_reference import delta_merge_outcome
    from tests.support.scenario_harness import session_confs

    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]))
    delta_copy = tmp_path / "delta"
    shutil.copytree(target, delta_copy)
    source = parquet_source(tmp_path / "s", kv(source_rows))

    with session_confs(spark, confs):
        metrics = merge(spark, target, source, f"MERGE INTO t USING s ON t.id = s.id {clauses}")
    delta = delta_merge_outcome(
        spark, delta_copy, f"MERGE INTO target t USING source s ON t.id = s.id {clauses}",
        spark.createDataFrame(source_rows, "id BIGINT, v STRING"), confs=confs,
    )  # fmt: skip

    assert "error" not in delta, delta
    assert (metrics["tableVersion"], table_version(target)) == (delta["version"], delta["version"])
    assert multiset(read_rows(target, columns=["id", "v"])) == delta["rows"]


# -- partitions and data skipping -----------------------------------------------------------------------
PARTITIONED = pa.schema([
    ("id", pa.int64()), ("region", pa.string()), ("bucket", pa.int32()), ("day", pa.date32()),
    ("v", pa.string()),
])
PARTITION_COLUMNS = ("region", "bucket", "day")


def test_partitioned_target_skips_partitions_and_moves_rows(spark: Any, tmp_path: Path) -> None:
    day1, day2, day3 = dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)
    leap = dt.date(2024, 2, 29)
    target = make_target(tmp_path / "t", kv([
        (1, "us east", 1, day1, "a"), (2, "us east", 1, day1, "b"),
        (3, "a=b", 2, day2, "c"), (4, "eu west", 3, day3, "d"), (6, None, 2, day2, "n"),
    ], PARTITIONED), partition_by=PARTITION_COLUMNS)
    before = live_files(target)
    assert len(before) == 4

    # 1. A target-only predicate on a partition column: only the 'us east' file is read and rewritten.
    source = parquet_source(tmp_path / "s1", kv([(2, "B"), (4, "never")]))
    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id AND t.region = 'us east'
        WHEN MATCHED THEN UPDATE SET v = s.v""")

    assert sorted_rows(target) == [
        (1, "us east", 1, day1, "a"), (2, "us east", 1, day1, "B"), (3, "a=b", 2, day2, "c"),
        (4, "eu west", 3, day3, "d"), (6, None, 2, day2, "n"),
    ]
    assert metrics["numTargetFilesBeforeSkipping"] == 4
    assert metrics["numTargetFilesAfterSkipping"] == 1
    assert metrics["numTargetPartitionsAfterSkipping"] == 1
    assert metrics["numTargetFilesRemoved"] == metrics["numTargetPartitionsRemovedFrom"] == 1
    assert row_metrics(metrics) == expected_rows(numSourceRows=2, numTargetRowsMatchedUpdated=1,
                                                 numTargetRowsCopied=1)
    removes, adds = check_commit(target, before, metrics, partition_columns=PARTITION_COLUMNS)
    us_east = {"region": "us east", "bucket": "1", "day": "2024-01-01"}
    assert [r["partitionValues"] for r in removes] == [us_east]
    assert [a["partitionValues"] for a in adds] == [us_east]
    untouched = {p: a for p, a in before.items() if a["partitionValues"]["region"] != "us east"}
    after = live_files(target)
    assert {p: after[p] for p in untouched} == untouched  # same add.path, same action

    # 2. A date-partition predicate (the NULL-region file shares the day); the update moves row 3 to
    # another partition and keeps row 6 in the NULL partition; the insert creates a partition.
    before = after
    source = parquet_source(tmp_path / "s2", kv([
        (3, "us east", 2, day2, "c2"), (5, "new = part x", 7, leap, "e"), (6, None, 2, day2, "n2"),
    ], PARTITIONED))
    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id AND t.day = DATE'2024-01-02'
        WHEN MATCHED THEN UPDATE SET region = s.region, v = s.v
        WHEN NOT MATCHED THEN INSERT *""")

    assert sorted_rows(target) == [
        (1, "us east", 1, day1, "a"), (2, "us east", 1, day1, "B"), (3, "us east", 2, day2, "c2"),
        (4, "eu west", 3, day3, "d"), (5, "new = part x", 7, leap, "e"), (6, None, 2, day2, "n2"),
    ]
    assert (metrics["numTargetFilesAfterSkipping"], metrics["numTargetFilesRemoved"]) == (2, 2)
    assert metrics["numTargetPartitionsAddedTo"] == 3
    assert row_metrics(metrics) == expected_rows(numSourceRows=3, numTargetRowsMatchedUpdated=2,
                                                 numTargetRowsInserted=1)
    removes, adds = check_commit(target, before, metrics, partition_columns=PARTITION_COLUMNS)
    assert {r["partitionValues"]["region"] for r in removes} == {"a=b", None}
    assert {tuple(a["partitionValues"][c] for c in PARTITION_COLUMNS) for a in adds} == {
        ("new = part x", "7", "2024-02-29"), ("us east", "2", "2024-01-02"), (None, "2", "2024-01-02")}
    assert not any(a["partitionValues"]["region"] == "a=b" for a in live_files(target).values())


def test_data_skipping_on_stats_prunes_files_of_an_unpartitioned_target(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", *[kv([(base + i, f"v{base + i}") for i in range(1, 11)])
                                           for base in (0, 100, 200, 300)])
    before = live_files(target)
    assert len(before) == 4
    source = parquet_source(tmp_path / "s", kv([(105, "new"), (205, "new"), (5, "dup"), (400, "new")]))

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id AND t.id > 100
        WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *""")

    expected = [(i, f"v{i}") for base in (0, 100, 200, 300) for i in range(base + 1, base + 11)]
    expected = [(i, "new" if i in (105, 205) else v) for i, v in expected]
    # Target row 5 fails `t.id > 100`, so source row 5 matches nothing and is inserted (Delta's semantics).
    expected += [(5, "dup"), (400, "new")]
    assert sorted_rows(target) == sorted(expected, key=lambda r: (r[0], repr(r)))
    assert metrics["numTargetFilesBeforeSkipping"] == 4
    assert metrics["numTargetFilesAfterSkipping"] == 3
    assert metrics["numTargetBytesAfterSkipping"] < metrics["numTargetBytesBeforeSkipping"]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=4, numTargetRowsMatchedUpdated=2, numTargetRowsInserted=2, numTargetRowsCopied=18)
    removes, _ = check_commit(target, before, metrics)
    assert len(removes) == 2
    untouched = {p for p, a in before.items() if json.loads(a["stats"])["minValues"]["id"] in (1, 301)}
    assert len(untouched) == 2
    assert untouched <= set(live_files(target))


def test_not_matched_by_source_sees_target_rows_failing_the_target_only_part_of_on(
    spark: Any, tmp_path: Path
) -> None:
    # Rows 1 and 2 fail `t.id > 100`, so they are not matched by source: no file may be skipped.
    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]), kv([(101, "c"), (102, "d")]))
    source = parquet_source(tmp_path / "s", kv([(101, "x"), (2, "y")]))
    before = live_files(target)

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id AND t.id > 100
        WHEN MATCHED THEN UPDATE SET v = s.v
        WHEN NOT MATCHED BY SOURCE AND t.id < 100 THEN DELETE""")

    assert sorted_rows(target) == [(101, "x"), (102, "d")]
    assert metrics["numTargetFilesAfterSkipping"] == 2
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsNotMatchedBySourceDeleted=2,
        numTargetRowsCopied=1)
    removes, _ = check_commit(target, before, metrics)
    assert len(removes) == 2


# -- nested types ---------------------------------------------------------------------------------------
ADDR = pa.struct([("city", pa.string()), ("zip", pa.string())])
ITEM = pa.struct([("sku", pa.string()), ("qty", pa.int64())])


def test_nested_struct_field_update_struct_by_name_and_arrays_of_structs(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("addr", ADDR), ("items", pa.list_(ITEM))])
    target = make_target(tmp_path / "t", pa.Table.from_pylist([
        {"id": 1, "addr": {"city": "Paris", "zip": "75001"}, "items": [{"sku": "a", "qty": 1}]},
        {"id": 2, "addr": {"city": "Rome", "zip": "00100"}, "items": []},
        {"id": 3, "addr": None, "items": None},
    ], schema=schema))
    # The source's struct fields come in another order, and qty is an int: assigned by name, widened.
    source_schema = pa.schema([
        ("id", pa.int64()), ("city", pa.string()),
        ("addr", pa.struct([("zip", pa.string()), ("city", pa.string())])),
        ("items", pa.list_(pa.struct([("qty", pa.int32()), ("sku", pa.string())]))),
    ])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 1, "city": "Lyon", "addr": {"zip": "69001", "city": "Lyon"},
         "items": [{"qty": 5, "sku": "z"}]},
        {"id": 2, "city": "Milan", "addr": {"zip": "20100", "city": "Milan"},
         "items": [{"qty": 2, "sku": "b"}, {"qty": 3, "sku": "c"}]},
        {"id": 4, "city": "Oslo", "addr": {"zip": "0150", "city": "Oslo"}, "items": [{"qty": 7, "sku": "d"}]},
    ], schema=source_schema))
    before = live_files(target)

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED AND s.id = 1 THEN UPDATE SET t.addr.city = s.city
        WHEN MATCHED THEN UPDATE SET addr = s.addr, items = s.items
        WHEN NOT MATCHED THEN INSERT *""")

    assert sorted_rows(target) == [
        (1, {"city": "Lyon", "zip": "75001"}, [{"sku": "a", "qty": 1}]),
        (2, {"city": "Milan", "zip": "20100"}, [{"sku": "b", "qty": 2}, {"sku": "c", "qty": 3}]),
        (3, None, None),
        (4, {"city": "Oslo", "zip": "0150"}, [{"sku": "d", "qty": 7}]),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=3, numTargetRowsMatchedUpdated=2, numTargetRowsInserted=1, numTargetRowsCopied=1)
    check_commit(target, before, metrics)
    assert DeltaTable(str(target)).schema().to_json() == DeltaTable(str(target), version=0).schema().to_json()


# -- casts ----------------------------------------------------------------------------------------------
def test_casts_to_target_types_and_datetime_round_trip(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([
        ("id", pa.int64()), ("price", pa.decimal128(10, 2)), ("qty", pa.int32()), ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")),
    ])
    t0 = dt.datetime(2024, 1, 1)
    target = make_target(tmp_path / "t", pa.Table.from_pylist([
        {"id": 1, "price": Decimal("1.50"), "qty": 1, "d": dt.date(2024, 1, 1), "ts": t0.replace(tzinfo=UTC),
         "ntz": t0},
    ], schema=schema))
    source_schema = pa.schema([
        ("id", pa.int32()), ("price", pa.decimal128(6, 3)), ("qty", pa.float64()), ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")),
    ])
    ts1 = dt.datetime(2024, 3, 10, 12, 34, 56, 123456, tzinfo=UTC)
    ts2 = dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    ntz1, ntz2 = dt.datetime(2024, 3, 10, 12, 34, 56, 654321), dt.datetime(2100, 1, 1)
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 1, "price": Decimal("2.345"), "qty": 2.7, "d": dt.date(2024, 2, 29), "ts": ts1, "ntz": ntz1},
        {"id": 2, "price": Decimal("-10.000"), "qty": -3.0, "d": dt.date(1999, 12, 31), "ts": ts2,
         "ntz": ntz2},
    ], schema=source_schema))
    before = live_files(target)

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *""")

    # int -> bigint, decimal(6,3) -> decimal(10,2) (rounded half up), double -> int (truncated).
    assert sorted_rows(target) == [
        (1, Decimal("2.35"), 2, dt.date(2024, 2, 29), ts1, ntz1),
        (2, Decimal("-10.00"), -3, dt.date(1999, 12, 31), ts2, ntz2),
    ]
    _, adds = check_commit(target, before, metrics)
    assert DeltaTable(str(target)).schema().to_json() == DeltaTable(str(target), version=0).schema().to_json()
    written = pq.read_schema(_decoded(target, adds[0]["path"]))
    assert written.field("ts").type == pa.timestamp("us", tz="UTC")  # INT64 micros, not INT96
    assert written.field("ntz").type == pa.timestamp("us")


def test_double_overflowing_int_fails_under_ansi_and_leaves_the_table(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int32())])
    target = make_target(tmp_path / "t", pa.Table.from_pylist([{"id": 1, "n": 1}], schema=schema))
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist(
        [{"id": 1, "n": 1e10}], schema=pa.schema([("id", pa.int64()), ("n", pa.float64())])))
    files = all_files(target)

    with pytest.raises(MergeJobError) as raised:
        merge(spark, target, source, "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *")

    # Delta's DELTA_CAST_OVERFLOW_IN_TABLE_WRITE, naming the column.
    delta_message = ('Failed to write a value of "DOUBLE" type into the "INT" type column `n` '
                     "due to an overflow")
    assert delta_message in str(raised.value)
    assert table_version(target) == 0
    assert all_files(target) == files
    assert sorted_rows(target) == [(1, 1)]


def test_legacy_policy_casts_without_failing(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("m", pa.int32())])
    target = make_target(tmp_path / "t", pa.Table.from_pylist([{"id": 1, "n": 1, "m": 1}], schema=schema))
    source_schema = pa.schema([("id", pa.int64()), ("n", pa.float64()), ("m", pa.string())])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 2, "n": 1e10, "m": "abc"}, {"id": 3, "n": -3.9, "m": "42"}, {"id": 1, "n": 0.0, "m": "0"},
    ], schema=source_schema))
    before = live_files(target)

    sql = "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *"
    metrics = merge(spark, target, source, sql, store_assignment_policy="LEGACY")

    assert sorted_rows(target) == [(1, 1, 1), (2, 2147483647, None), (3, -3, 42)]
    assert metrics["materializeSourceReason"] == "NOT_MATERIALIZED_AUTO_INSERT_ONLY"
    assert row_metrics(metrics) == expected_rows(numSourceRows=3, numTargetRowsInserted=2)
    removes, adds = check_commit(target, before, metrics)
    assert (removes, len(adds)) == ([], 1)


# -- schema evolution -----------------------------------------------------------------------------------
def test_schema_evolution_adds_columns_and_nested_fields(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("addr", pa.struct([("city", pa.string())]))])
    target = make_target(tmp_path / "t", pa.Table.from_pylist([
        {"id": 1, "v": "a", "addr": {"city": "Paris"}}, {"id": 2, "v": "b", "addr": {"city": "Rome"}},
    ], schema=schema))
    source_schema = pa.schema([
        ("id", pa.int64()), ("v", pa.string()), ("addr", ADDR), ("extra", pa.int32()),
    ])
    source = parquet_source(tmp_path / "s", pa.Table.from_pylist([
        {"id": 2, "v": "B", "addr": {"city": "Milan", "zip": "20100"}, "extra": 7},
        {"id": 3, "v": "C", "addr": {"city": "Oslo", "zip": "0150"}, "extra": 8},
    ], schema=source_schema))
    before = live_files(target)

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *""", schema_evolution=True)

    fields_ = json.loads(DeltaTable(str(target)).schema().to_json())["fields"]
    assert [f["name"] for f in fields_] == ["id", "v", "addr", "extra"]
    assert [f["name"] for f in fields_[2]["type"]["fields"]] == ["city", "zip"]
    assert (fields_[3]["type"], fields_[3]["nullable"]) == ("integer", True)
    assert sorted_rows(target) == [
        (1, "a", {"city": "Paris", "zip": None}, None),
        (2, "B", {"city": "Milan", "zip": "20100"}, 7),
        (3, "C", {"city": "Oslo", "zip": "0150"}, 8),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    # One version: the evolved metaData lands with the data, as Delta commits a schema-evolving merge.
    assert (metrics["readVersion"], metrics["tableVersion"]) == (0, 1)
    commit = log_actions(target, 1)
    kinds = [next(iter(a)) for a in commit]
    assert kinds[:2] == ["commitInfo", "metaData"]
    assert read_commit_info(str(target), 1)["operation"] == "MERGE"
    check_commit(target, before, metrics)


# -- dry run, source kinds, session confs ---------------------------------------------------------------
def test_dry_run_computes_metrics_and_writes_nothing(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]))
    source = parquet_source(tmp_path / "s", kv([(2, "B"), (3, "C")]))
    files = all_files(target)

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *""", dry_run=True)

    assert metrics["dryRun"] is True
    assert metrics["tableVersion"] == metrics["readVersion"] == 0
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetFilesAdded"]) == (1, 0)
    assert table_version(target) == 0
    assert all_files(target) == files
    assert sorted_rows(target) == [(1, "a"), (2, "b")]


def _csv(directory: Path) -> dict[str, Any]:
    directory.mkdir()
    (directory / "part-0.csv").write_text("id,v\n2,B\n3,C\n", encoding="utf-8")
    return {"uri": str(directory), "format": "csv", "options": {"header": "true"}}


def _json(directory: Path) -> dict[str, Any]:
    directory.mkdir()
    (directory / "part-0.json").write_text('{"id": 2, "v": "B"}\n{"id": 3, "v": "C"}\n', encoding="utf-8")
    return {"uri": str(directory), "format": "json"}


def _delta(directory: Path) -> dict[str, Any]:
    write_deltalake(str(directory), kv([(2, "B"), (3, "C")]))
    write_deltalake(str(directory), kv([(2, "later"), (99, "later")]), mode="overwrite")
    return {"uri": str(directory), "format": "delta", "version": 0}


def _query(directory: Path) -> dict[str, Any]:
    parquet_source(directory, kv([(2, "b"), (3, "c"), (50, "filtered")]))
    return {"query": f"SELECT id, upper(v) AS v FROM parquet.`{directory}` WHERE id < 10"}


@pytest.mark.parametrize(
    ("make_source", "options", "reason"),
    [
        (_csv, {}, "NON_DETERMINISTIC_SOURCE_NON_DELTA"),
        (_json, {"materialize_source": "all"}, "MATERIALIZE_ALL"),
        (_delta, {}, "NOT_MATERIALIZED_AUTO"),
        (_query, {"materialize_source": "none"}, "NOT_MATERIALIZED_NONE"),
    ],
    ids=["csv-header", "json", "delta-pinned-version", "sql-query"],
)
def test_source_kinds(
    spark: Any, tmp_path: Path, make_source: Any, options: dict[str, Any], reason: str
) -> None:
    target = make_target(tmp_path / "t", kv([(1, "a"), (2, "b")]))
    source = make_source(tmp_path / "s")
    before = live_files(target)

    metrics = merge(spark, target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *""", **options)

    assert sorted_rows(target) == [(1, "a"), (2, "B"), (3, "C")]
    assert metrics["materializeSourceReason"] == reason
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    check_commit(target, before, metrics)


def test_run_merge_restores_the_session_confs_it_changed(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", kv([(1, "a")]))
    source = parquet_source(tmp_path / "s", kv([(1, "b")]))
    keys = ("spark.sql.shuffle.partitions", "spark.sql.ansi.enabled", "spark.sql.storeAssignmentPolicy",
            "spark.sql.adaptive.enabled", "spark.sql.sources.parallelPartitionDiscovery.threshold")
    saved = {key: spark.conf.get(key, None) for key in keys}
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "7")
        spark.conf.set("spark.sql.ansi.enabled", "false")
        spark.conf.unset("spark.sql.storeAssignmentPolicy")
        expected = {key: spark.conf.get(key, None) for key in keys}

        metrics = merge(spark, target, source, "MERGE INTO t USING s ON t.id = s.id "
                        "WHEN MATCHED THEN UPDATE SET v = s.v", shuffle_partitions=3)

        assert {key: spark.conf.get(key, None) for key in keys} == expected
        assert metrics["numTargetRowsUpdated"] == 1
        assert metrics["materializeSourceReason"] == "NON_DETERMINISTIC_SOURCE_NON_DELTA"
        # The materialized source is dropped with the merge's last reference to it (on Spark Connect the
        # server releases it; a classic session's context cleaner unpersists it when the JVM collects it).
        assert metrics["materializeSourceTimeMs"] >= 0
        assert sorted_rows(target) == [(1, "b")]
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
