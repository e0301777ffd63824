"""Azure Blob Storage / ADLS Gen2 credentials from an Airflow connection (``azure_conn_id``), read field by
field as the Microsoft Azure provider's wasb and adls connection types define them; without a JVM. The
same connection against Azurite: tests/integration/object_storage/test_azure_connection.py."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from airflow_merge_provider.errors import MergeArgumentError
from airflow_merge_provider.hooks.storage_credentials import (
    AzureStorageCredentialsHook,
    connection_storage_options,
    with_credentials,
)

KEY = "YWNjb3VudC1rZXktZm9yLXRlc3RzLW9ubHk="
SAS = "sv=2024-11-04&ss=b&srt=sco&sp=rwl&sig=c2lnbmF0dXJl"


def _define(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "wasb", **fields}))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # wasb: login = account name, password = account key
        ({"login": "lakeaccount", "password": KEY},
         {"azure_storage_account_name": "lakeaccount", "azure_storage_account_key": KEY}),
        # the account from the host (an account URL, blob or dfs), the key from the extra shared_access_key
        ({"host": "https://lakeaccount.dfs.core.windows.net/", "extra": {"shared_access_key": KEY}},
         {"azure_storage_account_name": "lakeaccount", "azure_storage_account_key": KEY}),
        # a SAS token (a leading "?" or a whole SAS URL as the provider accepts it)
        ({"login": "lakeaccount", "extra": {"sas_token": f"?{SAS}"}},
         {"azure_storage_account_name": "lakeaccount", "azure_storage_sas_token": SAS}),
        ({"host": "lakeaccount.blob.core.windows.net", "extra": {"sas_token": f"https://x/c?{SAS}"}},
         {"azure_storage_account_name": "lakeaccount", "azure_storage_sas_token": SAS}),
        # a service principal: with tenant_id, login and password are the client id and secret
        ({"host": "https://lakeaccount.blob.core.windows.net", "login": "app-id", "password": "app-secret",
          "extra": {"tenant_id": "tenant-1"}},
         {"azure_storage_account_name": "lakeaccount", "azure_storage_client_id": "app-id",
          "azure_storage_client_secret": "app-secret", "azure_storage_tenant_id": "tenant-1"}),
        # a connection string; old-style prefixed extras
        ({"extra": {"extra__wasb__connection_string":
                    f"DefaultEndpointsProtocol=https;AccountName=lakeaccount;AccountKey={KEY};EndpointSuffix=y"}},
         {"azure_storage_account_name": "lakeaccount", "azure_storage_account_key": KEY}),
        # an emulator (Azurite) or private endpoint as the host: the endpoint goes along, http allowed
        ({"host": "http://127.0.0.1:10000/devstoreaccount1", "login": "devstoreaccount1", "password": KEY},
         {"azure_storage_account_name": "devstoreaccount1", "azure_storage_account_key": KEY,
          "azure_storage_endpoint": "http://127.0.0.1:10000/devstoreaccount1", "azure_allow_http": "true"}),
    ],
)  # fmt: skip
def test_the_connection_fields_become_the_jobs_storage_options(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], expected: dict[str, str]
) -> None:
    _define(monkeypatch, "lake_adls", **fields)
    assert AzureStorageCredentialsHook(azure_conn_id="lake_adls").storage_options() == expected
    assert asyncio.run(AzureStorageCredentialsHook(azure_conn_id="lake_adls").astorage_options()) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"login": "lakeaccount"}, "holds no credential: set its password (the account key), the extra"),
        ({"extra": {"sas_token": SAS}}, "names no storage account: set its login (the account name)"),
    ],
)  # fmt: skip
def test_a_connection_without_an_account_or_a_credential_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], message: str
) -> None:
    _define(monkeypatch, "lake_adls", **fields)
    with pytest.raises(MergeArgumentError, match=re.escape(message)) as refused:
        AzureStorageCredentialsHook(azure_conn_id="lake_adls").storage_options()
    assert "Azure connection 'lake_adls' (azure_conn_id)" in str(refused.value)
    assert SAS not in str(refused.value)


def test_an_undefined_connection_says_how_to_define_one() -> None:
    with pytest.raises(MergeArgumentError, match=r"'no_such_adls' \(azure_conn_id\) is not defined.*wasb"):
        AzureStorageCredentialsHook(azure_conn_id="no_such_adls").storage_options()


CREDENTIALS = {"azure_storage_account_name": "lakeaccount", "azure_storage_account_key": KEY}


def test_azure_credentials_go_to_azure_uris_only_and_explicit_keys_win() -> None:
    assert with_credentials(CREDENTIALS, {}, uri="abfss://c@acct.dfs.core.windows.net/t") == CREDENTIALS
    assert with_credentials(CREDENTIALS, {}, uri="az://c/t") == CREDENTIALS
    assert with_credentials(CREDENTIALS, {}, uri="s3://b/t") == {}
    # A SAS token given explicitly is used whole: never beside the connection's key.
    explicit = {"AZURE_STORAGE_SAS_TOKEN": SAS}
    assert with_credentials(CREDENTIALS, explicit, uri="az://c/t") == {
        "azure_storage_account_name": "lakeaccount", "AZURE_STORAGE_SAS_TOKEN": SAS,
    }  # fmt: skip


def test_only_the_connection_of_the_uris_store_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    _define(monkeypatch, "lake_adls", login="lakeaccount", password=KEY)
    # An S3 table with both connections given: the Azure one is not read (nor is the undefined AWS one
    # needed for an Azure table).
    options, named = connection_storage_options({}, uri="az://c/t", aws_conn_id="undefined_aws",
                                                azure_conn_id="lake_adls")  # fmt: skip
    assert (options, named) == (CREDENTIALS, "azure_conn_id='lake_adls'")
    local = connection_storage_options({"x": "y"}, uri="/local/t", azure_conn_id="lake_adls")
    assert local == ({"x": "y"}, None)
    explicit = {"azure_storage_account_key": "mine"}
    assert connection_storage_options(explicit, uri="az://c/t", azure_conn_id="lake_adls")[1] is None
