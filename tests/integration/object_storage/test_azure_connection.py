"""Azure credentials from an Airflow connection (``azure_conn_id``, a ``wasb`` connection given as an
environment variable, as a secrets backend hands it over) against Azurite: a whole merge with the options
the connection gives, the sensor finding its commit, and a wrong key in the connection failing the operator
before anything is launched, naming the connection, never the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk.execution_time.context import OutletEventAccessors
from deltalake import write_deltalake

from airflow_merge_provider.errors import StorageRefusedError
from airflow_merge_provider.hooks.storage_credentials import AzureStorageCredentialsHook
from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from airflow_merge_provider.sensors.merge_commit import MergeCommitSensor
from tests.integration.object_storage.table_io import UPSERT, kv, merge
from tests.integration.object_storage.test_azure_merge import parquet_source, rows
from tests.integration.object_storage.test_azure_storage import WRONG_KEY
from tests.support.azurite_server import AzuriteServer

CONN_ID = "lake_adls"
START = pendulum.datetime(2024, 1, 1, tz="UTC")


def _define(monkeypatch: pytest.MonkeyPatch, azurite: AzuriteServer, key: str) -> None:
    connection = {"conn_type": "wasb", "host": azurite.endpoint, "login": azurite.account, "password": key}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))


def test_a_merge_with_the_connections_credentials_and_the_sensor_finding_it(
    spark: Any, azurite: AzuriteServer, container: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _define(monkeypatch, azurite, azurite.account_key)
    options = AzureStorageCredentialsHook(azure_conn_id=CONN_ID).storage_options()
    assert options == azurite.storage_options()
    uri = f"az://{container}/orders"
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options)
    source = parquet_source(azurite, container, "incoming", kv([(2, "B"), (3, "c")]))

    metrics = merge(spark, uri, options, {**source, "storage_options": options})

    assert rows(azurite, uri, container, "orders", tmp_path) == [(1, "a"), (2, "B"), (3, "c")]
    with DAG("dag", schedule=None, start_date=START):
        sensor = MergeCommitSensor(task_id="wait", target=uri, after_version=0, azure_conn_id=CONN_ID)
    found = sensor.poke({"outlet_events": OutletEventAccessors()})  # type: ignore[typeddict-item]
    assert isinstance(found, PokeReturnValue)
    assert found.is_done
    assert found.xcom_value["tableVersion"] == metrics["tableVersion"] == 1
    assert found.xcom_value["numTargetRowsUpdated"] == 1


def test_a_wrong_key_in_the_connection_fails_the_operator_once_naming_it(
    azurite: AzuriteServer, container: str, monkeypatch: pytest.MonkeyPatch, make_context: Any,
    spark_local: str, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _define(monkeypatch, azurite, WRONG_KEY)
    uri = f"az://{container}/guarded"
    write_deltalake(uri, kv([(1, "a")]), storage_options=azurite.storage_options())
    source = {"uri": f"az://{container}/src", "format": "parquet"}
    with DAG("dag", schedule=None, start_date=START):
        operator = MergeIntoOperator(task_id="merge", target=uri, source=source, merge_sql=UPSERT,
                                     conn_id=spark_local, azure_conn_id=CONN_ID)  # fmt: skip

    with pytest.raises(StorageRefusedError) as raised:
        operator.execute(make_context())

    assert isinstance(raised.value, AirflowFailException)  # not retried
    assert str(raised.value).startswith(
        f"Reading the Delta log of table {uri} failed: the store did not accept the credentials (403 "
        f"Forbidden, AuthorizationFailure). They came from azure_conn_id={CONN_ID!r}: check the account name"
    )
    assert WRONG_KEY not in str(raised.value) + capsys.readouterr().out
