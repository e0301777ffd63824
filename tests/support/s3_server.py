"""A real S3 API server for tests: moto's, started as a subprocess, with request signing enforced.

moto checks signatures and IAM policies once ``INITIAL_NO_AUTH_ACTION_COUNT`` unauthenticated actions
have been served. Those first actions create the IAM users whose keys the tests use, so every later
request, by any client, must be signed with a key moto issued: a wrong secret really fails. moto honours
``If-None-Match: *`` on PUT, which object_store sends for put-if-absent (``PutMode::Create``) without any
``conditional_put`` setting; the server runs moto's app one request at a time so that check is atomic
(see ``moto_serialized_server``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.local_servers import free_port, stop_process, wait_for_port

__all__ = ["S3Server", "start_s3_server"]

REGION = "us-east-1"
# create_user + put_user_policy + create_access_key for each of the two users below.
_SETUP_ACTIONS = 6
_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
_READ_ONLY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket", "s3:HeadObject"], "Resource": "*"}
    ],
}


@dataclass(frozen=True)
class S3Key:
    access_key_id: str
    secret_access_key: str = field(repr=False)


@dataclass(frozen=True)
class S3Server:
    """A running moto server: its endpoint, an all-powerful key and a read-only key."""

    endpoint: str
    pid: int
    admin: S3Key
    reader: S3Key
    _process: subprocess.Popen[bytes] = field(repr=False, compare=False)

    def storage_options(self, key: S3Key | None = None, **overrides: str) -> dict[str, str]:
        """``storage_options`` for deltalake and this project's log store (obstore)."""
        key = key or self.admin
        options = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key.access_key_id,
            "AWS_SECRET_ACCESS_KEY": key.secret_access_key,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }
        options.update(overrides)
        return options

    def client(self, service: str = "s3", key: S3Key | None = None) -> Any:
        import boto3

        key = key or self.admin
        return boto3.client(
            service, endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=key.access_key_id, aws_secret_access_key=key.secret_access_key,
        )  # fmt: skip

    def arrow_fs(self, key: S3Key | None = None) -> Any:
        import pyarrow.fs as pafs

        key = key or self.admin
        return pafs.S3FileSystem(
            access_key=key.access_key_id, secret_key=key.secret_access_key, region=REGION,
            endpoint_override=self.endpoint, scheme="http", allow_bucket_creation=False,
        )  # fmt: skip

    def stop(self) -> None:
        stop_process(self._process)


def start_s3_server(*, timeout: float = 60.0) -> S3Server:
    """Start moto's server on a free port of 127.0.0.1 and create its IAM users; stop it with ``stop()``."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_ACTIONS)}
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("moto_serialized_server.py")), "127.0.0.1", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, process, name="moto server", timeout=timeout)
        endpoint = f"http://127.0.0.1:{port}"
        admin = _create_user(endpoint, "merge-admin", _ALL)
        reader = _create_user(endpoint, "merge-reader", _READ_ONLY)
    except BaseException:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        raise
    return S3Server(endpoint=endpoint, pid=process.pid, admin=admin, reader=reader, _process=process)


def _create_user(endpoint: str, name: str, policy: dict[str, Any]) -> S3Key:
    import boto3

    # The setup actions are served unauthenticated, so any key signs them.
    iam = boto3.client(
        "iam", endpoint_url=endpoint, region_name=REGION,
        aws_access_key_id="setup", aws_secret_access_key="setup",
    )  # fmt: skip
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="policy", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return S3Key(access_key_id=key["AccessKeyId"], secret_access_key=key["SecretAccessKey"])
