"""MergeIntoOperator(deferrable=True): submit, defer to MergeCommitTrigger, one event, execute_complete.

The trigger runs as the triggerer would run it: rebuilt from its serialized form, in an event loop.
spark-submit is slow_driver.py's fake, whose driver waits to be released, so the task defers while it runs.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Asset, Context
from airflow.sdk.exceptions import AirflowTaskTimeout, TaskDeferred

from airflow_merge_provider.driver_process import DriverRef, driver_state
from airflow_merge_provider.errors import MergeArgumentError, MergeJobFailedError, MergeJobRejectedError
from airflow_merge_provider.hooks.merge_commit import find_merge_commit
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger
from tests.support.airflow_fixtures import ContextFactory
from tests.support.delta_tables import create_table
from tests.support.operator_helpers import (
    APP_ID,
    JOB_METRICS,
    MemoryTaskStateStore,
    merge_operator,
    runtime_context,
)
from tests.support.slow_driver import make_slow_spark_submit


@pytest.fixture
def slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    return make_slow_spark_submit(tmp_path, monkeypatch)


def _defer(tmp_path: Path, slow: SimpleNamespace, context: Context, **kwargs: Any) -> TaskDeferred:
    op = merge_operator(tmp_path, slow.binary, deferrable=True, poll_interval=0.2, **kwargs)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    return deferred.value


def _event(deferred: TaskDeferred, *, limit: float = 60) -> dict[str, Any]:
    """The one event of the deferred task's trigger, rebuilt from its serialized form."""
    classpath, kwargs = deferred.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**kwargs)

    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    (event,) = asyncio.run(asyncio.wait_for(collect(), timeout=limit))
    return event


def _complete(
    tmp_path: Path, slow: SimpleNamespace, context: Context, deferred: TaskDeferred, **kwargs: Any
) -> dict[str, Any]:
    """Resume as Airflow does: a new operator instance, ``execute_complete(context, event, **kwargs)``."""
    event = _event(deferred)
    op = merge_operator(tmp_path, slow.binary, deferrable=True, poll_interval=0.2, **kwargs)
    assert deferred.method_name == "execute_complete"
    assert not deferred.kwargs  # everything execute_complete needs is in the event
    result: dict[str, Any] = getattr(op, deferred.method_name)(context, event=event)
    return result


