"""MergeCommitSensor: wait for a merge commit in a Delta table's log and return its metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout

from airflow_merge_provider.assets import record_merge_event
from airflow_merge_provider.errors import MergeArgumentError
from airflow_merge_provider.hooks.merge_commit import MergeCommit, find_merge_commit
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger

__all__ = ["MergeCommitSensor"]


class MergeCommitSensor(BaseSensorOperator):
    """Wait until ``target``'s Delta log holds a merge commit; push that commit's metrics as XCom.

    Wait for the merge of one application, ``app_id`` (and ``app_version``; without it, the latest
    version the table records for that app id), or for any merge commit made by this provider's job
    above ``after_version``. The XCom value has the shape of MergeIntoOperator's (ints). Outlets naming
    the table's asset get the metrics as their event's extra.

    Works in ``poke`` and ``reschedule`` modes, and with ``deferrable=True`` through
    :class:`MergeCommitTrigger` (the triggerer polls; no worker slot is held).

    :param target: the Delta table's path or URI. (templated)
    :param app_id: the merge's application id, e.g. MergeIntoOperator's ``appId`` XCom. (templated)
    :param app_version: the merge's application version; an int or its text. (templated)
    :param after_version: wait for a merge commit above this table version; an int or its text.
        (templated)
    :param storage_options: passed to deltalake.
    :param deferrable: wait in the triggerer rather than in a worker.
    """

    template_fields: Sequence[str] = ("target", "app_id", "app_version", "after_version")
    ui_color = "#b3e5f0"

    def __init__(
        self,
        *,
        target: str,
        app_id: str | None = None,
        app_version: int | str | None = None,
        after_version: int | str | None = None,
        storage_options: Mapping[str, str] | None = None,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        if app_id is None and after_version is None:
            raise ValueError("MergeCommitSensor: give app_id (and app_version) or after_version")
        if app_id is None and app_version is not None:
            raise ValueError("MergeCommitSensor: app_version needs app_id")
        super().__init__(**kwargs)
        self.target = target
        self.app_id = app_id
        self.app_version = app_version
        self.after_version = after_version
        self.storage_options = dict(storage_options or {})
        self.deferrable = deferrable

    def _query(self) -> dict[str, Any]:
        """The rendered fields as find_merge_commit's arguments (templated numbers arrive as text)."""
        return {
            "app_id": self.app_id or None,
            "app_version": _optional_int(self.app_version, "app_version"),
            "after_version": _optional_int(self.after_version, "after_version"),
            "storage_options": self.storage_options,
        }

    def poke(self, context: Context) -> bool | PokeReturnValue:
        commit = find_merge_commit(self.target, **self._query())
        if commit is None:
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._complete(context, commit))

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        commit = find_merge_commit(self.target, **self._query())
        if commit is not None:
            return self._complete(context, commit)
        self.defer(
            trigger=MergeCommitTrigger(
                target=self.target, poll_interval=self.poke_interval, deadline=time.time() + self.timeout,
                **self._query(),
            ),
            method_name="execute_complete",
        )  # fmt: skip

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, Any]:
        """Resume after the trigger's one event."""
        if event.get("status") == "success":
            return self._complete(context, MergeCommit.from_dict(event["commit"]))
        if event.get("timed_out"):
            raise AirflowSensorTimeout(str(event.get("message")))
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
