"""Merges into UniForm tables (IcebergCompatV2 with ``delta.universalFormat.enabledFormats=iceberg``) that
Delta on Spark created: the job keeps IcebergCompatV2's writer rules and writes the Iceberg metadata of each
version it commits, which pyiceberg reads back row for row as Delta, DuckDB's Delta extension and
deltalake read the Delta table.

Delta 4.4 itself (without its delta-iceberg module, which is not on Maven Central for 4.4) writes no Iceberg
metadata, so versions Delta commits in between are caught up by the job's next conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable

from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version

COLUMNS = "id BIGINT, v STRING, ts TIMESTAMP, arr ARRAY<INT>, m MAP<STRING, ARRAY<INT>>, " \
          "st STRUCT<a: INT, b: ARRAY<STRING>>, p STRING"  # fmt: skip
UNIFORM = ("'delta.columnMapping.mode'='name', 'delta.enableIcebergCompatV2'='true', "
           "'delta.universalFormat.enabledFormats'='iceberg'")  # fmt: skip
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def _uniform_table(spark: Any, path: Path) -> None:
    spark.sql(f"CREATE TABLE delta.`{path}` ({COLUMNS}) USING delta PARTITIONED BY (p) "
              f"TBLPROPERTIES ({UNIFORM})")
    spark.sql(f"INSERT INTO delta.`{path}` SELECT id, concat('v', id), TIMESTAMP'2024-01-01 00:00:00', "
              "array(1, 2), map('k', array(3)), named_struct('a', 1, 'b', array('x')), concat('p', id % 2) "
              "FROM range(1, 6)")  # fmt: skip


def _iceberg(path: Path) -> StaticTable:
    from spark_jobs.delta_merge.uniform.iceberg_metadata import latest_metadata_location

    location = latest_metadata_location(str(path))
    assert location is not None, f"no Iceberg metadata under {path}/metadata"
    return StaticTable.from_metadata(location)


def _rows(table: Any) -> list[tuple[Any, ...]]:
    """(id, v, arr, st.a, p, tags) per row, sorted, from an Arrow table or a list of dicts."""
    records = table.to_pylist() if hasattr(table, "to_pylist") else table
    return sorted((r["id"], r["v"], r["arr"], r["st"]["a"], r["p"], r.get("tags")) for r in records)


def _delta_rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return _rows([r.asDict(recursive=True) for r in spark.read.format("delta").load(str(path)).collect()])


def _field_ids(fields: Any, prefix: str = "") -> dict[str, int]:
    """The Parquet field id of every field, array element and map key and value (-1 where none)."""
    found: dict[str, int] = {}
    for field in fields:
        name = f"{prefix}{field.name}"
        found[name] = int((field.metadata or {}).get(b"PARQUET:field_id", -1))
        if pa.types.is_struct(field.type):
            found |= _field_ids(list(field.type), f"{name}.")
        elif pa.types.is_map(field.type):
            found |= _field_ids([field.type.key_field, field.type.item_field], f"{name}.")
        elif pa.types.is_list(field.type):
            found |= _field_ids([field.type.value_field], f"{name}.")
    return found


def test_merges_keep_a_uniform_table_iceberg_compatible_and_iceberg_reads_every_version(
    spark: Any, tmp_path: Path
) -> None:
    from spark_jobs.delta_merge import run_merge

    path = tmp_path / "t"
    _uniform_table(spark, path)
    source = tmp_path / "s"
    spark.sql("SELECT id, concat('V', id) v, TIMESTAMP'2024-02-01 00:00:00' ts, array(7) arr, "
              "map('z', array(9)) m, named_struct('a', 2, 'b', array('y')) st, concat('p', id % 2) p, "
              "array(concat('t', id)) tags FROM range(3, 8)").write.parquet(str(source))  # fmt: skip
    spec = {"target": {"uri": str(path)}, "source": {"uri": str(source)}, "merge_sql": UPSERT,
            "options": {"schema_evolution": True}}  # fmt: skip
    metrics = run_merge(spark, spec).to_dict()
    counts = (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["tableVersion"])
    assert counts == (3, 2, 2)

    iceberg = _iceberg(path)
    assert iceberg.properties["delta-version"] == "2"
    assert _rows(iceberg.scan().to_arrow()) == _delta_rows(spark, path)
    assert [f.name for f in iceberg.schema().fields][-1] == "tags"
    # The new array column got an element id, in the schema and in every file the merge wrote, and the
    # partition column is in the files too (IcebergCompatV2's rules).
    log = [json.loads(line) for line in (path / "_delta_log" / f"{2:020d}.json").read_text().splitlines()]
    metadata = next(a["metaData"] for a in log if "metaData" in a)
    tags = next(f for f in json.loads(metadata["schemaString"])["fields"] if f["name"] == "tags")
    (element_id,) = tags["metadata"]["delta.columnMapping.nested.ids"].values()
    assert int(metadata["configuration"]["delta.columnMapping.maxColumnId"]) >= element_id
    partition_column = next(f for f in json.loads(metadata["schemaString"])["fields"] if f["name"] == "p")
    for add in (a["add"] for a in log if "add" in a):
        parquet = pq.read_schema(path / add["path"])
        ids = _field_ids(parquet)
        assert all(field_id >= 0 for field_id in ids.values()), ids
        assert element_id in ids.values()
        assert partition_column["metadata"]["delta.columnMapping.physicalName"] in parquet.names

    # Delta's own MERGE commits a version without Iceberg metadata; the job's next merge catches it up.
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT 1 AS id) s ON t.id = s.id WHEN MATCHED THEN DELETE")
    assert _iceberg(path).properties["delta-version"] == "2"
    delete = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED AND s.id = 7 THEN DELETE"
    metrics = run_merge(spark, spec | {"merge_sql": delete}).to_dict()
    assert (metrics["numTargetRowsDeleted"], metrics["tableVersion"]) == (1, 4)
    iceberg = _iceberg(path)
    assert iceberg.properties["delta-version"] == "4"
    expected = _delta_rows(spark, path)
    assert [row[0] for row in expected] == [2, 3, 4, 5, 6]
    assert _rows(iceberg.scan().to_arrow()) == expected
    assert len(iceberg.metadata.snapshots) == 2
    assert sorted(r[0] for r in read_rows_with_kernel(path, columns=["id"])) == [2, 3, 4, 5, 6]
    assert sorted(r[0] for r in read_rows(path, columns=["id"])) == [2, 3, 4, 5, 6]
    # Iceberg readers prune by the statistics the conversion carried over.
    assert len(list(iceberg.scan(row_filter="id = 3").plan_files())) == 1


def test_a_merge_adding_a_type_iceberg_lacks_is_refused_before_anything_is_written(
    spark: Any, tmp_path: Path
) -> None:
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import MergeAnalysisError

    path = tmp_path / "t"
    _uniform_table(spark, path)
    version = table_version(path)
    source = tmp_path / "s"
    spark.sql("SELECT 9L AS id, parse_json('{\"a\": 1}') AS j").write.parquet(str(source))
    spec = {"target": {"uri": str(path)}, "source": {"uri": str(source)},
            "merge_sql": "MERGE INTO t USING s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *",
            "options": {"schema_evolution": True}}  # fmt: skip
    refusal = "IcebergCompatV2 does not support the data type variant"
    with pytest.raises(MergeAnalysisError, match=refusal) as err:
        run_merge(spark, spec)
    assert err.value.error_class == "DELTA_ICEBERG_COMPAT_VIOLATION.UNSUPPORTED_DATA_TYPE"
    assert table_version(path) == version
    assert not (path / "metadata").exists()


def test_a_merge_on_spark_connect_writes_the_iceberg_metadata_too(
    spark: Any, connect_spark: Any, tmp_path: Path
) -> None:
    """The job on a Spark Connect session (the conversion runs beside the commit, in the client)."""
    from spark_jobs.delta_merge import run_merge

    path = tmp_path / "t"
    _uniform_table(spark, path)
    source = tmp_path / "s"
    spark.sql("SELECT id, concat('C', id) v, TIMESTAMP'2024-03-01 00:00:00' ts, array(5) arr, "
              "map('c', array(6)) m, named_struct('a', 3, 'b', array('c')) st, concat('p', id % 2) p "
              "FROM range(4, 7)").write.parquet(str(source))  # fmt: skip
    spec = {"target": {"uri": str(path)}, "source": {"uri": str(source)}, "merge_sql": UPSERT}
    metrics = run_merge(connect_spark, spec).to_dict()
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 1)
    iceberg = _iceberg(path)
    assert iceberg.properties["delta-version"] == str(metrics["tableVersion"])
    assert _rows(iceberg.scan().to_arrow()) == _delta_rows(spark, path)


@pytest.mark.parametrize(
    "source",
    [
        "SELECT 1L id, 5000000000L n, CAST(3.00 AS DECIMAL(10,2)) d",  # INT to BIGINT: Iceberg's int to long
        "SELECT 1L id, 5 n, CAST(3.000 AS DECIMAL(12,3)) d",  # a scale change Iceberg cannot follow
        "SELECT 1L id, CAST(5.5 AS DOUBLE) n, CAST(3.00 AS DECIMAL(10,2)) d",  # INT to DOUBLE: neither
    ],
    ids=["int-to-long", "decimal-scale", "int-to-double"],
)
def test_schema_evolution_on_a_uniform_table_widens_only_as_iceberg_can_as_delta_does(
    spark: Any, tmp_path: Path, source: str
) -> None:
    """Against Delta's own MERGE WITH SCHEMA EVOLUTION on a copy of the same table (typeWidening on)."""
    import shutil

    from spark_jobs.delta_merge import run_merge

    table = tmp_path / "t"
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, n INT, d DECIMAL(10,2)) USING delta "
              f"TBLPROPERTIES ({UNIFORM}, 'delta.enableTypeWidening'='true')")  # fmt: skip
    spark.sql(f"INSERT INTO delta.`{table}` VALUES (1, 1, 1.00), (2, 2, 2.00)")
    reference = tmp_path / "delta"
    shutil.copytree(table, reference)
    spark.sql(f"MERGE WITH SCHEMA EVOLUTION INTO delta.`{reference}` t USING ({source}) s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET *")  # fmt: skip
    spark.sql(source).write.parquet(str(tmp_path / "s"))
    run_merge(spark, {"target": {"uri": str(table)}, "source": {"uri": str(tmp_path / "s")},
                      "merge_sql": "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *",
                      "options": {"schema_evolution": True}})  # fmt: skip

    def read(path: Path) -> tuple[str, list[tuple[Any, ...]]]:
        frame = spark.read.format("delta").load(str(path))
        return frame.schema.simpleString(), sorted(tuple(r) for r in frame.collect())

    assert read(table) == read(reference)
    iceberg = _iceberg(table)
    widened = read(table)[0].startswith("struct<id:bigint,n:bigint")
    assert str(iceberg.schema().find_field("n").field_type) == ("long" if widened else "int")
    assert sorted(tuple(r.values()) for r in iceberg.scan().to_arrow().to_pylist()) == read(table)[1]
