"""Commit one merge as one Delta version: its actions per PROTOCOL.md, put-if-absent on a base version.

deltalake's write-transaction API takes only adds and removes (no metaData beside removes, operation forced
to WRITE), so the merge's commit file is written here (``log_store``); deltalake stays the log reader and
writes the checkpoints.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata as package_metadata
from typing import TYPE_CHECKING, Any

import deltalake
from deltalake.exceptions import DeltaError
from obstore.exceptions import BaseError as StoreError

from spark_jobs.delta_merge.commit.validity import check_commit_files
from spark_jobs.delta_merge.errors import (
    ConcurrentModificationError,
    MergeExecutionError,
    MergeSpecError,
)
from spark_jobs.delta_merge.protocol.commit_info import MERGE_ENGINE, MERGE_OPERATION
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.row_tracking import assign_row_ids, high_water_mark, row_tracking
from spark_jobs.delta_merge.storage.log_store import (
    commit_path,
    log_store,
    write_commit,
)
from spark_jobs.delta_merge.storage.storage_errors import storage_failure
from spark_jobs.delta_merge.storage.storage_secrets import redacted

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = [
    "ISOLATION_LEVELS",
    "MERGE_ENGINE",
    "MERGE_OPERATION",
    "CommitPlan",
    "attempt_commit",
    "plan_commit",
]

log = logging.getLogger("delta_merge")

# MERGE_ENGINE and MERGE_OPERATION (commitInfo keys of a merge commit) belong to the provider contract.
ISOLATION_LEVELS = ("Serializable", "WriteSerializable", "SnapshotIsolation")
_CONCURRENCY_DOC = "https://docs.delta.io/latest/concurrency-control.html"
_DEFAULT_CHECKPOINT_INTERVAL = 10
# Keys deltalake generates or this module sets: commit_metadata must not override them.
_RESERVED_KEYS = frozenset(
    {
        "timestamp",
        "operation",
        "operationParameters",
        "operationMetrics",
        "readVersion",
        "isolationLevel",
        "isBlindAppend",
        "engineInfo",
        "clientVersion",
        "txnId",
        "mergeEngine",
        "mergeOperation",
        "mergeCommitToken",
    }
)


@dataclass(frozen=True)
class CommitPlan:
    """Everything one merge commits, independent of the version it finally lands on.

    :param new_schema_json: the evolved schema, or None when the merge keeps the table schema; it is
        committed as a ``metaData`` action in the same version as the data.
    :param token: a random id recorded in commitInfo (``mergeCommitToken``) and as its ``txnId``.
    :param checkpoint_interval: the table's ``delta.checkpointInterval``: a checkpoint follows every
        version divisible by it, as Delta writers do.
    :param change_files: change data files (change data feed), committed as ``cdc`` actions.
    :param configuration_updates: table properties the merge sets (column mapping's maxColumnId, ...);
        committed, like a schema change, as a ``metaData`` action in the same version as the data.
    :param assigns_row_ids: row tracking is supported: adds get ``baseRowId`` above the high-water mark
        and ``defaultRowCommitVersion``, and the mark moves, at the version the commit lands on.
    :param read_domains: the live domain metadata at ``read_version`` (the high-water mark's base).
    :param in_commit_timestamps: ``delta.enableInCommitTimestamps``: commitInfo carries a monotonic
        ``inCommitTimestamp``.
    :param read_in_commit_timestamp: the in-commit timestamp of ``read_version``.
    """

    table_uri: str
    read_version: int
    partition_by: tuple[str, ...]
    removes: tuple[LiveFile, ...]
    adds: tuple[WrittenFile, ...]
    commit_info: Mapping[str, Any]
    app_transaction: tuple[str, int] | None
    new_schema_json: str | None
    deletion_timestamp: int
    token: str
    checkpoint_interval: int = _DEFAULT_CHECKPOINT_INTERVAL
    change_files: tuple[WrittenFile, ...] = ()
    configuration_updates: Mapping[str, str] = field(default_factory=dict)
    assigns_row_ids: bool = False
    read_domains: Mapping[str, str] = field(default_factory=dict)
    in_commit_timestamps: bool = False
    read_in_commit_timestamp: int | None = None
    readds: tuple[LiveFile, ...] = ()

    @property
    def changes_metadata(self) -> bool:
        return self.new_schema_json is not None or bool(self.configuration_updates)


def plan_commit(
    snapshot: TargetSnapshot,
    *,
    removes: Sequence[LiveFile],
    adds: Sequence[WrittenFile],
    new_schema: StructType | None,
    operation_parameters: Mapping[str, Any],
    operation_metrics: Mapping[str, int],
    app_transaction: tuple[str, int] | None,
    commit_metadata: Mapping[str, Any],
    isolation_level: str = "Serializable",
    change_files: Sequence[WrittenFile] = (),
    configuration_updates: Mapping[str, str] | None = None,
    readds: Sequence[LiveFile] = (),
) -> CommitPlan:
    """Validate the merge's file actions and build its commitInfo.

    The files are checked as committed (:func:`~spark_jobs.delta_merge.commit.validity.check_commit_files`):
    this reads their sizes and Parquet footers, but writes nothing.

    :raises MergeExecutionError: a remove or an add is not valid; nothing is committed.
    """
    if isolation_level not in ISOLATION_LEVELS:
        raise MergeSpecError(
            f"invalid isolation level {isolation_level!r}: isolation_level must be one of "
            f"{', '.join(ISOLATION_LEVELS)}.",
            error_class="DELTA_INVALID_ISOLATION_LEVEL",
        )
    clashes = sorted(set(commit_metadata) & _RESERVED_KEYS)
    if clashes:
        raise MergeSpecError(
            f"run.commit_metadata must not set reserved commitInfo keys; found {', '.join(clashes)}."
        )
    try:
        json.dumps(dict(commit_metadata), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise MergeSpecError(f"run.commit_metadata must be JSON-serializable (no NaN): {exc}.") from exc
    final_schema = new_schema if new_schema is not None else snapshot.schema
    check_commit_files(snapshot, removes, adds, schema=final_schema)
    token = str(uuid.uuid4())
    tracking = row_tracking(snapshot)
    if tracking is not None and tracking.preserves:
        # PROTOCOL.md: set when every updated or copied row kept its stable row id (and copies their
        # commit versions), which this job's merges always do.
        tags = {**commit_metadata.get("tags", {}), "delta.rowTracking.preserved": "true"}
        commit_metadata = {**commit_metadata, "tags": tags}
    commit_info: dict[str, Any] = {
        **commit_metadata,
        "operation": "MERGE",
        "operationParameters": {
            k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
            for k, v in operation_parameters.items()
        },
        "operationMetrics": {k: str(int(v)) for k, v in operation_metrics.items()},
        "readVersion": snapshot.version,
        "isolationLevel": isolation_level,
        "isBlindAppend": False,
        "engineInfo": _engine_info(),
        "txnId": token,
        "mergeEngine": MERGE_ENGINE,
        "mergeOperation": MERGE_OPERATION,
        "mergeCommitToken": token,
    }
    return CommitPlan(
        table_uri=snapshot.table_uri,
        read_version=snapshot.version,
        partition_by=snapshot.partition_columns,
        removes=tuple(removes),
        adds=tuple(adds),
        commit_info=commit_info,
        app_transaction=app_transaction,
        new_schema_json=_evolved_schema_json(snapshot, new_schema),
        deletion_timestamp=int(time.time() * 1000),
        token=token,
        checkpoint_interval=_checkpoint_interval(snapshot.configuration),
        change_files=tuple(change_files),
        configuration_updates=_configuration_updates(snapshot, configuration_updates or {}),
        assigns_row_ids=tracking is not None,
        read_domains=dict(snapshot.domains),
        in_commit_timestamps=_in_commit_timestamps(snapshot),
        read_in_commit_timestamp=snapshot.in_commit_timestamp,
        readds=tuple(readds),
    )


def _in_commit_timestamps(snapshot: TargetSnapshot) -> bool:
    enabled = snapshot.configuration.get("delta.enableInCommitTimestamps", "false").lower() == "true"
    return enabled and "inCommitTimestamp" in snapshot.protocol.writer_features


def _configuration_updates(snapshot: TargetSnapshot, updates: Mapping[str, str]) -> dict[str, str]:
    """The properties that actually change (a metaData action is committed only for real changes)."""
    return {k: str(v) for k, v in updates.items() if snapshot.configuration.get(k) != str(v)}


def attempt_commit(
    plan: CommitPlan, *, base_version: int, storage_options: Mapping[str, str] | None = None
) -> int:
    """Commit ``plan`` as the version right after ``base_version``, or fail: no retries, no rebase.

    The commit file holds commitInfo, then metaData (when the schema evolved), txn, the removes, the
    adds and the cdc actions, and is written only if that version does not exist yet.

    :raises ConcurrentModificationError: a version after ``base_version`` already exists.
    :raises MergeExecutionError: the commit failed for another reason.
    """
    version = base_version + 1
    actions = commit_actions(plan, storage_options=storage_options, base_version=base_version)
    store = log_store(plan.table_uri, storage_options)
    try:
        written = write_commit(store, version, actions)
    except (OSError, StoreError) as exc:
        operation = f"writing commit {commit_path(version).rsplit('/', 1)[-1]} (on version {base_version})"
        raise storage_failure(
            plan.table_uri, operation, exc, storage_options,
            note="Before retrying, check with find_app_transaction_commit or the table history whether "
            "it landed.",
        ) from exc  # fmt: skip
    if not written:
        raise ConcurrentModificationError(
            "ConcurrentWriteException: A concurrent transaction has written new data since the current "
            "transaction read the table. Please try the operation again.\n"
            f"Refer to {_CONCURRENCY_DOC} for more details. The merge into {plan.table_uri} read version "
            f"{plan.read_version} and committed on version {base_version}, but version {version} exists now. "
            "Nothing of this commit landed. Re-run the merge on the new version.",
            error_class="DELTA_CONCURRENT_WRITE",
        )
    _checkpoint_if_due(plan, version, storage_options)
    return version


def commit_actions(
    plan: CommitPlan, *, base_version: int, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The actions of the merge's commit, in the order Delta writes them, for landing on ``base_version``
    + 1: row ids, the high-water mark and the in-commit timestamp follow from that version's base."""
    now = int(time.time() * 1000)
    domains, previous_timestamp = _base_state(plan, base_version, storage_options)
    commit_info: dict[str, Any] = {"timestamp": now, **plan.commit_info}
    if plan.in_commit_timestamps:
        # PROTOCOL.md "In-Commit Timestamps": strictly greater than the previous commit's.
        timestamp = now if previous_timestamp is None else max(now, previous_timestamp + 1)
        commit_info = {"inCommitTimestamp": timestamp, **commit_info, "timestamp": timestamp}
    actions: list[dict[str, Any]] = [{"commitInfo": commit_info}]
    if plan.changes_metadata:
        actions.append({"metaData": _metadata_action(plan, base_version, storage_options)})
    if plan.app_transaction is not None:
        app_id, app_version = plan.app_transaction
        # lastUpdated lets Delta expire the txn after delta.setTransactionRetentionDuration.
        actions.append(
            {"txn": {"appId": app_id, "version": app_version, "lastUpdated": plan.deletion_timestamp}}
        )
    # A file with a deletion vector is identified by path and vector: its remove carries the descriptor.
    # Row tracking: a remove repeats its add's baseRowId and defaultRowCommitVersion.
    actions += [
        {"remove": {
            "path": f.path, "deletionTimestamp": plan.deletion_timestamp, "dataChange": True,
            "extendedFileMetadata": True, "partitionValues": dict(f.partition_values), "size": f.size,
            **({"deletionVector": f.deletion_vector.to_action()} if f.deletion_vector else {}),
            **({"baseRowId": f.base_row_id} if f.base_row_id is not None else {}),
            **({"defaultRowCommitVersion": f.default_row_commit_version}
               if f.default_row_commit_version is not None else {}),
        }}
        for f in plan.removes
    ]  # fmt: skip
    row_ids: list[dict[str, int]] = [{} for _ in plan.adds]
    if plan.assigns_row_ids:
        row_ids, mark = assign_row_ids(
            plan.adds, high_water_mark=high_water_mark(domains), version=base_version + 1
        )
        if mark is not None:
            actions.append({"domainMetadata": mark})
    actions += [
        {"add": {
            "path": f.path, "partitionValues": dict(f.partition_values), "size": f.size,
            "modificationTime": f.modification_time, "dataChange": True, "stats": f.stats_json, **ids,
        }}
        for f, ids in zip(plan.adds, row_ids, strict=True)
    ]  # fmt: skip
    # A file whose rows the merge marked deleted: the same file again with its new deletion vector; it keeps
    # its row ids and commit version (PROTOCOL.md "Row Tracking": they belong to the file's rows).
    actions += [
        {"add": {
            "path": f.path, "partitionValues": dict(f.partition_values), "size": f.size,
            "modificationTime": f.modification_time, "dataChange": True,
            **({"stats": f.stats_json} if f.stats_json is not None else {}),
            "deletionVector": f.deletion_vector.to_action() if f.deletion_vector else None,
            **({"baseRowId": f.base_row_id} if f.base_row_id is not None else {}),
            **({"defaultRowCommitVersion": f.default_row_commit_version}
               if f.default_row_commit_version is not None else {}),
        }}
        for f in plan.readds
    ]  # fmt: skip
    # PROTOCOL.md "Add CDC File": change data only, never data of the table, so dataChange is false.
    actions += [
        {"cdc": {
            "path": f.path, "partitionValues": dict(f.partition_values), "size": f.size, "dataChange": False,
        }}
        for f in plan.change_files
    ]  # fmt: skip
    return actions


def _base_state(
    plan: CommitPlan, base_version: int, storage_options: Mapping[str, str] | None
) -> tuple[Mapping[str, str], int | None]:
    """The live domains and the in-commit timestamp at ``base_version`` (read again from the log only
    when the commit lands on a later version than the merge read, and only when needed)."""
    if base_version == plan.read_version or not (plan.assigns_row_ids or plan.in_commit_timestamps):
        return plan.read_domains, plan.read_in_commit_timestamp
    # Imported here: delta_log reads checkpoints with pyarrow, which the Airflow side does not need.
    from spark_jobs.delta_merge.protocol.delta_log import replay_log

    operation = f"reading the row id high-water mark and in-commit timestamp at version {base_version}"
    try:
        state = replay_log(log_store(plan.table_uri, storage_options), base_version)
    except (OSError, StoreError) as exc:
        raise storage_failure(plan.table_uri, operation, exc, storage_options) from exc
    except (ValueError, KeyError) as exc:
        raise MergeExecutionError(
            f"Cannot read the row id high-water mark and in-commit timestamp of {plan.table_uri} at "
            f"version {base_version} to commit on it: {_first_line(exc)}"
        ) from exc
    return state.domains, state.in_commit_timestamp


def _metadata_action(
    plan: CommitPlan, base_version: int, storage_options: Mapping[str, str] | None
) -> dict[str, Any]:
    """The table's metaData at ``base_version`` with the merge's schema and property changes; same id and
    partitioning."""
    options = dict(storage_options) if storage_options else None
    try:
        current = deltalake.DeltaTable(
            plan.table_uri, version=base_version, storage_options=options
        ).metadata()
    except (DeltaError, OSError) as exc:
        raise MergeExecutionError(
            f"Cannot read the metadata of {plan.table_uri} at version {base_version} to commit the merge's "
            f"schema change: {_first_line(exc)}"
        ) from exc
    return {
        "id": current.id,
        "name": current.name,
        "description": current.description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": plan.new_schema_json if plan.new_schema_json is not None else _schema_json(
            plan.table_uri, base_version, options
        ),
        "partitionColumns": list(current.partition_columns),
        "configuration": {**current.configuration, **plan.configuration_updates},
        "createdTime": current.created_time,
    }


def _schema_json(table_uri: str, version: int, options: dict[str, str] | None) -> str:
    return deltalake.DeltaTable(table_uri, version=version, storage_options=options).schema().to_json()


def _checkpoint_if_due(plan: CommitPlan, version: int, storage_options: Mapping[str, str] | None) -> None:
    if version % plan.checkpoint_interval:
        return
    options = dict(storage_options) if storage_options else None
    try:
        deltalake.DeltaTable(plan.table_uri, version=version, storage_options=options).create_checkpoint()
    except (DeltaError, OSError) as exc:  # the commit stands; the next due version writes one again
        cause = redacted(_first_line(exc), storage_options)
        log.warning("checkpoint of %s at version %d failed: %s", plan.table_uri, version, cause)


def _checkpoint_interval(configuration: Mapping[str, str]) -> int:
    try:
        interval = int(configuration.get("delta.checkpointInterval", _DEFAULT_CHECKPOINT_INTERVAL))
    except ValueError:
        return _DEFAULT_CHECKPOINT_INTERVAL
    return interval if interval > 0 else _DEFAULT_CHECKPOINT_INTERVAL


def _engine_info() -> str:
    try:
        return f"{MERGE_ENGINE}/{package_metadata.version('airflow-merge-provider')}"
    except package_metadata.PackageNotFoundError:
        return MERGE_ENGINE


def _evolved_schema_json(snapshot: TargetSnapshot, new_schema: StructType | None) -> str | None:
    if new_schema is None:
        return None
    from spark_jobs.delta_merge.protocol.delta_schema import delta_schema_json, normalized_schema_json

    text = delta_schema_json(new_schema)
    return None if normalized_schema_json(text) == normalized_schema_json(snapshot.schema_json) else text


def _first_line(exc: Exception) -> str:
    # delta-rs appends a Rust backtrace to some messages; the first line carries the cause.
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
