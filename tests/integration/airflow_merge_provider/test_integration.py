"""The example DAGs and the operator end to end: real ``airflow dags test``, real spark-submit, real tables.

Each test runs one DAG (one spark-submit, 10-15 s on an idle machine, more on a busy one) and checks the
rows, the Delta commit history, XCom and the asset events in the metadata DB. The upsert example runs end
to end in test_example_seed.py (on the seeded data) and in the fresh-clone test (the README's command); the
CDC and branching examples' statements and branches run in the shared SparkSession
(tests/unit/airflow_merge_provider/test_example_merges.py): their Airflow path is this one.
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
