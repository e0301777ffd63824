"""The provider under a deployed Airflow: scheduler, dag-processor, triggerer and api-server as real
processes on a real PostgreSQL metadata database, LocalExecutor, a scheduled DAG with catchup, a
deferrable merge and a deferrable sensor beside it in the real triggerer, then a backfill of the same
dates through the CLI.

Everything is read back the way an operator of a deployment would: XCom and task logs through the REST API
(v2), the table through two Delta readers and its log's history. 1 min 45 s to 2 min 30 s on 2 cores
shared with other work (the two spark-submits on a local[1] master, one at a time, are most of it).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.airflow_processes import AirflowProcesses, kill_session
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.support.jvm import fast_jvm_options
from tests.support.local_servers import free_port, wait_for_port
from tests.support.postgres_server import PostgresServer

DAG_ID = "deployed_daily_upsert"
MERGE_TASK, SENSOR_TASK = "merge_accounts", "wait_for_commit"
DATES = ("2024-01-01", "2024-01-02")
ADMIN = "admin"

# Each day upserts its landing file; day 2 updates a row day 1 updated and one day 1 inserted, so the
# final rows also show that the runs merged in date order.
INITIAL: dict[str, list[Any]] = {
    "id": list(range(10)),
    "name": [f"n{i}" for i in range(10)],
    "balance": [float(i) for i in range(10)],
}
LANDING: dict[str, dict[str, list[Any]]] = {
    "2024-01-01": {"id": [1, 2, 100], "name": ["a1", "a2", "a100"], "balance": [11.0, 12.0, 100.0]},
    "2024-01-02": {"id": [2, 100, 101, 102], "name": ["b2", "b100", "b101", "b102"],
                   "balance": [22.0, 200.0, 101.0, 102.0]},
}  # fmt: skip
# (inserted, updated) by each date's merge
EXPECTED_COUNTS = {"2024-01-01": (1, 2), "2024-01-02": (2, 2)}

DAG_FILE = '''
"""Written by test_deployed_airflow: a daily upsert with catchup, each merge waited for in the triggerer."""
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from airflow_merge_provider.sensors.merge_commit import MergeCommitSensor

TARGET = {target!r}
LANDING = {landing!r}

with DAG(
    dag_id={dag_id!r},
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    end_date=pendulum.datetime(2024, 1, 2, tz="UTC"),
    catchup=True,
    # One table: runs merge in date order, one at a time.
    max_active_runs=1,
):
    # Deferrable: the task starts spark-submit and waits in the triggerer for its driver and commit.
    MergeIntoOperator(
        task_id={merge_task!r},
        target=TARGET,
        source=LANDING + "/{{{{ ds }}}}",
        merge_sql="""
            MERGE INTO target t USING source s ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET *
            WHEN NOT MATCHED THEN INSERT *
        """,
        conn_id="spark_local",
        # Once per logical date, whatever run or clear executes it (README: Idempotency).
        app_id="deployed_accounts.{{{{ ds }}}}",
        app_version=1,
        deferrable=True,
        poll_interval=1,
        spark_conf={spark_conf!r},
    )
    # Beside the merge, not after it: it starts while the driver runs (a JVM takes seconds to start),
    # finds no commit yet and defers until the commit lands.
    MergeCommitSensor(
        task_id={sensor_task!r},
        target=TARGET,
        app_id="deployed_accounts.{{{{ ds }}}}",
        app_version=1,
        deferrable=True,
        poke_interval=1,
        timeout=600,
    )
'''

# A small local job: no UI, few partitions (and a JVM that starts fast: tests/support/jvm.py).
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


class AirflowApi:
    """The deployment's public REST API (v2), as a client of a deployment sees it: a JWT from the simple
    auth manager's ``/auth/token`` for a user and password, then bearer requests."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=30)

    def login(self, username: str, password: str) -> None:
        response = self.client.post("/auth/token", json={"username": username, "password": password})
        assert response.status_code == 201, f"POST /auth/token: {response.status_code} {response.text[:2000]}"
        self.client.headers["Authorization"] = f"Bearer {response.json()['access_token']}"

    def get(self, path: str, **params: Any) -> Any:
        response = self.client.get(path, params=params, headers={"Accept": "application/json"})
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:2000]}"
        return response.json()

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        response = self.client.patch(path, json=body)
        assert response.status_code == 200, f"PATCH {path}: {response.status_code} {response.text[:2000]}"
        return response.json()

    def task_path(self, run_id: str, task_id: str) -> str:
        return f"/api/v2/dags/{DAG_ID}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/{task_id}"

    def xcom(self, run_id: str, task_id: str) -> Any:
        return self.get(self.task_path(run_id, task_id) + "/xcomEntries/return_value")["value"]

    def log(self, run_id: str, task_id: str, try_number: int) -> str:
        """The task's log as text: one line per structured event."""
        body = self.get(self.task_path(run_id, task_id) + f"/logs/{try_number}", full_content=True)
        content = body["content"]
        if isinstance(content, str):
            return content
        return "\n".join(
            str(line.get("event", line)) if isinstance(line, dict) else str(line) for line in content
        )


