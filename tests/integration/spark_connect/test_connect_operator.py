"""MergeIntoOperator on a real Spark Connect server: the same XCom, commit and asset event as through
spark-submit; no token or storage secret in the server's log, plans, session conf or the task's output; a
server killed mid-merge or after the commit leaves the table at its old version or committed once, and the
retry applies the batch once."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from airflow_merge_provider.errors import MergeJobFailedError
from tests.integration.airflow_merge_provider.test_integration import _txns
from tests.support.connect_server import ConnectServer
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.operator_helpers import APP_ID, merge_operator, runtime_context

CONN_ID = "spark_connect_test"


def _connection(monkeypatch: pytest.MonkeyPatch, server: ConnectServer) -> None:
    conn = {"conn_type": "spark_connect", "host": "localhost", "port": server.port, "password": server.token,
            "extra": {"max_retries": 2}}  # fmt: skip
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))


def _upsert_data(root: Path) -> None:
    write_deltalake(str(root / "table"), pa.table({"id": pa.array(range(5), pa.int64()),
                                                   "v": [f"v{i}" for i in range(5)]}))  # fmt: skip
    (root / "source").mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 7], pa.int64()), "v": ["new1", "new7"]}),
                   root / "source" / "part-0.parquet")  # fmt: skip


UPSERTED = [[0, "v0"], [1, "new1"], [2, "v2"], [3, "v3"], [4, "v4"], [7, "new7"]]


def test_the_operator_merges_on_spark_connect_with_the_xcom_of_a_submitted_merge(
    connect_server: ConnectServer, tmp_path: Path, make_context: Any, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _connection(monkeypatch, connect_server)
    _upsert_data(tmp_path)
    operator = merge_operator(tmp_path, conn_id=CONN_ID)
    context = runtime_context(make_context)
    with caplog.at_level(logging.INFO):
        result = operator.execute(context)

    table = tmp_path / "table"
    assert sorted(read_rows(table)) == UPSERTED
    assert sorted(read_rows_with_kernel(table)) == UPSERTED
    counts = ("numSourceRows", "numTargetRowsUpdated", "numTargetRowsInserted", "numTargetRowsCopied")
    assert [result[name] for name in counts] == [2, 1, 1, 4]
    assert (result["skipped"], result["readVersion"], result["tableVersion"], result["appId"]) == (
        False, 0, 1, APP_ID)  # fmt: skip
    assert result["stageTimesMs"]
    assert _txns(str(table)) == [(1, APP_ID, 0)]
    # The XCom has the keys a spark-submit merge pushes (tests/unit/docs/test_docs.py checks those).
    from tests.support.operator_helpers import JOB_METRICS

    assert set(JOB_METRICS) | {"appId", "appVersion"} <= set(result)
    assert connect_server.token not in caplog.text

    # A retry (the same try of the same run) finds the commit and applies nothing again.
    again = operator.execute(runtime_context(make_context))
    assert (again["skipped"], again["tableVersion"]) == (True, 1)
    assert table_version(table) == 1


def test_an_s3_merge_on_spark_connect_keeps_the_secret_out_of_the_server_and_the_plans(
    connect_server: ConnectServer, connect_spark: Any, s3_server: Any, bucket: str,
) -> None:
    from spark_jobs.delta_merge import run_merge

    options = s3_server.storage_options()
    secret = options["AWS_SECRET_ACCESS_KEY"]
    target = f"s3://{bucket}/table"
    write_deltalake(target, pa.table({"id": pa.array(range(4), pa.int64()), "v": ["a", "b", "c", "d"]}),
                    storage_options=options)  # fmt: skip
    source = f"s3://{bucket}/source"
    write_deltalake(source, pa.table({"id": pa.array([2, 9], pa.int64()), "v": ["B", "I"]}),
                    storage_options=options)  # fmt: skip
    spec = {
        "target": {"uri": target, "storage_options": options},
        "source": {"uri": source, "format": "delta", "storage_options": options},
        "merge_sql": "MERGE INTO target t USING source s ON t.id = s.id "
                     "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    }  # fmt: skip
    metrics = run_merge(connect_spark, spec)
    assert (metrics.numTargetRowsUpdated, metrics.numTargetRowsInserted) == (1, 1)
    assert sorted(read_rows(target, storage_options=options)) == [[0, "a"], [1, "b"], [2, "B"], [3, "d"],
                                                                  [9, "I"]]  # fmt: skip

    # Nowhere on the server: its log, its session conf, the plans of what it ran.
    assert secret not in connect_server.log.read_text(errors="replace")
    assert all(secret not in str(value) for value in connect_spark.conf.getAll.values())
    from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
    from spark_jobs.delta_merge.scan.table_scan import scan_files

    snapshot = load_snapshot(target, storage_options=options)
    scan = scan_files(connect_spark, snapshot, snapshot.files)
    for mode in ("simple", "extended", "formatted", "cost"):
        assert secret not in scan._explain_string(mode=mode)
    assert secret not in str(connect_spark.sql("EXPLAIN EXTENDED SELECT 1").collect())


def test_merges_lease_warm_sessions_one_at_a_time(
    connect_server: ConnectServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_merge_provider.hooks.merge_connect import MergeConnectHook

    _connection(monkeypatch, connect_server)
    with MergeConnectHook(CONN_ID).session() as spark:
        first = spark.client._session_id
        assert spark.range(3).count() == 3
        # A merge running meanwhile gets another session.
        with MergeConnectHook(CONN_ID).session() as other:
            assert other.client._session_id != first
    # The next merge gets the first session back, with the job already added to it.
    with MergeConnectHook(CONN_ID).session() as spark:
        assert spark.client._session_id == first
        assert spark.range(2).count() == 2


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ConnectServer]]:
    """A server of this test's own, to kill; the list gains the one started after it."""
    servers = [ConnectServer(tmp_path_factory.mktemp("connect-faults")).__enter__()]
    yield servers
    for server in servers:
        server.stop()


