"""Whole merges into Delta tables on S3 (a real S3 API, moto, with request signing on), with sources on S3,
on both session kinds (``merge_spark``: the shared local Spark session and a Spark Connect session), neither
of which has a Hadoop S3 connector: the job reads and writes table files with pyarrow. Rows are read back
with deltalake from S3 and with DuckDB's delta-kernel reader from a downloaded copy, which must agree;
commits are checked in the log."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import (
    MergeAnalysisError,
    MergeJobError,
    StorageAuthenticationError,
    StoragePermissionError,
)
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.row_tracking import row_tracking
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from spark_jobs.delta_merge.scan.arrow_scan import is_object_store
from spark_jobs.delta_merge.scan.table_scan import FILE_KEY_COLUMN, scan_files
from tests.integration.object_storage.s3_tables import upload_directory
from tests.integration.object_storage.table_io import UPSERT, kv, merge
from tests.integration.object_storage.table_io import download as shared_download
from tests.integration.object_storage.table_io import table_rows as shared_table_rows
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.s3_server import S3Key, S3Server
from tests.support.table_feature_fixtures import enable_features
from tests.unit.spark_jobs.protocol.test_row_tracking import stable_ids
from tests.unit.spark_jobs.test_pipeline import make_target


def parquet_source(server: S3Server, uri: str, table: pa.Table) -> dict[str, Any]:
    """A Parquet source directory on S3 (one file, and a ``_SUCCESS`` marker Spark's reader skips)."""
    fs = server.arrow_fs()
    base = uri.removeprefix("s3://")
    pq.write_table(table, f"{base}/part-0.parquet", filesystem=fs)
    with fs.open_output_stream(f"{base}/_SUCCESS") as out:
        out.write(b"")
    return {"uri": uri, "format": "parquet", "storage_options": server.storage_options()}


def download(server: S3Server, uri: str, local: Path) -> Path:
    """A copy of the table on local disk, object by object."""
    return shared_download(server.arrow_fs(), uri.removeprefix("s3://"), local)


def table_rows(
    server: S3Server, uri: str, tmp_path: Path, *, kernel_columns: Sequence[str] | None = None
) -> list[tuple[Any, ...]]:
    """Live rows through deltalake on S3, sorted; DuckDB's delta-kernel reader must read the same from a
    downloaded copy (``kernel_columns``: the columns it is compared on)."""
    return shared_table_rows(uri, server.storage_options(), server.arrow_fs(), uri.removeprefix("s3://"),
                             tmp_path, kernel_columns=kernel_columns)  # fmt: skip


def commit(server: S3Server, bucket: str, table: str, version: int) -> list[dict[str, Any]]:
    body = server.client().get_object(Bucket=bucket, Key=f"{table}/_delta_log/{version:020d}.json")["Body"]
    return [json.loads(line) for line in body.read().decode().splitlines() if line.strip()]


@pytest.mark.parametrize("by_position", [False, True], ids=["through-spark", "by-position"])
def test_upsert_from_a_parquet_source_on_s3(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path, by_position: bool,
    request: pytest.FixtureRequest,
) -> None:
    if by_position:  # the touched file's unchanged row copied by a pyarrow task reading and writing S3
        request.getfixturevalue("copy_by_position")
    uri = f"s3://{bucket}/orders"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options)
    write_deltalake(uri, kv([(3, "c")]), mode="append", storage_options=options)
    source = parquet_source(s3_server, f"s3://{bucket}/incoming", kv([(2, "B"), (4, "d")]))

    metrics = merge(merge_spark, uri, options, source)

    assert table_rows(s3_server, uri, tmp_path) == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]
    assert (metrics["numSourceRows"], metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"],
            metrics["numTargetRowsCopied"]) == (2, 1, 1, 1)  # fmt: skip
    actions = commit(s3_server, bucket, "orders", 2)
    assert [a["commitInfo"]["operation"] for a in actions if "commitInfo" in a] == ["MERGE"]
    removed = [a["remove"]["path"] for a in actions if "remove" in a]
    added = [a["add"] for a in actions if "add" in a]
    assert len(removed) == 1
    assert sum(json.loads(a["stats"])["numRecords"] for a in added) == 3
    # By position, the copy is a file of its own; through Spark, one file holds changed and copied rows.
    assert len(added) == (2 if by_position else 1)
    for add in added:  # every added file is on S3 with the size the log gives
        head = s3_server.client().head_object(Bucket=bucket, Key=f"orders/{add['path']}")
        assert head["ContentLength"] == add["size"]


