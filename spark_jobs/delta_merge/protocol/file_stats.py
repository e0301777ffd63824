"""Delta per-file statistics (numRecords, minValues, maxValues, nullCount) from the Arrow data written."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "DEFAULT_NUM_INDEXED_COLS",
    "STRING_PREFIX_LENGTH",
    "FileStatsCollector",
    "StatsLeaf",
    "indexed_leaves",
    "split_column_name",
    "truncate_max_string",
    "truncate_min_string",
]

DEFAULT_NUM_INDEXED_COLS = 32  # delta.dataSkippingNumIndexedCols
STRING_PREFIX_LENGTH = 32  # Delta's spark.databricks.delta.stats.skipping.string.prefixLength
_ASCII_MAX = "\x7f"
_UNICODE_MAX = "\U0010ffff"
_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)


@dataclass(frozen=True)
class StatsLeaf:
    """One indexed column: its path through structs and its Arrow type.

    Every leaf gets a nullCount (arrays and maps as whole columns); :attr:`bounds` says whether it
    also gets min/max (numbers, strings, dates, timestamps: Delta's ``SkippingEligibleDataType``).
    """

    path: tuple[str, ...]
    arrow_type: pa.DataType

    @property
    def bounds(self) -> bool:
        t = self.arrow_type
        return bool(
            pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or pa.types.is_date32(t) or pa.types.is_timestamp(t)
        )


def indexed_leaves(
    data_schema: pa.Schema, *, num_indexed_cols: int = DEFAULT_NUM_INDEXED_COLS,
    stats_columns: Sequence[str] | None = None, whole: Collection[tuple[str, ...]] = (),
) -> tuple[StatsLeaf, ...]:
    """The leaves Delta collects statistics on, in schema order.

    :param data_schema: the file's schema (partition columns already left out).
    :param num_indexed_cols: first N leaves, counting every non-struct field as one and recursing
        into structs (Delta's ``truncateSchema``); negative means all.
    :param stats_columns: ``delta.dataSkippingStatsColumns`` names (``a``, ``s.x``, backticks quote);
        when given they win over ``num_indexed_cols``. Matched case-insensitively; a struct name
        takes all its leaves; names that match nothing are ignored, as Delta's ``filterSchema`` does.
    :param whole: paths of structs that are one value (VARIANT columns, stored as a struct of ``value``
        and ``metadata`` binaries): one leaf each, with a nullCount and no bounds.
    """
    fields = list(data_schema)
    if stats_columns is not None:
        wanted = [tuple(p.lower() for p in split_column_name(n)) for n in stats_columns]
        leaves = list(_chosen_leaves(fields, [w for w in wanted if w], ()))
    else:
        budget = num_indexed_cols if num_indexed_cols >= 0 else math.inf
        leaves = _first_leaves(fields, budget, ())[0]
    folded: list[StatsLeaf] = []
    for leaf in leaves:
        owner = next((w for w in whole if leaf.path[:len(w)] == w and len(leaf.path) > len(w)), None)
        if owner is None:
            folded.append(leaf)
        elif not folded or folded[-1].path != owner:
            folded.append(StatsLeaf(owner, pa.struct([("value", pa.binary()), ("metadata", pa.binary())])))
    return tuple(folded)


def split_column_name(name: str) -> list[str]:
    """``a.`b.c`.d`` -> ``["a", "b.c", "d"]`` (a doubled backtick inside backticks is one backtick)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    i = 0
    while i < len(name):
        c = name[i]
        if quoted:
            if c == "`" and name[i + 1:i + 2] == "`":
                current.append("`")
                i += 1
            elif c == "`":
                quoted = False
            else:
                current.append(c)
        elif c == "`":
            quoted = True
        elif c == ".":
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def truncate_min_string(value: str, prefix_length: int = STRING_PREFIX_LENGTH) -> str:
    """A lower bound for ``value``: its first ``prefix_length`` characters (Delta's min truncation)."""
    return value[:prefix_length]


def truncate_max_string(value: str, prefix_length: int = STRING_PREFIX_LENGTH) -> str | None:
    """An upper bound for ``value`` of at most ~``prefix_length`` characters, or None (no bound).

    Delta's ``truncateMaxStringAgg``: the prefix plus a tie-breaker that is larger than the next
    character it replaces (U+007F when that character is ASCII below it, else U+10FFFF, skipping
    U+10FFFF characters themselves), extending the prefix up to twice its length. Counted in code
    points; Delta counts UTF-16 units, which only differs (still a bound) outside the BMP.
    """
    if len(value) <= prefix_length:
        return value
    cut = prefix_length
    while cut <= 2 * prefix_length:
        if cut >= len(value):
            return value
        following = value[cut]
        if following == _UNICODE_MAX:
            cut += 1
            continue
        return value[:cut] + (_ASCII_MAX if following < _ASCII_MAX else _UNICODE_MAX)
    return None


class FileStatsCollector:
    """Accumulates the statistics of one file over the Arrow chunks written to it."""

    def __init__(self, leaves: Sequence[StatsLeaf]) -> None:
        self._leaves = tuple(leaves)
        self._num_records = 0
        self._nulls = [0] * len(self._leaves)
        self._min: list[Any] = [None] * len(self._leaves)
        self._max: list[Any] = [None] * len(self._leaves)
        # A NaN has no place in an ordering readers agree on: such a column gets no bounds.
        self._unbounded = [False] * len(self._leaves)

    @property
    def num_records(self) -> int:
        return self._num_records

    def update(self, data: pa.Table | pa.RecordBatch) -> None:
        """Fold in rows exactly as they were written (same schema as the file)."""
        self._num_records += data.num_rows
        for i, leaf in enumerate(self._leaves):
            # Whole (chunked) columns per kernel call: a file's buffer holds many small batches.
            values = _leaf_values(data, leaf.path)
            self._nulls[i] += values.null_count
            if not leaf.bounds or self._unbounded[i] or values.null_count == len(values):
                continue
            if pa.types.is_floating(values.type) and pc.any(pc.is_nan(values)).as_py():
                self._unbounded[i] = True
                continue
            extremes = pc.min_max(values)
            low, high = _plain(extremes["min"]), _plain(extremes["max"])
            self._min[i] = low if self._min[i] is None else min(self._min[i], low)
            self._max[i] = high if self._max[i] is None else max(self._max[i], high)

    def to_json(self) -> str:
        """``add.stats``: numRecords, then minValues / maxValues / nullCount nested like the schema."""
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for i, leaf in enumerate(self._leaves):
            _put(nulls, leaf.path, str(self._nulls[i]))
            if not leaf.bounds or self._unbounded[i] or self._min[i] is None:
                continue
            low = _render(leaf.arrow_type, self._min[i], upper=False)
            high = _render(leaf.arrow_type, self._max[i], upper=True)
            if low is not None:
                _put(mins, leaf.path, low)
            if high is not None:
                _put(maxs, leaf.path, high)
        parts = [f'"numRecords":{self._num_records}']
        for key, values in (("minValues", mins), ("maxValues", maxs), ("nullCount", nulls)):
            if values:
                parts.append(f'"{key}":{_json_object(values)}')
        return "{" + ",".join(parts) + "}"


def _first_leaves(
    fields: Sequence[pa.Field], budget: float, prefix: tuple[str, ...],
) -> tuple[list[StatsLeaf], int]:
    leaves: list[StatsLeaf] = []
    count = 0
    for field in fields:
        if count >= budget:
            break
        if pa.types.is_struct(field.type):
            nested, used = _first_leaves(list(field.type), budget - count, (*prefix, field.name))
            leaves += nested
            count += used
        else:
            leaves.append(StatsLeaf((*prefix, field.name), field.type))
            count += 1
    return leaves, count


def _chosen_leaves(
    fields: Sequence[pa.Field], wanted: Sequence[tuple[str, ...]], prefix: tuple[str, ...],
) -> Iterator[StatsLeaf]:
    for field in fields:
        tails = [w[1:] for w in wanted if w[0] == field.name.lower()]
        if not tails:
            continue
        path = (*prefix, field.name)
        if any(not t for t in tails):
            if pa.types.is_struct(field.type):
                yield from _first_leaves(list(field.type), math.inf, path)[0]
            else:
                yield StatsLeaf(path, field.type)
        elif pa.types.is_struct(field.type):
            yield from _chosen_leaves(list(field.type), tails, path)


def _leaf_values(data: pa.Table | pa.RecordBatch, path: tuple[str, ...]) -> pa.Array | pa.ChunkedArray:
    values = data.column(data.schema.get_field_index(path[0]))
    for name in path[1:]:
        # flatten() folds the struct's own validity into its children: a NULL struct makes its
        # leaves NULL, which is what nullCount must count.
        values = values.flatten()[values.type.get_field_index(name)]
    return values


def _plain(scalar: pa.Scalar) -> Any:
    if pa.types.is_timestamp(scalar.type) or pa.types.is_date32(scalar.type):
        return scalar.value  # epoch micros / days: exact and free of datetime's range limits
    return scalar.as_py()


def _render(arrow_type: pa.DataType, value: Any, *, upper: bool) -> str | None:
    """JSON text of a bound, or None to leave the bound out (always safe: no bound, no pruning)."""
    if pa.types.is_floating(arrow_type):
        return repr(float(value)) if math.isfinite(value) else None
    if pa.types.is_decimal(arrow_type):
        return format(value, "f") if isinstance(value, Decimal) and value.is_finite() else None
    if pa.types.is_integer(arrow_type):
        return str(int(value))
    if pa.types.is_date32(arrow_type):
        try:
            return json.dumps((_EPOCH_DATE + dt.timedelta(days=value)).isoformat())
        except OverflowError:
            return None
    if pa.types.is_timestamp(arrow_type):
        return _render_timestamp(arrow_type, value, upper=upper)
    text = truncate_max_string(value) if upper else truncate_min_string(value)
    return None if text is None else json.dumps(text, ensure_ascii=False)


def _render_timestamp(arrow_type: pa.TimestampType, value: int, *, upper: bool) -> str | None:
    per_milli = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[arrow_type.unit]
    # Stats keep milliseconds: round the max up so it stays an upper bound for sub-ms values.
    millis = value * 1000 if per_milli is None else (-(-value // per_milli) if upper else value // per_milli)
    try:
        stamp = _EPOCH + dt.timedelta(milliseconds=millis)
    except OverflowError:
        return None
    text = (f"{stamp.year:04d}-{stamp.month:02d}-{stamp.day:02d}T{stamp.hour:02d}:{stamp.minute:02d}:"
            f"{stamp.second:02d}.{stamp.microsecond // 1000:03d}")
    return json.dumps(text + ("Z" if arrow_type.tz is not None else ""))


def _put(target: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    for name in path[:-1]:
        target = target.setdefault(name, {})
    target[path[-1]] = value


def _json_object(values: dict[str, Any]) -> str:
    # Values are JSON fragments already, so decimals keep every digit (json.dumps has no Decimal).
    items = (f"{json.dumps(k, ensure_ascii=False)}:{v if isinstance(v, str) else _json_object(v)}"
             for k, v in values.items())
    return "{" + ",".join(items) + "}"
