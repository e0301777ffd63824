"""A UniForm table on S3 (a real S3 API, moto): the job merges into it and writes its Iceberg metadata
through the table's storage options; pyiceberg reads the merged rows from S3 with its own S3 client, as
deltalake reads the Delta table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyiceberg.table import StaticTable

from spark_jobs.delta_merge.uniform.iceberg_metadata import latest_metadata_location
from tests.integration.object_storage.s3_tables import upload_directory
from tests.integration.object_storage.table_io import merge
from tests.support.delta_reader import read_rows
from tests.support.s3_server import REGION, S3Server
from tests.unit.spark_jobs.test_uniform_tables import _uniform_table


def test_the_iceberg_metadata_of_a_merge_on_s3_is_read_by_pyiceberg_from_s3(
    spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    local = tmp_path / "t"
    _uniform_table(spark, local)  # Delta wrote it; the job merges it where it now lives, on S3
    upload_directory(s3_server.client(), local, bucket, "uniform")
    uri = f"s3://{bucket}/uniform"
    source = tmp_path / "s"
    spark.sql("SELECT id, concat('S', id) v, TIMESTAMP'2024-04-01 00:00:00' ts, array(4) arr, "
              "map('s', array(5)) m, named_struct('a', 6, 'b', array('s')) st, concat('p', id % 2) p "
              "FROM range(4, 8)").write.parquet(str(source))  # fmt: skip
    options = s3_server.storage_options()
    metrics = merge(spark, uri, options, {"uri": str(source)})
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 2)

    location = latest_metadata_location(uri, options)
    assert location is not None
    assert location.startswith(f"s3://{bucket}/uniform/metadata/00000-")
    key = s3_server.admin
    iceberg = StaticTable.from_metadata(location, properties={
        "s3.endpoint": s3_server.endpoint, "s3.access-key-id": key.access_key_id,
        "s3.secret-access-key": key.secret_access_key, "s3.region": REGION,
    })  # fmt: skip
    assert iceberg.properties["delta-version"] == str(metrics["tableVersion"])
    assert {task.file.file_path.split("/", 3)[2] for task in iceberg.scan().plan_files()} == {bucket}
    expected = sorted((r[0], r[1]) for r in read_rows(uri, columns=["id", "v"], storage_options=options))
    assert sorted((r["id"], r["v"]) for r in iceberg.scan().to_arrow().to_pylist()) == expected
    assert [v for _, v in expected] == ["v1", "v2", "v3", "S4", "S5", "S6", "S7"]
