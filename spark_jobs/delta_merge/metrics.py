"""Merge metrics, named exactly as in Delta's MergeIntoCommandBase metric table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

__all__ = ["DELTA_METRIC_NAMES", "MergeMetrics", "stage_times"]

# The 26 metrics of MergeIntoCommandBase, in Delta's order.
DELTA_METRIC_NAMES: tuple[str, ...] = (
    "numSourceRows",
    "numSourceRowsInSecondScan",
    "numTargetRowsCopied",
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsDeleted",
    "numTargetFilesBeforeSkipping",
    "numTargetFilesAfterSkipping",
    "numTargetFilesRemoved",
    "numTargetFilesAdded",
    "numTargetChangeFilesAdded",
    "numTargetChangeFileBytes",
    "numTargetBytesBeforeSkipping",
    "numTargetBytesAfterSkipping",
    "numTargetBytesRemoved",
    "numTargetBytesAdded",
    "numTargetPartitionsAfterSkipping",
    "numTargetPartitionsRemovedFrom",
    "numTargetPartitionsAddedTo",
    "numTargetRowsMatchedDeleted",
    "numTargetRowsNotMatchedBySourceDeleted",
    "numTargetRowsMatchedUpdated",
    "numTargetRowsNotMatchedBySourceUpdated",
    "executionTimeMs",
    "scanTimeMs",
    "rewriteTimeMs",
)


@dataclass(frozen=True)
class MergeMetrics:
    """Every metric of one merge; ``to_dict()`` spells the keys as Delta does."""

    numSourceRows: int = 0
    numSourceRowsInSecondScan: int = 0
    numTargetRowsCopied: int = 0
    numTargetRowsInserted: int = 0
    numTargetRowsUpdated: int = 0
    numTargetRowsDeleted: int = 0
    numTargetFilesBeforeSkipping: int = 0
    numTargetFilesAfterSkipping: int = 0
    numTargetFilesRemoved: int = 0
    numTargetFilesAdded: int = 0
    numTargetChangeFilesAdded: int = 0
    numTargetChangeFileBytes: int = 0
    numTargetBytesBeforeSkipping: int = 0
    numTargetBytesAfterSkipping: int = 0
    numTargetBytesRemoved: int = 0
    numTargetBytesAdded: int = 0
    numTargetPartitionsAfterSkipping: int = 0
    numTargetPartitionsRemovedFrom: int = 0
    numTargetPartitionsAddedTo: int = 0
    numTargetRowsMatchedDeleted: int = 0
    numTargetRowsNotMatchedBySourceDeleted: int = 0
    numTargetRowsMatchedUpdated: int = 0
    numTargetRowsNotMatchedBySourceUpdated: int = 0
    executionTimeMs: int = 0
    scanTimeMs: int = 0
    rewriteTimeMs: int = 0
    numOutputRows: int = 0
    # Merges into tables with deletion vectors (Delta's MergeIntoCommandBase records them too).
    numTargetDeletionVectorsAdded: int = 0
    numTargetDeletionVectorsRemoved: int = 0
    numTargetDeletionVectorsUpdated: int = 0
    materializeSourceReason: str = ""
    materializeSourceTimeMs: int = 0
    readVersion: int = -1
    tableVersion: int = -1
    skipped: bool = False
    dryRun: bool = False
    # What the merge cost its Spark session (not in the Delta log): each stage, by Delta's name for it, and
    # its milliseconds, in the order the stages ran (for a merge that was skipped, none). A list, not a
    # mapping: XCom on PostgreSQL is JSONB, which keeps no key order.
    stageTimesMs: Sequence[Mapping[str, Any]] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for XCom, the JSON line and tests (``stageTimesMs`` a list of ``{"stage", "ms"}``)."""
        data = asdict(self)
        data["stageTimesMs"] = [dict(stage) for stage in self.stageTimesMs]
        return data

    def operation_metrics(self) -> dict[str, int]:
        """The counts and times Delta records in ``commitInfo.operationMetrics`` (the commit writes them
        as Delta's strings)."""
        skip = {"materializeSourceReason", "readVersion", "tableVersion", "skipped", "dryRun", "stageTimesMs"}
        return {f.name: int(getattr(self, f.name)) for f in fields(self) if f.name not in skip}

    def with_values(self, **values: Any) -> MergeMetrics:
        """A copy with some values replaced."""
        return replace(self, **values)

    @classmethod
    def from_commit(cls, version: int, commit_info: Mapping[str, Any]) -> MergeMetrics:
        """The metrics a merge recorded in the commitInfo of ``version`` (operationMetrics as strings)."""
        recorded: dict[str, Any] = dict(commit_info.get("operationMetrics") or {})
        # Not an operation metric in Delta: the job records it at the top level of commitInfo.
        reason = recorded.get("materializeSourceReason", commit_info.get("materializeSourceReason"))
        recorded["materializeSourceReason"] = "" if reason is None else str(reason)
        recorded["readVersion"] = commit_info.get("readVersion", -1)
        recorded["tableVersion"] = version
        return cls.from_mapping(recorded)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> MergeMetrics:
        """Read back metrics stored as strings (operationMetrics) or ints; unknown keys are ignored."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in data.items():
            field_ = known.get(key)
            if field_ is None:
                continue
            if key == "stageTimesMs":
                values[key] = stage_times(raw)
            elif field_.type in ("bool", bool):
                values[key] = raw if isinstance(raw, bool) else str(raw).lower() == "true"
            elif field_.type in ("str", str):
                values[key] = str(raw)
            else:
                values[key] = int(raw)
        return cls(**values)


def stage_times(raw: Any) -> tuple[dict[str, Any], ...]:
    """``stageTimesMs`` as ``({"stage": name, "ms": int}, ...)`` in the order given: from that list, or from
    a mapping of name to milliseconds (in its order)."""
    if isinstance(raw, Mapping):
        return tuple({"stage": str(name), "ms": int(ms)} for name, ms in raw.items())
    return tuple({"stage": str(item["stage"]), "ms": int(item["ms"])} for item in raw or ())