def test_the_task_defers_while_the_driver_runs_and_completes_with_a_waiting_runs_xcom(
    tmp_path: Path,
    make_context: ContextFactory,
    slow: SimpleNamespace,
    spark_local: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    table = create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    context = runtime_context(make_context)

    deferred = _defer(tmp_path, slow, context)

    assert isinstance(deferred.trigger, MergeCommitTrigger)
    driver = DriverRef.from_dict(deferred.trigger.driver or {})
    assert driver_state(driver) == "running"  # the worker slot is free while Spark runs
    assert (deferred.trigger.app_id, deferred.trigger.app_version, deferred.trigger.poll_interval) == (
        APP_ID, 0, 0.2,
    )  # fmt: skip
    slow.release()
    result = _complete(tmp_path, slow, context, deferred)

    (argv,) = slow.calls()
    assert "--spec-json" in argv
    assert result["stageTimesMs"] == [{"stage": "MERGE operation - committing", "ms": 12}]
    assert (result["skipped"], result["tableVersion"], result["appId"], result["appVersion"]) == (
        False, 1, APP_ID, 0,
    )  # fmt: skip
    assert context["outlet_events"][Asset(uri=f"file://{table}")].extra == result
    # The driver's output is replayed into the resumed task's log; its live UI is not linked any more.
    out, err = capfd.readouterr()
    assert "[delta-merge] MERGE committed" in out + err
    assert context["ti"].pushes == []
    assert not Path(driver.driver_log).exists()


def test_a_commit_seen_without_the_driver_log_gives_the_commits_metrics(
    tmp_path: Path, make_context: ContextFactory, slow: SimpleNamespace, spark_local: str
) -> None:
    # As when the triggerer runs on another host than the driver's: only the Delta log is in reach.
    table = create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    slow.release()
    context = runtime_context(make_context)
    deferred = _defer(tmp_path, slow, context)
    _event(deferred)  # the driver has committed and exited
    commit = find_merge_commit(table, app_id=APP_ID, app_version=0)
    assert commit is not None
    op = merge_operator(tmp_path, slow.binary, deferrable=True)

    result = op.execute_complete(context, event={"status": "success", "commit": commit.to_dict(),
                                                 "metrics": None})  # fmt: skip

    assert result == commit.metrics()
    assert (result["tableVersion"], result["skipped"]) == (1, False)


@pytest.mark.parametrize(
    ("mode", "error", "retried"),
    [
        ("fail", "ConstraintViolationError", False),
        ("fail", "ConcurrentModificationError", True),
        ("die", None, True),
    ],
)
def test_a_failed_job_fails_the_deferred_task_at_once_as_a_waiting_task_fails(
    tmp_path: Path,
    make_context: ContextFactory,
    slow: SimpleNamespace,
    spark_local: str,
    mode: str,
    error: str | None,
    retried: bool,
) -> None:
    create_table(tmp_path / "table")
    slow.mode(mode, error=error)
    context = runtime_context(make_context)
    deferred = _defer(tmp_path, slow, context)
    slow.release()

    with pytest.raises(MergeJobFailedError) as raised:
        _complete(tmp_path, slow, context, deferred)

    assert raised.value.error_type == error
    assert isinstance(raised.value, MergeJobRejectedError) is not retried


def test_the_deadline_times_the_task_out_and_stops_the_driver(
    tmp_path: Path, make_context: ContextFactory, slow: SimpleNamespace, spark_local: str
) -> None:
    create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    context = runtime_context(make_context)
    deferred = _defer(tmp_path, slow, context, execution_timeout=timedelta(seconds=1))
    driver = DriverRef.from_dict(deferred.trigger.driver or {})

    with pytest.raises(AirflowTaskTimeout, match="Timed out waiting for a merge commit"):
        _complete(tmp_path, slow, context, deferred)

    deadline = time.monotonic() + 10
    while driver_state(driver) == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert driver_state(driver) == "exited"
    assert find_merge_commit(str(tmp_path / "table"), app_id=APP_ID, app_version=0) is None


def test_a_retry_defers_on_the_driver_its_crashed_try_started(
    tmp_path: Path, make_context: ContextFactory, slow: SimpleNamespace, spark_local: str
) -> None:
    create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    store = MemoryTaskStateStore()
    first = _defer(tmp_path, slow, runtime_context(make_context, store=store))
    # The try dies with its trigger (a triggerer crash that failed the task, say); the driver runs on.

    context = runtime_context(make_context, store=store, try_number=2)
    retry = _defer(tmp_path, slow, context)
    slow.release()
    result = _complete(tmp_path, slow, context, retry)

    assert retry.trigger.driver == first.trigger.driver
    assert len(slow.calls()) == 1
    assert result["skipped"] is False
    assert result["stageTimesMs"] == [{"stage": "MERGE operation - committing", "ms": 12}]


def test_a_deferred_dry_run_waits_for_the_driver_alone(
    tmp_path: Path, make_context: ContextFactory, slow: SimpleNamespace, spark_local: str
) -> None:
    create_table(tmp_path / "table")
    slow.mode("ok", metrics={**JOB_METRICS, "dryRun": True, "tableVersion": 0})
    context = runtime_context(make_context)
    deferred = _defer(tmp_path, slow, context, dry_run=True)
    assert deferred.trigger.app_id is None
    slow.release()

    result = _complete(tmp_path, slow, context, deferred, dry_run=True)

    assert (result["dryRun"], result["tableVersion"]) == (True, 0)
    assert find_merge_commit(str(tmp_path / "table"), app_id=APP_ID, app_version=0) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"aws_conn_id": "lake"},
        {"target": {"uri": "TABLE", "storage_options": {"aws_secret_access_key": "x"}}},
    ],
)
def test_credentials_are_refused_before_anything_is_launched(
    tmp_path: Path,
    make_context: ContextFactory,
    slow: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
    kwargs: dict[str, Any],
) -> None:
    table = create_table(tmp_path / "table")
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", '{"conn_type": "aws", "login": "AKIA", "password": "secret"}')
    if "target" in kwargs:
        kwargs = {"target": {**kwargs["target"], "uri": table}}
    op = merge_operator(tmp_path, slow.binary, deferrable=True, **kwargs)

    with pytest.raises(MergeArgumentError, match="command line"):
        op.execute(runtime_context(make_context))

    assert slow.calls() == []


def test_deferrable_defaults_to_the_operators_default_deferrable_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert merge_operator(tmp_path).deferrable is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "true")
    assert merge_operator(tmp_path, task_id="merge2").deferrable is True
    assert merge_operator(tmp_path, task_id="merge3", deferrable=False).deferrable is False
