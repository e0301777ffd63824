"""Type widening (the ``typeWidening`` table feature) against Delta 4.4 itself, on copies of one table Delta
wrote: every widening Delta's ALTER TABLE applies (byte to short, int and long, short to int, int to long,
float to double, a wider decimal, int to decimal and to double, inside a struct, an array and a map), with
files written before and after the changes; the job and Delta's own MERGE run the same statement on two
copies and must leave the same rows, read back by Delta and by DuckDB's delta-kernel reader. Then schema
evolution: on a table with ``delta.enableTypeWidening`` a wider source type widens the column and records
``delta.typeChanges`` exactly as Delta's MERGE does; without the property the type is kept, as Delta keeps
it. deltalake (delta-rs) cannot open such tables (it lacks the reader feature), so it reads none here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.delta_reader import read_rows_with_kernel

COLUMNS = (
    "id BIGINT, b TINYINT, s SMALLINT, i INT, f FLOAT, dec DECIMAL(5,2), idec INT, idbl INT, "
    "st STRUCT<x: INT>, arr ARRAY<INT>, m MAP<INT, FLOAT>"
)
NARROW_ROWS = (
    "SELECT id, CAST(id AS TINYINT), CAST(id * 100 AS SMALLINT), CAST(id * 100000 AS INT), "
    "CAST(id / 3 AS FLOAT), CAST(id * 1.25 AS DECIMAL(5,2)), CAST(id AS INT), CAST(id AS INT), "
    "named_struct('x', CAST(id AS INT)), array(CAST(id AS INT)), map(CAST(id AS INT), CAST(id / 7 AS FLOAT)) "
    "FROM range(1, 7)"
)
WIDENINGS = (
    "b TYPE SMALLINT", "b TYPE INT", "b TYPE BIGINT", "s TYPE INT", "i TYPE BIGINT", "f TYPE DOUBLE",
    "dec TYPE DECIMAL(10,4)", "idec TYPE DECIMAL(12,2)", "idbl TYPE DOUBLE", "st.x TYPE BIGINT",
    "arr.element TYPE BIGINT", "m.key TYPE BIGINT", "m.value TYPE DOUBLE",
)
WIDE_ROW = (
    "SELECT 10, 10, 1000, 10000000000, 1.5, 1.2345, 12.5, 0.5, named_struct('x', 9999999999), "
    "array(9999999999), map(9999999999, 2.5)"
)


def _schema_in_log(table: Path) -> dict[str, Any]:
    """The table's schema as its log states it (the last metaData action), field metadata included."""
    schema: dict[str, Any] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                schema = json.loads(action["metaData"]["schemaString"])
    return schema


def _rows(spark: Any, table: Path) -> list[Any]:
    return sorted(spark.read.format("delta").load(str(table)).collect())


