"""MergeCommitTrigger: poll a table's Delta log, off the event loop, until a merge commit shows up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_merge_provider.hooks.merge_commit import find_merge_commit
from airflow_merge_provider.hooks.storage_credentials import StorageCredentialsHook, with_credentials

__all__ = ["MergeCommitTrigger"]


class MergeCommitTrigger(BaseTrigger):
    """Yield exactly one event: ``{"status": "success", "commit": MergeCommit.to_dict()}`` once the commit
    is in the log, or ``{"status": "error", "message": ..., "timed_out": bool}``.

    :param target: the Delta table's path or URI.
    :param app_id: wait for the commit of this application id (see ``find_merge_commit``).
    :param app_version: ... and exactly this version of it.
    :param after_version: wait for a merge commit above this table version.
    :param storage_options: passed to deltalake. :meth:`serialize` stores them in the trigger's row of the
        metadata database: give no secret here (MergeCommitSensor refuses to defer with one).
    :param aws_conn_id: an Airflow connection whose AWS credentials (and extras ``region_name``,
        ``endpoint_url``) complete ``storage_options`` for an S3 target; keys given in ``storage_options``
        win. Only the id is serialized: the triggerer reads the connection when it polls.
    :param poll_interval: seconds between two reads of the log.
    :param deadline: epoch seconds after which the trigger gives up (None: never). A deadline rather than
        a duration, so a trigger restarted on another triggerer keeps the original time limit.
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
        poll_interval: float = 30.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.target = target
        self.app_id = app_id
        self.app_version = app_version
        self.after_version = after_version
        self.storage_options = dict(storage_options or {})
        self.aws_conn_id = aws_conn_id
        self.poll_interval = poll_interval
        self.deadline = deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "target": self.target,
                "app_id": self.app_id,
                "app_version": self.app_version,
                "after_version": self.after_version,
                "storage_options": self.storage_options,
                "aws_conn_id": self.aws_conn_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                storage_options = await self._storage_options()
                # deltalake reads block: keep them off the triggerer's event loop.
                commit = await asyncio.to_thread(
                    find_merge_commit,
                    self.target,
                    app_id=self.app_id,
                    app_version=self.app_version,
                    after_version=self.after_version,
                    storage_options=storage_options,
                )
            except Exception as error:
                yield _event({"status": "error", "message": self._error_message(error), "timed_out": False})
                return
            if commit is not None:
                yield _event({"status": "success", "commit": commit.to_dict()})
                return
            remaining = None if self.deadline is None else self.deadline - time.time()
            if remaining is not None and remaining <= 0:
                yield _event({"status": "error", "message": self._timeout_message(), "timed_out": True})
                return
            delay = self.poll_interval if remaining is None else min(self.poll_interval, remaining)
            self.log.info("No merge commit in %s yet (%s); next look in %.0fs", self.target, self._wanted(),
                          delay)  # fmt: skip
            await asyncio.sleep(delay)

    async def _storage_options(self) -> dict[str, str]:
        """``storage_options`` completed with the connection's credentials, read at each poll rather than
        once: temporary credentials (a session token, an assumed role) can expire while the trigger waits."""
        if self.aws_conn_id is None:
            return self.storage_options
        credentials = await StorageCredentialsHook(aws_conn_id=self.aws_conn_id).astorage_options()
        return with_credentials(credentials, self.storage_options, uri=self.target)

    def _error_message(self, error: Exception) -> str:
        # The log readers' messages say to check the keys "in storage_options": say where they came from.
        if self.aws_conn_id is None:
            return f"{error}"
        return f"{error} (credentials from aws_conn_id {self.aws_conn_id!r})"

    def _wanted(self) -> str:
        if self.app_id is None:
            return f"any merge after version {self.after_version}"
        version = "its latest version" if self.app_version is None else f"version {self.app_version}"
        return f"app {self.app_id}, {version}"

    def _timeout_message(self) -> str:
        return f"Timed out waiting for a merge commit in {self.target} ({self._wanted()})"


def _event(payload: dict[str, Any]) -> TriggerEvent:
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]
