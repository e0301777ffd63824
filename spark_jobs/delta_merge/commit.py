"""Commit one merge as one Delta version through deltalake, as a compare-and-swap on a base version."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from spark_jobs.delta_merge.contract import MERGE_ENGINE, MERGE_OPERATION
from spark_jobs.delta_merge.errors import (
    ConcurrentModificationError,
    MergeAnalysisError,
    MergeExecutionError,
    MergeSpecError,
)
from spark_jobs.delta_merge.files import LiveFile, WrittenFile

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from spark_jobs.delta_merge.snapshot import TargetSnapshot

__all__ = [
    "ISOLATION_LEVELS", "MERGE_ENGINE", "MERGE_OPERATION", "SCHEMA_EVOLUTION_OPERATION", "CommitPlan",
    "attempt_commit", "commit_merge", "find_app_transaction_commit", "latest_version", "plan_commit",
    "read_commit_actions", "read_commit_info",
]

# MERGE_ENGINE and MERGE_OPERATION (commitInfo keys of a merge commit) belong to the provider contract.
SCHEMA_EVOLUTION_OPERATION = "MERGE SCHEMA EVOLUTION"  # ... of the metadata-only commit before it
ISOLATION_LEVELS = ("Serializable", "WriteSerializable", "SnapshotIsolation")
_COMMIT_FILE = "_delta_log/{:020d}.json"
_CONCURRENCY_DOC = "https://docs.delta.io/latest/concurrency-control.html"
# Keys deltalake generates or this module sets: commit_metadata must not override them.
_RESERVED_KEYS = frozenset({
    "timestamp", "operation", "operationParameters", "operationMetrics", "readVersion", "isolationLevel",
    "isBlindAppend", "engineInfo", "clientVersion", "txnId", "mergeEngine", "mergeOperation",
    "mergeCommitToken",
})


@dataclass(frozen=True)
class CommitPlan:
    """Everything one merge commits, independent of the version it finally lands on.

    :param new_schema_json: the evolved schema, or None when the merge keeps the table schema.
    :param token: a random id recorded in commitInfo (``mergeCommitToken``) of every commit of this
        plan, so a retry can recognise its own schema-evolution commit.
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