def _merge_both(
    spark: Any, table: Path, tmp_path: Path, merge_sql: str, source: Any, *, evolve: bool = False
) -> tuple[Path, Path, dict[str, Any] | Exception, Exception | None]:
    """``merge_sql`` run by the job and by Delta's MERGE on two copies of ``table``: (the job's copy,
    Delta's copy, the job's metrics or error, Delta's error or None)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import MergeJobError

    job, delta = tmp_path / "job", tmp_path / "delta"
    shutil.copytree(table, job)
    shutil.copytree(table, delta)
    source_dir = tmp_path / "source"
    source.write.parquet(str(source_dir))
    spec = {"target": {"uri": str(job)}, "source": {"uri": str(source_dir), "format": "parquet"},
            "merge_sql": merge_sql, "options": {"schema_evolution": evolve}}  # fmt: skip
    outcome: dict[str, Any] | Exception
    try:
        outcome = run_merge(spark, spec).to_dict()
    except MergeJobError as refused:
        outcome = refused
    spark.read.parquet(str(source_dir)).createOrReplaceTempView("source")
    evolution = "MERGE WITH SCHEMA EVOLUTION INTO" if evolve else "MERGE INTO"
    delta_error: Exception | None = None
    try:
        spark.sql(merge_sql.replace("MERGE INTO target", f"{evolution} delta.`{delta}`")).collect()
    except (Py4JJavaError, PySparkException) as failed:
        delta_error = failed
    finally:
        spark.catalog.dropTempView("source")
    return job, delta, outcome, delta_error


@pytest.fixture(name="widened_table")
def fixture_widened_table(spark: Any, tmp_path: Path) -> Path:
    """Delta's table: six rows in the narrow types, every widening, then one row in the wide types."""
    table = tmp_path / "widened"
    name = f"delta.`{table}`"
    properties = "TBLPROPERTIES ('delta.enableTypeWidening'='true')"
    spark.sql(f"CREATE TABLE {name} ({COLUMNS}) USING delta {properties}")
    spark.sql(f"INSERT INTO {name} {NARROW_ROWS}")
    for widening in WIDENINGS:
        spark.sql(f"ALTER TABLE {name} ALTER COLUMN {widening}")
    spark.sql(f"INSERT INTO {name} {WIDE_ROW}")
    return table


def test_rows_of_files_written_before_the_widening_are_read_up_cast_and_merged_as_delta_merges_them(
    spark: Any, tmp_path: Path, widened_table: Path
) -> None:
    # Matches in the old files and the new one; a condition on a widened column, whose old files' statistics
    # are in the narrower type, must not skip a file that holds a match.
    source = spark.sql(
        "SELECT CAST(id AS BIGINT) AS id, CAST(id AS BIGINT) * 1000000000 AS i, CAST(id / 4 AS DOUBLE) AS f "
        "FROM VALUES (2), (5), (10), (11) AS v(id)"
    )
    merge_sql = (
        "MERGE INTO target t USING source s ON t.id = s.id AND t.i >= 200000 "
        "WHEN MATCHED THEN UPDATE SET i = s.i, f = s.f, dec = t.dec + 1 "
        "WHEN NOT MATCHED THEN INSERT (id, i, f, idec) VALUES (s.id, s.i, s.f, 7.25)"
    )
    job, delta, metrics, delta_error = _merge_both(spark, widened_table, tmp_path, merge_sql, source)
    assert delta_error is None
    assert isinstance(metrics, dict), metrics
    names = ("numTargetRowsUpdated", "numTargetRowsInserted", "numTargetRowsCopied")
    assert tuple(metrics[name] for name in names) == (3, 1, 4)
    assert _rows(spark, job) == _rows(spark, delta)
    assert len(_rows(spark, job)) == 8
    assert _schema_in_log(job) == _schema_in_log(delta)  # the typeChanges kept
    columns = ["id", "b", "s", "i", "f", "dec", "idec", "idbl"]
    kernel = sorted(tuple(row) for row in read_rows_with_kernel(job, columns=columns))
    assert kernel == sorted(tuple(row[c] for c in columns) for row in _rows(spark, delta))


WIDER_SOURCES = [
    ("b", "INT", "300"),
    ("s", "BIGINT", "70000"),
    ("i", "BIGINT", "5000000000"),
    ("f", "DOUBLE", "1.1"),
    ("dec", "DECIMAL(10,4)", "1.2345"),
    ("idec", "DECIMAL(12,2)", "1.5"),
    ("idbl", "DOUBLE", "0.5"),
    ("i", "DECIMAL(20,0)", "5"),
    ("dec", "DECIMAL(6,1)", "12345.6"),  # fewer scale digits: not wider, the type is kept (and fails)
    ("st", "STRUCT<x: BIGINT>", "named_struct('x', 5000000000)"),
    ("arr", "ARRAY<BIGINT>", "array(5000000000)"),
    ("m", "MAP<BIGINT, DOUBLE>", "map(5000000000, 2.5)"),
]
# Without delta.enableTypeWidening the type is kept: one case of each kind is enough.
CASES = [(*case, True) for case in WIDER_SOURCES] + [
    (*case, False) for case in WIDER_SOURCES if case[0] in ("b", "dec", "arr") and case[1] != "DECIMAL(6,1)"
]