@dataclass
class Deployment:
    """What the test drives: the running components, the API, the paths, and what it saw on the way."""

    processes: AirflowProcesses
    api: AirflowApi
    root: Path
    target: Path
    postgres: PostgresServer
    started: float  # time.monotonic() when the fixture started
    # (run_id, task_id) -> every state seen while polling
    states_seen: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def post_mortem(self, *names: str) -> str:
        return self.processes.tails(*names) + "\n--- postgres ---\n" + self.postgres.log_tail(1500)


def _write_inputs(root: Path) -> tuple[Path, Path]:
    """The target table (version 0), a landing directory per date, and the DAG file; returns the table's and
    the dags folder's paths."""
    from deltalake import write_deltalake

    target, landing, dags = root / "tables" / "accounts", root / "landing" / "accounts", root / "dags"
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("balance", pa.float64())])
    write_deltalake(str(target), pa.table(INITIAL, schema=schema))
    for date, columns in LANDING.items():
        (landing / date).mkdir(parents=True)
        pq.write_table(pa.table(columns, schema=schema), landing / date / "part-00000.parquet")
    dags.mkdir()
    spark_conf = {**SPARK_CONF, "spark.driver.extraJavaOptions": fast_jvm_options()}
    dag = DAG_FILE.format(target=str(target), landing=str(landing), dag_id=DAG_ID, merge_task=MERGE_TASK,
                          sensor_task=SENSOR_TASK, spark_conf=spark_conf)  # fmt: skip
    (dags / f"{DAG_ID}.py").write_text(textwrap.dedent(dag), encoding="utf-8")
    return target, dags


