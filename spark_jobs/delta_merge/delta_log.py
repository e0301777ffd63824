"""Replay the Delta log for what deltalake 1.6 does not expose: add fields, domain metadata, in-commit time.

``get_add_actions`` leaves out ``deletionVector``, ``baseRowId`` and ``defaultRowCommitVersion``, and
the Python API has no domain metadata; both are read here from the newest complete checkpoint at or
before a version (classic, multi-part, or V2 with sidecars) and the JSON commits after it.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from obstore.exceptions import NotFoundError
from obstore.store import ObjectStore

from spark_jobs.delta_merge.deletion_vectors import DeletionVector
from spark_jobs.delta_merge.log_store import commit_path

__all__ = ["AddFields", "LogState", "replay_log"]

_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?(?:\.[0-9a-fA-F-]{36})?\.(parquet|json)$"
)
_CHECKPOINT_COLUMNS = ("add", "sidecar", "domainMetadata")


@dataclass(frozen=True)
class AddFields:
    """The fields of a live file's last ``add`` that deltalake does not expose."""

    deletion_vector: DeletionVector | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None

    @classmethod
    def from_action(cls, add: Mapping[str, Any]) -> AddFields:
        vector, base = add.get("deletionVector"), add.get("baseRowId")
        version = add.get("defaultRowCommitVersion")
        return cls(
            deletion_vector=DeletionVector.from_action(vector) if vector else None,
            base_row_id=None if base is None else int(base),
            default_row_commit_version=None if version is None else int(version),
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

    :param store: the store rooted at the table (see :func:`~spark_jobs.delta_merge.log_store.log_store`).
    """
    start, actions = _checkpoint_actions(store, version)
    adds: dict[str, Mapping[str, Any]] = {}
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
        files={path: AddFields.from_action(add) for path, add in adds.items()},
        domains=domains,
        in_commit_timestamp=None if timestamp is None else int(timestamp),
    )


def _apply(
    actions: list[dict[str, Any]], adds: dict[str, Mapping[str, Any]], domains: dict[str, str]
) -> None:
    for action in actions:
        if action.get("remove"):
            adds.pop(action["remove"]["path"], None)
        elif action.get("add"):
            adds[action["add"]["path"]] = action["add"]
        elif action.get("domainMetadata"):
            domain = action["domainMetadata"]
            if domain.get("removed"):
                domains.pop(domain["domain"], None)
            else:
                domains[domain["domain"]] = str(domain["configuration"])


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