IDS = [f"{c[0]} {c[1]}{'' if c[3] else ' no typeWidening'}" for c in CASES]


@pytest.mark.parametrize(("column", "source_type", "value", "enabled"), CASES, ids=IDS)
def test_schema_evolution_widens_a_column_to_a_wider_source_type_as_delta_does(
    spark: Any, tmp_path: Path, column: str, source_type: str, value: str, enabled: bool
) -> None:
    table = tmp_path / "t"
    properties = "TBLPROPERTIES ('delta.enableTypeWidening'='true')" if enabled else ""
    spark.sql(f"CREATE TABLE delta.`{table}` ({COLUMNS}) USING delta {properties}")
    spark.sql(f"INSERT INTO delta.`{table}` {NARROW_ROWS}")
    source = spark.sql(f"SELECT CAST(id AS BIGINT) AS id, CAST({value} AS {source_type}) AS {column} "
                       "FROM VALUES (2), (9) AS v(id)")  # fmt: skip
    merge_sql = "MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * " \
                "WHEN NOT MATCHED THEN INSERT *"  # fmt: skip
    job, delta, outcome, delta_error = _merge_both(spark, table, tmp_path, merge_sql, source, evolve=True)
    # Both merge, or both refuse, each leaving its copy as it was.
    assert isinstance(outcome, Exception) == (delta_error is not None), (outcome, delta_error)
    assert _schema_in_log(job) == _schema_in_log(delta)
    assert _rows(spark, job) == _rows(spark, delta)
    if delta_error is not None:
        # A value the kept type cannot hold: what a wider type was kept from (or was not wider).
        assert not enabled or (column, source_type) == ("dec", "DECIMAL(6,1)"), delta_error
        assert _rows(spark, job) == _rows(spark, table)
        return
    field = next(f for f in _schema_in_log(job)["fields"] if f["name"] == column)
    assert ("delta.typeChanges" in json.dumps(field)) == enabled


def test_an_arrow_written_narrow_file_is_read_up_cast_to_a_decimal_with_a_scale(
    spark: Any, tmp_path: Path
) -> None:
    """Spark's own Parquet reader refuses an INT32 column for a DECIMAL(10,1) ("Expected decimal(10,1),
    actual INT32"); Delta's reader, and the job's, widen it."""
    from spark_jobs.delta_merge import run_merge

    table = tmp_path / "t"
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, n INT) USING delta "
              "TBLPROPERTIES ('delta.enableTypeWidening'='true')")  # fmt: skip
    spark.sql(f"INSERT INTO delta.`{table}` VALUES (1, 10), (2, 20)")
    spark.sql(f"ALTER TABLE delta.`{table}` ALTER COLUMN n TYPE DECIMAL(11,1)")
    (tmp_path / "s").mkdir()
    pq.write_table(pa.table({"id": pa.array([2, 3], pa.int64())}), tmp_path / "s" / "part-0.parquet")
    merge_sql = ("MERGE INTO target t USING source s ON t.id = s.id "
                 "WHEN MATCHED THEN UPDATE SET n = t.n + 0.5 "
                 "WHEN NOT MATCHED THEN INSERT (id, n) VALUES (s.id, 3.5)")  # fmt: skip
    spec = {"target": {"uri": str(table)}, "source": {"uri": str(tmp_path / "s")}, "merge_sql": merge_sql}
    run_merge(spark, spec)
    rows = sorted((r["id"], float(r["n"])) for r in spark.read.format("delta").load(str(table)).collect())
    assert rows == [(1, 10.0), (2, 20.5), (3, 3.5)]
