"""engine="delta" under real ``airflow dags test``: Delta's own MERGE INTO through spark-submit (Delta's
package resolved by spark-submit, or the cluster's own Delta), on the standalone cluster, and on a Spark
Connect server that has Delta,
with the native job's Airflow contract: the XCom is Delta's commit's metrics (as its history shows them), a
retry after the commit applies nothing, a bad statement fails with Delta's error class and leaves the
table as it was, and the Connect token stays out of the output, the XCom and the server's log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.integration.airflow_merge_provider.test_example_seed import _run, _xcom
from tests.integration.airflow_merge_provider.test_integration import _asset_events, _task_instances, _txns
from tests.support.airflow_fixtures import RETRY_DAG, AirflowHome, make_airflow_home
from tests.support.connect_server import ConnectServer
from tests.support.delta_reader import read_rows, table_version
from tests.support.delta_reference import JOB_ONLY_METRICS
from tests.support.delta_spark import delta_jars, delta_package_confs
from tests.support.jvm import FAST_START, submit_opts
from tests.support.standalone_cluster import StandaloneCluster

DATE = "2024-01-02"
DAG_ID, TASK_ID = "merge_with_delta_engine", "upsert_customers"
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# The retry DAG of the native job's test (a task that fails after its merge committed, on its first try
# only) with the delta engine; then a statement Delta refuses.
RETRY_DAG_WITH_DELTA = (
    RETRY_DAG.replace('dag_id="merge_retry_after_commit"', 'dag_id="delta_retry_after_commit"')
    .replace('conn_id=os.environ["MERGE_EXAMPLES_SPARK_CONN_ID"],',
             'conn_id=os.environ["MERGE_EXAMPLES_DELTA_CONN_ID"], engine="delta",')
)  # fmt: skip
BAD_STATEMENT_DAG = '''
import os

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.operators.merge_into import MergeIntoOperator

DATA_DIR = os.environ["MERGE_EXAMPLES_DATA_DIR"]

with DAG(dag_id="delta_bad_statement", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
    MergeIntoOperator(
        task_id="merge_names", engine="delta", conn_id=os.environ["MERGE_EXAMPLES_DELTA_CONN_ID"],
        target=f"{DATA_DIR}/names", source=f"{DATA_DIR}/landing/names/{{{{ ds }}}}",
        merge_sql="MERGE INTO target t USING source s ON t.id = s.id "
                  "WHEN MATCHED THEN UPDATE SET name = s.nope",
    )
'''


def _write_test_dags(home: AirflowHome) -> None:
    (home.dags / "delta_retry_after_commit.py").write_text(RETRY_DAG_WITH_DELTA, encoding="utf-8")
    (home.dags / "delta_bad_statement.py").write_text(BAD_STATEMENT_DAG, encoding="utf-8")


def _table(path: Path, ids: list[int], prefix: str) -> str:
    from deltalake import write_deltalake

    names = [f"{prefix}{i}" for i in ids]
    write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64()), "name": names}))
    return str(path)


def _landing(path: Path, ids: list[int], prefix: str) -> None:
    path.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"{prefix}{i}" for i in ids]}),
                   path / "part-00000.parquet")  # fmt: skip


def _spark_defaults(folder: Path, confs: dict[str, str]) -> dict[str, str]:
    """A SPARK_CONF_DIR whose spark-defaults.conf holds ``confs``: the cluster's own settings."""
    folder.mkdir()
    lines = "".join(f"{key} {value}\n" for key, value in confs.items())
    (folder / "spark-defaults.conf").write_text(lines, encoding="utf-8")
    return {"SPARK_CONF_DIR": str(folder)}


def _history_metrics(table: str) -> dict[str, int]:
    """The last commit's operationMetrics, as Delta's DESCRIBE HISTORY shows them (read by deltalake)."""
    from deltalake import DeltaTable

    (last,) = DeltaTable(table).history(1)
    return {name: int(value) for name, value in last["operationMetrics"].items()}


def _check_the_upsert(home: AirflowHome) -> dict[str, Any]:
    customers = str(home.data / "customers")
    metrics = _xcom(home, DAG_ID, TASK_ID)
    assert sorted(read_rows(customers)) == [[0, "c0"], [1, "c1"], [2, "u2"], [3, "u3"], [4, "u4"]]
    history = _history_metrics(customers)
    assert {name: metrics[name] for name in history} == history
    counts = ("numTargetRowsUpdated", "numTargetRowsInserted", "numSourceRows")
    assert [history[name] for name in counts] == [1, 2, 3]
    assert set(metrics) - set(history) <= JOB_ONLY_METRICS | {"appId", "appVersion"}
    assert (metrics["appId"], metrics["appVersion"], metrics["skipped"]) == (f"customers.{DATE}", 1, False)
    assert _txns(customers) == [(1, f"customers.{DATE}", 1)]
    assert _asset_events(home, f"file://{customers}") == [{"task_id": TASK_ID, "extra": metrics}]
    return metrics


def _seed_the_upsert(home: AirflowHome) -> None:
    _table(home.data / "customers", [0, 1, 2], "c")
    _landing(home.data / "landing" / "customers" / DATE, [2, 3, 4], "u")


