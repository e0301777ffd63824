"""The daily upsert run by Delta Lake's own MERGE INTO (``engine="delta"``), with the same Airflow contract.

The task is the upsert example's, on its own table (``customers``): the same statement and source, the same
XCom of Delta's metric names (read from the commit's ``operationMetrics``), the same idempotency key (Delta
records it as the commit's app transaction, ``txnAppId``/``txnVersion``, and skips a MERGE whose key is in
the log), the same asset event. The Spark application loads Delta: the operator adds Delta's package and SQL
extension to spark-submit, unless the connection's extra says ``{"delta_package": "cluster"}`` (the
cluster's spark-defaults load Delta); on a Spark Connect connection the server must have Delta.

Paths as in the upsert example (``$MERGE_EXAMPLES_DATA_DIR``, landing files under ``<data dir>/landing``).
The Spark connection is ``$MERGE_EXAMPLES_DELTA_CONN_ID`` (default: the examples' ``spark_cluster``).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.operators.merge_into import MergeIntoOperator

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")
SPARK_CONN_ID = os.environ.get(
    "MERGE_EXAMPLES_DELTA_CONN_ID", os.environ.get("MERGE_EXAMPLES_SPARK_CONN_ID", "spark_cluster")
)

with DAG(
    dag_id="merge_with_delta_engine",
    # Run on demand (its table is not seeded by merge_examples_seed): airflow dags trigger or dags test.
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    tags=["delta-merge", "example"],
):
    MergeIntoOperator(
        task_id="upsert_customers",
        engine="delta",
        target=f"{DATA_DIR}/customers",
        source=DATA_DIR + "/landing/customers/{{ ds }}",
        merge_sql="""
            MERGE INTO target t
            USING source s
            ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET *
            WHEN NOT MATCHED THEN INSERT *
        """,
        conn_id=SPARK_CONN_ID,
        app_id="customers.{{ ds }}",
        app_version=1,
    )
