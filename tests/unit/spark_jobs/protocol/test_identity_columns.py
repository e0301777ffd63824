"""Merges into tables with identity columns (GENERATED ALWAYS / BY DEFAULT AS IDENTITY), as Delta's MERGE.

Inserts that leave the column out draw values ``start + k * step`` beyond the high-water mark, unique
across Spark partitions and INSERT clauses; the mark moves in the merge's own commit (a metaData action
beside the data); explicit values into ALWAYS columns and updates of identity columns are refused before
anything is written. Every result is read back with deltalake and with DuckDB's delta-kernel reader.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge import commit as commit_stage
from spark_jobs.delta_merge.errors import CastFailureError, ConcurrentModificationError, MergeAnalysisError
from spark_jobs.delta_merge.protocol.delta_schema import normalized_schema_json
from spark_jobs.delta_merge.protocol.identity_columns import IdentityColumn, moved_high_water_mark
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.identity_fixture import commit_high_water_mark, identity_metadata, make_identity_column
from tests.unit.spark_jobs.merge.test_change_data_feed import changes
from tests.unit.spark_jobs.test_pipeline import live_files, log_actions, merge

TARGET = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])
SOURCE = pa.schema([("k", pa.int64()), ("v", pa.string())])
UPSERT_COLUMNS = """MERGE INTO t USING s ON t.k = s.k
WHEN MATCHED THEN UPDATE SET v = s.v
WHEN NOT MATCHED THEN INSERT (k, v) VALUES (s.k, s.v)"""
UPSERT_STAR = """MERGE INTO t USING s ON t.k = s.k
WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""


def identity_table(
    path: Path, rows: Sequence[tuple[Any, ...]], *, start: int, step: int, always: bool,
    high_water_mark: int | None, table_features: bool = False, configuration: dict[str, str] | None = None,
    partition_by: list[str] | None = None,
) -> Path:
    """A table (id, k, v) whose ``id`` is an identity column; returns its path."""
    data = pa.Table.from_pylist([dict(zip(TARGET.names, r, strict=True)) for r in rows], schema=TARGET)
    write_deltalake(str(path), data, configuration=configuration, partition_by=partition_by)
    make_identity_column(path, "id", start=start, step=step, always=always, high_water_mark=high_water_mark,
                         table_features=table_features)
    return path


def source_files(
    directory: Path, *parts: Sequence[tuple[Any, ...]], schema: pa.Schema = SOURCE
) -> dict[str, Any]:
    """A Parquet source of one file per part, so Spark reads it as several partitions."""
    directory.mkdir(parents=True)
    for index, rows in enumerate(parts):
        table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)
        pq.write_table(table, directory / f"part-{index}.parquet")
    return {"uri": str(directory), "format": "parquet"}


def rows_of(path: Path) -> list[tuple[Any, ...]]:
    """Live rows (id, k, v) sorted by k, read by deltalake and checked equal to the delta-kernel reader's."""
    names = ["id", "k", "v"]
    def by_key(rows: list[list[Any]]) -> list[tuple[Any, ...]]:
        return sorted((tuple(r) for r in rows), key=lambda r: (r[1], repr(r)))

    rows = by_key(read_rows(path, columns=names))
    assert by_key(read_rows_with_kernel(path, columns=names)) == rows
    return rows


def committed_mark(path: Path, version: int) -> Any:
    """The ``id`` column's high-water mark in the metaData action of ``version`` (which must have one)."""
    (metadata,) = [a["metaData"] for a in log_actions(path, version) if "metaData" in a]
    field = next(f for f in json.loads(metadata["schemaString"])["fields"] if f["name"] == "id")
    return field["metadata"].get("delta.identity.highWaterMark")


