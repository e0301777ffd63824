"""The job writes deletion vectors as PROTOCOL.md "Deletion Vectors" specifies, and Delta readers agree.

Round trips go through the job's own reader; the bytes are checked against the spec's layout (built here
from pyroaring's 32-bit bitmaps and ``struct``); and tables given vectors by the writer are read back by
deltalake and by DuckDB's Delta extension (delta-kernel), which must leave out exactly the marked rows.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyroaring import BitMap, BitMap64

from spark_jobs.delta_merge.errors import MergeExecutionError, TableStorageError
from spark_jobs.delta_merge.protocol.deletion_vectors import (
    INLINE_LIMIT,
    DeletionVector,
    deleted_rows,
    deserialize_row_indexes,
    inline_deletion_vector,
    serialize_row_indexes,
    write_deletion_vectors,
    z85_decode,
    z85_encode,
)
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from spark_jobs.delta_merge.storage.log_store import log_store
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.delta_reader import read_rows, read_rows_with_kernel

MAGIC = struct.pack("<i", 1681511377)
HIGH = 1 << 32  # the first row index of the second bucket

ROW_SETS = {
    "one row": [0],
    "small": [1, 3, 7, 11],
    "run": list(range(100, 200_000)),
    "dense": list(range(0, 150_000, 2)),  # bitset containers
    "sparse": [5, 65_536 * 7 + 1, 10**9, HIGH - 1],
    "high keys": [3, HIGH, 2 * HIGH + 5, 7 * HIGH + 9, (1 << 62) + 1, (1 << 63) - 1],
}


def spec_layout(rows: Iterable[int]) -> bytes:
    """PROTOCOL.md's RoaringBitmapArray, built bucket by bucket: magic, bucket count, (key, 32-bit bitmap)."""
    buckets: dict[int, BitMap] = {}
    for row in rows:
        buckets.setdefault(row >> 32, BitMap()).add(row & 0xFFFFFFFF)
    body = MAGIC + struct.pack("<Q", len(buckets))
    for key in sorted(buckets):
        bitmap = buckets[key]
        bitmap.run_optimize()
        body += struct.pack("<I", key) + bitmap.serialize()
    return body


@pytest.mark.parametrize("name", list(ROW_SETS))
def test_row_indexes_round_trip_in_the_spec_layout(name: str) -> None:
    rows = ROW_SETS[name]
    data = serialize_row_indexes(rows)
    assert data == spec_layout(rows)
    assert serialize_row_indexes(BitMap64(rows)) == data
    assert list(deserialize_row_indexes(data)) == rows


def test_no_rows_serialize_to_an_empty_bitmap() -> None:
    assert serialize_row_indexes([]) == MAGIC + struct.pack("<Q", 0)
    assert list(deserialize_row_indexes(serialize_row_indexes(BitMap64()))) == []


def test_the_callers_bitmap_is_left_alone() -> None:
    bitmap = BitMap64(range(1000))
    before = bitmap.serialize()
    serialize_row_indexes(bitmap)
    assert bitmap.serialize() == before


@pytest.mark.parametrize("rows", [[-1], [1 << 63], [1 << 64]])
def test_row_indexes_out_of_range_are_refused(rows: list[int]) -> None:
    with pytest.raises(ValueError, match=r"out of range \[0, 2\^63\)"):
        serialize_row_indexes(rows)


def test_deserializing_reads_delta_sparks_empty_buckets_and_refuses_garbage() -> None:
    # Delta Spark writes a bucket for every key up to the highest, empty ones included.
    dense = MAGIC + struct.pack("<Q", 3)
    for key, low in ((0, [1]), (1, []), (2, [5])):
        dense += struct.pack("<I", key) + BitMap(low).serialize()
    assert list(deserialize_row_indexes(dense)) == [1, 2 * HIGH + 5]
    with pytest.raises(ValueError, match="magic"):
        deserialize_row_indexes(b"\0" * 12)
    with pytest.raises(ValueError, match="Could not deserialize"):  # pyroaring's word for a truncated bitmap
        deserialize_row_indexes(serialize_row_indexes([1, 2, 3])[:-3])


