"""Real spark-submits racing each other and a deltalake writer process on one table: every merge commits
exactly once or fails with Delta's conflict, and no counter is lost or counted twice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.protocol.delta_log import read_commit_info
from tests.support.delta_reader import read_rows, table_version
from tests.support.submit_harness import PYTHON, Submitted, kill_all, submit_env
from tests.unit.spark_jobs.commit.test_concurrency import assert_unique_keys

COUNTER_SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("counter", pa.int64())])
INCREMENT = """MERGE INTO t USING s ON t.id = s.id AND t.p = 'orig'
WHEN MATCHED THEN UPDATE SET counter = t.counter + 1"""


def counter_table(path: Path, keys: range) -> None:
    half = len(keys) // 2
    for chunk in (keys[:half], keys[half:]):  # two files, so that compaction has work
        rows = [{"id": i, "p": "orig", "counter": 0} for i in chunk]
        write_deltalake(str(path), pa.Table.from_pylist(rows, schema=COUNTER_SCHEMA), mode="append",
                        partition_by=["p"])


def counter_spec(path: Path, source_dir: Path, app_id: str) -> dict[str, Any]:
    return {"target": {"uri": str(path)}, "source": {"uri": str(source_dir), "format": "parquet"},
            "merge_sql": INCREMENT, "run": {"app_id": app_id, "app_version": 1}}


def counters(path: Path) -> dict[tuple[int, str], int]:
    rows = read_rows(path, columns=["id", "p", "counter"])
    assert_unique_keys([tuple(r) for r in rows])
    return {(int(i), str(p)): int(c) for i, p, c in rows}
def test_two_concurrent_submits_with_the_same_app_transaction_commit_once(tmp_path: Path) -> None:
    path, keys = tmp_path / "t", range(10)
    counter_table(path, keys)
    source_dir = tmp_path / "s"
    source_dir.mkdir()
    pq.write_table(pa.table({"id": pa.array(keys, pa.int64())}), source_dir / "part-0.parquet")
    merge_spec = counter_spec(path, source_dir, "same.app")

    jobs = [Submitted(merge_spec, tmp_path / f"spec-{n}.json") for n in range(2)]
    try:
        codes = [job.wait(timeout=300) for job in jobs]
    finally:
        kill_all(jobs)

    outcomes = [(code, job.metrics(), job.failure()) for code, job in zip(codes, jobs, strict=True)]
    applied_runs = [m for code, m, _ in outcomes if code == 0 and m is not None and not m["skipped"]]
    assert len(applied_runs) == 1, [job.tail() for job in jobs]
    for code, metrics, failure in outcomes:
        if metrics is not None and metrics["skipped"]:
            # The loser saw the winner's commit: it reports that commit and its metrics.
            assert metrics["tableVersion"] == applied_runs[0]["tableVersion"]
            assert metrics["numTargetRowsUpdated"] == applied_runs[0]["numTargetRowsUpdated"] == 10
        elif metrics is None:
            assert code == 1, failure
            assert failure is not None
            assert "ConcurrentModificationError" in failure, failure
    assert table_version(path) == 2
    with_txn = [v for v in range(table_version(path) + 1)
                if any("txn" in json.loads(line) for line in _commit_lines(path, v))]
    assert with_txn == [2]
    assert set(counters(path).values()) == {1}
    print("same app transaction:", [(code, metrics and metrics["skipped"], failure)
                                    for code, metrics, failure in outcomes], file=sys.stderr)


def _commit_lines(path: Path, version: int) -> list[str]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


# -- stress: overlapping spark-submits and a deltalake writer process -----------------------------------
WRITER = textwrap.dedent("""
    import json, os, sys, time
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    path, calm, stop, report = sys.argv[1:5]
    schema = pa.schema([("id", pa.int64()), ("p", pa.string()), ("counter", pa.int64())])
    appended, failures, compactions, tick = [], [], 0, 0
    deadline = time.monotonic() + 200
    while not os.path.exists(stop) and time.monotonic() < deadline:
        tick += 1
        # Until told to calm down, every 30th tick appends into the partition the merges read and every
        # 45th compacts the whole table (both conflict with merges in flight); otherwise only the other
        # partition changes, which merges must commit on top of.
        chaos = not os.path.exists(calm)
        part, key = ("orig", 5000 + tick) if chaos and tick % 30 == 0 else ("new", 1000 + tick)
        try:
            write_deltalake(path, pa.Table.from_pylist([{"id": key, "p": part, "counter": 0}], schema=schema),
                            mode="append", partition_by=["p"])
            appended.append([key, part])
            if tick % 5 == 0:
                whole = chaos and tick % 45 == 0
                DeltaTable(path).optimize.compact(partition_filters=None if whole else [("p", "=", "new")])
                compactions += 1
        except Exception as exc:  # a delta-rs commit conflict with a merge: fine, go on
            failures.append(type(exc).__name__)
        time.sleep(0.3)
    with open(report, "w") as handle:
        json.dump({"appended": appended, "failures": failures, "compactions": compactions}, handle)
