"""MergeCommitSensor: poke, reschedule and deferrable modes share find_merge_commit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG, Asset
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, TaskDeferred

from airflow_merge_provider.assets import table_asset
from airflow_merge_provider.errors import MergeArgumentError
from airflow_merge_provider.hooks.merge_commit import find_merge_commit
from airflow_merge_provider.sensors.merge_commit import MergeCommitSensor
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger
from tests.support.airflow_fixtures import ContextFactory
from tests.support.delta_tables import UPSERT_METRICS, commit_merge, create_table


def _sensor(table: str, **kwargs: Any) -> MergeCommitSensor:
    with DAG("dag", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
        return MergeCommitSensor(task_id="wait", target=table, **kwargs)


def test_poke_returns_the_commit_metrics_once_it_is_there(
    tmp_path: Path, make_context: ContextFactory
) -> None:
    table = create_table(tmp_path / "t")
    sensor = _sensor(table, app_id="{{ ti.xcom_pull(task_ids='merge')['appId'] }}", app_version="{{ 0 }}",
                     outlets=[table_asset(table)])  # fmt: skip
    context = make_context(xcoms={"merge": {"appId": "a", "appVersion": 0}})
    sensor.render_template_fields(context)
    assert (sensor.app_id, sensor.app_version) == ("a", "0")

    assert sensor.poke(context) is False
    commit_merge(table, app_id="a", app_version=0)
    result = sensor.poke(context)

    assert result
    assert not isinstance(result, bool)
    metrics = result.xcom_value
    assert isinstance(metrics, dict)
    assert {name: metrics[name] for name in UPSERT_METRICS} == UPSERT_METRICS
    assert (metrics["tableVersion"], metrics["appId"], metrics["appVersion"]) == (1, "a", 0)
    assert context["outlet_events"][Asset(uri=f"file://{table}")].extra == metrics


@pytest.mark.parametrize("mode", ["poke", "reschedule"])
def test_execute_returns_the_metrics_in_both_waiting_modes(
    tmp_path: Path, make_context: ContextFactory, mode: str
) -> None:
    table = create_table(tmp_path / "t")
    commit_merge(table, app_id="a", app_version=0)
    result = _sensor(table, after_version=0, mode=mode, poke_interval=1, timeout=5).execute(make_context())
    assert result["tableVersion"] == 1
    assert result["numTargetRowsUpdated"] == 2


def test_poke_mode_times_out(tmp_path: Path, make_context: ContextFactory) -> None:
    table = create_table(tmp_path / "t")
    with pytest.raises(AirflowSensorTimeout):
        _sensor(table, app_id="a", app_version=0, poke_interval=0.1, timeout=0.3).execute(make_context())


def test_deferrable_defers_to_the_trigger_with_the_rendered_query(
    tmp_path: Path, make_context: ContextFactory
) -> None:
    table = create_table(tmp_path / "t")
    sensor = _sensor(table, after_version="{{ 0 }}", deferrable=True, poke_interval=7, timeout=60)
    context = make_context()
    sensor.render_template_fields(context)

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)

    trigger = deferred.value.trigger
    assert isinstance(trigger, MergeCommitTrigger)
    assert (trigger.target, trigger.after_version, trigger.app_id, trigger.poll_interval) == (
        table,
        0,
        None,
        7,
    )
    assert trigger.deadline is not None
    assert deferred.value.method_name == "execute_complete"


def test_deferrable_does_not_defer_when_the_commit_is_already_there(
    tmp_path: Path, make_context: ContextFactory
) -> None:
    table = create_table(tmp_path / "t")
    commit_merge(table, app_id="a", app_version=0)
    result = _sensor(table, app_id="a", deferrable=True).execute(make_context())
    assert result["appVersion"] == 0


def test_execute_complete_parses_the_one_event(tmp_path: Path, make_context: ContextFactory) -> None:
    table = create_table(tmp_path / "t")
    commit_merge(table, app_id="a", app_version=0)
    commit = find_merge_commit(table, app_id="a", app_version=0)
    assert commit is not None
    sensor = _sensor(table, app_id="a", deferrable=True)

    metrics = sensor.execute_complete(make_context(), {"status": "success", "commit": commit.to_dict()})
    assert metrics == commit.metrics()
    with pytest.raises(AirflowSensorTimeout, match="Timed out"):
        sensor.execute_complete(
            make_context(), {"status": "error", "message": "Timed out", "timed_out": True}
        )
    with pytest.raises(AirflowException, match="boom"):
        sensor.execute_complete(make_context(), {"status": "error", "message": "boom", "timed_out": False})


def test_arguments_are_checked(tmp_path: Path, make_context: ContextFactory) -> None:
    with pytest.raises(ValueError, match="app_id"):
        _sensor("/t")
    with pytest.raises(ValueError, match="app_version needs app_id"):
        _sensor("/t", app_version=1, after_version=0)
    sensor = _sensor(create_table(tmp_path / "t"), app_id="a", app_version="{{ 'x' }}")
    context = make_context()
    sensor.render_template_fields(context)
    with pytest.raises(MergeArgumentError, match="app_version must be an integer, found 'x'"):
        sensor.poke(context)


def test_a_deferrable_sensor_refuses_secret_storage_options_before_deferring(
    tmp_path: Path, make_context: ContextFactory
) -> None:
    secret = "sensor-secret-0c9d8e7f"
    instead = "pass aws_conn_id, azure_conn_id or gcp_conn_id instead"
    with pytest.raises(MergeArgumentError, match=instead) as refused:
        _sensor("/t", after_version=0, deferrable=True,
                storage_options={"AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "eu-west-1"})  # fmt: skip
    assert "AWS_SECRET_ACCESS_KEY" in str(refused.value)
    assert secret not in str(refused.value)
    assert "AWS_REGION" not in str(refused.value)

    # Made deferrable after construction: execute checks again, before its first look at the log.
    table = create_table(tmp_path / "t")
    sensor = _sensor(table, after_version=0, storage_options={"azure_storage_sas_key": secret})
    sensor.deferrable = True
    with pytest.raises(MergeArgumentError, match="azure_storage_sas_key") as refused:
        sensor.execute(make_context())
    assert secret not in str(refused.value)


def test_a_deferred_trigger_carries_the_connection_id_and_the_options_without_secrets(
    tmp_path: Path, make_context: ContextFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = {"conn_type": "aws", "login": "AKIA1", "password": "pw"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps(connection))
    table = create_table(tmp_path / "t")
    options = {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true"}
    sensor = _sensor(table, after_version=0, deferrable=True, storage_options=options, aws_conn_id="lake")

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(make_context())

    trigger = deferred.value.trigger
    assert isinstance(trigger, MergeCommitTrigger)
    assert (trigger.aws_conn_id, trigger.storage_options) == ("lake", options)
