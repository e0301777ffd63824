"""Daily upsert of account updates into a Delta table, with catchup: each run merges its own day's files.

Re-running a day is safe: the merge is keyed on the day (``app_id="accounts.{{ ds }}", app_version=1``:
the default key is the run, and the default version its clear number), so a retry after
it committed, a clear, a backfill or another ``airflow dags test`` of the same date reports the day's commit
(``skipped``) instead of applying the batch again. A second DAG runs whenever the table changes and reads
the merge's metrics from the asset event.

Paths: the table lives under ``$MERGE_EXAMPLES_DATA_DIR`` (default ``/data/tables``, the volume shared with
Spark in docker-compose.yaml); landing files under the Airflow Variable ``merge_examples_landing_dir``
(default ``<data dir>/landing``), read when the task runs. The Spark connection is
``$MERGE_EXAMPLES_SPARK_CONN_ID`` (default ``spark_cluster``).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from airflow_merge_provider.assets import table_asset
from airflow_merge_provider.operators.merge_into import MergeIntoOperator

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")
SPARK_CONN_ID = os.environ.get("MERGE_EXAMPLES_SPARK_CONN_ID", "spark_cluster")
# Read when the task runs: the Variable if set, else the DAG's default_landing_dir macro.
LANDING_DIR = "{{ var.value.get('merge_examples_landing_dir', default_landing_dir) }}"
ACCOUNTS = f"{DATA_DIR}/accounts"

with DAG(
    dag_id="merge_upsert_daily",
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=True,
    # Merges into one table are serialized: concurrent runs would only conflict and retry.
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    tags=["delta-merge", "example"],
    user_defined_macros={"default_landing_dir": f"{DATA_DIR}/landing"},
):
    MergeIntoOperator(
        task_id="upsert_accounts",
        target=ACCOUNTS,
        source=LANDING_DIR + "/accounts/{{ ds }}",
        merge_sql="""
            MERGE INTO target t
            USING source s
            ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET *
            WHEN NOT MATCHED THEN INSERT *
        """,
        # Checked by the job before it commits: an upsert never deletes.
        expected_metrics={"numTargetRowsDeleted": {"equal_to": 0}},
        conn_id=SPARK_CONN_ID,
        # Once per date, whichever run applies it (the default key is the run and its clear number: a clear
        # would apply the day's files again).
        app_id="accounts.{{ ds }}",
        app_version=1,
    )


with DAG(
    dag_id="merge_upsert_daily_report",
    schedule=[table_asset(ACCOUNTS)],
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    tags=["delta-merge", "example"],
):

    @task
    def report(triggering_asset_events: dict[str, list[object]] | None = None) -> None:
        """Log what each merge that triggered this run did (the asset event's extra holds its metrics)."""
        for events in (triggering_asset_events or {}).values():
            for event in events:
                metrics = getattr(event, "extra", {})
                print(
                    f"accounts v{metrics.get('tableVersion')}: +{metrics.get('numTargetRowsInserted')} "
                    f"~{metrics.get('numTargetRowsUpdated')} rows"
                )

    report()
