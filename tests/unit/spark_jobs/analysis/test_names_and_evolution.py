"""Names with dots, duplicate assignments, schema evolution of structs and void columns, constant ON.

Each merge is checked against the result Delta's MergeIntoCommand gives for the same statement: the
rows (read back through deltalake), the table schema, and the commit against the merge's metrics.
Statements use the structural form (``condition`` + ``clauses``), in which ```value.a``` is one
top-level column and ``value.a`` the field ``a`` of the struct ``value``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import MergeAnalysisError, MergeJobError
from tests.support.delta_reader import table_version
from tests.unit.spark_jobs.test_pipeline import (
    check_commit,
    expected_rows,
    live_files,
    log_actions,
    make_target,
    parquet_source,
    row_metrics,
    sorted_rows,
)

VALUE = pa.struct([("a", pa.int64()), ("b", pa.string())])
DOTTED = pa.schema([("id", pa.int64()), ("value.a", pa.int64()), ("value", VALUE)])
CITY = pa.struct([("city", pa.string())])
CITY_ZIP = pa.struct([("city", pa.string()), ("zip", pa.string())])


def table(schema: pa.Schema, rows: Sequence[Sequence[Any]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)


def structural(
    target: Path, source: Mapping[str, Any], condition: str, clauses: Sequence[Mapping[str, Any]],
    **options: Any,
) -> dict[str, Any]:
    return {
        "target": {"uri": str(target)}, "source": dict(source), "target_alias": "t", "source_alias": "s",
        "condition": condition, "clauses": list(clauses), "options": options,
    }


def run(spark: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    metrics: dict[str, Any] = run_merge(spark, spec).to_dict()
    return metrics


def schema_fields(path: Path) -> list[dict[str, Any]]:
    fields: list[dict[str, Any]] = json.loads(DeltaTable(str(path)).schema().to_json())["fields"]
    return fields


def field_names(fields: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f["name"] for f in fields]


def refused(
    spark: Any, target: Path, spec: Mapping[str, Any], *fragments: str,
    error: type[MergeJobError] = MergeJobError,
) -> MergeJobError:
    """The merge fails with ``error`` carrying ``fragments``; the table is left as it was."""
    version, files = table_version(target), live_files(target)
    with pytest.raises(error) as raised:
        run_merge(spark, spec)
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert (table_version(target), live_files(target)) == (version, files)
    return raised.value


UPSERT_ALL = [{"when": "matched", "action": "update_all"}, {"when": "not_matched", "action": "insert_all"}]


# -- item 4: backticked names with dots -----------------------------------------------------------------
def test_dotted_top_level_column_and_struct_field_are_different_columns(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", table(DOTTED, [
        (1, 10, {"a": 100, "b": "x"}), (2, 20, {"a": 200, "b": "y"}), (3, 30, {"a": 300, "b": "z"}),
    ]))
    # Source row 8 would match target 2 on the struct field value.a (200), but ON names `value.a`.
    source = parquet_source(tmp_path / "s", table(DOTTED, [
        (9, 10, {"a": 999, "b": "p"}), (8, 21, {"a": 200, "b": "q"}),
    ]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, "t.`value.a` = s.`value.a`", [
        # Both names in one SET: no conflict, since they are different columns. Values see the old row.
        {"when": "matched", "action": "update",
         "set": {"`value.a`": "s.`value.a` + t.value.a", "value.a": "t.`value.a`"}},
        {"when": "not_matched", "action": "insert",
         "values": {"id": "s.id", "`value.a`": "s.value.a",
                    "value": "named_struct('a', s.`value.a`, 'b', s.value.b)"}},
        {"when": "not_matched_by_source", "condition": "t.value.a > 250", "action": "update",
         "set": {"value.a": "t.`value.a`"}},
    ]))

    assert sorted_rows(target) == [
        (1, 110, {"a": 10, "b": "x"}), (2, 20, {"a": 200, "b": "y"}), (3, 30, {"a": 30, "b": "z"}),
        (8, 200, {"a": 21, "b": "q"}),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1,
        numTargetRowsNotMatchedBySourceUpdated=1, numTargetRowsCopied=1)
    _, adds = check_commit(target, before, metrics)
    assert field_names(schema_fields(target)) == ["id", "value.a", "value"]
    # Statistics keep the top-level `value.a` apart from the struct's field a.
    stats = [json.loads(a["stats"]) for a in adds]
    assert min(s["minValues"]["value.a"] for s in stats) == 20
    assert max(s["maxValues"]["value.a"] for s in stats) == 200
    assert min(s["minValues"]["value"]["a"] for s in stats) == 10
    assert max(s["maxValues"]["value"]["a"] for s in stats) == 200


def test_star_resolves_dotted_names_by_whole_name_case_insensitively(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", table(DOTTED, [(1, 10, {"a": 100, "b": "x"}), (2, 20, None)]))
    # Other order, other case, struct fields swapped: `*` matches names (whole, with the dot), not positions.
    source_schema = pa.schema([
        ("VALUE", pa.struct([("b", pa.string()), ("A", pa.int64())])), ("Value.A", pa.int64()),
        ("ID", pa.int64()),
    ])
    source = parquet_source(tmp_path / "s", table(source_schema, [
        ({"b": "s1", "A": 111}, 11, 1), ({"b": "s5", "A": 555}, 55, 5),
    ]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, "t.id = s.id", UPSERT_ALL))

    assert sorted_rows(target) == [
        (1, 11, {"a": 111, "b": "s1"}), (2, 20, None), (5, 55, {"a": 555, "b": "s5"}),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    check_commit(target, before, metrics)
    assert DeltaTable(str(target)).schema().to_json() == DeltaTable(str(target), version=0).schema().to_json()


def test_schema_evolution_adds_dotted_columns_and_dotted_struct_fields(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", table(DOTTED, [(1, 10, {"a": 100, "b": "x"}), (2, 20, None)]))
    value_xy = pa.struct([("a", pa.int64()), ("b", pa.string()), ("x.y", pa.string())])
    source_schema = pa.schema([
        ("id", pa.int64()), ("value.a", pa.int64()), ("value", value_xy), ("new.col", pa.string()),
    ])
    source = parquet_source(tmp_path / "s", table(source_schema, [
        (1, 11, {"a": 111, "b": "s1", "x.y": "xy1"}, "n1"),
        (3, 33, {"a": 333, "b": "s3", "x.y": "xy3"}, "n3"),
    ]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, "t.`value.a` < s.`value.a` AND t.id = s.id", UPSERT_ALL,
                                    schema_evolution=True))

    fields = schema_fields(target)
    assert field_names(fields) == ["id", "value.a", "value", "new.col"]
    assert field_names(fields[2]["type"]["fields"]) == ["a", "b", "x.y"]
    assert sorted_rows(target) == [
        (1, 11, {"a": 111, "b": "s1", "x.y": "xy1"}, "n1"),
        (2, 20, None, None),
        (3, 33, {"a": 333, "b": "s3", "x.y": "xy3"}, "n3"),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    check_commit(target, before, metrics)


def test_data_skipping_on_a_dotted_column_is_not_confused_with_the_struct_field(
    spark: Any, tmp_path: Path
) -> None:
    # File 1: `value.a` in [1, 2]; file 2: `value.a` in [10, 11]. The struct field value.a is >= 100 in both.
    target = make_target(
        tmp_path / "t",
        table(DOTTED, [(1, 1, {"a": 100, "b": "p"}), (2, 2, {"a": 200, "b": "q"})]),
        table(DOTTED, [(3, 10, {"a": 300, "b": "r"}), (4, 11, {"a": 400, "b": "s"})]),
    )
    source = parquet_source(tmp_path / "s", table(DOTTED, [(2, 0, None), (4, 0, None)]))
    before = live_files(target)

    metrics = run(spark, structural(
        target, source, "t.id = s.id AND t.`value.a` > 5 AND t.value.a >= 100",
        [{"when": "matched", "action": "update", "set": {"value.b": "'hit'"}}],
    ))

    assert sorted_rows(target) == [
        (1, 1, {"a": 100, "b": "p"}), (2, 2, {"a": 200, "b": "q"}),
        (3, 10, {"a": 300, "b": "r"}), (4, 11, {"a": 400, "b": "hit"}),
    ]
    assert (metrics["numTargetFilesBeforeSkipping"], metrics["numTargetFilesAfterSkipping"]) == (2, 1)
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsCopied=1)
    removes, _ = check_commit(target, before, metrics)
    assert [json.loads(before[r["path"]]["stats"])["minValues"]["value.a"] for r in removes] == [10]


KV = pa.schema([("id", pa.int64()), ("v", pa.string())])


@pytest.mark.parametrize(
    ("clause", "fragments"),
    [
        ({"when": "not_matched", "action": "insert", "values": {"id": "s.id", "v": "s.v", "V": "'x'"}},
         ["Duplicate column names in INSERT clause"]),
        ({"when": "not_matched", "action": "insert", "values": {"t.id": "s.id", "ID": "2"}},
         ["Duplicate column names in INSERT clause"]),
        ({"when": "matched", "action": "update", "set": {"v": "s.v", "V": "'x'"}},
         ["There is a conflict from these SET columns", "`v`", "`V`"]),
        ({"when": "not_matched_by_source", "action": "update", "set": {"t.v": "'a'", "T.V": "'b'"}},
         ["There is a conflict from these SET columns"]),
    ],
    ids=["insert-case", "insert-alias-and-case", "set-case", "set-alias-and-case"],
)
def test_duplicate_assignments_are_refused_case_insensitively(
    spark: Any, tmp_path: Path, clause: dict[str, Any], fragments: list[str]
) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a")]))
    source = parquet_source(tmp_path / "s", table(KV, [(1, "b")]))

    refused(spark, target, structural(target, source, "t.id = s.id", [clause]), *fragments)


def test_a_struct_and_its_field_conflict_but_a_dotted_column_does_not(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", table(DOTTED, [(1, 10, {"a": 100, "b": "x"})]))
    source = parquet_source(tmp_path / "s", table(DOTTED, [(1, 11, {"a": 111, "b": "y"})]))

    refused(spark, target, structural(target, source, "t.id = s.id", [
        {"when": "matched", "action": "update", "set": {"value": "s.value", "VALUE.a": "1"}},
    ]), "There is a conflict from these SET columns")


# -- item 5: schema evolution -----------------------------------------------------------------------------
def test_star_evolution_brings_new_nested_fields_and_keeps_target_fields_the_source_lacks(
    spark: Any, tmp_path: Path
) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("addr", CITY_ZIP)])
    target = make_target(tmp_path / "t", table(schema, [
        (1, "a", {"city": "Paris", "zip": "75001"}), (2, "b", {"city": "Rome", "zip": "00100"}),
    ]))
    # The source lacks v and addr.zip, and its addr brings a new field country.
    addr = pa.struct([("city", pa.string()), ("country", pa.string())])
    source_schema = pa.schema([("id", pa.int64()), ("addr", addr)])
    source = parquet_source(tmp_path / "s", table(source_schema, [
        (1, {"city": "Lyon", "country": "FR"}), (3, {"city": "Oslo", "country": "NO"}),
    ]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, "t.id = s.id", UPSERT_ALL, schema_evolution=True))

    fields = schema_fields(target)
    assert field_names(fields) == ["id", "v", "addr"]
    assert field_names(fields[2]["type"]["fields"]) == ["city", "zip", "country"]
    # UPDATE SET * assigns the source's leaves (Delta unfolds structs): the target keeps v and addr.zip;
    # INSERT * assigns whole source columns, so what the source lacks is NULL.
    assert sorted_rows(target) == [
        (1, "a", {"city": "Lyon", "zip": "75001", "country": "FR"}),
        (2, "b", {"city": "Rome", "zip": "00100", "country": None}),
        (3, None, {"city": "Oslo", "zip": None, "country": "NO"}),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    check_commit(target, before, metrics)


def test_explicit_assignments_add_source_columns_and_nested_fields(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("addr", CITY), ("home", CITY)])
    target = make_target(tmp_path / "t", table(schema, [
        (1, {"city": "Paris"}, {"city": "Nice"}), (2, {"city": "Rome"}, {"city": "Bari"}),
    ]))
    wide = pa.struct([("city", pa.string()), ("zip", pa.string()), ("unused", pa.string())])
    source_schema = pa.schema([
        ("id", pa.int64()), ("addr", wide), ("home", wide), ("newcol", pa.int32()), ("other", pa.string()),
    ])
    source = parquet_source(tmp_path / "s", table(source_schema, [
        (1, {"city": "Lyon", "zip": "69001", "unused": "u"}, {"city": "Metz", "zip": "57000", "unused": "u"},
         10, "o"),
        (3, {"city": "Oslo", "zip": "0150", "unused": "u"}, {"city": "Bergen", "zip": "5003", "unused": "u"},
         30, "o"),
    ]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, "t.id = s.id", [
        # A new nested field by its path; a new top-level column by the source's name for it.
        {"when": "matched", "action": "update", "set": {"addr.zip": "s.addr.zip", "newcol": "s.newcol"}},
        # A whole struct assigned: all of the source struct's fields arrive (Delta keeps it whole).
        {"when": "not_matched", "action": "insert",
         "values": {"id": "s.id", "home": "s.home", "NEWCOL": "s.newcol"}},
    ], schema_evolution=True))

    fields = schema_fields(target)
    assert field_names(fields) == ["id", "addr", "home", "newcol"]
    assert field_names(fields[1]["type"]["fields"]) == ["city", "zip"]
    assert field_names(fields[2]["type"]["fields"]) == ["city", "zip", "unused"]
    assert (fields[3]["type"], fields[3]["nullable"]) == ("integer", True)
    assert sorted_rows(target) == [
        (1, {"city": "Paris", "zip": "69001"}, {"city": "Nice", "zip": None, "unused": None}, 10),
        (2, {"city": "Rome", "zip": None}, {"city": "Bari", "zip": None, "unused": None}, None),
        (3, None, {"city": "Bergen", "zip": "5003", "unused": "u"}, 30),
    ]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    check_commit(target, before, metrics)


@pytest.mark.parametrize(
    ("clauses", "fragments"),
    [
        # The source has no column named newcol, so evolution cannot add it.
        ([{"when": "matched", "action": "update", "set": {"newcol": "s.v"}}],
         ["cannot resolve newcol in UPDATE clause"]),
        # NOT MATCHED BY SOURCE clauses see only the target's columns and never add any (Delta).
        ([{"when": "matched", "action": "update", "set": {"v": "s.v"}},
          {"when": "not_matched_by_source", "action": "update", "set": {"extra": "'x'"}}],
         ["cannot resolve extra in UPDATE clause"]),
    ],
    ids=["not-a-source-column", "not-matched-by-source"],
)
def test_evolution_adds_only_source_columns_named_by_matched_or_insert_clauses(
    spark: Any, tmp_path: Path, clauses: list[dict[str, Any]], fragments: list[str]
) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a")]))
    source_schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("extra", pa.string())])
    source = parquet_source(tmp_path / "s", table(source_schema, [(1, "b", "e")]))

    error = refused(spark, target, structural(target, source, "t.id = s.id", clauses, schema_evolution=True),
                    *fragments, error=MergeAnalysisError)
    assert error.error_class == "DELTA_MERGE_UNRESOLVED_EXPRESSION"


@pytest.mark.parametrize(
    ("query", "column"),
    [
        ("SELECT CAST(2 AS BIGINT) AS id, 'B' AS v, NULL AS extra", "`extra`"),
        ("SELECT CAST(2 AS BIGINT) AS id, named_struct('c', 'x', 'void', NULL) AS extra", "`extra`.`void`"),
    ],
    ids=["column", "nested-field"],
)
def test_evolution_refuses_to_add_a_void_column(spark: Any, tmp_path: Path, query: str, column: str) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a"), (2, "b")]))

    error = refused(spark, target, structural(target, {"query": query}, "t.id = s.id", UPSERT_ALL,
                                              schema_evolution=True),
                    f"[DELTA_MERGE_ADD_VOID_COLUMN] Cannot add column {column} with type VOID. Please "
                    "explicitly specify a non-void type.", error=MergeAnalysisError)
    assert error.error_class == "DELTA_MERGE_ADD_VOID_COLUMN"


@pytest.mark.parametrize("evolution", [False, True], ids=["plain", "evolution"])
def test_void_source_column_into_an_existing_column_assigns_null(
    spark: Any, tmp_path: Path, evolution: bool
) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a"), (2, "b")]))
    query = "SELECT * FROM VALUES (CAST(2 AS BIGINT), NULL), (CAST(3 AS BIGINT), NULL) AS s(id, v)"
    before = live_files(target)

    metrics = run(spark, structural(target, {"query": query}, "t.id = s.id", UPSERT_ALL,
                                    schema_evolution=evolution))

    assert sorted_rows(target) == [(1, "a"), (2, None), (3, None)]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsMatchedUpdated=1, numTargetRowsInserted=1, numTargetRowsCopied=1)
    check_commit(target, before, metrics)
    assert field_names(schema_fields(target)) == ["id", "v"]


def test_unassigned_void_source_column_is_ignored_under_evolution(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a")]))
    query = "SELECT CAST(1 AS BIGINT) AS id, 'A' AS v, NULL AS unused"
    before = live_files(target)

    metrics = run(spark, structural(target, {"query": query}, "t.id = s.id", [
        {"when": "matched", "action": "update", "set": {"v": "s.v"}},
    ], schema_evolution=True))

    assert sorted_rows(target) == [(1, "A")]
    assert field_names(schema_fields(target)) == ["id", "v"]
    assert row_metrics(metrics) == expected_rows(numSourceRows=1, numTargetRowsMatchedUpdated=1)
    check_commit(target, before, metrics)


# -- item 5: constant ON conditions -----------------------------------------------------------------------
@pytest.mark.parametrize("condition", ["NULL", "false"])
def test_constant_condition_every_source_row_not_matched_every_target_row_not_matched_by_source(
    spark: Any, tmp_path: Path, condition: str
) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a"), (2, "b")]), table(KV, [(3, "c")]))
    source = parquet_source(tmp_path / "s", table(KV, [(1, "x"), (4, "y")]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, condition, [
        {"when": "matched", "action": "update", "set": {"v": "'matched?'"}},
        {"when": "not_matched", "action": "insert_all"},
        {"when": "not_matched_by_source", "condition": "t.id < 3", "action": "update",
         "set": {"v": "concat(t.v, '!')"}},
    ]))

    assert sorted_rows(target) == [(1, "a!"), (1, "x"), (2, "b!"), (3, "c"), (4, "y")]
    assert row_metrics(metrics) == expected_rows(
        numSourceRows=2, numTargetRowsInserted=2, numTargetRowsNotMatchedBySourceUpdated=2,
        numTargetRowsCopied=1)
    # With NOT MATCHED BY SOURCE clauses Delta reads every file and, the join being a right outer join
    # that records every target row's file, rewrites every file (row 3 is copied).
    assert (metrics["numTargetFilesAfterSkipping"], metrics["numTargetFilesRemoved"]) == (2, 2)
    check_commit(target, before, metrics)
    info = next(a["commitInfo"] for a in log_actions(target, metrics["tableVersion"]) if "commitInfo" in a)
    assert [p.lower() for p in json.loads(info["operationParameters"]["predicate"])] == [condition.lower()]


@pytest.mark.parametrize("condition", ["NULL", "false", "t.id = s.id AND NULL"])
def test_constant_condition_skips_every_file_and_only_inserts(
    spark: Any, tmp_path: Path, condition: str
) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a")]), table(KV, [(2, "b")]))
    source = parquet_source(tmp_path / "s", table(KV, [(1, "x"), (5, "y")]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, condition, [
        {"when": "matched", "action": "delete"}, {"when": "not_matched", "action": "insert_all"},
    ]))

    assert sorted_rows(target) == [(1, "a"), (1, "x"), (2, "b"), (5, "y")]
    assert (metrics["numTargetFilesBeforeSkipping"], metrics["numTargetFilesAfterSkipping"]) == (2, 0)
    assert row_metrics(metrics) == expected_rows(numSourceRows=2, numTargetRowsInserted=2)
    removes, adds = check_commit(target, before, metrics)
    assert (removes, len(adds)) == ([], 1)


def test_constant_false_condition_in_a_matched_only_merge_changes_nothing(spark: Any, tmp_path: Path) -> None:
    target = make_target(tmp_path / "t", table(KV, [(1, "a"), (2, "b")]))
    source = parquet_source(tmp_path / "s", table(KV, [(1, "x")]))
    before = live_files(target)

    metrics = run(spark, structural(target, source, "false", [
        {"when": "matched", "action": "update_all"},
    ]))

    assert sorted_rows(target) == [(1, "a"), (2, "b")]
    assert (metrics["numTargetFilesAfterSkipping"], metrics["numTargetFilesRemoved"]) == (0, 0)
    assert metrics["numTargetFilesAdded"] == 0
    assert row_metrics(metrics) == expected_rows(numSourceRows=1)
    assert live_files(target) == before
