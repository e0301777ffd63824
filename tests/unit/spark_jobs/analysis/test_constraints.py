"""Constraints on every written row: CHECK, NOT NULL (nested too) and generated columns, as Delta does."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import ConstraintViolationError, MergeAnalysisError
from tests.support.delta_reader import read_rows, table_version

KV = pa.schema([("id", pa.int64()), ("v", pa.string())])
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
INSERT_ALL = "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *"
UTC = dt.timezone.utc
TS = pa.timestamp("us", tz="UTC")
GENERATED = pa.schema([
    pa.field("id", pa.int64()),
    pa.field("ts", TS),
    pa.field("day", pa.date32(), metadata={"delta.generationExpression": "CAST(ts AS DATE)"}),
])


def rows_of(schema: pa.Schema, rows: Sequence[Sequence[Any]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)


def source_dir(tmp_path: Path, table: pa.Table) -> Path:
    directory = tmp_path / "s"
    directory.mkdir()
    pq.write_table(table, directory / "part-0.parquet")
    return directory


def spec(target: Path, source: Path, sql: str, **options: Any) -> dict[str, Any]:
    sides = {"target": {"uri": str(target)}, "source": {"uri": str(source)}}
    return {**sides, "merge_sql": sql, "options": options}


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def violates(spark: Any, target: Path, merge_spec: Mapping[str, Any], message: str) -> str:
    """The merge fails with Delta's message (``message`` is its start); the table did not change."""
    version, files = table_version(target), files_under(target)
    with pytest.raises(ConstraintViolationError) as raised:
        run_merge(spark, merge_spec)
    text = str(raised.value)
    assert raised.value.bare_message.startswith(message), text
    not_null = message.startswith("NOT NULL")
    assert raised.value.error_class == (
        "DELTA_NOT_NULL_CONSTRAINT_VIOLATED" if not_null else "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"
    )
    assert table_version(target) == version
    assert files_under(target) == files
    return text


def kv_target(
    tmp_path: Path, rows: Sequence[Sequence[Any]], constraints: Mapping[str, str], *, unchecked: bool = False
) -> Path:
    """A table with CHECK constraints; ``unchecked``: set as plain properties, which neither validates the
    expressions nor the rows already there (a test can start from rows that violate them)."""
    target = tmp_path / "t"
    write_deltalake(str(target), rows_of(KV, rows))
    table = DeltaTable(str(target))
    if unchecked:
        properties = {f"delta.constraints.{k}": v for k, v in constraints.items()}
        table.alter.set_table_properties(properties, raise_if_not_exists=False)
    else:
        table.alter.add_constraint(dict(constraints))
    return target


# -- CHECK ------------------------------------------------------------------------------------------------
def test_check_constraint_on_inserted_and_updated_rows(spark: Any, tmp_path: Path) -> None:
    target = kv_target(tmp_path, [(1, "a"), (2, "b")], {"id_positive": "id > 0", "v_short": "length(v) < 4"},
                       unchecked=True)
    bad_insert = source_dir(tmp_path, rows_of(KV, [(2, "bb"), (-3, "c")]))
    violates(spark, target, spec(target, bad_insert, UPSERT),
             "CHECK constraint id_positive id > 0 violated by row with values:\n - id : -3")
    update = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = concat(t.v, s.v)"
    violates(spark, target, spec(target, bad_insert, update.replace("s.v)", "'long')")),
             "CHECK constraint v_short length(v) < 4 violated by row with values:\n - v : blong")

    metrics = run_merge(spark, spec(target, bad_insert, update)).to_dict()

    assert sorted(map(tuple, read_rows(target))) == [(1, "a"), (2, "bbb")]
    assert (metrics["numTargetRowsUpdated"], metrics["tableVersion"]) == (1, 2)


def test_a_null_check_result_is_a_violation_as_in_delta(spark: Any, tmp_path: Path) -> None:
    target = kv_target(tmp_path, [(1, "a")], {"v_known": "v <> 'x'"}, unchecked=True)
    source = source_dir(tmp_path, rows_of(KV, [(5, None)]))
    violates(spark, target, spec(target, source, INSERT_ALL),
             "CHECK constraint v_known v <> 'x' violated by row with values:\n - v : null")


