"""S3 credentials resolved by the Amazon provider (``AwsBaseHook``) for an ``aws_conn_id`` whose connection
assumes an IAM role: the hook hands the job temporary credentials, and they really work against the moto
server, which checks signatures and IAM policies for assumed roles as for users. The merges with them run on
both session kinds (``merge_spark``): the executors of a classic session and of a Spark Connect server.

What moto does with assumed roles (checked here, since the tests rely on it): AssumeRole is allowed only when
the caller's own policy allows ``sts:AssumeRole`` and the role's trust policy names the caller; the temporary
key (``ASIA...``) is accepted only with its session token and its own secret; and every request made with it
is checked against the role's policies, not the caller's.

The provider never sends AssumeRole to the connection's ``endpoint_url`` (its STS client for assuming roles
ignores the global endpoint), so the connection also names moto as the STS endpoint in ``service_config``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError
from deltalake import DeltaTable, write_deltalake

from airflow_merge_provider.errors import MergeArgumentError
from airflow_merge_provider.hooks.storage_credentials import StorageCredentialsHook, amazon_provider_installed
from spark_jobs.delta_merge.errors import StoragePermissionError
from tests.integration.object_storage.table_io import kv, merge, table_rows
from tests.support.delta_reader import read_rows
from tests.support.s3_server import REGION, S3Key, S3Server

ACCOUNT = "123456789012"  # moto's default account
ADMIN_ARN = f"arn:aws:iam::{ACCOUNT}:user/merge-admin"
ALL_OF_S3 = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
READ_S3 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}],
}


def trusting(principal_arn: str) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": principal_arn}, "Action": "sts:AssumeRole"}]}  # fmt: skip


def create_role(server: S3Server, policy: dict[str, Any], *, trusted: str = ADMIN_ARN) -> str:
    """A new role in moto's IAM that ``trusted`` may assume, with ``policy``; its ARN."""
    iam = server.client("iam")
    name = f"merge-role-{uuid.uuid4().hex[:8]}"
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trusting(trusted)))["Role"]
    iam.put_role_policy(RoleName=name, PolicyName="s3", PolicyDocument=json.dumps(policy))
    return str(role["Arn"])


def define_role_connection(
    monkeypatch: pytest.MonkeyPatch, server: S3Server, conn_id: str, role_arn: str, key: S3Key | None = None
) -> None:
    """An aws connection as a deployment would write it: a user's key (the admin's unless ``key``) that
    assumes ``role_arn``."""
    key = key or server.admin
    extra = {
        "region_name": REGION,
        "endpoint_url": server.endpoint,
        "role_arn": role_arn,
        "assume_role_method": "assume_role",
        # AssumeRole goes to the STS endpoint of service_config only (never to endpoint_url).
        "service_config": {"sts": {"endpoint_url": server.endpoint}},
    }
    connection = {"conn_type": "aws", "login": key.access_key_id, "password": key.secret_access_key,
                  "extra": extra}  # fmt: skip
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))


def s3_client(server: S3Server, options: dict[str, str]) -> Any:
    """A boto3 S3 client signing with the key in ``options`` (and its session token, when there is one)."""
    return boto3.client(
        "s3", endpoint_url=server.endpoint, region_name=REGION,
        aws_access_key_id=options["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=options["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=options.get("AWS_SESSION_TOKEN"),
    )  # fmt: skip


def assert_temporary_credentials_of_a_role(server: S3Server, options: dict[str, str]) -> None:
    assert set(options) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                            "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"}  # fmt: skip
    # STS's temporary key ids start with ASIA (a user's with AKIA); key and secret are not the admin's.
    assert options["AWS_ACCESS_KEY_ID"].startswith("ASIA"), options["AWS_ACCESS_KEY_ID"]
    assert options["AWS_ACCESS_KEY_ID"] != server.admin.access_key_id
    assert options["AWS_SECRET_ACCESS_KEY"] != server.admin.secret_access_key
    assert options["AWS_SESSION_TOKEN"]
    assert (options["AWS_REGION"], options["AWS_ENDPOINT_URL"], options["AWS_ALLOW_HTTP"]) == (
        REGION, server.endpoint, "true")  # fmt: skip


def test_the_amazon_provider_is_installed() -> None:
    # Everything below runs the provider's real AwsBaseHook, not StorageCredentialsHook's fallback.
    assert amazon_provider_installed()


