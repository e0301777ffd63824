"""MergeCommitSensor: wait for a merge commit in a Delta table's log and return its metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout

from airflow_merge_provider.argument_check import reject_unknown_arguments
from airflow_merge_provider.assets import record_merge_event
from airflow_merge_provider.errors import MergeArgumentError, StorageRefusedError, one_clear_message
from airflow_merge_provider.hooks.merge_commit import MergeCommit, find_merge_commit
from airflow_merge_provider.hooks.storage_credentials import connection_storage_options, secret_option_keys
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger

__all__ = ["SENSOR_ARGUMENT_MEANINGS", "MergeCommitSensor"]

# The names other sensors and operators give these settings (reject_unknown_arguments' hints).
SENSOR_ARGUMENT_MEANINGS: dict[str, str] = {
    **dict.fromkeys(("table", "target_table", "table_name", "path", "target_path", "target_uri",
                     "delta_table"), "target"),
    **dict.fromkeys(("poll_interval", "polling_period_seconds", "check_interval"), "poke_interval"),
    **dict.fromkeys(("aws_conn", "s3_conn_id", "aws_connection_id", "conn_id"), "aws_conn_id"),
    **dict.fromkeys(("azure_conn", "wasb_conn_id", "adls_conn_id", "azure_data_lake_conn_id"),
                    "azure_conn_id"),
    **dict.fromkeys(("google_cloud_storage_conn_id", "gcs_conn_id", "google_conn_id", "gcp_conn"),
                    "gcp_conn_id"),
    **dict.fromkeys(("version", "table_version", "min_version"), "after_version"),
    **dict.fromkeys(("idempotency_key", "txn_app_id", "application_id"), "app_id"),
    **dict.fromkeys(("txn_version", "idempotency_version"), "app_version"),
}


class MergeCommitSensor(BaseSensorOperator):
    """Wait until ``target``'s Delta log holds a merge commit; push that commit's metrics as XCom.

    Wait for the merge of one application, ``app_id`` (and ``app_version``; without it, the latest
    version the table records for that app id), or for any merge commit made by this provider's job
    above ``after_version``. The XCom value has the shape of MergeIntoOperator's (ints). Outlets naming
    the table's asset get the metrics as their event's extra.

    Works in ``poke`` and ``reschedule`` modes, and with ``deferrable=True`` through
    :class:`MergeCommitTrigger` (the triggerer polls; no worker slot is held).

    For a table on S3, give the credentials as ``aws_conn_id`` (on Azure, ``azure_conn_id``; on GCS,
    ``gcp_conn_id``): they are read from the connection where
    the log is read (the worker when poking, the triggerer when deferred) and never stored. A deferrable
    sensor refuses secret ``storage_options`` (keys, tokens, passwords), as the trigger's row in the
    metadata database would hold them.

    :param target: (required) the Delta table's path or URI. (templated)
    :param app_id: the merge's application id, e.g. MergeIntoOperator's ``appId`` XCom. (templated)
    :param app_version: the merge's application version; an int or its text. (templated)
    :param after_version: wait for a merge commit above this table version; an int or its text.
        (templated)
    :param storage_options: passed to deltalake. With ``deferrable=True`` only options without secrets
        (endpoint, region, ``AWS_ALLOW_HTTP``, ...): the trigger's row would store them.
    :param aws_conn_id: an Airflow connection whose AWS credentials (and extras ``region_name``,
        ``endpoint_url``) complete ``storage_options`` for an S3 target; keys given in ``storage_options``
        win. Read when the log is read (with the Amazon provider when it is installed, else login = access
        key id, password = secret, extra ``aws_session_token``); a trigger carries only the id. Not
        templated.
    :param azure_conn_id: likewise for an Azure target: a ``wasb``, ``adls`` or generic connection (login:
        the storage account, password: its key; or extras ``sas_token``, ``connection_string``,
        ``tenant_id`` with a service principal; see MergeIntoOperator). Not templated.
    :param gcp_conn_id: likewise for a GCS target: a ``google_cloud_platform`` or generic connection with
        the extra ``keyfile_dict`` (a service account key) or ``key_path``. Not templated.
    :param deferrable: wait in the triggerer rather than in a worker.
    """

    template_fields: Sequence[str] = ("target", "app_id", "app_version", "after_version")
    ui_color = "#b3e5f0"

    def __init__(
        self,
        *,
        # Required: None only so that a misnamed one gets its hint first (reject_unknown_arguments).
        target: str | None = None,
        app_id: str | None = None,
        app_version: int | str | None = None,
        after_version: int | str | None = None,
        storage_options: Mapping[str, str] | None = None,
        aws_conn_id: str | None = None,
        azure_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        reject_unknown_arguments(type(self), kwargs, meanings=SENSOR_ARGUMENT_MEANINGS,
                                 required={"target": target})
        if app_id is None and after_version is None:
            raise ValueError("MergeCommitSensor: give app_id (and app_version) or after_version")
        if app_id is None and app_version is not None:
            raise ValueError("MergeCommitSensor: app_version needs app_id")
        super().__init__(**kwargs)
        self.target: str = target or ""  # given: checked above
        self.app_id = app_id
        self.app_version = app_version
        self.after_version = after_version
        self.storage_options = dict(storage_options or {})
        self.aws_conn_id = aws_conn_id
        self.azure_conn_id = azure_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.deferrable = deferrable
        self._refuse_secrets_for_the_trigger()

    def _query(self) -> dict[str, Any]:
        """The rendered fields as find_merge_commit's arguments (templated numbers arrive as text)."""
        return {
            "app_id": self.app_id or None,
            "app_version": _optional_int(self.app_version, "app_version"),
            "after_version": _optional_int(self.after_version, "after_version"),
        }

    def _find(self) -> MergeCommit | None:
        """One look at the log from the worker, with the connection's credentials read now."""
        query = self._query()
        storage_options, named = connection_storage_options(self.storage_options, uri=self.target,
                                                            aws_conn_id=self.aws_conn_id,
                                                            azure_conn_id=self.azure_conn_id,
                                                            gcp_conn_id=self.gcp_conn_id)  # fmt: skip
        return find_merge_commit(self.target, storage_options=storage_options, credentials_from=named,
                                 **query)  # fmt: skip

    def _refuse_secrets_for_the_trigger(self) -> None:
        """A deferred sensor's trigger is serialized into the metadata database: no secret may go there."""
        secret_keys = secret_option_keys(self.storage_options) if self.deferrable else []
        if secret_keys:
            raise MergeArgumentError(
                f"MergeCommitSensor: storage_options {', '.join(secret_keys)} hold secrets, which a "
                "deferrable sensor would store in the metadata database with its trigger: pass aws_conn_id, "
                "azure_conn_id or gcp_conn_id instead (the triggerer reads the connection when it polls), or "
                "set deferrable=False. "
                "Options without secrets (endpoint, region, allow_http) may stay in storage_options."
            )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        commit = self._find()
        if commit is None:
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._complete(context, commit))

    def execute(self, context: Context) -> Any:
        with one_clear_message(self.log):
            return self._execute(context)

    def _execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # Checked again here: deferrable or storage_options may have been changed after construction.
        self._refuse_secrets_for_the_trigger()
        commit = self._find()
        if commit is not None:
            return self._complete(context, commit)
        self.defer(
            trigger=MergeCommitTrigger(
                target=self.target, storage_options=self.storage_options, aws_conn_id=self.aws_conn_id,
                azure_conn_id=self.azure_conn_id, gcp_conn_id=self.gcp_conn_id,
                poll_interval=self.poke_interval, deadline=time.time() + self.timeout, **self._query(),
            ),
            method_name="execute_complete",
        )  # fmt: skip

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, Any]:
        """Resume after the trigger's one event."""
        if event.get("status") == "success":
            return self._complete(context, MergeCommit.from_dict(event["commit"]))
        if event.get("timed_out"):
            raise AirflowSensorTimeout(str(event.get("message")))
        if event.get("refused"):
            raise StorageRefusedError(f"MergeCommitSensor: {event.get('message')}")
        raise AirflowException(f"MergeCommitSensor: {event.get('message')}")

    def _complete(self, context: Context, commit: MergeCommit) -> dict[str, Any]:
        metrics = commit.metrics()
        self.log.info("Found merge commit version %d of %s (app %s, version %s)", commit.version, self.target,
                      commit.app_id, commit.app_version)  # fmt: skip
        record_merge_event(context, self.outlets, target=self.target, metrics=metrics)
        return metrics


def _optional_int(value: int | str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise MergeArgumentError(f"MergeCommitSensor: {name} must be an integer, found {value!r}")
    try:
        return int(value)
    except ValueError:
        raise MergeArgumentError(f"MergeCommitSensor: {name} must be an integer, found {value!r}") from None
