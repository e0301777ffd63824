"""Tables in Azure Blob Storage below the merge: one set of deltalake-style storage options reaches Azurite
from deltalake, obstore (the Delta log, put-if-absent commits) and pyarrow (data files); Azurite really
checks the account key; the options pyarrow cannot honour are refused by name; secrets are masked."""

from __future__ import annotations

import base64
import logging
import traceback

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge.errors import MergeSpecError, StorageAuthenticationError, TableStorageError
from spark_jobs.delta_merge.protocol.deletion_vectors import deleted_rows, write_deletion_vectors
from spark_jobs.delta_merge.protocol.delta_log import read_commit_actions
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from spark_jobs.delta_merge.storage.arrow_store import arrow_file_path, arrow_filesystem
from spark_jobs.delta_merge.storage.azure_options import azure_filesystem_arguments
from spark_jobs.delta_merge.storage.log_store import (
    commit_path,
    log_store,
    read_commit,
    write_commit,
)
from spark_jobs.delta_merge.storage.storage_errors import storage_errors
from spark_jobs.delta_merge.storage.storage_secrets import redacted
from tests.integration.object_storage.table_io import race_for_commits
from tests.support.azurite_server import ACCOUNT, ACCOUNT_KEY, AzuriteServer

# A well-formed key (64 bytes, base64) that is not the account's: the signature check must refuse it.
WRONG_KEY = base64.b64encode(b"not-the-account-key-" * 3 + b"1234").decode()


def test_azurite_refuses_a_wrong_account_key(azurite: AzuriteServer, container: str) -> None:
    with azurite.arrow_fs().open_output_stream(f"{container}/probe") as out:
        out.write(b"1")
    with pytest.raises(OSError, match="403"):
        azurite.arrow_fs(account_key=WRONG_KEY).get_file_info(f"{container}/probe")
    assert azurite.arrow_fs().get_file_info(f"{container}/probe").size == 1


@pytest.mark.parametrize(
    "uri_of",
    [lambda c: f"az://{c}/t", lambda c: f"abfss://{c}@{ACCOUNT}.dfs.core.windows.net/t"],
    ids=["az", "abfss"],
)
def test_one_set_of_storage_options_reaches_the_table_from_deltalake_obstore_and_pyarrow(
    azurite: AzuriteServer, container: str, uri_of: object
) -> None:
    uri = uri_of(container)  # type: ignore[operator]
    options = azurite.storage_options()
    write_deltalake(uri, pa.table({"id": [1, 2]}), storage_options=options)

    fs, base = arrow_filesystem(uri, options)
    files = [a["add"]["path"] for a in read_commit(log_store(uri, options), 0) or [] if "add" in a]

    assert base == f"{container}/t"
    assert isinstance(fs, pafs.AzureFileSystem)
    assert [pq.read_table(f"{base}/{path}", filesystem=fs)["id"].to_pylist() for path in files] == [[1, 2]]
    assert load_snapshot(uri, storage_options=options).version == 0


