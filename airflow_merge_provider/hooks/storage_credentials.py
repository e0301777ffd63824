"""Storage credentials from Airflow connections, as deltalake-style storage options: an AWS connection's for
S3 (``aws_conn_id``), an Azure connection's for Azure Blob Storage and ADLS Gen2 (``azure_conn_id``), a
Google Cloud connection's for GCS (``gcp_conn_id``).

The Azure and Google connections are read by hand, field by field as the Microsoft Azure provider's ``wasb``
and ``adls`` and the Google provider's ``google_cloud_platform`` connection types define them: those
providers' hooks build SDK clients, not the key material the job's executors need, and they need not be
installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_merge_provider.errors import MergeArgumentError
from spark_jobs.delta_merge.contract import AZURE_SCHEMES, is_secret_option

__all__ = [
    "AzureStorageCredentialsHook",
    "GcsStorageCredentialsHook",
    "StorageCredentialsHook",
    "aconnection_storage_options",
    "amazon_provider_installed",
    "connection_storage_options",
    "secret_option_keys",
    "with_credentials",
]

# The URI schemes whose storage options take AWS credentials.
_S3_SCHEMES = ("s3://", "s3a://")
# Spellings deltalake and object_store take for the same option (after dropping ``AWS_``).
_ALIASES = {"ENDPOINT": "ENDPOINT_URL", "TOKEN": "SESSION_TOKEN", "DEFAULT_REGION": "REGION"}
_KEY_PARTS = frozenset({"ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN"})
# object_store's Azure spellings (after dropping ``azure_storage_`` or ``azure_``), as the job reads them.
_AZURE_ALIASES = {"access_key": "account_key", "master_key": "account_key", "sas_key": "sas_token",
                  "authority_id": "tenant_id"}  # fmt: skip
_AZURE_KEY_PARTS = frozenset({"account_key", "sas_token", "client_id", "client_secret", "tenant_id"})
# Hosts of Azure Storage accounts (public and sovereign clouds): ACCOUNT.blob|dfs.<suffix>.
_AZURE_HOST_SUFFIXES = (".core.windows.net", ".core.chinacloudapi.cn", ".core.usgovcloudapi.net")
_GCS_SCHEMES = ("gs", "gcs")
# object_store's GCS spellings (after dropping ``google_``) of the credentials a connection gives.
_GOOGLE_ALIASES = {"service_account_path": "service_account", "application_credentials": "service_account"}
_GOOGLE_KEY_PARTS = frozenset({"service_account", "service_account_key"})
# The Google provider's extras that name credentials this job cannot hand to object_store, and what to use.
_GOOGLE_UNREAD = {
    "key_secret_name": "a key in Secret Manager",
    "key_secret_project_id": "a key in Secret Manager",
    "credential_config_file": "workload identity federation",
    "impersonation_chain": "service account impersonation",
    "is_anonymous": "anonymous access",
}


def amazon_provider_installed() -> bool:
    """Whether the Amazon provider is installed: it then resolves the connection (roles, profiles, ...)."""
    return importlib.util.find_spec("airflow.providers.amazon") is not None


class StorageCredentialsHook(BaseHook):
    """Reads S3 credentials from an Airflow connection, as the job's ``storage_options`` keys.

    With the Amazon provider installed, its ``AwsBaseHook`` resolves the connection (so assumed roles,
    profiles and the default credential chain work); otherwise the connection is read as: login = access
    key id, password = secret access key, extras ``region_name``, ``endpoint_url`` and
    ``aws_session_token``. The endpoint comes from the extra ``endpoint_url`` either way.

    :param aws_conn_id: the connection id.
    """

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"

    def __init__(self, *, aws_conn_id: str) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id

    def storage_options(self) -> dict[str, str]:
        """``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and, when known, ``AWS_SESSION_TOKEN``,
        ``AWS_REGION``, ``AWS_ENDPOINT_URL`` (with ``AWS_ALLOW_HTTP`` for an ``http://`` endpoint).

        :raises MergeArgumentError: the connection is not defined, or holds no usable credentials. The
            message names the connection, never its values.
        """
        try:
            connection = self.get_connection(self.aws_conn_id)
        except AirflowNotFoundException as error:
            raise self._not_defined() from error
        extra = _extras(connection.extra_dejson)
        amazon = self._from_amazon_provider() if amazon_provider_installed() else None
        return self._storage_options(connection, extra, amazon)

    async def astorage_options(self) -> dict[str, str]:
        """:meth:`storage_options` for async code (a trigger's ``run``): the connection is read with the
        task SDK's async calls, which a blocking read on the triggerer's event loop would deadlock or
        stall, and the Amazon provider's blocking resolution (it may call STS) runs in a thread."""
        try:
            connection = await self.aget_connection(self.aws_conn_id)
        except AirflowNotFoundException as error:
            raise self._not_defined() from error
        extra = _extras(await connection.aextra_dejson())
        amazon = await asyncio.to_thread(self._from_amazon_provider) if amazon_provider_installed() else None
        return self._storage_options(connection, extra, amazon)

    def _storage_options(
        self, connection: Any, extra: Mapping[str, Any], amazon: dict[str, str] | None
    ) -> dict[str, str]:
        """The options from the connection's fields, or from what the Amazon provider resolved."""
        if amazon is not None:
            options = amazon
        else:
            token, region = extra.get("aws_session_token"), extra.get("region_name")
            options = _options(connection.login, connection.password, token, region)
        endpoint = extra.get("endpoint_url") or _service_endpoint(extra)
        if endpoint:
            options["AWS_ENDPOINT_URL"] = str(endpoint)
            if str(endpoint).startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        if "AWS_ACCESS_KEY_ID" not in options or "AWS_SECRET_ACCESS_KEY" not in options:
            raise MergeArgumentError(
                f"AWS connection {self.aws_conn_id!r} (aws_conn_id) has no access key id and secret access "
                "key: set its login and password (or let the Amazon provider resolve them)."
            )
        return options

    def _not_defined(self) -> MergeArgumentError:
        return MergeArgumentError(
            f"AWS connection {self.aws_conn_id!r} (aws_conn_id) is not defined. Define it, e.g. "
            f"AIRFLOW_CONN_{self.aws_conn_id.upper()}='{{\"conn_type\": \"aws\", \"login\": "
            '"<access key id>", "password": "<secret access key>", "extra": {"region_name": ...}}\'.'
        )

    def _from_amazon_provider(self) -> dict[str, str]:
        from airflow.providers.amazon.aws.hooks.base_aws import (  # type: ignore[import-not-found,unused-ignore]
            AwsBaseHook,
        )

        hook = AwsBaseHook(aws_conn_id=self.aws_conn_id)
        try:
            credentials = hook.get_credentials()
        except Exception as error:
            # The cause's message may quote the connection; keep only its type.
            raise MergeArgumentError(
                f"AWS connection {self.aws_conn_id!r} (aws_conn_id): the Amazon provider could not resolve "
                f"credentials ({type(error).__name__})."
            ) from None
        return _options(credentials.access_key, credentials.secret_key, credentials.token, hook.region_name)


class AzureStorageCredentialsHook(BaseHook):
    """Reads Azure Blob Storage / ADLS Gen2 credentials from an Airflow connection, as the job's
    ``storage_options`` keys (object_store's names).

    The connection's fields as the Microsoft Azure provider's ``wasb`` and ``adls`` types use them (a generic
    connection with the same fields works too): *login* the storage account name and *password* its account
    key; with the extra ``tenant_id``, *login* and *password* are a service principal's client id and secret
    instead. *host* is the account URL (``https://ACCOUNT.blob.core.windows.net``) or, for an emulator or a
    private endpoint, the endpoint with the account (``http://127.0.0.1:10000/devstoreaccount1``). Extras:
    ``account_name``, ``sas_token``, ``shared_access_key`` (an account key), ``connection_string``
    (``AccountName=...;AccountKey=...`` or ``SharedAccessSignature=...``, ``BlobEndpoint=...``),
    ``tenant_id``, ``client_id``, ``client_secret``.

    :param azure_conn_id: the connection id.
    """

    conn_name_attr = "azure_conn_id"
    default_conn_name = "wasb_default"

    def __init__(self, *, azure_conn_id: str) -> None:
        super().__init__()
        self.azure_conn_id = azure_conn_id

    def storage_options(self) -> dict[str, str]:
        """``azure_storage_account_name`` with ``azure_storage_account_key``, ``azure_storage_sas_token`` or
        ``azure_storage_client_id``/``_client_secret``/``_tenant_id``, and ``azure_storage_endpoint`` (with
        ``azure_allow_http`` for ``http://``) when the host is not Azure's.

        :raises MergeArgumentError: the connection is not defined, or holds no account or no credential. The
            message names the connection and its fields, never their values.
        """
        try:
            connection = self.get_connection(self.azure_conn_id)
        except AirflowNotFoundException as error:
            raise self._not_defined() from error
        return self._storage_options(connection, _extras(connection.extra_dejson))

    async def astorage_options(self) -> dict[str, str]:
        """:meth:`storage_options` for async code (a trigger's ``run``)."""
        try:
            connection = await self.aget_connection(self.azure_conn_id)
        except AirflowNotFoundException as error:
            raise self._not_defined() from error
        return self._storage_options(connection, _extras(await connection.aextra_dejson()))

    def _storage_options(self, connection: Any, extra: Mapping[str, Any]) -> dict[str, str]:
        extra = {key.rsplit("__", 1)[-1]: value for key, value in extra.items() if value not in (None, "")}
        parts = _connection_string(str(extra.get("connection_string") or ""))
        account = extra.get("account_name") or parts.get("accountname")
        endpoint = parts.get("blobendpoint")
        host = (connection.host or "").strip()
        if host:
            url = urlsplit(host if "://" in host else f"https://{host}")
            hostname = (url.hostname or "").lower()
            if hostname.endswith(_AZURE_HOST_SUFFIXES):
                account = account or hostname.split(".", 1)[0]
            elif "://" in host:
                endpoint = endpoint or host.rstrip("/")
            else:
                account = account or host
        options: dict[str, str] = {}
        if extra.get("tenant_id"):
            # A service principal: login and password are its client id and secret (as the provider has it).
            principal = {"client_id": extra.get("client_id") or connection.login,
                         "client_secret": extra.get("client_secret") or connection.password,
                         "tenant_id": extra["tenant_id"]}  # fmt: skip
            options.update({f"azure_storage_{k}": str(v) for k, v in principal.items() if v})
        else:
            account = account or connection.login
            key = extra.get("shared_access_key") or parts.get("accountkey") or connection.password
            if key:
                options["azure_storage_account_key"] = str(key)
        sas = str(extra.get("sas_token") or parts.get("sharedaccesssignature") or "")
        if sas:
            options["azure_storage_sas_token"] = sas.split("?", 1)[1] if "?" in sas else sas
        if account:
            options["azure_storage_account_name"] = str(account)
        if endpoint:
            options["azure_storage_endpoint"] = str(endpoint)
            if str(endpoint).startswith("http://"):
                options["azure_allow_http"] = "true"
        named = f"Azure connection {self.azure_conn_id!r} (azure_conn_id)"
        secrets = {"azure_storage_account_key", "azure_storage_sas_token", "azure_storage_client_secret"}
        if not secrets & set(options):
            raise MergeArgumentError(
                f"{named} holds no credential: set its password (the account key), the extra sas_token, or "
                "the extras tenant_id with login and password as a service principal's client id and secret."
            )
        if not account and not endpoint:
            raise MergeArgumentError(
                f"{named} names no storage account: set its login (the account name), its host (the account "
                "URL) or the extra account_name."
            )
        return options

    def _not_defined(self) -> MergeArgumentError:
        return MergeArgumentError(
            f"Azure connection {self.azure_conn_id!r} (azure_conn_id) is not defined. Define it, e.g. "
            f"AIRFLOW_CONN_{self.azure_conn_id.upper()}='{{\"conn_type\": \"wasb\", \"login\": "
            '"<account name>", "password": "<account key>"}\'.'
        )


class GcsStorageCredentialsHook(BaseHook):
    """Reads GCS credentials from an Airflow connection, as the job's ``storage_options`` keys (object_store's
    names).

    The connection's extras as the Google provider's ``google_cloud_platform`` type uses them (plain or with
    its ``extra__google_cloud_platform__`` prefix; a generic connection with the same extras works too):
    ``keyfile_dict`` (a service account key, JSON text or an object) becomes ``google_service_account_key``;
    ``key_path`` (a key file every driver and executor can read) becomes ``google_service_account``. With
    neither, nothing is added and the environment's credentials apply (``GOOGLE_APPLICATION_CREDENTIALS``,
    the machines' service account), as the Google provider falls back to Application Default Credentials.

    :param gcp_conn_id: the connection id.
    """

    conn_name_attr = "gcp_conn_id"
    default_conn_name = "google_cloud_default"

    def __init__(self, *, gcp_conn_id: str) -> None:
        super().__init__()
        self.gcp_conn_id = gcp_conn_id

    def storage_options(self) -> dict[str, str]:
        """``google_service_account_key`` or ``google_service_account``, or nothing for the environment's.

        :raises MergeArgumentError: the connection is not defined, its key is not a service account key, or
            it names credentials this job cannot use (Secret Manager, workload identity federation,
            impersonation, anonymous access). The message names the connection and its extras, never a key.
        """
        try:
            connection = self.get_connection(self.gcp_conn_id)
        except AirflowNotFoundException as error:
            raise self._not_defined() from error
        return self._storage_options(_extras(connection.extra_dejson))

    async def astorage_options(self) -> dict[str, str]:
        """:meth:`storage_options` for async code (a trigger's ``run``)."""
        try:
            connection = await self.aget_connection(self.gcp_conn_id)
        except AirflowNotFoundException as error:
            raise self._not_defined() from error
        return self._storage_options(_extras(await connection.aextra_dejson()))

    def _storage_options(self, extra: Mapping[str, Any]) -> dict[str, str]:
        extra = {key.rsplit("__", 1)[-1]: value for key, value in extra.items()
                 if value not in (None, "", False)}  # fmt: skip
        named = f"Google Cloud connection {self.gcp_conn_id!r} (gcp_conn_id)"
        unread = sorted(name for name in _GOOGLE_UNREAD if name in extra)
        if unread:
            what = ", ".join(f"{name} ({_GOOGLE_UNREAD[name]})" for name in unread)
            raise MergeArgumentError(
                f"{named} sets {what}, which the merge job cannot hand to its executors: give the connection "
                "a service account key (the extra keyfile_dict, or key_path to a file every driver and "
                "executor can read), or leave it without a key so the environment's credentials apply."
            )
        key = extra.get("keyfile_dict")
        if key is not None:
            return {"google_service_account_key": _service_account_key(key, named)}
        if extra.get("key_path"):
            return {"google_service_account": str(extra["key_path"])}
        return {}

    def _not_defined(self) -> MergeArgumentError:
        return MergeArgumentError(
            f"Google Cloud connection {self.gcp_conn_id!r} (gcp_conn_id) is not defined. Define it, e.g. "
            f"AIRFLOW_CONN_{self.gcp_conn_id.upper()}='{{\"conn_type\": \"google_cloud_platform\", "
            '"extra": {"keyfile_dict": <the service account key JSON>}}\' (or "key_path": a key file).'
        )


def _service_account_key(key: Any, named: str) -> str:
    """The extra ``keyfile_dict`` as JSON text, checked to be a service account key (never quoted)."""
    try:
        parsed = json.loads(key) if isinstance(key, str) else key
    except ValueError:
        parsed = None
    if not isinstance(parsed, Mapping) or not {"client_email", "private_key"} <= set(parsed):
        raise MergeArgumentError(
            f"{named}: the extra keyfile_dict is not a service account key (JSON with client_email and "
            "private_key, as the Cloud console downloads it)."
        )
    return json.dumps(dict(parsed))


def connection_storage_options(
    storage_options: Mapping[str, str], *, uri: str | None, aws_conn_id: str | None = None,
    azure_conn_id: str | None = None, gcp_conn_id: str | None = None,
) -> tuple[dict[str, str], str | None]:  # fmt: skip
    """``storage_options`` completed with the credentials of the connection for ``uri``'s store (S3:
    ``aws_conn_id``, Azure: ``azure_conn_id``, GCS: ``gcp_conn_id``; only that connection is read), and how
    storage errors name the connection (``"aws_conn_id='lake_s3'"``), or None when its keys are not used
    (explicit keys win)."""
    named, hook = _connection_for(uri, aws_conn_id, azure_conn_id, gcp_conn_id)
    if hook is None:
        return dict(storage_options), None
    completed = with_credentials(hook.storage_options(), storage_options, uri=uri)
    return completed, _named_if_used(named, storage_options, completed)


async def aconnection_storage_options(
    storage_options: Mapping[str, str], *, uri: str | None, aws_conn_id: str | None = None,
    azure_conn_id: str | None = None, gcp_conn_id: str | None = None,
) -> tuple[dict[str, str], str | None]:  # fmt: skip
    """:func:`connection_storage_options` for async code (a trigger's ``run``)."""
    named, hook = _connection_for(uri, aws_conn_id, azure_conn_id, gcp_conn_id)
    if hook is None:
        return dict(storage_options), None
    completed = with_credentials(await hook.astorage_options(), storage_options, uri=uri)
    return completed, _named_if_used(named, storage_options, completed)


def _connection_for(
    uri: str | None, aws_conn_id: str | None, azure_conn_id: str | None, gcp_conn_id: str | None
) -> tuple[str, Any]:
    """(how errors name it, its hook) of the connection for ``uri``'s store, or ("", None)."""
    store = _store(uri)
    if store == "s3" and aws_conn_id is not None:
        return f"aws_conn_id={aws_conn_id!r}", StorageCredentialsHook(aws_conn_id=aws_conn_id)
    if store == "azure" and azure_conn_id is not None:
        return f"azure_conn_id={azure_conn_id!r}", AzureStorageCredentialsHook(azure_conn_id=azure_conn_id)
    if store == "gcs" and gcp_conn_id is not None:
        return f"gcp_conn_id={gcp_conn_id!r}", GcsStorageCredentialsHook(gcp_conn_id=gcp_conn_id)
    return "", None


def _named_if_used(named: str, given: Mapping[str, str], completed: Mapping[str, str]) -> str | None:
    added = [key for key in completed if key not in given]
    return named if secret_option_keys(dict.fromkeys(added, "")) else None


def with_credentials(
    credentials: Mapping[str, str], storage_options: Mapping[str, str], *, uri: str | None
) -> dict[str, str]:
    """``storage_options`` completed with ``credentials`` when ``uri`` is on their store (``AWS_*`` keys:
    S3; ``azure_*`` keys: Azure; ``google_*`` keys: GCS); explicit keys win, and an explicit credential is
    never mixed with the connection's."""
    store = _credentials_store(credentials)
    if _store(uri) != store:
        return dict(storage_options)
    canonical, parts = {"azure": (_azure_canonical, _AZURE_KEY_PARTS), "s3": (_canonical, _KEY_PARTS),
                        "gcs": (_google_canonical, _GOOGLE_KEY_PARTS)}[store]  # fmt: skip
    given = {canonical(key) for key in storage_options}
    if given & parts:
        # A key given explicitly is used whole: never its id with the connection's secret.
        given |= parts
    added = {key: value for key, value in credentials.items() if canonical(key) not in given}
    return {**added, **storage_options}


def secret_option_keys(storage_options: Mapping[str, str]) -> list[str]:
    """The keys of ``storage_options`` whose values are secrets (sorted), by the job's rule."""
    return sorted(key for key in storage_options if is_secret_option(key))


def _canonical(key: str) -> str:
    name = key.upper().removeprefix("AWS_")
    return _ALIASES.get(name, name)


def _credentials_store(credentials: Mapping[str, str]) -> str:
    """The store a connection's credentials are for, by their keys' prefix."""
    keys = [key.lower() for key in credentials]
    if any(key.startswith("azure_") for key in keys):
        return "azure"
    return "gcs" if any(key.startswith("google_") for key in keys) else "s3"


def _google_canonical(key: str) -> str:
    name = key.lower().removeprefix("google_")
    return _GOOGLE_ALIASES.get(name, name)


def _azure_canonical(key: str) -> str:
    name = key.lower().removeprefix("azure_storage_").removeprefix("azure_")
    return _AZURE_ALIASES.get(name, name)


def _store(uri: str | None) -> str | None:
    if uri is None:
        return None
    scheme = uri.partition("://")[0].lower() if "://" in uri else ""
    if f"{scheme}://" in _S3_SCHEMES:
        return "s3"
    if scheme in _GCS_SCHEMES:
        return "gcs"
    return "azure" if scheme in AZURE_SCHEMES else None


def _connection_string(text: str) -> dict[str, str]:
    """An Azure Storage connection string's fields, by lowercased name (``accountname``, ``accountkey``,
    ``sharedaccesssignature``, ``blobendpoint``)."""
    fields = (part.partition("=") for part in text.split(";") if "=" in part)
    return {name.strip().lower(): value.strip() for name, _, value in fields}


def _options(
    access_key: str | None, secret_key: str | None, token: Any, region: Any
) -> dict[str, str]:
    values = {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key,
              "AWS_SESSION_TOKEN": token, "AWS_REGION": region}  # fmt: skip
    return {key: str(value) for key, value in values.items() if value}


def _extras(extra: Any) -> dict[str, Any]:
    return dict(extra) if isinstance(extra, Mapping) else {}


def _service_endpoint(extra: Mapping[str, Any]) -> str | None:
    # The Amazon provider's per-service form: {"service_config": {"s3": {"endpoint_url": ...}}}.
    service = extra.get("service_config")
    s3 = service.get("s3") if isinstance(service, Mapping) else None
    endpoint = s3.get("endpoint_url") if isinstance(s3, Mapping) else None
    return str(endpoint) if endpoint else None
