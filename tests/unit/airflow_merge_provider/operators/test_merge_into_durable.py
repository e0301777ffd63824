"""MergeIntoOperator with a task state store: the driver outlives a crashed try and the retry follows it.

The store is an in-memory stand-in with the accessor's get/set (test_merge_into_integration.py runs the
same path against Airflow's own store); spark-submit is slow_driver.py's fake, which waits to be released.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset

from airflow_merge_provider.driver_process import DriverRef, driver_state
from airflow_merge_provider.errors import MergeJobFailedError, MergeJobRejectedError
from airflow_merge_provider.hooks.merge_commit import find_merge_commit
from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from tests.support.airflow_fixtures import ContextFactory
from tests.support.delta_tables import commit_merge, create_table
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


class Crash(BaseException):
    """A worker dying between recording its driver and following it (nothing of the task survives)."""


def _crash_before_following(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(self: MergeIntoOperator, external_id: object, context: object) -> None:
        raise Crash

    monkeypatch.setattr(MergeIntoOperator, "poll_until_complete", crash)


def _wait_for(condition: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)


def test_a_durable_run_records_its_driver_then_follows_it_into_the_task_log(
    tmp_path: Path,
    make_context: ContextFactory,
    slow: SimpleNamespace,
    spark_local: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    table = create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    slow.release()
    store = MemoryTaskStateStore()
    context = runtime_context(make_context, store=store)
    op = merge_operator(tmp_path, slow.binary, target={"uri": table, "storage_options": {"key": "secret"}})

    result = op.execute(context)

    (argv,) = slow.calls()
    # The spec travels in a private file, removed once the driver has exited; credentials stay off argv.
    spec_file = Path(argv[argv.index("--spec") + 1])
    assert not spec_file.exists()
    assert "secret" not in " ".join(argv)
    driver = DriverRef.from_dict(store.get("merge_driver"))
    assert (driver.app_id, driver.app_version, driver.spec_file) == (APP_ID, 0, str(spec_file))
    assert driver_state(driver) == "exited"
    assert not Path(driver.driver_log).exists()  # relayed into the task log, then removed
    # The same XCom as an attached run: the job's metrics line, Spark jobs and stage times included.
    assert result["stageTimesMs"] == [{"stage": "MERGE operation - committing", "ms": 12}]
    assert (result["skipped"], result["tableVersion"], result["appId"]) == (False, 1, APP_ID)
    assert context["outlet_events"][Asset(uri=f"file://{table}")].extra == result
    out, err = capfd.readouterr()
    assert "[delta-merge] MERGE operation - loading the target's snapshot" in out + err
    # The driver's UI, from its log lines, is the Spark UI link while it runs (local master, client mode).
    assert context["ti"].pushes == [
        ("_link_SparkApplicationUiLink", "http://10.1.2.3:4041"),
        ("_link_SparkApplicationUiLink", ""),
    ]


def test_a_retry_follows_the_driver_a_crashed_try_left_running_instead_of_submitting_again(
    tmp_path: Path,
    make_context: ContextFactory,
    slow: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    store = MemoryTaskStateStore()
    with monkeypatch.context() as crashing:
        _crash_before_following(crashing)
        with pytest.raises(Crash):
            merge_operator(tmp_path, slow.binary).execute(runtime_context(make_context, store=store))
    driver = DriverRef.from_dict(store.get("merge_driver"))
    assert driver_state(driver) == "running"
    threading.Timer(1.0, slow.release).start()

    result = merge_operator(tmp_path, slow.binary).execute(runtime_context(make_context, store=store,
                                                                           try_number=2))  # fmt: skip

    assert len(slow.calls()) == 1  # one Spark application
    assert (result["skipped"], result["tableVersion"]) == (False, 1)
    assert result["stageTimesMs"] == [{"stage": "MERGE operation - committing", "ms": 12}]
    commit = find_merge_commit(table, app_id=APP_ID, app_version=0)
    assert commit is not None
    assert commit.version == 1


def test_a_retry_after_the_driver_committed_and_exited_reports_the_commit_as_skipped(
    tmp_path: Path, make_context: ContextFactory, slow: SimpleNamespace, spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    store = MemoryTaskStateStore()
    with monkeypatch.context() as crashing:
        _crash_before_following(crashing)
        with pytest.raises(Crash):
            merge_operator(tmp_path, slow.binary).execute(runtime_context(make_context, store=store))
    slow.release()
    driver = DriverRef.from_dict(store.get("merge_driver"))
    _wait_for(lambda: driver_state(driver) == "exited")

    result = merge_operator(tmp_path, slow.binary).execute(runtime_context(make_context, store=store))

    assert len(slow.calls()) == 1
    assert (result["skipped"], result["tableVersion"]) == (True, 1)


@pytest.mark.parametrize("previous", ["exited", "cleared"])
def test_a_retry_submits_again_when_the_recorded_driver_is_gone_or_of_another_clear(
    tmp_path: Path,
    make_context: ContextFactory,
    slow: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
    previous: str,
) -> None:
    create_table(tmp_path / "table")
    slow.mode("die")
    store = MemoryTaskStateStore()
    with monkeypatch.context() as crashing:
        _crash_before_following(crashing)
        with pytest.raises(Crash):
            merge_operator(tmp_path, slow.binary).execute(runtime_context(make_context, store=store))
    first = DriverRef.from_dict(store.get("merge_driver"))
    if previous == "exited":
        slow.release()
        _wait_for(lambda: driver_state(first) == "exited")
    slow.mode("ok", metrics=JOB_METRICS)
    slow.release()
    clear_number = 1 if previous == "cleared" else 0

    result = merge_operator(tmp_path, slow.binary).execute(
        runtime_context(make_context, store=store, clear_number=clear_number)
    )

    assert len(slow.calls()) == 2
    assert (result["skipped"], result["appVersion"]) == (False, clear_number)
    assert DriverRef.from_dict(store.get("merge_driver")).pid != first.pid


@pytest.mark.parametrize(
    ("mode", "error", "retried"),
    [
        ("fail", "MultipleSourceRowMatchesError", False),
        ("fail", "MergeExecutionError", True),
        ("die", None, True),
    ],
)
def test_a_followed_driver_that_fails_fails_the_task_as_an_attached_one_does(
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
    slow.release()

    with pytest.raises(MergeJobFailedError) as raised:
        merge_operator(tmp_path, slow.binary).execute(
            runtime_context(make_context, store=MemoryTaskStateStore())
        )

    assert raised.value.error_type == error
    assert isinstance(raised.value, MergeJobRejectedError) is not retried


def test_on_kill_stops_the_detached_driver_and_its_process_group(
    tmp_path: Path, make_context: ContextFactory, slow: SimpleNamespace, spark_local: str
) -> None:
    create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    store = MemoryTaskStateStore()
    op = merge_operator(tmp_path, slow.binary)
    threading.Timer(1.5, op.on_kill).start()

    with pytest.raises(MergeJobFailedError) as raised:
        op.execute(runtime_context(make_context, store=store))

    assert raised.value.error_type is None  # killed: no failure line
    driver = DriverRef.from_dict(store.get("merge_driver"))
    assert driver_state(driver) == "exited"
    with pytest.raises(ProcessLookupError):
        os.killpg(driver.pid, signal.SIG_DFL)


def test_without_a_task_state_store_or_with_durable_false_spark_submit_runs_attached(
    tmp_path: Path, make_context: ContextFactory, slow: SimpleNamespace, spark_local: str
) -> None:
    create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    slow.release()
    store = MemoryTaskStateStore()

    merge_operator(tmp_path, slow.binary, durable=False).execute(runtime_context(make_context, store=store))
    commit_merge(str(tmp_path / "table"), app_id="other", app_version=0)
    result = merge_operator(tmp_path, slow.binary).execute(runtime_context(make_context, clear_number=1))

    assert store.values == {}
    # Attached: the spec on the command line (no secrets here), no driver ref recorded.
    assert ["--spec-json" in argv for argv in slow.calls()] == [True, True]
    assert result["appVersion"] == 1
