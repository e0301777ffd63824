"""MergeCommitSensor and MergeCommitTrigger on a table in S3 (moto, request signing enforced), with the
credentials read from an Airflow connection (``aws_conn_id``): in the worker when poking, in the triggerer
when deferred, and never in the trigger's serialized row."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import traceback
from typing import Any, cast

import pendulum
import pytest
from airflow.sdk import DAG, Asset, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_merge_provider.assets import table_asset
from airflow_merge_provider.errors import MergeArgumentError, StorageRefusedError
from airflow_merge_provider.sensors.merge_commit import MergeCommitSensor
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger
from spark_jobs.delta_merge.commit.actions import attempt_commit
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from tests.integration.object_storage.s3_tables import create_table, plan, write_file
from tests.support.s3_server import REGION, S3Key, S3Server

CONN_ID = "lake_s3"
APP_ID = "orders-dag"
WRONG_SECRET = "wrong-sensor-secret-3Jq8Zr5Vx1Lm"


def _define_connection(monkeypatch: pytest.MonkeyPatch, server: S3Server, key: S3Key) -> None:
    """The connection ``lake_s3`` as an environment variable, the way a deployment's secrets backend would
    hand it to the worker and the triggerer."""
    connection = {
        "conn_type": "aws", "login": key.access_key_id, "password": key.secret_access_key,
        "extra": {"region_name": REGION, "endpoint_url": server.endpoint},
    }  # fmt: skip
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))


def _commit_merge(server: S3Server, uri: str) -> None:
    """Version 1 of the table: a MERGE commit recording app transaction (orders-dag, 3), as the job writes."""
    options = server.storage_options()
    snapshot = load_snapshot(uri, storage_options=options)
    removed = next(f for f in snapshot.files if f.partition_values["p"] == "a")
    added = write_file(server, uri, "a", [10, 11])
    merge = plan(snapshot, [added], removes=[removed], app_transaction=(APP_ID, 3))
    assert attempt_commit(merge, base_version=snapshot.version, storage_options=options) == 1


def _sensor(target: str, **kwargs: Any) -> MergeCommitSensor:
    with DAG("dag", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
        return MergeCommitSensor(task_id="wait", target=target, **kwargs)


def _context() -> Context:
    # The sensor reads only the outlet events from its context (to attach the metrics to the asset event).
    return cast("Context", {"outlet_events": OutletEventAccessors()})


async def _events(trigger: MergeCommitTrigger) -> list[dict[str, Any]]:
    """Every event run() yields until it returns (a trigger yields exactly one)."""

    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return await asyncio.wait_for(collect(), timeout=60)


def _rebuilt(trigger: MergeCommitTrigger) -> MergeCommitTrigger:
    """The trigger as the triggerer builds it: from its serialized class path and keyword arguments only."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert isinstance(rebuilt, MergeCommitTrigger)
    return rebuilt


def _assert_no_secret(text: str, server: S3Server) -> None:
    assert WRONG_SECRET not in text
    assert server.admin.secret_access_key not in text
    assert server.reader.secret_access_key not in text


