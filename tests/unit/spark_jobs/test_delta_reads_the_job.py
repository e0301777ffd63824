"""Delta (delta-spark 4.4, in the shared session) reads what the job writes, and writes after it: the
every-feature table of test_modern_tables (column mapping by name and by id, deletion vectors with
merge-on-read, row tracking, the change data feed, in-commit timestamps, an identity column), merged by the
job, then read by Delta - rows, ``_metadata.row_id`` and ``row_commit_version``, the change feed, ``DESCRIBE
HISTORY`` with the MERGE's metrics - and changed by Delta's own INSERT (the identity mark), MERGE, OPTIMIZE
and VACUUM, each result read back by deltalake and DuckDB's delta-kernel reader as well."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.unit.spark_jobs.test_modern_tables import (  # noqa: F401  (table: the fixture)
    MERGE,
    SOURCE_SCHEMA,
    _read,
    _stable_row_ids,
    table,
)
from tests.unit.spark_jobs.test_pipeline import merge, parquet_source


def _delta_rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    rows = spark.read.format("delta").load(str(path)).select("id", "v", "seq").collect()
    return sorted(tuple(r) for r in rows)


def test_delta_reads_the_jobs_merge_of_every_feature_and_writes_after_it(
    spark: Any, table: Path, tmp_path: Path  # noqa: F811
) -> None:
    source = parquet_source(tmp_path / "s", pa.table({"id": [1, 4, 6, 7], "v": ["A", "x", "f", "g"]},
                                                       schema=SOURCE_SCHEMA))  # fmt: skip
    metrics = merge(spark, table, source, MERGE)
    version = metrics["tableVersion"]
    rows = _read(table)
    assert _delta_rows(spark, table) == rows

    # Row tracking: Delta's row ids and commit versions are the ones the log and files give.
    tracked = spark.sql(f"SELECT id, _metadata.row_id AS row_id, _metadata.row_commit_version AS "
                        f"commit_version FROM delta.`{table}`").collect()  # fmt: skip
    assert {r["id"]: r["row_id"] for r in tracked} == _stable_row_ids(table)
    changed = {r["id"] for r in tracked if r["commit_version"] == version}
    assert changed == {1, 6, 7}

    # The change feed of the merge's version, as Delta reads it.
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(str(table)))  # fmt: skip
    assert sorted((r["id"], r["v"], r["_change_type"]) for r in feed.collect()) == [
        (1, "A", "update_postimage"), (1, "a", "update_preimage"), (4, "d", "delete"), (6, "f", "insert"),
        (7, "g", "insert"),
    ]

    # DESCRIBE HISTORY shows the job's MERGE with its metrics.
    last = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]
    assert (last["version"], last["operation"]) == (version, "MERGE")
    recorded = {k: int(v) for k, v in last["operationMetrics"].items()}
    for name in ("numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted", "numSourceRows"):
        assert recorded[name] == metrics[name], name

    # Delta's own INSERT draws identity values above the mark the job moved.
    mark = max(r[2] for r in rows)
    spark.sql(f"INSERT INTO delta.`{table}` (id, v) VALUES (9, 'i')")
    assert next(r[2] for r in _delta_rows(spark, table) if r[0] == 9) > mark

    # Delta's own MERGE, OPTIMIZE and VACUUM on the job's table; every reader agrees after each.
    spark.createDataFrame([(3, "C"), (10, "j")], "id long, v string").createOrReplaceTempView("delta_source")
    try:
        spark.sql(f"MERGE INTO delta.`{table}` t USING delta_source s ON t.id = s.id WHEN MATCHED THEN "
                  "UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)")
    finally:
        spark.catalog.dropTempView("delta_source")
    expected = [(1, "A"), (3, "C"), (5, "e"), (6, "f"), (7, "g"), (9, "i"), (10, "j")]
    assert [r[:2] for r in _read(table)] == expected
    spark.sql(f"OPTIMIZE delta.`{table}`")
    assert [r[:2] for r in _read(table)] == expected
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert [r[:2] for r in _read(table)] == expected
    assert [r[:2] for r in _delta_rows(spark, table)] == expected

    # And the job merges into what Delta wrote.
    again = parquet_source(tmp_path / "s2", pa.table({"id": [10, 11], "v": ["J", "k"]}, schema=SOURCE_SCHEMA))
    merge(spark, table, again, MERGE)
    assert [r[:2] for r in _delta_rows(spark, table)] == [*expected[:-1], (10, "J"), (11, "k")]
    assert [r[:2] for r in _read(table)] == [*expected[:-1], (10, "J"), (11, "k")]
