"""Deferrable and durable MergeIntoOperator under real ``airflow dags test``: its triggerer runs the trigger
in-process, and its task runner gives the task Airflow's own task state store (the metadata DB's table).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_merge_provider.driver_process import DriverRef
from tests.support.airflow_fixtures import AirflowHome
from tests.support.delta_reader import read_rows
from tests.support.delta_tables import create_table
from tests.support.operator_helpers import JOB_METRICS
from tests.support.slow_driver import make_slow_spark_submit

DATE = "2024-01-02"

DEFERRABLE_DAG = '''
"""A deferrable merge: the worker slot is free while Spark runs."""
from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.operators.merge_into import MergeIntoOperator

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")

with DAG(dag_id="merge_deferrable", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
    MergeIntoOperator(
        task_id="upsert_items",
        target=f"{DATA_DIR}/items",
        source=f"{DATA_DIR}/landing/items/{{{{ ds }}}}",
        merge_sql="MERGE INTO target t USING source s ON t.id = s.id "
                  "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        conn_id=os.environ.get("MERGE_EXAMPLES_SPARK_CONN_ID", "spark_local"),
        deferrable=True,
        poll_interval=1,
    )
'''

# A worker that dies after its driver started: the first try fails where a crash would stop it (after the
# driver's ref is in the task state store, before following it); the retry lets the driver go on.
DURABLE_DAG = '''
"""A durable merge whose first try dies while its driver runs."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException

from airflow_merge_provider.operators.merge_into import MergeIntoOperator

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")


class DiesWhileItsDriverRuns(MergeIntoOperator):
    def poll_until_complete(self, external_id, context):
        if context["ti"].try_number == 1:
            raise AirflowException("the worker died")
        Path(os.environ["SLOW_SUBMIT_RELEASE"]).touch()
        return super().poll_until_complete(external_id, context)


with DAG(dag_id="merge_durable", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
         default_args={"retries": 1, "retry_delay": timedelta(seconds=0)}):
    DiesWhileItsDriverRuns(
        task_id="upsert_items",
        target=f"{DATA_DIR}/durable_items",
        source=f"{DATA_DIR}/landing/durable_items",
        merge_sql="MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *",
        conn_id=os.environ.get("MERGE_EXAMPLES_SPARK_CONN_ID", "spark_local"),
        spark_binary=os.environ.get("SLOW_SUBMIT_BINARY"),
    )
'''


def _xcom(home: AirflowHome, dag_id: str, key: str = "return_value") -> Any:
    rows = home.sql("SELECT value FROM xcom WHERE dag_id = ? AND key = ?", dag_id, key)
    return [json.loads(value) for (value,) in rows]


def _assert_ran(result: Any, home: AirflowHome, dag_id: str) -> None:
    log = Path(home.env["AIRFLOW_HOME"]) / f"dags-test-{dag_id}.log"
    assert result.returncode == 0, f"airflow dags test failed, see {log}:\n{result.stderr[-4000:]}"


def test_a_deferrable_merge_runs_while_its_task_is_deferred(airflow_home: AirflowHome) -> None:
    from deltalake import write_deltalake

    (airflow_home.dags / "merge_deferrable.py").write_text(DEFERRABLE_DAG, encoding="utf-8")
    items = airflow_home.data / "items"
    write_deltalake(str(items), pa.table({"id": pa.array(range(6), pa.int64()), "name": list("abcdef")}))
    landing = airflow_home.data / "landing" / "items" / DATE
    landing.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 9], pa.int64()), "name": ["B", "new"]}),
                   landing / "part-0.parquet")  # fmt: skip

    result = airflow_home.dags_test("merge_deferrable", DATE)

    _assert_ran(result, airflow_home, "merge_deferrable")
    rows = airflow_home.sql("SELECT state, try_number FROM task_instance WHERE dag_id = ?",
                            "merge_deferrable")  # fmt: skip
    assert [tuple(row) for row in rows] == [("success", 1)]
    log = result.stdout + result.stderr
    assert "Pausing task as DEFERRED" in log
    assert "[delta-merge] MERGE committed version 1" in log  # the driver's output, replayed on resuming
    assert sorted(read_rows(str(items))) == [[0, "a"], [1, "B"], [2, "c"], [3, "d"], [4, "e"], [5, "f"],
                                             [9, "new"]]  # fmt: skip
    (metrics,) = _xcom(airflow_home, "merge_deferrable")
    # A waiting run's XCom: the driver's metrics line (with stage times), not only the commit's.
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["tableVersion"]) == (
        1, 1, 1,
    )  # fmt: skip
    assert metrics["stageTimesMs"]
    events = airflow_home.sql(
        "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = ?",
        f"file://{items}",
    )
    assert [json.loads(extra) for (extra,) in events] == [metrics]


def test_a_durable_merge_retried_after_its_worker_died_follows_the_running_driver(
    airflow_home: AirflowHome, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = make_slow_spark_submit(tmp_path, monkeypatch)
    slow.mode("ok", metrics=JOB_METRICS)
    home = AirflowHome(env={**airflow_home.env, **slow.env, "SLOW_SUBMIT_BINARY": slow.binary},
                       data=airflow_home.data, dags=airflow_home.dags)  # fmt: skip
    (home.dags / "merge_durable.py").write_text(DURABLE_DAG, encoding="utf-8")
    create_table(home.data / "durable_items")

    result = home.dags_test("merge_durable", DATE)

    _assert_ran(result, home, "merge_durable")
    states = home.sql("SELECT state, try_number FROM task_instance WHERE dag_id = ?", "merge_durable")
    assert [tuple(row) for row in states] == [("success", 2)]
    assert len(slow.calls()) == 1  # the retry followed the first try's driver: one Spark application
    output = result.stdout + result.stderr
    assert "Reconnecting to existing job" in output
    (stored,) = home.sql("SELECT value FROM task_state_store WHERE dag_id = ? AND key = ?", "merge_durable",
                         "merge_driver")  # fmt: skip
    driver = DriverRef.from_dict(json.loads(stored[0]))
    assert driver.app_id.startswith("airflow:merge_durable.upsert_items:manual__")
    (metrics,) = _xcom(home, "merge_durable")
    assert (metrics["skipped"], bool(metrics["stageTimesMs"]), metrics["tableVersion"]) == (False, True, 1)
    # The driver's UI was linked while it ran, and the link emptied once the driver had exited.
    assert "Spark application link: http://10.1.2.3:4041" in output
    assert _xcom(home, "merge_durable", "_link_SparkApplicationUiLink") == [""]
