"""Deletion vectors of live files: their descriptors, the row indexes they delete, and writing new ones.

PROTOCOL.md "Deletion Vectors" and its appendix "Deletion Vector Format". Libraries do the encodings:
pyroaring's ``BitMap64`` (CRoaring) writes and parses the 64-bit roaring "portable" format (bucket count,
then key + 32-bit portable bitmap per bucket) that Delta stores, and ``base64``'s base-85 arithmetic does
Z85, which differs from it only in the alphabet (mapped here by ``str.translate``). Written by hand, as
no library knows them, is Delta's own framing: the magic number before the bitmap, the DV file (format
version byte, then size, data and CRC32 per vector) and the descriptors. deltalake 1.6 neither writes
deletion vectors nor exposes their descriptors: ``delta_log`` replays the log for them.
"""

from __future__ import annotations

import base64
import re
import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import obstore
from obstore.exceptions import BaseError as StoreError
from obstore.exceptions import NotFoundError
from obstore.store import ObjectStore
from pyroaring import BitMap64

from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.storage.log_store import log_store
from spark_jobs.delta_merge.storage.storage_errors import storage_errors, storage_failure

__all__ = [
    "INLINE_LIMIT",
    "DeletionVector",
    "deleted_rows",
    "deserialize_row_indexes",
    "inline_deletion_vector",
    "serialize_row_indexes",
    "write_deletion_vectors",
    "z85_decode",
    "z85_encode",
]

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
# base64.b85encode's alphabet (RFC 1924), digit for digit.
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_B85_TO_Z85 = str.maketrans(_B85, _Z85)
_Z85_TO_B85 = str.maketrans(_Z85, _B85)
_Z85_TEXT = re.compile(f"[{re.escape(_Z85)}]*")
_MAGIC = 1681511377
_UUID_CHARS = 20  # a 16-byte UUID in Z85
# Delta reads a bucket key as a signed int32 and requires its top bit clear: row indexes below 2^63.
_ROW_INDEX_END = 1 << 63
_INT32_MAX = (1 << 31) - 1
_FILE_FORMAT_VERSION = 1
# Delta Spark's random prefixes are letters and digits; a prefix names one directory under the table root.
_PREFIX = re.compile(r"[A-Za-z0-9]*")

