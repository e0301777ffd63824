"""The write stage on real Spark, read back and pruned by deltalake (an independent implementation)."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs.delta_merge.errors import ConstraintViolationError
from spark_jobs.delta_merge.protocol.file_stats import indexed_leaves
from spark_jobs.delta_merge.protocol.files import WrittenFile
from spark_jobs.delta_merge.protocol.partition_values import decode_add_path, serialize_partition_value
from spark_jobs.delta_merge.write.merge_output import (
    MergeOutputPlan,
    WriteOutcome,
    arrow_schema,
    write_merge_output,
)
from spark_jobs.delta_merge.write.task_plan import WriteTaskPlan
from spark_jobs.delta_merge.write.write_task import write_task

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


UTC = dt.timezone.utc
ACTION = "__action"
TRICKY = ["a b", "x=y", "50%", "a/b", "héllo", "ü€😀", "c:d", "q?#", '{}[]^*<>|\\"', "+&'", "%2F", None, ""]


def _write(spark: SparkSession, root: Path | str, schema: StructType, rows: Sequence[tuple[Any, ...]],
           **options: Any) -> WriteOutcome:
    with_action = StructType([*schema.fields, StructField(ACTION, IntegerType(), False)])
    df = spark.createDataFrame(list(rows), with_action)
    options.setdefault("partition_columns", [])
    options.setdefault("drop_codes", [])
    options.setdefault("target_file_size", 128 << 20)
    plan = MergeOutputPlan(table_root=str(root), schema=schema, action_column=ACTION, **options)
    return write_merge_output(df, plan)


def _commit(root: Path, schema: StructType, partition_by: list[str], files: Sequence[WrittenFile]) -> None:
    """Minimal commit through deltalake: an empty table, then one transaction adding ``files``.

    deltalake percent-encodes ``AddAction.path`` itself, so it takes the decoded relative path; the
    log then holds exactly ``WrittenFile.path`` (checked in the partitioned round trip).
    """
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction, RemoveAction

    write_deltalake(str(root), arrow_schema(schema).empty_table(), partition_by=partition_by or None)
    table = DeltaTable(str(root))
    actions: list[AddAction | RemoveAction] = [
        AddAction(path=decode_add_path(f.path), size=f.size, partition_values=dict(f.partition_values),
                  modification_time=f.modification_time, data_change=True, stats=f.stats_json)
        for f in files
    ]
    table.create_write_transaction(actions=actions, mode="append", schema=table.schema(),
                                   partition_by=partition_by or None)


def _read(root: Path, where: str | None = None) -> list[dict[str, Any]]:
    # deltalake's query engine, not its pyarrow-dataset path (which can abort the process at exit).
    from deltalake import DeltaTable, QueryBuilder

    sql = "SELECT * FROM t" + (f" WHERE {where}" if where else "")
    rows: list[dict[str, Any]] = pa.table(
        QueryBuilder().register("t", DeltaTable(str(root))).execute(sql).read_all()).to_pylist()
    return rows


def _by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # NaN != NaN would fail equal rows: compare it as text.
    same = [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]
    return sorted(same, key=lambda r: r["id"])
def test_partitioned_round_trip_with_tricky_values(spark: SparkSession, table_root: Path) -> None:
    schema = StructType([
        StructField("id", LongType(), False),
        StructField("s", StringType()),
        StructField("v", StringType()),
        StructField("d", DateType()),
        StructField("ts", TimestampType()),
    ])
    days = [dt.date(2024, 1, 1), None]
    stamps = [dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
              dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)]
    rows = [(i, TRICKY[i % len(TRICKY)], f"v{i}", days[i % 2], stamps[i % 3 % 2], 9 if i % 10 == 0 else i % 3)
            for i in range(120)]
    parts = ["s", "d", "ts"]
    outcome = _write(spark, table_root, schema, rows, partition_columns=parts, drop_codes=[9])

    assert dict(outcome.rows_by_code) == {9: 12, 0: 36, 1: 36, 2: 36}
    kept = [r for r in rows if r[-1] != 9]
    # A small output: one file per partition value ("" and NULL are the same partition in Delta).
    combos = {(None if r[1] == "" else r[1], r[3], r[4]) for r in kept}
    assert len(outcome.files) == len(combos)
    assert outcome.num_written_rows == len(kept)
    for f in outcome.files:
        relative = decode_add_path(f.path)
        assert (table_root / relative).is_file()
        assert f.size == (table_root / relative).stat().st_size
        assert not f.path.startswith("/")
        directory = relative.rsplit("/", 1)[0]
        assert directory.startswith("s=")
        assert "/d=" in directory
        assert "/ts=" in directory
        assert json.loads(f.stats_json)["numRecords"] == f.num_records
        assert pq.read_schema(table_root / relative).names == ["id", "v"]  # partition columns left out
    by_values = {tuple(f.partition_values[c] for c in parts) for f in outcome.files}
    expected_values = {(serialize_partition_value(s, StringType()), serialize_partition_value(d, DateType()),
                        serialize_partition_value(t, TimestampType())) for s, d, t in combos}
    assert by_values == expected_values
    assert any(f.path.startswith("s=50%2525/") for f in outcome.files)  # Hive "%25", then URI "%2525"
    assert any(f.path.startswith("s=a%20b/") for f in outcome.files)

    _commit(table_root, schema, parts, outcome.files)
    logged = [json.loads(line)["add"] for line in (table_root / "_delta_log" / "00000000000000000001.json")
              .read_text().splitlines() if '"add"' in line]
    assert sorted(a["path"] for a in logged) == [f.path for f in outcome.files]  # delta-rs's own encoding
    expected = [{"id": r[0], "s": r[1] or None, "v": r[2], "d": r[3], "ts": r[4]} for r in kept]
    assert _by_id(_read(table_root)) == expected
    assert _by_id(_read(table_root, "s = 'x=y'")) == [e for e in expected if e["s"] == "x=y"]
    assert _by_id(_read(table_root, "s IS NULL")) == [e for e in expected if e["s"] is None]

    # deltalake's pyarrow-dataset path too, in a child process since it can abort at exit.
    script = textwrap.dedent(f"""
        import json, deltalake
        t = deltalake.DeltaTable({str(table_root)!r}).to_pyarrow_table()
        print(json.dumps(sorted([r["id"], r["s"]] for r in t.select(["id", "s"]).to_pylist())))
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert child.stdout.strip(), child.stderr
    assert json.loads(child.stdout.strip().splitlines()[-1]) == sorted([e["id"], e["s"]] for e in expected)


