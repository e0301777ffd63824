"""Delta itself (delta-spark's JVM, with Hadoop's S3A connector) on the test S3 server: it creates, writes,
merges and reads a table at the ``s3://`` URIs the job and deltalake use, and deltalake reads the same rows.
And what its commit does when the version it writes already exists, committed by deltalake meanwhile:
Delta's S3 log store (``S3SingleDriverLogStore``) lists the log first, so a commit already there makes
Delta check for a conflict and retry on top or fail, never overwrite; but its upload is an unconditional
PUT, so a commit landing between that check and the upload is overwritten (the store is for one driver).

Delta runs in a session of its own process, one for the module (tests/support/delta_on_s3.py says why).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.support.delta_on_s3 import DeltaOnS3, DeltaOnS3Error, start_delta_on_s3
from tests.support.delta_spark import delta_s3_session_confs
from tests.support.object_store_fixtures import own_s3_server  # noqa: F401  (the fixture s3_server, own)
from tests.support.s3_server import REGION, S3Server


@pytest.fixture(scope="module")
def delta(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeltaOnS3]:
    key = s3_server.admin
    confs = delta_s3_session_confs(s3_server.endpoint, key.access_key_id, key.secret_access_key, REGION)
    process = start_delta_on_s3(confs, tmp_path_factory.mktemp("delta-on-s3") / "delta.log")
    yield process
    process.stop()


def rows(uri: str, server: S3Server) -> list[tuple[Any, ...]]:
    """The table's rows as deltalake reads them, sorted."""
    table = DeltaTable(uri, storage_options=server.storage_options()).to_pyarrow_table()
    return sorted(tuple(row.values()) for row in table.to_pylist())


def kv(pairs: list[tuple[int, str]]) -> pa.Table:
    return pa.table({"id": pa.array([k for k, _ in pairs], pa.int64()), "v": [v for _, v in pairs]})


def commit(server: S3Server, bucket: str, table: str, version: int) -> list[dict[str, Any]]:
    """The actions of commit ``version``, read from the server."""
    key = f"{table}/_delta_log/{version:020d}.json"
    body = server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    return [json.loads(line) for line in body.splitlines()]


def commit_info(server: S3Server, bucket: str, table: str, version: int) -> dict[str, Any]:
    return next(a["commitInfo"] for a in commit(server, bucket, table, version) if "commitInfo" in a)


def test_delta_creates_writes_merges_and_reads_a_table_on_s3_and_deltalake_reads_the_same_rows(
    delta: DeltaOnS3, s3_server: S3Server, bucket: str
) -> None:
    uri = f"s3://{bucket}/t"
    delta.sql(f"CREATE TABLE delta.`{uri}` (id BIGINT, v STRING) USING delta")
    delta.sql(f"INSERT INTO delta.`{uri}` VALUES (1, 'a'), (2, 'b')")
    delta.sql(
        f"MERGE INTO delta.`{uri}` t USING (SELECT * FROM VALUES (2, 'B'), (3, 'c') AS s(id, v)) s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )

    expected = [(1, "a"), (2, "B"), (3, "c")]
    assert [(r["id"], r["v"]) for r in delta.sql(f"SELECT * FROM delta.`{uri}` ORDER BY id")] == expected
    # s3a:// is the same table through the same connector.
    assert [(r["id"], r["v"]) for r in delta.sql(f"SELECT * FROM delta.`s3a://{bucket}/t` ORDER BY id")] == (
        expected
    )
    assert rows(uri, s3_server) == expected
    history = DeltaTable(uri, storage_options=s3_server.storage_options()).history()
    operations = [(h["version"], h["operation"]) for h in history]
    assert operations == [(2, "MERGE"), (1, "WRITE"), (0, "CREATE TABLE")]
    assert commit_info(s3_server, bucket, "t", 2)["engineInfo"].startswith("Apache-Spark/")
    # Delta gives s3:// the log store it gives s3a://, without a conf of ours.
    assert delta.log_store(uri) == "io.delta.storage.S3SingleDriverLogStore"


def test_the_s3_key_is_on_no_command_line_and_in_no_environment(
    delta: DeltaOnS3, s3_server: S3Server
) -> None:
    secret = s3_server.admin.secret_access_key.encode()
    jvm = delta.jvm_pid()
    for pid in (delta.pid, jvm):
        for what in ("cmdline", "environ"):
            assert secret not in Path(f"/proc/{pid}/{what}").read_bytes(), (pid, what)
    # The session's other confs are on its JVM's command line (pyspark's builder passes each as --conf):
    # where the key would be, had it gone through the builder.
    endpoint_conf = f"spark.hadoop.fs.s3a.endpoint={s3_server.endpoint}".encode()
    assert endpoint_conf in Path(f"/proc/{jvm}/cmdline").read_bytes()


def test_a_version_deltalake_committed_meanwhile_makes_a_blind_append_commit_on_top_of_it(
    delta: DeltaOnS3, s3_server: S3Server, bucket: str
) -> None:
    uri = f"s3://{bucket}/t"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options)
    gate = delta.gate()
    # Delta's transaction reads version 0, then waits (gated) while computing the rows it appends.
    insert = f"INSERT INTO delta.`{uri}` SELECT gated(id), v FROM VALUES (10, 'x') AS s(id, v)"
    delta.start("sql", gate=gate, statement=insert)
    gate.wait_until_delta_waits()
    write_deltalake(uri, kv([(3, "c")]), mode="append", storage_options=options)  # version 1
    gate.open()
    delta.reply()

    # Delta found version 1 there, checked deltalake's append against its own (no conflict: it read
    # nothing) and committed as version 2; deltalake's commit is intact.
    assert commit_info(s3_server, bucket, "t", 1)["engineInfo"].startswith("delta-rs")
    assert commit_info(s3_server, bucket, "t", 2)["readVersion"] == 0
    assert DeltaTable(uri, storage_options=options).version() == 2
    assert rows(uri, s3_server) == [(1, "a"), (2, "b"), (3, "c"), (10, "x")]


