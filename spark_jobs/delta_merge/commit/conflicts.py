"""Delta's conflict rules (its ConflictChecker) applied to the commits that landed after a merge read.

deltalake's commit does not check these (a concurrent append or compaction would commit silently and
duplicate rows), so the merge checks every commit between its read version and the version it commits on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_jobs.delta_merge.errors import ConcurrentModificationError
from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector
from spark_jobs.delta_merge.protocol.files import FileStats, LiveFile

__all__ = ["AlreadyApplied", "ReadSet", "added_file", "check_winning_commit"]


@dataclass(frozen=True)
class ReadSet:
    """What a merge read and writes, as the conflict rules need it.

    :param whole_table: the merge read every file (no target-only predicate, or NOT MATCHED BY SOURCE).
    :param read_paths: ``add.path`` of every file the merge scanned.
    :param removed_paths: ``add.path`` of every file the merge removes.
    :param token: the merge's commit token, which marks its own schema-evolution commit.
    :param serializable: the table's ``delta.isolationLevel`` is Serializable: blind appends conflict too.
    """

    whole_table: bool
    read_paths: frozenset[str]
    removed_paths: frozenset[str]
    app_id: str | None
    app_version: int | None
    token: str
    serializable: bool = False


@dataclass(frozen=True)
class AlreadyApplied:
    """A concurrent commit already applied this merge's app transaction (same app id, same or newer)."""

    version: int
    commit_info: Mapping[str, Any]


_RETRY = "Please try the operation again."
_DOC = "https://docs.delta.io/latest/concurrency-control.html"


def _conflict(version: int, error_class: str, head: str, detail: str) -> ConcurrentModificationError:
    """Delta's exception text for the rule (``head``), then the commit that broke it and what to do."""
    return ConcurrentModificationError(
        f"{head}\nConflicting commit: version {version}, committed after this merge read the table, "
        f"{detail}.\nRefer to {_DOC} for more details. Nothing was committed; re-run the merge so that "
        "it reads the new version.",
        error_class=error_class,
    )


def _where(files: Sequence[LiveFile]) -> str:
    # Delta names the partition the files went into, or "the root of the table" when unpartitioned.
    values = {tuple(sorted(f.partition_values.items())) for f in files}
    parts = sorted(", ".join(f"{k}={'null' if v is None else v}" for k, v in kv) for kv in values if kv)
    if not parts:
        return "the root of the table"
    shown = ", ".join(f"[{p}]" for p in parts[:3]) + (", ..." if len(parts) > 3 else "")
    return f"partition {shown}" if len(parts) == 1 else f"partitions {shown}"


def added_file(add: Mapping[str, Any]) -> LiveFile:
    """An ``add`` action as a :class:`LiveFile` (partition values and statistics as logged)."""
    stats_text = add.get("stats")
    stats = None
    if stats_text:
        parsed = json.loads(stats_text)
        stats = FileStats(
            num_records=parsed.get("numRecords"), min_values=parsed.get("minValues", {}),
            max_values=parsed.get("maxValues", {}), null_count=parsed.get("nullCount", {}),
        )
    return LiveFile(
        path=add["path"], size=int(add.get("size", 0)), partition_values=add.get("partitionValues", {}),
        stats=stats, modification_time=int(add.get("modificationTime", 0)),
        deletion_vector=DeletionVector.from_action(dv) if (dv := add.get("deletionVector")) else None,
    )


def check_winning_commit(
    version: int,
    actions: Sequence[Mapping[str, Any]],
    read: ReadSet,
    *,
    matches_read: Callable[[Sequence[LiveFile]], bool],
) -> AlreadyApplied | None:
    """Raise :class:`ConcurrentModificationError` when commit ``version`` conflicts with the merge.

    ``matches_read`` says whether any of the given added files falls into what the merge read (its
    target-only predicates, evaluated on partition values and statistics). Returns
    :class:`AlreadyApplied` when the commit applied this very app transaction.
    """
    info: Mapping[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    if info.get("mergeCommitToken") == read.token:
        return None  # this merge's own schema-evolution commit
    for txn in _of(actions, "txn"):
        if read.app_id is not None and txn.get("appId") == read.app_id:
            if read.app_version is not None and int(txn.get("version", -1)) >= read.app_version:
                return AlreadyApplied(version, dict(info))
            raise _conflict(
                version, "DELTA_CONCURRENT_TRANSACTION",
                "ConcurrentTransactionException: This error occurs when multiple streaming queries are using "
                "the same checkpoint to write into this table. Did you run multiple instances of the same "
                "streaming query at the same time?",
                f"holds a transaction of the same app id {read.app_id!r}",
            )
    if any(True for _ in _of(actions, "protocol")):
        raise _conflict(
            version, "DELTA_PROTOCOL_CHANGED",
            "ProtocolChangedException: The protocol version of the Delta table has been changed by a "
            "concurrent update.",
            "changed the table's protocol",
        )
    if any(True for _ in _of(actions, "metaData")):
        raise _conflict(
            version, "DELTA_METADATA_CHANGED",
            f"MetadataChangedException: The metadata of the Delta table has been changed by a concurrent "
            f"update. {_RETRY}",
            "changed the table's schema or properties",
        )
    # In the order of Delta's ConflictChecker: files added where the merge read, files removed that it
    # read, files removed that it removes too.
    blind = info.get("isBlindAppend") is True
    if read.serializable or not blind:
        added = [added_file(a) for a in _of(actions, "add") if a.get("dataChange", True)]
        if added and (read.whole_table or matches_read(added)):
            raise _conflict(
                version, "DELTA_CONCURRENT_APPEND",
                f"ConcurrentAppendException: Files were added to {_where(added)} by a concurrent update. "
                f"{_RETRY}",
                f"added {len(added)} file(s) into what this merge read",
            )
    removed = [remove.get("path") for remove in _of(actions, "remove")]
    for path in removed:
        if path in read.read_paths:
            raise _conflict(
                version, "DELTA_CONCURRENT_DELETE_READ",
                f"ConcurrentDeleteReadException: This transaction attempted to read one or more files "
                f"that were deleted (for example {path}) by a concurrent update. {_RETRY}",
                f"removed {path}, a file this merge read",
            )
    for path in removed:
        if path in read.removed_paths:
            raise _conflict(
                version, "DELTA_CONCURRENT_DELETE_DELETE",
                f"ConcurrentDeleteDeleteException: This transaction attempted to delete one or more files "
                f"that were deleted (for example {path}) by a concurrent update. {_RETRY}",
                f"removed {path}, a file this merge also removes",
            )
    return None


def _of(actions: Iterable[Mapping[str, Any]], kind: str) -> Iterable[Mapping[str, Any]]:
    return (a[kind] for a in actions if kind in a)