def check_lattice(values: Sequence[int], *, start: int, step: int, beyond: int | None) -> None:
    """Unique, on ``start + k * step`` and strictly beyond ``beyond`` in the step's direction."""
    assert len(set(values)) == len(values), values
    assert all((value - start) % step == 0 and (value - start) // step >= 0 for value in values), values
    if beyond is not None:
        assert all((value - beyond) * step > 0 for value in values), (values, beyond)
@pytest.mark.parametrize("table_features", [False, True], ids=["writer-v6", "identityColumns-feature"])
def test_always_inserts_draw_unique_values_beyond_the_mark_in_one_commit(
    spark: Any, tmp_path: Path, table_features: bool
) -> None:
    target = identity_table(tmp_path / "t", [(10, 1, "a"), (15, 2, "b")], start=10, step=5, always=True,
                            high_water_mark=15, table_features=table_features)
    before = table_version(target)
    source = source_files(tmp_path / "s", [(2, "B"), (3, "c"), (4, "d")], [(5, "e"), (6, "f")],
                          [(7, "g"), (8, "h"), (9, "i")])
    metrics = merge(spark, target, source, UPSERT_COLUMNS, shuffle_partitions=3)

    assert metrics["tableVersion"] == before + 1 == table_version(target)
    assert metrics["numTargetRowsInserted"] == 7
    assert metrics["numTargetRowsUpdated"] == 1
    rows = rows_of(target)
    assert [(k, v) for _, k, v in rows] == [(1, "a"), (2, "B"), (3, "c"), (4, "d"), (5, "e"), (6, "f"),
                                            (7, "g"), (8, "h"), (9, "i")]
    assert [r[0] for r in rows[:2]] == [10, 15]  # matched and copied rows keep their values
    inserted = [r[0] for r in rows[2:]]
    check_lattice(inserted, start=10, step=5, beyond=15)
    assert committed_mark(target, before + 1) == max(inserted)
    assert identity_metadata(target, "id") == {
        "delta.identity.start": 10, "delta.identity.step": 5, "delta.identity.allowExplicitInsert": False,
        "delta.identity.highWaterMark": max(inserted),
    }
    actions = log_actions(target, before + 1)
    assert [next(iter(a)) for a in actions][:2] == ["commitInfo", "metaData"]
    assert any("add" in a for a in actions)
def test_by_default_negative_step_takes_explicit_values_and_moves_the_mark_past_them(
    spark: Any, tmp_path: Path
) -> None:
    # No value generated yet: the first is start. Delta's mark follows every value written to the column
    # (its stats tracker), rounded onto the lattice: the explicit -50 rounds to -52.
    target = identity_table(tmp_path / "t", [(-1000, 1, "a")], start=-1, step=-3, always=False,
                            high_water_mark=None)
    before = table_version(target)
    source = source_files(tmp_path / "s", [(2, "b"), (3, "c")], [(4, "d"), (50, "x")])
    sql = """MERGE INTO t USING s ON t.k = s.k
    WHEN NOT MATCHED AND s.k < 10 THEN INSERT (k, v) VALUES (s.k, s.v)
    WHEN NOT MATCHED THEN INSERT (id, k, v) VALUES (-s.k, s.k, s.v)"""
    metrics = merge(spark, target, source, sql, shuffle_partitions=2)

    assert metrics["tableVersion"] == before + 1
    rows = rows_of(target)
    assert [(k, v) for _, k, v in rows] == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (50, "x")]
    assert rows[0][0] == -1000
    assert rows[-1][0] == -50
    generated = [r[0] for r in rows[1:4]]
    check_lattice(generated, start=-1, step=-3, beyond=None)
    assert committed_mark(target, before + 1) == -52
    assert min(generated) > -52
def test_explicit_by_default_values_alone_leave_the_mark(spark: Any, tmp_path: Path) -> None:
    # Delta tracks marks only for columns a clause generates values for: explicit values alone don't move it.
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=False, high_water_mark=1)
    source = source_files(tmp_path / "s", [(2, "b")])
    sql = "MERGE INTO t USING s ON t.k = s.k WHEN NOT MATCHED THEN INSERT (id, k, v) VALUES (100, s.k, s.v)"
    metrics = merge(spark, target, source, sql)

    assert not [a for a in log_actions(target, metrics["tableVersion"]) if "metaData" in a]
    assert identity_metadata(target, "id")["delta.identity.highWaterMark"] == 1
    assert rows_of(target) == [(1, 1, "a"), (100, 2, "b")]
