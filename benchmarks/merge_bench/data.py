"""The merge benchmark's data: the key-clustered target table, each case's source, the pristine cache.

The table is synthetic and key-clustered instead of Delta's TPC-DS ``web_returns``, so that "a fraction of
the files" is exactly known: file ``i`` holds exactly the ids ``Layout.bounds(i)``.
"""

from __future__ import annotations

import json
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from .cases import MergeCase

__all__ = [
    "COLUMNS",
    "Layout",
    "SourceInfo",
    "build_source",
    "build_target",
    "ensure_pristine",
    "pristine_dir",
    "restore",
]

STRING_LEN = 20
_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", dtype=np.uint8)
_CHUNK_ROWS = 1_000_000  # rows generated at a time: ~60 MB of Arrow data, whatever the table size
_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("int_a", pa.int32()),
        ("int_b", pa.int64()),
        ("dbl_a", pa.float64()),
        ("dbl_b", pa.float64()),
        ("str_a", pa.string()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(_SCHEMA.names)
_BUILD_FORMAT = 1  # bump when the generated table changes, so that a cached pristine copy is rebuilt


@dataclass(frozen=True)
class Layout:
    """The target's key clustering: file ``i`` holds exactly the ids ``bounds(i)``."""

    rows: int
    files: int

    def bounds(self, index: int) -> tuple[int, int]:
        """``[low, high)`` of file ``index``'s ids (sizes differ by at most one row)."""
        return index * self.rows // self.files, (index + 1) * self.rows // self.files

    def matched_files(self, fraction: float) -> list[int]:
        """Evenly spaced file indexes, ``round(fraction * files)`` of them (at least one)."""
        count = min(self.files, max(1, round(fraction * self.files)))
        return [int((j + 0.5) * self.files / count) for j in range(count)]


@dataclass(frozen=True)
class SourceInfo:
    """One case's source as written, and the outcome every engine must reach."""

    path: str
    rows: int
    matched_rows: int
    not_matched_rows: int
    matched_files: int
    expected: dict[str, int]


def _columns(rng: np.random.Generator, ids: np.ndarray[Any, np.dtype[np.int64]]) -> pa.Table:
    """The value columns for ``ids``; the string is built from buffers, without Python objects."""
    n = len(ids)
    chars = _ALPHABET[rng.integers(0, len(_ALPHABET), size=n * STRING_LEN)]
    offsets = np.arange(0, (n + 1) * STRING_LEN, STRING_LEN, dtype=np.int32)
    strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))
    arrays = [
        pa.array(ids, pa.int64()),
        pa.array(rng.integers(0, 1000, size=n, dtype=np.int32)),
        pa.array(rng.integers(0, 2**40, size=n, dtype=np.int64)),
        pa.array(rng.random(n)),
        pa.array(rng.normal(100.0, 15.0, size=n)),
        strings,
    ]
    return pa.Table.from_arrays(arrays, schema=_SCHEMA)


def _chunks(rng: np.random.Generator, low: int, high: int) -> Iterator[pa.RecordBatch]:
    for start in range(low, high, _CHUNK_ROWS):
        ids = np.arange(start, min(high, start + _CHUNK_ROWS), dtype=np.int64)
        yield from _columns(rng, ids).to_batches()


def build_target(path: Path, layout: Layout, *, seed: int, deletion_vectors: bool = False) -> None:
    """Write the table one file per append, so that file ``i`` holds exactly ``layout.bounds(i)``;
    with ``deletion_vectors``, created with ``delta.enableDeletionVectors=true`` (protocol 3/7)."""
    configuration = {"delta.enableDeletionVectors": "true"} if deletion_vectors else None
    for index in range(layout.files):
        rng = np.random.default_rng([seed, index])
        reader = pa.RecordBatchReader.from_batches(_SCHEMA, _chunks(rng, *layout.bounds(index)))
        # A huge target size keeps each append in one file, whatever its size.
        write_deltalake(
            str(path),
            reader,
            mode="append",
            target_file_size=1 << 40,
            configuration=configuration if index == 0 else None,  # set when the first append creates it
        )
    table = DeltaTable(str(path))
    table.create_checkpoint()  # the merges then read one checkpoint, not one commit per file
    if len(table.file_uris()) != layout.files:
        raise RuntimeError(f"built {len(table.file_uris())} files at {path}, expected {layout.files}")
    if deletion_vectors and table.metadata().configuration.get("delta.enableDeletionVectors") != "true":
        raise RuntimeError(f"built {path} without delta.enableDeletionVectors=true")


