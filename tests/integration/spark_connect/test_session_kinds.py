"""The merge job on a Spark Connect server gives what it gives on a classic session, and what Delta's own
MERGE gives: Delta's MERGE test scenarios (a sample, as data) run through the job on both session kinds and
through Delta's ``MERGE INTO`` (delta-spark 4.4, in the same classic session), and must give the same rows,
error classes and metrics (the differential cases against delta-rs run on both kinds too:
tests/unit/spark_jobs/test_differential.py); the job's code reaches the server's Python workers as a
session artifact; the server admits only clients with its token."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.connect_server import ConnectServer, connect_mode
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.delta_reference import JOB_ONLY_METRICS, delta_scenario_outcome
from tests.support.scenario_harness import (
    create_target,
    dataframe,
    load_scenarios,
    merge_spec,
    multiset,
    scenario_confs,
)

SCENARIOS = load_scenarios()
# What differs between two runs of one merge whatever the session: times.
TIMES = {"executionTimeMs", "scanTimeMs", "rewriteTimeMs", "materializeSourceTimeMs", "stageTimesMs"}
# Depend on the number of files the original test's table had, not on the merge's semantics.
FILE_DEPENDENT_METRICS = {"numTargetRowsCopied", "numOutputRows"}
# Where the job deliberately differs from Delta 4.4's MERGE on the same table:
# - how its writer lays rows out: Delta writes a rewrite of an unpartitioned table as one file (adaptive
#   execution coalesces its shuffle), the job as one file a shuffle partition, and the two Parquet writers'
#   encodings differ, so the files and bytes added differ (both add files exactly when the merge writes);
WRITER_LAYOUT_METRICS = {"numTargetFilesAdded", "numTargetBytesAdded"}
# - the error of a statement both refuse, where Delta 4.4's is not the class Delta documents for the case:
#   a SET of a struct and of one of its fields fails in Delta 4.4 with an internal assertion
#   (DELTA_MERGE_UNEXPECTED_ASSIGNMENT_KEY); the job raises DELTA_CONFLICT_SET_COLUMN, as Delta did before
#   4.x.
DIFFERENT_ERROR_CLASSES = {("DELTA_CONFLICT_SET_COLUMN", "DELTA_MERGE_UNEXPECTED_ASSIGNMENT_KEY")}


def scenario_outcome(spark: Any, target: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    """Run one scenario into ``target`` (a copy of its target table): the rows, metrics and version, or
    the error."""
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import MergeJobError

    view = "source_" + scenario["id"].replace("-", "_")
    dataframe(spark, scenario["source_schema"], scenario["source_rows"]).createOrReplaceTempView(view)
    columns = None
    if "expected_schema" in scenario:
        columns = [f.name for f in spark.createDataFrame([], scenario["expected_schema"]).schema]
    try:
        metrics = run_merge(spark, merge_spec(scenario, target, view)).to_dict()
    except MergeJobError as error:
        failure = (type(error).__name__, error.error_class, str(error))
        return {"error": failure, "version": table_version(target)}
    rows = read_rows(target, columns=columns)
    assert multiset(read_rows_with_kernel(target, columns=columns)) == multiset(rows)
    kept = {k: v for k, v in metrics.items() if k not in TIMES}
    return {"rows": multiset(rows), "metrics": kept, "version": table_version(target)}


def assert_delta_gave_the_same(job: dict[str, Any], delta: dict[str, Any], spark: Any, target: Path) -> None:
    """The job's outcome of a scenario against Delta's MERGE of it on the same table: the same error class
    (or a difference named in DIFFERENT_ERROR_CLASSES), or the same rows, version and metrics, name by
    name, those Delta does not record named in JOB_ONLY_METRICS; and Delta reads what the job wrote."""
    if "error" in delta or "error" in job:
        assert "error" in job, f"Delta refused the merge, the job did not: {delta.get('error')}"
        assert "error" in delta, f"the job refused the merge, Delta did not: {job['error']}"
        job_class, delta_classes = job["error"][1], delta["error"][0]
        assert job_class in delta_classes or any(
            (job_class, named) in DIFFERENT_ERROR_CLASSES for named in delta_classes
        ), f"the job's {job_class} against Delta's {sorted(delta_classes)}: {delta['error'][1][:500]}"
        assert job["version"] == delta["version"]
        return
    assert job["rows"] == delta["rows"]
    assert job["version"] == delta["version"]
    job_metrics = {k: v for k, v in job["metrics"].items() if k not in TIMES}
    delta_metrics = {k: v for k, v in delta["metrics"].items() if k not in TIMES}
    assert set(delta_metrics) - set(job_metrics) == set(), "metrics Delta records and the job does not report"
    assert set(job_metrics) - set(delta_metrics) <= JOB_ONLY_METRICS
    differing = {
        name: (value, delta_metrics[name]) for name, value in job_metrics.items()
        if name in delta_metrics and name not in WRITER_LAYOUT_METRICS and value != delta_metrics[name]
    }  # fmt: skip
    assert differing == {}, "metrics differ (job, Delta)"
    for name in WRITER_LAYOUT_METRICS & set(delta_metrics):
        assert (job_metrics[name] > 0) == (delta_metrics[name] > 0), name
    read_by_delta = [list(row.asDict(recursive=True).values())
                     for row in spark.read.format("delta").load(str(target)).collect()]  # fmt: skip
    assert multiset(read_by_delta) == multiset(read_rows(target))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["id"] for s in SCENARIOS])
def test_each_scenario_has_deltas_outcome_on_both_session_kinds(
    spark: Any, connect_server: ConnectServer, connect_client: Any, tmp_path: Path, scenario: dict[str, Any]
) -> None:
    """Each scenario with copy-on-write's unchanged rows copied by position (the default path of small
    merges, through Spark's reader, is the one every other merge test takes), on both session kinds, and
    through Delta's own MERGE."""
    from spark_jobs.delta_merge.merge.copy_by_position import COPY_BY_POSITION_CONF

    # One target table, copied: both sessions and Delta merge into the same bytes.
    create_target(spark, tmp_path / "target", scenario)
    version_before = table_version(tmp_path / "target")
    shutil.copytree(tmp_path / "target", tmp_path / "connect")
    shutil.copytree(tmp_path / "target", tmp_path / "delta")
    delta = delta_scenario_outcome(spark, tmp_path / "delta", scenario)
    with scenario_confs(spark, scenario, {COPY_BY_POSITION_CONF: "0"}):
        classic = scenario_outcome(spark, tmp_path / "target", scenario)
    assert_delta_gave_the_same(classic, delta, spark, tmp_path / "target")
    with connect_mode(), scenario_confs(connect_client, scenario, {COPY_BY_POSITION_CONF: "0"}):
        connected = scenario_outcome(connect_client, tmp_path / "connect", scenario)
    differing = {
        key: (connected.get("metrics", {}).get(key), classic.get("metrics", {}).get(key))
        for key in {*connected.get("metrics", {}), *classic.get("metrics", {})}
        if connected.get("metrics", {}).get(key) != classic.get("metrics", {}).get(key)
    }
    assert differing == {}, "metrics differ (Connect, classic)"
    assert connected == classic
    if "expected_error" in scenario:
        assert scenario["expected_error"].lower() in connected["error"][2].lower()
        assert connected["version"] == version_before
        return
    assert connected["rows"] == multiset(scenario["expected_rows"])
    # One version per merge, schema evolution included (the merges that change nothing set Delta's
    # skipRecordingEmptyCommits off, as their original tests do, to find the merge in the history).
    assert connected["metrics"]["tableVersion"] == connected["version"] == version_before + 1
    for name, value in scenario.get("expected_metrics", {}).items():
        if name not in FILE_DEPENDENT_METRICS:
            assert connected["metrics"][name] == value, name


