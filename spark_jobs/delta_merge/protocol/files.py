"""Data files as the Delta log knows them: live files of a snapshot and files a merge wrote."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector

__all__ = ["FileStats", "LiveFile", "WrittenFile"]


@dataclass(frozen=True)
class FileStats:
    """Parsed ``add.stats``: per-column bounds as the log records them (nested dicts for structs).

    Values are as JSON decoded them: numbers, strings (dates, timestamps, strings), booleans.
    A column missing from ``min_values`` / ``max_values`` has no bound and must not prune.
    """

    num_records: int | None
    min_values: Mapping[str, Any] = field(default_factory=dict)
    max_values: Mapping[str, Any] = field(default_factory=dict)
    null_count: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LiveFile:
    """One live ``add`` action of a snapshot.

    :param path: ``add.path`` exactly as in the log: relative to the table root and percent-encoded
        (or an absolute URI for shallow-cloned tables).
    :param partition_values: serialized partition values as in the log (None for NULL).
    :param deletion_vector: the file's deletion vector descriptor (its rows are not all live), or None.
    :param base_row_id: row tracking: the default row id of the file's first row (``add.baseRowId``).
    :param default_row_commit_version: row tracking: ``add.defaultRowCommitVersion``.
    :param stats_json: ``add.stats`` as the log holds it, when the log was replayed for the file's fields.
    """

    path: str
    size: int
    partition_values: Mapping[str, str | None]
    stats: FileStats | None
    modification_time: int
    deletion_vector: DeletionVector | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    stats_json: str | None = field(default=None, compare=False)

    @property
    def has_deletion_vector(self) -> bool:
        return self.deletion_vector is not None


@dataclass(frozen=True)
class WrittenFile:
    """A Parquet file the merge wrote, ready to become an ``add`` action.

    :param path: relative to the table root, percent-encoded as ``add.path`` must be.
    :param stats_json: Delta statistics JSON (numRecords, minValues, maxValues, nullCount).
    """

    path: str
    size: int
    partition_values: Mapping[str, str | None]
    stats_json: str
    num_records: int
    modification_time: int
