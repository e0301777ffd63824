"""VARIANT columns (the ``variantType`` table feature) against Delta 4.4 itself: on copies of one table
Delta wrote, with a top-level and a nested VARIANT, the job and Delta's own MERGE run the same statement
(update a VARIANT from the source, a condition on another column, a condition reading a VARIANT, an insert,
copied rows) and must leave the same rows, as Delta reads them. DuckDB's reader cannot hand a VARIANT to
Arrow, and deltalake lacks the feature, so Delta is the reader here; the shredding preview stays refused."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

ROWS = (
    "SELECT id, parse_json(concat('{\"a\": ', id, ', \"tags\": [\"t', id, '\"]}')) AS j, "
    "named_struct('n', id, 'doc', parse_json(concat('[', id, ', null]'))) AS st FROM range(1, 9)"
)
MERGE = (
    "MERGE INTO {target} t USING source s ON t.id = s.id "
    "WHEN MATCHED AND variant_get(t.j, '$.a', 'int') = 2 THEN DELETE "
    "WHEN MATCHED AND s.id > 4 THEN UPDATE SET j = s.j, st.doc = s.j "
    "WHEN NOT MATCHED THEN INSERT (id, j, st) VALUES (s.id, s.j, named_struct('n', s.id, 'doc', s.j))"
)


def _rows(spark: Any, table: Path) -> list[tuple[Any, ...]]:
    read = spark.read.format("delta").load(str(table))
    return sorted(tuple(r) for r in read.selectExpr("id", "to_json(j)", "st.n", "to_json(st.doc)").collect())


@pytest.mark.parametrize("widened", [False, True], ids=["Spark's reader", "pyarrow's reader"])
def test_the_job_merges_variant_columns_as_delta_merges_them(
    spark: Any, tmp_path: Path, widened: bool
) -> None:
    _merge_both_and_compare(spark, spark, tmp_path, widened=widened)


def test_on_spark_connect_the_job_merges_a_widened_table_with_variant_columns_as_delta_does(
    spark: Any, connect_spark: Any, tmp_path: Path
) -> None:
    """The job on a Spark Connect session: files written before the widening read by pyarrow and up-cast,
    VARIANT values from the statement's source written as Delta stores them; Delta merges a copy."""
    _merge_both_and_compare(spark, connect_spark, tmp_path, widened=True)


def _merge_both_and_compare(spark: Any, job_session: Any, tmp_path: Path, *, widened: bool) -> None:
    """Delta (on ``spark``) creates the table and merges one copy; the job (on ``job_session``) the other."""
    from spark_jobs.delta_merge import run_merge

    table = tmp_path / "t"
    # A widened id makes the job read the files with pyarrow, as on object stores.
    widening = "TBLPROPERTIES ('delta.enableTypeWidening'='true')"
    id_type, properties = ("INT", widening) if widened else ("BIGINT", "")
    spark.sql(f"CREATE TABLE delta.`{table}` (id {id_type}, j VARIANT, st STRUCT<n: BIGINT, doc: VARIANT>) "
              f"USING delta {properties}")  # fmt: skip
    spark.sql(f"INSERT INTO delta.`{table}` {ROWS}")
    if widened:
        spark.sql(f"ALTER TABLE delta.`{table}` ALTER COLUMN id TYPE BIGINT")
    job, delta = tmp_path / "job", tmp_path / "delta"
    shutil.copytree(table, job)
    shutil.copytree(table, delta)
    query = ("SELECT id, parse_json(concat('{\"new\": ', id * 10, ', \"nested\": {\"x\": \"', id, "
             "'\"}}')) AS j FROM VALUES (2L), (3L), (6L), (11L) AS v(id)")  # fmt: skip
    # The job's Parquet source cannot hold a VARIANT: the statement's source is a query over a view.
    job_session.sql(query).createOrReplaceTempView("variant_source")
    spec = {"target": {"uri": str(job)}, "source": {"query": "SELECT * FROM variant_source"},
            "merge_sql": MERGE.format(target="target")}  # fmt: skip
    try:
        metrics = run_merge(job_session, spec).to_dict()
        spark.sql(query).createOrReplaceTempView("source")
        spark.sql(MERGE.format(target=f"delta.`{delta}`")).collect()
    finally:
        job_session.catalog.dropTempView("variant_source")
        spark.catalog.dropTempView("source")
    names = ("numTargetRowsDeleted", "numTargetRowsUpdated", "numTargetRowsInserted")
    assert tuple(metrics[name] for name in names) == (1, 1, 1)
    assert _rows(spark, job) == _rows(spark, delta)
    assert len(_rows(spark, job)) == 8


def test_the_shredding_preview_is_still_refused_unchanged(spark: Any, tmp_path: Path) -> None:
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import UnsupportedTableFeatureError
    from tests.support.delta_reader import table_version

    table = tmp_path / "t"
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, j VARIANT) USING delta "
              "TBLPROPERTIES ('delta.feature.variantShredding-preview' = 'supported')")  # fmt: skip
    spark.sql(f"INSERT INTO delta.`{table}` SELECT id, parse_json('1') FROM range(1, 3)")
    version = table_version(table)
    spec = {"target": {"uri": str(table)}, "source": {"query": "SELECT 1L AS id, parse_json('2') AS j"},
            "merge_sql": "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *"}  # fmt: skip
    with pytest.raises(UnsupportedTableFeatureError, match="variantShredding-preview"):
        run_merge(spark, spec)
    assert table_version(table) == version