def test_copied_rows_are_checked_deleted_and_dropped_rows_are_not(spark: Any, tmp_path: Path) -> None:
    # Row -5 predates the constraint (set without validation): copying it fails, deleting it works.
    target = kv_target(tmp_path, [(-5, "old"), (1, "a")], {"id_positive": "id > 0"}, unchecked=True)
    source = source_dir(tmp_path, rows_of(KV, [(-5, "x"), (1, "b"), (7, None)]))

    update = "MERGE INTO t USING s ON t.id = s.id AND s.id > 0 WHEN MATCHED THEN UPDATE SET *"
    violates(spark, target, spec(target, source, update),
             "CHECK constraint id_positive id > 0 violated by row with values:\n - id : -5")
    # Source row 7 matches nothing and no clause inserts it: its (NULL) output row is dropped, not checked.
    metrics = run_merge(spark, spec(target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED AND s.id < 0 THEN DELETE WHEN MATCHED THEN UPDATE SET *""")).to_dict()

    assert sorted(map(tuple, read_rows(target))) == [(1, "b")]
    assert (metrics["numTargetRowsDeleted"], metrics["numTargetRowsUpdated"]) == (1, 1)


def test_dry_run_finds_the_violation_without_writing(spark: Any, tmp_path: Path) -> None:
    target = kv_target(tmp_path, [(1, "a")], {"id_positive": "id > 0"})
    source = source_dir(tmp_path, rows_of(KV, [(-1, "x")]))
    text = violates(spark, target, spec(target, source, INSERT_ALL, dry_run=True),
                    "CHECK constraint id_positive id > 0 violated by row with values:\n - id : -1")
    assert "dry run" in text


def test_unsafe_or_unresolvable_constraint_is_refused_before_writing(spark: Any, tmp_path: Path) -> None:
    source_rows = rows_of(KV, [(2, "b")])
    for name, expression, fragment in [
        ("boom", "reflect('java.lang.Runtime', 'exec', 'id') IS NULL", "calls arbitrary Java methods"),
        ("ghost", "nope > 0", "does not resolve"),
    ]:
        root = tmp_path / name
        root.mkdir()
        target = kv_target(root, [(1, "a")], {name: expression}, unchecked=True)
        files = files_under(target)
        with pytest.raises(MergeAnalysisError, match=fragment) as raised:
            run_merge(spark, spec(target, source_dir(root, source_rows), INSERT_ALL))
        assert f"Table constraint {name}" in str(raised.value)
        assert (table_version(target), files_under(target)) == (1, files)


# -- NOT NULL ---------------------------------------------------------------------------------------------
def test_not_null_columns_and_nested_fields_of_present_structs(spark: Any, tmp_path: Path) -> None:
    inner = pa.struct([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("st", inner)])
    target = tmp_path / "t"
    write_deltalake(str(target), rows_of(schema, [(1, {"a": 1, "b": "x"})]))
    source = source_dir(tmp_path, rows_of(KV, [(2, "y"), (3, None)]))
    insert = "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT (id, st) VALUES ({}, {})"

    violates(spark, target, spec(target, source, insert.format("CAST(NULL AS BIGINT)", "NULL")),
             "NOT NULL constraint violated for column: id.")
    present = "named_struct('a', length(s.v), 'b', s.v)"
    violates(spark, target, spec(target, source, insert.format("s.id", present)),
             "NOT NULL constraint violated for column: st.a.")
    # A NULL struct hides its NOT NULL field: no violation.
    absent = "IF(s.v IS NULL, NULL, named_struct('a', 0L, 'b', s.v))"
    run_merge(spark, spec(target, source, insert.format("s.id", absent)))

    assert sorted(map(tuple, read_rows(target))) == [
        (1, {"a": 1, "b": "x"}), (2, {"a": 0, "b": "y"}), (3, None),
    ]


# -- generated columns ------------------------------------------------------------------------------------
def generated_target(tmp_path: Path) -> Path:
    target = tmp_path / "t"
    DeltaTable.create(str(target), schema=GENERATED)
    first = rows_of(pa.schema(list(GENERATED)[:2]), [(1, dt.datetime(2024, 1, 2, 3, tzinfo=UTC))])
    write_deltalake(str(target), first, mode="append")  # deltalake computes day
    return target


def test_generated_column_is_computed_when_not_assigned(spark: Any, tmp_path: Path) -> None:
    target = generated_target(tmp_path)
    assert read_rows(target, columns=["id", "day"]) == [[1, dt.date(2024, 1, 2)]]
    no_day = pa.schema(list(GENERATED)[:2])
    source = source_dir(tmp_path, rows_of(no_day, [
        (1, dt.datetime(2024, 3, 4, 23, tzinfo=UTC)), (2, dt.datetime(2024, 5, 6, tzinfo=UTC)),
    ]))
    # UPDATE of the column it depends on recomputes it; INSERT * from a source without it computes it.
    run_merge(spark, spec(target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET ts = s.ts WHEN NOT MATCHED THEN INSERT *"""))
    # An explicit column list without it computes it too.
    run_merge(spark, spec(target, source, """
        MERGE INTO t USING s ON t.id = s.id + 10
        WHEN NOT MATCHED THEN INSERT (id, ts) VALUES (s.id + 10, s.ts - INTERVAL 1 DAY)"""))

    assert sorted(map(tuple, read_rows(target, columns=["id", "day"]))) == [
        (1, dt.date(2024, 3, 4)), (2, dt.date(2024, 5, 6)),
        (11, dt.date(2024, 3, 3)), (12, dt.date(2024, 5, 5)),
    ]


def test_assigned_generated_column_must_equal_its_expression(spark: Any, tmp_path: Path) -> None:
    target = generated_target(tmp_path)
    wrong_day = (2, dt.datetime(2024, 5, 6, tzinfo=UTC), dt.date(2020, 1, 1))
    source = source_dir(tmp_path, rows_of(GENERATED, [wrong_day]))

    violates(spark, target, spec(target, source, INSERT_ALL),
             "CHECK constraint Generated Column (day <=> CAST(ts AS DATE)) violated by row with values:\n"
             " - day : 2020-01-01\n - ts : 2024-05-06 00:00:00")
    violates(spark, target, spec(target, source, """
        MERGE INTO t USING s ON t.id = s.id - 1 WHEN MATCHED THEN UPDATE SET day = DATE'2000-01-01'"""),
             "CHECK constraint Generated Column (day <=> CAST(ts AS DATE))")
    # The right value (or NULL <=> NULL) is accepted.
    run_merge(spark, spec(target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN NOT MATCHED THEN INSERT (id, ts, day) VALUES (s.id, s.ts, CAST(s.ts AS DATE))"""))

    assert sorted(map(tuple, read_rows(target, columns=["id", "day"]))) == [
        (1, dt.date(2024, 1, 2)), (2, dt.date(2024, 5, 6)),
    ]
