"""Find a merge commit in a table's Delta log: the one decision shared by the operator, sensor and trigger.

Reads the log through the job's log reader (``delta_log``, via ``contract``; it imports deltalake only when
called, as DAG parsing must not load it); never starts Spark.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow_merge_provider.errors import MergeProviderError, StorageRefusedError, TargetTableNotFoundError
from airflow_merge_provider.metrics import to_xcom
from spark_jobs.delta_merge.contract import (
    MergeJobError,
    MergeMetrics,
    TableStorageError,
    app_transaction_version,
    credentials_named,
    find_app_transaction_commit,
    first_merge_commit_after,
    is_deterministic,
)

__all__ = ["MergeCommit", "find_merge_commit", "normalize_table_uri"]


@dataclass(frozen=True)
class MergeCommit:
    """One merge commit of a Delta table.

    :param version: the table version the merge committed.
    :param commit_info: the commit's ``commitInfo`` as stored (operationMetrics as strings).
    :param app_id: the ``txn`` application id the merge recorded, if any.
    :param app_version: the ``txn`` version the merge recorded, if any.
    """

    version: int
    commit_info: Mapping[str, Any] = field(default_factory=dict)
    app_id: str | None = None
    app_version: int | None = None

    def metrics(self, *, skipped: bool = False) -> dict[str, Any]:
        """The commit's metrics in the operator's XCom shape (ints, plus appId/appVersion)."""
        raw = MergeMetrics.from_commit(self.version, self.commit_info).to_dict()
        return to_xcom(raw, app_id=self.app_id, app_version=self.app_version, skipped=skipped)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (trigger events)."""
        return {
            "version": self.version,
            "commit_info": dict(self.commit_info),
            "app_id": self.app_id,
            "app_version": self.app_version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MergeCommit:
        """Inverse of :meth:`to_dict`."""
        return cls(
            version=int(data["version"]),
            commit_info=dict(data.get("commit_info") or {}),
            app_id=data.get("app_id"),
            app_version=None if data.get("app_version") is None else int(data["app_version"]),
        )


def normalize_table_uri(uri: str) -> str:
    """A local path made absolute; a URI (``s3://``, ``file://``, ...) unchanged."""
    return os.path.abspath(uri) if not urlsplit(uri).scheme else uri


def find_merge_commit(
    target: str,
    *,
    app_id: str | None = None,
    app_version: int | None = None,
    after_version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    credentials_from: str | None = None,
) -> MergeCommit | None:
    """The merge commit asked for, or None when the log does not hold it (yet).

    - ``app_id`` and ``app_version``: the commit whose ``txn`` action is exactly that pair;
    - ``app_id`` alone: the commit of the highest version recorded for that app id;
    - ``after_version`` alone: the oldest merge commit (made by this provider's job) above that version;
    - ``app_id`` with ``after_version``: as for ``app_id``, and only if its version is above it.

    :param credentials_from: where the credentials in ``storage_options`` came from (``"aws_conn_id='x'"``),
        for the message of a storage error.
    :raises TargetTableNotFoundError: ``target`` is not a Delta table.
    :raises StorageRefusedError: the store refused the credentials or the request, or the bucket is missing.
    :raises MergeProviderError: the log could not be read.
    """
    if app_id is None and after_version is None:
        raise ValueError("find_merge_commit needs app_id or after_version (or both)")
    if app_id is None and app_version is not None:
        raise ValueError("find_merge_commit: app_version needs an app_id")
    uri = normalize_table_uri(target)
    options = dict(storage_options) if storage_options else None
    with credentials_named({uri: credentials_from}):
        return _find(uri, app_id, app_version, after_version, options)


def _find(
    uri: str, app_id: str | None, app_version: int | None, after_version: int | None,
    options: dict[str, str] | None,
) -> MergeCommit | None:  # fmt: skip
    if app_id is None:
        assert after_version is not None
        return _first_merge_after(uri, after_version, options)
    commit = _app_commit(uri, app_id, app_version, options)
    if commit is not None and after_version is not None and commit.version <= after_version:
        return None
    return commit


def _app_commit(
    uri: str, app_id: str, app_version: int | None, options: dict[str, str] | None
) -> MergeCommit | None:
    with _reading(uri):
        if app_version is None:
            app_version = app_transaction_version(uri, app_id, storage_options=options)
            if app_version is None:
                return None
        found = find_app_transaction_commit(uri, app_id, app_version, storage_options=options)
    if found is None:
        return None
    version, commit_info = found
    return MergeCommit(version, commit_info, app_id, app_version)


def _first_merge_after(uri: str, after_version: int, options: dict[str, str] | None) -> MergeCommit | None:
    with _reading(uri):
        found = first_merge_commit_after(uri, after_version, storage_options=options)
    return None if found is None else MergeCommit(*found)


@contextmanager
def _reading(uri: str) -> Iterator[None]:
    """Turn deltalake's and the job's errors into the provider's, classified by type."""
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        yield
    except (DeltaError, MergeJobError, OSError) as error:
        if isinstance(error, TableNotFoundError) or isinstance(error.__cause__, TableNotFoundError):
            raise TargetTableNotFoundError(
                f"{uri} is not a Delta table (no _delta_log found). Check the target URI and that the "
                "table has been created."
            ) from error
        if isinstance(error, MergeJobError):
            # The job's message names the table, the operation and what to check already.
            refused = isinstance(error, TableStorageError) and is_deterministic(type(error).__name__)
            kind = StorageRefusedError if refused else MergeProviderError
            raise kind(str(error)) from error
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise MergeProviderError(f"Cannot read the Delta log of {uri}: {first}") from error