def test_two_insert_clauses_draw_from_one_sequence(spark: Any, tmp_path: Path) -> None:
    target = identity_table(tmp_path / "t", [], start=1, step=1, always=True, high_water_mark=None)
    source = source_files(tmp_path / "s", [(k, "even" if k % 2 == 0 else "odd") for k in range(1, 7)],
                          [(k, "even" if k % 2 == 0 else "odd") for k in range(7, 13)])
    sql = """MERGE INTO t USING s ON t.k = s.k
    WHEN NOT MATCHED AND s.v = 'even' THEN INSERT (k, v) VALUES (s.k, 'E')
    WHEN NOT MATCHED THEN INSERT (k, v) VALUES (s.k, 'O')"""
    metrics = merge(spark, target, source, sql, shuffle_partitions=2)

    assert metrics["numTargetRowsInserted"] == 12
    ids = [r[0] for r in rows_of(target)]
    check_lattice(ids, start=1, step=1, beyond=None)
    assert committed_mark(target, metrics["tableVersion"]) == max(ids)
def test_the_mark_is_read_from_the_files_when_statistics_leave_the_column_out(
    spark: Any, tmp_path: Path
) -> None:
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=2, always=True, high_water_mark=1,
                            configuration={"delta.dataSkippingNumIndexedCols": "0"})
    source = source_files(tmp_path / "s", [(2, "b"), (3, "c")], [(4, "d")])
    metrics = merge(spark, target, source, UPSERT_COLUMNS)

    adds = [a["add"] for a in log_actions(target, metrics["tableVersion"]) if "add" in a]
    assert all("id" not in json.loads(add["stats"]).get("maxValues", {}) for add in adds)
    new = [r[0] for r in rows_of(target)[1:]]
    check_lattice(new, start=1, step=2, beyond=1)
    assert committed_mark(target, metrics["tableVersion"]) == max(new)
def test_partitioned_table_values_stay_unique_across_partitions(spark: Any, tmp_path: Path) -> None:
    # The write stage rebalances by partition value after the values are drawn.
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=True, high_water_mark=1,
                            partition_by=["v"])
    source = source_files(tmp_path / "s", [(k, "ab"[k % 2]) for k in range(2, 8)],
                          [(k, "ab"[k % 2]) for k in range(8, 14)])
    metrics = merge(spark, target, source, UPSERT_STAR, shuffle_partitions=3)

    rows = rows_of(target)
    assert [(k, v) for _, k, v in rows] == [(1, "a")] + [(k, "ab"[k % 2]) for k in range(2, 14)]
    new = [r[0] for r in rows[1:]]
    check_lattice(new, start=1, step=1, beyond=1)
    assert committed_mark(target, metrics["tableVersion"]) == max(new)
def test_change_data_feed_records_the_drawn_values(spark: Any, tmp_path: Path) -> None:
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=True, high_water_mark=1,
                            configuration={"delta.enableChangeDataFeed": "true"})
    source = source_files(tmp_path / "s", [(1, "A"), (2, "b")], [(3, "c")])
    metrics = merge(spark, target, source, UPSERT_COLUMNS)

    rows = rows_of(target)
    assert changes(target, metrics["tableVersion"]) == sorted(
        [(1, 1, "a", "update_preimage"), (1, 1, "A", "update_postimage"),
         *[(*row, "insert") for row in rows[1:]]], key=repr)
def test_a_dry_run_draws_values_but_commits_nothing(spark: Any, tmp_path: Path) -> None:
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=True, high_water_mark=1)
    before = table_version(target)
    source = source_files(tmp_path / "s", [(2, "b"), (3, "c")])
    metrics = merge(spark, target, source, UPSERT_COLUMNS, dry_run=True)
    assert metrics["dryRun"] is True
    assert metrics["numTargetRowsInserted"] == 2
    assert table_version(target) == before
    assert identity_metadata(target, "id")["delta.identity.highWaterMark"] == 1
def test_merges_in_a_row_continue_beyond_the_mark_with_star_clauses(spark: Any, tmp_path: Path) -> None:
    # INSERT * / UPDATE SET * leave the identity column out when the source has none.
    target = identity_table(tmp_path / "t", [(100, 1, "a")], start=100, step=-10, always=True,
                            high_water_mark=100)
    marks = [100]
    for round_number, keys in enumerate([(1, 2, 3), (3, 4, 5, 6)]):
        source = source_files(tmp_path / f"s{round_number}", [(k, f"r{round_number}") for k in keys[:2]],
                              [(k, f"r{round_number}") for k in keys[2:]])
        metrics = merge(spark, target, source, UPSERT_STAR)
        rows = rows_of(target)
        old = {r[1]: r[0] for r in rows if r[0] >= marks[-1]}
        new = [r[0] for r in rows if r[0] < marks[-1]]
        check_lattice(new, start=100, step=-10, beyond=marks[-1])
        assert len(new) == metrics["numTargetRowsInserted"] == len(keys) - 1
        assert committed_mark(target, metrics["tableVersion"]) == min(new)
        assert set(old) | {r[1] for r in rows if r[0] < marks[-1]} == {r[1] for r in rows}
        marks.append(min(new))
    ids = [r[0] for r in rows_of(target)]
    assert len(set(ids)) == len(ids) == 6