ALL_TYPES = StructType([
    StructField("id", LongType(), False),
    StructField("b8", ByteType()),
    StructField("i16", ShortType()),
    StructField("i32", IntegerType(), False),
    StructField("f32", FloatType()),
    StructField("f64", DoubleType()),
    StructField("dec", DecimalType(38, 6)),
    StructField("s", StringType()),
    StructField("bin", BinaryType()),
    StructField("flag", BooleanType()),
    StructField("d", DateType()),
    StructField("ts", TimestampType()),
    StructField("ntz", TimestampNTZType()),
    StructField("st", StructType([StructField("x", IntegerType()), StructField("y", StringType(), False)])),
    StructField("arr", ArrayType(StructType([StructField("k", LongType())]))),
    StructField("m", MapType(StringType(), ArrayType(IntegerType()))),
])


def _all_types_row(i: int) -> tuple[Any, ...]:
    return (
        i, i % 100 - 50, 1000 + i, -i, 1.5 * i, i / 7, Decimal(f"{i}.123456") * (-1) ** i, f"s{i}é",
        bytes([i % 256, 0]), i % 2 == 0, dt.date(2024, 1, 1) + dt.timedelta(days=i),
        dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=1001 * i),
        dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i), {"x": i if i % 3 else None, "y": f"y{i}"},
        [{"k": i}, {"k": None}] if i % 4 else None, {"a": [i, None]} if i % 5 else {},
    )
def test_types_round_trip_in_delta_conformant_parquet(spark: SparkSession, table_root: Path) -> None:
    rows = [(*_all_types_row(i), 0) for i in range(30)]
    rows += [(100 + i, *[None] * 2, 7, *[None] * 10, None, None, 0) for i in range(2)]
    # The DataFrame may carry the table's columns in any order.
    shuffled = StructType([*reversed(ALL_TYPES.fields), StructField(ACTION, IntegerType(), False)])
    df = spark.createDataFrame([(*reversed(r[:-1]), r[-1]) for r in rows], shuffled)
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    outcome = write_merge_output(df, MergeOutputPlan(
        table_root=table_root.as_uri(), schema=ALL_TYPES, partition_columns=[], action_column=ACTION,
        drop_codes=[], target_file_size=128 << 20,
    ))
    assert spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") == previous

    assert outcome.num_written_rows == len(rows)
    for f in outcome.files:
        parquet = pq.ParquetFile(table_root / decode_add_path(f.path))
        assert parquet.schema_arrow.names == ALL_TYPES.names
        physical = {c.path: c for c in (parquet.schema.column(i) for i in range(len(parquet.schema)))}
        for column, utc in (("ts", "true"), ("ntz", "false")):
            assert physical[column].physical_type == "INT64"
            logical = json.loads(physical[column].logical_type.to_json())
            assert logical == {"Type": "Timestamp", "isAdjustedToUTC": utc == "true",
                               "timeUnit": "microseconds", "is_from_converted_type": False,
                               "force_set_converted_type": False}
        assert physical["id"].max_definition_level == 0
        assert physical["i32"].max_definition_level == 0
        assert physical["st.y"].max_definition_level == 1  # required inside an optional struct
        assert parquet.schema_arrow.field("dec").type == pa.decimal128(38, 6)

    _commit(table_root, ALL_TYPES, [], outcome.files)
    got = _by_id(_read(table_root))
    expected = [dict(zip(ALL_TYPES.names, r[:-1], strict=True)) for r in rows]
    for row in expected:
        row["m"] = None if row["m"] is None else list(row["m"].items())
        row["f32"] = None if row["f32"] is None else pytest.approx(row["f32"])
    assert got == expected
