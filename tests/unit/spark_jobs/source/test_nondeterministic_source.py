"""Sources that change between the merge's two scans, and materialized sources that lose their blocks.

Delta reads the source twice (find touched files, then rewrite); materializing it makes both scans see
one snapshot. A merge whose materialized blocks are lost runs again from its snapshot with a more
durable storage level (Delta's runWithMaterializedSourceLostRetries), committing exactly once.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.merge import classic as classic_merge_module
from spark_jobs.delta_merge.source.materialize import MATERIALIZE_MAX_ATTEMPTS, storage_level_for_attempt
from tests.support.delta_reader import read_rows, table_version
from tests.support.standalone_cluster import StandaloneCluster
from tests.support.submit_harness import Submitted, progress_line

KV = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("v2", pa.int64())])
UPSERT = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED THEN UPDATE SET v = s.v, v2 = s.v2 WHEN NOT MATCHED THEN INSERT *"""


def kv(rows: list[tuple[int, int, int]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(KV.names, r, strict=True)) for r in rows], schema=KV)


def merge(
    spark: Any, target: Path, source: dict[str, Any], sql: str = UPSERT, **options: Any
) -> dict[str, Any]:
    spec = {"target": {"uri": str(target)}, "source": source, "merge_sql": sql, "options": options}
    metrics: dict[str, Any] = run_merge(spark, spec).to_dict()
    return metrics


def rows(target: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in read_rows(target, columns=list(KV.names)))


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    write_deltalake(str(path), kv([(i, -1, -1) for i in range(10)]))
    return path


@pytest.fixture
def source_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "s"
    directory.mkdir()
    pq.write_table(kv([(i, 100 + i, 100 + i) for i in range(0, 10, 2)]), directory / "part-0.parquet")
    return directory


def parquet(directory: Path) -> dict[str, Any]:
    return {"uri": str(directory), "format": "parquet"}


# -- (a) rand() in the source ---------------------------------------------------------------------------
def test_rand_source_is_materialized_and_both_scans_see_one_snapshot(
    spark: Any, target: Path, tmp_path: Path
) -> None:
    ids = tmp_path / "ids"
    ids.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}), ids / "part-0.parquet")
    # Each source row either matches target row `id` or is a new key `id + 1000`, decided by rand(): were
    # the two scans to evaluate rand() differently, the rows found matched and the rows written would
    # disagree (an id both updated and inserted, or neither). v2 comes from the same rand() draw as v.
    query = f"""
        SELECT CASE WHEN r < 0.5 THEN id ELSE id + 1000 END AS id, CAST(r * 1000 AS BIGINT) AS v,
               CAST(r * 1000 AS BIGINT) AS v2
        FROM (SELECT id, rand() AS r FROM parquet.`{ids}`)"""

    metrics = merge(spark, target, {"query": query})

    assert metrics["materializeSourceReason"] == "NON_DETERMINISTIC_SOURCE_NON_DELTA"
    assert metrics["numSourceRows"] == metrics["numSourceRowsInSecondScan"] == 10
    assert metrics["numTargetRowsUpdated"] + metrics["numTargetRowsInserted"] == 10
    result = rows(target)
    by_id = {r[0]: r for r in result}
    assert len(by_id) == len(result) == 10 + metrics["numTargetRowsInserted"]
    for i in range(10):
        updated = by_id[i][1] != -1
        inserted = i + 1000 in by_id
        assert updated != inserted, (i, by_id[i], by_id.get(i + 1000))  # exactly one of the two
        written = by_id[i] if updated else by_id[i + 1000]
        assert written[1] == written[2]
    assert metrics["numTargetRowsUpdated"] == sum(1 for i in range(10) if by_id[i][1] != -1)


