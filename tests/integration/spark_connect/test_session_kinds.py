"""The merge job on a Spark Connect server gives what it gives on a classic session: Delta's own MERGE test
scenarios (a sample, as data) run on both session kinds and must give Delta's outcome, the same on each
(the differential cases against delta-rs run on both kinds too: tests/unit/spark_jobs/test_differential.py);
the job's code reaches the server's Python workers as a session artifact; the server admits only clients
with its token."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.connect_server import ConnectServer, connect_mode
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
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


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["id"] for s in SCENARIOS])
def test_each_scenario_has_the_same_outcome_on_both_session_kinds(
    spark: Any, connect_server: ConnectServer, connect_client: Any, tmp_path: Path, scenario: dict[str, Any]
) -> None:
    """Each scenario with copy-on-write's unchanged rows copied by position (the default path of small
    merges, through Spark's reader, is the one every other merge test takes), on both session kinds."""
    from spark_jobs.delta_merge.merge.copy_by_position import COPY_BY_POSITION_CONF

    # One target table, copied: both sessions merge into the same bytes.
    create_target(spark, tmp_path / "target", scenario)
    version_before = table_version(tmp_path / "target")
    shutil.copytree(tmp_path / "target", tmp_path / "connect")
    with scenario_confs(spark, scenario, {COPY_BY_POSITION_CONF: "0"}):
        classic = scenario_outcome(spark, tmp_path / "target", scenario)
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