def commit_merge(
    snapshot: TargetSnapshot,
    *,
    removes: Sequence[LiveFile],
    adds: Sequence[WrittenFile],
    new_schema: StructType | None,
    operation_parameters: Mapping[str, Any],
    operation_metrics: Mapping[str, int],
    app_transaction: tuple[str, int] | None,
    commit_metadata: Mapping[str, Any],
    isolation_level: str = "WriteSerializable",
    storage_options: Mapping[str, str] | None = None,
) -> int:
    """Commit the merge on top of exactly ``snapshot.version``; return the committed version.

    :raises ConcurrentModificationError: someone committed after ``snapshot.version``.
    """
    plan = plan_commit(
        snapshot, removes=removes, adds=adds, new_schema=new_schema,
        operation_parameters=operation_parameters, operation_metrics=operation_metrics,
        app_transaction=app_transaction, commit_metadata=commit_metadata, isolation_level=isolation_level,
    )
    return attempt_commit(plan, base_version=snapshot.version, storage_options=storage_options)


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
    isolation_level: str = "WriteSerializable",
) -> CommitPlan:
    """Validate the merge's file actions and build its commitInfo.

    The files are checked as committed (:func:`~spark_jobs.delta_merge.commit_validity.check_commit_files`):
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
    # Imported here: commit_validity needs pyspark, and the Airflow side imports this module without it.
    from spark_jobs.delta_merge.commit_validity import check_commit_files

    final_schema = new_schema if new_schema is not None else snapshot.schema
    check_commit_files(snapshot, removes, adds, schema=final_schema)
    token = str(uuid.uuid4())
    commit_info: dict[str, Any] = {
        **commit_metadata,
        "operationParameters": {
            k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
            for k, v in operation_parameters.items()
        },
        "operationMetrics": {k: str(int(v)) for k, v in operation_metrics.items()},
        "readVersion": snapshot.version,
        "isolationLevel": isolation_level,
        "isBlindAppend": False,
        "mergeEngine": MERGE_ENGINE,
        "mergeOperation": MERGE_OPERATION,
        "mergeCommitToken": token,
    }
    return CommitPlan(
        table_uri=snapshot.table_uri, read_version=snapshot.version, partition_by=snapshot.partition_columns,
        removes=tuple(removes), adds=tuple(adds), commit_info=commit_info, app_transaction=app_transaction,
        new_schema_json=_evolved_schema_json(snapshot, new_schema),
        deletion_timestamp=int(time.time() * 1000), token=token,
    )


def attempt_commit(
    plan: CommitPlan, *, base_version: int, storage_options: Mapping[str, str] | None = None
) -> int:
    """Commit ``plan`` as the version right after ``base_version``, or fail: no retries, no rebase.

    With a schema change, two versions are written: a metadata-only ``add_columns`` commit at
    ``base_version + 1`` (deltalake 1.6.6 writes metaData only in overwrite mode, which cannot carry
    explicit removes), then the files at ``base_version + 2``. Returns the data commit's version.

    :raises ConcurrentModificationError: a version after ``base_version`` already exists.
    :raises MergeExecutionError: the commit failed for another reason.
    """
    options = dict(storage_options) if storage_options else None
    try:
        table = deltalake.DeltaTable(plan.table_uri, version=base_version, storage_options=options)
    except DeltaError as exc:
        raise MergeExecutionError(
            f"Cannot load target {plan.table_uri} at version {base_version} to commit: {_first_line(exc)}"
        ) from exc
    version = base_version
    schema_version: int | None = None
    if plan.new_schema_json is not None:
        fields = _changed_fields(table.schema(), plan.new_schema_json)
        if fields:
            info = {"readVersion": plan.read_version, "mergeEngine": MERGE_ENGINE,
                    "mergeOperation": SCHEMA_EVOLUTION_OPERATION, "mergeCommitToken": plan.token}
            props = CommitProperties(custom_metadata=info, max_commit_retries=0)
            _commit(plan, version, options, lambda: table.alter.add_columns(fields, commit_properties=props))
            version += 1
            schema_version = version
            if table.version() != version:  # add_columns advances the table object; be sure
                table = deltalake.DeltaTable(plan.table_uri, version=version, storage_options=options)
    # deltalake percent-encodes the paths it is given; add.path is already encoded, so decode once.
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(unquote(f.path), True, plan.deletion_timestamp, f.size, dict(f.partition_values))
        for f in plan.removes
    ]
    actions += [
        AddAction(unquote(f.path), f.size, dict(f.partition_values), f.modification_time, True, f.stats_json)
        for f in plan.adds
    ]
    # lastUpdated lets Delta expire the txn after delta.setTransactionRetentionDuration.
    txns = [Transaction(*plan.app_transaction, plan.deletion_timestamp)] if plan.app_transaction else None
    props = CommitProperties(
        custom_metadata=dict(plan.commit_info), max_commit_retries=0, app_transactions=txns
    )
    _commit(plan, version, options, lambda: table.create_write_transaction(
        actions, mode="append", schema=table.schema(), partition_by=list(plan.partition_by),
        commit_properties=props,
    ), schema_version=schema_version)
    return version + 1


def read_commit_info(
    uri: str, version: int, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``commitInfo`` of one version, read from its commit file (``{}`` if it has none).

    :raises MergeAnalysisError: the commit file does not exist (never written, or cleaned up).
    """
    actions = _read_commit(_log_handler(uri, storage_options), version)
    if actions is None:
        raise MergeAnalysisError(
            f"Target {uri} has no commit file for version {version} in _delta_log/: the version was never "
            "committed or its log entry has been cleaned up. Check the version and the URI."
        )
    return next((dict(a["commitInfo"]) for a in actions if "commitInfo" in a), {})


