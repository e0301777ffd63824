"""MergeIntoOperator in unit tests: a DAG, an operator with the test defaults, a task state store."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from tests.support.delta_tables import UPSERT_METRICS

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tests.support.airflow_fixtures import ContextFactory

RUN_ID = "scheduled__2024-01-02T00:00:00+00:00"
APP_ID = f"airflow:dag.merge:{RUN_ID}"
UPSERT_SQL = (
    "MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
    "WHEN NOT MATCHED THEN INSERT *"
)
# What the job prints (the commit stores the Delta metrics only: no stage times).
JOB_METRICS = {
    **UPSERT_METRICS, "materializeSourceReason": "NON_DETERMINISTIC_SOURCE_NON_DELTA", "readVersion": 0,
    "tableVersion": 1, "skipped": False, "dryRun": False,
    "stageTimesMs": [{"stage": "MERGE operation - committing", "ms": 12}],
}  # fmt: skip


def merge_operator(tmp_path: Path, binary: str | None = None, **kwargs: Any) -> MergeIntoOperator:
    """An upsert of ``tmp_path/source`` into ``tmp_path/table`` on ``spark_local``, in a DAG ``dag``."""
    defaults: dict[str, Any] = {
        "task_id": "merge", "target": str(tmp_path / "table"), "source": str(tmp_path / "source"),
        "merge_sql": UPSERT_SQL, "conn_id": "spark_local",
    }  # fmt: skip
    if binary is not None:
        defaults["spark_binary"] = binary
    with DAG("dag", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
             template_searchpath=str(tmp_path)):  # fmt: skip
        return MergeIntoOperator(**{**defaults, **kwargs})


class MemoryTaskStateStore:
    """``context["task_state_store"]``'s get and set over a dict, values through JSON as the metadata
    database keeps them (Airflow's accessor sends them to the API server)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return json.loads(self.values[key]) if key in self.values else default

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        if value is None:
            raise ValueError("Cannot set value as None")
        self.values[key] = json.dumps(value)


def runtime_context(
    make_context: ContextFactory, *, store: MemoryTaskStateStore | None = None, **kwargs: Any
) -> Context:
    """``make_context``'s context with what Airflow's task runner adds: the task state store, the task
    instance's stats tags, and ``xcom_push`` (each push lands in ``context["ti"].pushes``)."""
    context = make_context(**kwargs)
    ti: SimpleNamespace = context["ti"]  # type: ignore[assignment]
    ti.stats_tags = {}
    ti.pushes = []
    ti.xcom_push = lambda key, value: ti.pushes.append((key, value))
    if store is not None:
        context["task_state_store"] = store  # type: ignore[typeddict-unknown-key]
    return context
