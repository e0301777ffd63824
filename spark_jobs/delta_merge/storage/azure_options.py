"""Azure Blob Storage ``storage_options`` (object_store's names, as deltalake and obstore take them) as the
keyword arguments of pyarrow's AzureFileSystem, written by hand because no library maps one onto the other.

An option pyarrow cannot honour is refused by name rather than dropped: the driver would reach the table
through deltalake while the executors, reading and writing files with pyarrow, failed or reached another
account. No pyarrow import here, so the check is cheap wherever storage options are first used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from spark_jobs.delta_merge.errors import MergeSpecError

__all__ = ["AZURE_SCHEMES", "azure_filesystem_arguments", "check_azure_options"]

AZURE_SCHEMES = frozenset({"az", "azure", "adl", "abfs", "abfss", "wasb", "wasbs"})
# object_store's Azure option names (after dropping an azure_storage_/azure_ prefix) -> what they mean here.
_AZURE_KEYS = {
    "account_name": "account_name",
    "account_key": "account_key", "access_key": "account_key", "master_key": "account_key",
    "sas_key": "sas_token", "sas_token": "sas_token",
    "client_id": "client_id", "client_secret": "client_secret",
    "tenant_id": "tenant_id", "authority_id": "tenant_id",
    "endpoint": "endpoint", "use_emulator": "use_emulator",
}  # fmt: skip
# object_store's Azure credentials that pyarrow's AzureFileSystem has no parameter for.
_AZURE_UNSUPPORTED = frozenset({
    "token", "bearer_token", "use_azure_cli", "msi_endpoint", "identity_endpoint", "object_id",
    "msi_resource_id", "federated_token_file", "skip_signature", "use_fabric_endpoint", "authority_host",
    "encryption_key", "fabric_token_service_url", "fabric_workload_host", "fabric_session_token",
    "fabric_cluster_identifier", "credential_type",
})  # fmt: skip
# object_store's emulator defaults (the development account is public, documented by Microsoft).
_EMULATOR_ACCOUNT = "devstoreaccount1"
_EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_EMULATOR_URL = "http://127.0.0.1:10000"
_TRUE = frozenset({"true", "1", "yes", "on"})


def check_azure_options(table_uri: str, storage_options: Mapping[str, str] | None) -> None:
    """Refuse ``storage_options`` that cannot reach ``table_uri``'s Azure account the same way from
    deltalake, obstore and pyarrow; nothing for other stores.

    :raises MergeSpecError: what is wrong and what to give instead (option keys, never values).
    """
    if urlsplit(table_uri).scheme.lower() in AZURE_SCHEMES:
        azure_filesystem_arguments(table_uri, storage_options or {})


def azure_filesystem_arguments(table_uri: str, storage_options: Mapping[str, str]) -> dict[str, str]:
    """AzureFileSystem's keyword arguments for deltalake-style ``storage_options``.

    :raises MergeSpecError: an option pyarrow has no equivalent for, or a contradictory combination.
    """
    given: dict[str, tuple[str, str]] = {}  # meaning -> (option key as given, value)
    for key, value in storage_options.items():
        name = key.lower()
        bare = name.removeprefix("azure_storage_").removeprefix("azure_")
        if bare in _AZURE_UNSUPPORTED:
            raise _refused(
                table_uri,
                f"storage option {key!r} is not supported for Azure: the job's executors read and write "
                "table files with pyarrow's AzureFileSystem, which authenticates with an account key "
                "(azure_storage_account_key), a SAS token (azure_storage_sas_token), a service principal "
                "(azure_client_id, azure_client_secret, azure_tenant_id) or, with none of these, Azure's "
                "default credential chain (environment, workload or managed identity, Azure CLI). Use one "
                f"of those instead of {key!r}.",
            )
        if bare in _AZURE_KEYS and value is not None and str(value) != "":
            given[_AZURE_KEYS[bare]] = (key, str(value))
    for key, value in os.environ.items():
        # What storage_options leave unsaid, deltalake and obstore read from AZURE_* variables; so does
        # pyarrow here. A credential the environment holds for Azure's default chain instead (e.g. a
        # federated token file) is left to that chain, not refused.
        bare = key.lower().removeprefix("azure_storage_").removeprefix("azure_")
        if key.upper().startswith("AZURE_") and bare in _AZURE_KEYS and value:
            given.setdefault(_AZURE_KEYS[bare], (key, value))
    value_of = {meaning: value for meaning, (_, value) in given.items()}
    parts = urlsplit(table_uri)
    host = parts.hostname or ""
    account = value_of.get("account_name")
    if parts.username and "." in host:  # abfs[s]://container@account.dfs.core.windows.net/path
        account = host.split(".", 1)[0]
    emulator = value_of.get("use_emulator", "").lower() in _TRUE
    if emulator and "endpoint" in value_of:
        raise _refused(
            table_uri,
            f"storage options {given['use_emulator'][0]!r} and {given['endpoint'][0]!r} are given together, "
            "but deltalake and object_store ignore the endpoint when use_emulator is set (they use "
            "AZURITE_BLOB_STORAGE_URL or http://127.0.0.1:10000). For an emulator elsewhere leave "
            "use_emulator out and set azure_storage_endpoint to http://HOST:PORT/ACCOUNT with "
            "azure_allow_http=true.",
        )
    if "account_key" in value_of and "sas_token" in value_of:
        raise _refused(
            table_uri,
            f"storage options {given['account_key'][0]!r} and {given['sas_token'][0]!r} are both given; "
            "give either an account key or a SAS token.",
        )
    kwargs: dict[str, str] = {}
    endpoint = value_of.get("endpoint")
    if emulator:
        account = account or _EMULATOR_ACCOUNT
        endpoint = f"{os.environ.get('AZURITE_BLOB_STORAGE_URL', _EMULATOR_URL).rstrip('/')}/{account}"
        if "sas_token" not in value_of and "client_id" not in value_of:
            kwargs["account_key"] = value_of.get("account_key", _EMULATOR_KEY)
    if not account:
        raise _refused(
            table_uri,
            "no storage account: set azure_storage_account_name in storage_options, or name the account "
            "in the URI (abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH).",
        )
    kwargs["account_name"] = account
    for meaning in ("account_key", "client_id", "client_secret", "tenant_id"):
        if meaning in value_of:
            kwargs[meaning] = value_of[meaning]
    if "sas_token" in value_of:
        # pyarrow appends the token to its URLs as given: without the leading "?" it lands in the path
        # (apache/arrow#49972). object_store takes the token with or without it.
        kwargs["sas_token"] = "?" + value_of["sas_token"].lstrip("?")
    if endpoint:
        kwargs.update(_azure_authorities(table_uri, endpoint, account, given.get("endpoint", ("", ""))[0]))
    return kwargs


def _azure_authorities(table_uri: str, endpoint: str, account: str, key: str) -> dict[str, str]:
    """AzureFileSystem's blob and DFS scheme and authority for an object_store endpoint URL.

    object_store sends requests to ``ENDPOINT/CONTAINER/PATH``; pyarrow to ``SCHEME://ACCOUNT.AUTHORITY/...``
    when the authority starts with a dot, else ``SCHEME://AUTHORITY/ACCOUNT/...`` (the emulator's layout).
    An endpoint neither layout reproduces is refused.
    """
    url = urlsplit(endpoint)
    host = url.hostname or ""
    path = url.path.rstrip("/")
    if url.scheme not in ("http", "https") or not host:
        raise _refused(
            table_uri,
            f"storage option {key!r} must be an http(s) URL, e.g. https://{account}.blob.core.windows.net; "
            "got a value without a scheme or host.",
        )
    if host.lower().startswith(f"{account.lower()}.") and not path:
        blob = url.netloc[len(account):]
        dfs = blob.replace(".blob.", ".dfs.")
    elif path == f"/{account}":
        blob = dfs = url.netloc
    else:
        raise _refused(
            table_uri,
            f"storage option {key!r} is neither https://{account}.HOST (the account's own endpoint) nor "
            f"http(s)://HOST:PORT/{account} (an emulator's), the two layouts pyarrow's AzureFileSystem can "
            "address. Give the endpoint in one of them.",
        )
    return {"blob_storage_authority": blob, "dfs_storage_authority": dfs,
            "blob_storage_scheme": url.scheme, "dfs_storage_scheme": url.scheme}  # fmt: skip


def _refused(table_uri: str, why: str) -> MergeSpecError:
    # Messages name option keys, never values: an endpoint is the only value quoted, and only its layout.
    return MergeSpecError(f"Cannot reach table {table_uri} on Azure: {why}")