def test_the_emulator_flag_reaches_azurite_through_its_environment_variable(
    azurite: AzuriteServer, container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # object_store's use_emulator takes the emulator's address from AZURITE_BLOB_STORAGE_URL (never from an
    # endpoint option), and its account and key by default; pyarrow's file system must follow it there.
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", f"http://{azurite.host}:{azurite.port}")
    uri = f"az://{container}/emulated"
    options = {"azure_storage_use_emulator": "true"}
    write_deltalake(uri, pa.table({"id": [7]}), storage_options=options)

    fs, base = arrow_filesystem(uri, options)
    (add,) = [a["add"] for a in read_commit(log_store(uri, options), 0) or [] if "add" in a]

    assert pq.read_table(f"{base}/{add['path']}", filesystem=fs)["id"].to_pylist() == [7]


def test_the_environment_alone_reaches_the_table_from_deltalake_obstore_and_pyarrow(
    azurite: AzuriteServer, container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker configured by AZURE_* variables (as for deltalake and object_store), no storage_options.
    for key, value in azurite.storage_options().items():
        monkeypatch.setenv(key.upper(), value)
    uri = f"az://{container}/from-env"
    write_deltalake(uri, pa.table({"id": [5]}))

    fs, base = arrow_filesystem(uri, {})
    (add,) = [a["add"] for a in read_commit(log_store(uri, {}), 0) or [] if "add" in a]

    assert pq.read_table(f"{base}/{add['path']}", filesystem=fs)["id"].to_pylist() == [5]
    assert azure_filesystem_arguments(uri, {})["account_name"] == ACCOUNT
    # An option given explicitly still wins over the environment's.
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", WRONG_KEY)
    fs, base = arrow_filesystem(uri, {"azure_storage_account_key": ACCOUNT_KEY})
    assert pq.read_table(f"{base}/{add['path']}", filesystem=fs)["id"].to_pylist() == [5]


def test_put_if_absent_is_conditional_on_azurite(azurite: AzuriteServer, container: str) -> None:
    uri = f"az://{container}/raw"
    store = log_store(uri, azurite.storage_options())
    assert write_commit(store, 0, [{"commitInfo": {"writer": "first"}}]) is True
    assert write_commit(store, 0, [{"commitInfo": {"writer": "second"}}]) is False
    assert read_commit(store, 0) == [{"commitInfo": {"writer": "first"}}]

    # Six writers race for each of the next versions, each through its own store (own connections).
    stores = [log_store(uri, azurite.storage_options()) for _ in range(6)]
    for version in range(1, 4):
        won = race_for_commits(stores, version)
        assert len(won) == 1
        assert read_commit(store, version) == [{"commitInfo": {"writer": won[0]}}]


def test_deletion_vectors_written_to_azure_are_read_back(azurite: AzuriteServer, container: str) -> None:
    uri = f"az://{container}/dv-write"
    options = azurite.storage_options()
    vectors = {"a": list(range(0, 4000, 3)), "b": [*range(0, 60, 2), 1 << 33]}
    descriptors = write_deletion_vectors(uri, options, vectors, inline_limit=0)
    assert {d.storage_type for d in descriptors.values()} == {"u"}
    store = log_store(uri, options)
    for key, rows in vectors.items():
        assert deleted_rows(store, uri, descriptors[key], storage_options=options) == rows


def test_a_sas_token_reaches_the_table_and_a_read_only_one_cannot_commit(
    azurite: AzuriteServer, container: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"az://{container}/shared"
    options = azurite.sas_storage_options("racwdl")
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=options)
    fs, base = arrow_filesystem(uri, options)
    (add,) = [a["add"] for a in read_commit(log_store(uri, options), 0) or [] if "add" in a]
    assert pq.read_table(f"{base}/{add['path']}", filesystem=fs)["id"].to_pylist() == [1]

    read_only = azurite.sas_storage_options("rl")
    assert load_snapshot(uri, storage_options=read_only).version == 0
    store = log_store(uri, read_only)
    with (
        caplog.at_level(logging.DEBUG),
        pytest.raises(TableStorageError) as raised,
        storage_errors(uri, f"writing {commit_path(1)}", read_only),
    ):
        write_commit(store, 1, [{"commitInfo": {}}])

    assert f"Writing {commit_path(1)} of table {uri} failed" in str(raised.value)
    signature = read_only["azure_storage_sas_token"].rsplit("sig=", 1)[1]
    text = "".join(traceback.format_exception(raised.value)) + caplog.text
    assert signature not in str(raised.value)
    assert signature not in caplog.text
    assert text.count("sig=") == text.count("sig=***")
    assert DeltaTable(uri, storage_options=options).version() == 0


def test_a_wrong_account_key_fails_the_log_readers_clearly(
    azurite: AzuriteServer, container: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"az://{container}/secured"
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=azurite.storage_options())
    bad = azurite.storage_options(azure_storage_account_key=WRONG_KEY)
    cases = [
        (lambda: load_snapshot(uri, storage_options=bad), "Reading the Delta log of table"),
        (lambda: read_commit_actions(uri, 0, storage_options=bad),
         f"Reading _delta_log/{0:020d}.json of table"),
    ]  # fmt: skip
    for call, operation in cases:
        with caplog.at_level(logging.DEBUG), pytest.raises(TableStorageError) as raised:
            call()
        assert f"{operation} {uri} failed" in str(raised.value)
        assert type(raised.value) is StorageAuthenticationError
        assert "did not accept the credentials (403 Forbidden, AuthorizationFailure)" in str(raised.value)
        assert "the account name with its account key, SAS token or service principal" in str(raised.value)
        text = "".join(traceback.format_exception(raised.value)) + caplog.text
        assert WRONG_KEY not in text
    assert DeltaTable(uri, storage_options=azurite.storage_options()).version() == 0


def test_azure_options_become_pyarrow_arguments() -> None:
    emulator = azure_filesystem_arguments(
        "az://c/t",
        {"AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1", "azure_storage_account_key": "a2V5",
         "azure_storage_endpoint": "http://127.0.0.1:10001/devstoreaccount1", "allow_http": "true"},
    )  # fmt: skip
    assert emulator == {
        "account_name": "devstoreaccount1", "account_key": "a2V5",
        "blob_storage_authority": "127.0.0.1:10001", "dfs_storage_authority": "127.0.0.1:10001",
        "blob_storage_scheme": "http", "dfs_storage_scheme": "http",
    }  # fmt: skip
    # The account from an abfss URI, a SAS token (given a "?" if it has none), the account's own endpoint.
    own = azure_filesystem_arguments(
        "abfss://c@prod.dfs.core.windows.net/t",
        {"azure_storage_sas_token": "sv=2024&sig=abc", "endpoint": "https://prod.blob.core.windows.net"},
    )
    assert own == {
        "account_name": "prod", "sas_token": "?sv=2024&sig=abc",
        "blob_storage_authority": ".blob.core.windows.net", "dfs_storage_authority": ".dfs.core.windows.net",
        "blob_storage_scheme": "https", "dfs_storage_scheme": "https",
    }  # fmt: skip
    # object_store's emulator flag: its account, key and address (127.0.0.1:10000).
    assert azure_filesystem_arguments("az://c/t", {"azure_storage_use_emulator": "true"}) == {
        "account_name": ACCOUNT, "account_key": ACCOUNT_KEY,
        "blob_storage_authority": "127.0.0.1:10000", "dfs_storage_authority": "127.0.0.1:10000",
        "blob_storage_scheme": "http", "dfs_storage_scheme": "http",
    }  # fmt: skip
    principal = {"account_name": "a", "azure_client_id": "i", "azure_client_secret": "s", "tenant_id": "t"}
    assert azure_filesystem_arguments("az://c/t", principal) == {
        "account_name": "a", "client_id": "i", "client_secret": "s", "tenant_id": "t",
    }  # fmt: skip
    assert arrow_file_path("abfss://c@prod.dfs.core.windows.net/t/p=a b/f?.parquet") == "c/t/p=a b/f?.parquet"
    assert arrow_file_path("az://c/t/f.parquet") == "c/t/f.parquet"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"account_name": "a", "azure_storage_token": "bearer-secret"},
         "storage option 'azure_storage_token' is not supported for Azure"),
        ({"account_name": "a", "use_azure_cli": "true"}, "storage option 'use_azure_cli' is not supported"),
        ({"azure_storage_use_emulator": "true", "azure_storage_endpoint": "http://127.0.0.1:1/devstoreaccount1"},
         "ignore the endpoint when use_emulator is set"),
        ({"account_name": "a", "account_key": "a2V5", "sas_token": "sv=1&sig=secret-sig"},
         "give either an account key or a SAS token"),
        ({"account_key": "a2V5"}, "no storage account: set azure_storage_account_name"),
        ({"account_name": "a", "endpoint": "http://127.0.0.1:10000"}, "neither https://a.HOST"),
    ],
)  # fmt: skip
def test_options_pyarrow_cannot_honour_are_refused_by_name(options: dict[str, str], message: str) -> None:
    with pytest.raises(MergeSpecError, match=message) as raised:
        arrow_filesystem("az://c/t", options)
    assert "Cannot reach table az://c/t on Azure" in str(raised.value)
    for secret in ("bearer-secret", "a2V5", "secret-sig"):
        assert secret not in str(raised.value)
    # The log store refuses the same options before any request, as does the snapshot.
    with pytest.raises(MergeSpecError, match=message):
        log_store("az://c/t", options)


def test_azure_secrets_are_masked() -> None:
    options = {"azure_storage_account_key": "k3y/with+chars==", "azure_storage_sas_token": "sv=1&sig=s1g%2B",
               "access_key": "other-key", "AZURE_STORAGE_ACCOUNT_NAME": "prod"}  # fmt: skip
    text = ("key k3y/with+chars== or k3y%2Fwith%2Bchars%3D%3D, sas sv=1&sig=s1g%2B, other-key, account prod, "
            "GET https://prod.blob.core.windows.net/c/t?sv=2024&se=x&sig=AnotherSig%3D&sp=r")  # fmt: skip
    masked = redacted(text, options)
    for secret in ("k3y/with+chars==", "k3y%2Fwith%2Bchars%3D%3D", "s1g", "other-key", "AnotherSig"):
        assert secret not in masked
    assert "account prod" in masked
    assert "sig=***&sp=r" in masked
