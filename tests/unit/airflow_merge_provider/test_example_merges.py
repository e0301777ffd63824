"""The CDC and branching examples' merges, rendered from the DAG files as Airflow renders them and run in the
shared SparkSession: their statements do what the examples say, and the branch follows the metrics.

The Airflow path around them (``airflow dags test``, spark-submit, XCom, retries) is the upsert example's,
run end to end in tests/integration/airflow_merge_provider/.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from spark_jobs.delta_merge import run_merge
from tests.support.airflow_fixtures import EXAMPLES, ContextFactory
from tests.support.delta_reader import read_rows, read_rows_with_kernel

DATE = "2024-01-02"  # the logical date of make_context's run


@pytest.fixture
def example_dags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """The example DAGs parsed with their tables under ``tmp_path`` (as the examples' docker-compose sets)."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("MERGE_EXAMPLES_DATA_DIR", str(tmp_path))
    return tmp_path, DagBag(dag_folder=str(EXAMPLES), safe_mode=False).dags


def _table(path: Path, columns: dict[str, Any]) -> Path:
    write_deltalake(str(path), pa.table(columns))
    return path


def _landing(path: Path, columns: dict[str, Any]) -> None:
    path.mkdir(parents=True)
    pq.write_table(pa.table(columns), path / "part-00000.parquet")


def _merge(spark: Any, task: MergeIntoOperator, make_context: ContextFactory) -> dict[str, Any]:
    """Render the task for the run, build its spec and run it as the job does: the metrics XCom gets."""
    context = make_context(dag_id=task.dag_id, task_id=task.task_id)
    task.render_template_fields(context)
    return run_merge(spark, task.build_spec(context)).to_dict()


def test_the_cdc_example_applies_updates_inserts_and_deletes(
    spark: Any, example_dags: tuple[Path, Any], make_context: ContextFactory
) -> None:
    data, dags = example_dags
    old = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    recent = dt.datetime(2023, 12, 1, tzinfo=dt.timezone.utc)
    customers = _table(data / "customers", {
        "id": pa.array([1, 2, 3, 4], pa.int64()), "name": ["a", "b", "c", "stale"],
        "email": ["a@x", "b@x", "c@x", "s@x"],
        "updated_at": pa.array([recent, recent, recent, old], pa.timestamp("us", tz="UTC")),
    })  # fmt: skip
    changed = dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)
    _landing(data / "landing" / "customer_changes" / DATE, {
        "id": pa.array([1, 2, 9], pa.int64()), "op": ["U", "D", "I"], "name": ["a2", "b", "new"],
        "email": ["a2@x", "b@x", "n@x"],
        "changed_at": pa.array([changed] * 3, pa.timestamp("us", tz="UTC")),
    })  # fmt: skip

    metrics = _merge(spark, dags["merge_cdc_apply"].get_task("apply_customer_changes"), make_context)

    # 1 updated, 2 deleted by the feed, 9 inserted, 4 deleted as not matched by source and stale.
    expected = {1: "a2", 3: "c", 9: "new"}
    assert {row[0]: row[1] for row in read_rows(customers, columns=["id", "name"])} == expected
    assert {row[0]: row[1] for row in read_rows_with_kernel(customers, columns=["id", "name"])} == expected
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    assert metrics["numTargetRowsMatchedDeleted"] == 1
    assert metrics["numTargetRowsNotMatchedBySourceDeleted"] == 1


@pytest.mark.parametrize(
    ("landing", "rows", "branch"),
    [
        ({"order_id": [2, 4], "status": ["cancelled", "open"]}, [[1, "open"], [3, "open"], [4, "open"]],
         ["audit_deletions"]),
        ({"order_id": [3, 5], "status": ["shipped", "open"]},
         [[1, "open"], [2, "open"], [3, "shipped"], [5, "open"]], ["nothing_deleted"]),
    ],
    ids=["cancellation", "no-cancellation"],
)
def test_the_branching_example_follows_the_merge_metrics(
    spark: Any, example_dags: tuple[Path, Any], make_context: ContextFactory,
    landing: dict[str, list[Any]], rows: list[list[Any]], branch: list[str],
) -> None:
    data, dags = example_dags
    dag = dags["merge_metrics_branching"]
    orders = _table(data / "orders", {
        "order_id": pa.array([1, 2, 3], pa.int64()), "status": ["open", "open", "open"],
    })  # fmt: skip
    _landing(data / "landing" / "orders" / DATE, {
        "order_id": pa.array(landing["order_id"], pa.int64()), "status": landing["status"],
    })  # fmt: skip

    metrics = _merge(spark, dag.get_task("sync_orders"), make_context)

    assert sorted(read_rows(orders)) == sorted(read_rows_with_kernel(orders)) == rows
    chosen = dag.get_task("deleted_anything").choose_branch(make_context(xcoms={"sync_orders": metrics}))
    assert chosen == branch