def test_a_version_deltalake_committed_meanwhile_fails_a_delete_that_should_have_read_its_rows(
    delta: DeltaOnS3, s3_server: S3Server, bucket: str
) -> None:
    uri = f"s3://{bucket}/t"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options)
    gate = delta.gate()
    # Delta's DELETE reads version 0 and waits (gated) while it scans for the rows to delete.
    delta.start("sql", gate=gate, statement=f"DELETE FROM delta.`{uri}` WHERE gated(id) = 1")
    gate.wait_until_delta_waits()
    write_deltalake(uri, kv([(3, "c")]), mode="append", storage_options=options)  # version 1
    gate.open()
    with pytest.raises(DeltaOnS3Error) as conflict:
        delta.reply()

    assert conflict.value.java_class == "io.delta.exceptions.ConcurrentAppendException"
    assert conflict.value.error_class == "DELTA_CONCURRENT_APPEND.WITHOUT_HINT"
    assert "committed at version 1" in conflict.value.message
    assert DeltaTable(uri, storage_options=options).version() == 1
    assert commit_info(s3_server, bucket, "t", 1)["engineInfo"].startswith("delta-rs")
    assert rows(uri, s3_server) == [(1, "a"), (2, "b"), (3, "c")]


def test_a_commit_landing_between_the_log_stores_check_and_its_upload_is_overwritten(
    delta: DeltaOnS3, s3_server: S3Server, bucket: str
) -> None:
    uri = f"s3://{bucket}/t"
    options = s3_server.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    version_1 = f"{uri}/_delta_log/{1:020d}.json"
    delta_commit = json.dumps({"commitInfo": {"timestamp": 1_700_000_000_000, "operation": "WRITE",
                                              "engineInfo": "delta-log-store-write"}})  # fmt: skip
    gate = delta.gate()
    # The store checks that version 1 does not exist, opens S3A's stream, then waits (gated) at its
    # first line; S3A uploads when the stream closes.
    delta.start("log_store_write", gate=gate, path=version_1, lines=[delta_commit])
    gate.wait_until_delta_waits()
    write_deltalake(uri, kv([(2, "b")]), mode="append", storage_options=options)  # version 1
    assert rows(uri, s3_server) == [(1, "a"), (2, "b")]
    gate.open()
    delta.reply()

    # The upload replaced deltalake's commit: its row is lost (its data file is left unreferenced).
    assert commit(s3_server, bucket, "t", 1) == [json.loads(delta_commit)]
    assert rows(uri, s3_server) == [(1, "a")]
    # Once the version is there before the check, the store refuses to write it.
    with pytest.raises(DeltaOnS3Error) as refused:
        delta.log_store_write(version_1, [delta_commit])
    assert refused.value.java_class == "java.nio.file.FileAlreadyExistsException"
