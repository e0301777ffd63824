"""Reading a table's Delta log: commits, versions, app transactions and the merges this job committed.

The one reader of the log for the job (idempotency, conflict checks, the commit loop) and for the Airflow
provider's operator, sensor and trigger (through ``contract``). Commit files are read through object_store
(``log_store``); table versions and app transactions through deltalake, which replays checkpoints.
Imports no pyspark.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import deltalake
from deltalake.exceptions import DeltaError

from spark_jobs.delta_merge.contract import MERGE_ENGINE, MERGE_OPERATION
from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.log_store import latest_version as _probe_latest
from spark_jobs.delta_merge.log_store import log_store, read_commit

__all__ = [
    "LoggedCommit",
    "app_transaction_version",
    "commit_info_of",
    "find_app_transaction_commit",
    "first_merge_commit_after",
    "latest_version",
    "read_commit_actions",
    "read_commit_info",
    "table_version",
]

# (version, commitInfo, txn appId or None, txn version or None) of one commit.
LoggedCommit = tuple[int, dict[str, Any], "str | None", "int | None"]


def read_commit_actions(
    uri: str, version: int, *, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, Any]] | None:
    """The actions of one commit file, or None when it does not exist."""
    try:
        store = log_store(_normalized_uri(uri), storage_options)
    except FileNotFoundError:
        return None
    return read_commit(store, version)


def commit_info_of(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``commitInfo`` of a commit's actions (``{}`` if it has none)."""
    return next((dict(a["commitInfo"]) for a in actions if "commitInfo" in a), {})


def read_commit_info(
    uri: str, version: int, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``commitInfo`` of one version, read from its commit file (``{}`` if it has none).

    :raises MergeAnalysisError: the commit file does not exist (never written, or cleaned up).
    """
    actions = read_commit_actions(uri, version, storage_options=storage_options)
    if actions is None:
        raise MergeAnalysisError(
            f"Target {uri} has no commit file for version {version} in _delta_log/: the version was never "
            "committed or its log entry has been cleaned up. Check the version and the URI."
        )
    return commit_info_of(actions)


def latest_version(uri: str, *, known: int, storage_options: Mapping[str, str] | None = None) -> int:
    """The latest committed version, at least ``known`` (which must exist)."""
    return _probe_latest(log_store(_normalized_uri(uri), storage_options), known)


def table_version(uri: str, *, storage_options: Mapping[str, str] | None = None) -> int:
    """The table's latest version, as deltalake resolves it (checkpoints and log listing)."""
    return int(_open(uri, storage_options).version())


def app_transaction_version(
    uri: str, app_id: str, *, storage_options: Mapping[str, str] | None = None
) -> int | None:
    """The highest version of app transaction ``app_id`` the table records (``txn`` actions), or None."""
    recorded = _open(uri, storage_options).transaction_version(app_id)
    return None if recorded is None else int(recorded)


def find_app_transaction_commit(
    uri: str, app_id: str, app_version: int, *, storage_options: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any]] | None:
    """The version and commitInfo of the commit whose ``txn`` action is ``(app_id, app_version)``.

    Returns None when the table records no transaction of ``app_id`` at or above ``app_version``
    (checked first, cheaply, with ``transaction_version``) or when no retained commit carries that
    exact pair. Commits are scanned newest first and, as Delta's app versions only grow, the scan
    stops at the first older transaction of ``app_id``.
    """
    table = _open(uri, storage_options)
    recorded = table.transaction_version(app_id)
    if recorded is None or recorded < app_version:
        return None
    store = log_store(table.table_uri, storage_options)
    for version in range(table.version(), -1, -1):
        actions = read_commit(store, version)
        if actions is None:
            return None
        for txn in (a["txn"] for a in actions if "txn" in a):
            if txn.get("appId") != app_id:
                continue
            if txn.get("version") == app_version:
                return version, commit_info_of(actions)
            if isinstance(txn.get("version"), int) and txn["version"] < app_version:
                return None
    return None


def first_merge_commit_after(
    uri: str, after_version: int, *, storage_options: Mapping[str, str] | None = None
) -> LoggedCommit | None:
    """The oldest commit above ``after_version`` made by this job's merge (commitInfo's mergeEngine and
    mergeOperation), with its app transaction; None when there is none (yet)."""
    latest = table_version(uri, storage_options=storage_options)
    for version in range(after_version + 1, latest + 1):
        actions = read_commit_actions(uri, version, storage_options=storage_options) or []
        info = commit_info_of(actions)
        if info.get("mergeEngine") == MERGE_ENGINE and info.get("mergeOperation") == MERGE_OPERATION:
            txn: dict[str, Any] = next((a["txn"] for a in actions if "txn" in a), {})
            app_version = txn.get("version")
            return version, info, txn.get("appId"), app_version if isinstance(app_version, int) else None
    return None


def _open(uri: str, storage_options: Mapping[str, str] | None) -> deltalake.DeltaTable:
    options = dict(storage_options) if storage_options else None
    try:
        return deltalake.DeltaTable(_normalized_uri(uri), storage_options=options)
    except DeltaError as exc:
        raise MergeAnalysisError(f"Cannot read the Delta log of {uri}: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    # delta-rs appends a Rust backtrace to some messages; the first line carries the cause.
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _normalized_uri(uri: str) -> str:
    return os.path.abspath(uri) if not urlsplit(uri).scheme else uri
