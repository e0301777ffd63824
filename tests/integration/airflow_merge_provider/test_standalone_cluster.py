"""The merge on a real Spark standalone cluster: a master and two one-core workers on 127.0.0.1.

The upsert example DAG runs through ``airflow dags test`` with its Spark connection on the cluster, and
its work is spread over executors on both workers. Then a worker dies in the middle of a larger merge:
the merge either completes (Spark reschedules the lost work) or fails with nothing committed, and a
rerun of the same application (in this process's session) leaves exactly the one-application result.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from tests.integration.airflow_merge_provider.test_integration import _assert_ran, _txns, _xcom
from tests.support.airflow_fixtures import make_airflow_home
from tests.support.delta_reader import read_table, table_version
from tests.support.jvm import FAST_START, submit_opts
from tests.support.standalone_cluster import StandaloneCluster
from tests.support.submit_harness import Submitted, progress_line

DATE = "2024-06-01"
ACCOUNTS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("balance", pa.float64())])


def _accounts(ids: range | list[int], *, balance: float) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"account-{i}" for i in ids],
                     "balance": [balance + i for i in ids]}, schema=ACCOUNTS)


def _rows(table: pa.Table) -> dict[int, tuple[Any, ...]]:
    """id -> the row's other values; duplicate ids fail here rather than vanish in the dict."""
    ids = table.column("id").to_pylist()
    duplicated = [key for key, count in Counter(ids).items() if count > 1]
    assert not duplicated, f"{len(duplicated)} ids occur more than once, e.g. {duplicated[:5]}"
    others = [table.column(name).to_pylist() for name in table.column_names if name != "id"]
    return dict(zip(ids, zip(*others, strict=True), strict=True))


def _upserted(target: dict[int, tuple[Any, ...]], source: pa.Table) -> dict[int, tuple[Any, ...]]:
    """The one-application result of ``UPDATE SET * / INSERT *`` on ``id``, computed without Spark."""
    return {**target, **_rows(source)}


def _differences(found: dict[int, tuple[Any, ...]], expected: dict[int, tuple[Any, ...]]) -> str:
    """A short account of how two tables of rows differ ('' when equal); pytest's own diff of two
    dicts of a quarter million rows would take minutes."""
    missing = sorted(expected.keys() - found.keys())
    extra = sorted(found.keys() - expected.keys())
    changed = sorted(key for key in expected.keys() & found.keys() if found[key] != expected[key])
    if not (missing or extra or changed):
        return ""
    return (f"{len(missing)} rows missing (ids {missing[:5]}), {len(extra)} unexpected (ids {extra[:5]}), "
            f"{len(changed)} with other values (e.g. {[(k, found[k], expected[k]) for k in changed[:3]]})")


# -- the upsert example DAG ------------------------------------------------------------------------------
def _event_log(directory: Path) -> tuple[str, list[dict[str, Any]]]:
    """The one application that logged events under ``directory``: its id and its events."""
    (log,) = directory.iterdir()
    return log.name, [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _tasks_by_executor(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["Task Info"]["Executor ID"] for e in events
                   if e["Event"] == "SparkListenerTaskEnd" and e["Task End Reason"]["Reason"] == "Success")


@pytest.mark.timeout(300)
def test_upsert_example_dag_runs_on_executors_of_both_workers(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    cluster = standalone_cluster
    events = tmp_path / "spark-events"
    events.mkdir()
    # The operator passes no conf of its own here, so the cluster's settings reach spark-submit through
    # SPARK_SUBMIT_OPTS, as system properties (the place of spark-defaults.conf; see tests/support/jvm.py).
    opts = submit_opts({
        **FAST_START, **cluster.application_confs(wait_for_executors=2), "spark.locality.wait": "0",
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
    })  # fmt: skip
    connection = json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.port})
    home = make_airflow_home(tmp_path / "airflow", spark_conn_id="spark_cluster", spark_conn=connection,
                             env={"SPARK_SUBMIT_OPTS": opts})
    accounts = home.data / "accounts"
    for start in range(0, 1000, 250):  # four files; the updates touch two of them
        write_deltalake(str(accounts), _accounts(range(start, start + 250), balance=0.0), mode="append")
    before = _rows(read_table(accounts))
    landing = home.data / "landing" / "accounts" / DATE
    landing.mkdir(parents=True)
    updates = _accounts([*range(10, 250, 6), *range(510, 750, 8)], balance=0.5)
    inserts = _accounts(range(1000, 1030), balance=0.5)
    pq.write_table(updates, landing / "part-00000.parquet")
    pq.write_table(inserts, landing / "part-00001.parquet")

    _assert_ran(home.dags_test("merge_upsert_daily", DATE), home, "merge_upsert_daily")

    source = pa.concat_tables([updates, inserts])
    assert not _differences(_rows(read_table(accounts)), _upserted(before, source))
    metrics = _xcom(home, "merge_upsert_daily", "upsert_accounts")
    expected = {
        "numSourceRows": 100, "numTargetRowsInserted": 30, "numTargetRowsUpdated": 70,
        "numTargetRowsDeleted": 0, "numTargetRowsCopied": 430, "numOutputRows": 530,
        "numTargetFilesBeforeSkipping": 4, "numTargetFilesRemoved": 2, "readVersion": 3, "tableVersion": 4,
        "skipped": False, "dryRun": False, "appVersion": 1, "appId": f"accounts.{DATE}",
    }  # fmt: skip
    assert {key: metrics[key] for key in expected} == expected
    assert _txns(str(accounts)) == [(4, f"accounts.{DATE}", 1)]
    # Both workers launched an executor for the merge's application, and both executors ran tasks.
    app_id, logged = _event_log(events)
    by_worker = cluster.executors_by_worker(app_id)
    assert [len(executors) for executors in by_worker] == [1, 1], by_worker
    tasks = _tasks_by_executor(logged)
    assert all(tasks[executor] > 0 for (executor,) in by_worker), (by_worker, tasks)
    assert set(tasks) == {executor for (executor,) in by_worker}, (by_worker, tasks)