def test_schema_evolution_commits_the_new_column_and_the_moved_mark_together(
    spark: Any, tmp_path: Path
) -> None:
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=True, high_water_mark=1)
    before = table_version(target)
    schema = pa.schema([("k", pa.int64()), ("v", pa.string()), ("extra", pa.string())])
    source = source_files(tmp_path / "s", [(1, "A", "x"), (2, "b", "y")], schema=schema)
    metrics = merge(spark, target, source, UPSERT_STAR, schema_evolution=True)

    assert metrics["tableVersion"] == before + 1
    (metadata,) = [a["metaData"] for a in log_actions(target, before + 1) if "metaData" in a]
    fields = json.loads(metadata["schemaString"])["fields"]
    assert [f["name"] for f in fields] == ["id", "k", "v", "extra"]
    assert fields[0]["metadata"]["delta.identity.highWaterMark"] == 2
    rows = sorted(read_rows(target, columns=["id", "k", "v", "extra"]))
    assert rows == sorted(read_rows_with_kernel(target, columns=["id", "k", "v", "extra"]))
    assert rows == [[1, 1, "A", "x"], [2, 2, "b", "y"]]
def test_a_merge_generating_nothing_leaves_the_schema_alone(spark: Any, tmp_path: Path) -> None:
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=True, high_water_mark=1)
    source = source_files(tmp_path / "s", [(1, "A")])
    sql = "MERGE INTO t USING s ON t.k = s.k WHEN MATCHED THEN UPDATE SET v = s.v"
    metrics = merge(spark, target, source, sql)
    assert not [a for a in log_actions(target, metrics["tableVersion"]) if "metaData" in a]
    assert rows_of(target) == [(1, 1, "A")]
@pytest.mark.parametrize(
    ("sql", "source_schema"),
    [
        ("MERGE INTO t USING s ON t.k = s.k WHEN NOT MATCHED THEN INSERT (id, k, v) VALUES (s.k, s.k, s.v)",
         SOURCE),
        (UPSERT_STAR.replace("UPDATE SET *", "UPDATE SET v = s.v"), TARGET),
    ],
    ids=["insert-column-list", "insert-star"],
)
def test_explicit_values_into_an_always_column_are_refused(
    spark: Any, tmp_path: Path, sql: str, source_schema: pa.Schema
) -> None:
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=True, high_water_mark=1)
    before, files = table_version(target), live_files(target)
    row = (7, 2, "b") if source_schema is TARGET else (2, "b")
    source = source_files(tmp_path / "s", [row], schema=source_schema)
    with pytest.raises(MergeAnalysisError) as raised:
        merge(spark, target, source, sql)
    assert raised.value.error_class == "DELTA_IDENTITY_COLUMNS_EXPLICIT_INSERT_NOT_SUPPORTED"
    message = "Providing values for GENERATED ALWAYS AS IDENTITY column id is not supported."
    assert message in str(raised.value)
    assert table_version(target) == before
    assert live_files(target) == files
    assert rows_of(target) == [(1, 1, "a")]
@pytest.mark.parametrize(
    ("sql", "source_schema"),
    [
        ("MERGE INTO t USING s ON t.k = s.k WHEN MATCHED THEN UPDATE SET id = s.k", SOURCE),
        ("MERGE INTO t USING s ON t.k = s.k WHEN NOT MATCHED BY SOURCE THEN UPDATE SET id = t.id + 1",
         SOURCE),
        (UPSERT_STAR, TARGET),
    ],
    ids=["update-set", "not-matched-by-source-update", "update-star"],
)
def test_updates_of_an_identity_column_are_refused_even_by_default(
    spark: Any, tmp_path: Path, sql: str, source_schema: pa.Schema
) -> None:
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=False, high_water_mark=1)
    before, files = table_version(target), live_files(target)
    row = (7, 1, "b") if source_schema is TARGET else (1, "b")
    source = source_files(tmp_path / "s", [row], schema=source_schema)
    with pytest.raises(MergeAnalysisError) as raised:
        merge(spark, target, source, sql)
    assert raised.value.error_class == "DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED"
    assert "IDENTITY column id cannot be updated." in str(raised.value)
    assert table_version(target) == before
    assert live_files(target) == files
