"""MergeCommitTrigger: poll a Delta log (and a detached driver), off the event loop, for a merge commit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_merge_provider.driver_output import DriverOutput
from airflow_merge_provider.driver_process import DriverRef, driver_state
from airflow_merge_provider.errors import StorageRefusedError
from airflow_merge_provider.hooks.merge_commit import MergeCommit, find_merge_commit
from airflow_merge_provider.hooks.storage_credentials import aconnection_storage_options

__all__ = ["MergeCommitTrigger"]

_METRICS_GRACE = 30.0  # seconds to wait, once the commit is in, for the driver's metrics line
_METRICS_POLL = 1.0


class MergeCommitTrigger(BaseTrigger):
    """Yield exactly one event once the merge commit is in the log (or the watched driver has ended):
    ``{"status": "success", "commit": MergeCommit.to_dict()}``, or ``{"status": "error", "message": ...,
    "timed_out": bool}``.

    With ``driver`` (a deferred MergeIntoOperator's detached spark-submit), the trigger also reads the
    driver's log and, on the driver's host, watches its process, so a failed merge ends the wait rather
    than the deadline: a success event then also has ``"metrics"`` (the job's metrics line, or None), and
    an error event ``"failure"`` (``{"kind", "message"}`` of the job's failure line, or None) and
    ``"exited"`` (the driver exited without its metrics line and without the commit); every event then
    carries ``"driver"`` back, so the task resumes from the event alone. The trigger only
    reports what it saw; ``MergeIntoOperator.execute_complete`` decides what it means, as a waiting task
    does.

    :param target: the Delta table's path or URI.
    :param app_id: wait for the commit of this application id (see ``find_merge_commit``).
    :param app_version: ... and exactly this version of it.
    :param after_version: wait for a merge commit above this table version.
    :param storage_options: passed to deltalake. :meth:`serialize` stores them in the trigger's row of the
        metadata database: give no secret here (MergeCommitSensor refuses to defer with one).
    :param aws_conn_id: an Airflow connection whose AWS credentials (and extras ``region_name``,
        ``endpoint_url``) complete ``storage_options`` for an S3 target; keys given in ``storage_options``
        win. Only the id is serialized: the triggerer reads the connection when it polls.
    :param azure_conn_id: likewise, an Azure connection's credentials for an Azure target.
    :param gcp_conn_id: likewise, a Google Cloud connection's credentials for a GCS target.
    :param poll_interval: seconds between two reads of the log.
    :param deadline: epoch seconds after which the trigger gives up (None: never). A deadline rather than
        a duration, so a trigger restarted on another triggerer keeps the original time limit.
    :param driver: a :class:`~airflow_merge_provider.driver_process.DriverRef` as a dict: the detached
        driver to watch. Without ``app_id`` and ``after_version`` (a dry run, which commits nothing) the
        trigger waits for the driver alone.
    """

    def __init__(
        self,
        *,
        target: str,
        app_id: str | None = None,
        app_version: int | None = None,
        after_version: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        aws_conn_id: str | None = None,
        azure_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        poll_interval: float = 30.0,
        deadline: float | None = None,
        driver: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if app_id is None and after_version is None and driver is None:
            raise ValueError("MergeCommitTrigger needs app_id, after_version or driver")
        self.target = target
        self.app_id = app_id
        self.app_version = app_version
        self.after_version = after_version
        self.storage_options = dict(storage_options or {})
        self.aws_conn_id = aws_conn_id
        self.azure_conn_id = azure_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.driver = None if driver is None else dict(driver)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "target": self.target,
            "app_id": self.app_id,
            "app_version": self.app_version,
            "after_version": self.after_version,
            "storage_options": self.storage_options,
            "aws_conn_id": self.aws_conn_id,
            "azure_conn_id": self.azure_conn_id,
            "gcp_conn_id": self.gcp_conn_id,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
        }
        if self.driver is not None:
            kwargs["driver"] = self.driver
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        driver = None if self.driver is None else DriverRef.from_dict(self.driver)
        output = DriverOutput()
        commit_seen_at: float | None = None
        while True:
            try:
                # Asked before reading anything: the reads after an exit see all the driver left behind.
                exited = driver is not None and await asyncio.to_thread(driver_state, driver) == "exited"
                readable = driver is not None and await asyncio.to_thread(output.read, driver.driver_log)
                if exited:
                    output.finish()
                commit = await self._find()
            except Exception as error:
                # refused: the store refused the credentials or the request; the task is not retried.
                yield self._event({"status": "error", "message": str(error), "timed_out": False,
                                   "failure": None, "exited": False,
                                   "refused": isinstance(error, StorageRefusedError)})  # fmt: skip
                return
            if driver is None and commit is not None:
                yield self._event({"status": "success", "commit": commit.to_dict()})
                return
            # The job prints its metrics line just after its commit lands: wait for it briefly, as the
            # metrics line also has what the commit lacks (Spark jobs, stage times).
            if commit is not None and commit_seen_at is None:
                commit_seen_at = time.monotonic()
            line_due = (
                commit_seen_at is not None and readable and not exited
                and time.monotonic() - commit_seen_at < _METRICS_GRACE
            )  # fmt: skip
            if output.metrics is not None or (commit is not None and not line_due):
                found = None if commit is None else commit.to_dict()
                yield self._event({"status": "success", "commit": found, "metrics": output.metrics})
                return
            if output.failure is not None or (exited and commit is None):
                yield self._event(self._driver_failed(driver, output, exited))
                return
            remaining = None if self.deadline is None else self.deadline - time.time()
            if remaining is not None and remaining <= 0:
                yield self._event({"status": "error", "message": self._timeout_message(), "timed_out": True,
                                   "failure": None, "exited": False})  # fmt: skip
                return
            delay = _METRICS_POLL if commit is not None else self.poll_interval
            delay = delay if remaining is None else min(delay, remaining)
            self.log.info("No merge commit in %s yet (%s); next look in %.0fs", self.target, self._wanted(),
                          delay)  # fmt: skip
            await asyncio.sleep(delay)

    async def _find(self) -> MergeCommit | None:
        if self.app_id is None and self.after_version is None:
            return None  # a dry run's driver: it commits nothing
        # The connection is read at each poll rather than once: temporary credentials (a session token, an
        # assumed role) can expire while the trigger waits.
        connections = {"aws_conn_id": self.aws_conn_id, "azure_conn_id": self.azure_conn_id,
                       "gcp_conn_id": self.gcp_conn_id}  # fmt: skip
        storage_options, named = await aconnection_storage_options(self.storage_options, uri=self.target,
                                                                   **connections)  # fmt: skip
        # deltalake reads block: keep them off the triggerer's event loop.
        return await asyncio.to_thread(
            find_merge_commit,
            self.target,
            app_id=self.app_id,
            app_version=self.app_version,
            after_version=self.after_version,
            storage_options=storage_options,
            credentials_from=named,
        )

    def _driver_failed(self, driver: DriverRef | None, output: DriverOutput, exited: bool) -> dict[str, Any]:
        failure = output.failure
        if failure is not None:
            message = f"the merge job failed: {failure.kind}: {failure.message}"
        else:
            pid = "?" if driver is None else driver.pid
            message = (f"spark-submit (pid {pid}) exited without the job's metrics or failure line, and "
                       f"{self.target} holds no commit of {self._wanted()}")  # fmt: skip
        return {
            "status": "error", "message": message, "timed_out": False, "exited": exited,
            "failure": None if failure is None else {"kind": failure.kind, "message": failure.message},
        }  # fmt: skip

    def _wanted(self) -> str:
        if self.app_id is None:
            return f"any merge after version {self.after_version}"
        version = "its latest version" if self.app_version is None else f"version {self.app_version}"
        return f"app {self.app_id}, {version}"

    def _timeout_message(self) -> str:
        return f"Timed out waiting for a merge commit in {self.target} ({self._wanted()})"

    def _event(self, payload: dict[str, Any]) -> TriggerEvent:
        """The event, with the watched driver's ref: the task resumes from the event alone."""
        if self.driver is not None:
            payload = {**payload, "driver": self.driver}
        return TriggerEvent(payload)  # type: ignore[no-untyped-call]