def test_partitioned_table(merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/by_p"
    options = s3_server.storage_options()
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("p", pa.string())])
    # "x y": a partition directory whose name is percent-encoded in add.path.
    write_deltalake(uri, kv([(1, "a", "x y"), (2, "b", "y"), (3, "c", "y")], schema), partition_by=["p"],
                    storage_options=options)  # fmt: skip
    source = parquet_source(s3_server, f"s3://{bucket}/src/data.parquet",
                            kv([(2, "B", "x y"), (4, "d", "z")], schema))  # fmt: skip
    source["uri"] = f"s3://{bucket}/src/data.parquet/part-0.parquet"  # a single file, not a directory

    metrics = merge(merge_spark, uri, options, source)

    assert table_rows(s3_server, uri, tmp_path, kernel_columns=["id", "v", "p"]) == [
        (1, "a", "x y"), (2, "B", "x y"), (3, "c", "y"), (4, "d", "z"),
    ]  # fmt: skip
    # Only y's file, where id 2 was, is rewritten (id 3 copied); id 2 moves to "x y", whose file stays.
    assert metrics["numTargetFilesRemoved"] == 1
    assert metrics["numTargetRowsCopied"] == 1
    adds = [a["add"] for a in commit(s3_server, bucket, "by_p", 1) if "add" in a]
    assert sorted(a["partitionValues"]["p"] for a in adds) == ["x y", "y", "z"]
    assert {a["path"].split("/")[0] for a in adds} == {"p=x%20y", "p=y", "p=z"}


@pytest.mark.parametrize("layout", ["column_mapped", "partitioned"])
def test_the_arrow_reader_gives_what_spark_reads_from_the_same_table_on_disk(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path, layout: str
) -> None:
    # Everything the reader must get right: column mapping (a nested field too) or a partition with a
    # space, deletion vectors (in a file and inline), row tracking with ids materialized by a merge.
    local = tmp_path / "local"
    point = pa.struct([("x", pa.int64())])
    schema = pa.schema([
        ("id", pa.int64()), ("my v", pa.string()), ("pt", point), ("at", pa.timestamp("us", "UTC")),
        ("amount", pa.decimal128(10, 2)), ("day", pa.date32()), ("p", pa.string()),
    ])  # fmt: skip
    at = dt.datetime(2024, 6, 1, 12, 30, tzinfo=dt.timezone.utc)
    data = kv([(i, f"v{i}", {"x": i}, at + dt.timedelta(hours=i), Decimal(i) / 4, at.date(),
                "a b" if i < 4 else "c") for i in range(8)], schema)  # fmt: skip
    if layout == "partitioned":
        write_deltalake(str(local), data, partition_by=["p"])
    else:  # two files, as the two partitions would be
        for half in (data.slice(0, 4), data.slice(4)):
            write_deltalake(str(local), half, mode="append",
                            configuration={"delta.columnMapping.mode": "name"})  # fmt: skip
    enable_features(local, row_tracking=True)
    source = tmp_path / "src.parquet"
    pq.write_table(kv([(1, "V1", {"x": 10}, at, Decimal("9.99"), None, "c")], schema), source)
    spec = {"target": {"uri": str(local)}, "source": {"uri": str(source)}, "merge_sql": UPSERT}
    run_merge(merge_spark, spec)
    # The rewritten file of ids 0, 2, 3 (materialized row ids) and the untouched one of ids 4-7.
    counts = {f.path: f.stats.num_records if f.stats else None for f in load_snapshot(str(local)).files}
    files = sorted((path for path, n in counts.items() if (n or 0) > 1), key=lambda path: counts[path] or 0)
    add_deletion_vectors(local, {files[0]: ([0, 2], "u"), files[1]: ([1], "i")})
    upload_directory(s3_server.client(), local, bucket, "same")
    on_disk = load_snapshot(str(local))
    on_s3 = load_snapshot(f"s3://{bucket}/same", storage_options=s3_server.storage_options())
    assert (on_disk.version, len(on_disk.files)) == (on_s3.version, len(on_s3.files))
    assert on_s3.column_mapping_mode == ("name" if layout == "column_mapped" else "none")

    def scanned(snapshot: Any) -> tuple[Any, list[str]]:
        tracking = row_tracking(snapshot)
        df = scan_files(merge_spark, snapshot, snapshot.files, with_file_key=True, row_tracking=tracking)
        root = _root_key(snapshot)
        rows = [{**r.asDict(recursive=True), FILE_KEY_COLUMN: r[FILE_KEY_COLUMN].removeprefix(root)}
                for r in df.collect()]  # fmt: skip
        return df.schema, sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)

    disk_schema, disk_rows = scanned(on_disk)
    s3_schema, s3_rows = scanned(on_s3)
    assert [(f.name, f.dataType) for f in s3_schema] == [(f.name, f.dataType) for f in disk_schema]
    assert s3_rows == disk_rows
    assert len(disk_rows) == 8 - 3  # two rows of one file and one of the other deleted