def test_z85_rfc_vector_protocol_example_and_padding() -> None:
    assert z85_encode(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"
    # PROTOCOL.md, "JSON Example 1": prefix "ab", then the file's UUID in Z85.
    dv_id = uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61")
    assert z85_encode(dv_id.bytes) == "^-aqEH.-t@S}K{vb[*k^"
    assert z85_decode("^-aqEH.-t@S}K{vb[*k^") == dv_id.bytes
    for size in range(9):
        data = bytes(range(7, 7 + size))
        text = z85_encode(data)
        assert len(text) == -(-size // 4) * 5  # padded to whole 4-byte groups
        assert z85_decode(text) == data + b"\0" * (-size % 4)


@pytest.mark.parametrize("text", ["abcd", "abcd_", "abcd\u00e9", "#####"])
def test_z85_decoding_refuses_what_is_not_z85(text: str) -> None:
    with pytest.raises(MergeExecutionError, match="Z85"):
        z85_decode(text)


def test_an_inline_vector_keeps_its_unpadded_size(tmp_path: Path) -> None:
    vector = inline_deletion_vector([1])
    data = serialize_row_indexes([1])
    assert len(data) % 4  # so Z85's padding is exercised
    assert vector == DeletionVector("i", z85_encode(data), size_in_bytes=len(data), cardinality=1)
    assert z85_decode(vector.path_or_inline_dv)[: len(data)] == data
    assert deleted_rows(log_store(str(tmp_path)), str(tmp_path), vector) == [1]


def dv_files(root: Path) -> list[Path]:
    return sorted(root.rglob("deletion_vector_*.bin"))


def test_one_commits_vectors_share_one_file_with_crcs_and_offsets(tmp_path: Path) -> None:
    vectors = {name: ROW_SETS[name] for name in ("one row", "run", "dense", "high keys")}
    descriptors = write_deletion_vectors(str(tmp_path), None, vectors)
    assert list(descriptors) == list(vectors)
    assert descriptors["one row"].storage_type == "i"  # 34 bytes, under INLINE_LIMIT
    (file,) = dv_files(tmp_path)
    assert file.parent == tmp_path
    blob = file.read_bytes()
    assert blob[0] == 1  # the format version
    position = 1
    in_file = [name for name in vectors if name != "one row"]
    for name in in_file:
        vector = descriptors[name]
        data = serialize_row_indexes(vectors[name])
        assert vector.storage_type == "u"
        assert file.name == f"deletion_vector_{uuid.UUID(bytes=z85_decode(vector.path_or_inline_dv))}.bin"
        assert (vector.offset, vector.size_in_bytes, vector.cardinality) == (
            position, len(data), len(vectors[name]),
        )  # fmt: skip
        (size,) = struct.unpack_from(">i", blob, position)
        (checksum,) = struct.unpack_from(">I", blob, position + 4 + size)
        assert (size, blob[position + 4 : position + 4 + size]) == (len(data), data)
        assert checksum == zlib.crc32(data)
        position += 4 + size + 4
    assert position == len(blob)
    store = log_store(str(tmp_path))
    for name, rows in vectors.items():
        assert deleted_rows(store, str(tmp_path), descriptors[name]) == rows


def test_the_inline_limit_is_inclusive_and_zero_puts_every_vector_in_the_file(tmp_path: Path) -> None:
    rows = ROW_SETS["small"]
    size = len(serialize_row_indexes(rows))
    assert size <= INLINE_LIMIT
    inline = write_deletion_vectors(str(tmp_path), None, {"f": rows}, inline_limit=size)["f"]
    assert inline == inline_deletion_vector(rows)
    assert dv_files(tmp_path) == []  # nothing to store: no file
    vector = write_deletion_vectors(str(tmp_path), None, {"f": rows}, inline_limit=size - 1)["f"]
    assert vector.storage_type == "u"
    assert deleted_rows(log_store(str(tmp_path)), str(tmp_path), vector) == rows
    assert write_deletion_vectors(str(tmp_path), None, {"f": [0]}, inline_limit=0)["f"].storage_type == "u"
    assert len(dv_files(tmp_path)) == 2  # a file per call, never one rewritten


def test_a_prefix_puts_the_file_in_that_directory(tmp_path: Path) -> None:
    vector = write_deletion_vectors(str(tmp_path), None, {"f": ROW_SETS["run"]}, prefix="k7")["f"]
    (file,) = dv_files(tmp_path)
    assert file.parent == tmp_path / "k7"
    assert vector.path_or_inline_dv[:2] == "k7"
    assert len(vector.path_or_inline_dv) == 2 + 20  # the prefix, then the UUID in Z85
    assert deleted_rows(log_store(str(tmp_path)), str(tmp_path), vector) == ROW_SETS["run"]


@pytest.mark.parametrize(
    ("vectors", "prefix", "message"),
    [({"f": [1], "g": []}, "", "empty deletion vector for 'g'"), ({"f": [1]}, "a/b", "letters and digits")],
)
def test_bad_requests_are_refused_before_anything_is_written(
    tmp_path: Path, vectors: dict[str, list[int]], prefix: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_deletion_vectors(str(tmp_path), None, vectors, inline_limit=0, prefix=prefix)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_is_a_table_storage_error(tmp_path: Path) -> None:
    (tmp_path / "xy").write_text("a file where the prefix directory should go")
    with pytest.raises(TableStorageError, match="deletion vector file xy/deletion_vector_"):
        write_deletion_vectors(str(tmp_path), None, {"f": [1]}, inline_limit=0, prefix="xy")


# Real readers ------------------------------------------------------------------------------------------

ROWS_PER_FILE = 10_000


def table_rows(path: Path) -> list[tuple[Any, ...]]:
    """Live (id, part) rows through deltalake, checked equal to DuckDB's (delta-kernel), sorted."""
    found = sorted(tuple(r) for r in read_rows(path, columns=["id", "part"]))
    assert sorted(tuple(r) for r in read_rows_with_kernel(path, columns=["id", "part"])) == found
    return found


def rows_left(path: Path, marked: dict[str, list[int]]) -> list[tuple[Any, ...]]:
    """Every row of the table's data files but the marked ones (row indexes in file order), sorted."""
    snapshot = load_snapshot(str(path))
    left = []
    for file in snapshot.files:
        data = pq.read_table(path / file.path).to_pylist()
        part = file.partition_values.get("part") if file.partition_values else None
        gone = set(marked.get(file.path, []))
        left += [(row["id"], row.get("part", part)) for i, row in enumerate(data) if i not in gone]
    return sorted(left)


def ids(start: int, part: str) -> pa.Table:
    return pa.table({
        "id": pa.array(range(start, start + ROWS_PER_FILE), pa.int64()),
        "part": pa.array([part] * ROWS_PER_FILE, pa.string()),
    })  # fmt: skip


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
def test_deltalake_and_delta_kernel_skip_exactly_the_marked_rows(tmp_path: Path, partitioned: bool) -> None:
    path = tmp_path / "t"
    for n, part in enumerate(["x", "y", "x", "y"]):
        write_deltalake(str(path), ids(n * ROWS_PER_FILE, part), mode="append",
                        partition_by=["part"] if partitioned else None)  # fmt: skip
    files = sorted(f.path for f in load_snapshot(str(path)).files)
    assert len(files) == 4
    # Two vectors share the DV file (the second at a later offset), one is inline, one file keeps none.
    marked = {
        files[0]: list(range(0, ROWS_PER_FILE, 2)),  # a bitset container
        files[1]: list(range(100, 9_000)),  # a run container
        files[2]: [0, 3, ROWS_PER_FILE - 1],  # inline
    }
    storage = {files[0]: "u", files[1]: "u", files[2]: "i"}
    descriptors = add_deletion_vectors(path, {f: (rows, storage[f]) for f, rows in marked.items()})
    assert [d["storageType"] for d in descriptors] == ["u", "u", "i"]
    assert [d["offset"] for d in descriptors[:2]] == [1, 1 + 4 + descriptors[0]["sizeInBytes"] + 4]
    (dv_file,) = dv_files(path)
    assert dv_file.parent == path  # at the table root, whatever the partitions (PROTOCOL.md)
    expected = rows_left(path, marked)
    assert len(expected) == 4 * ROWS_PER_FILE - sum(len(rows) for rows in marked.values())
    assert table_rows(path) == expected
    # And the job's own reader gives back the same row indexes.
    snapshot = load_snapshot(str(path))
    store = log_store(snapshot.table_uri)
    for file in snapshot.files:
        vector = file.deletion_vector
        found = [] if vector is None else deleted_rows(store, snapshot.table_uri, vector)
        assert found == marked.get(file.path, [])
