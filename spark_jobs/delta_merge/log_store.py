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
from obstore.store import LocalStore, ObjectStore, from_url

__all__ = ["commit_path", "latest_version", "log_store", "read_commit", "write_commit"]


def commit_path(version: int) -> str:
    """The commit file of ``version``, relative to the table root."""
    return f"_delta_log/{version:020d}.json"


def log_store(table_uri: str, storage_options: Mapping[str, str] | None = None) -> ObjectStore:
    """The store rooted at the table (``file://`` URIs and plain paths are local directories).

    :raises FileNotFoundError: a local table root that does not exist.
    """
    parts = urlsplit(table_uri)
    if not parts.scheme or parts.scheme == "file":
        root = os.path.abspath(unquote(parts.path) if parts.scheme else table_uri)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{root} is not a directory")
        return LocalStore(prefix=root)
    return from_url(table_uri.rstrip("/"), config=dict(storage_options or {}))  # type: ignore[call-overload, no-any-return]


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
