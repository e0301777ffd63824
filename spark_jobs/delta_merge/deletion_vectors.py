"""Deletion vectors of live files: their descriptors and the row indexes they delete.

PROTOCOL.md "Deletion Vectors". The 32-bit roaring bitmaps are pyroaring's (portable format); written by
hand here are Z85 decoding (``base64`` has none; PyPI's ``z85`` 0.0.2 and ``z85-codec`` 0.1.0 are
single early releases, not worth a dependency for ten lines), the
RoaringBitmapArray framing (magic, count, key + bitmap pairs) and the DV file framing (size, data, CRC32).
deltalake 1.6 does not expose the descriptors: ``delta_log`` replays the log for them.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import BaseError as StoreError
from obstore.exceptions import NotFoundError
from obstore.store import ObjectStore
from pyroaring import BitMap

from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.log_store import log_store, storage_failure

__all__ = ["DeletionVector", "deleted_rows", "z85_decode"]

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_MAGIC = 1681511377
_UUID_CHARS = 20  # a 16-byte UUID in Z85


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


# Decoded vectors by (table, vector id, size), oldest first; bounded so a long-lived driver stays small.
_DECODED: dict[tuple[str, str, int], tuple[int, ...]] = {}
_DECODED_MAX = 4096


def deleted_rows(
    store: ObjectStore,
    table_uri: str,
    vector: DeletionVector,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> list[int]:
    """The row indexes (0-based, in file order) ``vector`` deletes, sorted.

    :param store: the store rooted at the table (see :func:`log_store`), for ``u`` vectors.
    :param storage_options: how to reach the store of a ``p`` vector (an absolute path).
    :raises MergeExecutionError: the vector's file is missing, or its data is corrupt.
    :raises TableStorageError: the store refused or failed the read.
    """
    # A merge reads the same files twice (finding touched files, then rewriting them); a stored vector
    # never changes (a new vector is a new file or offset), so it is decoded once.
    key = (table_uri, vector.unique_id, vector.size_in_bytes)
    cached = _DECODED.get(key)
    if cached is not None:
        return list(cached)
    rows = _decode(store, table_uri, vector, storage_options)
    if len(_DECODED) >= _DECODED_MAX:
        _DECODED.pop(next(iter(_DECODED)))
    _DECODED[key] = tuple(rows)
    return rows


def _decode(
    store: ObjectStore, table_uri: str, vector: DeletionVector, storage_options: Mapping[str, str] | None
) -> list[int]:
    if vector.storage_type == "i":
        data = z85_decode(vector.path_or_inline_dv)[: vector.size_in_bytes]
    elif vector.storage_type in ("u", "p"):
        data = _stored(store, table_uri, vector, storage_options)
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


def _stored(
    store: ObjectStore, table_uri: str, vector: DeletionVector, storage_options: Mapping[str, str] | None
) -> bytes:
    if vector.storage_type == "u":
        encoded = vector.path_or_inline_dv
        prefix, dv_id = encoded[:-_UUID_CHARS], uuid.UUID(bytes=z85_decode(encoded[-_UUID_CHARS:]))
        path = (f"{prefix}/" if prefix else "") + f"deletion_vector_{dv_id}.bin"
        where = f"{table_uri}/{path}"
    else:
        where = vector.path_or_inline_dv
        parts = urlsplit(where)
        parent, _, name = parts.path.rpartition("/")
        root = f"{parts.scheme}://{parts.netloc}{parent}" if parts.scheme else parent
        store = log_store(root, storage_options)
        path = name
    offset = 1 if vector.offset is None else vector.offset
    try:
        raw = bytes(obstore.get_range(store, path, start=offset, length=vector.size_in_bytes + 8))
    except (FileNotFoundError, NotFoundError) as exc:
        raise MergeExecutionError(
            f"Cannot read deletion vector file {where}: {exc}. A live file's deletion vector is missing; "
            "check that VACUUM did not remove it."
        ) from exc
    except (OSError, StoreError) as exc:
        operation = f"reading deletion vector file {path}"
        raise storage_failure(table_uri, operation, exc, storage_options) from exc
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