# -- a worker dies in the middle of a larger merge ---------------------------------------------------------
TARGET_ROWS, TARGET_FILES = 240_000, 8  # a rewrite of 5-10 s on the two one-core executors
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
RUN = {"app_id": "standalone-cluster:worker-lost", "app_version": 1}


def _check_committed_metrics(
    metrics: dict[str, Any] | None, *, read_version: int, skipped: bool, path: str
) -> None:
    """The metrics of the merge's one commit: every target file gets a quarter of its rows updated."""
    assert metrics is not None, f"{path}: no metrics line"
    expected = {
        "numSourceRows": TARGET_ROWS // 4 + TARGET_ROWS // 20, "numTargetRowsUpdated": TARGET_ROWS // 4,
        "numTargetRowsInserted": TARGET_ROWS // 20, "numTargetRowsDeleted": 0,
        "numTargetRowsCopied": TARGET_ROWS * 3 // 4, "numOutputRows": TARGET_ROWS * 21 // 20,
        "numTargetFilesRemoved": TARGET_FILES, "readVersion": read_version, "tableVersion": read_version + 1,
        "skipped": skipped,
    }  # fmt: skip
    assert {key: metrics.get(key) for key in expected} == expected, path


def _stop_and_keep_output(job: Submitted, log: Path) -> None:
    """Kill the job if it still runs, and keep its output for post-mortems."""
    if job.process.poll() is None:
        job.kill()
    log.write_text("\n".join(job.lines) + "\n", encoding="utf-8")


@pytest.mark.timeout(420)
def test_worker_killed_mid_merge_then_a_rerun_leaves_the_one_application_result(
    standalone_cluster: StandaloneCluster, spark: Any, tmp_path: Path
) -> None:
    cluster = standalone_cluster
    target = tmp_path / "accounts"
    per_file = TARGET_ROWS // TARGET_FILES
    for start in range(0, TARGET_ROWS, per_file):
        write_deltalake(str(target), _accounts(range(start, start + per_file), balance=0.0), mode="append")
    read_version = table_version(target)
    before = _rows(read_table(target))
    landing = tmp_path / "landing"
    landing.mkdir()
    updates = _accounts(range(0, TARGET_ROWS, 4), balance=0.5)
    inserts = _accounts(range(TARGET_ROWS, TARGET_ROWS + TARGET_ROWS // 20), balance=0.5)
    pq.write_table(updates, landing / "part-00000.parquet")
    pq.write_table(inserts, landing / "part-00001.parquet")
    expected = _upserted(before, pa.concat_tables([updates, inserts]))
    spec = {"target": {"uri": str(target)}, "source": {"uri": str(landing), "format": "parquet"},
            "merge_sql": UPSERT, "run": RUN}
    confs = {**cluster.application_confs(wait_for_executors=2), "spark.locality.wait": "0"}

    first = Submitted(spec, tmp_path / "spec.json", master=cluster.master_url, confs=confs)
    try:
        rewriting = first.wait_for_line(progress_line("MERGE operation - Rewriting"), timeout=240)
        assert rewriting is not None, first.tail(80)
        time.sleep(1)  # time for the rewrite's tasks to start on both executors
        progress_at_kill = first.progress()
        victim = cluster.workers[0]
        assert len(victim.executor_pids()) == 1, "the worker to kill runs no executor of the merge"
        cluster.kill_worker(victim)
        first_code = first.wait(timeout=300)
    finally:
        _stop_and_keep_output(first, tmp_path / "first-run.log")
    assert not [line for line in progress_at_kill if line.startswith("committing")], (
        f"the merge had finished its rewrite before the worker was killed: {progress_at_kill}")

    if first_code == 0:
        retries = [line for line in first.progress() if line.startswith("MERGE retry")]
        path = f"the first run completed after the worker was lost ({len(retries)} merge retries)"
        assert table_version(target) == read_version + 1, path
        difference = _differences(_rows(read_table(target)), expected)
        _check_committed_metrics(first.metrics(), read_version=read_version, skipped=False, path=path)
    else:
        path = f"the first run failed (exit {first_code}: {first.failure()})"
        assert table_version(target) == read_version, f"{path} but committed"
        difference = _differences(_rows(read_table(target)), before)
    assert not difference, f"{path}: {difference}"

    # A fresh worker: the session's cluster is whole again for the tests after this one.
    cluster.start_worker()
    # The rerun, in this process's Spark session (the job's rerun logic is the same whatever the master; a
    # second application on the cluster would cost another cold driver and two executors).
    from spark_jobs.delta_merge import run_merge

    rerun_metrics = run_merge(spark, spec).to_dict()

    difference = _differences(_rows(read_table(target)), expected)
    assert not difference, f"{path}; after the rerun: {difference}"
    assert table_version(target) == read_version + 1, path
    assert _txns(str(target)) == [(read_version + 1, RUN["app_id"], RUN["app_version"])], path
    # After a first run that committed, the rerun finds its transaction and reports that commit.
    _check_committed_metrics(rerun_metrics, read_version=read_version, skipped=first_code == 0,
                             path=f"{path}; the rerun")