def _statement_source_scenario(name: str, merge_sql: str, expected: list[list[Any]], **tables: Any
                               ) -> dict[str, Any]:  # fmt: skip
    return {
        "id": name, "target_schema": "key INT, value INT", "target_partition_by": [],
        "target_rows": [[1, 10], [2, 20], [3, 30]], "source_schema": "key INT, value INT",
        "source_rows": [[1, 100], [2, 200], [4, 400]], "merge_sql": merge_sql, "conf": {},
        "expected_rows": expected, **tables,
    }  # fmt: skip


UPSERT_CLAUSES = "ON t.key = s.key WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
STATEMENT_SOURCES = [
    _statement_source_scenario(
        "subquery-order-by-limit",
        f"MERGE INTO target t USING (SELECT * FROM source ORDER BY key DESC LIMIT 1) s {UPSERT_CLAUSES}",
        [[1, 10], [2, 20], [3, 30], [4, 400]]),
    _statement_source_scenario(
        "cte",
        "MERGE INTO target t USING (WITH doubled AS (SELECT key, value * 2 AS value FROM source "
        f"WHERE key < 4) SELECT * FROM doubled) s {UPSERT_CLAUSES}",
        [[1, 200], [2, 400], [3, 30]]),
    # Statements Delta merges that the check of the operator's parse against Spark's once refused.
    _statement_source_scenario(
        "source-query-of-literals",
        "MERGE INTO target as trg USING (SELECT 5 as key1, 5 as value) src ON src.key1 = trg.key2 WHEN "
        "MATCHED THEN UPDATE SET trg.key2 = 20 + key1, value = 20 + src.value WHEN NOT MATCHED THEN INSERT "
        "(trg.key2, value) VALUES (key1 - 10, src.value + 10)",
        [[1, 1], [25, 25]], target_schema="key2 INT, value INT", target_rows=[[1, 1], [5, 7]]),
    _statement_source_scenario(
        "struct-column-named-like-the-table",
        "MERGE INTO target USING source ON 1 = 1 WHEN MATCHED THEN UPDATE SET target.target.a = "
        "source.target.a",
        [[1, {"a": 8, "b": 3}]], target_schema="a INT, target STRUCT<a: INT, b: INT>",
        target_rows=[[1, {"a": 2, "b": 3}]], source_schema="a INT, target STRUCT<a: INT, b: INT>",
        source_rows=[[9, {"a": 8, "b": 7}]]),
]


