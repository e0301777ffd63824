"""Failures on S3 are the job's errors: they name the table, the operation and what to check, and never
carry a secret key (in the message, the chained causes or the log records)."""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_merge_provider.errors import StorageRefusedError, TargetTableNotFoundError
from airflow_merge_provider.hooks.merge_commit import find_merge_commit
from spark_jobs.delta_merge.commit.actions import attempt_commit
from spark_jobs.delta_merge.errors import (
    MergeAnalysisError,
    MergeJobError,
    StorageAuthenticationError,
    StorageContainerNotFoundError,
    StoragePermissionError,
    TableStorageError,
)
from spark_jobs.delta_merge.protocol.deletion_vectors import deleted_rows, write_deletion_vectors
from spark_jobs.delta_merge.protocol.delta_log import (
    app_transaction_version,
    find_app_transaction_commit,
    first_merge_commit_after,
    latest_version,
    read_commit_actions,
    table_version,
)
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from spark_jobs.delta_merge.storage.log_store import log_store
from spark_jobs.delta_merge.storage.storage_errors import storage_failure
from tests.integration.object_storage.s3_tables import create_table, plan, upload_directory, write_file
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.s3_server import S3Server

WRONG_SECRET = "wrong-secret-4f7Qz9Kx2LmP8vRt"


def _failure(call: Callable[[], Any], kind: type[BaseException], caplog: pytest.LogCaptureFixture) -> str:
    """The full text a user could see of the failure: message, chained causes and log records."""
    with caplog.at_level(logging.DEBUG), pytest.raises(kind) as raised:
        call()
    return "".join(traceback.format_exception(raised.value)) + caplog.text


def _assert_clean(text: str, server: S3Server) -> None:
    assert WRONG_SECRET not in text
    assert server.admin.secret_access_key not in text
    assert server.reader.secret_access_key not in text


def test_the_server_refuses_a_wrong_secret_key_and_writes_without_permission(s3_server: S3Server) -> None:
    wrong = dataclasses.replace(s3_server.admin, secret_access_key=WRONG_SECRET)
    with pytest.raises(botocore.exceptions.ClientError, match="SignatureDoesNotMatch"):
        s3_server.client(key=wrong).list_buckets()
    s3_server.client().create_bucket(Bucket="refusals")
    with pytest.raises(botocore.exceptions.ClientError, match="AccessDenied"):
        s3_server.client(key=s3_server.reader).put_object(Bucket="refusals", Key="x", Body=b"1")
    assert s3_server.client(key=s3_server.reader).list_objects_v2(Bucket="refusals")["KeyCount"] == 0


def test_a_wrong_secret_key_fails_every_log_reader_clearly(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/secured"
    create_table(s3_server, uri)
    bad = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: load_snapshot(uri, storage_options=bad), "Reading the Delta log of table"),
        (lambda: read_commit_actions(uri, 0, storage_options=bad),
         f"Reading _delta_log/{0:020d}.json of table"),
        (lambda: latest_version(uri, known=0, storage_options=bad),
         "Probing the Delta log for commits after version 0 of table"),
        (lambda: table_version(uri, storage_options=bad), "Reading the Delta log of table"),
        (lambda: app_transaction_version(uri, "app", storage_options=bad), "Reading the Delta log of table"),
        (lambda: find_app_transaction_commit(uri, "app", 1, storage_options=bad),
         "Reading the Delta log of table"),
        (lambda: first_merge_commit_after(uri, 0, storage_options=bad), "Reading the Delta log of table"),
    ]  # fmt: skip
    for call, operation in cases:
        if operation.startswith("Probing"):
            # A HEAD request: its 403 has no body, so the message cannot tell a wrong key from a missing
            # permission and names both (neither is retried).
            text = _failure(call, StoragePermissionError, caplog)
            answer = "the store refused the request (403 Forbidden): the credentials from storage_options " \
                "(AWS_SECRET_ACCESS_KEY) are wrong or may not do this"
        else:
            text = _failure(call, StorageAuthenticationError, caplog)
            answer = "the store did not accept the credentials (403 Forbidden, SignatureDoesNotMatch). " \
                "They came from storage_options (AWS_SECRET_ACCESS_KEY)"
        assert f"{operation} {uri} failed: {answer}" in text
        _assert_clean(text, s3_server)
        caplog.clear()


