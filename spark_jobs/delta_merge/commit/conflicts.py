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

__all__ = ["CONFLICT_CLASSES", "AlreadyApplied", "ReadSet", "added_file", "check_winning_commit"]


@dataclass(frozen=True)
class ReadSet:
    """What a merge read and writes, as the conflict rules need it.

    :param whole_table: the merge read every file (no target-only predicate, or NOT MATCHED BY SOURCE).
    :param read_paths: ``add.path`` of every file the merge scanned, with its partition values.
    :param removed_paths: ``add.path`` of every file the merge removes, with its partition values.
    :param token: the merge's commit token, which marks its own schema-evolution commit.
    :param serializable: the merge commits at Delta's Serializable level (Delta's only one, and the default):
        blind appends into what it read conflict too. False when the table's ``delta.isolationLevel`` is
        ``WriteSerializable`` (tables Databricks wrote).
    :param table: the table's URI, as conflict messages name it.
    :param partitioned: the table has partition columns (conflict messages then name a partition).
    """

    whole_table: bool
    read_paths: Mapping[str, Mapping[str, Any]]
    removed_paths: Mapping[str, Mapping[str, Any]]
    app_id: str | None
    app_version: int | None
    token: str
    serializable: bool = True
    table: str = ""
    partitioned: bool = False


@dataclass(frozen=True)
class AlreadyApplied:
    """A concurrent commit already applied this merge's app transaction (same app id, same or newer)."""

    version: int
    commit_info: Mapping[str, Any]


_DOC = "https://docs.delta.io/latest/concurrency-control.html"
_RETRY = f"Please retry the operation. Refer to {_DOC} for more information."


def _conflict(version: int, error_class: str, head: str, detail: str) -> ConcurrentModificationError:
    """Delta 4.4's text for the rule (``head``), then the commit that broke it and what to do."""
    return ConcurrentModificationError(
        f"{head}\nConflicting commit: version {version}, committed after this merge read the table, "
        f"{detail}. Nothing was committed; re-run the merge so that it reads the new version.",
        error_class=error_class,
    )


# Delta 4.4's classes of the conflicts over data files: (with a partition hint, without one).
_APPEND = ("DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT", "DELTA_CONCURRENT_APPEND.WITHOUT_HINT")
_DELETE_READ = (
    "DELTA_CONCURRENT_DELETE_READ.WITH_PARTITION_HINT", "DELTA_CONCURRENT_DELETE_READ.WITHOUT_HINT"
)
_DELETE_DELETE = (
    "DELTA_CONCURRENT_DELETE_DELETE.WITH_PARTITION_HINT", "DELTA_CONCURRENT_DELETE_DELETE.WITHOUT_HINT"
)

_TRANSACTION = "DELTA_CONCURRENT_TRANSACTION"
_PROTOCOL = "DELTA_PROTOCOL_CHANGED"
_METADATA = "DELTA_METADATA_CHANGED"
# Every class of a conflict with a concurrent commit, the job's and Delta's alike.
CONFLICT_CLASSES = frozenset((*_APPEND, *_DELETE_READ, *_DELETE_DELETE, _TRANSACTION, _PROTOCOL, _METADATA))


