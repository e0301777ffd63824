"""Deletion vectors of live files: their descriptors from the log and the row indexes they delete.

PROTOCOL.md "Deletion Vectors". The 32-bit roaring bitmaps are pyroaring's (portable format); written by
hand here are Z85 decoding (``base64`` has none; PyPI's ``z85`` 0.0.2 and ``z85-codec`` 0.1.0 are
single early releases, not worth a dependency for ten lines), the
RoaringBitmapArray framing (magic, count, key + bitmap pairs), the DV file framing (size, data, CRC32)
and the replay of the log for descriptors, which deltalake 1.6 does not expose.
"""

from __future__ import annotations

import io
import json
import re
import struct
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from obstore.store import ObjectStore
from pyroaring import BitMap

from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.log_store import commit_path, log_store

__all__ = ["DeletionVector", "deleted_rows", "log_deletion_vectors"]

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_MAGIC = 1681511377
_UUID_CHARS = 20  # a 16-byte UUID in Z85
_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?(?:\.[0-9a-fA-F-]{36})?\.(parquet|json)$"
)


@dataclass(frozen=True)
class DeletionVector:
    """A ``deletionVector`` descriptor: ``u`` (file by UUID), ``i`` (inline) or ``p`` (absolute path)."""

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @property
    def unique_id(self) -> str:
        """Delta's DV id: with the path, it identifies a file's version (conflict checks)."""
        at = "" if self.offset is None else f"@{self.offset}"
        return f"{self.storage_type}{self.path_or_inline_dv}{at}"

    def to_action(self) -> dict[str, Any]:
        """The descriptor as the log spells it."""
        action: dict[str, Any] = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline_dv}
        if self.offset is not None:
            action["offset"] = self.offset
        action.update(sizeInBytes=self.size_in_bytes, cardinality=self.cardinality)
        return action

    @classmethod
    def from_action(cls, action: Mapping[str, Any]) -> DeletionVector:
        offset = action.get("offset")
        return cls(
            storage_type=str(action["storageType"]), path_or_inline_dv=str(action["pathOrInlineDv"]),
            size_in_bytes=int(action["sizeInBytes"]), cardinality=int(action["cardinality"]),
            offset=None if offset is None else int(offset),
        )  # fmt: skip


def log_deletion_vectors(store: ObjectStore, version: int) -> dict[str, DeletionVector]:
    """``add.path`` -> descriptor for every live file with a deletion vector at ``version``.

    Replays the newest complete checkpoint at or before ``version`` (classic, multi-part or V2 with
    sidecars) and the JSON commits after it.
    """
    start, live = _checkpoint_files(store, version)
    for v in range(start + 1, version + 1):
        for action in _json_lines(_get(store, commit_path(v))):
            if "remove" in action:
                live.pop(action["remove"]["path"], None)
            elif "add" in action:
                live[action["add"]["path"]] = action["add"].get("deletionVector")
    return {path: DeletionVector.from_action(dv) for path, dv in live.items() if dv}


