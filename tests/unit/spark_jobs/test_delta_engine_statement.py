"""The delta engine's statement and spec, without Spark: what Delta's MERGE INTO is handed is the parsed
merge itself, and what Delta cannot honour is refused before anything runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.delta_merge.delta_engine import delta_merge_confs, delta_merge_statement
from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.spec import NATIVE_ONLY_OPTIONS, MergeSpec
from spark_jobs.delta_merge.statement.merge_sql import parse_merge_sql

SCENARIOS = json.loads((Path(__file__).parents[2] / "data" / "merge_scenarios.json").read_text())
ODD_NAMES = [
    "MERGE INTO target `t.x` USING source `s``y` ON `t.x`.`a b` = `s``y`.`a b` "
    "WHEN MATCHED AND `s``y`.`ü` > 0 THEN UPDATE SET `a b` = `s``y`.`a b`, nested.`dot.ted` = 1 "
    "WHEN NOT MATCHED THEN INSERT (`a b`, `ü`) VALUES (`s``y`.`a b`, 2)",
    "MERGE WITH SCHEMA EVOLUTION INTO target t USING source s ON t.id = s.id "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT * "
    "WHEN NOT MATCHED BY SOURCE AND t.id < 0 THEN DELETE",
    "MERGE INTO target t USING (SELECT id, max(v) AS v FROM source GROUP BY id) s ON t.id = s.id "
    "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET t.v = -1",
]


def _spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"uri": "/tables/t"}, "source": {"uri": "/landing/s"},
        "merge_sql": "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "options": {"engine": "delta"}, "run": {"app_id": "a", "app_version": 3},
    }  # fmt: skip
    for key, value in changes.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) and key in spec else value
    return spec


@pytest.mark.parametrize("sql", [s["merge_sql"] for s in SCENARIOS] + ODD_NAMES)
def test_delta_is_handed_the_parsed_merge_itself(sql: str) -> None:
    parsed = parse_merge_sql(sql)
    statement = delta_merge_statement(parsed, target_uri="/tables/a `quoted` path", source_view="view_1")

    again = parse_merge_sql(statement)

    # The same aliases, ON condition, clauses in their order, assignments and evolution; the source is the
    # view (a USING query is the view's own query), the target the spec's path.
    assert replace(again, source_query=None) == replace(parsed, source_query=None)
    assert again.source_query is None
    assert statement.startswith(("MERGE INTO delta.`/tables/a ``quoted`` path` AS ",
                                 "MERGE WITH SCHEMA EVOLUTION INTO delta.`/tables/a ``quoted`` path`"))
    assert "\nUSING `view_1` AS " in statement


def test_the_options_key_and_metadata_become_delta_s_session_confs() -> None:
    spec = MergeSpec.from_dict(_spec(
        options={"materialize_source": "all", "materialize_storage_level": "DISK_ONLY",
                 "schema_evolution": True, "store_assignment_policy": "LEGACY",
                 "resolve_structs_by_name": False, "shuffle_partitions": 7},
        run={"commit_metadata": {"team": "x", "n": 1}},
    ))  # fmt: skip

    confs = delta_merge_confs(spec)

    assert confs == {
        "spark.sql.ansi.enabled": "false",
        "spark.sql.storeAssignmentPolicy": "LEGACY",
        "spark.databricks.delta.merge.materializeSource": "all",
        "spark.databricks.delta.merge.materializeSource.rddStorageLevel": "DISK_ONLY",
        "spark.databricks.delta.schema.autoMerge.enabled": "true",
        "spark.databricks.delta.resolveMergeUpdateStructsByName.enabled": "false",
        "spark.databricks.delta.write.txnAppId": "a",
        "spark.databricks.delta.write.txnVersion": "3",
        "spark.sql.shuffle.partitions": "7",
        "spark.databricks.delta.commitInfo.userMetadata": '{"n": 1, "team": "x"}',
    }


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"options": {"dry_run": True}}, "options.dry_run"),
        ({"expected_metrics": {"numTargetRowsDeleted": {"equal_to": 0}}}, "expected_metrics"),
        ({"options": {"target_file_size": 1 << 20}}, "options.target_file_size"),
        ({"target": {"storage_options": {"AWS_REGION": "eu-west-1"}}}, "target.storage_options"),
    ],
)
def test_what_only_the_native_job_does_is_refused_naming_it(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(MergeSpecError) as refused:
        MergeSpec.from_dict(_spec(**changes)).validate()

    message = str(refused.value)
    assert f"options.engine 'delta' cannot honour {named} ({named}: {NATIVE_ONLY_OPTIONS[named]})" in message
    assert "options.engine 'native'" in message
    # The native job takes the same spec.
    native = _spec(**changes)
    native["options"] = {**native["options"], "engine": "native"}
    MergeSpec.from_dict(native).validate()


def test_the_delta_engine_needs_the_idempotency_key_and_a_known_engine_name() -> None:
    with pytest.raises(MergeSpecError, match=r"needs run.app_id and run.app_version"):
        MergeSpec.from_dict(_spec(run={"app_id": None, "app_version": None})).validate()
    with pytest.raises(MergeSpecError, match=r"options.engine: expected one of native, delta, found 'spark'"):
        MergeSpec.from_dict(_spec(options={"engine": "spark"})).validate()


def test_a_session_without_delta_is_refused_before_anything_is_read() -> None:
    from types import SimpleNamespace

    from spark_jobs.delta_merge.delta_engine import run_delta_merge

    spec = MergeSpec.from_dict(_spec(target={"uri": "/nowhere/no-table"}))
    # Only the session's conf is asked: a session without Delta's SQL extension.
    session = SimpleNamespace(conf=SimpleNamespace(get=lambda key, default=None: "com.example.Other"))

    with pytest.raises(MergeSpecError) as refused:
        run_delta_merge(session, spec, spec.validate())  # type: ignore[arg-type]

    assert "needs Delta Lake in the Spark session" in str(refused.value)
    assert "io.delta.sql.DeltaSparkSessionExtension (found com.example.Other)" in str(refused.value)
