"""Fixtures for tables in object storage: one moto S3 server and one Azurite per test session (each started
on first use), a fresh bucket or container per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.azurite_server import AzuriteServer, start_azurite
from tests.support.s3_server import S3Server, start_s3_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 API (moto) on 127.0.0.1 that checks request signatures and IAM permissions."""
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture(scope="module", name="s3_server")
def own_s3_server() -> Iterator[S3Server]:
    """An S3 server of one module's own, in place of the shared one (``bucket`` then uses it): a module
    imports it to keep its clients away from the server the other S3 tests share (Delta's S3A client,
    the AWS SDK v2)."""
    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    """A new, empty bucket (tests never share tables)."""
    name = f"tables-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    """A real Azure Blob Storage API (Azurite) on 127.0.0.1 that checks shared-key signatures."""
    server = start_azurite()
    yield server
    server.stop()


@pytest.fixture
def container(azurite: AzuriteServer) -> str:
    """A new, empty container (tests never share tables)."""
    name = f"tables-{uuid.uuid4().hex[:12]}"
    azurite.create_container(name)
    return name
