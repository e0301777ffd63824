"""MergeIntoOperator on a real Spark Connect server: the same XCom, commit and asset event as through
spark-submit; no token or storage secret in the server's log, plans, session conf or the task's output; a
server killed mid-merge or after the commit leaves the table at its old version or committed once, and the
retry applies the batch once."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from airflow_merge_provider.errors import MergeJobFailedError
from tests.integration.airflow_merge_provider.test_integration import _txns
from tests.support.connect_server import ConnectServer, command_lines_holding
from tests.support.delta_reader import read_rows, read_rows_with_kernel, table_version
from tests.support.operator_helpers import APP_ID, merge_operator, runtime_context

CONN_ID = "spark_connect_test"
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))


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

    # Nowhere on the server: its log, its session conf, the plans of what it ran; on no command line.
    assert secret not in connect_server.log.read_text(errors="replace")
    assert command_lines_holding(secret) == []
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


def test_a_merge_hands_its_session_back_holding_nothing_and_a_failed_one_gives_it_up(
    connect_server: ConnectServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import gc

    from pyspark.sql.connect.plan import CachedRemoteRelation

    from airflow_merge_provider.hooks.merge_connect import MergeConnectHook
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import MultipleSourceRowMatchesError

    def checkpointed() -> list[Any]:
        # type(), not isinstance: isinstance asks every object its __class__, which makes Airflow's lazy
        # module proxies import what they stand for.
        return [o for o in gc.get_objects() if type(o) is CachedRemoteRelation]

    _connection(monkeypatch, connect_server)
    _upsert_data(tmp_path)
    spec = {"target": {"uri": str(tmp_path / "table")}, "source": {"uri": str(tmp_path / "source")},
            "merge_sql": "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
                         "WHEN NOT MATCHED THEN INSERT *"}  # fmt: skip
    with MergeConnectHook(CONN_ID).session() as spark:
        first = spark.client._session_id
        # What earlier tests of this worker left as garbage (a failed merge's traceback holds its source) is
        # collected first, so that what is left after the merge is the merge's.
        gc.collect()
        before = {id(o) for o in checkpointed()}
        metrics = run_merge(spark, spec).to_dict()
        # The source was checkpointed on the server, and released there by the merge's end: no DataFrame
        # of it is left, not even as garbage waiting for a collection (then it would never be released).
        assert metrics["materializeSourceReason"] == "NON_DETERMINISTIC_SOURCE_NON_DELTA"
        assert [o for o in checkpointed() if id(o) not in before] == []

    # A merge that fails after materializing its source (two source rows for one target row).
    duplicates = tmp_path / "duplicates"
    duplicates.mkdir()
    pq.write_table(pa.table({"id": pa.array([2, 2], pa.int64()), "v": ["a", "b"]}), duplicates / "p.parquet")
    failing = {**spec, "source": {"uri": str(duplicates)}}

    def merge_in_a_leased_session() -> None:
        with MergeConnectHook(CONN_ID).session() as spark:
            assert spark.client._session_id == first
            run_merge(spark, failing)

    with pytest.raises(MultipleSourceRowMatchesError):
        merge_in_a_leased_session()
    # Its session, with whatever the failure still holds, was closed on the server: the next merge on that
    # pool slot gets a new one.
    with MergeConnectHook(CONN_ID).session() as spark:
        assert spark.client._session_id != first
        assert spark.range(2).count() == 2
    assert table_version(tmp_path / "table") == 1


def test_a_server_killed_before_or_after_the_commit_and_the_retry_on_the_restarted_server(
    tmp_path_factory: pytest.TempPathFactory, make_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed before the commit: the task fails naming the server, the table is at its old version, and
    the retry on the server started again (same address, same token) applies the batch once. Killed after
    the commit: the task reports that commit, and the retry on the next restart applies nothing again."""
    from spark_jobs.delta_merge import pipeline
    from spark_jobs.delta_merge.merge import classic

    server = ConnectServer(tmp_path_factory.mktemp("connect-faults"))
    servers = [server]
    _connection(monkeypatch, server)

    def restart() -> ConnectServer:
        again = ConnectServer(server.root / f"restart-{len(servers)}", port=server.port, token=server.token)
        again.start()
        servers.append(again)
        return again

    try:
        server.start()
        # Killed before the commit (while the output is written).
        before = tmp_path_factory.mktemp("killed-before")
        _upsert_data(before)
        with monkeypatch.context() as patch:
            real_write = classic.write_output

            def kill_then_write(*args: Any, **kwargs: Any) -> Any:
                servers[-1].kill()
                return real_write(*args, **kwargs)

            patch.setattr(classic, "write_output", kill_then_write)
            with pytest.raises(MergeJobFailedError) as failed:
                merge_operator(before, conn_id=CONN_ID).execute(runtime_context(make_context))
        message = str(failed.value)
        assert f"sc://localhost:{server.port}" in message
        assert f"'{CONN_ID}'" in message
        assert "Nothing was committed" in message
        assert server.token not in message
        assert table_version(before / "table") == 0

        restart()  # the pooled session's id is new to this server: opened anew, the job added again
        retried = merge_operator(before, conn_id=CONN_ID).execute(runtime_context(make_context))
        assert retried["skipped"] is False
        assert sorted(read_rows(before / "table")) == UPSERTED
        assert _txns(str(before / "table")) == [(1, APP_ID, 0)]

        # Killed after the commit landed: the task reports that commit.
        after = tmp_path_factory.mktemp("killed-after")
        _upsert_data(after)
        with monkeypatch.context() as patch:
            real_commit = pipeline.commit_merge

            def commit_then_kill(*args: Any, **kwargs: Any) -> Any:
                committed = real_commit(*args, **kwargs)
                servers[-1].kill()
                return committed

            patch.setattr(pipeline, "commit_merge", commit_then_kill)
            result = merge_operator(after, conn_id=CONN_ID).execute(runtime_context(make_context))
        assert (result["tableVersion"], result["numTargetRowsInserted"]) == (1, 1)

        restart()
        again = merge_operator(after, conn_id=CONN_ID).execute(runtime_context(make_context))
        assert (again["skipped"], again["tableVersion"]) == (True, 1)
        assert sorted(read_rows(after / "table")) == UPSERTED
        assert _txns(str(after / "table")) == [(1, APP_ID, 0)]
    finally:
        for each in servers:
            each.stop()