@pytest.mark.parametrize("when", ["before the commit", "after the commit"])
def test_a_server_killed_mid_merge_fails_the_task_naming_it_and_the_retry_applies_the_batch_once(
    own_server: list[ConnectServer], tmp_path: Path, make_context: Any, monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    from spark_jobs.delta_merge import pipeline
    from spark_jobs.delta_merge.merge import classic

    server = own_server[0]
    _connection(monkeypatch, server)
    _upsert_data(tmp_path)
    table = tmp_path / "table"
    if when == "before the commit":
        real_write = classic.write_output

        def kill_then_write(*args: Any, **kwargs: Any) -> Any:
            server.kill()
            return real_write(*args, **kwargs)

        monkeypatch.setattr(classic, "write_output", kill_then_write)
    else:
        real_commit = pipeline.commit_merge

        def commit_then_kill(*args: Any, **kwargs: Any) -> Any:
            committed = real_commit(*args, **kwargs)
            server.kill()
            return committed

        monkeypatch.setattr(pipeline, "commit_merge", commit_then_kill)

    operator = merge_operator(tmp_path, conn_id=CONN_ID)
    if when == "before the commit":
        with pytest.raises(MergeJobFailedError) as failed:
            operator.execute(runtime_context(make_context))
        message = str(failed.value)
        assert f"sc://localhost:{server.port}" in message
        assert f"'{CONN_ID}'" in message
        assert "Nothing was committed" in message
        assert server.token not in message
        assert table_version(table) == 0
    else:
        # The commit landed before the server went: the task reports that commit.
        result = operator.execute(runtime_context(make_context))
        assert (result["tableVersion"], result["numTargetRowsInserted"]) == (1, 1)
        assert table_version(table) == 1

    # The retry (same run, same try of the idempotency key) on a server started again: applied once.
    monkeypatch.undo()
    restarted = ConnectServer(server.root.parent / f"{server.root.name}-restarted")
    restarted.start()
    own_server.append(restarted)
    _connection(monkeypatch, restarted)
    retried = merge_operator(tmp_path, conn_id=CONN_ID).execute(runtime_context(make_context))
    assert sorted(read_rows(table)) == UPSERTED
    assert _txns(str(table)) == [(1, APP_ID, 0)]
    assert retried["skipped"] is (when == "after the commit")


def test_the_upsert_example_merges_on_spark_connect_under_airflow_dags_test(
    connect_server: ConnectServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.integration.airflow_merge_provider.test_example_seed import _run, _xcom
    from tests.integration.airflow_merge_provider.test_integration import _asset_events
    from tests.support.airflow_fixtures import make_airflow_home

    conn = {"conn_type": "spark_connect", "host": "localhost", "port": connect_server.port,
            "password": connect_server.token}  # fmt: skip
    home = make_airflow_home(tmp_path_factory.mktemp("airflow-connect"), spark_conn_id="merge_connect",
                             spark_conn=json.dumps(conn))  # fmt: skip
    _run(home, "merge_examples_seed", "2024-01-01")
    day = sorted(_xcom(home, "merge_examples_seed", "seed_landing_files"))[0]

    _run(home, "merge_upsert_daily", day)

    accounts = home.data / "accounts"
    metrics = _xcom(home, "merge_upsert_daily", "upsert_accounts")
    # What the same example merges through spark-submit (test_example_seed.py).
    expected = {
        "numSourceRows": 30, "numTargetRowsUpdated": 20, "numTargetRowsInserted": 10,
        "numTargetRowsDeleted": 0, "numTargetFilesRemoved": 2, "tableVersion": 4,
    }  # fmt: skip
    assert {name: metrics[name] for name in expected} == expected
    assert (metrics["skipped"], metrics["readVersion"]) == (False, 3)
    assert _txns(str(accounts)) == [(4, metrics["appId"], metrics["appVersion"])]
    assert _asset_events(home, f"file://{accounts}") == [{"task_id": "upsert_accounts", "extra": metrics}]
    assert len(read_rows(accounts, columns=["id"])) == 1010
    output = (Path(home.env["AIRFLOW_HOME"]) / "dags-test-merge_upsert_daily.log").read_text()
    assert "spark-submit" not in output.lower() or "Spark Connect server" in output
    assert connect_server.token not in output
    assert connect_server.token not in connect_server.log.read_text(errors="replace")