def test_poke_reads_the_log_with_the_connections_credentials(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"s3://{bucket}/orders"
    create_table(s3_server, uri)
    _define_connection(monkeypatch, s3_server, s3_server.reader)
    sensor = _sensor(uri, app_id=APP_ID, aws_conn_id=CONN_ID, outlets=[table_asset(uri)])
    context = _context()

    assert sensor.poke(context) is False
    _commit_merge(s3_server, uri)
    result = sensor.poke(context)

    assert isinstance(result, PokeReturnValue)
    assert result.is_done
    metrics = result.xcom_value
    assert isinstance(metrics, dict)
    assert (metrics["tableVersion"], metrics["appId"], metrics["appVersion"]) == (1, APP_ID, 3)
    assert metrics["numTargetRowsInserted"] == 1
    assert context["outlet_events"][Asset(uri=uri)].extra == metrics


def test_explicit_storage_options_win_over_the_connection(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"s3://{bucket}/orders"
    create_table(s3_server, uri)
    _commit_merge(s3_server, uri)
    wrong = dataclasses.replace(s3_server.reader, secret_access_key=WRONG_SECRET)
    _define_connection(monkeypatch, s3_server, wrong)
    # The reader's whole key is given explicitly: the connection's (wrong) secret must not replace it.
    explicit = {"AWS_ACCESS_KEY_ID": s3_server.reader.access_key_id,
                "AWS_SECRET_ACCESS_KEY": s3_server.reader.secret_access_key}  # fmt: skip
    sensor = _sensor(uri, after_version=0, aws_conn_id=CONN_ID, storage_options=explicit)

    result = sensor.poke(_context())

    assert isinstance(result, PokeReturnValue)
    assert isinstance(result.xcom_value, dict)
    assert result.xcom_value["tableVersion"] == 1


def test_deferred_the_trigger_row_holds_no_secret_and_the_triggerer_finds_the_commit(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"s3://{bucket}/orders"
    create_table(s3_server, uri)
    _define_connection(monkeypatch, s3_server, s3_server.reader)
    not_secret = {"AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}
    sensor = _sensor(uri, after_version=0, aws_conn_id=CONN_ID, storage_options=not_secret, deferrable=True,
                     poke_interval=0.2, timeout=60)  # fmt: skip

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(_context())  # no merge commit yet: the sensor defers

    trigger = deferred.value.trigger
    assert isinstance(trigger, MergeCommitTrigger)
    row = json.dumps(trigger.serialize())
    _assert_no_secret(row, s3_server)
    assert s3_server.reader.access_key_id not in row
    assert trigger.serialize()[1]["aws_conn_id"] == CONN_ID
    assert trigger.serialize()[1]["storage_options"] == not_secret

    _commit_merge(s3_server, uri)
    (event,) = asyncio.run(_events(_rebuilt(trigger)))

    assert event["status"] == "success"
    assert (event["commit"]["version"], event["commit"]["app_id"], event["commit"]["app_version"]) == (
        1,
        APP_ID,
        3,
    )
    assert event["commit"]["commit_info"]["operation"] == "MERGE"
    metrics = sensor.execute_complete(_context(), event)
    assert (metrics["tableVersion"], metrics["appVersion"]) == (1, 3)


def test_a_deferrable_sensor_refuses_secret_storage_options_naming_the_key_only(
    s3_server: S3Server, bucket: str
) -> None:
    options = s3_server.storage_options()
    instead = "pass aws_conn_id, azure_conn_id or gcp_conn_id instead"
    with pytest.raises(MergeArgumentError, match=instead) as refused:
        _sensor(f"s3://{bucket}/orders", app_id=APP_ID, storage_options=options, deferrable=True)

    message = str(refused.value)
    assert "AWS_SECRET_ACCESS_KEY" in message
    _assert_no_secret(message, s3_server)
    # Not deferrable, the same options are fine: nothing is serialized.
    assert _sensor(f"s3://{bucket}/orders", app_id=APP_ID, storage_options=options).storage_options == options


def test_a_wrong_secret_in_the_connection_is_a_readable_error_without_the_secret(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/orders"
    create_table(s3_server, uri)
    wrong = dataclasses.replace(s3_server.admin, secret_access_key=WRONG_SECRET)
    _define_connection(monkeypatch, s3_server, wrong)
    sensor = _sensor(uri, after_version=0, aws_conn_id=CONN_ID)

    with caplog.at_level(logging.DEBUG), pytest.raises(StorageRefusedError) as raised:
        sensor.poke(_context())

    text = "".join(traceback.format_exception(raised.value)) + caplog.text
    # The job's message, once: the table, the operation, the store's answer and the connection.
    assert str(raised.value).startswith(f"Reading the Delta log of table {uri} failed: the store did not "
                                        "accept the credentials (403 Forbidden, SignatureDoesNotMatch). "
                                        f"They came from aws_conn_id={CONN_ID!r}")  # fmt: skip
    assert isinstance(raised.value, AirflowFailException)  # not retried
    _assert_no_secret(text, s3_server)

    caplog.clear()
    trigger = MergeCommitTrigger(target=uri, after_version=0, aws_conn_id=CONN_ID, poll_interval=0.2)
    with caplog.at_level(logging.DEBUG):
        (event,) = asyncio.run(_events(trigger))

    assert (event["status"], event["timed_out"]) == ("error", False)
    assert event["refused"] is True
    assert event["message"] == str(raised.value)
    _assert_no_secret(event["message"] + caplog.text, s3_server)
    with pytest.raises(StorageRefusedError, match=f"Reading the Delta log of table {uri} failed"):
        sensor.execute_complete(_context(), event)


def test_a_missing_bucket_is_a_readable_error(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = "s3://no-such-bucket-for-sensor/orders"
    _define_connection(monkeypatch, s3_server, s3_server.admin)
    trigger = MergeCommitTrigger(target=uri, app_id=APP_ID, aws_conn_id=CONN_ID, poll_interval=0.2)

    (event,) = asyncio.run(_events(trigger))

    assert (event["status"], event["timed_out"]) == ("error", False)
    assert event["message"].startswith(f"Reading the Delta log of table {uri} failed: the bucket "
                                       "'no-such-bucket-for-sensor' does not exist (404 Not Found, "
                                       "NoSuchBucket)")  # fmt: skip
    assert event["refused"] is True
    _assert_no_secret(event["message"], s3_server)
