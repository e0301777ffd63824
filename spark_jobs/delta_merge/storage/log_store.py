"""A table's ``_delta_log`` through object_store (obstore): read commits, probe versions, write put-if-absent.

One code path for local disk and object stores. A commit file is written with ``mode="create"``: an
exclusive create on local disk, a conditional PUT on S3, GCS and Azure. Whoever writes version ``v`` first
wins; the loser learns it from the store, never by renaming over a file (PROTOCOL.md, "Delta Log Entries").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError, PermissionDeniedError, UnauthenticatedError
from obstore.exceptions import BaseError as StoreError
from obstore.store import LocalStore, ObjectStore, from_url

from spark_jobs.delta_merge.errors import TableStorageError
from spark_jobs.delta_merge.storage.azure_options import AZURE_SCHEMES, check_azure_options
from spark_jobs.delta_merge.storage.storage_secrets import is_secret_option

__all__ = [
    "commit_path",
    "is_secret_option",
    "latest_version",
    "log_store",
    "read_commit",
    "redacted",
    "storage_errors",
    "storage_failure",
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
# Words of option keys whose values must never reach a message or a log record. Azure's account key also
# goes by access_key and master_key (object_store's aliases); AWS's access_key_id is not a secret.
# A SAS token's signature wherever a request URL shows it: object_store redacts its URLs, but pyarrow's
# Azure errors may quote them, with the token re-encoded, so the option's value may not appear verbatim.
_SAS_SIGNATURE = re.compile(r"(?i)\b(sig=)[^&\s\"'<>]+")


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
    config, client = _split_options(storage_options or {})
    try:
        # No client options given: obstore then keeps those object_store reads from the environment
        # (AWS_ALLOW_HTTP beside AWS_ENDPOINT_URL, as on a host configured by variables alone).
        return from_url(table_uri.rstrip("/"), config=config, client_options=client or None)  # type: ignore[call-overload, no-any-return]
    except (StoreError, ValueError) as exc:
        raise storage_failure(table_uri, "opening the table's store", exc, storage_options) from exc


def _split_options(options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
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


def redacted(text: str, storage_options: Mapping[str, str] | None) -> str:
    """``text`` with the values of secret storage options (keys, tokens, passwords) masked, also
    percent-encoded, and any SAS signature (``sig=...``) masked whatever options are given."""
    for key, value in (storage_options or {}).items():
        if value and len(value) >= 4 and is_secret_option(key):
            for form in {value, quote(value, safe=""), quote(value, safe="/=&")}:
                text = text.replace(form, "***")
    return _SAS_SIGNATURE.sub(r"\1***", text)


def storage_failure(
    table_uri: str,
    operation: str,
    exc: BaseException,
    storage_options: Mapping[str, str] | None,
    *,
    note: str = "",
) -> TableStorageError:
    """The job's error for a failed request to the table's store, naming the table, the operation, what
    to check and the cause (secrets masked).

    :param operation: what failed, e.g. ``"reading the Delta log"``.
    :param note: a sentence to end the message with.
    """
    azure = urlsplit(table_uri).scheme.lower() in AZURE_SCHEMES
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError, PermissionError)):
        check = (
            "the account name and the account key or SAS token in storage_options, and that they may "
            "access the container" if azure else
            "the access key and secret key in storage_options, and that the key may access the table"
        )  # fmt: skip
    elif isinstance(exc, (FileNotFoundError, NotFoundError)):
        check = "that the bucket (or container) and the table path exist"
    elif azure:
        check = (
            "the endpoint, account name and credentials in storage_options (account key or SAS token), "
            "that the container exists and that the credentials may access the table"
        )
    else:
        check = (
            "the endpoint, region and credentials in storage_options, that the bucket exists and that the "
            "key may access the table"
        )
    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = f"{operation[:1].upper()}{operation[1:]} of table {table_uri} failed. Check {check}. Cause: "
    text += f"{type(exc).__name__}: {cause}" + (f" {note}" if note else "")
    return TableStorageError(redacted(text, storage_options))


@contextmanager
def storage_errors(
    table_uri: str, operation: str, storage_options: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Turn the store's errors (obstore's, OSError) inside the block into :class:`TableStorageError`."""
    try:
        yield
    except (StoreError, OSError) as exc:
        raise storage_failure(table_uri, operation, exc, storage_options) from exc


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
