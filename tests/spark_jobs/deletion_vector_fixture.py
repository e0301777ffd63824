"""Write deletion vectors into a deltalake-made table by hand (the inverse of the job's reader).

deltalake cannot write deletion vectors, so a test table gets them from a commit written here per
PROTOCOL.md "Deletion Vectors": protocol 3/7 with the ``deletionVectors`` feature, and each chosen file's
``add`` replaced by remove + add carrying a ``deletionVector`` descriptor (``u`` file or ``i`` inline).
"""

from __future__ import annotations

import json
import struct
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pyroaring import BitMap

from tests.spark_jobs.table_feature_fixtures import replay

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_MAGIC = 1681511377


def z85_encode(data: bytes) -> str:
    padded = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(padded), 4):
        (value,) = struct.unpack(">I", padded[i : i + 4])
        chars = []
        for _ in range(5):
            value, rem = divmod(value, 85)
            chars.append(_Z85[rem])
        out.append("".join(reversed(chars)))
    return "".join(out)


def bitmap_array(rows: Iterable[int]) -> bytes:
    """A RoaringBitmapArray in Delta's portable format: magic, bitmap count, (key, bitmap) pairs."""
    by_key: dict[int, BitMap] = {}
    for row in rows:
        by_key.setdefault(row >> 32, BitMap()).add(row & 0xFFFFFFFF)
    count = max(by_key, default=-1) + 1
    body = struct.pack("<iq", _MAGIC, count)
    for key in range(count):
        body += struct.pack("<i", key) + by_key.get(key, BitMap()).serialize()
    return body


def add_deletion_vectors(
    table: Path, vectors: Mapping[str, tuple[list[int], str]], *, prefix: str = ""
) -> list[dict[str, Any]]:
    """Commit the next version giving each file of ``vectors`` (add.path -> (rows, "u" or "i")) a vector.

    :returns: the descriptors written, in the order of ``vectors``.
    """
    version, adds, metadata, protocol, _ = replay(table)
    config = {**metadata["configuration"], "delta.enableDeletionVectors": "true"}
    metadata = {**metadata, "configuration": config}
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "DELETE"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": sorted({"deletionVectors", *protocol.get("readerFeatures", [])}),
                      "writerFeatures": sorted({"deletionVectors", *protocol.get("writerFeatures", [])})}},
        {"metaData": metadata},
    ]  # fmt: skip
    descriptors = []
    for path, (rows, storage) in vectors.items():
        data = bitmap_array(rows)
        if storage == "i":
            descriptor = {"storageType": "i", "pathOrInlineDv": z85_encode(data), "sizeInBytes": len(data),
                          "cardinality": len(set(rows))}  # fmt: skip
        else:
            dv_id = uuid.uuid4()
            name = f"deletion_vector_{dv_id}.bin"
            (table / prefix).mkdir(parents=True, exist_ok=True)
            blob = b"\x01" + struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
            (table / prefix / name).write_bytes(blob)
            descriptor = {"storageType": "u", "pathOrInlineDv": prefix + z85_encode(dv_id.bytes), "offset": 1,
                          "sizeInBytes": len(data), "cardinality": len(set(rows))}  # fmt: skip
        add = adds[path]
        actions.append({"remove": {"path": path, "deletionTimestamp": now, "dataChange": True,
                                   "extendedFileMetadata": True, "partitionValues": add["partitionValues"],
                                   "size": add["size"]}})  # fmt: skip
        actions.append({"add": {**add, "dataChange": True, "deletionVector": descriptor}})
        descriptors.append(descriptor)
    body = "".join(json.dumps(a) + "\n" for a in actions)
    (table / "_delta_log" / f"{version + 1:020d}.json").write_text(body)
    return descriptors
