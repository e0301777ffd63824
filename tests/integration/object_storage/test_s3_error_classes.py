"""Storage failures of whole merges on a real S3 API server (moto, signatures and IAM enforced), each its
own class: a wrong key, a key without write permission and a missing bucket are deterministic (the
provider fails the task without its retries: tests/unit/airflow_merge_provider/test_errors.py); an
unreachable endpoint is retried. Each message names the
table, the operation and where the credentials came from, never the secret; the table is left as it was."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException
from deltalake import DeltaTable, write_deltalake

from airflow_merge_provider.errors import StorageRefusedError
from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import (
    StorageAuthenticationError,
    StorageContainerNotFoundError,
    StorageNetworkError,
    StoragePermissionError,
    TableStorageError,
)
from tests.integration.object_storage.table_io import UPSERT, kv
from tests.integration.object_storage.test_s3_merge import parquet_source, table_rows
from tests.support.s3_server import REGION, S3Server

WRONG_SECRET = "wrong-secret-Zq4Lm8Rt2Vx6Np0Kc"


def _failed_merge(
    spark: Any, uri: str, options: dict[str, str], source: dict[str, Any], caplog: pytest.LogCaptureFixture,
    kind: type[TableStorageError], *, credentials_from: str | None = None,
) -> str:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    spec_target = {"uri": uri, "storage_options": options}
    if credentials_from is not None:
        spec_target["credentials_from"] = credentials_from
    with pytest.raises(kind) as raised:
        run_merge(spark, {"target": spec_target, "source": source, "merge_sql": UPSERT})
    assert type(raised.value) is kind
    return str(raised.value)


@pytest.fixture
def guarded(s3_server: S3Server, bucket: str) -> tuple[str, dict[str, Any]]:
    """A one-row target and a one-row Parquet source on the server, written with the admin key."""
    uri = f"s3://{bucket}/guarded"
    write_deltalake(uri, kv([(1, "a")]), storage_options=s3_server.storage_options())
    return uri, parquet_source(s3_server, f"s3://{bucket}/src", kv([(1, "A"), (2, "b")]))


def _unchanged(s3_server: S3Server, uri: str, tmp_path: Path) -> None:
    options = s3_server.storage_options()
    assert DeltaTable(uri, storage_options=options).version() == 0
    assert table_rows(s3_server, uri, tmp_path) == [(1, "a")]


def test_a_wrong_secret_is_an_authentication_error_naming_the_connection(
    spark: Any, s3_server: S3Server, guarded: tuple[str, dict[str, Any]], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    uri, source = guarded
    wrong = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    message = _failed_merge(spark, uri, wrong, source, caplog, StorageAuthenticationError,
                            credentials_from="aws_conn_id='lake_s3'")  # fmt: skip

    assert message.startswith(f"Reading the Delta log of table {uri} failed: the store did not accept the "
                              "credentials (403 Forbidden, SignatureDoesNotMatch).")  # fmt: skip
    assert "They came from aws_conn_id='lake_s3'" in message
    assert "_last_checkpoint" not in message
    for secret in (WRONG_SECRET, s3_server.admin.secret_access_key):
        assert secret not in message
        assert secret not in caplog.text
    _unchanged(s3_server, uri, tmp_path)


def test_a_read_only_key_is_a_permission_error_when_the_executors_write(
    spark: Any, s3_server: S3Server, guarded: tuple[str, dict[str, Any]], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    uri, source = guarded
    reader = s3_server.storage_options(s3_server.reader)
    # The driver reads the log and the executors the source with the read-only key; the first write fails.
    message = _failed_merge(spark, uri, reader, {**source, "storage_options": s3_server.storage_options()},
                            caplog, StoragePermissionError)  # fmt: skip

    assert message.startswith(f"Reading and writing the data files in Spark's tasks of table {uri} failed: "
                              "the store refused the request (ACCESS_DENIED)")  # fmt: skip
    assert "credentials from storage_options (AWS_SECRET_ACCESS_KEY) may not do this" in message
    assert "s3:PutObject" in message
    assert "Nothing was committed" in message
    assert s3_server.reader.secret_access_key not in message
    _unchanged(s3_server, uri, tmp_path)


def test_a_missing_bucket_is_named(
    spark: Any, s3_server: S3Server, guarded: tuple[str, dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    _, source = guarded
    uri = "s3://no-such-bucket-anywhere/t"
    message = _failed_merge(spark, uri, s3_server.storage_options(), source, caplog,
                            StorageContainerNotFoundError)  # fmt: skip

    assert message.startswith(f"Reading the Delta log of table {uri} failed: the bucket "
                              "'no-such-bucket-anywhere' does not exist (404 Not Found, "
                              "NoSuchBucket).")  # fmt: skip


def test_an_unreachable_endpoint_is_a_network_error(
    spark: Any, s3_server: S3Server, guarded: tuple[str, dict[str, Any]], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    uri, source = guarded
    unreachable = s3_server.storage_options(AWS_ENDPOINT_URL="http://127.0.0.1:9")
    message = _failed_merge(spark, uri, unreachable, source, caplog, StorageNetworkError)

    assert f"Reading the Delta log of table {uri} failed: the store could not be reached" in message
    assert "connection refused" in message
    assert "at http://127.0.0.1:9" in message
    _unchanged(s3_server, uri, tmp_path)


def test_the_operator_fails_a_wrong_secret_in_its_connection_once_naming_it(
    s3_server: S3Server, guarded: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
    make_context: Any, spark_local: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # The operator looks for an applied merge in the target's log before it launches anything: a key the
    # store refuses fails the task there, as AirflowFailException (Airflow does not retry it).
    uri, source = guarded
    connection = {"conn_type": "aws", "login": s3_server.admin.access_key_id, "password": WRONG_SECRET,
                  "extra": {"region_name": REGION, "endpoint_url": s3_server.endpoint}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps(connection))
    with DAG("dag", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
        operator = MergeIntoOperator(task_id="merge", target=uri, source=source, merge_sql=UPSERT,
                                     conn_id=spark_local, aws_conn_id="lake_s3")  # fmt: skip

    with caplog.at_level(logging.DEBUG), pytest.raises(StorageRefusedError) as raised:
        operator.execute(make_context())

    assert isinstance(raised.value, AirflowFailException)
    assert str(raised.value).startswith(
        f"Reading the Delta log of table {uri} failed: the store did not accept the credentials (403 "
        "Forbidden, SignatureDoesNotMatch). They came from aws_conn_id='lake_s3': check the access key id"
    )
    assert WRONG_SECRET not in caplog.text + capsys.readouterr().out