def find_app_transaction_commit(
    uri: str, app_id: str, app_version: int, *, storage_options: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any]] | None:
    """The version and commitInfo of the commit whose ``txn`` action is ``(app_id, app_version)``.

    Returns None when the table records no transaction of ``app_id`` at or above ``app_version``
    (checked first, cheaply, with ``transaction_version``) or when no retained commit carries that
    exact pair. Commits are scanned newest first and, as Delta's app versions only grow, the scan
    stops at the first older transaction of ``app_id``.
    """
    options = dict(storage_options) if storage_options else None
    try:
        table = deltalake.DeltaTable(_normalized_uri(uri), storage_options=options)
    except DeltaError as exc:
        raise MergeAnalysisError(
            f"Cannot read target {uri} to find app transaction {app_id}: {_first_line(exc)}"
        ) from exc
    recorded = table.transaction_version(app_id)
    if recorded is None or recorded < app_version:
        return None
    handler = _log_handler(table.table_uri, storage_options)
    for version in range(table.version(), -1, -1):
        actions = _read_commit(handler, version)
        if actions is None:
            return None
        for txn in (a["txn"] for a in actions if "txn" in a):
            if txn.get("appId") != app_id:
                continue
            if txn.get("version") == app_version:
                return version, next((dict(a["commitInfo"]) for a in actions if "commitInfo" in a), {})
            if isinstance(txn.get("version"), int) and txn["version"] < app_version:
                return None
    return None


def _evolved_schema_json(snapshot: TargetSnapshot, new_schema: StructType | None) -> str | None:
    if new_schema is None:
        return None
    from spark_jobs.delta_merge.delta_schema import delta_schema_json, normalized_schema_json

    text = delta_schema_json(new_schema)
    return None if normalized_schema_json(text) == normalized_schema_json(snapshot.schema_json) else text


def _changed_fields(current: deltalake.Schema, new_schema_json: str) -> list[deltalake.Field]:
    """Top-level fields that are new or differ; ``add_columns`` merges nested additions into them."""
    old = {f.name: json.loads(f.to_json()) for f in current.fields}
    new = deltalake.Schema.from_json(new_schema_json).fields
    return [f for f in new if old.get(f.name) != json.loads(f.to_json())]


def _commit(
    plan: CommitPlan, base: int, options: dict[str, str] | None, run: Callable[[], None], *,
    schema_version: int | None = None,
) -> None:
    try:
        run()
    except CommitFailedError as exc:  # with max_commit_retries=0: the next version already exists
        latest = _latest_version(_log_handler(plan.table_uri, options), base)
        if latest > base:
            note = "" if schema_version is None else (
                f" except its schema change, committed as version {schema_version} (token {plan.token})"
            )
            raise ConcurrentModificationError(
                "ConcurrentWriteException: A concurrent transaction has written new data since the current "
                "transaction read the table. Please try the operation again.\n"
                f"Refer to {_CONCURRENCY_DOC} for more details. The merge into {plan.table_uri} read "
                f"version {plan.read_version} and committed on version {base}, but the table is now at "
                f"version {latest}. Nothing of this commit landed{note}. Re-run the merge on the new "
                "version.",
                error_class="DELTA_CONCURRENT_WRITE",
            ) from exc
        cause: Exception = exc
    except DeltaError as exc:
        cause = exc
    else:
        return
    raise MergeExecutionError(
        f"Commit to {plan.table_uri} on version {base} failed: {_first_line(cause)}. Before retrying, check "
        "with find_app_transaction_commit or the table history whether it landed."
    ) from cause


def read_commit_actions(
    uri: str, version: int, *, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, Any]] | None:
    """The actions of one commit file, or None when it does not exist."""
    return _read_commit(_log_handler(uri, storage_options), version)


def latest_version(uri: str, *, known: int, storage_options: Mapping[str, str] | None = None) -> int:
    """The latest committed version, at least ``known`` (which must exist)."""
    return _latest_version(_log_handler(uri, storage_options), known)


def _first_line(exc: Exception) -> str:
    # delta-rs appends a Rust backtrace to some messages; the first line carries the cause.
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _latest_version(handler: DeltaStorageHandler, start: int) -> int:
    # Probing the next commit files is cheaper than loading the latest snapshot or listing the log.
    import pyarrow.fs

    version = start
    while handler.get_file_info([_COMMIT_FILE.format(version + 1)])[0].type != pyarrow.fs.FileType.NotFound:
        version += 1
    return version


def _read_commit(handler: DeltaStorageHandler, version: int) -> list[dict[str, Any]] | None:
    try:
        raw = handler.open_input_file(_COMMIT_FILE.format(version)).read()
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def _log_handler(uri: str, storage_options: Mapping[str, str] | None) -> DeltaStorageHandler:
    return DeltaStorageHandler(_normalized_uri(uri), dict(storage_options) if storage_options else None)


def _normalized_uri(uri: str) -> str:
    return os.path.abspath(uri) if not urlsplit(uri).scheme else uri