@pytest.mark.parametrize("scenario", STATEMENT_SOURCES, ids=[s["id"] for s in STATEMENT_SOURCES])
def test_statements_with_a_source_query_or_names_like_the_aliases_merge_as_through_delta(
    spark: Any, connect_server: ConnectServer, connect_client: Any, tmp_path: Path, scenario: dict[str, Any]
) -> None:
    """On both session kinds. A Connect DataFrame of ``spark.sql`` is analyzed again each time it runs, so
    the ``source`` view its query names must outlive its first analysis (the job once dropped it there:
    TABLE_OR_VIEW_NOT_FOUND on Connect only)."""
    create_target(spark, tmp_path / "target", scenario)
    shutil.copytree(tmp_path / "target", tmp_path / "connect")
    shutil.copytree(tmp_path / "target", tmp_path / "delta")
    delta = delta_scenario_outcome(spark, tmp_path / "delta", scenario)
    classic = scenario_outcome(spark, tmp_path / "target", scenario)
    with connect_mode():
        connected = scenario_outcome(connect_client, tmp_path / "connect", scenario)
    assert connected == classic
    assert classic["rows"] == multiset(scenario["expected_rows"])
    assert_delta_gave_the_same(classic, delta, spark, tmp_path / "target")
    # Nothing of the merge is left in either session's catalog.
    with connect_mode():
        assert not connect_client.catalog.tableExists("source")
    assert not spark.catalog.tableExists("source")


def test_the_job_reaches_the_servers_workers_as_this_sessions_artifact(
    connect_server: ConnectServer, connect_spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def job_file(_: Any) -> str:
        import spark_jobs.delta_merge

        return str(spark_jobs.delta_merge.__file__)

    where = connect_spark.range(1).select(F.udf(job_file, StringType())("id")).collect()[0][0]
    # Not this tree (the server's workers do not have it on their path): the session's copy of the zip.
    assert "spark_jobs.zip" in where
    assert not where.startswith(str(Path.cwd()))

    # Another session with another build of the job sees its own build only.
    other_zip = tmp_path / "spark_jobs.zip"
    from airflow_merge_provider.job_package import job_py_files

    shutil.copy(job_py_files(), other_zip)
    with zipfile.ZipFile(other_zip, "a") as archive:
        archive.writestr("spark_jobs/build_marker.py", "BUILD = 'other'\n")

    def marker(_: Any) -> str:
        try:
            import spark_jobs.build_marker as found  # type: ignore[import-not-found]
        except ImportError:
            return "none"
        return str(found.BUILD)

    other = connect_server.session(with_job=False)
    try:
        other.addArtifacts(str(other_zip), pyfile=True)
        assert other.range(1).select(F.udf(marker, StringType())("id")).collect()[0][0] == "other"
        assert connect_spark.range(1).select(F.udf(marker, StringType())("id")).collect()[0][0] == "none"
    finally:
        other.stop()


def test_a_client_without_the_servers_token_is_refused(connect_server: ConnectServer) -> None:
    from pyspark.errors import PySparkException

    with connect_mode():
        for token in ("wrong-token",):
            with pytest.raises((PySparkException, Exception)) as refused:
                connect_server.session(token=token).range(1).collect()
            assert "UNAUTHENTICATED" in str(refused.value) or "token" in str(refused.value).lower()
            assert connect_server.token not in str(refused.value)
