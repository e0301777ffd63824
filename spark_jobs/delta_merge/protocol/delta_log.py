"""Reading a table's Delta log: commits, versions, app transactions, and what deltalake does not expose.

The one reader of the log for the job (snapshot, idempotency, conflict checks, the commit loop) and for the
Airflow provider's operator, sensor and trigger (through ``contract``). Commit files are read through
object_store (``log_store``); table versions and app transactions through deltalake, which replays
checkpoints. deltalake 1.6's ``get_add_actions`` leaves out ``deletionVector``, ``baseRowId`` and
``defaultRowCommitVersion``, and its Python API has no domain metadata: :func:`replay_log` reads them from
the newest complete checkpoint at or before a version (classic, multi-part, or V2 with sidecars) and the
JSON commits after it. Imports no pyspark.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import deltalake
import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError
from obstore.exceptions import NotFoundError
from obstore.store import ObjectStore

from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.protocol.commit_info import MERGE_ENGINE, MERGE_OPERATION
from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector
from spark_jobs.delta_merge.storage.log_store import (
    commit_path,
    log_store,
    read_commit,
)
from spark_jobs.delta_merge.storage.log_store import latest_version as _probe_latest
from spark_jobs.delta_merge.storage.storage_errors import storage_errors, storage_failure

__all__ = [
    "AddFields",
    "LogState",
    "LoggedCommit",
    "app_transaction_version",
    "commit_info_of",
    "find_app_transaction_commit",
    "first_merge_commit_after",
    "latest_version",
    "read_commit_actions",
    "read_commit_info",
    "replay_log",
    "table_version",
]

_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?(?:\.[0-9a-fA-F-]{36})?\.(parquet|json)$"
)
_CHECKPOINT_COLUMNS = ("add", "sidecar", "domainMetadata")


@dataclass(frozen=True)
class AddFields:
    """The fields of a live file's last ``add`` that deltalake does not expose (and ``stats`` as the log
    holds it, keyed by physical names: a deletion vector's new ``add`` repeats it)."""

    deletion_vector: DeletionVector | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    stats_json: str | None = None

    @classmethod
    def from_action(cls, add: Mapping[str, Any]) -> AddFields:
        vector, base = add.get("deletionVector"), add.get("baseRowId")
        version, stats = add.get("defaultRowCommitVersion"), add.get("stats")
        return cls(
            deletion_vector=DeletionVector.from_action(vector) if vector else None,
            base_row_id=None if base is None else int(base),
            default_row_commit_version=None if version is None else int(version),
            stats_json=stats if isinstance(stats, str) and stats else None,
        )


@dataclass(frozen=True)
class LogState:
    """What :func:`replay_log` found at one version.

    :param files: ``add.path`` -> its fields, for every live file.
    :param domains: ``domainMetadata.domain`` -> its ``configuration`` (a JSON string), live domains only.
    :param in_commit_timestamp: the version's ``commitInfo.inCommitTimestamp``, if it has one.
    """

    files: Mapping[str, AddFields] = field(default_factory=dict)
    domains: Mapping[str, str] = field(default_factory=dict)
    in_commit_timestamp: int | None = None


def replay_log(store: ObjectStore, version: int) -> LogState:
    """The live files' extra fields, the live domains and the in-commit timestamp at ``version``.

    :param store: the store rooted at the table
        (see :func:`~spark_jobs.delta_merge.storage.log_store.log_store`).
    """
    start, actions = _checkpoint_actions(store, version)
    adds: dict[tuple[str, str | None], Mapping[str, Any]] = {}
    domains: dict[str, str] = {}
    commit_info: Mapping[str, Any] = {}
    _apply(actions, adds, domains)
    for v in range(start + 1, version + 1):
        commit = list(_json_lines(_get(store, commit_path(v))))
        _apply(commit, adds, domains)
        if v == version:
            commit_info = next((a["commitInfo"] for a in commit if "commitInfo" in a), {})
    if start == version:
        commit_info = _commit_info_if_kept(store, version)
    timestamp = commit_info.get("inCommitTimestamp")
    return LogState(
        files={path: AddFields.from_action(add) for (path, _), add in adds.items()},
        domains=domains,
        in_commit_timestamp=None if timestamp is None else int(timestamp),
    )


