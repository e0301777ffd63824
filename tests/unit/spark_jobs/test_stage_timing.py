"""A merge reports what it cost its Spark session (the time of each stage, under Delta's names for them) and
tags its Spark operations with a tag of its own, leaving the caller's tags as they were."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.delta_merge import pipeline, stage_timing
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.stage_timing import MERGE_TAG_PREFIX
from tests.unit.spark_jobs.merge.test_merge_on_read import UPSERT, dv_table
from tests.unit.spark_jobs.test_pipeline import kv, merge, parquet_source


def test_a_merge_reports_its_stage_times_and_tags_its_operations_keeping_the_callers_tags(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = dv_table(tmp_path / "t", files=2, per_file=5)
    source = parquet_source(tmp_path / "s", kv([(1, "a"), (7, "b"), (99, "n")]))
    tags_during: list[set[str]] = []
    real_stage = stage_timing.stage

    @contextmanager
    def recording_stage(description: str) -> Iterator[None]:
        tags_during.append(set(spark.getTags()))
        with real_stage(description):
            yield

    monkeypatch.setattr(pipeline, "stage", recording_stage)
    spark.addTag("callers-tag")
    try:
        metrics = merge(spark, target, source, UPSERT)
        assert spark.getTags() == {"callers-tag"}
    finally:
        spark.removeTag("callers-tag")

    # Every stage ran under the caller's tag and one merge tag of its own.
    merge_tags = {tag for tags in tags_during for tag in tags if tag.startswith(MERGE_TAG_PREFIX)}
    assert len(merge_tags) == 1
    assert all(tags == {"callers-tag", *merge_tags} for tags in tags_during)
    stages = {stage["stage"]: stage["ms"] for stage in metrics["stageTimesMs"]}
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
    assert "stageTimesMs" not in MergeMetrics.from_mapping(metrics).operation_metrics()
    assert MergeMetrics.from_mapping(metrics).to_dict() == metrics
