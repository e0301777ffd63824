"""The job merges into tables Delta itself writes (delta-spark 4.4, in the shared session), one table
feature each, or refuses the table before anything is written; Delta and DuckDB's delta-kernel reader read
the result.

Delta creates each table with ``CREATE TABLE ... USING delta`` and the feature's properties, inserts five
rows (and, where the feature needs it, deletes one, widens a type or writes a checkpoint), then the job
upserts three rows; on the UniForm table (icebergCompatV2) pyiceberg reads the rows back from the Iceberg
metadata the job wrote (tests/unit/spark_jobs/test_uniform_tables.py has the rest). Type widening is merged
(tests/unit/spark_jobs/test_type_widening.py has the rest). Delta 4.4
does not create collated string columns by default (its type check
refuses them), so collations are not among these tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.delta_reader import read_rows_with_kernel

UPSERT = (
    "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v "
    "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
)
KV = "id BIGINT, v STRING"
# feature: (columns, layout clause, properties, what Delta does after its insert)
TABLES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "plain": (KV, "", "", ()),
    "partitioned": (f"{KV}, p STRING", "PARTITIONED BY (p)", "", ()),
    "deletionVectors": (KV, "", "'delta.enableDeletionVectors'='true'", ("DELETE FROM {t} WHERE id = 2",)),
    "changeDataFeed": (KV, "", "'delta.enableChangeDataFeed'='true'", ()),
    "columnMapping": (KV, "", "'delta.columnMapping.mode'='name'", ()),
    "rowTracking": (KV, "", "'delta.enableRowTracking'='true'", ()),
    "identityColumns": (f"{KV}, seq BIGINT GENERATED ALWAYS AS IDENTITY", "", "", ()),
    "generatedColumns": (f"{KV}, twice BIGINT GENERATED ALWAYS AS (id * 2)", "", "", ()),
    "checkConstraints": (KV, "", "", ("ALTER TABLE {t} ADD CONSTRAINT positive CHECK (id > 0)",)),
    "clustering": (KV, "CLUSTER BY (id)", "", ()),
    "inCommitTimestamp": (KV, "", "'delta.enableInCommitTimestamps'='true'", ()),
    "timestampNtz": (f"{KV}, ts TIMESTAMP_NTZ", "", "", ()),
    "v2Checkpoint": (KV, "", "'delta.checkpointPolicy'='v2', 'delta.checkpointInterval'='2'",
                     ("INSERT INTO {t} (id, v) VALUES (20, 'x')",)),
    "typeWidening": (f"{KV}, n INT", "", "'delta.enableTypeWidening'='true'",
                     ("ALTER TABLE {t} ALTER COLUMN n TYPE BIGINT",)),
    "variantType": (f"{KV}, j VARIANT", "", "", ()),
    "icebergCompatV2": (KV, "", "'delta.columnMapping.mode'='name', 'delta.enableIcebergCompatV2'='true', "
                        "'delta.universalFormat.enabledFormats'='iceberg'", ()),
}  # fmt: skip
VALUES = {
    "id": "id", "v": "concat('v', id)", "p": "concat('p', id % 2)", "n": "CAST(id AS INT)",
    "j": "parse_json(concat('{\"a\": ', id, '}'))", "ts": "TIMESTAMP_NTZ'2024-01-01 00:00:00'",
}  # fmt: skip


def _delta_table(spark: Any, path: Path, feature: str) -> None:
    columns, layout, properties, after = TABLES[feature]
    table = f"delta.`{path}`"
    written = [c.split()[0] for c in columns.split(", ") if "GENERATED" not in c]
    options = f"TBLPROPERTIES ({properties})" if properties else ""
    spark.sql(f"CREATE TABLE {table} ({columns}) USING delta {layout} {options}")
    spark.sql(f"INSERT INTO {table} ({', '.join(written)}) "
              f"SELECT {', '.join(VALUES[c] for c in written)} FROM range(1, 6)")  # fmt: skip
    for statement in after:
        spark.sql(statement.format(t=table))


@pytest.mark.parametrize("feature", list(TABLES))
def test_the_job_merges_into_a_table_delta_wrote_with_the_feature(
    spark: Any, tmp_path: Path, feature: str
) -> None:
    from spark_jobs.delta_merge import run_merge

    path = tmp_path / "t"
    _delta_table(spark, path, feature)
    before = {r["id"]: r["v"] for r in spark.read.format("delta").load(str(path)).collect()}
    (tmp_path / "s").mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 3, 7], pa.int64()), "v": ["A", "C", "G"]}),
                   tmp_path / "s" / "part-0.parquet")  # fmt: skip
    spec = {"target": {"uri": str(path)}, "source": {"uri": str(tmp_path / "s")}, "merge_sql": UPSERT}
    metrics = run_merge(spark, spec).to_dict()
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 1)
    expected = sorted({**before, 1: "A", 3: "C", 7: "G"}.items())
    assert sorted((r["id"], r["v"]) for r in spark.read.format("delta").load(str(path)).collect()) == expected
    if feature != "variantType":  # DuckDB cannot hand a VARIANT column to Arrow
        assert sorted((r[0], r[1]) for r in read_rows_with_kernel(path, columns=["id", "v"])) == expected
    if feature == "icebergCompatV2":
        from pyiceberg.table import StaticTable

        from spark_jobs.delta_merge.uniform.iceberg_metadata import latest_metadata_location

        iceberg = StaticTable.from_metadata(str(latest_metadata_location(str(path))))
        assert sorted((r["id"], r["v"]) for r in iceberg.scan().to_arrow().to_pylist()) == expected


@pytest.mark.parametrize("feature", ["clustering", "v2Checkpoint"])
def test_delta_reads_the_jobs_merges_from_the_jobs_checkpoint_and_merges_and_optimizes_after_them(
    spark: Any, tmp_path: Path, feature: str
) -> None:
    """Delta wrote the table; the job merges twice, one of its commits followed by its checkpoint (a V2
    one, with ``checkpointMetadata``, on a v2Checkpoint table); Delta, its log cache cleared, loads the
    table from that checkpoint, then runs its own MERGE and OPTIMIZE (clustering the files on a clustered
    table) on top."""
    from spark_jobs.delta_merge import run_merge

    path = tmp_path / "t"
    _delta_table(spark, path, feature)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    rows = {r["id"]: r["v"] for r in spark.read.format("delta").load(str(path)).collect()}
    committed = []
    for batch, (ids, values) in enumerate((([1, 3, 7], ["A", "C", "G"]), ([7, 8], ["G2", "H"]))):
        source = tmp_path / f"s{batch}"
        source.mkdir()
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "v": values}), source / "part-0.parquet")
        spec = {"target": {"uri": str(path)}, "source": {"uri": str(source)}, "merge_sql": UPSERT}
        committed.append(run_merge(spark, spec).to_dict()["tableVersion"])
        rows.update(zip(ids, values, strict=True))
    checkpointed = json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"]
    assert checkpointed in committed  # a checkpoint the job wrote, after its commit
    (checkpoint,) = (path / "_delta_log").glob(f"{checkpointed:020d}.checkpoint*.parquet")
    has_metadata = "checkpointMetadata" in pq.read_schema(checkpoint).names
    assert has_metadata == (feature == "v2Checkpoint"), checkpoint.name

    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    read = spark.read.format("delta").load(str(path))
    assert sorted((r["id"], r["v"]) for r in read.collect()) == sorted(rows.items())
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT 9 AS id, 'I' AS v) s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)")
    optimized = spark.sql(f"OPTIMIZE delta.`{path}`").collect()[0]["metrics"]
    assert optimized["numFilesRemoved"] >= 2
    rows[9] = "I"
    history = [r["operation"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
    assert history[:4] == ["OPTIMIZE", "MERGE", "MERGE", "MERGE"]
    expected = sorted(rows.items())
    assert sorted((r["id"], r["v"]) for r in spark.read.format("delta").load(str(path)).collect()) == expected
    assert sorted((r[0], r[1]) for r in read_rows_with_kernel(path, columns=["id", "v"])) == expected
