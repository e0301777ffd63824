"""Merge-on-read: the touched files' rows a merge changed, marked in deletion vectors instead of rewritten.

Delta's MergeIntoCommand does this when ``shouldWritePersistentDeletionVectors`` holds: the table supports
the ``deletionVectors`` feature with ``delta.enableDeletionVectors=true`` and
``spark.databricks.delta.merge.deletionVectors.persistent`` is on (its default). The rows a merge updated
or deleted are marked in their file's vector (joined with the vector it had); updated and inserted rows go
to new files; copied rows stay where they are. As Delta's ``DMLWithDeletionVectorsHelper`` does, a file
whose every row is now deleted is removed instead, and the others are removed and added again with their
new vector (same path, size, statistics with ``tightBounds: false``, row ids and commit version).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pyroaring import BitMap64
from pyspark.sql import SparkSession

from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.protocol.deletion_vectors import deleted_rows, write_deletion_vectors
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = [
    "PERSISTENT_DELETION_VECTORS_CONF", "DeletionVectorUpdates", "mark_rows", "writes_deletion_vectors",
]  # fmt: skip

# Delta's switch for merge-on-read in MERGE (on by default).
PERSISTENT_DELETION_VECTORS_CONF = "spark.databricks.delta.merge.deletionVectors.persistent"


def writes_deletion_vectors(spark: SparkSession, snapshot: TargetSnapshot) -> bool:
    """Delta's ``shouldWritePersistentDeletionVectors``: the conf is on, and the table supports the
    ``deletionVectors`` feature and enables it (``delta.enableDeletionVectors``)."""
    enabled = str(spark.conf.get(PERSISTENT_DELETION_VECTORS_CONF, "true")).strip().lower() == "true"
    supported = "deletionVectors" in snapshot.protocol.writer_features
    return enabled and supported and snapshot.configuration.get("delta.enableDeletionVectors") == "true"


@dataclass(frozen=True)
class DeletionVectorUpdates:
    """The file actions of marked rows: ``removes`` (the files as they were, vectors included) and
    ``readds`` (the same files with their new vectors; fully deleted files have none), and Delta's
    counts of them."""

    removes: tuple[LiveFile, ...]
    readds: tuple[LiveFile, ...]
    deletion_vectors_added: int
    deletion_vectors_updated: int
    deletion_vectors_removed: int

    @property
    def fully_removed(self) -> tuple[LiveFile, ...]:
        kept = {f.path for f in self.readds}
        return tuple(f for f in self.removes if f.path not in kept)


def mark_rows(
    snapshot: TargetSnapshot, touched: Sequence[LiveFile], marks: Mapping[str, BitMap64]
) -> DeletionVectorUpdates:
    """Join each touched file's marked rows (by :func:`file_key`) with its current vector and store the
    new vectors (one deletion vector file for the commit, written before it).

    :raises MergeExecutionError: marks for a file the merge did not touch, or a file whose row count the
        log does not give (Delta writes ``numRecords`` for every file of a deletion-vector table).
    """
    by_key = {snapshot.file_key(f): f for f in touched}
    if unknown := sorted(set(marks) - set(by_key)):
        raise MergeExecutionError(f"rows were marked deleted in files the merge did not touch: {unknown[:3]}")
    store = None
    new_rows: dict[str, BitMap64] = {}
    emptied: list[LiveFile] = []
    for key, marked in sorted(marks.items()):
        live = by_key[key]
        rows = BitMap64(marked)
        if live.deletion_vector is not None:
            store = store or snapshot.log_store
            rows |= BitMap64(deleted_rows(store, snapshot.table_uri, live.deletion_vector,
                                          storage_options=snapshot.storage_options))  # fmt: skip
        total = live.stats.num_records if live.stats is not None else None
        if total is None:
            raise MergeExecutionError(
                f"Cannot mark rows deleted in {live.path}: its add action has no numRecords statistic. Run "
                "the merge with spark.databricks.delta.merge.deletionVectors.persistent=false to rewrite it."
            )
        if len(rows) >= total:
            emptied.append(live)
        else:
            new_rows[key] = rows
    descriptors = write_deletion_vectors(snapshot.table_uri, snapshot.storage_options, new_rows)
    readds = tuple(
        replace(by_key[key], deletion_vector=descriptors[key], stats_json=_loose_stats(by_key[key]))
        for key in sorted(new_rows)
    )
    # As Delta 4.4 counts them: every new vector is added; a file's old vector, replaced or dropped with the
    # emptied file, is removed; a replaced one is updated as well.
    updated = sum(1 for key in new_rows if by_key[key].deletion_vector is not None)
    return DeletionVectorUpdates(
        removes=tuple(by_key[key] for key in sorted(marks)),
        readds=readds,
        deletion_vectors_added=len(new_rows),
        deletion_vectors_updated=updated,
        deletion_vectors_removed=updated + sum(1 for f in emptied if f.deletion_vector is not None),
    )


def _loose_stats(live: LiveFile) -> str | None:
    """The file's statistics for its new add: still true of its rows, but no longer tight bounds
    (PROTOCOL.md "Per-file Statistics": ``tightBounds`` false once a vector deletes rows)."""
    if live.stats_json is None:
        return None
    stats = json.loads(live.stats_json)
    stats["tightBounds"] = False
    return json.dumps(stats, separators=(",", ":"))