def test_a_concurrent_move_of_the_mark_fails_the_merge_without_duplicates(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another writer generated 2 and 3 and committed the mark 3 after this merge read the mark 1.
    target = identity_table(tmp_path / "t", [(1, 1, "a")], start=1, step=1, always=True, high_water_mark=1)
    real = commit_stage.commit_serializably  # type: ignore[attr-defined]

    def racing(*args: Any, **kwargs: Any) -> Any:
        commit_high_water_mark(target, "id", 3)
        return real(*args, **kwargs)

    monkeypatch.setattr(commit_stage, "commit_serializably", racing)
    raced = table_version(target) + 1
    source = source_files(tmp_path / "s", [(2, "b"), (3, "c")])
    with pytest.raises(ConcurrentModificationError) as raised:
        merge(spark, target, source, UPSERT_COLUMNS)
    assert raised.value.error_class == "DELTA_METADATA_CHANGED"
    assert table_version(target) == raced
    assert rows_of(target) == [(1, 1, "a")]
@pytest.mark.parametrize("step", [1, -1])
def test_running_out_of_bigint_values_fails_instead_of_wrapping(
    spark: Any, tmp_path: Path, step: int
) -> None:
    # One value is left for two inserts. The LEGACY policy turns ANSI arithmetic off: no wrapping still.
    mark = (1 << 63) - 2 if step > 0 else -(1 << 63) + 1
    target = identity_table(tmp_path / "t", [(mark, 1, "a")], start=0, step=step, always=True,
                            high_water_mark=mark)
    before = table_version(target)
    source = source_files(tmp_path / "s", [(2, "b"), (3, "c")])
    with pytest.raises(CastFailureError) as raised:
        merge(spark, target, source, UPSERT_COLUMNS, store_assignment_policy="LEGACY")
    assert raised.value.error_class == "ARITHMETIC_OVERFLOW"
    assert "identity column id (start 0, step" in str(raised.value)
    assert table_version(target) == before


# -- the mark's rule, without Spark ------------------------------------------------------------------------
def _column(start: int, step: int, mark: int | None) -> IdentityColumn:
    return IdentityColumn("id", start, step, mark, allow_explicit_insert=True)


@pytest.mark.parametrize(
    ("column", "written", "expected"),
    [
        (_column(1, 1, None), [3, 1, 2], 3),
        (_column(10, 5, 15), [20, 35, 12], 35),
        (_column(10, 5, 15), [11], None),  # not beyond the mark: stays
        (_column(10, 3, None), [9], None),  # before start: no mark (the first value stays 10)
        (_column(10, 3, None), [11], 13),  # rounded onto 10 + 3k
        (_column(-1, -3, None), [-50, -4], -52),
        (_column(-1, -3, -10), [-4], None),
        (_column(100, -10, 100), [90, 70, 80], 70),
        (_column(1, 1, 5), [], None),
    ],
)
def test_moved_high_water_mark_follows_delta(
    column: IdentityColumn, written: list[int], expected: int | None
) -> None:
    assert moved_high_water_mark(column, written) == expected


def test_first_value_is_one_step_beyond_the_mark_or_start() -> None:
    assert _column(10, 5, None).first_value == 10
    assert _column(10, 5, 25).first_value == 30
    assert _column(-1, -3, -7).first_value == -10


def test_a_moved_mark_is_a_schema_change_to_the_commit_plan() -> None:
    # plan_commit emits metaData only when delta-rs's reading of the schema differs: field metadata counts.
    def schema(mark: int) -> str:
        metadata = {"delta.identity.start": 1, "delta.identity.step": 1,
                    "delta.identity.allowExplicitInsert": False, "delta.identity.highWaterMark": mark}
        field = {"name": "id", "type": "long", "nullable": True, "metadata": metadata}
        return json.dumps({"type": "struct", "fields": [field]})

    assert normalized_schema_json(schema(3)) == normalized_schema_json(schema(3))
    assert normalized_schema_json(schema(3)) != normalized_schema_json(schema(4))
