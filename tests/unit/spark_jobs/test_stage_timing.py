"""A merge reports what it cost its Spark session: its Spark jobs (one job group per merge, counted by
Spark's status tracker) and the time of each stage, under the names its Spark jobs carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_jobs.delta_merge.metrics import MergeMetrics
from tests.unit.spark_jobs.merge.test_merge_on_read import UPSERT, dv_table
from tests.unit.spark_jobs.test_pipeline import kv, merge, parquet_source


def test_a_merge_reports_its_spark_jobs_and_stage_times_and_keeps_the_callers_job_group(
    spark: Any, tmp_path: Path
) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=5)
    source = parquet_source(tmp_path / "s", kv([(1, "a"), (7, "b"), (99, "n")]))
    context = spark.sparkContext
    context.setJobGroup("callers-group", "the caller's own jobs")
    try:
        metrics = merge(spark, target, source, UPSERT)
        assert context.getLocalProperty("spark.jobGroup.id") == "callers-group"
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)

    # The merge's jobs ran in its own group, not the caller's.
    assert context.statusTracker().getJobIdsForGroup("callers-group") == []
    assert metrics["numSparkJobs"] > 0
    stages = metrics["stageTimesMs"]
    assert list(stages) == [
        "MERGE operation - loading the target's snapshot",
        "MERGE operation - resolving the statement",
        "MERGE operation - materializing the source",
        "MERGE operation - scanning files for matches",
        "MERGE operation - writing changed rows of 2 files with deletion vectors",
        "MERGE operation - committing",
    ]
    assert all(isinstance(ms, int) and ms >= 0 for ms in stages.values())
    assert sum(stages.values()) <= metrics["executionTimeMs"] + 1000
    # Kept out of the Delta log, and read back from the metrics line as they were written.
    assert "numSparkJobs" not in MergeMetrics.from_mapping(metrics).operation_metrics()
    assert MergeMetrics.from_mapping(metrics).to_dict() == metrics