def test_counts_every_code_and_writes_nothing_for_empty_input(spark: SparkSession, table_root: Path) -> None:
    schema = StructType([StructField("id", LongType()), StructField("p", IntegerType())])
    rows = [(i, i % 2, [0, 1, 3, 3][i % 4]) for i in range(40)]
    outcome = _write(spark, f"file:{table_root}", schema, rows, partition_columns=["p"], drop_codes=[3, 8],
                     stats_columns=["ID"])
    assert dict(outcome.rows_by_code) == {0: 10, 1: 10, 3: 20}
    assert all(json.loads(f.stats_json)["nullCount"] == {"id": 0} for f in outcome.files)
    assert outcome.num_written_rows == 20
    assert sorted(str(f.partition_values["p"]) for f in outcome.files) == ["0", "1"]

    empty = _write(spark, table_root, schema, [], partition_columns=["p"], drop_codes=[3])
    assert empty.files == ()
    assert dict(empty.rows_by_code) == {}
    only_deletes = _write(spark, table_root, schema, [(1, 1, 3)], drop_codes=[3])
    assert only_deletes.files == ()
    assert dict(only_deletes.rows_by_code) == {3: 1}
def test_rolls_over_at_target_file_size(spark: SparkSession, table_root: Path) -> None:
    schema = StructType([StructField("id", LongType()), StructField("s", StringType())])
    generator = random.Random(7)
    rows = [(i, "".join(generator.choices("abcdefghij", k=20)), 0) for i in range(20000)]
    target = 48 << 10
    outcome = _write(spark, table_root, schema, rows, target_file_size=target)
    assert outcome.num_written_rows == len(rows)
    sizes = sorted(f.size for f in outcome.files)
    total = sum(sizes)
    assert total // target - 2 <= len(sizes) <= total // target + 2  # one short tail file per task at most
    assert sizes[-1] < 2 * target
    assert sum(s < target for s in sizes) <= 2
def test_not_null_violation_fails_and_leaves_no_file(spark: SparkSession, table_root: Path) -> None:
    schema = StructType([StructField("id", LongType(), False), StructField("p", StringType())])
    # One task, so the failing one is the only one (files of tasks that succeeded would stay, as orphans).
    df = spark.createDataFrame([(1, "a", 0), (None, "b", 0)], f"id long, p string, {ACTION} int").coalesce(1)
    plan = MergeOutputPlan(table_root=str(table_root), schema=schema, partition_columns=[],
                           action_column=ACTION, drop_codes=[], target_file_size=1 << 20)
    with pytest.raises(ConstraintViolationError, match=r"^\[DELTA_NOT_NULL_CONSTRAINT_VIOLATED\] NOT NULL "
                       r"constraint violated for column: id\. The merge produced NULL in 1 row"):
        write_merge_output(df, plan)
    assert not list(table_root.rglob("*.parquet"))
