"""The seed example under real ``airflow dags test``: its data lets the upsert example merge, and a second
seed leaves the merged table alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.integration.airflow_merge_provider.test_integration import _asset_events, _txns
from tests.support.airflow_fixtures import EXAMPLES, AirflowHome
from tests.support.delta_reader import read_rows


def _xcom(home: AirflowHome, dag_id: str, task_id: str) -> Any:
    """The task's return value in the run ``airflow dags test`` made last."""
    rows = home.sql(
        "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND key = 'return_value' "
        "ORDER BY timestamp DESC LIMIT 1",
        dag_id, task_id,
    )  # fmt: skip
    assert rows, f"{dag_id}.{task_id} pushed no return value"
    return json.loads(rows[0][0])


def _add_actions(table: Path) -> list[tuple[int, str]]:
    """(table version, path) of every file the table's log adds."""
    found = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                found.append((int(commit.stem), action["add"]["path"]))
    return found


def _run(home: AirflowHome, dag_id: str, logical_date: str) -> None:
    result = home.dags_test(dag_id, logical_date)
    log = Path(home.env["AIRFLOW_HOME"]) / f"dags-test-{dag_id}.log"
    assert result.returncode == 0, f"airflow dags test failed, see {log}:\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def example_dags() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(EXAMPLES), safe_mode=False).dags


def test_seeded_data_lets_the_upsert_example_merge_and_reseeding_keeps_the_table(
    airflow_home: AirflowHome, example_dags: Any
) -> None:
    seed_home = airflow_home
    _run(seed_home, "merge_examples_seed", "2024-01-01")

    accounts = seed_home.data / "accounts"
    table = _xcom(seed_home, "merge_examples_seed", "seed_accounts_table")
    assert table == {"table": str(accounts), "created": True, "version": 3}
    assert [version for version, _ in _add_actions(accounts)] == [0, 1, 2, 3]
    assert sorted(row[0] for row in read_rows(accounts, columns=["id"])) == list(range(1, 1001))
    landing = _xcom(seed_home, "merge_examples_seed", "seed_landing_files")
    days = sorted(landing)
    # The upsert's first catchup run is the first seeded day, so unpausing it finds files to merge.
    upsert_start = example_dags["merge_upsert_daily"].start_date
    assert days[0] == upsert_start.strftime("%Y-%m-%d")
    assert landing == dict.fromkeys(days, 30)
    for day in days:
        (part,) = (seed_home.data / "landing" / "accounts" / day).iterdir()
        assert pq.read_table(part).num_rows == 30
    # Nothing half-written is left beside what the seed published.
    assert not [path.name for path in seed_home.data.rglob(".*seeding*")]

    _run(seed_home, "merge_upsert_daily", days[0])

    metrics = _xcom(seed_home, "merge_upsert_daily", "upsert_accounts")
    expected = {
        "numSourceRows": 30, "numTargetRowsUpdated": 20, "numTargetRowsInserted": 10,
        "numTargetRowsDeleted": 0, "numTargetFilesRemoved": 2, "tableVersion": 4,
    }  # fmt: skip
    assert {name: metrics[name] for name in expected} == expected
    assert (metrics["skipped"], metrics["dryRun"], metrics["readVersion"]) == (False, False, 3)
    # The commit carries the merge's identity, and the asset event its metrics.
    # Keyed on the day: a clear or another `dags test` of this date would skip.
    assert (metrics["appId"], metrics["appVersion"]) == (f"accounts.{days[0]}", 1)
    assert _txns(str(accounts)) == [(4, metrics["appId"], metrics["appVersion"])]
    events = _asset_events(seed_home, f"file://{accounts}")
    assert events == [{"task_id": "upsert_accounts", "extra": metrics}]
    # The provider's reader of a task's metrics after `airflow dags test` (the docs' recipe).
    shown = subprocess.run(
        [sys.executable, "-m", "airflow_merge_provider", "metrics", "merge_upsert_daily", "upsert_accounts",
         days[0]],
        env=seed_home.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert shown.stdout.startswith("merge_upsert_daily.upsert_accounts in run ")
    cells = dict(re.findall(r"(\w+)\s+(\d+)", shown.stdout))
    assert {name: int(cells[name]) for name in expected} == expected
    balances = dict(read_rows(accounts, columns=["id", "balance"]))
    assert len(balances) == 1010
    # Account 1 updated by the first day, 2 untouched, 1001 new.
    assert (balances[1], balances[2], balances[1001]) == (110.5, 21.0, 10610.5)

    landing_files = sorted(seed_home.data.joinpath("landing").rglob("*.parquet"))
    stamps = [path.stat().st_mtime_ns for path in landing_files]
    _run(seed_home, "merge_examples_seed", "2024-01-02")

    assert _xcom(seed_home, "merge_examples_seed", "seed_accounts_table") == {
        "table": str(accounts), "created": False, "version": 4,
    }  # fmt: skip
    assert _xcom(seed_home, "merge_examples_seed", "seed_landing_files") == {}
    assert len(read_rows(accounts, columns=["id"])) == 1010
    assert [path.stat().st_mtime_ns for path in landing_files] == stamps


def test_the_metrics_command_in_a_home_without_runs_names_airflow_home(tmp_path: Path) -> None:
    home = tmp_path / "not-migrated"
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(home)
    shown = subprocess.run(
        [sys.executable, "-m", "airflow_merge_provider", "metrics", "merge_upsert_daily", "upsert_accounts",
         "2024-06-01"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "Traceback" not in shown.stderr
    assert f"the metadata database of AIRFLOW_HOME='{home}' has no DAG runs to read" in shown.stderr
    assert "scripts/run-example's is .example/airflow" in shown.stderr
