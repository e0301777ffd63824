"""Row tracking (PROTOCOL.md "Row Tracking"): fresh row ids for new files, stable ids kept on rewritten rows.

A target row's stable row id is its materialized id, else its file's ``baseRowId`` plus its physical
index; its stable commit version is its materialized version, else the file's ``defaultRowCommitVersion``.
As Delta's MERGE does, updated and copied rows are written with their stable id in the materialized
row id column, copied rows also with their stable commit version (updated rows take the new file's
default), inserted rows with NULLs (they take the new file's defaults). ``baseRowId`` and
``defaultRowCommitVersion`` of new files depend on the version a commit lands on, so the commit step
assigns them for each attempt (:func:`assign_row_ids`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:

    from spark_jobs.delta_merge.protocol.files import WrittenFile
    from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = [
    "DOMAIN",
    "ROW_COMMIT_VERSION_COLUMN",
    "ROW_ID_COLUMN",
    "RowTracking",
    "assign_row_ids",
    "high_water_mark",
    "row_tracking",
]

DOMAIN = "delta.rowTracking"
# The stable row id and commit version of a scanned target row (bookkeeping columns, never written).
ROW_ID_COLUMN = "__merge_row_id"
ROW_COMMIT_VERSION_COLUMN = "__merge_row_commit_version"
_ROW_ID_NAME_KEY = "delta.rowTracking.materializedRowIdColumnName"
_COMMIT_VERSION_NAME_KEY = "delta.rowTracking.materializedRowCommitVersionColumnName"


@dataclass(frozen=True)
class RowTracking:
    """How a merge into a table that supports row tracking treats row ids.

    :param row_id_column: the materialized row id column (hidden, not in the schema), or None when
        row tracking is only supported: then ids are assigned but never preserved, as the protocol says.
    :param commit_version_column: the materialized row commit version column, likewise.
    """

    row_id_column: str | None = None
    commit_version_column: str | None = None

    @property
    def preserves(self) -> bool:
        """Row tracking is enabled: stable ids and commit versions of rewritten rows are kept."""
        return self.row_id_column is not None and self.commit_version_column is not None

    @property
    def materialized_columns(self) -> tuple[str, ...]:
        """The hidden columns rewritten rows carry their stable ids in; none unless preserving."""
        if self.row_id_column is None or self.commit_version_column is None:
            return ()
        return self.row_id_column, self.commit_version_column


def row_tracking(snapshot: TargetSnapshot) -> RowTracking | None:
    """The table's row tracking, or None when it is not supported or suspended (nothing to assign)."""
    if "rowTracking" not in snapshot.protocol.writer_features:
        return None
    config = {k.lower(): v.lower() for k, v in snapshot.configuration.items()}
    if config.get("delta.rowtrackingsuspended", "false") == "true":
        return None
    if config.get("delta.enablerowtracking", "false") != "true":
        return RowTracking()
    return RowTracking(
        row_id_column=snapshot.configuration.get(_ROW_ID_NAME_KEY),
        commit_version_column=snapshot.configuration.get(_COMMIT_VERSION_NAME_KEY),
    )


def high_water_mark(domains: Mapping[str, str]) -> int:
    """The highest row id assigned so far (``rowIdHighWaterMark``), -1 when none was."""
    configuration = domains.get(DOMAIN)
    if configuration is None:
        return -1
    return int(json.loads(configuration)["rowIdHighWaterMark"])


def assign_row_ids(
    adds: Sequence[WrittenFile], *, high_water_mark: int, version: int
) -> tuple[list[dict[str, int]], dict[str, Any] | None]:
    """Each add's ``baseRowId`` and ``defaultRowCommitVersion``, and the high-water mark's new
    ``domainMetadata`` action (None when no id was assigned).

    Every file gets the ids after the mark, one per record, so no default row id is used twice.
    """
    fields: list[dict[str, int]] = []
    next_id = high_water_mark + 1
    for written in adds:
        fields.append({"baseRowId": next_id, "defaultRowCommitVersion": version})
        next_id += written.num_records
    if next_id - 1 == high_water_mark:
        return fields, None
    domain = {
        "domain": DOMAIN,
        "configuration": json.dumps({"rowIdHighWaterMark": next_id - 1}, separators=(",", ":")),
        "removed": False,
    }
    return fields, domain