def test_stats_let_delta_rs_prune_without_losing_rows(spark: SparkSession, table_root: Path) -> None:
    schema = StructType([
        StructField("id", LongType(), False),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("s", StringType()),
        StructField("dec", DecimalType(20, 4)),
        StructField("f", DoubleType()),
        StructField("d", DateType()),
    ])
    base = dt.datetime(2024, 5, 1, tzinfo=UTC)
    generator = random.Random(11)
    rows = []
    for i in range(3000):
        # Sub-millisecond timestamps: a max truncated to the millisecond would prune live rows.
        stamp = base + dt.timedelta(microseconds=1337 * i + 999)
        text = f"{i:06d}" + "k" * (40 if i % 2 else 0) if i % 7 else None  # some past the 32-char prefix
        rows.append((i, stamp, stamp.replace(tzinfo=None), text, Decimal(i) / 8,
                     float("nan") if i % 997 == 5 else generator.uniform(-1, 1),
                     dt.date(2020, 1, 1) + dt.timedelta(i // 50), 0))
    # Unpartitioned and unshuffled: each file holds a contiguous id range, so stats can prune.
    outcome = _write(spark, table_root, schema, rows, target_file_size=16 << 10)
    assert len(outcome.files) >= 4
    _commit(table_root, schema, [], outcome.files)

    from deltalake import DeltaTable

    table = DeltaTable(str(table_root))
    everything = _read(table_root)
    cut = rows[1500][1]
    cut_sql = cut.strftime("%Y-%m-%d %H:%M:%S.%f")
    # SQL for the rows (deltalake's query engine); for the file listing the same predicate, as
    # tuples where deltalake 1.6.6 cannot compare a SQL timestamp literal (ns) with the column (us).
    cut_ntz = cut.replace(tzinfo=None)
    predicates: list[tuple[str, Any, Callable[[dict[str, Any]], bool]]] = [
        ("id BETWEEN 700 AND 720", None, lambda r: 700 <= r["id"] <= 720),
        (f"ts >= TIMESTAMP '{cut_sql}'", [("ts", ">=", cut)], lambda r: r["ts"] >= cut),
        (f"ts <= TIMESTAMP '{cut_sql}'", [("ts", "<=", cut)], lambda r: r["ts"] <= cut),
        (f"ntz = TIMESTAMP '{cut_sql}'", [("ntz", "=", cut_ntz)], lambda r: r["ntz"] == cut_ntz),
        ("s > '002990'", None, lambda r: r["s"] is not None and r["s"] > "002990"),
        ("s < '000100kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk'", None,
         lambda r: r["s"] is not None and r["s"] < "000100" + "k" * 34),
        ("s IS NULL", None, lambda r: r["s"] is None),
        ("dec < 12.5", None, lambda r: r["dec"] < Decimal("12.5")),
        ("d = DATE '2020-01-30'", None, lambda r: r["d"] == dt.date(2020, 1, 30)),
        # NaN sorts above every number in DataFusion (as in Spark): a max that ignored it would prune it.
        ("f > 0.99", None, lambda r: math.isnan(r["f"]) or r["f"] > 0.99),
    ]
    files_with = {row["id"]: f for f in outcome.files for row in _ids_in(table_root, f)}
    all_uris = table.file_uris()
    pruned_somewhere = False
    for sql, pruning, keep in predicates:
        expected = [r for r in everything if keep(r)]
        assert _by_id(_read(table_root, sql)) == _by_id(expected), sql
        kept_files = {Path(u).name for u in table.file_uris(file_pruning_predicate=pruning or sql)}
        needed = {Path(decode_add_path(files_with[r["id"]].path)).name for r in expected}
        assert needed <= kept_files, sql
        pruned_somewhere |= len(kept_files) < len(all_uris)
    assert pruned_somewhere  # the stats were used, not just ignored


def _ids_in(root: Path, written: WrittenFile) -> list[dict[str, Any]]:
    table = pq.read_table(root / decode_add_path(written.path), columns=["id"])
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


@pytest.mark.parametrize("failure", ["not null", "nested not null"])
def test_failed_task_deletes_its_files(tmp_path: Path, failure: str) -> None:
    """No JVM: the task function itself, fed two batches of which the second is bad."""
    schema = StructType([StructField("id", LongType(), False),
                         StructField("st", StructType([StructField("x", LongType(), False)])),
                         StructField("p", StringType())])
    plan = _plan(tmp_path, schema, ["p"], target_file_size=1)  # every batch starts a new file
    good = pa.record_batch(
        [pa.array([1, 2]), pa.array([{"x": 1}, None]), pa.array(["a", "b"]), pa.array([0, 0])],
        names=["id", "st", "p", ACTION])
    if failure == "not null":
        bad = good.set_column(0, "id", pa.array([None, 3], pa.int64()))
    else:
        x = pa.array([None, 3], pa.int64())
        bad = good.set_column(1, "st", pa.StructArray.from_arrays([x], names=["x"]))
    column = "id" if failure == "not null" else "st.x"
    violated = f"NOT NULL constraint violated for column: {column}\\."
    with pytest.raises(ConstraintViolationError, match=violated):
        list(write_task(plan, iter([good, bad])))
    assert not list(tmp_path.rglob("*.parquet"))
    # A NULL under a NULL parent is no violation: the same batch writes.
    (result,) = list(write_task(plan, iter([good])))
    assert sorted(result.to_pydict()["num_records"][:2]) == [1, 1]


def _plan(root: Path, schema: StructType, partition_columns: list[str], **options: Any) -> WriteTaskPlan:
    full = arrow_schema(schema)
    data = pa.schema([f for f in full if f.name not in partition_columns])
    return WriteTaskPlan(
        root=str(root), input_schema=full, data_schema=data, partition_columns=tuple(partition_columns),
        partition_types=tuple(schema[c].dataType for c in partition_columns), leaves=indexed_leaves(data),
        drop_codes=options.get("drop_codes", ()), target_file_size=options.get("target_file_size", 1 << 20),
    )
