"""MergeCommitTrigger: serialize() round trip and the one event run() yields."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_merge_provider.driver_process import DriverRef
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger
from tests.support.delta_tables import commit_merge, create_table


async def _events(trigger: MergeCommitTrigger, *, limit: float = 30) -> list[dict[str, Any]]:
    """Every event run() yields, until it returns (a trigger must yield exactly one)."""

    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return await asyncio.wait_for(collect(), timeout=limit)


def test_serialize_round_trip() -> None:
    trigger = MergeCommitTrigger(
        target="s3://bucket/t", app_id="a", app_version=3, after_version=None,
        storage_options={"AWS_REGION": "eu-west-1"}, aws_conn_id="lake", azure_conn_id="lake_adls",
        gcp_conn_id="lake_gcs", poll_interval=5.0, deadline=1234.5,
    )  # fmt: skip
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_merge_provider.triggers.merge_commit.MergeCommitTrigger"
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs == {
        "target": "s3://bucket/t", "app_id": "a", "app_version": 3, "after_version": None,
        "storage_options": {"AWS_REGION": "eu-west-1"}, "aws_conn_id": "lake", "azure_conn_id": "lake_adls",
        "gcp_conn_id": "lake_gcs", "poll_interval": 5.0, "deadline": 1234.5,
    }  # fmt: skip


def test_run_yields_success_once_the_commit_lands(tmp_path: Path) -> None:
    table = create_table(tmp_path / "t")
    trigger = MergeCommitTrigger(target=table, app_id="a", app_version=0, poll_interval=0.2)

    async def scenario() -> list[dict[str, Any]]:
        waiting = asyncio.create_task(_events(trigger))
        await asyncio.sleep(0.6)
        assert not waiting.done()
        await asyncio.to_thread(commit_merge, table, app_id="a", app_version=0)
        return await waiting

    (event,) = asyncio.run(scenario())
    assert event["status"] == "success"
    assert (event["commit"]["version"], event["commit"]["app_id"], event["commit"]["app_version"]) == (
        1,
        "a",
        0,
    )
    assert event["commit"]["commit_info"]["operationMetrics"]["numSourceRows"] == "3"


def test_run_yields_a_timeout_error_at_the_deadline(tmp_path: Path) -> None:
    table = create_table(tmp_path / "t")
    trigger = MergeCommitTrigger(target=table, after_version=0, poll_interval=10, deadline=time.time() + 0.5)
    started = time.monotonic()

    (event,) = asyncio.run(_events(trigger))

    assert time.monotonic() - started < 5  # the deadline shortens the last sleep
    assert event["status"] == "error"
    assert event["timed_out"] is True
    assert "Timed out waiting for a merge commit" in event["message"]


def test_run_yields_an_error_when_the_log_cannot_be_read(tmp_path: Path) -> None:
    trigger = MergeCommitTrigger(target=str(tmp_path / "missing"), app_id="a", app_version=0)
    (event,) = asyncio.run(_events(trigger))
    assert event["status"] == "error"
    assert event["timed_out"] is False
    assert "is not a Delta table" in event["message"]


@pytest.mark.parametrize("after_version", [0, None])
def test_run_finds_a_commit_already_there_at_once(tmp_path: Path, after_version: int | None) -> None:
    table = create_table(tmp_path / "t")
    commit_merge(table, app_id="a", app_version=0)
    app_id = None if after_version is not None else "a"
    trigger = MergeCommitTrigger(target=table, app_id=app_id, after_version=after_version, poll_interval=60)
    (event,) = asyncio.run(_events(trigger, limit=10))
    assert event["status"] == "success"
    assert event["commit"]["version"] == 1


# -- watching a deferred MergeIntoOperator's detached driver -----------------------------------------------


def _driver(
    tmp_path: Path, lines: list[str], *, running: bool
) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    """A driver ref of a real process (sleeping, or already exited) whose log holds ``lines``."""
    log = tmp_path / "driver.log"
    log.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    code = "import time; time.sleep(60)" if running else "pass"
    process = subprocess.Popen([sys.executable, "-c", code])
    if not running:
        process.wait()
    ref = DriverRef.of_process(process.pid, app_id="a", app_version=0, driver_log=str(log))
    return ref.to_dict(), process


def test_serialize_round_trip_with_a_driver(tmp_path: Path) -> None:
    driver, _ = _driver(tmp_path, [], running=False)
    trigger = MergeCommitTrigger(target="/t", app_id="a", app_version=0, driver=driver)
    classpath, kwargs = trigger.serialize()
    assert kwargs["driver"] == driver
    assert MergeCommitTrigger(**kwargs).serialize() == (classpath, kwargs)
    with pytest.raises(ValueError, match="needs app_id, after_version or driver"):
        MergeCommitTrigger(target="/t")


def test_a_drivers_failure_line_ends_the_wait_with_the_failure(tmp_path: Path) -> None:
    table = create_table(tmp_path / "t")
    driver, process = _driver(
        tmp_path, ["MERGE failed: CastFailureError: [CAST_INVALID_INPUT] 'x'"], running=True
    )
    try:
        trigger = MergeCommitTrigger(target=table, app_id="a", app_version=0, driver=driver, poll_interval=60)
        (event,) = asyncio.run(_events(trigger, limit=10))
    finally:
        process.kill()
    assert (event["status"], event["timed_out"], event["exited"]) == ("error", False, False)
    assert event["failure"] == {"kind": "CastFailureError", "message": "[CAST_INVALID_INPUT] 'x'"}


def test_a_driver_that_exited_without_a_line_or_commit_ends_the_wait(tmp_path: Path) -> None:
    table = create_table(tmp_path / "t")
    driver, _ = _driver(tmp_path, ["26/01/01 INFO SparkContext: Running Spark version 4.2.0"], running=False)
    trigger = MergeCommitTrigger(target=table, app_id="a", app_version=0, driver=driver, poll_interval=60)
    (event,) = asyncio.run(_events(trigger, limit=10))
    assert (event["status"], event["exited"], event["failure"]) == ("error", True, None)
    assert "exited without the job's metrics or failure line" in event["message"]


def test_the_commit_and_the_drivers_metrics_line_make_one_success(tmp_path: Path) -> None:
    table = create_table(tmp_path / "t")
    commit_merge(table, app_id="a", app_version=0)
    driver, process = _driver(tmp_path, ['MERGE_METRICS_JSON={"numOutputRows": 4}'], running=True)
    try:
        trigger = MergeCommitTrigger(target=table, app_id="a", app_version=0, driver=driver, poll_interval=60)
        (event,) = asyncio.run(_events(trigger, limit=10))
    finally:
        process.kill()
    assert (event["status"], event["metrics"], event["commit"]["version"]) == (
        "success",
        {"numOutputRows": 4},
        1,
    )


def test_a_dry_runs_driver_alone_is_waited_for(tmp_path: Path) -> None:
    driver, _ = _driver(tmp_path, ['MERGE_METRICS_JSON={"dryRun": true}'], running=False)
    trigger = MergeCommitTrigger(target=str(tmp_path / "no-table"), driver=driver, poll_interval=60)
    (event,) = asyncio.run(_events(trigger, limit=10))
    assert event == {"status": "success", "commit": None, "metrics": {"dryRun": True}, "driver": driver}