def test_the_upsert_example_merges_on_spark_connect_under_airflow_dags_test(
    connect_server: ConnectServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import shutil

    from run_example import LOGICAL_DATE, check_result, prepare_demo

    from tests.integration.airflow_merge_provider.test_example_seed import _run, _xcom
    from tests.integration.airflow_merge_provider.test_integration import _asset_events
    from tests.support.airflow_fixtures import make_airflow_home

    conn = {"conn_type": "spark_connect", "host": "localhost", "port": connect_server.port,
            "password": connect_server.token}  # fmt: skip
    home = make_airflow_home(tmp_path_factory.mktemp("airflow-connect"), spark_conn_id="merge_connect",
                             spark_conn=json.dumps(conn))  # fmt: skip
    # The README demo's table and landing file, where the example DAG reads them.
    demo = prepare_demo(tmp_path_factory.mktemp("demo"))
    for part in demo.data_dir.iterdir():
        shutil.move(str(part), str(home.data / part.name))
    accounts = home.data / Path(demo.target_uri).name
    demo = replace(demo, target_uri=str(accounts), data_dir=home.data)

    _run(home, "merge_upsert_daily", LOGICAL_DATE)

    metrics = _xcom(home, "merge_upsert_daily", "upsert_accounts")
    # What the README demo merges through spark-submit.
    assert check_result(demo, metrics) == []
    version = demo.target_version
    assert (metrics["skipped"], metrics["readVersion"]) == (False, version)
    assert metrics["tableVersion"] == version + 1
    assert _txns(str(accounts)) == [(version + 1, metrics["appId"], metrics["appVersion"])]
    assert _asset_events(home, f"file://{accounts}") == [{"task_id": "upsert_accounts", "extra": metrics}]
    output = (Path(home.env["AIRFLOW_HOME"]) / "dags-test-merge_upsert_daily.log").read_text()
    assert f"Spark Connect server sc://localhost:{connect_server.port}" in output
    assert connect_server.token not in output
    assert connect_server.token not in connect_server.log.read_text(errors="replace")
