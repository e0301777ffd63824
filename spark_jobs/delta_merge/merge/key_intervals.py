"""Which of the target files' key intervals the source's keys fall in: Spark tasks mark, the driver reads.

For one key column, the files' [min, max] statistics have sorted distinct endpoints p_0 < ... < p_{n-1}.
They cut the key's domain into 2n+1 pieces: piece 2i is the open gap just below p_i (piece 2n is above
p_{n-1}), piece 2i+1 is p_i itself. Each task sorts its batch's keys (Arrow), finds each endpoint among
them (numpy's searchsorted) and marks the pieces holding at least one key, one bit per piece. The driver
ORs the tasks' bits; a file may hold a key of the source only where a marked piece lies within its
[min, max]. Unlike one [min, max] of the whole source, this skips the files between the source's keys:
an upsert whose keys cluster in 2 of 40 key-ordered files joins those 2, not the 30 its range spans.

Written by hand: no library here answers "which of these intervals hold a value of this column" in a
Spark task.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["EPOCH", "MARKS_SCHEMA", "intervals_marked", "mark_pieces", "merge_marks"]

EPOCH = dt.date(1970, 1, 1)
MARKS_SCHEMA = "key int, pieces binary"
_MARKS_ARROW_SCHEMA = pa.schema([("key", pa.int32()), ("pieces", pa.binary())])


def _comparable(values: pa.Array) -> np.ndarray:
    """The non-null values of one key column, sorted, as numpy compares them with the endpoints (dates as
    days since 1970-01-01; strings as Python str, which order by code point as UTF-8 bytes do)."""
    values = pc.drop_null(values)
    if pa.types.is_date32(values.type):
        values = values.cast(pa.int32())
    ordered: np.ndarray = values.take(pc.array_sort_indices(values)).to_numpy(zero_copy_only=False)
    return ordered


def mark_pieces(
    endpoints: Sequence[Sequence[Any]], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Spark task (``mapInArrow``): column ``i`` of the batches is key ``i``, ``endpoints[i]`` its sorted
    distinct endpoints; yields one row per key with the marked pieces as packed bits."""
    points = [np.array(list(p), dtype=object if p and isinstance(p[0], str) else np.int64) for p in endpoints]
    marked = [np.zeros(2 * len(p) + 1, dtype=bool) for p in points]
    for batch in batches:
        for index, column_points in enumerate(points):
            keys = _comparable(batch.column(index))
            if len(keys) == 0:
                continue
            below = np.searchsorted(keys, column_points, side="left")  # keys < p_i
            at_most = np.searchsorted(keys, column_points, side="right")  # keys <= p_i
            marked[index][1::2] |= at_most > below
            # Gap j lies between p_{j-1} and p_j: the keys < p_j less the keys <= p_{j-1}.
            marked[index][0::2] |= np.append(below, len(keys)) > np.insert(at_most, 0, 0)
    yield pa.RecordBatch.from_arrays(
        [pa.array(range(len(points)), pa.int32()), pa.array([np.packbits(m).tobytes() for m in marked])],
        schema=_MARKS_ARROW_SCHEMA,
    )


def merge_marks(rows: Sequence[tuple[int, bytes]], endpoints: Sequence[Sequence[Any]]) -> list[np.ndarray]:
    """The OR of every task's marks, per key: one bool per piece."""
    merged = [np.zeros(2 * len(p) + 1, dtype=bool) for p in endpoints]
    for key, pieces in rows:
        bits = np.unpackbits(np.frombuffer(pieces, dtype=np.uint8))[: len(merged[key])]
        merged[key] |= bits.astype(bool)
    return merged


def intervals_marked(
    marked: np.ndarray, endpoints: Sequence[Any], intervals: Sequence[tuple[Any, Any]]
) -> list[bool]:
    """For each (low, high) interval (a None bound is unbounded), whether a marked piece lies in it."""
    position = {value: i for i, value in enumerate(endpoints)}
    counts = np.concatenate(([0], np.cumsum(marked)))
    found = []
    for low, high in intervals:
        first = 0 if low is None else 2 * position[low] + 1
        last = len(marked) - 1 if high is None else 2 * position[high] + 1
        found.append(bool(counts[last + 1] - counts[first] > 0))
    return found