def _airflow_env(
    root: Path, dags: Path, *, database_url: str, api_port: int, password: str
) -> dict[str, str]:
    api_url = f"http://127.0.0.1:{api_port}"
    (root / "tmp").mkdir()
    passwords = root / "simple_auth_manager_passwords.json"
    passwords.write_text(json.dumps({ADMIN: password}), encoding="utf-8")
    return {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(root / "home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        # The default auth manager with one admin whose password the test knows.
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": api_url,
        # One secret for every component: the api-server checks the tokens the scheduler's workers get.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        # A cheap, quick deployment: one parsing process, a DAG parsed again at most every minute.
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[1]"}),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        # The job's zip and the detached drivers' logs go under <tempdir>/airflow-merge-provider: this test's.
        "TMPDIR": str(root / "tmp"),
    }


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """PostgreSQL, ``airflow db migrate``, then the four components; all stopped by PID at the end, with the
    detached spark-submits the merge tasks started."""
    started = time.monotonic()
    target, dags = _write_inputs(tmp_path)
    with PostgresServer() as postgres:
        postgres.create_database("airflow")
        api_port = free_port()
        password = secrets.token_urlsafe(16)
        env = _airflow_env(tmp_path, dags, database_url=postgres.sqlalchemy_url("airflow"), api_port=api_port,
                           password=password)  # fmt: skip
        with AirflowProcesses(tmp_path / "logs", env=env) as processes:
            timings = {"postgres": time.monotonic() - started}
            migrated = processes.run("db-migrate", "db", "migrate", timeout=600)
            assert migrated.returncode == 0, processes.tail("db-migrate") + postgres.log_tail()
            timings["db migrate"] = time.monotonic() - started
            api_server = processes.start("api-server", "api-server", "--host", "127.0.0.1", "--port",
                                         str(api_port), "--workers", "1")  # fmt: skip
            # No log servers: they bind every interface, and the api-server reads the task and trigger logs
            # from the shared log folder on this machine anyway.
            processes.start("scheduler", "scheduler", "--skip-serve-logs")
            processes.start("dag-processor", "dag-processor")
            processes.start("triggerer", "triggerer", "--skip-serve-logs")
            wait_for_port(api_port, api_server, name="api-server", timeout=120,
                          output=lambda: processes.tail("api-server"))  # fmt: skip
            api = AirflowApi(f"http://127.0.0.1:{api_port}")
            # Authentication is on: nothing without a token.
            assert api.client.get(f"/api/v2/dags/{DAG_ID}").status_code == 401
            api.login(ADMIN, password)
            timings["components up"] = time.monotonic() - started
            deployed = Deployment(
                processes=processes, api=api, root=tmp_path, target=target, postgres=postgres,
                started=started, timings=timings,
            )  # fmt: skip
            try:
                yield deployed
            finally:
                api.client.close()
                try:
                    processes.stop_all()
                finally:
                    _stop_detached_drivers(tmp_path)
                timings["stopped"] = time.monotonic() - started
                print(f"\ndeployed Airflow test timings (s since start): {timings}")


def _stop_detached_drivers(root: Path) -> None:
    """The merge tasks' spark-submits run in their own sessions, past their tasks: stop any still running
    (found by the job zip under this test's TMPDIR on their command lines)."""
    marker = str(root / "tmp")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in command and "spark" in command.lower():
            kill_session(int(proc.name), command_contains=marker)


def _wait_for_runs(deployment: Deployment, *, run_type: str, timeout: float) -> list[dict[str, Any]]:
    """Poll the API until the DAG's runs of ``run_type`` for every date succeeded; record each task
    instance's states on the way (a deferral lasts as long as its spark-submit: polled every second)."""
    api, deadline = deployment.api, time.monotonic() + timeout
    while True:
        deployment.processes.check_running()
        runs_path = f"/api/v2/dags/{DAG_ID}/dagRuns"
        runs: list[dict[str, Any]] = api.get(runs_path, order_by="logical_date")["dag_runs"]
        tis = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/~/taskInstances")["task_instances"]
        for ti in tis:
            seen = deployment.states_seen.setdefault((ti["dag_run_id"], ti["task_id"]), [])
            if not seen or seen[-1] != ti["state"]:
                seen.append(ti["state"])
        summary = [(r["dag_run_id"], r["run_type"], r["state"]) for r in runs]
        failed = [r for r in runs if r["state"] == "failed"]
        assert not failed, f"runs failed: {summary}\n{tis}\n{deployment.post_mortem()}"
        done = [r for r in runs if r["run_type"] == run_type and r["state"] == "success"]
        if len(done) == len(DATES):
            return runs
        assert time.monotonic() < deadline, (
            f"{run_type} runs not done within {timeout} s: {summary}\n{tis}\n{deployment.post_mortem()}"
        )
        time.sleep(1)


def _run_id(date: str) -> str:
    return f"scheduled__{date}T00:00:00+00:00"


def _unpause_once_parsed(deployment: Deployment) -> None:
    """Wait for the dag-processor to serialize the DAG (the API knows it then), check that it starts
    paused, and unpause it through the API."""
    api, deadline = deployment.api, time.monotonic() + 120
    while api.client.get(f"/api/v2/dags/{DAG_ID}").status_code != 200:
        deployment.processes.check_running()
        assert time.monotonic() < deadline, f"DAG never parsed\n{deployment.post_mortem('dag-processor')}"
        time.sleep(0.5)
    assert api.get(f"/api/v2/dags/{DAG_ID}")["is_paused"] is True
    assert api.patch(f"/api/v2/dags/{DAG_ID}", {"is_paused": False})["is_paused"] is False


def _history(target: Path) -> list[tuple[int, str]]:
    from deltalake import DeltaTable

    return sorted(
        (int(commit["version"]), str(commit["operation"])) for commit in DeltaTable(str(target)).history()
    )


def _txns(target: Path) -> list[tuple[int, str, int]]:
    """Every (table version, appId, app version) of the txn actions in the table's log."""
    found = []
    for commit in sorted((target / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            if "txn" in (action := json.loads(line)):
                found.append((int(commit.stem), action["txn"]["appId"], action["txn"]["version"]))
    return found


def _expected_rows() -> list[list[Any]]:
    rows = {i: [i, name, balance] for i, name, balance in zip(*INITIAL.values(), strict=True)}
    for date in DATES:  # in date order: a later day's update wins
        for i, name, balance in zip(*LANDING[date].values(), strict=True):
            rows[i] = [i, name, balance]
    return sorted(rows.values())


COUNTED = ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
           "numTargetRowsCopied", "numTargetFilesAdded", "numTargetFilesRemoved", "numOutputRows",
           "readVersion", "tableVersion", "appId", "appVersion")  # fmt: skip


def test_scheduled_catchup_then_backfill_on_a_deployed_airflow(deployment: Deployment) -> None:
    api, processes, target = deployment.api, deployment.processes, deployment.target
    timings = deployment.timings

    _unpause_once_parsed(deployment)
    runs = _wait_for_runs(deployment, run_type="scheduled", timeout=300)
    timings["scheduled runs done"] = time.monotonic() - deployment.started

    # Catchup made one run per date, which merged in date order: one commit each, keyed on the date.
    assert [(r["dag_run_id"], r["logical_date"][:10]) for r in runs] == [(_run_id(d), d) for d in DATES]
    committed: dict[str, dict[str, Any]] = {}
    for version, date in enumerate(DATES, start=1):
        run_id, app_id = _run_id(date), f"deployed_accounts.{date}"
        metrics = committed[date] = api.xcom(run_id, MERGE_TASK)
        inserted, updated = EXPECTED_COUNTS[date]
        expected = {
            "appId": app_id, "appVersion": 1, "numSourceRows": len(LANDING[date]["id"]),
            "numTargetRowsInserted": inserted, "numTargetRowsUpdated": updated, "numTargetRowsDeleted": 0,
            "readVersion": version - 1, "tableVersion": version, "skipped": False,
        }  # fmt: skip
        assert {key: metrics[key] for key in expected} == expected, metrics
        # The stages in the order they ran, through PostgreSQL's JSONB (which would sort an object's keys).
        stages = [stage["stage"].removeprefix("MERGE operation - ") for stage in metrics["stageTimesMs"]]
        assert stages[:2] == ["loading the target's snapshot", "resolving the statement"], stages
        assert stages[-1] == "committing", stages
        # The merge deferred; the triggerer watched its driver; the resumed task replayed the driver's
        # output into its log and logged the summary.
        merge_states = deployment.states_seen.get((run_id, MERGE_TASK), [])
        merge_log = api.log(run_id, MERGE_TASK, 1)
        assert "deferred" in merge_states, f"{merge_states}\n{merge_log}\n{processes.tails('triggerer')}"
        assert "Pausing task as DEFERRED" in merge_log, merge_log
        assert "Trigger fired event" in merge_log, merge_log
        assert f"MERGE committed version {version}" in merge_log, merge_log
        summary = (f"MERGE into {target} v{version}: source={len(LANDING[date]['id'])}, "
                   f"inserted={inserted}, updated={updated}, deleted=0,")  # fmt: skip
        assert summary in merge_log, merge_log

        # The sensor saw the same commit.
        sensed = api.xcom(run_id, SENSOR_TASK)
        assert {key: sensed[key] for key in COUNTED} == {key: metrics[key] for key in COUNTED}

        # The sensor deferred, its trigger ran in the triggerer (whose log file the API serves with the
        # task's), and the resumed task found the commit.
        states = deployment.states_seen.get((run_id, SENSOR_TASK), [])
        sensor_log = api.log(run_id, SENSOR_TASK, 1)
        assert "deferred" in states, f"{states}\n{sensor_log}\n{processes.tails('triggerer', 'scheduler')}"
        assert "Pausing task as DEFERRED" in sensor_log, sensor_log
        assert f"trigger {DAG_ID}/{run_id}/{SENSOR_TASK}/-1/1 " in sensor_log, sensor_log
        assert "Trigger fired event" in sensor_log, sensor_log
        found = f"Found merge commit version {version} of {target} (app {app_id}, version 1)"
        assert found in sensor_log, sensor_log
    assert _history(target) == [(0, "WRITE"), (1, "MERGE"), (2, "MERGE")]

    # Reprocess the same dates: Airflow 3 clears the completed runs and runs them again as a backfill.
    backfill = processes.run("backfill", "backfill", "create", "--dag-id", DAG_ID, "--from-date", DATES[0],
                             "--to-date", DATES[-1], "--reprocess-behavior", "completed")  # fmt: skip
    assert backfill.returncode == 0, processes.tail("backfill")
    (created,) = api.get("/api/v2/backfills", dag_id=DAG_ID)["backfills"]
    assert created["reprocess_behavior"] == "completed", created
    runs = _wait_for_runs(deployment, run_type="backfill", timeout=180)
    timings["backfill done"] = time.monotonic() - deployment.started

    assert [(r["dag_run_id"], r["run_type"]) for r in runs] == [(_run_id(d), "backfill") for d in DATES]
    for version, date in enumerate(DATES, start=1):
        run_id, first = _run_id(date), committed[date]
        ti = api.get(api.task_path(run_id, MERGE_TASK))
        assert (ti["state"], ti["try_number"]) == ("success", 2), ti
        # Keyed on {{ ds }}, each merge found its own commit and launched nothing.
        metrics = api.xcom(run_id, MERGE_TASK)
        assert metrics["skipped"] is True, metrics
        assert {key: metrics[key] for key in COUNTED} == {key: first[key] for key in COUNTED}
        merge_log = api.log(run_id, MERGE_TASK, 2)
        inserted, updated = EXPECTED_COUNTS[date]
        summary = (f"MERGE into {target} v{version} (already committed): source={len(LANDING[date]['id'])}, "
                   f"inserted={inserted}, updated={updated}, deleted=0,")  # fmt: skip
        assert summary in merge_log, merge_log
        assert "Started spark-submit" not in merge_log, merge_log
        assert api.xcom(run_id, SENSOR_TASK)["tableVersion"] == version

    # Exactly one merge a date, each applied once and in date order; both readers see the same rows.
    assert _history(target) == [(0, "WRITE"), (1, "MERGE"), (2, "MERGE")]
    assert _txns(target) == [(v, f"deployed_accounts.{d}", 1) for v, d in enumerate(DATES, start=1)]
    assert sorted(read_rows(target)) == _expected_rows()
    assert sorted(read_rows_with_kernel(target)) == _expected_rows()