def _file_conflict(
    classes: tuple[str, str], version: int, info: Mapping[str, Any], read: ReadSet,
    partition: Mapping[str, Any] | None, detail: str,
) -> ConcurrentModificationError:
    """A conflict over data files, worded as Delta 4.4's ConflictChecker words it: the winner's operation,
    the table, its version, and (``WITH_PARTITION_HINT``) the partition of the file it names when the table
    is partitioned."""
    operation = info.get("operation", "UNKNOWN")
    table = f"delta.`{read.table}`"
    if classes == _APPEND:
        head = (f"Transaction conflict detected. a concurrent {operation} added data to table {table} "
                f"committed at version {version}. The concurrent operation modified data")
        tail = "that should have been read by this operation."
    else:
        what = "that this transaction read" if classes == _DELETE_READ else (
            "that this transaction attempted to delete")
        head = (f"Transaction conflict detected, a concurrent {operation} deleted data from table {table} "
                f"(committed at version {version}) {what}. The concurrent operation deleted data")
        tail = "that was read by this operation."
    if partition is None or not read.partitioned:
        return _conflict(version, classes[1], f"{head} {tail} {_RETRY}", detail)
    values = ", ".join(f"{key}={'null' if value is None else value}" for key, value in partition.items())
    head = f"{head} in the partition [{values}] {tail} {_RETRY}"
    return _conflict(version, classes[0], head, detail)


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
    matches_read: Callable[[Sequence[LiveFile]], Sequence[LiveFile]],
) -> AlreadyApplied | None:
    """Raise :class:`ConcurrentModificationError` when commit ``version`` conflicts with the merge.

    ``matches_read`` gives the added files that fall into what the merge read: the partitions its
    target-only predicates select, as Delta's read predicates do (partition values only, never statistics).
    Returns :class:`AlreadyApplied` when the commit applied this very app transaction.
    """
    info: Mapping[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    if info.get("mergeCommitToken") == read.token:
        return None  # this merge's own schema-evolution commit
    # The app transaction first (unlike Delta): a commit that applied this very merge makes it a no-op,
    # whatever else that commit changed.
    for txn in _of(actions, "txn"):
        if read.app_id is not None and txn.get("appId") == read.app_id:
            if read.app_version is not None and int(txn.get("version", -1)) >= read.app_version:
                return AlreadyApplied(version, dict(info))
            raise _conflict(
                version, _TRANSACTION,
                "ConcurrentTransactionException: This error occurs when multiple streaming queries are using "
                "the same checkpoint to write into this table. Did you run multiple instances of the same "
                f"streaming query at the same time?\nRefer to {_DOC} for more details.",
                f"holds a transaction of the same app id {read.app_id!r}",
            )
    if any(True for _ in _of(actions, "protocol")):
        raise _conflict(
            version, _PROTOCOL,
            "ProtocolChangedException: The protocol version of the Delta table has been changed by a "
            f"concurrent update.\nRefer to {_DOC} for more details.",
            "changed the table's protocol",
        )
    if any(True for _ in _of(actions, "metaData")):
        raise _conflict(
            version, _METADATA,
            f"MetadataChangedException: The metadata of the Delta table delta.`{read.table}` has been "
            "changed by a concurrent update. Please try the operation again.\n"
            f"Refer to {_DOC} for more details.",
            "changed the table's schema or properties",
        )
    # In the order of Delta's ConflictChecker: files added where the merge read, files removed that it
    # read, files removed that it removes too. Every add of the winner counts, a compaction's too (its
    # dataChange is false); a blind append's only under Serializable, Delta's isolation level.
    blind = info.get("isBlindAppend") is True
    if read.serializable or not blind:
        added = [added_file(a) for a in _of(actions, "add")]
        matching = added if read.whole_table else matches_read(added)
        if matching:
            raise _file_conflict(
                _APPEND, version, info, read, matching[0].partition_values,
                f"added {len(added)} file(s), {matching[0].path} among them, into what this merge read",
            )
    removed = [str(remove.get("path")) for remove in _of(actions, "remove")]
    for path in removed:
        if path in read.read_paths:
            raise _file_conflict(
                _DELETE_READ, version, info, read, read.read_paths[path],
                f"removed {path}, a file this merge read",
            )
    for path in removed:
        if path in read.removed_paths:
            raise _file_conflict(
                _DELETE_DELETE, version, info, read, read.removed_paths[path],
                f"removed {path}, a file this merge also removes",
            )
    return None


def _of(actions: Iterable[Mapping[str, Any]], kind: str) -> Iterable[Mapping[str, Any]]:
    return (a[kind] for a in actions if kind in a)
