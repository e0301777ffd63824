"""The statistics the job records bound what its files hold, and a stats-pruning reader (deltalake) agrees.

After a few merges on a table of many types (ints, float, strings past the 32-character prefix, dates,
micro-second timestamps, decimals, booleans, lists, nested structs, NULLs everywhere), every file a merge
wrote is read back alone with pyarrow and checked against its add action: numRecords, nullCount per
leaf, and minValues / maxValues bounding the values (exact where Delta keeps exact values). Then
deltalake's filtered reads, which skip files by those statistics, must return what an unfiltered read
filtered in Python returns.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.delta_reader import read_table, table_version

UTC = dt.timezone.utc
PREFIX = 32  # Delta's string stats prefix length
MAX_CHAR = "\U0010ffff"

INNER = pa.struct([("z", pa.int64()), ("w", pa.date32())])
STRUCT = pa.struct([("x", pa.int32()), ("y", pa.string()), ("inner", INNER)])
SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("i32", pa.int32()),
    ("f", pa.float64()),
    ("s", pa.string()),
    ("d", pa.date32()),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("dec", pa.decimal128(12, 3)),
    ("b", pa.bool_()),
    ("tags", pa.list_(pa.string())),
    ("st", STRUCT),
    ("p", pa.string()),
])
LONG = "a" * PREFIX
STRINGS = (
    "", "a", "b", "zeta", "é", "日本語", "😀 emoji",
    LONG, LONG + "b", LONG + "bc" * 10, LONG + "\x7f", LONG + "é tail", "b" * 40,
    LONG + MAX_CHAR + "x", LONG + MAX_CHAR * (PREFIX + 2) + "x",  # no upper bound within 2x the prefix
)
PARTS = ("x", "y", None)


# ----------------------------------------------------------------------------------------------------
# Data


def _maybe(rng: random.Random, make: Callable[[], Any], null: float = 0.15) -> Any:
    return None if rng.random() < null else make()


def _timestamp(rng: random.Random) -> dt.datetime:
    base = dt.datetime(1950, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=rng.randrange(0, 150 * 365 * 86400))
    # Sub-millisecond parts on both sides of a millisecond boundary: stats keep milliseconds.
    micros = rng.choice((0, 1, 999, 1000, 123456, 999999, rng.randrange(1_000_000)))
    return base.replace(microsecond=micros)


def _row(rng: random.Random, row_id: int) -> dict[str, Any]:
    def inner() -> dict[str, Any]:
        return {"z": _maybe(rng, lambda: rng.randrange(-10**12, 10**12)),
                "w": _maybe(rng, lambda: dt.date(1900, 1, 1) + dt.timedelta(days=rng.randrange(73000)))}

    def tags() -> list[str | None]:
        return [_maybe(rng, lambda: rng.choice(STRINGS)) for _ in range(rng.randrange(3))]

    def struct() -> dict[str, Any]:
        return {
            "x": _maybe(rng, lambda: rng.randrange(-1000, 1000)),
            "y": _maybe(rng, lambda: rng.choice(STRINGS)),
            "inner": _maybe(rng, inner, 0.25),
        }

    return {
        "id": row_id,
        "i32": _maybe(rng, lambda: rng.randrange(-2**31, 2**31)),
        "f": _maybe(rng, lambda: rng.choice((-0.5, 0.0, 1e-300, 3.25, -1e300, rng.uniform(-1e6, 1e6)))),
        "s": _maybe(rng, lambda: rng.choice(STRINGS)),
        "d": _maybe(rng, lambda: dt.date(1900, 1, 1) + dt.timedelta(days=rng.randrange(73000))),
        "ts": _maybe(rng, lambda: _timestamp(rng)),
        "dec": _maybe(rng, lambda: Decimal(rng.randrange(-10**11, 10**11)).scaleb(-3)),
        "b": _maybe(rng, lambda: rng.random() < 0.5),
        "tags": _maybe(rng, tags),
        "st": _maybe(rng, struct, 0.1),
        "p": rng.choice(PARTS),
    }


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _null_row(row_id: int, part: str | None) -> dict[str, Any]:
    return dict.fromkeys(SCHEMA.names) | {"id": row_id, "p": part}


# ----------------------------------------------------------------------------------------------------
# The table and its merges


def _merge(spark: Any, root: Path, source_dir: Path, rows: list[dict[str, Any]], whens: str) -> None:
    from spark_jobs.delta_merge import run_merge

    source_dir.mkdir()
    pq.write_table(_table(rows), source_dir / "part-0.parquet")
    run_merge(spark, {
        "target": {"uri": str(root)},
        "source": {"uri": str(source_dir), "format": "parquet"},
        "merge_sql": f"MERGE INTO target t USING source s ON t.id = s.id {whens}",
    })


def _build_and_merge(
    spark: Any, tmp_path: Path, *, seed: int, partition_by: list[str] | None
) -> tuple[Path, int]:
    """The target after three merges, and the last version written by deltalake before them."""
    from deltalake import write_deltalake

    rng = random.Random(seed)
    root = tmp_path / "target"
    for batch in range(3):
        rows = [_row(rng, 100 * batch + i) for i in range(rng.randrange(8, 20))]
        write_deltalake(str(root), _table(rows), mode="append", partition_by=partition_by)
    setup_version = table_version(root)
    existing = [r["id"] for r in read_table(root).select(["id"]).to_pylist()]

    # 1. Updates (rows move between partitions), deletes and inserts.
    updated = rng.sample(existing, len(existing) // 2)
    _merge(spark, root, tmp_path / "source1", [_row(rng, i) for i in updated + list(range(1000, 1012))],
           "WHEN MATCHED AND s.id % 4 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
           "WHEN NOT MATCHED THEN INSERT *")
    # 2. NOT MATCHED BY SOURCE: every file is rewritten, some columns set to NULL or to edge values.
    _merge(spark, root, tmp_path / "source2", [_row(rng, i) for i in range(1000, 1004)],
           "WHEN MATCHED THEN UPDATE SET * "
           "WHEN NOT MATCHED BY SOURCE AND t.id % 3 = 0 THEN UPDATE SET s = NULL, ts = NULL, st = NULL "
           f"WHEN NOT MATCHED BY SOURCE AND t.id % 3 = 1 THEN UPDATE SET s = '{LONG}zz', dec = t.dec * 2")
    # 3. Insert-only: files whose columns are all NULL but the key, a string without an upper bound,
    # one whose bound is truncated.
    edge = _null_row(2005, "x") | {"s": STRINGS[-1], "st": {"x": None, "y": LONG + "bc" * 10, "inner": None}}
    nulls = [_null_row(2000 + i, PARTS[i % 3]) for i in range(5)]
    _merge(spark, root, tmp_path / "source3", [*nulls, edge], "WHEN NOT MATCHED THEN INSERT *")
    return root, setup_version


# ----------------------------------------------------------------------------------------------------
# Statistics against the files


def _leaves(
    schema: pa.Schema | pa.StructType, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], pa.DataType]]:
    for field in schema:
        if pa.types.is_struct(field.type):
            yield from _leaves(field.type, (*prefix, field.name))
        else:
            yield (*prefix, field.name), field.type


def _leaf_array(table: pa.Table, path: tuple[str, ...]) -> pa.Array:
    array = table.column(path[0]).combine_chunks()
    for name in path[1:]:
        array = array.flatten()[array.type.get_field_index(name)]  # a NULL struct makes its leaves NULL
    return array


def _lookup(stats: dict[str, Any], path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(stats, dict) or name not in stats:
            return None
        stats = stats[name]
    return stats


def _parse_bound(value: Any, arrow_type: pa.DataType) -> Any:
    if pa.types.is_date32(arrow_type):
        return dt.date.fromisoformat(value)
    if pa.types.is_timestamp(arrow_type):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if pa.types.is_decimal(arrow_type):
        return Decimal(str(value))
    if pa.types.is_floating(arrow_type):
        return float(value)
    return value


def _ms_floor(t: dt.datetime) -> dt.datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def _ms_ceil(t: dt.datetime) -> dt.datetime:
    floor = _ms_floor(t)
    return floor if floor == t else floor + dt.timedelta(milliseconds=1)


def _has_bounds(arrow_type: pa.DataType) -> bool:
    return not (pa.types.is_boolean(arrow_type) or pa.types.is_list(arrow_type))


def _check_bounds(where: str, arrow_type: pa.DataType, low: Any, high: Any, values: list[Any]) -> str:
    """``low``/``high`` are the recorded bounds (None: absent); ``values`` the leaf's non-NULL values.

    :returns: which kind of case this was, so the test can tell that the edge cases did occur.
    """
    if not values:
        assert (low, high) == (None, None), f"{where}: bounds {low!r}..{high!r} on an all-NULL column"
        return "all NULL"
    actual_low, actual_high = min(values), max(values)
    assert low is not None, f"{where}: no minValues though the file has values"
    assert low <= actual_low, f"{where}: minValues {low!r} > actual min {actual_low!r}"
    if high is not None:
        assert high >= actual_high, f"{where}: maxValues {high!r} < actual max {actual_high!r}"
    if pa.types.is_string(arrow_type):
        assert low == actual_low[:PREFIX], f"{where}: minValues {low!r} is not the min's prefix"
        if high is None:
            # Only when no string of <= 2x the prefix bounds the max (all U+10FFFF past the prefix).
            assert set(actual_high[PREFIX:2 * PREFIX + 1]) == {MAX_CHAR}, f"{where}: maxValues missing"
            return "string without max"
        assert len(high) <= 2 * PREFIX + 1, f"{where}: maxValues {high!r} longer than needed"
        return "truncated string max" if high != actual_high else "string"
    assert high is not None, f"{where}: no maxValues though the file has values"
    if pa.types.is_timestamp(arrow_type):
        assert (low, high) == (_ms_floor(actual_low), _ms_ceil(actual_high)), where
        return "sub-ms timestamp max" if high != actual_high else "timestamp"
    assert (low, high) == (actual_low, actual_high), f"{where}: bounds are not the exact min/max"
    return "exact"


def _job_adds(root: Path, after_version: int) -> list[dict[str, Any]]:
    adds = []
    for log in sorted((root / "_delta_log").glob("*.json")):
        if int(log.stem) <= after_version:
            continue
        for line in log.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                adds.append(action["add"] | {"version": int(log.stem)})
    return adds


def _check_file_stats(root: Path, add: dict[str, Any], partition_columns: list[str]) -> set[str]:
    where = f"v{add['version']} {add['path']}"
    assert add.get("stats"), f"{where}: no stats"
    stats = json.loads(add["stats"], parse_float=Decimal)
    table = pq.read_table(root / unquote(add["path"]))
    assert set(add["partitionValues"]) == set(partition_columns), where
    assert not set(partition_columns) & set(table.column_names), f"{where}: partition column in the file"
    assert stats["numRecords"] == table.num_rows, where
    seen = set()
    for path, arrow_type in _leaves(table.schema):
        at = f"{where} {'.'.join(path)}"
        array = _leaf_array(table, path)
        assert _lookup(stats.get("nullCount", {}), path) == array.null_count, at
        low, high = (_lookup(stats.get(key, {}), path) for key in ("minValues", "maxValues"))
        if not _has_bounds(arrow_type):
            assert (low, high) == (None, None), f"{at}: bounds on a type Delta does not skip on"
            continue
        low, high = (None if v is None else _parse_bound(v, arrow_type) for v in (low, high))
        seen.add(_check_bounds(at, arrow_type, low, high, [v for v in array.to_pylist() if v is not None]))
    return seen


def _check_delta_rs_parses(root: Path, adds: list[dict[str, Any]]) -> None:
    """deltalake's typed reading of the live files' stats bounds the data too (what its pruning sees)."""
    from deltalake import DeltaTable

    ours = {unquote(a["path"]): a for a in adds}
    actions = pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).to_pylist()
    live = [a for a in actions if unquote(a["path"]) in ours]
    assert live, "no live file written by the job"
    for action in live:
        table = pq.read_table(root / unquote(action["path"]))
        where = f"deltalake stats of {action['path']}"
        assert action["num_records"] == table.num_rows, where
        for path, arrow_type in _leaves(table.schema):
            key = ".".join(path)
            array = _leaf_array(table, path)
            assert action.get(f"null_count.{key}") == array.null_count, f"{where} {key}"
            if not _has_bounds(arrow_type):
                continue
            values = [v for v in array.to_pylist() if v is not None]
            low, high = action.get(f"min.{key}"), action.get(f"max.{key}")
            if values and low is not None:
                assert low <= min(values), f"{where} {key}: min {low!r}"
            if values and high is not None:
                assert high >= max(values), f"{where} {key}: max {high!r}"


# ----------------------------------------------------------------------------------------------------
# Filtered reads


def _sql_column(path: tuple[str, ...]) -> str:
    return f'"{path[0]}"' + "".join(f"['{name}']" for name in path[1:])


def _sql_literal(value: Any, arrow_type: pa.DataType) -> str:
    if pa.types.is_string(arrow_type):
        return "'" + value.replace("'", "''") + "'"
    if pa.types.is_date32(arrow_type):
        return f"DATE '{value.isoformat()}'"
    if pa.types.is_timestamp(arrow_type):
        return f"TIMESTAMP '{value.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%f')}Z'"
    if pa.types.is_decimal(arrow_type):
        return f"CAST('{value}' AS DECIMAL({arrow_type.precision},{arrow_type.scale}))"
    if pa.types.is_boolean(arrow_type):
        return "true" if value else "false"
    return repr(value)


def _value(row: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = row
    for name in path:
        if value is None:
            return None
        value = value[name]
    return value


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b, "<": lambda a, b: a < b, ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
}


def _literals(values: list[Any], arrow_type: pa.DataType, rng: random.Random) -> list[Any]:
    """Existing values (the extremes and a few others) and values just around and outside them."""
    distinct = sorted(set(values))
    if not distinct:
        return []
    chosen = {distinct[0], distinct[-1], *rng.sample(distinct, min(4, len(distinct)))}
    if pa.types.is_timestamp(arrow_type):
        step: Any = dt.timedelta(microseconds=1)
    elif pa.types.is_date32(arrow_type):
        step = dt.timedelta(days=1)
    elif pa.types.is_decimal(arrow_type):
        step = Decimal("0.001")
    elif pa.types.is_integer(arrow_type):
        step = 1
    else:
        step = None
    if step is not None:
        # Just past the extremes; for timestamps around every value, as their stats keep milliseconds.
        around = chosen if pa.types.is_timestamp(arrow_type) else {distinct[0], distinct[-1]}
        chosen |= {v + d for v in around for d in (-step, step)}
    if pa.types.is_string(arrow_type):
        chosen |= {"", LONG + "c", LONG + "b" + MAX_CHAR, distinct[-1] + "a"}
    if pa.types.is_integer(arrow_type) and pa.types.is_int32(arrow_type):
        chosen = {v for v in chosen if -2**31 <= v < 2**31}
    return sorted(chosen)


def _check_filtered_reads(root: Path, *, seed: int) -> int:
    from deltalake import DeltaTable, QueryBuilder

    rng = random.Random(seed)
    builder = QueryBuilder().register("t", DeltaTable(str(root)))
    rows = pa.table(builder.execute("SELECT * FROM t").read_all()).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    queries = 0
    for path, arrow_type in _leaves(SCHEMA):
        if pa.types.is_list(arrow_type):
            continue
        column = _sql_column(path)
        predicates: list[tuple[str, Callable[[Any], bool]]] = [
            (f"{column} IS NULL", lambda v: v is None), (f"{column} IS NOT NULL", lambda v: v is not None),
        ]
        values = [v for v in (_value(r, path) for r in rows) if v is not None]
        for literal in _literals(values, arrow_type, rng):
            for op, compare in _OPS.items():
                if pa.types.is_boolean(arrow_type) and op != "=":
                    continue
                predicates.append((
                    f"{column} {op} {_sql_literal(literal, arrow_type)}",
                    lambda v, c=compare, lit=literal: v is not None and c(v, lit),
                ))
        for predicate, keep in predicates:
            got = pa.table(builder.execute(f"SELECT id FROM t WHERE {predicate}").read_all()).column("id")
            want = sorted(r["id"] for r in rows if keep(_value(r, path)))
            assert sorted(got.to_pylist()) == want, f"WHERE {predicate}"
            queries += 1
    return queries


# ----------------------------------------------------------------------------------------------------
# Tests
@pytest.mark.parametrize(
    ("seed", "partition_by"), [(7, None), (11, ["p"])], ids=["unpartitioned", "partitioned"]
)
def test_written_stats_bound_files_and_drive_correct_pruning(
    spark: Any, tmp_path: Path, seed: int, partition_by: list[str] | None
) -> None:
    root, setup_version = _build_and_merge(spark, tmp_path, seed=seed, partition_by=partition_by)
    adds = _job_adds(root, setup_version)
    assert len({a["version"] for a in adds}) == 3, "every merge commits added files"
    seen: set[str] = set()
    for add in adds:
        seen |= _check_file_stats(root, add, partition_by or [])
    # The edge cases did occur (the data is random, the merges are not).
    assert seen >= {"all NULL", "string without max", "truncated string max", "sub-ms timestamp max", "exact"}
    _check_delta_rs_parses(root, adds)
    assert _check_filtered_reads(root, seed=seed) > 100


def test_reader_prunes_by_stats(tmp_path: Path) -> None:
    """The filtered-read check has teeth: deltalake does skip files by their recorded statistics."""
    from deltalake import DeltaTable, QueryBuilder, write_deltalake

    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"id": pa.array([1, 2], pa.int64())}))
    write_deltalake(str(root), pa.table({"id": pa.array([10, 20], pa.int64())}), mode="append")
    log = root / "_delta_log" / f"{1:020d}.json"
    actions = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    for action in actions:
        if "add" in action:
            stats = json.loads(action["add"]["stats"])
            stats["minValues"]["id"], stats["maxValues"]["id"] = 100, 200  # wrong on purpose
            action["add"]["stats"] = json.dumps(stats)
    log.write_text("".join(json.dumps(a) + "\n" for a in actions), encoding="utf-8")
    builder = QueryBuilder().register("t", DeltaTable(str(root)))
    assert pa.table(builder.execute("SELECT id FROM t WHERE id = 10").read_all()).num_rows == 0
    assert pa.table(builder.execute("SELECT id FROM t").read_all()).num_rows == 4
