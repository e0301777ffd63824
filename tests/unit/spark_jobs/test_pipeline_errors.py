"""run_merge failures: each names its cause, and leaves the table's version and files as they were."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import (
    MergeAnalysisError,
    MergeJobError,
    MergeSpecError,
    MultipleSourceRowMatchesError,
)
from tests.support.delta_reader import read_rows, table_version

KV = pa.schema([("id", pa.int64()), ("v", pa.string())])
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def kv(rows: Sequence[Sequence[Any]], schema: pa.Schema = KV) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)


def tables(tmp_path: Path, target_rows: Sequence[tuple[Any, Any]], source: pa.Table) -> tuple[Path, Path]:
    target = tmp_path / "t"
    write_deltalake(str(target), kv(target_rows))
    source_dir = tmp_path / "s"
    source_dir.mkdir()
    pq.write_table(source, source_dir / "part-0.parquet")
    return target, source_dir


def spec(target: Path | str, source: Mapping[str, Any] | Path, sql: str, **options: Any) -> dict[str, Any]:
    source_spec = {"uri": str(source)} if isinstance(source, Path) else dict(source)
    return {"target": {"uri": str(target)}, "source": source_spec, "merge_sql": sql, "options": options}


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def fails(
    spark: Any, target: Path, merge_spec: Mapping[str, Any], error: type[Exception], *matches: str
) -> str:
    """Run the merge expecting ``error``; check the message and that the table did not change."""
    version = table_version(target) if (target / "_delta_log").exists() else None
    files = files_under(target)
    with pytest.raises(error) as raised:
        run_merge(spark, merge_spec)
    message = str(raised.value)
    for text in matches:
        assert text.lower() in message.lower(), (text, message)
    if version is not None:
        assert table_version(target) == version
    assert files_under(target) == files
    return message


# -- multiple matches -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        UPSERT,
        # Delta counts matches before clause conditions: only one duplicate satisfying it is still an error.
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED AND s.v = 'x' THEN UPDATE SET v = s.v",
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED AND s.v = 'x' THEN DELETE",
    ],
    ids=["upsert", "conditional-update", "conditional-delete"],
)
def test_multiple_source_rows_matching_one_target_row(spark: Any, tmp_path: Path, sql: str) -> None:
    target, source = tables(tmp_path, [(1, "a"), (2, "b")], kv([(1, "x"), (1, "y"), (3, "z")]))

    fails(spark, target, spec(target, source, sql), MultipleSourceRowMatchesError,
          "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row")

    assert sorted(map(tuple, read_rows(target))) == [(1, "a"), (2, "b")]


def test_multiple_matches_are_allowed_with_one_unconditional_delete(spark: Any, tmp_path: Path) -> None:
    target, source = tables(tmp_path, [(1, "a"), (2, "b"), (3, "c")],
                            kv([(1, "x"), (1, "y"), (2, "z"), (4, "new"), (4, "again")]))

    metrics = run_merge(spark, spec(target, source, """
        MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT *""")).to_dict()

    # Duplicate source rows that match nothing are all inserted, as Delta does.
    assert sorted(map(tuple, read_rows(target))) == [(3, "c"), (4, "again"), (4, "new")]
    # Deleted rows are target rows, not joined pairs (Delta compensates the double count).
    assert (metrics["numTargetRowsDeleted"], metrics["numTargetRowsMatchedDeleted"]) == (2, 2)
    assert (metrics["numTargetRowsInserted"], metrics["numTargetRowsCopied"]) == (2, 1)
    assert metrics["numOutputRows"] == 3
    assert metrics["numSourceRows"] == 5


# -- resolution -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sql", "matches"),
    [
        ("MERGE INTO t USING s ON t.id = s.nope WHEN MATCHED THEN DELETE",
         ["cannot resolve", "nope", "search condition", "t.id", "s.v"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET nope = s.v",
         ["cannot resolve nope in UPDATE clause", "t.id, t.v"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.nope",
         ["cannot resolve", "nope", "UPDATE clause"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.nope)",
         ["cannot resolve", "nope", "INSERT clause"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT (id, nope) VALUES (s.id, s.v)",
         ["cannot resolve nope in INSERT clause"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, t.v)",
         ["cannot resolve t.v in INSERT clause", "s.id, s.v"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED AND t.v = 'a' THEN INSERT *",
         ["cannot resolve t.v in INSERT condition"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED BY SOURCE THEN UPDATE SET v = s.v",
         ["cannot resolve s.v in UPDATE clause", "t.id, t.v"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED BY SOURCE AND s.id > 1 THEN DELETE",
         ["cannot resolve s.id in DELETE condition"]),
        ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = 1 + ",
         ["merge_sql"]),
    ],
    ids=["on", "set-column", "set-value", "insert-value", "insert-column", "insert-target-column",
         "insert-condition-target-column", "nmbs-source-column", "nmbs-condition-source-column", "bad-sql"],
)
def test_statement_errors(spark: Any, tmp_path: Path, sql: str, matches: list[str]) -> None:
    target, source = tables(tmp_path, [(1, "a")], kv([(1, "b")]))
    error = MergeSpecError if "merge_sql" in matches else MergeAnalysisError

    fails(spark, target, spec(target, source, sql), error, *matches)


def test_assigning_a_column_the_target_lacks_without_schema_evolution(spark: Any, tmp_path: Path) -> None:
    source_schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("extra", pa.string())])
    target, source = tables(tmp_path, [(1, "a")], kv([(1, "b", "e")], source_schema))
    sql = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET extra = s.extra"

    fails(spark, target, spec(target, source, sql), MergeAnalysisError,
          "cannot resolve extra in UPDATE clause")


def test_star_without_a_source_column_for_every_target_column(spark: Any, tmp_path: Path) -> None:
    target, source = tables(tmp_path, [(1, "a")], pa.table({"id": pa.array([1], pa.int64())}))

    fails(spark, target, spec(target, source, UPSERT), MergeAnalysisError,
          "cannot resolve", "v", "UPDATE clause")


# -- paths ----------------------------------------------------------------------------------------------
def test_missing_target_path(spark: Any, tmp_path: Path) -> None:
    _, source = tables(tmp_path, [(1, "a")], kv([(1, "b")]))
    missing = tmp_path / "nowhere"

    message = fails(spark, missing, spec(missing, source, UPSERT), MergeAnalysisError,
                    f"{missing} is not a Delta table. {missing} does not exist")

    assert not missing.exists(), message


def test_target_that_is_not_a_delta_table(spark: Any, tmp_path: Path) -> None:
    _, source = tables(tmp_path, [(1, "a")], kv([(1, "b")]))
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(kv([(1, "a")]), plain / "part-0.parquet")

    fails(spark, plain, spec(plain, source, UPSERT), MergeAnalysisError,
          f"{plain} is not a Delta table")

    assert not (plain / "_delta_log").exists()


def test_missing_source_path(spark: Any, tmp_path: Path) -> None:
    target, _ = tables(tmp_path, [(1, "a")], kv([(1, "b")]))
    missing = tmp_path / "no-source"

    fails(spark, target, spec(target, missing, UPSERT), MergeAnalysisError,
          f"Cannot read the source {missing} as parquet")
    delta_source = {"uri": str(missing), "format": "delta", "version": 0}
    fails(spark, target, spec(target, delta_source, UPSERT), MergeAnalysisError,
          "Cannot read the Delta source (source.uri)", f"{missing} does not exist")


def test_bad_source_query(spark: Any, tmp_path: Path) -> None:
    target, _ = tables(tmp_path, [(1, "a")], kv([(1, "b")]))
    query = {"query": "SELECT id, v FROM no_such_view_anywhere"}

    fails(spark, target, spec(target, query, UPSERT), MergeAnalysisError,
          "source.query", "no_such_view_anywhere")


# -- run-time failures ----------------------------------------------------------------------------------
def test_malformed_string_into_int_fails_at_run_time_under_ansi(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int32())])
    target = tmp_path / "t"
    write_deltalake(str(target), pa.Table.from_pylist([{"id": 1, "n": 1}], schema=schema))
    source = tmp_path / "s"
    source.mkdir()
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "n": ["7", "abc"]})
    pq.write_table(rows, source / "part-0.parquet")
    keys = ("spark.sql.ansi.enabled", "spark.sql.shuffle.partitions", "spark.sql.storeAssignmentPolicy")
    confs = {key: spark.conf.get(key, None) for key in keys}

    fails(spark, target, spec(target, source, UPSERT), MergeJobError, "'abc'", "INT", "malformed")

    assert sorted(map(tuple, read_rows(target))) == [(1, 1)]
    assert {key: spark.conf.get(key, None) for key in keys} == confs  # restored after a failure too