""")
@pytest.mark.timeout(240)
def test_overlapping_merges_and_a_writer_keep_counters_exact(spark: Any, tmp_path: Path) -> None:
    path, keys = tmp_path / "t", range(20)
    counter_table(path, keys)
    write_deltalake(str(path), pa.Table.from_pylist([{"id": 999, "p": "new", "counter": 0}],
                                                    schema=COUNTER_SCHEMA), mode="append", partition_by=["p"])
    source_dir = tmp_path / "s"
    source_dir.mkdir()
    pq.write_table(pa.table({"id": pa.array(keys, pa.int64())}), source_dir / "part-0.parquet")
    calm, stop, report = tmp_path / "calm", tmp_path / "stop", tmp_path / "writer.json"
    writer = subprocess.Popen([str(PYTHON), "-c", WRITER, str(path), str(calm), str(stop), str(report)],
                              env=submit_env(), start_new_session=True)
    jobs: list[Submitted] = []

    def submit(n: int) -> None:
        jobs.append(Submitted(counter_spec(path, source_dir, f"stress.merge-{n}"), tmp_path / f"s{n}.json"))

    try:
        for n in range(2):  # overlapping, against the writer at its worst
            submit(n)
            time.sleep(4)
        codes = [job.wait(timeout=200) for job in jobs]
        # A last merge after the others, while the writer only touches the other partition: it must
        # commit on top of everything (so at least one merge always commits). It runs in this process's
        # session: the submitted merges' conflicts are the point, a third cold application is not.
        calm.touch()
        last = run_merge(spark, counter_spec(path, source_dir, "stress.merge-2")).to_dict()
    finally:
        kill_all(jobs)
        stop.touch()
        try:
            writer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            writer.kill()
            raise
    assert writer.returncode == 0
    written = json.loads(report.read_text(encoding="utf-8"))

    committed, conflicts = 0, []
    for code, job in zip(codes, jobs, strict=True):
        metrics = job.metrics()
        if code == 0:
            assert metrics is not None, job.tail()
            assert metrics["skipped"] is False
            committed += 1
        else:  # only conflicts may fail a merge here, with Delta's rule named
            failure = job.failure()
            assert code == 1, job.tail()
            assert failure is not None, job.tail()
            conflict = "MERGE failed: ConcurrentModificationError: [DELTA_CONCURRENT_"
            assert failure.startswith(conflict), failure
            conflicts.append(failure.split(": ")[2].split("] ")[1])
    assert last["skipped"] is False
    committed += 1
    final = counters(path)  # asserts unique keys
    assert {final[(i, "orig")] for i in keys} == {committed}
    expected_others = {(999, "new")} | {(int(k), str(p)) for k, p in written["appended"]}
    assert set(final) == {(i, "orig") for i in keys} | expected_others
    assert all(final[k] == 0 for k in expected_others)
    merges = [v for v in range(table_version(path) + 1)
              if read_commit_info(str(path), v).get("mergeOperation") == "MERGE"]
    assert len(merges) == committed
    print(f"stress: {committed} of {len(jobs) + 1} merges committed, conflicts {conflicts}; writer: "
          f"{len(written['appended'])} appends, "
          f"{written['compactions']} compactions, {len(written['failures'])} failed commits", file=sys.stderr)
