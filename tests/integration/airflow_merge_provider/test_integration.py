"""The example DAGs and the operator end to end: real ``airflow dags test``, real spark-submit, real tables.

Each test runs one DAG (one spark-submit, 10-15 s on an idle machine, more on a busy one) and checks the
rows, the Delta commit history, XCom and the asset events in the metadata DB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.airflow_fixtures import AirflowHome
from tests.support.delta_reader import read_rows

DATE = "2024-01-02"


def _table(path: Path, columns: dict[str, list[Any]]) -> str:
    from deltalake import write_deltalake

    write_deltalake(str(path), pa.table(columns))
    return str(path)


def _landing(path: Path, columns: dict[str, list[Any]]) -> None:
    path.mkdir(parents=True)
    pq.write_table(pa.table(columns), path / "part-00000.parquet")


def _txns(table: str) -> list[tuple[int, str, int]]:
    """Every (table version, appId, app version) of the txn actions in the table's log."""
    found = []
    for commit in sorted(Path(table, "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "txn" in action:
                found.append((int(commit.stem), action["txn"]["appId"], action["txn"]["version"]))
    return found


def _xcom(home: AirflowHome, dag_id: str, task_id: str) -> Any:
    (value,) = home.sql(
        "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND key = 'return_value'", dag_id, task_id
    )
    return json.loads(value[0])


def _task_instances(home: AirflowHome, dag_id: str) -> Any:
    rows = home.sql("SELECT task_id, state, try_number FROM task_instance WHERE dag_id = ?", dag_id)
    return {task_id: [str(state), try_number] for task_id, state, try_number in rows}


def _asset_events(home: AirflowHome, uri: str) -> Any:
    rows = home.sql(
        "SELECT e.source_task_id, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE a.uri = ? ORDER BY e.id",
        uri,
    )
    return [{"task_id": task_id, "extra": json.loads(extra)} for task_id, extra in rows]


def _assert_ran(result: Any, home: AirflowHome, dag_id: str) -> None:
    log = Path(home.env["AIRFLOW_HOME"]) / f"dags-test-{dag_id}.log"
    assert result.returncode == 0, f"airflow dags test failed, see {log}:\n{result.stderr[-4000:]}"


def test_daily_upsert_example_merges_and_pushes_its_metrics(airflow_home: AirflowHome) -> None:
    accounts = _table(airflow_home.data / "accounts", {
        "id": pa.array(range(10), pa.int64()), "name": [f"n{i}" for i in range(10)],
        "balance": [float(i) for i in range(10)],
    })  # fmt: skip
    _landing(airflow_home.data / "landing" / "accounts" / DATE, {
        "id": pa.array([5, 6, 100], pa.int64()), "name": ["x5", "x6", "x100"], "balance": [50.0, 60.0, 1e3],
    })  # fmt: skip

    _assert_ran(airflow_home.dags_test("merge_upsert_daily", DATE), airflow_home, "merge_upsert_daily")

    rows = {row[0]: row[1:] for row in read_rows(accounts)}
    assert len(rows) == 11
    assert (rows[5], rows[6], rows[100], rows[7]) == (["x5", 50.0], ["x6", 60.0], ["x100", 1e3], ["n7", 7.0])
    metrics = _xcom(airflow_home, "merge_upsert_daily", "upsert_accounts")
    expected = {
        "numSourceRows": 3, "numTargetRowsInserted": 1, "numTargetRowsUpdated": 2, "numTargetRowsDeleted": 0,
        "numTargetRowsCopied": 8, "numTargetFilesRemoved": 1, "numOutputRows": 11, "readVersion": 0,
        "tableVersion": 1, "skipped": False, "dryRun": False, "appVersion": 0,
    }  # fmt: skip
    assert {key: metrics[key] for key in expected} == expected
    assert metrics["appId"].startswith("airflow:merge_upsert_daily.upsert_accounts:manual__")
    # The commit carries the merge's identity, and the asset event its metrics.
    assert _txns(accounts) == [(1, metrics["appId"], 0)]
    events = _asset_events(airflow_home, f"file://{accounts}")
    assert events == [{"task_id": "upsert_accounts", "extra": metrics}]


def test_a_retry_after_the_merge_committed_does_not_apply_it_twice(airflow_home: AirflowHome) -> None:
    names = _table(airflow_home.data / "names", {
        "id": pa.array(range(5), pa.int64()), "name": [f"n{i}" for i in range(5)],
    })  # fmt: skip
    _landing(airflow_home.data / "landing" / "names" / DATE, {
        "id": pa.array([1, 2, 9], pa.int64()), "name": ["+a", "+b", "new"],
    })  # fmt: skip

    result = airflow_home.dags_test("merge_retry_after_commit", DATE)

    _assert_ran(result, airflow_home, "merge_retry_after_commit")
    assert _task_instances(airflow_home, "merge_retry_after_commit") == {"append_names": ["success", 2]}
    # Applied once: names grew once, one commit carries the merge's transaction.
    assert sorted(read_rows(names)) == [[0, "n0"], [1, "n1+a"], [2, "n2+b"], [3, "n3"], [4, "n4"], [9, "new"]]
    metrics = _xcom(airflow_home, "merge_retry_after_commit", "append_names")
    assert _txns(names) == [(1, metrics["appId"], 0)]
    assert metrics["skipped"] is True
    counts = ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsCopied")
    assert [metrics[name] for name in counts] == [3, 1, 2, 3]
    assert (metrics["readVersion"], metrics["tableVersion"]) == (0, 1)


def test_fire_and_forget_then_the_deferred_sensor_sees_the_other_process_commit(
    airflow_home: AirflowHome,
) -> None:
    events_table = _table(airflow_home.data / "events", {
        "event_id": pa.array([1, 2], pa.int64()), "kind": ["a", "b"],
    })  # fmt: skip
    _landing(airflow_home.data / "landing" / "events" / DATE, {
        "event_id": pa.array([2, 3, 4], pa.int64()), "kind": ["b", "c", "d"],
    })  # fmt: skip

    result = airflow_home.dags_test("merge_fire_and_forget", DATE)

    _assert_ran(result, airflow_home, "merge_fire_and_forget")
    submitted = _xcom(airflow_home, "merge_fire_and_forget", "submit_merge")
    assert submitted["submitted"] is True
    assert Path(submitted["driverLog"]).is_file()
    metrics = _xcom(airflow_home, "merge_fire_and_forget", "wait_for_commit")
    assert (metrics["appId"], metrics["appVersion"]) == (submitted["appId"], 0)
    assert (metrics["numTargetRowsInserted"], metrics["numTargetRowsUpdated"], metrics["tableVersion"]) == (
        2,
        0,
        1,
    )
    assert sorted(row[0] for row in read_rows(events_table)) == [1, 2, 3, 4]
    # The sensor's outlet, not the fire-and-forget task, announces the table change with the metrics.
    assert _asset_events(airflow_home, f"file://{events_table}") == [
        {"task_id": "wait_for_commit", "extra": metrics}
    ]


def test_cdc_example_applies_updates_inserts_and_deletes(airflow_home: AirflowHome) -> None:
    import datetime as dt

    old = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    recent = dt.datetime(2023, 12, 1, tzinfo=dt.timezone.utc)
    customers = _table(airflow_home.data / "customers", {
        "id": pa.array([1, 2, 3, 4], pa.int64()), "name": ["a", "b", "c", "stale"],
        "email": ["a@x", "b@x", "c@x", "s@x"],
        "updated_at": pa.array([recent, recent, recent, old], pa.timestamp("us", tz="UTC")),
    })  # fmt: skip
    changed = dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)
    _landing(airflow_home.data / "landing" / "customer_changes" / DATE, {
        "id": pa.array([1, 2, 9], pa.int64()), "op": ["U", "D", "I"], "name": ["a2", "b", "new"],
        "email": ["a2@x", "b@x", "n@x"],
        "changed_at": pa.array([changed] * 3, pa.timestamp("us", tz="UTC")),
    })  # fmt: skip

    _assert_ran(airflow_home.dags_test("merge_cdc_apply", DATE), airflow_home, "merge_cdc_apply")

    rows = {row[0]: row[1] for row in read_rows(customers, columns=["id", "name"])}
    # 1 updated, 2 deleted by the feed, 9 inserted, 4 deleted as not matched by source and stale.
    assert rows == {1: "a2", 3: "c", 9: "new"}
    metrics = _xcom(airflow_home, "merge_cdc_apply", "apply_customer_changes")
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    assert metrics["numTargetRowsMatchedDeleted"] == 1
    assert metrics["numTargetRowsNotMatchedBySourceDeleted"] == 1


def test_branching_example_follows_the_merge_metrics(airflow_home: AirflowHome) -> None:
    orders = _table(airflow_home.data / "orders", {
        "order_id": pa.array([1, 2, 3], pa.int64()), "status": ["open", "open", "open"],
    })  # fmt: skip
    _landing(airflow_home.data / "landing" / "orders" / DATE, {
        "order_id": pa.array([2, 4], pa.int64()), "status": ["cancelled", "open"],
    })  # fmt: skip

    dag_id = "merge_metrics_branching"
    _assert_ran(airflow_home.dags_test(dag_id, DATE), airflow_home, dag_id)

    assert sorted(read_rows(orders)) == [[1, "open"], [3, "open"], [4, "open"]]
    states = _task_instances(airflow_home, "merge_metrics_branching")
    assert states["audit_deletions"][0] == "success"
    assert states["nothing_deleted"][0] == "skipped"
