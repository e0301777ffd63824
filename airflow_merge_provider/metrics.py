"""Merge metrics at the Airflow edge: the XCom dict, the summary line and the table in the task log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spark_jobs.delta_merge.contract import DELTA_METRIC_NAMES, MergeMetrics, stage_times

__all__ = ["format_metrics_table", "format_summary", "to_xcom"]

# The time of each stage, listed after the table, without the prefix every stage's description has.
_STAGES = "stageTimesMs"
_STAGE_PREFIX = "MERGE operation - "
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
    """The metrics of :class:`MergeMetrics` as a table: the numbers as ``name value`` cells, ``columns`` a
    line, every column as wide as its widest cell; then the other values (materializeSourceReason, the
    flags) one a line; then the time of each stage, one a line. Long values widen their column only."""
    names = [name for name in (*DELTA_METRIC_NAMES, *_EXTRA_NAMES) if name in metrics and name != _STAGES]
    numbers = [(name, str(metrics[name])) for name in names if _is_number(metrics[name])]
    others = [(name, str(metrics[name])) for name in names if not _is_number(metrics[name])]
    lines = _grid(numbers, columns)
    width = max((len(name) for name, _ in others), default=0)
    lines += [f"  {name:<{width}}  {value}" for name, value in others]
    stages = stage_times(metrics.get(_STAGES))
    if stages:
        lines.append("  stage times (ms):")
        shown = [(str(stage["stage"]).removeprefix(_STAGE_PREFIX), str(stage["ms"])) for stage in stages]
        lines += _grid(shown, 1, indent="    ")
    return "\n".join(lines)


def _grid(cells: Sequence[tuple[str, str]], columns: int, *, indent: str = "  ") -> list[str]:
    """``name value`` cells, ``columns`` a line: names left-aligned, values right-aligned, each column of
    the table as wide as its widest name and value."""
    rows = [cells[i : i + columns] for i in range(0, len(cells), columns)]
    name_widths = (
        [max(len(row[c][0]) for row in rows if c < len(row)) for c in range(columns)] if rows else []
    )
    value_widths = (
        [max(len(row[c][1]) for row in rows if c < len(row)) for c in range(columns)] if rows else []
    )
    return [
        indent
        + "   ".join(
            f"{name:<{name_widths[c]}} {value:>{value_widths[c]}}" for c, (name, value) in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def _is_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
