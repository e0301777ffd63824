"""The XCom dict, the summary line and the metrics table."""

from __future__ import annotations

import re

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


def _cells(line: str) -> list[tuple[int, int]]:
    """Where each ``name value`` cell of a table line starts and where its value ends."""
    return [(cell.start(), cell.end()) for cell in re.finditer(r"[A-Za-z]+ +-?\d+", line)]


def test_table_lists_every_metric_once_in_aligned_columns() -> None:
    # A mapping (as the job's stage timer keeps them) becomes the XCom's list, in the order the stages ran.
    stages = {"MERGE operation - scanning files for matches": 1500, "MERGE operation - committing": 20}
    raw = {"numSourceRows": 1234567, "stageTimesMs": stages}
    xcom = to_xcom(raw, app_id="a", app_version=0)
    assert xcom["stageTimesMs"] == [{"stage": "MERGE operation - scanning files for matches", "ms": 1500},
                                    {"stage": "MERGE operation - committing", "ms": 20}]  # fmt: skip
    table = format_metrics_table(xcom)
    lines = table.splitlines()
    # 33 numbers three a line, 3 other values, the stages' title and 2 stages
    assert len(lines) == 11 + 3 + 1 + 2
    assert lines[-3:] == [
        "  stage times (ms):",
        "    scanning files for matches 1500",
        "    committing                   20",
    ]
    cells = " ".join(lines).split()
    for name in DELTA_METRIC_NAMES:
        assert cells.count(name) == 1
    assert "appId" not in cells


def test_long_values_keep_every_column_aligned() -> None:
    raw = {
        "numSourceRows": 12, "numTargetBytesAdded": 123_456_789_012_345, "numTargetBytesRemoved": 7,
        "executionTimeMs": 98_765_432, "materializeSourceReason": "NOT_MATERIALIZED_AUTO_INSERT_ONLY",
        "stageTimesMs": [
            {"stage": "MERGE operation - loading the target's snapshot", "ms": 15},
            {"stage": "MERGE operation - writing the output of 123 files in 40 partitions, change data "
                      "included", "ms": 4},
            {"stage": "MERGE operation - committing", "ms": 123_456},
        ],
    }  # fmt: skip
    lines = format_metrics_table(to_xcom(raw, app_id="a", app_version=0)).splitlines()
    grid = lines[:11]

    # Every cell of a column starts at the same place, and every value of a column ends at the same place.
    cells = [_cells(line) for line in grid]
    assert [len(row) for row in cells] == [3] * 11
    for column in range(3):
        assert len({row[column] for row in cells if column < len(row)}) == 1, column
    assert "123456789012345" in " ".join(grid)
    # Text values come after the numbers, one a line, aligned; the stages one a line, times aligned.
    assert lines[11:14] == [
        "  materializeSourceReason  NOT_MATERIALIZED_AUTO_INSERT_ONLY",
        "  skipped                  False",
        "  dryRun                   False",
    ]
    stage_lines = lines[15:]
    assert [line.split()[-1] for line in stage_lines] == ["15", "4", "123456"]
    assert len({len(line) for line in stage_lines}) == 1
    assert stage_lines[1].startswith("    writing the output of 123 files")