def pristine_dir(work: Path, *, deletion_vectors: bool) -> Path:
    """The pristine table of the work dir: one with deletion vectors enabled lives next to the other."""
    return work / ("pristine-dv" if deletion_vectors else "pristine")


def ensure_pristine(
    work: Path, layout: Layout, *, seed: int, rebuild: bool, deletion_vectors: bool = False
) -> dict[str, Any]:
    """Build the pristine table once; reuse it while rows, files, seed, format and kind are unchanged."""
    pristine = pristine_dir(work, deletion_vectors=deletion_vectors)
    marker = pristine.with_suffix(".json")
    wanted = {"rows": layout.rows, "files": layout.files, "seed": seed, "format": _BUILD_FORMAT}
    wanted |= {"deletion_vectors": True} if deletion_vectors else {}
    if not rebuild and marker.exists() and pristine.exists():
        info: dict[str, Any] = json.loads(marker.read_text())
        if {key: info.get(key) for key in wanted} == wanted:
            print(f"reusing the pristine table in {pristine} (built in {info['build_seconds']:.1f} s)")
            return info
    shutil.rmtree(pristine, ignore_errors=True)
    marker.unlink(missing_ok=True)
    kind = " deletion-vector" if deletion_vectors else ""
    print(
        f"building a {layout.rows:,}-row, {layout.files}-file{kind} Delta table in {pristine} ...", flush=True
    )
    started = time.perf_counter()
    build_target(pristine, layout, seed=seed, deletion_vectors=deletion_vectors)
    table_bytes = sum(f.stat().st_size for f in pristine.glob("*.parquet"))
    info = wanted | {"build_seconds": time.perf_counter() - started, "bytes": table_bytes}
    marker.write_text(json.dumps(info))
    print(f"built {table_bytes / 2**20:,.0f} MiB in {info['build_seconds']:.1f} s")
    return info


def restore(pristine: Path, target: Path) -> None:
    """Put the pristine table back at ``target`` (untimed)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine, target)


def build_source(case: MergeCase, layout: Layout, path: Path, *, seed: int) -> SourceInfo:
    """Delta's MergeDataLoad, key-clustered: from each matched file, a Bernoulli sample of its rows with
    fresh values (matched) and a sample given new ids beyond the table's max (not matched)."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    files = layout.matched_files(case.file_matched_fraction)
    matched_parts, new_count = [], 0
    for index in files:
        low, high = layout.bounds(index)
        matched_parts.append(low + np.flatnonzero(rng.random(high - low) < case.row_matched_fraction))
        new_count += int(np.count_nonzero(rng.random(high - low) < case.row_not_matched_fraction))
    matched = np.concatenate(matched_parts).astype(np.int64)
    new_ids = np.arange(layout.rows, layout.rows + new_count, dtype=np.int64)
    table = _columns(rng, np.concatenate([matched, new_ids]))
    pq.write_table(table, path)
    inserted = new_count if any(c.action == "insert_all" for c in case.clauses) else 0
    updated = len(matched) if any(c.action == "update_all" for c in case.clauses) else 0
    deleted = len(matched) if any(c.action == "delete" for c in case.clauses) else 0
    expected = {
        "inserted": inserted,
        "updated": updated,
        "deleted": deleted,
        "rows_after": layout.rows + inserted - deleted,
    }
    return SourceInfo(str(path), table.num_rows, len(matched), new_count, len(files), expected)