@pytest.fixture(scope="module")
def delta_home(tmp_path_factory: pytest.TempPathFactory) -> AirflowHome:
    """A home whose connection loads Delta as spark-submit's package (the operator's default), resolved with
    the Ivy settings and cache that fetched Delta's jars for the tests."""
    root = tmp_path_factory.mktemp("airflow-delta")
    env = _spark_defaults(root / "spark-conf", delta_package_confs())
    conn = json.dumps({"conn_type": "spark", "host": "local[2]"})
    home = make_airflow_home(root / "airflow", spark_conn_id="spark_delta", spark_conn=conn,
                             env={**env, "MERGE_EXAMPLES_DELTA_CONN_ID": "spark_delta"})  # fmt: skip
    _write_test_dags(home)
    return home


def test_the_example_merges_with_delta_s_package_through_spark_submit(delta_home: AirflowHome) -> None:
    _seed_the_upsert(delta_home)

    _run(delta_home, DAG_ID, DATE)

    _check_the_upsert(delta_home)
    output = (Path(delta_home.env["AIRFLOW_HOME"]) / f"dags-test-{DAG_ID}.log").read_text()
    assert "with Delta's MERGE INTO (app transaction customers.2024-01-02 v1)" in output


def test_a_failed_statement_carries_delta_s_class_and_leaves_the_table(delta_home: AirflowHome) -> None:
    names = _table(delta_home.data / "names", list(range(3)), "n")
    _landing(delta_home.data / "landing" / "names" / DATE, [1, 2, 9], "+")

    result = delta_home.dags_test("delta_bad_statement", DATE)

    assert result.returncode != 0
    output = (Path(delta_home.env["AIRFLOW_HOME"]) / "dags-test-delta_bad_statement.log").read_text()
    assert "MergeAnalysisError: [DELTA_MERGE_UNRESOLVED_EXPRESSION] Cannot resolve s.nope" in output
    assert "INTERNAL_ERROR" not in output
    assert _task_instances(delta_home, "delta_bad_statement") == {"merge_names": ["failed", 1]}
    assert table_version(names) == 0
    assert sorted(read_rows(names)) == [[0, "n0"], [1, "n1"], [2, "n2"]]


def test_a_retry_after_delta_committed_applies_nothing_on_the_cluster_s_own_delta(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("airflow-cluster-delta")
    jars = ",".join(str(jar) for jar in delta_jars())
    env = _spark_defaults(root / "spark-conf", {"spark.jars": jars, "spark.sql.extensions": EXTENSION,
                                                "spark.sql.catalog.spark_catalog": CATALOG})  # fmt: skip
    conn = json.dumps({"conn_type": "spark", "host": "local[2]", "extra": {"delta_package": "cluster"}})
    home = make_airflow_home(root / "airflow", spark_conn_id="spark_delta", spark_conn=conn,
                             env={**env, "MERGE_EXAMPLES_DELTA_CONN_ID": "spark_delta"})  # fmt: skip
    _write_test_dags(home)
    names = _table(home.data / "names", list(range(3)), "n")
    _landing(home.data / "landing" / "names" / DATE, [1, 2, 9], "+")

    _run(home, "delta_retry_after_commit", DATE)

    assert _task_instances(home, "delta_retry_after_commit") == {"append_names": ["success", 2]}
    assert sorted(read_rows(names)) == [[0, "n0"], [1, "n1+1"], [2, "n2+2"], [9, "+9"]]
    metrics = _xcom(home, "delta_retry_after_commit", "append_names")
    assert _txns(names) == [(1, metrics["appId"], 0)]
    assert metrics["skipped"] is True
    counts = ("numTargetRowsUpdated", "numTargetRowsInserted", "tableVersion")
    assert [metrics[name] for name in counts] == [2, 1, 1]
    output = (Path(home.env["AIRFLOW_HOME"]) / "dags-test-delta_retry_after_commit.log").read_text()
    assert "--packages" not in output
    assert "with Delta's MERGE INTO (app transaction" in output


def test_the_example_merges_with_delta_on_a_spark_connect_server(
    connect_server: ConnectServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    conn = {"conn_type": "spark_connect", "host": "localhost", "port": connect_server.port,
            "password": connect_server.token}  # fmt: skip
    home = make_airflow_home(tmp_path_factory.mktemp("airflow-connect-delta"), spark_conn_id="merge_connect",
                             spark_conn=json.dumps(conn))  # fmt: skip
    _seed_the_upsert(home)

    _run(home, DAG_ID, DATE)

    metrics = _check_the_upsert(home)
    output = (Path(home.env["AIRFLOW_HOME"]) / f"dags-test-{DAG_ID}.log").read_text()
    assert f"Spark Connect server sc://localhost:{connect_server.port}" in output
    for place in (output, json.dumps(metrics), connect_server.log.read_text(errors="replace")):
        assert connect_server.token not in place


def test_the_example_merges_with_delta_on_the_standalone_cluster(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # The cluster's settings reach spark-submit as system properties (see tests/support/jvm.py), Ivy's in
    # spark-defaults.conf (spark-submit resolves --packages before it reads system properties); the operator
    # adds Delta's package, which reaches the executors too.
    opts = submit_opts({**FAST_START, **standalone_cluster.application_confs(wait_for_executors=1)})
    env = _spark_defaults(tmp_path / "spark-conf", delta_package_confs())
    conn = json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1", "port": standalone_cluster.port})
    home = make_airflow_home(tmp_path / "airflow", spark_conn_id="spark_cluster", spark_conn=conn,
                             env={**env, "SPARK_SUBMIT_OPTS": opts})  # fmt: skip
    _seed_the_upsert(home)

    _run(home, DAG_ID, DATE)

    _check_the_upsert(home)
    output = (Path(home.env["AIRFLOW_HOME"]) / f"dags-test-{DAG_ID}.log").read_text()
    assert "Spark application app-" in output  # a standalone application (local ones are local-...)
