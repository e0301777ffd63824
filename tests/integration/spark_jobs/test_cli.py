"""The job's CLI under real spark-submit: one metrics line on stdout, or the cause as the last stderr line."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge.metrics import DELTA_METRIC_NAMES, MergeMetrics
from spark_jobs.delta_merge.protocol.delta_log import read_commit_info
from tests.support.delta_reader import read_rows, table_version
from tests.support.submit_harness import PYTHON, ROOT, SPARK_SUBMIT, fast_start_confs

PREFIX = "MERGE_METRICS_JSON="
KV = pa.schema([("id", pa.int64()), ("v", pa.string())])


def kv(rows: list[tuple[int, str]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "v": v} for i, v in rows], schema=KV)


@pytest.fixture
def tables(tmp_path: Path) -> tuple[Path, Path]:
    target, source = tmp_path / "t", tmp_path / "s"
    write_deltalake(str(target), kv([(1, "a"), (2, "b")]))
    source.mkdir()
    pq.write_table(kv([(2, "B"), (3, "C")]), source / "part-0.parquet")
    return target, source


def spec(target: Path, source: Path, sql: str) -> dict[str, Any]:
    return {"target": {"uri": str(target)}, "source": {"uri": str(source)}, "merge_sql": sql}


def submit(*args: str, confs: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert SPARK_SUBMIT.is_file(), SPARK_SUBMIT
    env = {**os.environ, "PYSPARK_PYTHON": str(PYTHON), "PYSPARK_DRIVER_PYTHON": str(PYTHON)}
    given = {**fast_start_confs(), **(confs or {})}
    confs_args = [arg for key, value in given.items() for arg in ("--conf", f"{key}={value}")]
    command = [str(SPARK_SUBMIT), "--master", "local[1]", *confs_args, "spark_jobs/delta_merge/__main__.py",
               *args]  # fmt: skip
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def metrics_line(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in result.stdout.splitlines() if line.startswith(PREFIX)]
    assert len(lines) == 1, result.stdout + result.stderr
    metrics: dict[str, Any] = json.loads(lines[0][len(PREFIX):])
    return metrics


def test_spec_file_prints_one_metrics_line(tables: tuple[Path, Path], tmp_path: Path) -> None:
    target, source = tables
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec(target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *""")), encoding="utf-8")

    result = submit("--spec", str(spec_file))

    assert result.returncode == 0, result.stderr[-3000:]
    metrics = metrics_line(result)
    assert set(metrics) == set(MergeMetrics().to_dict())
    assert MergeMetrics.from_mapping(metrics).to_dict() == metrics
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    assert metrics["numTargetRowsCopied"] == 1
    assert metrics["tableVersion"] == table_version(target) == 1
    assert sorted(map(tuple, read_rows(target))) == [(1, "a"), (2, "B"), (3, "C")]
    stored = read_commit_info(str(target), 1)["operationMetrics"]
    assert {name: int(stored[name]) for name in DELTA_METRIC_NAMES} == {
        name: metrics[name] for name in DELTA_METRIC_NAMES}


def test_the_driver_names_its_live_ui_for_the_provider_at_the_jobs_quiet_log_level(
    tables: tuple[Path, Path],
) -> None:
    # The job starts its context at WARN, below Spark's INFO line with the UI's port: its own line says it.
    from airflow_merge_provider.driver_output import SparkApplication

    target, source = tables
    sql = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *"
    result = submit("--spec-json", json.dumps(spec(target, source, sql)), confs={"spark.ui.enabled": "true"})

    assert result.returncode == 0, result.stderr[-3000:]
    assert "Successfully started service 'SparkUI'" not in result.stderr  # Spark's own line stays hidden
    application = SparkApplication()
    for line in (result.stdout + result.stderr).splitlines():
        application.feed(line)
    assert application.ui_url is not None, result.stderr[-3000:]
    assert re.fullmatch(r"http://[^/:]+:\d+", application.ui_url), application.ui_url
    assert application.app_id is None  # a local master's application has no page of a cluster's


def test_failing_merge_exits_non_zero_with_the_cause_last_on_stderr(tables: tuple[Path, Path]) -> None:
    target, source = tables
    bad = spec(target, source, "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET nope = s.v")

    result = submit("--spec-json", json.dumps(bad))

    assert result.returncode == 1  # a MergeJobError; anything unexpected exits 2
    assert not any(line.startswith(PREFIX) for line in result.stdout.splitlines())
    # The job prints the cause as its last line on the Python driver's stderr. spark-submit's PythonRunner
    # merges the driver's stderr into its stdout (redirectErrorStream), so under spark-submit that line is
    # the last line of stdout; spark-submit's own stderr carries only the JVM's log4j output.
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("MERGE failed: MergeAnalysisError:"), result.stdout[-3000:]
    assert "cannot resolve nope in UPDATE clause given columns t.id, t.v" in last
    assert "Traceback" not in result.stdout + result.stderr
    assert table_version(target) == 0