def test_an_assumed_role_gives_temporary_credentials_that_read_the_table(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"s3://{bucket}/orders"
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=s3_server.storage_options())
    define_role_connection(monkeypatch, s3_server, "lake_role", create_role(s3_server, ALL_OF_S3))

    options = StorageCredentialsHook(aws_conn_id="lake_role").storage_options()

    assert_temporary_credentials_of_a_role(s3_server, options)
    assert DeltaTable(uri, storage_options=options).version() == 0
    assert sorted(tuple(r) for r in read_rows(uri, columns=["id", "v"], storage_options=options)) == [
        (1, "a"), (2, "b")]  # fmt: skip
    # moto really checks the temporary key: without its token it is unknown, with another secret the
    # signature fails.
    client = s3_client(s3_server, options)
    assert client.head_object(Bucket=bucket, Key="orders/_delta_log/00000000000000000000.json")
    without_token = {k: v for k, v in options.items() if k != "AWS_SESSION_TOKEN"}
    with pytest.raises(ClientError) as refused:
        s3_client(s3_server, without_token).list_objects_v2(Bucket=bucket)
    assert refused.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    with pytest.raises(ClientError) as refused:
        s3_client(s3_server, {**options, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}).list_objects_v2(
            Bucket=bucket
        )
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_the_async_read_assumes_the_role_too(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    define_role_connection(monkeypatch, s3_server, "lake_role", create_role(s3_server, ALL_OF_S3))
    hook = StorageCredentialsHook(aws_conn_id="lake_role")

    options = asyncio.run(hook.astorage_options())

    assert_temporary_credentials_of_a_role(s3_server, options)
    s3_client(s3_server, options).put_object(Bucket=bucket, Key="probe", Body=b"x")
    # Each resolution assumes the role anew: a fresh temporary key, not a cached one.
    assert hook.storage_options()["AWS_ACCESS_KEY_ID"] != options["AWS_ACCESS_KEY_ID"]


@pytest.mark.parametrize(
    ("user", "trusted_user"),
    [
        # The admin may call sts:AssumeRole on anything, but the role trusts another user.
        pytest.param("admin", "merge-reader", id="not-in-the-trust-policy"),
        # The role trusts the reader, whose own policy allows S3 reads only: moto refuses this too (it
        # evaluates the caller's identity policy for sts:AssumeRole as well as the trust policy).
        pytest.param("reader", "merge-reader", id="no-sts-permission-of-its-own"),
    ],
)
def test_a_refused_assume_role_fails_without_quoting_the_connection(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, user: str, trusted_user: str
) -> None:
    key: S3Key = getattr(s3_server, user)
    role = create_role(s3_server, ALL_OF_S3, trusted=f"arn:aws:iam::{ACCOUNT}:user/{trusted_user}")
    define_role_connection(monkeypatch, s3_server, "lake_role", role, key=key)

    with pytest.raises(MergeArgumentError) as refused:
        StorageCredentialsHook(aws_conn_id="lake_role").storage_options()

    message = str(refused.value)
    # The provider's ClientError (AccessDenied on AssumeRole) is reduced to its type: it may quote the caller.
    assert "AWS connection 'lake_role' (aws_conn_id): the Amazon provider could not resolve credentials " in (
        message)  # fmt: skip
    assert "(ClientError)" in message
    assert key.secret_access_key not in message
    assert key.access_key_id not in message
    assert refused.value.__cause__ is None
def test_a_merge_commits_with_the_assumed_roles_credentials(
    merge_spark: Any, s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    admin = s3_server.storage_options()
    uri, source_uri = f"s3://{bucket}/orders", f"s3://{bucket}/incoming/2024-01-02"
    write_deltalake(uri, kv([(1, "a"), (2, "b"), (3, "c")]), storage_options=admin)
    pq.write_table(kv([(2, "B"), (4, "d")]), f"{bucket}/incoming/2024-01-02/part-0.parquet",
                   filesystem=s3_server.arrow_fs())  # fmt: skip
    define_role_connection(monkeypatch, s3_server, "lake_role", create_role(s3_server, ALL_OF_S3))
    options = StorageCredentialsHook(aws_conn_id="lake_role").storage_options()
    assert_temporary_credentials_of_a_role(s3_server, options)

    source = {"uri": source_uri, "format": "parquet", "storage_options": options}
    metrics = merge(merge_spark, uri, options, source)

    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["tableVersion"]) == (
        1, 1, 1)  # fmt: skip
    rows = table_rows(uri, admin, s3_server.arrow_fs(), f"{bucket}/orders", tmp_path)
    assert rows == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]
    assert DeltaTable(uri, storage_options=admin).history(1)[0]["operation"] == "MERGE"
def test_a_read_only_role_lets_the_merge_read_but_not_write(
    merge_spark: Any, s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """moto applies the role's policy to its temporary key: the merge reads the table, then its first
    write is refused and nothing lands."""
    admin = s3_server.storage_options()
    uri, source_uri = f"s3://{bucket}/orders", f"s3://{bucket}/incoming/2024-01-02"
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=admin)
    pq.write_table(kv([(2, "B")]), f"{bucket}/incoming/2024-01-02/part-0.parquet",
                   filesystem=s3_server.arrow_fs())  # fmt: skip
    define_role_connection(monkeypatch, s3_server, "reader_role", create_role(s3_server, READ_S3))
    options = StorageCredentialsHook(aws_conn_id="reader_role").storage_options()
    assert DeltaTable(uri, storage_options=options).version() == 0

    with pytest.raises(StoragePermissionError) as refused:
        merge(merge_spark, uri, options, {"uri": source_uri, "format": "parquet", "storage_options": options})

    message = str(refused.value)
    # The executors' pyarrow writer was refused its first data file (the role has no s3:PutObject).
    assert message.startswith(f"Reading and writing the data files in Spark's tasks of table {uri} failed: "
                              "the store refused the request (ACCESS_DENIED)")  # fmt: skip
    assert "Nothing was committed" in message
    assert options["AWS_SECRET_ACCESS_KEY"] not in message
    assert options["AWS_SESSION_TOKEN"] not in message
    assert DeltaTable(uri, storage_options=admin).version() == 0
    rows = table_rows(uri, admin, s3_server.arrow_fs(), f"{bucket}/orders", tmp_path)
    assert rows == [(1, "a"), (2, "b")]
