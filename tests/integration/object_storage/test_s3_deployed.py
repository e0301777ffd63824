"""Merges into Delta tables on S3 (the moto server, request signing on) through the deployment paths: the
job's CLI under real spark-submit with the storage options in a private spec file, and `airflow dags test` of
a MergeIntoOperator taking its credentials from a connection (aws_conn_id). The secret key must never show
on a command line, in the output or task log, in XCom, rendered fields or the metadata DB."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.support.delta_reader import read_rows
from tests.support.s3_server import S3Server
from tests.support.submit_harness import Submitted

KV = pa.schema([("id", pa.int64()), ("v", pa.string())])
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def kv(rows: list[tuple[int, str]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "v": v} for i, v in rows], schema=KV)


def write_parquet_source(server: S3Server, uri: str, table: pa.Table) -> None:
    pq.write_table(table, f"{uri.removeprefix('s3://')}/part-0.parquet", filesystem=server.arrow_fs())


class CommandLineWatch:
    """Samples every process's command line (``/proc/*/cmdline``) until stopped: which of them held
    ``needle``, and the command lines of the process group ``pgid`` seen meanwhile."""

    def __init__(self, needle: str, pgid: int) -> None:
        self.needle = needle.encode()
        self.pgid = pgid
        self.leaks: list[str] = []
        self.group: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                    pgrp = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
                except (OSError, ValueError, IndexError):
                    continue  # the process ended meanwhile
                text = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
                if self.needle in cmdline:
                    self.leaks.append(f"{proc.name}: {text[:300]}")
                if pgrp == self.pgid and text:
                    self.group.add(text)
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_spark_submit_merges_into_s3_with_the_keys_in_a_private_spec_file(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    options = s3_server.storage_options()
    secret = options["AWS_SECRET_ACCESS_KEY"]
    target = f"s3://{bucket}/orders"
    source = f"s3://{bucket}/incoming/2024-01-02"
    write_deltalake(target, kv([(1, "a"), (2, "b"), (3, "c")]), storage_options=options)
    write_parquet_source(s3_server, source, kv([(2, "B"), (4, "d")]))
    spec: dict[str, Any] = {
        "target": {"uri": target, "storage_options": options},
        "source": {"uri": source, "format": "parquet", "storage_options": options},
        "merge_sql": UPSERT,
        "run": {"app_id": "deployed-s3", "app_version": 1},
    }
    spec_file = tmp_path / "spec.json"
    spec_file.touch(mode=0o600)
    os.chmod(spec_file, 0o600)  # touch's mode goes through the umask

    job = Submitted(spec, spec_file, confs={"spark.driver.memory": "768m"})
    watch = CommandLineWatch(secret, job.process.pid)
    try:
        code = job.wait(timeout=600)
    finally:
        watch.stop()
        if job.process.poll() is None:
            job.kill()

    assert code == 0, job.tail()
    assert secret in spec_file.read_text(encoding="utf-8")  # the keys were there to leak
    assert spec_file.stat().st_mode & 0o777 == 0o600
    # The rows, read back from S3 with deltalake and the same storage options.
    rows = sorted(tuple(r) for r in read_rows(target, columns=["id", "v"], storage_options=options))
    assert rows == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]
    history = DeltaTable(target, storage_options=options).history(1)
    assert history[0]["operation"] == "MERGE"
    # One metrics line, with the merge's counts.
    metrics = job.metrics()
    assert metrics is not None, job.tail()
    counts = ("numSourceRows", "numTargetRowsUpdated", "numTargetRowsInserted", "numTargetRowsCopied")
    assert {name: metrics[name] for name in counts} == dict(zip(counts, (2, 1, 1, 2), strict=True))
    assert (metrics["readVersion"], metrics["tableVersion"], metrics["dryRun"]) == (0, 1, False)
    # No command line ever held the secret: not spark-submit's, the JVM's, the Python driver's or a worker's
    # (the watch did see the tree: the JVM and the Python driver running the job's __main__.py).
    assert watch.leaks == []
    assert any("org.apache.spark.deploy.SparkSubmit" in cmd for cmd in watch.group), watch.group
    assert any("__main__.py" in cmd and "--spec" in cmd for cmd in watch.group), watch.group
    # Nor the output (spark-submit's stdout and stderr, merged).
    output = "\n".join(job.lines)
    assert "MERGE_METRICS_JSON=" in output
    assert secret not in output
    assert secret not in json.dumps(metrics)


def test_spark_submit_takes_s3_credentials_from_the_environment(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """No storage_options at all: the driver's log store and deltalake, and the executors' pyarrow reader
    and writer, find the endpoint and keys in the standard AWS variables, as on a host with a role."""
    options = s3_server.storage_options()
    target, source = f"s3://{bucket}/orders", f"s3://{bucket}/incoming/2024-01-03"
    write_deltalake(target, kv([(1, "a"), (2, "b")]), storage_options=options)
    write_parquet_source(s3_server, source, kv([(2, "B"), (3, "c")]))
    spec = {"target": {"uri": target}, "source": {"uri": source, "format": "parquet"}, "merge_sql": UPSERT}

    job = Submitted(spec, tmp_path / "spec.json", env={**options, "AWS_EC2_METADATA_DISABLED": "true"})
    code = job.wait(timeout=600)

    assert code == 0, job.tail()
    assert options["AWS_SECRET_ACCESS_KEY"] not in (tmp_path / "spec.json").read_text(encoding="utf-8")
    rows = sorted(tuple(r) for r in read_rows(target, columns=["id", "v"], storage_options=options))
    assert rows == [(1, "a"), (2, "B"), (3, "c")]
    metrics = job.metrics()
    assert metrics is not None, job.tail()
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["tableVersion"]) == (
        1, 1, 1)  # fmt: skip


# -- airflow dags test: MergeIntoOperator with aws_conn_id --------------------------------------------------

S3_DAG = '''
"""A merge from a Parquet source on S3 into a Delta table on S3, with credentials from a connection."""
from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_merge_provider.operators.merge_into import MergeIntoOperator

START = pendulum.datetime(2024, 1, 1, tz="UTC")

with DAG(dag_id="merge_s3_with_connection", schedule=None, start_date=START):
    MergeIntoOperator(
        task_id="upsert_orders",
        target=os.environ["MERGE_S3_TARGET"],
        source=os.environ["MERGE_S3_SOURCE"] + "/{{ ds }}",
        merge_sql="MERGE INTO t USING s ON t.id = s.id "
                  "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        conn_id=os.environ["MERGE_EXAMPLES_SPARK_CONN_ID"],
        aws_conn_id="moto_s3",
        spark_conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
'''


def test_airflow_dags_test_merges_into_s3_with_credentials_from_a_connection(
    s3_server: S3Server, bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.support.airflow_fixtures import make_airflow_home

    options = s3_server.storage_options()
    secret, key_id = options["AWS_SECRET_ACCESS_KEY"], options["AWS_ACCESS_KEY_ID"]
    target, landing = f"s3://{bucket}/orders", f"s3://{bucket}/landing/orders"
    write_deltalake(target, kv([(1, "a"), (2, "b"), (3, "c")]), storage_options=options)
    write_parquet_source(s3_server, f"{landing}/2024-01-02", kv([(2, "B"), (4, "d")]))
    extra = {"region_name": options["AWS_REGION"], "endpoint_url": s3_server.endpoint}
    connection = {"conn_type": "aws", "login": key_id, "password": secret, "extra": extra}
    root = tmp_path_factory.mktemp("airflow-s3")
    home = make_airflow_home(root, env={
        "AIRFLOW_CONN_MOTO_S3": json.dumps(connection), "MERGE_S3_TARGET": target, "MERGE_S3_SOURCE": landing,
    })  # fmt: skip
    (home.dags / "merge_s3_with_connection.py").write_text(S3_DAG, encoding="utf-8")

    result = home.dags_test("merge_s3_with_connection", "2024-01-02")

    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    rows = sorted(tuple(r) for r in read_rows(target, columns=["id", "v"], storage_options=options))
    assert rows == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]
    history = DeltaTable(target, storage_options=options).history(1)
    assert history[0]["operation"] == "MERGE"
    xcom = home.query("""
        from airflow.models.xcom import XComModel
        with create_session() as session:
            (row,) = session.query(XComModel).filter_by(dag_id="merge_s3_with_connection",
                                                        task_id="upsert_orders", key="return_value").all()
            result = row.value
    """)
    xcom = json.loads(xcom) if isinstance(xcom, str) else xcom
    counts = ("numSourceRows", "numTargetRowsUpdated", "numTargetRowsInserted", "numTargetRowsCopied")
    assert {name: xcom[name] for name in counts} == dict(zip(counts, (2, 1, 1, 2), strict=True))
    assert (xcom["tableVersion"], xcom["skipped"]) == (1, False)
    rendered = home.query("""
        from airflow.models.renderedtifields import RenderedTaskInstanceFields as R
        with create_session() as session:
            rows = session.query(R).filter_by(dag_id="merge_s3_with_connection")
            result = [r.rendered_fields for r in rows]
    """)
    assert len(rendered) == 1
    assert rendered[0]["source"] == f"{landing}/2024-01-02"
    # The secret is nowhere Airflow keeps things: XCom, rendered fields, the task's log, the metadata DB as
    # a whole. `airflow dags test` runs the task in its own process and prints the task log (checked in
    # `output`) instead of writing files under logs/; any file there is scanned too.
    assert "from aws_conn_id='moto_s3' (keys: " in output  # the task log is in this output
    assert "MERGE_METRICS_JSON=" in output
    for text in (json.dumps(xcom), json.dumps(rendered), output):
        assert secret not in text
    home_dir = Path(home.env["AIRFLOW_HOME"])
    for path in [*home_dir.joinpath("logs").rglob("*"), *home_dir.glob("airflow.db*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


# -- the standalone cluster: executors on other JVMs read and write S3 with the spec's options --------------


@pytest.mark.timeout(420)
def test_standalone_cluster_merges_into_s3_and_a_rerun_is_skipped(
    standalone_cluster: Any, s3_server: S3Server, bucket: str, tmp_path: Path, spark: Any
) -> None:
    from tests.integration.airflow_merge_provider.test_standalone_cluster import (
        _event_log,
        _tasks_by_executor,
    )

    cluster = standalone_cluster
    options = s3_server.storage_options()
    secret = options["AWS_SECRET_ACCESS_KEY"]
    target, source = f"s3://{bucket}/orders", f"s3://{bucket}/incoming/2024-01-02"
    for start in range(0, 400, 100):  # four files; the updates touch two of them
        rows = [(i, f"v{i}") for i in range(start, start + 100)]
        write_deltalake(target, kv(rows), mode="append", storage_options=options)
    updates = [(i, f"u{i}") for i in range(0, 100, 10)] + [(i, f"u{i}") for i in range(300, 400, 10)]
    inserts = [(i, f"n{i}") for i in range(400, 420)]
    write_parquet_source(s3_server, source, kv(updates + inserts))
    spec_file = tmp_path / "spec.json"
    spec_file.touch(mode=0o600)
    os.chmod(spec_file, 0o600)
    spec: dict[str, Any] = {
        "target": {"uri": target, "storage_options": options},
        "source": {"uri": source, "format": "parquet", "storage_options": options},
        "merge_sql": UPSERT,
        "run": {"app_id": "deployed-s3-cluster", "app_version": 1},
    }
    events = tmp_path / "spark-events"
    events.mkdir()
    confs = {
        **cluster.application_confs(wait_for_executors=2), "spark.locality.wait": "0",
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
    }  # fmt: skip

    job = Submitted(spec, spec_file, master=cluster.master_url, confs=confs)
    watch = CommandLineWatch(secret, job.process.pid)
    try:
        code = job.wait(timeout=300)
    finally:
        watch.stop()
        if job.process.poll() is None:
            job.kill()

    assert code == 0, job.tail()
    expected = dict([(i, f"v{i}") for i in range(400)] + updates + inserts)
    rows = read_rows(target, columns=["id", "v"], storage_options=options)
    assert sorted(tuple(r) for r in rows) == sorted(expected.items())
    metrics = job.metrics()
    assert metrics is not None, job.tail()
    counts = {"numSourceRows": 40, "numTargetRowsUpdated": 20, "numTargetRowsInserted": 20,
              "numTargetRowsCopied": 180, "numTargetFilesRemoved": 2,
              "tableVersion": 4}  # fmt: skip
    assert {name: metrics[name] for name in counts} == counts
    # The work ran on executors of both workers, which read and wrote S3 with the spec's options: no
    # command line on the machine (executor JVMs and Python workers included) ever held the secret.
    app_id, logged = _event_log(events)
    by_worker = cluster.executors_by_worker(app_id)
    assert [len(executors) for executors in by_worker] == [1, 1], by_worker
    tasks = _tasks_by_executor(logged)
    assert all(tasks[executor] > 0 for (executor,) in by_worker), (by_worker, tasks)
    assert watch.leaks == []
    assert secret not in "\n".join(job.lines)

    # The same merge again (a retried task): the app transaction on S3 says it is done. The driver decides
    # that from the log before any executor works, so the warm local session reruns it: a second cluster
    # application (a driver and two executor JVMs) would cost the suite ~25 s of CPU to show the same.
    from spark_jobs.delta_merge import run_merge

    again = run_merge(spark, spec).to_dict()
    assert again["skipped"] is True, again
    assert DeltaTable(target, storage_options=options).version() == 4
    rows = read_rows(target, columns=["id", "v"], storage_options=options)
    assert sorted(tuple(r) for r in rows) == sorted(expected.items())