def deleted_rows(store: ObjectStore, table_uri: str, vector: DeletionVector) -> list[int]:
    """The row indexes (0-based, in file order) ``vector`` deletes, sorted.

    :param store: the store rooted at the table (see :func:`log_store`), for ``u`` vectors.
    :raises MergeExecutionError: the vector's file is missing, or its data is corrupt.
    """
    if vector.storage_type == "i":
        data = z85_decode(vector.path_or_inline_dv)[: vector.size_in_bytes]
    elif vector.storage_type in ("u", "p"):
        data = _stored(store, table_uri, vector)
    else:
        raise MergeExecutionError(f"Unknown deletion vector storage type {vector.storage_type!r}.")
    rows = _bitmap_array(data, vector)
    if len(rows) != vector.cardinality:
        raise MergeExecutionError(
            f"Deletion vector {vector.unique_id} holds {len(rows)} rows, but its descriptor says "
            f"{vector.cardinality}: the vector or the log is corrupt."
        )
    return rows


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ RFC 32) as Delta uses it: 5 characters per 4 bytes, padded to a multiple of 4."""
    if len(text) % 5:
        raise MergeExecutionError(f"Z85 text of length {len(text)} is not a multiple of 5: {text!r}.")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for char in text[i : i + 5]:
            value = value * 85 + _Z85_VALUE[char]
        out += struct.pack(">I", value)
    return bytes(out)


def _stored(store: ObjectStore, table_uri: str, vector: DeletionVector) -> bytes:
    if vector.storage_type == "u":
        encoded = vector.path_or_inline_dv
        prefix, dv_id = encoded[:-_UUID_CHARS], uuid.UUID(bytes=z85_decode(encoded[-_UUID_CHARS:]))
        path = (f"{prefix}/" if prefix else "") + f"deletion_vector_{dv_id}.bin"
        where = f"{table_uri}/{path}"
    else:
        where = vector.path_or_inline_dv
        parts = urlsplit(where)
        parent, _, name = parts.path.rpartition("/")
        store = log_store(f"{parts.scheme}://{parts.netloc}{parent}" if parts.scheme else parent)
        path = name
    offset = 1 if vector.offset is None else vector.offset
    try:
        raw = bytes(obstore.get_range(store, path, start=offset, length=vector.size_in_bytes + 8))
    except (FileNotFoundError, OSError) as exc:
        raise MergeExecutionError(
            f"Cannot read deletion vector file {where}: {exc}. A live file's deletion vector is missing; "
            "check that VACUUM did not remove it."
        ) from exc
    (size,) = struct.unpack(">i", raw[:4])
    data = raw[4 : 4 + vector.size_in_bytes]
    (checksum,) = struct.unpack(">I", raw[4 + vector.size_in_bytes : 8 + vector.size_in_bytes])
    if size != vector.size_in_bytes or zlib.crc32(data) != checksum:
        raise MergeExecutionError(f"Deletion vector at {where} offset {offset} is corrupt (size or CRC32).")
    return data


def _bitmap_array(data: bytes, vector: DeletionVector) -> list[int]:
    """A RoaringBitmapArray (portable format): int32 magic, int64 count, then int32 key + bitmap each."""
    if len(data) < 12 or struct.unpack_from("<i", data)[0] != _MAGIC:
        raise MergeExecutionError(f"Deletion vector {vector.unique_id} lacks the RoaringBitmapArray magic.")
    (count,) = struct.unpack_from("<q", data, 4)
    pos, rows = 12, []
    for _ in range(count):
        (key,) = struct.unpack_from("<i", data, pos)
        bitmap = BitMap.deserialize(data[pos + 4 :])
        pos += 4 + len(bitmap.serialize())
        rows += [(key << 32) | low for low in bitmap]
    if pos != len(data):
        raise MergeExecutionError(f"Deletion vector {vector.unique_id} has {len(data) - pos} bytes too many.")
    return rows


def _checkpoint_files(store: ObjectStore, version: int) -> tuple[int, dict[str, Any]]:
    """(checkpoint version, path -> deletionVector of its adds), or (-1, {}) without a checkpoint."""
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
                live: dict[str, Any] = {}
                for path in sorted(paths):
                    for add in _checkpoint_adds(store, path):
                        live[add["path"]] = add.get("deletionVector")
                return v, live
    return -1, {}


def _checkpoint_adds(store: ObjectStore, path: str) -> Iterator[Mapping[str, Any]]:
    raw = _get(store, path)
    if path.endswith(".json"):
        actions = list(_json_lines(raw))
    else:
        table = pq.read_table(pa.BufferReader(raw))
        names = [n for n in ("add", "sidecar") if n in table.column_names]
        actions = [{k: v for k, v in row.items() if v} for row in table.select(names).to_pylist()]
    for action in actions:
        if action.get("add"):
            yield action["add"]
        elif action.get("sidecar"):
            yield from _checkpoint_adds(store, f"_delta_log/_sidecars/{action['sidecar']['path']}")


def _get(store: ObjectStore, path: str) -> bytes:
    return bytes(obstore.get(store, path).bytes())


def _json_lines(raw: bytes) -> Iterator[dict[str, Any]]:
    for line in io.StringIO(raw.decode("utf-8")):
        if line.strip():
            yield json.loads(line)
