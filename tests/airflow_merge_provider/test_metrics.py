"""The XCom dict, the summary line and the metrics table."""

from __future__ import annotations

from airflow_merge_provider.metrics import format_metrics_table, format_summary, to_xcom
from spark_jobs.delta_merge.metrics import DELTA_METRIC_NAMES, MergeMetrics


def test_commit_metrics_become_ints_with_versions() -> None:
    info = {
        "operationMetrics": {"numSourceRows": "12", "numTargetRowsInserted": "4", "unknownMetric": "1"},
        "readVersion": 6,
        "materializeSourceReason": "MATERIALIZE_ALL",
    }
    metrics = to_xcom(MergeMetrics.from_commit(7, info).to_dict(), app_id="a", app_version=2, skipped=True)
    assert (metrics["numSourceRows"], metrics["numTargetRowsInserted"], metrics["numTargetRowsDeleted"]) == (
        12,
        4,
        0,
    )
    assert (metrics["readVersion"], metrics["tableVersion"]) == (6, 7)
    assert metrics["materializeSourceReason"] == "MATERIALIZE_ALL"
    assert (metrics["skipped"], metrics["appId"], metrics["appVersion"]) == (True, "a", 2)
    assert "unknownMetric" not in metrics


def test_summary_line() -> None:
    metrics = to_xcom(
        {
            "numSourceRows": 100, "numTargetRowsInserted": 10, "numTargetRowsUpdated": 90,
            "numTargetRowsDeleted": 0, "numTargetRowsCopied": 900, "numTargetFilesAdded": 2,
            "numTargetFilesRemoved": 1, "executionTimeMs": 12345, "scanTimeMs": 2500, "rewriteTimeMs": 7250,
            "tableVersion": 5,
        },
        app_id="a", app_version=0,
    )  # fmt: skip
    assert format_summary("/data/accounts", metrics) == (
        "MERGE into /data/accounts v5: source=100, inserted=10, updated=90, deleted=0, copied=900, "
        "files +2/-1 in 12.3s (scan 2.5s, rewrite 7.2s)"
    )
    skipped = format_summary("/data/accounts", {**metrics, "skipped": True})
    assert skipped.startswith("MERGE into /data/accounts v5 (already committed): ")


def test_table_lists_every_metric_once_in_aligned_columns() -> None:
    stages = {"MERGE operation - scanning files for matches": 1500, "MERGE operation - committing": 20}
    raw = {"numSourceRows": 1234567, "stageTimesMs": stages}
    table = format_metrics_table(to_xcom(raw, app_id="a", app_version=0))
    lines = table.splitlines()
    assert len(lines) == 14  # 37 metrics, three a line, then the stages
    assert lines[-1] == "  stages: scanning files for matches 1500 ms, committing 20 ms"
    lines = lines[:-1]
    cells = " ".join(lines).split()
    for name in DELTA_METRIC_NAMES:
        assert cells.count(name) == 1
    assert "appId" not in cells
    assert len({line.index("numSourceRowsInSecondScan") for line in lines[:1]}) == 1
