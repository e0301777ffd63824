"""The demo behind scripts/run-example: an upsert into a small Delta table, run and checked end to end."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_ROOT = REPO_ROOT / ".example"
JOB_ENTRY_POINT = REPO_ROOT / "spark_jobs" / "delta_merge" / "__main__.py"
METRICS_MARKER = "MERGE_METRICS_JSON="

TARGET_ROWS = 1000
TARGET_FILES = 4
# Updates fall into two of the four target files, so a merge that rewrites only touched files
# removes 2 files, not 4.
UPDATED_IDS = (*range(11, 251, 6), *range(511, 751, 8))
INSERTED_IDS = tuple(range(TARGET_ROWS + 1, TARGET_ROWS + 31))

MERGE_SQL = (
    "MERGE INTO target t USING source s ON t.id = s.id "
    "WHEN MATCHED THEN UPDATE SET * "
    "WHEN NOT MATCHED THEN INSERT *"
)

# What the merge must report for this data; the demo fails when the job says otherwise.
EXPECTED_METRICS = {
    "numSourceRows": len(UPDATED_IDS) + len(INSERTED_IDS),
    "numTargetRowsUpdated": len(UPDATED_IDS),
    "numTargetRowsInserted": len(INSERTED_IDS),
    "numTargetRowsDeleted": 0,
    "numTargetFilesRemoved": 2,
}

EXAMPLE_DAG_ID = "merge_upsert_daily"
EXAMPLE_TASK_ID = "upsert_accounts"
LOGICAL_DATE = "2024-06-01"

Metrics = Mapping[str, Any]
# Runs the demo's merge and returns its metrics: through the example DAG (the default) or spark-submit.
Runner = Callable[["Demo"], Metrics]


class ExampleError(Exception):
    """The demo could not run, or the merge did not do what the demo expects."""


@dataclass(frozen=True)
class Demo:
    """Where the demo's data and spec live."""

    target_uri: str
    source_uri: str
    spec_path: Path
    target_version: int
    data_dir: Path


def _accounts_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("balance", pa.float64()),
            pa.field("updated_at", pa.timestamp("us", tz="UTC")),
        ]
    )


def _accounts(ids: list[int], *, balance_offset: float, updated_at: datetime) -> pa.Table:
    return pa.table(
        {
            "id": ids,
            "name": [f"account-{i:05d}" for i in ids],
            "balance": [round(i * 10.5 + balance_offset, 2) for i in ids],
            "updated_at": [updated_at + timedelta(seconds=i) for i in ids],
        },
        schema=_accounts_schema(),
    )


def prepare_demo(root: Path) -> Demo:
    """Write a fresh target table (accounts in 4 files), a Parquet source of changes, and the merge spec."""
    if root.exists():
        shutil.rmtree(root)
    # The layout the example DAG reads: <data dir>/accounts and <data dir>/landing/accounts/<ds>/.
    data_dir = root / "tables"
    target = data_dir / "accounts"
    source = data_dir / "landing" / "accounts" / LOGICAL_DATE
    source.mkdir(parents=True)

    created = datetime(2024, 1, 1, tzinfo=timezone.utc)
    per_file = TARGET_ROWS // TARGET_FILES
    for start in range(1, TARGET_ROWS + 1, per_file):
        batch = _accounts(list(range(start, start + per_file)), balance_offset=0.0, updated_at=created)
        deltalake.write_deltalake(str(target), batch, mode="append")

    changed = datetime(2024, 6, 1, tzinfo=timezone.utc)
    updates = _accounts([*UPDATED_IDS, *INSERTED_IDS], balance_offset=100.0, updated_at=changed)
    pq.write_table(updates, source / "part-00000.parquet")

    spec = {
        "target": {"uri": str(target), "storage_options": {}},
        "source": {"uri": str(source), "format": "parquet", "options": {}},
        "merge_sql": MERGE_SQL,
        "options": {"shuffle_partitions": 2},
        "run": {
            "app_id": "airflow-merge-provider-example",
            "app_version": 1,
            "commit_metadata": {"example": "scripts/run-example"},
        },
    }
    spec_path = root / "merge_spec.json"
    spec_path.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    version = deltalake.DeltaTable(str(target)).version()
    return Demo(
        target_uri=str(target), source_uri=str(source), spec_path=spec_path, target_version=version,
        data_dir=data_dir,
    )


def parse_metrics_line(line: str) -> Metrics | None:
    """The metrics carried by the job's ``MERGE_METRICS_JSON=<json>`` line, or None for any other line."""
    if not line.startswith(METRICS_MARKER):
        return None
    metrics = json.loads(line[len(METRICS_MARKER) :])
    if not isinstance(metrics, dict):
        raise ExampleError(f"{METRICS_MARKER} carried {type(metrics).__name__}, expected a JSON object")
    return metrics


def _stream(argv: list[str], env: Mapping[str, str], *, prefix: str = "  | ") -> tuple[int, Metrics | None]:
    """Run a command, echo its output as it comes, and catch the job's metrics line if it prints one."""
    print("$", " ".join(argv), flush=True)
    metrics: Metrics | None = None
    with subprocess.Popen(
        argv, cwd=REPO_ROOT, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"{prefix}{line}", end="", flush=True)
            marker_at = line.find(METRICS_MARKER)
            if marker_at >= 0:
                # In a task log the line may carry more after the JSON; the DAG runner reads XCom anyway.
                with contextlib.suppress(ValueError, ExampleError):
                    metrics = parse_metrics_line(line[marker_at:].rstrip("\n"))
        return proc.wait(), metrics