INLINE_LIMIT = 64
"""Vectors serializing to at most this many bytes go inline in the log (Z85: at most 80 characters,
about the length of a ``u`` descriptor's path and offset); larger ones go to the commit's DV file.
Delta's own writers put every persistent vector in a file: an inline vector is copied into each
checkpoint and parsed by every snapshot load, so only tiny ones (up to 16 scattered rows, or a few
runs, as a point update or delete leaves) are worth saving a file read for."""


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
    try:
        rows = list(deserialize_row_indexes(data))
    except ValueError as exc:
        raise MergeExecutionError(f"Deletion vector {vector.unique_id} is corrupt: {exc}") from exc
    if len(rows) != vector.cardinality:
        raise MergeExecutionError(
            f"Deletion vector {vector.unique_id} holds {len(rows)} rows, but its descriptor says "
            f"{vector.cardinality}: the vector or the log is corrupt."
        )
    return rows


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ RFC 32) as Delta writes it: ``data`` padded with zero bytes to a multiple of 4, since
    Z85 encodes whole 4-byte groups; the descriptor's ``sizeInBytes`` tells readers where the data ends."""
    return base64.b85encode(data, pad=True).decode("ascii").translate(_B85_TO_Z85)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 ``text`` (5 characters per 4 bytes), padding included.

    :raises MergeExecutionError: ``text`` is not Z85.
    """
    # Checked first: a character outside Z85 could map to a valid base-85 digit of the other alphabet.
    if len(text) % 5 or not _Z85_TEXT.fullmatch(text):
        raise MergeExecutionError(f"Not Z85 text (5 characters per 4 bytes, Z85's alphabet): {text!r}.")
    try:
        return base64.b85decode(text.translate(_Z85_TO_B85))
    except ValueError as exc:  # a group above 2^32 - 1
        raise MergeExecutionError(f"Not Z85 text: {text!r}: {exc}.") from exc


def _stored(
    store: ObjectStore, table_uri: str, vector: DeletionVector, storage_options: Mapping[str, str] | None
) -> bytes:
    if vector.storage_type == "u":
        path = _relative_path(vector.path_or_inline_dv)
        where = f"{table_uri}/{path}"
    else:
        # An absolute URI, percent-encoded as Delta writes it (Hadoop's Path.toUri): the store is opened
        # at its folder (log_store decodes that) and the file's name is decoded here.
        where = vector.path_or_inline_dv
        parts = urlsplit(where)
        parent, _, name = parts.path.rpartition("/")
        root = f"{parts.scheme}://{parts.netloc}{parent}" if parts.scheme else unquote(parent)
        store = log_store(root, storage_options)
        path = unquote(name)
    # No offset: the file's first vector, right after the version byte (this writer always gives one).
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


def serialize_row_indexes(rows: BitMap64 | Iterable[int]) -> bytes:
    """Row indexes in Delta's RoaringBitmapArray format: the little-endian int32 magic 1681511377, then
    the 64-bit roaring bitmap in the portable format (pyroaring's ``BitMap64.serialize``).

    :param rows: 0-based row indexes in file order, below 2^63 (Delta reads bucket keys signed).
    :raises ValueError: a row index out of that range.
    """
    return struct.pack("<i", _MAGIC) + _row_bitmap(rows).serialize()


def deserialize_row_indexes(data: bytes) -> BitMap64:
    """The row indexes of a RoaringBitmapArray (:func:`serialize_row_indexes`'s output, or Delta's).

    Bytes after the bitmap are ignored, as Delta's and delta-kernel's readers do: the descriptor's
    cardinality and, in a DV file, the CRC32 are the checks on the whole vector.

    :raises ValueError: no magic number, a malformed bitmap or a row index of 2^63 or more.
    """
    if len(data) < 4 or struct.unpack_from("<i", data)[0] != _MAGIC:
        raise ValueError("no RoaringBitmapArray magic number")
    bitmap = BitMap64.deserialize(bytes(data[4:]))
    if bitmap and bitmap.max() >= _ROW_INDEX_END:
        raise ValueError(f"row index {bitmap.max()} is 2^63 or more")
    return bitmap


def _row_bitmap(rows: BitMap64 | Iterable[int]) -> BitMap64:
    """``rows`` as a new bitmap (the caller's is left alone), run-length encoded where that is smaller:
    merges often delete runs of neighbouring rows."""
    try:
        bitmap = rows.copy() if isinstance(rows, BitMap64) else BitMap64(rows)
    except OverflowError as exc:  # pyroaring's error for a negative or 64-bit-overflowing value
        raise ValueError(f"A row index is out of range [0, 2^63): {exc}") from exc
    if bitmap and bitmap.max() >= _ROW_INDEX_END:
        raise ValueError(f"Row index {bitmap.max()} is out of range [0, 2^63).")
    bitmap.run_optimize()
    return bitmap


def inline_deletion_vector(rows: BitMap64 | Iterable[int]) -> DeletionVector:
    """A vector stored in the log itself (``storageType`` ``i``): Z85 of the serialized ``rows``.

    :raises ValueError: ``rows`` is empty (a file without deleted rows takes no vector) or out of range.
    """
    bitmap = _nonempty(_row_bitmap(rows))
    data = serialize_row_indexes(bitmap)
    # sizeInBytes is the data's size before Z85's padding to a multiple of 4 (PROTOCOL.md).
    return DeletionVector("i", z85_encode(data), size_in_bytes=len(data), cardinality=len(bitmap))


def write_deletion_vectors(
    table_uri: str,
    storage_options: Mapping[str, str] | None,
    vectors: Mapping[str, BitMap64 | Iterable[int]],
    *,
    inline_limit: int = INLINE_LIMIT,
    prefix: str = "",
) -> dict[str, DeletionVector]:
    """Store the deletion vectors of one commit and return their descriptors, keyed as ``vectors``.

    Vectors serializing to at most ``inline_limit`` bytes go inline; the others go to one new file,
    ``<prefix>/deletion_vector_<uuid>.bin`` under the table root, written completely (one create-only
    PUT) before this returns, so a commit made afterwards never references a partial file. A commit
    that fails leaves the file unreferenced, for VACUUM to remove like any orphaned data file.

    :param vectors: deleted row indexes (0-based, in file order) by any key, e.g. the data file's path.
    :param inline_limit: 0 puts every vector in the file.
    :param prefix: a directory of letters and digits for the file (Delta's random file prefixes); the
        table root when empty.
    :raises ValueError: an empty vector, a row index out of [0, 2^63) or a prefix of other characters.
    :raises TableStorageError: the store refused or failed the write.
    """
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"A deletion vector file prefix takes letters and digits only, not {prefix!r}.")
    descriptors: dict[str, DeletionVector] = {}
    blob = bytearray([_FILE_FORMAT_VERSION])
    dv_id = uuid.uuid4()
    path_or_inline_dv = prefix + z85_encode(dv_id.bytes)
    for key, rows in vectors.items():
        bitmap = _nonempty(_row_bitmap(rows), key)
        data = serialize_row_indexes(bitmap)
        if len(data) <= inline_limit:
            descriptors[key] = inline_deletion_vector(bitmap)
            continue
        # offset is where the vector's size field starts (the first one right after the version
        # byte), as Delta's and delta-kernel's readers seek to it; sizeInBytes counts the data alone.
        offset = len(blob)
        if offset > _INT32_MAX or len(data) > _INT32_MAX:
            raise ValueError("Deletion vectors past 2 GiB in one file: descriptors count bytes in int32.")
        blob += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        descriptors[key] = DeletionVector(
            "u", path_or_inline_dv, size_in_bytes=len(data), cardinality=len(bitmap), offset=offset
        )
    if len(blob) > 1:
        path = _relative_path(path_or_inline_dv)
        with storage_errors(table_uri, f"writing deletion vector file {path}", storage_options):
            # mode="create": a single PUT that either stores the whole file or nothing, never replacing one.
            obstore.put(log_store(table_uri, storage_options), path, bytes(blob), mode="create")
    return descriptors


def _relative_path(path_or_inline_dv: str) -> str:
    """A ``u`` vector's file under the table root: ``<prefix>/deletion_vector_<uuid>.bin`` (PROTOCOL.md's
    derived ``absolutePath``), the UUID being the last 20 characters, in Z85."""
    prefix, encoded = path_or_inline_dv[:-_UUID_CHARS], path_or_inline_dv[-_UUID_CHARS:]
    dv_id = uuid.UUID(bytes=z85_decode(encoded))
    return (f"{prefix}/" if prefix else "") + f"deletion_vector_{dv_id}.bin"


def _nonempty(bitmap: BitMap64, key: str | None = None) -> BitMap64:
    if not bitmap:
        which = "" if key is None else f" for {key!r}"
        raise ValueError(f"An empty deletion vector{which}: a file without deleted rows takes no vector.")
    return bitmap
