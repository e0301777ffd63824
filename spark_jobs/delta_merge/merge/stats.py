"""The merge's outcome and Delta's metrics of it: rows per action, files and bytes before and after."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from spark_jobs.delta_merge.merge.rewrite import Action
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.scan.data_skipping import partition_count

__all__ = ["MergeOutcome", "elapsed_ms", "file_metrics", "row_metrics"]


@dataclass(frozen=True)
class MergeOutcome:
    """What the merge computed: its metrics and the files to remove and add in the commit
    (``change_files``: the change data files, for ``cdc`` actions; ``readds``: removed files added again
    with a new deletion vector)."""

    metrics: MergeMetrics
    removes: tuple[LiveFile, ...]
    adds: tuple[WrittenFile, ...]
    read: tuple[LiveFile, ...] = ()
    change_files: tuple[WrittenFile, ...] = ()
    readds: tuple[LiveFile, ...] = ()

def elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)

def row_metrics(counts: Mapping[int, int]) -> dict[str, int]:
    def n(action: Action) -> int:
        return int(counts.get(int(action), 0))

    updated_m, updated_s = n(Action.UPDATE_MATCHED), n(Action.UPDATE_NOT_MATCHED_BY_SOURCE)
    deleted_m, deleted_s = n(Action.DELETE_MATCHED), n(Action.DELETE_NOT_MATCHED_BY_SOURCE)
    return {
        "numTargetRowsCopied": n(Action.COPY),
        "numTargetRowsInserted": n(Action.INSERT),
        "numTargetRowsUpdated": updated_m + updated_s,
        "numTargetRowsDeleted": deleted_m + deleted_s,
        "numTargetRowsMatchedUpdated": updated_m,
        "numTargetRowsNotMatchedBySourceUpdated": updated_s,
        "numTargetRowsMatchedDeleted": deleted_m,
        "numTargetRowsNotMatchedBySourceDeleted": deleted_s,
        "numOutputRows": n(Action.COPY) + n(Action.INSERT) + updated_m + updated_s,
    }

def file_metrics(
    snapshot: TargetSnapshot, candidates: list[LiveFile], removes: tuple[LiveFile, ...],
    adds: tuple[WrittenFile, ...], change_files: tuple[WrittenFile, ...] = (),
) -> dict[str, int]:
    parts = snapshot.partition_columns
    return {
        "numTargetChangeFilesAdded": len(change_files),
        "numTargetChangeFileBytes": sum(f.size for f in change_files),
        "numTargetFilesBeforeSkipping": len(snapshot.files),
        "numTargetBytesBeforeSkipping": sum(f.size for f in snapshot.files),
        "numTargetFilesAfterSkipping": len(candidates),
        "numTargetBytesAfterSkipping": sum(f.size for f in candidates),
        "numTargetPartitionsAfterSkipping": partition_count(candidates, parts),
        "numTargetFilesRemoved": len(removes),
        "numTargetBytesRemoved": sum(f.size for f in removes),
        "numTargetPartitionsRemovedFrom": partition_count(removes, parts),
        "numTargetFilesAdded": len(adds),
        "numTargetBytesAdded": sum(f.size for f in adds),
        "numTargetPartitionsAddedTo": len({tuple(sorted(f.partition_values.items())) for f in adds})
        if parts else 0,
    }
