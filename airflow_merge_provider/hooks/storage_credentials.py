"""StorageCredentialsHook: an Airflow connection's AWS credentials as deltalake-style storage options."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_merge_provider.errors import MergeArgumentError

__all__ = ["StorageCredentialsHook", "amazon_provider_installed", "secret_option_keys", "with_credentials"]

# The URI schemes whose storage options take AWS credentials.
_S3_SCHEMES = ("s3://", "s3a://")
# Spellings deltalake and object_store take for the same option (after dropping ``AWS_``).
_ALIASES = {"ENDPOINT": "ENDPOINT_URL", "TOKEN": "SESSION_TOKEN", "DEFAULT_REGION": "REGION"}
_KEY_PARTS = frozenset({"ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN"})
# Words that make a storage option a secret: the job masks the values of such keys in its errors
# (spark_jobs.delta_merge.log_store, which imports obstore and so is not imported here to parse DAGs;
# a test keeps the two lists equal).
SECRET_WORDS = (
    "secret", "token", "password", "sas", "signature", "credential", "account_key", "private", "master_key",
    "encryption_key",
)  # fmt: skip


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


def with_credentials(
    credentials: Mapping[str, str], storage_options: Mapping[str, str], *, uri: str | None
) -> dict[str, str]:
    """``storage_options`` completed with ``credentials`` when ``uri`` is on S3; explicit keys win."""
    if uri is None or not uri.lower().startswith(_S3_SCHEMES):
        return dict(storage_options)
    given = {_canonical(key) for key in storage_options}
    if given & _KEY_PARTS:
        # A key given explicitly is used whole: never its id with the connection's secret.
        given |= _KEY_PARTS
    added = {key: value for key, value in credentials.items() if _canonical(key) not in given}
    return {**added, **storage_options}


def secret_option_keys(storage_options: Mapping[str, str]) -> list[str]:
    """The keys of ``storage_options`` whose values are secrets (sorted), by the job's rule."""
    return sorted(key for key in storage_options if any(word in key.lower() for word in SECRET_WORDS))


def _canonical(key: str) -> str:
    name = key.upper().removeprefix("AWS_")
    return _ALIASES.get(name, name)


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