def _airflow_env(demo: Demo) -> dict[str, str]:
    home = demo.data_dir.parent / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags_examples"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # The embedded default: local Spark, Airflow on SQLite (in AIRFLOW_HOME), tables on local disk.
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "MERGE_EXAMPLES_SPARK_CONN_ID": "spark_local",
        "MERGE_EXAMPLES_DATA_DIR": str(demo.data_dir),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    return env


def run_with_airflow_dag(demo: Demo) -> Metrics:
    """Run the example DAG's merge task with ``airflow dags test`` and read its metrics from XCom."""
    airflow = str(Path(sys.executable).parent / "airflow")
    env = _airflow_env(demo)
    print("setting up Airflow's metadata database (SQLite) ...", flush=True)
    migrated = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True)
    if migrated.returncode != 0:
        raise ExampleError(f"airflow db migrate failed:\n{migrated.stdout}{migrated.stderr}")
    code, _ = _stream([airflow, "dags", "test", EXAMPLE_DAG_ID, LOGICAL_DATE], env)
    if code != 0:
        raise ExampleError(f"airflow dags test exited with code {code} (its output is above)")
    print("reading the task's metrics from XCom ...", flush=True)
    # The provider's own reader (Airflow 3's CLI has no xcom command); the README shows it too.
    read = subprocess.run(
        [sys.executable, "-m", "airflow_merge_provider", "metrics", EXAMPLE_DAG_ID, EXAMPLE_TASK_ID,
         LOGICAL_DATE, "--json"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    value = json.loads(read.stdout) if read.returncode == 0 and read.stdout.strip() else None
    if not isinstance(value, dict):
        raise ExampleError(f"no XCom return_value from {EXAMPLE_DAG_ID}.{EXAMPLE_TASK_ID}: {read.stderr}")
    print(f"\nXCom return_value of {EXAMPLE_DAG_ID}.{EXAMPLE_TASK_ID}:")
    return value


def run_with_spark_submit(demo: Demo) -> Metrics:
    """Run the packaged merge job with spark-submit on a local master, streaming its output."""
    spec_path = demo.spec_path
    if not JOB_ENTRY_POINT.is_file():
        raise ExampleError(
            f"the merge job's entry point {JOB_ENTRY_POINT.relative_to(REPO_ROOT)} does not exist yet: "
            "the demo needs the job CLI (`__main__.py --spec <file.json>`, printing one "
            f"{METRICS_MARKER}<json> line) to run a merge"
        )
    spark_submit = Path(sys.executable).parent / "spark-submit"
    if not spark_submit.exists():
        spark_submit = Path(shutil.which("spark-submit") or "spark-submit")
    argv = [
        str(spark_submit),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.log.level=WARN",
        str(JOB_ENTRY_POINT.relative_to(REPO_ROOT)),
        "--spec",
        str(spec_path),
    ]
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    returncode, metrics = _stream(argv, env)
    if returncode != 0:
        raise ExampleError(f"spark-submit exited with code {returncode} (its output is above)")
    # An exit code of 0 alone proves nothing: the job must also have reported what it did.
    if metrics is None:
        raise ExampleError(f"spark-submit exited 0 but printed no {METRICS_MARKER} line")
    return metrics


RUNNERS: dict[str, Runner] = {"airflow-dag": run_with_airflow_dag, "spark-submit": run_with_spark_submit}


def format_metrics(metrics: Metrics) -> str:
    """The metrics as a two-column table, in the order the job reported them."""
    width = max((len(name) for name in metrics), default=6)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 12}"]
    lines += [f"{name:<{width}}  {value}" for name, value in metrics.items()]
    return "\n".join(lines)


def check_result(demo: Demo, metrics: Metrics) -> list[str]:
    """What differs from the expected outcome: the metrics, and the rows now in the table."""
    problems = [
        f"{name} is {metrics.get(name)!r}, expected {want}"
        for name, want in EXPECTED_METRICS.items()
        if metrics.get(name) != want
    ]
    table = deltalake.DeltaTable(demo.target_uri)
    # Row counts from the log's per-file stats: reading the data through deltalake's pyarrow path can
    # abort the process at exit.
    rows = sum(pa.table(table.get_add_actions(flatten=True)).column("num_records").to_pylist())
    want_rows = TARGET_ROWS + len(INSERTED_IDS)
    if rows != want_rows:
        problems.append(f"the table has {rows} rows, expected {want_rows}")
    want_version = demo.target_version + 1
    if table.version() != want_version:
        problems.append(f"the table is at version {table.version()}, expected {want_version} (one merge)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runner", choices=sorted(RUNNERS), default="airflow-dag")
    args = parser.parse_args(argv)

    demo = prepare_demo(EXAMPLE_ROOT)
    print(f"target table : {demo.target_uri} ({TARGET_ROWS} accounts in {TARGET_FILES} files)")
    print(f"source       : {demo.source_uri} ({EXPECTED_METRICS['numSourceRows']} rows)")
    print(f"merge spec   : {demo.spec_path}")
    try:
        metrics = RUNNERS[args.runner](demo)
    except ExampleError as err:
        print(f"run-example: {err}", file=sys.stderr)
        return 1
    print()
    print(format_metrics(metrics))
    problems = check_result(demo, metrics)
    if problems:
        print("\nrun-example: the merge did not do what was expected:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(f"\nrun-example: ok: {len(UPDATED_IDS)} accounts updated, {len(INSERTED_IDS)} inserted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
