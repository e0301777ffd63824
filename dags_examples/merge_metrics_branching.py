"""Branch on what a merge did: audit deletions only when the merge deleted rows.

``MergeMetricsBranchOperator`` reads the merge's metrics from XCom. Its condition is a callable, as
here, or checks in the merge contract's form: ``{"numTargetRowsDeleted": {"greater_than": 0}}``.

Paths and connection as in ``merge_upsert_daily``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, task
from airflow.sdk.types import RuntimeTaskInstanceProtocol

from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from airflow_merge_provider.operators.merge_metrics_branch import MergeMetricsBranchOperator

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")
SPARK_CONN_ID = os.environ.get("MERGE_EXAMPLES_SPARK_CONN_ID", "spark_cluster")
# Read when the task runs: the Variable if set, else the DAG's default_landing_dir macro.
LANDING_DIR = "{{ var.value.get('merge_examples_landing_dir', default_landing_dir) }}"

with DAG(
    dag_id="merge_metrics_branching",
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["delta-merge", "example"],
    user_defined_macros={"default_landing_dir": f"{DATA_DIR}/landing"},
):
    merge = MergeIntoOperator(
        task_id="sync_orders",
        target=f"{DATA_DIR}/orders",
        source=LANDING_DIR + "/orders/{{ ds }}",
        merge_sql="""
            MERGE INTO target t USING source s ON t.order_id = s.order_id
            WHEN MATCHED AND s.status = 'cancelled' THEN DELETE
            WHEN MATCHED THEN UPDATE SET *
            WHEN NOT MATCHED AND s.status <> 'cancelled' THEN INSERT *
        """,
        conn_id=SPARK_CONN_ID,
    )

    branch = MergeMetricsBranchOperator(
        task_id="deleted_anything",
        merge_task_id="sync_orders",
        condition=lambda metrics: metrics["numTargetRowsDeleted"] > 0,
        follow_task_ids_if_true=["audit_deletions"],
        follow_task_ids_if_false=["nothing_deleted"],
    )

    @task
    def audit_deletions(ti: RuntimeTaskInstanceProtocol | None = None) -> None:
        """Record how many orders the merge deleted, and in which table version."""
        assert ti is not None  # Airflow passes it
        metrics = ti.xcom_pull(task_ids="sync_orders")
        deleted = metrics["numTargetRowsDeleted"]
        print(f"orders v{metrics['tableVersion']}: {deleted} cancelled orders deleted")

    merge >> branch >> [audit_deletions(), EmptyOperator(task_id="nothing_deleted")]