# -- (b) a source directory that gains or changes files between the scans --------------------------------
def _after_first_scan(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Run ``action`` once, right after the merge's first source scan (finding touched files)."""
    real = classic_merge_module.find_touched_files  # type: ignore[attr-defined]

    def scanned_then_act(*args: Any, **kwargs: Any) -> Any:
        touched = real(*args, **kwargs)
        action()
        return touched

    monkeypatch.setattr(classic_merge_module, "find_touched_files", scanned_then_act)
def test_file_added_between_scans_is_not_applied_by_a_materialized_source(
    spark: Any, target: Path, source_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    late = kv([(1, 201, 201), (50, 250, 250)])  # would update 1 and insert 50
    _after_first_scan(monkeypatch, lambda: pq.write_table(late, source_dir / "part-1.parquet"))

    metrics = merge(spark, target, parquet(source_dir))

    assert metrics["materializeSourceReason"] == "NON_DETERMINISTIC_SOURCE_NON_DELTA"
    assert metrics["numSourceRows"] == metrics["numSourceRowsInSecondScan"] == 5
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (5, 0)
    assert rows(target) == [(i, 100 + i, 100 + i) if i % 2 == 0 else (i, -1, -1) for i in range(10)]
def test_file_added_between_scans_without_materialization(
    spark: Any, target: Path, source_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Documented behaviour: a Spark DataFrame lists its input files once, when it is created, so even an
    # unmaterialized file source does not see a file added later; only changes to listed files show.
    late = kv([(1, 201, 201), (50, 250, 250)])
    _after_first_scan(monkeypatch, lambda: pq.write_table(late, source_dir / "part-1.parquet"))

    metrics = merge(spark, target, parquet(source_dir), materialize_source="none")

    assert metrics["materializeSourceReason"] == "NOT_MATERIALIZED_NONE"
    assert metrics["numSourceRows"] == metrics["numSourceRowsInSecondScan"] == 5
    assert rows(target) == [(i, 100 + i, 100 + i) if i % 2 == 0 else (i, -1, -1) for i in range(10)]
@pytest.mark.parametrize("mode", ["auto", "none"])
def test_file_rewritten_between_scans(
    spark: Any, target: Path, source_dir: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, mode: str,
) -> None:
    """A listed file rewritten in place: materialized, nothing changes; unmaterialized, the second scan
    reads the new rows, which the metrics show (numSourceRowsInSecondScan) and a warning reports."""
    rewritten = kv([(i, 300 + i, 300 + i) for i in (0, 2, 4, 6, 8, 11, 13)])
    _after_first_scan(monkeypatch, lambda: pq.write_table(rewritten, source_dir / "part-0.parquet"))

    with caplog.at_level(logging.WARNING, logger="delta_merge"):
        metrics = merge(spark, target, parquet(source_dir), materialize_source=mode)

    changed = [r.getMessage() for r in caplog.records if "changed between the scans" in r.getMessage()]
    assert metrics["numSourceRows"] == 5
    if mode == "auto":
        assert metrics["numSourceRowsInSecondScan"] == 5
        assert not changed
        assert rows(target) == [(i, 100 + i, 100 + i) if i % 2 == 0 else (i, -1, -1) for i in range(10)]
    else:
        # The merge of two different snapshots: the touched files come from the first, the rows written
        # from the second (inserts 11 and 13 were never seen by the first scan).
        assert metrics["numSourceRowsInSecondScan"] == 7
        assert changed == ["the source had 5 rows in the first scan but 7 in the second: it changed between "
                           "the scans (materialized: False)"]
        assert (11, 311, 311) in rows(target)


# -- (c) lost materialized blocks -----------------------------------------------------------------------
def test_storage_levels_escalate_to_replicated_disk_levels() -> None:
    def ladder(configured: str) -> list[str]:
        return [storage_level_for_attempt(configured, a) for a in range(1, MATERIALIZE_MAX_ATTEMPTS + 1)]

    assert MATERIALIZE_MAX_ATTEMPTS == 4  # Delta's merge.materializeSource.maxAttempts
    assert ladder("MEMORY_AND_DISK") == ["MEMORY_AND_DISK", "DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3"]
    assert ladder("DISK_ONLY") == ["DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3", "DISK_ONLY_3"]
    assert ladder("memory_only_2") == ["MEMORY_ONLY_2", "DISK_ONLY_2", "DISK_ONLY_3", "DISK_ONLY_3"]
    assert ladder("DISK_ONLY_3") == ["DISK_ONLY_3"] * 4


def _lose_blocks_after_first_scan(monkeypatch: pytest.MonkeyPatch, *, times: int) -> list[tuple[int, bool]]:
    """Unpersist the materialized source's blocks after the first scan of the first ``times`` attempts,
    which makes the second scan fail with Spark's CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND (as a lost executor
    does). Returns (replication, uses memory) of the materialized RDD per attempt."""
    real = classic_merge_module.find_touched_files  # type: ignore[attr-defined]
    levels: list[tuple[int, bool]] = []

    def scan_then_lose(source: Any, *args: Any, **kwargs: Any) -> Any:
        touched = real(source, *args, **kwargs)
        rdd = source._jdf.queryExecution().logical().rdd()
        level = rdd.getStorageLevel()
        levels.append((int(level.replication()), bool(level.useMemory())))
        if len(levels) <= times:
            rdd.unpersist(True)
        return touched

    monkeypatch.setattr(classic_merge_module, "find_touched_files", scan_then_lose)
    return levels
def test_lost_materialized_blocks_rerun_the_merge_with_a_more_durable_level(
    spark: Any, target: Path, source_dir: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    levels = _lose_blocks_after_first_scan(monkeypatch, times=2)

    with caplog.at_level(logging.INFO, logger="delta_merge"):
        metrics = merge(spark, target, parquet(source_dir), materialize_source="all")

    # MEMORY_AND_DISK, then DISK_ONLY, then DISK_ONLY_2 (one executor holds one replica locally).
    assert levels == [(1, True), (1, False), (2, False)]
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("MERGE retry")]
    assert len(retries) == 2
    assert retries[0].startswith("MERGE retry 2 of 4: Blocks of the materialized merge source (storage ")
    assert "storage level MEMORY_AND_DISK) were lost" in retries[0]
    assert retries[0].endswith("Running the merge again with storage level DISK_ONLY.")
    assert retries[1].endswith("Running the merge again with storage level DISK_ONLY_2.")
    committed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("MERGE committed")]
    assert committed == ["MERGE committed version 1"]
    assert table_version(target) == metrics["tableVersion"] == 1
    assert metrics["numSourceRows"] == metrics["numSourceRowsInSecondScan"] == 5
    assert metrics["numTargetRowsUpdated"] == 5
    assert rows(target) == [(i, 100 + i, 100 + i) if i % 2 == 0 else (i, -1, -1) for i in range(10)]
    assert Counter(r[0] for r in rows(target)).most_common(1)[0][1] == 1
def test_blocks_lost_on_every_attempt_fail_without_committing(
    spark: Any, target: Path, source_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    levels = _lose_blocks_after_first_scan(monkeypatch, times=MATERIALIZE_MAX_ATTEMPTS)
    before = rows(target)

    with pytest.raises(MergeExecutionError, match=r"lost blocks in each of 4 attempts") as raised:
        merge(spark, target, parquet(source_dir), materialize_source="all")

    assert "storage level DISK_ONLY_3" in str(raised.value)
    assert [replicas for replicas, _ in levels] == [1, 1, 2, 3]
    assert table_version(target) == 0
    assert rows(target) == before
def test_other_failures_are_not_retried(
    spark: Any, target: Path, source_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise MergeExecutionError("boom")

    monkeypatch.setattr(classic_merge_module, "find_touched_files", failing)
    with pytest.raises(MergeExecutionError, match=r"^boom$"):
        merge(spark, target, parquet(source_dir), materialize_source="all")
    assert calls == [1]


# -- (c) on a real standalone cluster: an executor dies after the source was materialized ---------------
@pytest.mark.timeout(300)
def test_executor_lost_on_a_standalone_cluster_reruns_the_merge(
    target: Path, tmp_path: Path, standalone_cluster: StandaloneCluster
) -> None:
    ids = tmp_path / "ids"
    ids.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(0, 10, 2), pa.int64())}), ids / "part-0.parquet")
    # Four partitions: the materialized blocks spread over both executors.
    query = f"SELECT /*+ REPARTITION(4) */ id, 100 + id AS v, 100 + id AS v2 FROM parquet.`{ids}`"
    spec = {"target": {"uri": str(target)}, "source": {"query": query}, "merge_sql": UPSERT}
    job: Submitted | None = None
    cluster = standalone_cluster
    try:
        job = Submitted(spec, tmp_path / "spec.json", master=cluster.master_url, confs={
            **cluster.application_confs(wait_for_executors=2),
            # Fail a task's job fast once its block is gone.
            "spark.task.maxFailures": "2", "spark.locality.wait": "0",
        })
        assert job.wait_for_line(progress_line("source prepared"), timeout=240) is not None, job.tail()
        executors = cluster.workers[0].executor_pids()
        assert len(executors) == 1, executors
        # Its block manager, and the source blocks it held, are gone (the worker starts a new executor).
        os.kill(executors[0], signal.SIGKILL)

        code = job.wait(timeout=240)
    finally:
        if job is not None and job.process.poll() is None:
            job.kill()

    assert code == 0, job.tail(80)
    progress = job.progress()
    retries = [line for line in progress if line.startswith("MERGE retry")]
    assert retries, progress
    assert retries[0].startswith("MERGE retry 2 of 4: Blocks of the materialized merge source")
    assert retries[0].endswith("Running the merge again with storage level DISK_ONLY.")
    assert [line for line in progress if line.startswith("MERGE committed")] == ["MERGE committed version 1"]
    metrics = job.metrics()
    assert metrics is not None
    assert metrics["tableVersion"] == table_version(target) == 1
    assert metrics["numSourceRows"] == metrics["numSourceRowsInSecondScan"] == 5
    assert rows(target) == [(i, 100 + i, 100 + i) if i % 2 == 0 else (i, -1, -1) for i in range(10)]
