"""Merge metrics at the Airflow edge: the XCom dict, the summary line and the table in the task log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_jobs.delta_merge.contract import DELTA_METRIC_NAMES, MergeMetrics

__all__ = ["format_metrics_table", "format_summary", "to_xcom"]

# The time of each stage, listed on a line of its own after the table.
_STAGES = "stageTimesMs"
_EXTRA_NAMES = tuple(name for name in MergeMetrics.__dataclass_fields__ if name not in DELTA_METRIC_NAMES)


def to_xcom(
    raw: Mapping[str, Any], *, app_id: str | None, app_version: int | None, skipped: bool = False
) -> dict[str, Any]:
    """One plain dict: every metric of Delta's table as an int, numOutputRows, materializeSourceReason,
    readVersion, tableVersion, skipped, dryRun, plus the merge's ``appId`` and ``appVersion``.

    :param raw: the job's metrics line or a commit's metrics (``MergeMetrics.from_commit``); unknown keys
        are dropped, missing ones are 0 (-1 for the versions).
    """
    metrics = MergeMetrics.from_mapping(raw).with_values(skipped=skipped).to_dict()
    return {**metrics, "appId": app_id, "appVersion": app_version}


def format_summary(target: str, metrics: Mapping[str, Any]) -> str:
    """``MERGE into <target> v<version>: source=..., inserted=..., ... in <sec>s (scan ..s, rewrite ..s)``."""

    def get(name: str) -> int:
        return int(metrics.get(name) or 0)

    flags = (("dryRun", "dry run"), ("skipped", "already committed"))
    notes = [note for flag, note in flags if metrics.get(flag)]
    return (
        f"MERGE into {target} v{metrics.get('tableVersion', -1)}"
        f"{' (' + ', '.join(notes) + ')' if notes else ''}: "
        f"source={get('numSourceRows')}, inserted={get('numTargetRowsInserted')}, "
        f"updated={get('numTargetRowsUpdated')}, deleted={get('numTargetRowsDeleted')}, "
        f"copied={get('numTargetRowsCopied')}, "
        f"files +{get('numTargetFilesAdded')}/-{get('numTargetFilesRemoved')} "
        f"in {get('executionTimeMs') / 1000:.1f}s "
        f"(scan {get('scanTimeMs') / 1000:.1f}s, rewrite {get('rewriteTimeMs') / 1000:.1f}s)"
    )


def format_metrics_table(metrics: Mapping[str, Any], *, columns: int = 3) -> str:
    """The metrics of :class:`MergeMetrics` as aligned ``name value`` cells, ``columns`` per line, then
    the time of each stage."""
    names = [name for name in (*DELTA_METRIC_NAMES, *_EXTRA_NAMES) if name in metrics and name != _STAGES]
    name_width = max((len(name) for name in names), default=0)
    # Numbers set the width; a long text value (materializeSourceReason) only widens its own cell.
    value_width = max((len(str(metrics[name])) for name in names if _is_number(metrics[name])), default=0)
    cells = [f"{name:<{name_width}} {metrics[name]!s:>{value_width}}" for name in names]
    rows = [cells[i : i + columns] for i in range(0, len(cells), columns)]
    lines = ["  " + "   ".join(row) for row in rows]
    stages = metrics.get(_STAGES) or {}
    if stages:
        lines.append("  stages: " + ", ".join(f"{name.removeprefix('MERGE operation - ')} {ms} ms"
                                              for name, ms in stages.items()))  # fmt: skip
    return "\n".join(lines)


def _is_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