def test_the_provider_reports_a_wrong_secret_key_as_its_own_error(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/provider"
    create_table(s3_server, uri)
    bad = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    for kwargs in ({"after_version": 0}, {"app_id": "dag"}):
        text = _failure(
            lambda kwargs=kwargs: find_merge_commit(uri, storage_options=bad,
                                                    credentials_from="aws_conn_id='x'", **kwargs),
            StorageRefusedError,
            caplog,
        )  # fmt: skip
        # The job's message as it is (not wrapped in another that repeats it), naming the credentials' source.
        assert f"StorageRefusedError: Reading the Delta log of table {uri} failed: the store did not" in text
        assert "They came from aws_conn_id='x'" in text
        assert "Cannot read the Delta log" not in text
        _assert_clean(text, s3_server)


def test_a_commit_with_a_wrong_secret_or_without_permission_names_the_commit_file(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/guarded"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    merge = plan(snapshot, [write_file(s3_server, uri, "a", [9])])
    for bad, kind, what in (
        (s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET), StorageAuthenticationError,
         "the store did not accept the credentials (403 Forbidden, SignatureDoesNotMatch)"),
        (s3_server.storage_options(s3_server.reader), StoragePermissionError,
         "the store refused the request (403 Forbidden, AccessDenied): the credentials from storage_options "
         "(AWS_SECRET_ACCESS_KEY) may not do this"),
    ):  # fmt: skip
        text = _failure(lambda bad=bad: attempt_commit(merge, base_version=0, storage_options=bad),
                        kind, caplog)  # fmt: skip
        assert f"Writing commit {1:020d}.json (on version 0) of table {uri} failed: {what}" in text
        assert "find_app_transaction_commit" in text
        _assert_clean(text, s3_server)
        caplog.clear()
    assert read_commit_actions(uri, 1, storage_options=options) is None


def test_checking_new_files_with_a_wrong_secret_key_fails_clearly(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/checked"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    added = write_file(s3_server, uri, "a", [9])
    wrong = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    bad = dataclasses.replace(snapshot, storage_options=wrong)
    text = _failure(lambda: plan(bad, [added]), TableStorageError, caplog)
    assert f"Checking the merge's new files of table {uri} failed" in text
    _assert_clean(text, s3_server)


def test_reading_a_deletion_vector_with_a_wrong_secret_key_fails_clearly(
    s3_server: S3Server, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = tmp_path / "dv"
    write_deltalake(local, pa.table({"id": pa.array(range(3), pa.int64())}))
    add_deletion_vectors(local, {load_snapshot(str(local)).files[0].path: ([1], "u")})
    upload_directory(s3_server.client(), local, bucket, "dv")
    uri = f"s3://{bucket}/dv"
    vector = load_snapshot(uri, storage_options=s3_server.storage_options()).files[0].deletion_vector
    assert vector is not None
    bad = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    text = _failure(lambda: deleted_rows(log_store(uri, bad), uri, vector, storage_options=bad),
                    TableStorageError, caplog)  # fmt: skip
    assert "Reading deletion vector file deletion_vector_" in text
    assert f"of table {uri} failed" in text
    _assert_clean(text, s3_server)


def test_writing_a_deletion_vector_with_a_wrong_secret_key_fails_clearly(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/dv-write"
    bad = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    write = lambda: write_deletion_vectors(uri, bad, {"f": [1]}, inline_limit=0)  # noqa: E731
    text = _failure(write, TableStorageError, caplog)
    assert "Writing deletion vector file deletion_vector_" in text
    assert f"of table {uri} failed" in text
    _assert_clean(text, s3_server)


def test_a_missing_bucket_is_named(s3_server: S3Server, caplog: pytest.LogCaptureFixture) -> None:
    uri = "s3://no-such-bucket-here/table"
    options = s3_server.storage_options()
    load = lambda: load_snapshot(uri, storage_options=options)  # noqa: E731
    text = _failure(load, StorageContainerNotFoundError, caplog)
    assert f"Reading the Delta log of table {uri} failed: the bucket 'no-such-bucket-here' does not" in text
    _assert_clean(text, s3_server)


def test_a_commit_into_a_missing_bucket_is_named(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/moved"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    merge = dataclasses.replace(plan(snapshot, [write_file(s3_server, uri, "a", [9])]),
                                table_uri="s3://no-such-bucket-here/moved")  # fmt: skip
    text = _failure(lambda: attempt_commit(merge, base_version=0, storage_options=options),
                    StorageContainerNotFoundError, caplog)  # fmt: skip
    assert f"Writing commit {1:020d}.json (on version 0) of table s3://no-such-bucket-here/moved failed: " \
        "the bucket 'no-such-bucket-here' does not exist" in text
    _assert_clean(text, s3_server)


def test_a_missing_table_path_is_not_a_delta_table(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/never-written"
    options = s3_server.storage_options()
    text = _failure(lambda: load_snapshot(uri, storage_options=options), MergeAnalysisError, caplog)
    assert f"{uri} is not a Delta table" in text
    assert "DELTA_MISSING_DELTA_TABLE" in text
    _assert_clean(text, s3_server)
    assert read_commit_actions(uri, 0, storage_options=options) is None
    with pytest.raises(MergeAnalysisError, match=f"Cannot read the Delta log of {uri}"):
        table_version(uri, storage_options=options)
    with pytest.raises(TargetTableNotFoundError, match=f"{uri} is not a Delta table"):
        find_merge_commit(uri, after_version=0, storage_options=options)


def test_storage_failures_mask_secrets_even_when_the_cause_quotes_them() -> None:
    options = {"AWS_SECRET_ACCESS_KEY": WRONG_SECRET, "AWS_SESSION_TOKEN": "token-abc-123", "AWS_REGION": "x"}
    error = storage_failure(
        "s3://b/t", "reading the Delta log", OSError(f"signed with {WRONG_SECRET} and token-abc-123"), options
    )
    assert isinstance(error, MergeJobError)
    assert WRONG_SECRET not in str(error)
    assert "token-abc-123" not in str(error)
    assert str(error).startswith("Reading the Delta log of table s3://b/t failed. Check ")
    assert "signed with *** and ***" in str(error)


def test_rereading_the_row_id_base_with_a_wrong_secret_key_fails_clearly(
    s3_server: S3Server, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A commit that assigns row ids and lands on a newer version than it read replays the log first.
    uri = f"s3://{bucket}/tracked"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    merge = dataclasses.replace(plan(snapshot, [write_file(s3_server, uri, "a", [9])]), assigns_row_ids=True)
    write_deltalake(uri, pa.table({"id": pa.array([3], pa.int64()), "p": ["c"]}), mode="append",
                    storage_options=options)  # fmt: skip
    bad = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    text = _failure(lambda: attempt_commit(merge, base_version=1, storage_options=bad), TableStorageError,
                    caplog)  # fmt: skip
    operation = "Reading the row id high-water mark and in-commit timestamp at version 1"
    assert f"{operation} of table {uri} failed" in text
    _assert_clean(text, s3_server)