def _root_key(snapshot: Any) -> str:
    """The file key prefix of the table root: keys on disk and on S3 differ only in it."""
    probe = LiveFile(path="x", size=0, partition_values={}, stats=None, modification_time=0)
    return snapshot.file_key(probe).removesuffix("/x")


def test_change_data_feed(merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/feed"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options,
                    configuration={"delta.enableChangeDataFeed": "true"})  # fmt: skip
    source = parquet_source(s3_server, f"s3://{bucket}/src", kv([(2, "B"), (3, "c")]))

    merge(merge_spark, uri, options, source)

    assert table_rows(s3_server, uri, tmp_path) == [(1, "a"), (2, "B"), (3, "c")]
    feed = DeltaTable(uri, storage_options=options).load_cdf(starting_version=1, ending_version=1)
    table = pa.table(feed.read_all())
    changes = sorted((r["id"], r["v"], r["_change_type"]) for r in table.to_pylist())
    assert changes == [(2, "B", "update_postimage"), (2, "b", "update_preimage"), (3, "c", "insert")]
    cdc = [a["cdc"] for a in commit(s3_server, bucket, "feed", 1) if "cdc" in a]
    assert cdc
    assert all(a["path"].startswith("_change_data/") for a in cdc)


@pytest.mark.usefixtures("copy_on_write")  # merge-on-read on S3: test_s3_merge_on_read.py
def test_table_with_deletion_vectors(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write_deltalake(str(local), pa.table({"id": pa.array(range(6), pa.int64()), "p": ["a"] * 3 + ["b"] * 3}),
                    partition_by=["p"])  # fmt: skip
    paths = {f.partition_values["p"]: f.path for f in load_snapshot(str(local)).files}
    add_deletion_vectors(local, {paths["a"]: ([0, 2], "u"), paths["b"]: ([1], "i")})
    upload_directory(s3_server.client(), local, bucket, "dv")
    uri = f"s3://{bucket}/dv"
    options = s3_server.storage_options()
    schema = pa.schema([("id", pa.int64()), ("p", pa.string())])
    # Vectors delete ids 0 and 2 (file a) and 4 (file b): the source's 0 and 4 are inserts, 3 an update.
    source = parquet_source(s3_server, f"s3://{bucket}/src", kv([(0, "b"), (3, "a"), (4, "a")], schema))

    metrics = merge(merge_spark, uri, options, source, sql="""MERGE INTO t USING s ON t.id = s.id
        WHEN MATCHED THEN UPDATE SET p = s.p WHEN NOT MATCHED THEN INSERT *""")

    assert table_rows(s3_server, uri, tmp_path, kernel_columns=["id", "p"]) == [
        (0, "b"), (1, "a"), (3, "a"), (4, "a"), (5, "b"),
    ]  # fmt: skip
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 2)
    # File b is rewritten without its deleted row: only 5 is copied, 4 does not come back.
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsCopied"]) == (1, 1)


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapped_table(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path, mode: str
) -> None:
    uri = f"s3://{bucket}/mapped"
    options = s3_server.storage_options()
    point = pa.struct([("x", pa.int64())])
    schema = pa.schema([("id", pa.int64()), ("my value", pa.string()), ("pt", point)])
    rows = [(1, "a", {"x": 10}), (2, "b", {"x": 20})]
    write_deltalake(uri, kv(rows, schema), storage_options=options,
                    configuration={"delta.columnMapping.mode": mode})  # fmt: skip
    source = parquet_source(s3_server, f"s3://{bucket}/src",
                            kv([(2, "B", {"x": 21}), (3, "c", None)], schema))  # fmt: skip

    merge(merge_spark, uri, options, source)

    assert table_rows(s3_server, uri, tmp_path) == [(1, "a", {"x": 10}), (2, "B", {"x": 21}), (3, "c", None)]
    adds = [a["add"] for a in commit(s3_server, bucket, "mapped", 1) if "add" in a]
    data = pq.read_schema(f"{bucket}/mapped/{adds[0]['path']}", filesystem=s3_server.arrow_fs())
    assert all(name.startswith("col-") for name in data.names)  # physical names in the files


