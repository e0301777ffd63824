"""Apply a daily change feed (inserts, updates, deletes) to a Delta table, in the structural form.

Each day's feed holds at most one change per customer: ``op`` is ``I``, ``U`` or ``D``. Customers the feed
does not mention are purged once they have not changed for a year (WHEN NOT MATCHED BY SOURCE). The
clauses are templated like any other field: the purge horizon follows the run's logical date.

Paths and connection as in ``merge_upsert_daily``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.operators.merge_into import MergeIntoOperator

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")
SPARK_CONN_ID = os.environ.get("MERGE_EXAMPLES_SPARK_CONN_ID", "spark_cluster")
# Read when the task runs: the Variable if set, else the DAG's default_landing_dir macro.
LANDING_DIR = "{{ var.value.get('merge_examples_landing_dir', default_landing_dir) }}"

with DAG(
    dag_id="merge_cdc_apply",
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    tags=["delta-merge", "example"],
    user_defined_macros={"default_landing_dir": f"{DATA_DIR}/landing"},
):
    MergeIntoOperator(
        task_id="apply_customer_changes",
        target=f"{DATA_DIR}/customers",
        source={"uri": LANDING_DIR + "/customer_changes/{{ ds }}", "format": "parquet"},
        target_alias="t",
        source_alias="s",
        condition="t.id = s.id",
        when_matched=[
            {"condition": "s.op = 'D'", "action": "delete"},
            {"action": "update", "set": {"name": "s.name", "email": "s.email", "updated_at": "s.changed_at"}},
        ],
        when_not_matched=[
            {
                "condition": "s.op <> 'D'",
                "action": "insert",
                "values": {"id": "s.id", "name": "s.name", "email": "s.email", "updated_at": "s.changed_at"},
            },
        ],
        when_not_matched_by_source=[
            {"condition": "t.updated_at < TIMESTAMP '{{ macros.ds_add(ds, -365) }}'", "action": "delete"},
        ],
        # A feed that would delete more than a tenth of the table is more likely a bug than a fact.
        expected_metrics={"numTargetRowsDeleted": {"leq_to": 10_000}},
        conn_id=SPARK_CONN_ID,
    )
