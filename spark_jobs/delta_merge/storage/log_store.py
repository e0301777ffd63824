"""A table's ``_delta_log`` through object_store (obstore): read commits, probe versions, write put-if-absent.

One code path for local disk and object stores. A commit file is written with ``mode="create"``: an
exclusive create on local disk, a conditional PUT on S3, GCS and Azure. Whoever writes version ``v`` first
wins; the loser learns it from the store, never by renaming over a file (PROTOCOL.md, "Delta Log Entries").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError
from obstore.exceptions import BaseError as StoreError
from obstore.store import LocalStore, ObjectStore, from_url

from spark_jobs.delta_merge.storage.azure_options import check_azure_options
from spark_jobs.delta_merge.storage.storage_errors import storage_failure

__all__ = [
    "commit_path",
    "latest_version",
    "log_store",
    "read_commit",
    "store_options",
    "write_commit",
]

# object_store's HTTP client options: obstore takes them apart from the store's config (given there, they
# make it panic). Keys are compared lowercased, without their aws_/azure_/google_ prefix.
_CLIENT_OPTIONS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
    "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle", "http2_only",
    "pool_idle_timeout", "pool_max_idle_per_host", "proxy_ca_certificate", "proxy_excludes", "proxy_url",
    "randomize_addresses", "timeout", "user_agent",
})  # fmt: skip
# deltalake's own storage options (locking and rename policy), which object_store does not know.
_DELTALAKE_ONLY = frozenset({
    "aws_s3_allow_unsafe_rename", "aws_s3_locking_provider", "aws_s3_lock_table_name",
    "delta_dynamo_table_name",
    "dynamo_lock_table_name", "dynamo_lock_owner_name", "dynamo_lock_partition_key_value",
    "dynamo_lock_refresh_period_millis", "dynamo_lock_additional_time_to_wait_millis",
    "dynamo_lock_lease_duration", "aws_endpoint_url_dynamodb", "max_retries", "retry_timeout",
})  # fmt: skip
def commit_path(version: int) -> str:
    """The commit file of ``version``, relative to the table root."""
    return f"_delta_log/{version:020d}.json"


def log_store(table_uri: str, storage_options: Mapping[str, str] | None = None) -> ObjectStore:
    """The store rooted at the table (``file://`` URIs and plain paths are local directories).

    :raises FileNotFoundError: a local table root that does not exist.
    :raises MergeSpecError: Azure storage options the job's pyarrow readers could not use alike.
    """
    parts = urlsplit(table_uri)
    if not parts.scheme or parts.scheme == "file":
        root = os.path.abspath(unquote(parts.path) if parts.scheme else table_uri)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root} is not a directory")
        return LocalStore(prefix=root)
    check_azure_options(table_uri, storage_options)
    config, client = store_options(storage_options or {})
    try:
        # No client options given: obstore then keeps those object_store reads from the environment
        # (AWS_ALLOW_HTTP beside AWS_ENDPOINT_URL, as on a host configured by variables alone).
        return from_url(table_uri.rstrip("/"), config=config, client_options=client or None)  # type: ignore[call-overload, no-any-return]
    except (StoreError, ValueError) as exc:
        raise storage_failure(table_uri, "opening the table's store", exc, storage_options) from exc


def store_options(options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """deltalake-style storage options as obstore's (store config, HTTP client options)."""
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in options.items():
        name = key.lower()
        bare = name.split("_", 1)[1] if name.startswith(("aws_", "azure_", "google_")) else name
        if bare in _CLIENT_OPTIONS:
            client[bare] = value
        elif name not in _DELTALAKE_ONLY:
            config[name] = value
    return config, client


def read_commit(store: ObjectStore, version: int) -> list[dict[str, Any]] | None:
    """The actions of one commit file, or None when it does not exist."""
    try:
        raw = obstore.get(store, commit_path(version)).bytes()
    except (FileNotFoundError, NotFoundError):
        return None
    return [json.loads(line) for line in bytes(raw).decode("utf-8").splitlines() if line.strip()]


def latest_version(store: ObjectStore, known: int) -> int:
    """The latest committed version, at least ``known`` (which must exist)."""
    # Probing the next commit files is cheaper than listing the log or loading a snapshot.
    version = known
    while _exists(store, commit_path(version + 1)):
        version += 1
    return version


def write_commit(store: ObjectStore, version: int, actions: Sequence[Mapping[str, Any]]) -> bool:
    """Write ``actions`` as the commit file of ``version`` unless it exists; False when it already does."""
    body = "".join(json.dumps(action, separators=(",", ":")) + "\n" for action in actions).encode("utf-8")
    try:
        obstore.put(store, commit_path(version), body, mode="create")
    except (FileExistsError, AlreadyExistsError):
        return False
    return True


def _exists(store: ObjectStore, path: str) -> bool:
    try:
        obstore.head(store, path)
    except (FileNotFoundError, NotFoundError):
        return False
    return True
