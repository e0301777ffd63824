"""Fire and forget: start a long merge without holding a worker slot, then wait for its commit.

The merge task starts spark-submit and returns at once with the merge's ``appId`` and ``appVersion``.
A deferrable ``MergeCommitSensor`` waits in the triggerer until the table's Delta log holds that merge's
commit, then pushes the commit's metrics; the table's asset event (the sensor's outlet) carries them.

Paths and connection as in ``merge_upsert_daily``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.assets import table_asset
from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from airflow_merge_provider.sensors.merge_commit import MergeCommitSensor

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")
SPARK_CONN_ID = os.environ.get("MERGE_EXAMPLES_SPARK_CONN_ID", "spark_cluster")
# Read when the task runs: the Variable if set, else the DAG's default_landing_dir macro.
LANDING_DIR = "{{ var.value.get('merge_examples_landing_dir', default_landing_dir) }}"
EVENTS = f"{DATA_DIR}/events"

with DAG(
    dag_id="merge_fire_and_forget",
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["delta-merge", "example"],
    user_defined_macros={"default_landing_dir": f"{DATA_DIR}/landing"},
):
    submit = MergeIntoOperator(
        task_id="submit_merge",
        target=EVENTS,
        source=LANDING_DIR + "/events/{{ ds }}",
        merge_sql="""
            MERGE INTO target t USING source s ON t.event_id = s.event_id
            WHEN NOT MATCHED THEN INSERT *
        """,
        conn_id=SPARK_CONN_ID,
        wait_for_completion=False,
    )

    wait = MergeCommitSensor(
        task_id="wait_for_commit",
        target=EVENTS,
        app_id="{{ ti.xcom_pull(task_ids='submit_merge')['appId'] }}",
        app_version="{{ ti.xcom_pull(task_ids='submit_merge')['appVersion'] }}",
        deferrable=True,
        poke_interval=10,
        timeout=60 * 60,
        outlets=[table_asset(EVENTS)],
    )

    submit >> wait