def _apply(
    actions: list[dict[str, Any]],
    adds: dict[tuple[str, str | None], Mapping[str, Any]],
    domains: dict[str, str],
) -> None:
    # Keyed by (path, deletion vector id), as Delta's log replay reconciles file actions: a commit that
    # gives a file a new vector holds its add and the remove of the old vector, in an order the protocol
    # leaves open, so with a key of the path alone an add listed first would drop the file from the replay.
    for action in actions:
        if action.get("remove"):
            adds.pop(_file_key(action["remove"]), None)
        elif action.get("add"):
            adds[_file_key(action["add"])] = action["add"]
        elif action.get("domainMetadata"):
            domain = action["domainMetadata"]
            if domain.get("removed"):
                domains.pop(domain["domain"], None)
            else:
                domains[domain["domain"]] = str(domain["configuration"])


def _file_key(action: Mapping[str, Any]) -> tuple[str, str | None]:
    vector = action.get("deletionVector")
    return str(action["path"]), DeletionVector.from_action(vector).unique_id if vector else None


def _commit_info_if_kept(store: ObjectStore, version: int) -> Mapping[str, Any]:
    # A checkpointed version's commit file is usually still there; log cleanup may have removed it.
    try:
        raw = _get(store, commit_path(version))
    except (FileNotFoundError, NotFoundError):
        return {}
    return next((a["commitInfo"] for a in _json_lines(raw) if "commitInfo" in a), {})


def _checkpoint_actions(store: ObjectStore, version: int) -> tuple[int, list[dict[str, Any]]]:
    """(checkpoint version, its add and domainMetadata actions), or (-1, []) without a checkpoint."""
    found: dict[int, dict[tuple[int, str], list[str]]] = {}
    for batch in obstore.list(store, prefix="_delta_log/"):
        for meta in batch:
            name = meta["path"].rsplit("/", 1)[-1]
            match = _CHECKPOINT.match(name)
            if match and int(match.group(1)) <= version:
                parts = int(match.group(3) or 1)
                group = (parts, "" if parts > 1 else name)  # the parts of one multi-part checkpoint
                found.setdefault(int(match.group(1)), {}).setdefault(group, []).append(meta["path"])
    for v in sorted(found, reverse=True):
        for (parts, _), paths in found[v].items():
            if len(paths) == parts:
                return v, [a for path in sorted(paths) for a in _checkpoint_file_actions(store, path)]
    return -1, []


def _checkpoint_file_actions(store: ObjectStore, path: str) -> Iterator[dict[str, Any]]:
    raw = _get(store, path)
    if path.endswith(".json"):
        actions = list(_json_lines(raw))
    else:
        table = pq.read_table(pa.BufferReader(raw))
        names = [n for n in _CHECKPOINT_COLUMNS if n in table.column_names]
        actions = [{k: v for k, v in row.items() if v} for row in table.select(names).to_pylist()]
    for action in actions:
        if action.get("sidecar"):
            yield from _checkpoint_file_actions(store, f"_delta_log/_sidecars/{action['sidecar']['path']}")
        elif action.get("add") or action.get("domainMetadata"):
            yield action


def _get(store: ObjectStore, path: str) -> bytes:
    return bytes(obstore.get(store, path).bytes())


def _json_lines(raw: bytes) -> Iterator[dict[str, Any]]:
    for line in io.StringIO(raw.decode("utf-8")):
        if line.strip():
            yield json.loads(line)


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
    with storage_errors(uri, f"reading {commit_path(version)}", storage_options):
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
    store = log_store(_normalized_uri(uri), storage_options)
    with storage_errors(uri, f"probing the Delta log for commits after version {known}", storage_options):
        return _probe_latest(store, known)


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
        with storage_errors(uri, f"reading {commit_path(version)}", storage_options):
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
    """The oldest merge commit above ``after_version``, with its app transaction; None when there is none
    (yet). A merge commit: this job's (commitInfo's mergeEngine and mergeOperation), or another writer's
    whose operation is Delta's ``MERGE`` (Delta's own MERGE INTO, the ``delta`` engine's included)."""
    latest = table_version(uri, storage_options=storage_options)
    for version in range(after_version + 1, latest + 1):
        actions = read_commit_actions(uri, version, storage_options=storage_options) or []
        info = commit_info_of(actions)
        if info.get("mergeEngine") == MERGE_ENGINE:
            merged = info.get("mergeOperation") == MERGE_OPERATION
        else:
            merged = info.get("operation") == "MERGE"
        if merged:
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
    except OSError as exc:  # deltalake raises the store's errors (credentials, bucket) as OSError
        raise storage_failure(uri, "reading the Delta log", exc, storage_options) from exc


def _first_line(exc: Exception) -> str:
    # delta-rs appends a Rust backtrace to some messages; the first line carries the cause.
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _normalized_uri(uri: str) -> str:
    return os.path.abspath(uri) if not urlsplit(uri).scheme else uri
