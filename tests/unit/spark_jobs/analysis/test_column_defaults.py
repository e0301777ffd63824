"""Merges into tables with column DEFAULT values (allowColumnDefaults) and with checkpointProtection.

Spark's analyzer (ResolveDefaultColumns) gives a column an INSERT column list leaves out its
``CURRENT_DEFAULT`` expression, and resolves an assignment ``c = DEFAULT`` to it (NULL for a nullable
column without one). Rows are read back by deltalake and the delta-kernel reader, and every commit's
actions are checked against PROTOCOL.md's shapes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.delta_merge.analysis.column_defaults import is_default_keyword
from spark_jobs.delta_merge.errors import MergeJobError
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.scenario_harness import multiset
from tests.support.table_feature_fixtures import set_column_defaults
from tests.unit.spark_jobs.commit.test_commit_protocol import _check_actions
from tests.unit.spark_jobs.merge.test_change_data_feed import changes
from tests.unit.spark_jobs.test_pipeline import all_files, kv, log_actions, make_target, merge, parquet_source

SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("v", pa.string()), ("tag", pa.string())])
SOURCE = pa.schema([("id", pa.int64()), ("v", pa.string())])
ON = "MERGE INTO t USING s ON t.id = s.id "
INSERT_ID_V = ON + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"


@pytest.mark.parametrize(
    ("value", "keyword"),
    [("DEFAULT", True), (" default ", True), ("`Default`", True), ("((DEFAULT))", True),
     ("DEFAULT + 1", False), ("s.default", False), ("defaults", False), ("'DEFAULT'", False)],
)
def test_which_values_are_the_default_keyword(value: str, keyword: bool) -> None:
    # As Spark's isExplicitDefaultColumn: one unqualified name DEFAULT, in any case, quoted or not.
    assert is_default_keyword(value) is keyword


def _rows(path: Path) -> list[tuple[Any, ...]]:
    """Live rows sorted by id, the same from deltalake and from the delta-kernel reader."""
    listed = read_rows(path)
    assert multiset(read_rows_with_kernel(path)) == multiset(listed)
    return sorted((tuple(r) for r in listed), key=lambda r: r[0])


def _table(tmp_path: Path, defaults: dict[str, str], **kwargs: Any) -> Path:
    target = make_target(tmp_path / "t", kv([(1, 10, "a", "t1"), (2, 20, "b", "t2")], SCHEMA), **kwargs)
    set_column_defaults(target, defaults)
    return target


def _source(tmp_path: Path, *rows: tuple[Any, ...], schema: pa.Schema = SOURCE) -> dict[str, Any]:
    return parquet_source(tmp_path / "s", kv(list(rows), schema))


def _checked_commit(target: Path, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    actions = log_actions(target, metrics["tableVersion"])
    _check_actions(actions)
    return actions


def test_an_insert_column_list_leaving_columns_out_fills_their_defaults(spark: Any, tmp_path: Path) -> None:
    # A BIGINT default whose value fits the INT column is narrowed, as Spark's coerceDefaultValue does.
    target = _table(tmp_path, {"n": "CAST(40 AS BIGINT) + 2", "tag": "'x' || 'y'"})
    source = _source(tmp_path, (2, "B"), (3, "C"))
    metrics = merge(spark, target, source, INSERT_ID_V)
    _checked_commit(target, metrics)
    assert _rows(target) == [(1, 10, "a", "t1"), (2, 20, "b", "t2"), (3, 42, "C", "xy")]


def test_a_column_without_a_default_stays_null_and_current_date_is_a_default(
    spark: Any, tmp_path: Path
) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("day", pa.date32())])
    target = make_target(tmp_path / "t", kv([(1, "a", dt.date(2020, 1, 1))], schema))
    set_column_defaults(target, {"day": "current_date()"})
    before = dt.date.today()
    insert_id = ON + "WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)"
    metrics = merge(spark, target, _source(tmp_path, (3, "C")), insert_id)
    _checked_commit(target, metrics)
    rows = _rows(target)
    assert rows[0] == (1, "a", dt.date(2020, 1, 1))
    assert rows[1][:2] == (3, None)
    assert before <= rows[1][2] <= dt.date.today()


def test_the_default_keyword_in_insert_values_and_update_set(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path, {"n": "7", "tag": "upper('dflt')"})
    source = _source(tmp_path, (1, "A"), (3, "C"))
    metrics = merge(
        spark, target, source,
        ON + "WHEN MATCHED THEN UPDATE SET n = DEFAULT, v = default, tag = `DEFAULT` "
        "WHEN NOT MATCHED THEN INSERT (id, n, v, tag) VALUES (s.id, DEFAULT, s.v, (Default))",
    )
    _checked_commit(target, metrics)
    # v has no default and is nullable: DEFAULT is NULL there, as Spark resolves it.
    assert _rows(target) == [(1, 7, None, "DFLT"), (2, 20, "b", "t2"), (3, 7, "C", "DFLT")]
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)


def test_a_source_column_named_default_is_a_column_not_the_keyword(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path, {"v": "'from default'"})
    named_default = pa.schema([("id", pa.int64()), ("default", pa.string())])
    source = _source(tmp_path, (3, "from source"), schema=named_default)
    metrics = merge(spark, target, source, ON + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, default)")
    _checked_commit(target, metrics)
    assert _rows(target)[-1] == (3, None, "from source", None)


def test_insert_star_and_update_star_take_the_source_values(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path, {"n": "7", "tag": "'dflt'"})
    source = _source(tmp_path, (2, 21, "B", None), (3, 31, "C", "c"), schema=SCHEMA)
    upsert = ON + "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    metrics = merge(spark, target, source, upsert)
    _checked_commit(target, metrics)
    assert _rows(target) == [(1, 10, "a", "t1"), (2, 21, "B", None), (3, 31, "C", "c")]


def _refused(spark: Any, target: Path, source: dict[str, Any], sql: str) -> MergeJobError:
    version, files = table_version(target), all_files(target)
    with pytest.raises(MergeJobError) as err:
        merge(spark, target, source, sql)
    assert (table_version(target), all_files(target)) == (version, files)
    return err.value


def test_default_on_a_not_null_column_without_a_default_is_refused_before_writing(
    spark: Any, tmp_path: Path
) -> None:
    target = make_target(tmp_path / "t", kv([(1, 10, "a", "t1")], SCHEMA))
    set_column_defaults(target, {"tag": "'x'"}, not_null=["n"])
    error = _refused(
        spark, target, _source(tmp_path, (3, "C")),
        ON + "WHEN NOT MATCHED THEN INSERT (id, n, v) VALUES (s.id, DEFAULT, s.v)",
    )
    assert error.error_class == "NO_DEFAULT_COLUMN_VALUE_AVAILABLE"
    assert "Can't determine the default value for `n` since it is not nullable and it has no " in str(error)


def test_default_inside_an_expression_is_refused(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path, {"n": "7"})
    error = _refused(
        spark, target, _source(tmp_path, (1, "A")), ON + "WHEN MATCHED THEN UPDATE SET n = DEFAULT + 1"
    )
    assert error.error_class == "DEFAULT_PLACEMENT_INVALID"
    assert "could not be directly assigned to a target column because it was part of an expression" in str(
        error
    )


REQUIRES_INT = "which requires int type, but the statement provided a value of incompatible"


@pytest.mark.parametrize(
    ("default", "error_class", "fragment"),
    [
        ("'abc'", "INVALID_DEFAULT_VALUE.DATA_TYPE", f"{REQUIRES_INT} string type"),
        ("3000000000", "INVALID_DEFAULT_VALUE.DATA_TYPE", f"{REQUIRES_INT} bigint type"),
        ("array(1)", "INVALID_DEFAULT_VALUE.DATA_TYPE", f"{REQUIRES_INT} array<int> type"),
        ("CAST(rand() AS INT)", "INVALID_DEFAULT_VALUE.NOT_CONSTANT", "which is not a constant expression"),
        ("id + 1", "INVALID_DEFAULT_VALUE.UNRESOLVED_EXPRESSION",
         "which fails to resolve as a valid expression"),
    ],
)
def test_a_default_that_fails_the_column_type_resolution_or_folding_is_refused(
    spark: Any, tmp_path: Path, default: str, error_class: str, fragment: str
) -> None:
    target = _table(tmp_path, {"n": default})
    error = _refused(
        spark, target, _source(tmp_path, (3, "C")), INSERT_ID_V
    )
    assert error.error_class == error_class
    assert f"destination column or variable `n` has a DEFAULT value {default}, {fragment}" in str(error)


def test_a_default_goes_through_the_expression_guard(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path, {"n": "(SELECT 1)"})
    error = _refused(
        spark, target, _source(tmp_path, (3, "C")), INSERT_ID_V
    )
    assert "DEFAULT value of column n" in str(error)
    assert "Subqueries are not supported" in str(error)


def test_a_partition_column_with_a_default(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path, {"tag": "'p' || '0'"}, partition_by=["tag"])
    metrics = merge(spark, target, _source(tmp_path, (3, "C")), INSERT_ID_V)
    actions = _checked_commit(target, metrics)
    assert [a["add"]["partitionValues"] for a in actions if "add" in a] == [{"tag": "p0"}]
    assert _rows(target)[-1] == (3, None, "C", "p0")


def test_the_change_data_feed_records_the_defaults(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", kv([(1, 10, "a", "t1")], SCHEMA))
    set_column_defaults(
        target, {"n": "5"}, writer_features=("allowColumnDefaults", "changeDataFeed"),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    metrics = merge(
        spark, target, _source(tmp_path, (1, "A"), (3, "C")),
        ON + "WHEN MATCHED THEN UPDATE SET n = DEFAULT " + INSERT_ID_V.removeprefix(ON),
    )
    _checked_commit(target, metrics)
    assert changes(target, metrics["tableVersion"]) == sorted([
        (1, 10, "a", "t1", "update_preimage"), (1, 5, "a", "t1", "update_postimage"),
        (3, 5, "C", None, "insert"),
    ], key=repr)  # fmt: skip
    assert _rows(target) == [(1, 5, "a", "t1"), (3, 5, "C", None)]


def test_checkpoint_protection_keeps_every_commit_when_the_merge_checkpoints(
    spark: Any, tmp_path: Path
) -> None:
    # PROTOCOL.md "Checkpoint Protection" binds only log cleanup. With zero log retention and expired
    # commits, the checkpoint the merge's commit is due for (deltalake's create_checkpoint, which takes
    # both features) must still leave every commit in place.
    target = make_target(tmp_path / "t", kv([(1, 10, "a", "t1")], SCHEMA), kv([(2, 20, "b", "t2")], SCHEMA))
    set_column_defaults(
        target, {"tag": "'d'"}, writer_features=("allowColumnDefaults", "checkpointProtection"),
        configuration={
            "delta.requireCheckpointProtectionBeforeVersion": "2",
            "delta.logRetentionDuration": "interval 0 seconds",
            "delta.enableExpiredLogCleanup": "true",
            "delta.checkpointInterval": "3",
        },
    )
    log = target / "_delta_log"
    expired = time.time() - 60 * 86400
    for commit in log.glob("*.json"):
        os.utime(commit, (expired, expired))
    commits = sorted(p.name for p in log.glob("*.json"))
    metrics = merge(spark, target, _source(tmp_path, (3, "C")), INSERT_ID_V)
    assert metrics["tableVersion"] == 3
    _checked_commit(target, metrics)
    assert sorted(p.name for p in log.glob("*.json")) == [*commits, f"{3:020d}.json"]
    assert (log / f"{3:020d}.checkpoint.parquet").exists()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 3
    assert DeltaTable(str(target), version=0).version() == 0  # the oldest version is still readable
    assert _rows(target) == [(1, 10, "a", "t1"), (2, 20, "b", "t2"), (3, None, "C", "d")]


def test_default_in_a_not_matched_by_source_update(spark: Any, tmp_path: Path) -> None:
    target = _table(tmp_path, {"n": "-1"})
    not_matched_by_source = ON + "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET n = DEFAULT"
    metrics = merge(spark, target, _source(tmp_path, (1, "A")), not_matched_by_source)
    _checked_commit(target, metrics)
    assert _rows(target) == [(1, 10, "a", "t1"), (2, -1, "b", "t2")]


def test_default_on_a_generated_column_is_refused(spark: Any, tmp_path: Path) -> None:
    # Delta computes a generated column; Spark allows no default on one (GENERATED_COLUMN_WITH_DEFAULT_VALUE).
    schema = pa.schema([
        pa.field("id", pa.int64()), pa.field("v", pa.string()),
        pa.field("w", pa.string(), metadata={"delta.generationExpression": "upper(v)"}),
    ])  # fmt: skip
    target = tmp_path / "t"
    DeltaTable.create(str(target), schema=schema)
    set_column_defaults(target, {}, writer_features=("allowColumnDefaults", "generatedColumns"))
    error = _refused(
        spark, target, _source(tmp_path, (3, "c")),
        ON + "WHEN NOT MATCHED THEN INSERT (id, v, w) VALUES (s.id, s.v, DEFAULT)",
    )
    assert "DEFAULT cannot be assigned to `w` in INSERT clause: it is a generated column" in str(error)