def test_row_tracking_keeps_ids_across_merges(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    local = make_target(tmp_path / "local", kv([(1, "a"), (2, "b"), (3, "c")]), kv([(4, "d"), (5, "e")]))
    enable_features(local, row_tracking=True)
    upload_directory(s3_server.client(), local, bucket, "tracked")
    uri = f"s3://{bucket}/tracked"
    options = s3_server.storage_options()

    def ids_after(merged: dict[str, Any], copy: str) -> dict[int, tuple[int, int]]:
        table = download(s3_server, uri, tmp_path / copy)
        assert merged["tableVersion"] == DeltaTable(str(table)).version()
        return stable_ids(table)

    before = stable_ids(local)
    first_source = parquet_source(s3_server, f"s3://{bucket}/s1", kv([(2, "B"), (6, "f")]))
    first = merge(merge_spark, uri, options, first_source)
    after_first = ids_after(first, "after-first")
    # The rewrite materialized the ids of the copied rows 1 and 3; the second merge reads them back.
    second = merge(merge_spark, uri, options, parquet_source(s3_server, f"s3://{bucket}/s2", kv([(3, "C")])))
    after_second = ids_after(second, "after-second")

    assert {k: before[k] for k in (1, 3, 4, 5)} == {k: after_first[k] for k in (1, 3, 4, 5)}
    assert after_first[2] == (before[2][0], first["tableVersion"])
    assert after_first[6][0] > max(row_id for row_id, _ in before.values())
    assert after_second[3] == (before[3][0], second["tableVersion"])
    assert {k: after_second[k] for k in (1, 2, 4, 5, 6)} == {k: after_first[k] for k in (1, 2, 4, 5, 6)}
    expected = [(1, "a"), (2, "B"), (3, "C"), (4, "d"), (5, "e"), (6, "f")]
    assert table_rows(s3_server, uri, tmp_path) == expected


def test_delta_source_on_s3(merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/target"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options)
    source_uri = f"s3://{bucket}/changes"
    write_deltalake(source_uri, kv([(2, "old")]), storage_options=options)
    write_deltalake(source_uri, kv([(2, "B"), (3, "c")]), mode="overwrite", storage_options=options)

    metrics = merge(merge_spark, uri, options, {"uri": source_uri, "format": "delta", "version": 1,
                                          "storage_options": options})  # fmt: skip

    assert table_rows(s3_server, uri, tmp_path) == [(1, "a"), (2, "B"), (3, "c")]
    assert metrics["numSourceRows"] == 2
    assert metrics["materializeSourceReason"] == "NOT_MATERIALIZED_AUTO"


def test_idempotent_rerun_with_an_app_id_is_skipped(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    uri = f"s3://{bucket}/once"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    source = parquet_source(s3_server, f"s3://{bucket}/src", kv([(1, "A"), (2, "b")]))
    run = {"app_id": "nightly-load", "app_version": 7}

    first = merge(merge_spark, uri, options, source, run=run)
    second = merge(merge_spark, uri, options, source, run=run)

    assert (first["skipped"], second["skipped"]) == (False, True)
    assert DeltaTable(uri, storage_options=options).version() == 1
    assert table_rows(s3_server, uri, tmp_path) == [(1, "A"), (2, "b")]


def test_a_csv_source_on_s3_is_refused_naming_the_connector(
    merge_spark: Any, s3_server: S3Server, bucket: str
) -> None:
    uri = f"s3://{bucket}/t"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    s3_server.client().put_object(Bucket=bucket, Key="src/data.csv", Body=b"id,v\n1,A\n")
    source = {"uri": f"s3://{bucket}/src", "format": "csv", "options": {"header": "true"},
              "storage_options": options}  # fmt: skip

    with pytest.raises(MergeAnalysisError) as raised:
        merge(merge_spark, uri, options, source)

    # The Hadoop version pyspark ships, from its jar's name (the session's JVM is not at hand on Connect).
    (client_jar,) = Path(pyspark.__file__).parent.glob("jars/hadoop-client-api-*.jar")
    version = client_jar.stem.removeprefix("hadoop-client-api-")
    assert f"org.apache.hadoop:hadoop-aws:{version}" in str(raised.value)
    assert "--packages" in str(raised.value)
    assert DeltaTable(uri, storage_options=options).version() == 0


@pytest.mark.parametrize(
    ("where", "path", "connector"),
    [
        ("source.query", "s3://landing/orders", "org.apache.hadoop:hadoop-aws:"),
        ("USING query", "abfss://landing@acct.dfs.core.windows.net/t", "org.apache.hadoop:hadoop-azure:"),
        ("USING query", "gs://landing/orders", "com.google.cloud.bigdataoss:gcs-connector:"),
    ],
)
def test_spark_reading_an_object_store_path_in_a_query_is_refused_naming_the_connector(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path, where: str, path: str, connector: str
) -> None:
    uri = f"s3://{bucket}/t"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    if where == "source.query":
        source: dict[str, Any] = {"query": f"SELECT * FROM parquet.`{path}`"}
        sql = UPSERT
    else:
        local = tmp_path / "local.parquet"
        pq.write_table(kv([(1, "A")]), local)
        source = {"uri": str(local), "format": "parquet"}
        both = f"SELECT * FROM parquet.`{path}` UNION ALL SELECT * FROM source"
        sql = UPSERT.replace("USING s", f"USING ({both}) s")

    with pytest.raises(MergeAnalysisError) as raised:
        merge(merge_spark, uri, options, source, sql)

    message = str(raised.value)
    assert message.startswith("source.query" if where == "source.query" else "merge_sql: the USING query")
    assert f"reads a {path.partition(':')[0]}:// path" in message
    assert connector in message
    assert "--packages" in message
    assert "source.uri" in message
    assert DeltaTable(uri, storage_options=options).version() == 0


def test_a_hive_partitioned_parquet_source_on_s3_reads_as_sparks_reader_reads_it(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    from spark_jobs.delta_merge.source.object_store import read_object_store_parquet
    from spark_jobs.delta_merge.spec import SourceSpec

    fs = s3_server.arrow_fs()
    local = tmp_path / "landing"
    # Typed from the names as Spark types them: a date, an int with Hive's NULL directory, an escaped
    # string, and a column that is also in the files (its value comes from the directory).
    layout = {
        "day=2024-01-01/n=1/tag=a%2Fb/v=x": [(1, "a")],
        "day=2024-01-01/n=__HIVE_DEFAULT_PARTITION__/tag=c%3Dd/v=y": [(2, "b"), (3, "c")],
        "day=2024-01-02/n=20/tag=plain/v=z": [(4, "d")],
    }
    for directory, rows in layout.items():
        (local / directory).mkdir(parents=True)
        for root, filesystem in ((f"{bucket}/landing", fs), (str(local), None)):
            pq.write_table(kv(rows), f"{root}/{directory}/part-0.parquet", filesystem=filesystem)
    fs.open_output_stream(f"{bucket}/landing/_SUCCESS").close()
    # A file beside the partition directories, which Spark's reader leaves out.
    for root, filesystem in ((f"{bucket}/landing", fs), (str(local), None)):
        pq.write_table(kv([(9, "stray")]), f"{root}/part-9.parquet", filesystem=filesystem)

    source = SourceSpec(uri=f"s3://{bucket}/landing", format="parquet",
                        storage_options=s3_server.storage_options())  # fmt: skip
    read = read_object_store_parquet(merge_spark, source)
    expected = merge_spark.read.parquet(str(local))

    assert read.schema == expected.schema
    assert read.schema.simpleString() == "struct<id:bigint,v:string,day:date,n:int,tag:string>"
    assert sorted(read.collect()) == sorted(expected.collect())
    assert sorted(tuple(r) for r in read.select("id", "n", "tag").collect()) == [
        (1, 1, "a/b"), (2, None, "c=d"), (3, None, "c=d"), (4, 20, "plain")
    ]


def test_upsert_from_a_hive_partitioned_parquet_source_on_s3(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    uri = f"s3://{bucket}/events"
    options = s3_server.storage_options()
    dated = pa.schema([("id", pa.int64()), ("v", pa.string()), ("day", pa.date32())])
    write_deltalake(uri, pa.table({"id": [1, 2], "v": ["a", "b"], "day": [dt.date(2024, 1, 1)] * 2},
                                  schema=dated), storage_options=options)  # fmt: skip
    fs = s3_server.arrow_fs()
    pq.write_table(kv([(2, "B")]), f"{bucket}/landing/day=2024-01-01/part-0.parquet", filesystem=fs)
    pq.write_table(kv([(3, "c")]), f"{bucket}/landing/day=2024-01-02/part-0.parquet", filesystem=fs)

    metrics = merge(merge_spark, uri, options, {"uri": f"s3://{bucket}/landing", "format": "parquet",
                                          "storage_options": options})  # fmt: skip

    assert (metrics["numSourceRows"], metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (
        2, 1, 1)  # fmt: skip
    assert table_rows(s3_server, uri, tmp_path) == [
        (1, "a", dt.date(2024, 1, 1)), (2, "B", dt.date(2024, 1, 1)), (3, "c", dt.date(2024, 1, 2))
    ]


@pytest.mark.parametrize(
    ("layout", "options", "message"),
    [
        ("empty", {}, "no Parquet file there"),
        ("conflicting", {}, "CONFLICTING_PARTITION_COLUMN_NAMES"),
        ("flat", {"mergeSchema": "true"}, "source.options ['mergeSchema']: these are Spark reader options"),
    ],
)
def test_parquet_sources_on_s3_that_spark_would_not_read_are_refused(
    merge_spark: Any, s3_server: S3Server, bucket: str, layout: str, options: dict[str, str], message: str
) -> None:
    uri = f"s3://{bucket}/t"
    store = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=store)
    source_uri = f"s3://{bucket}/src"
    if layout == "empty":
        s3_server.client().put_object(Bucket=bucket, Key="src/_SUCCESS", Body=b"")
    else:
        parquet_source(s3_server, source_uri, kv([(1, "A")]))
    if layout == "conflicting":  # sibling directories partitioned by different columns
        parquet_source(s3_server, f"{source_uri}/day=1", kv([(2, "B")]))
        parquet_source(s3_server, f"{source_uri}/hour=2", kv([(3, "C")]))

    with pytest.raises(MergeAnalysisError, match=re.escape(message)):
        merge(merge_spark, uri, store, {"uri": source_uri, "format": "parquet", "options": options,
                                  "storage_options": store})  # fmt: skip

    assert DeltaTable(uri, storage_options=store).version() == 0


@pytest.mark.parametrize("side", ["target", "source"])
def test_a_wrong_secret_fails_cleanly_and_leaves_the_table(
    merge_spark: Any,
    s3_server: S3Server,
    bucket: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    side: str,
) -> None:
    uri = f"s3://{bucket}/guarded"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    source = parquet_source(s3_server, f"s3://{bucket}/src", kv([(1, "A")]))
    wrong_secret = "wrong-secret-" + "x" * 20
    wrong = s3_server.storage_options(S3Key(s3_server.admin.access_key_id, wrong_secret))
    caplog.set_level(logging.DEBUG)

    target_options, source_options = (wrong, options) if side == "target" else (options, wrong)

    with pytest.raises(MergeJobError) as raised:
        merge(merge_spark, uri, target_options, {**source, "storage_options": source_options})

    text = f"{raised.value!r} {raised.value}"
    assert (uri if side == "target" else source["uri"]) in str(raised.value)
    # Where the credentials came from. (A HEAD request's 403 has no body to tell a wrong key from a missing
    # permission: either way the message names both, and neither is retried.)
    assert "storage_options (AWS_SECRET_ACCESS_KEY)" in str(raised.value)
    assert type(raised.value) in (StorageAuthenticationError, StoragePermissionError)
    for secret in (wrong_secret, s3_server.admin.secret_access_key):
        assert secret not in text
        assert secret not in caplog.text
    assert DeltaTable(uri, storage_options=options).version() == 0
    assert table_rows(s3_server, uri, tmp_path) == [(1, "a")]


@pytest.mark.parametrize(
    ("uri", "object_store"),
    [
        ("s3://bucket/t", True), ("s3a://bucket/t", True), ("gs://bucket/t", True),
        ("abfss://c@account.dfs.core.windows.net/t", True), ("az://c/t", True),
        ("/data/t", False), ("file:///data/t", False), ("hdfs://namenode/t", False),
    ],
)  # fmt: skip
def test_object_stores_are_read_with_pyarrow_and_hdfs_with_spark(uri: str, object_store: bool) -> None:
    assert is_object_store(uri) is object_store
