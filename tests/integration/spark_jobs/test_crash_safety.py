"""SIGKILL the merge job at each stage: the table stays at one consistent version, a re-run with the same
app id applies the merge exactly once, and files of the killed attempt are never referenced by the log."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.merge.copy_by_position import COPY_BY_POSITION_CONF
from tests.support.delta_reader import read_rows, table_version
from tests.support.submit_harness import Submitted, progress_line

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("tag", pa.string())])
TARGET_ROWS = 12_000
UPDATED = range(0, TARGET_ROWS, 10)
INSERTED = range(TARGET_ROWS, TARGET_ROWS + 500)
SQL = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED THEN UPDATE SET v = s.v, tag = s.tag WHEN NOT MATCHED THEN INSERT *"""
APP_ID, APP_VERSION = "crash-safety.merge", 7


def table(ids: range | list[int], v: int, tag: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([v] * len(ids), pa.int64()),
                     "tag": pa.array([tag] * len(ids))}, schema=SCHEMA)


def multiset(path: Path) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in read_rows(path, columns=SCHEMA.names))


def before_rows() -> Counter[tuple[Any, ...]]:
    return Counter((i, 0, "old") for i in range(TARGET_ROWS))


def after_rows() -> Counter[tuple[Any, ...]]:
    rows = before_rows()
    for i in UPDATED:
        rows[(i, 0, "old")] -= 1
        rows[(i, 1, "new")] += 1
    for i in INSERTED:
        rows[(i, 1, "new")] += 1
    return +rows


def data_files(root: Path) -> set[str]:
    """Parquet files on disk, as decoded paths relative to the table root."""
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def referenced_files(root: Path) -> tuple[set[str], set[str]]:
    """(every path any retained commit adds, the live paths), decoded, from the commit JSON files."""
    import json

    ever: set[str] = set()
    live: set[str] = set()
    for commit in sorted((root / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                ever.add(unquote(action["add"]["path"]))
                live.add(unquote(action["add"]["path"]))
            elif "remove" in action:
                live.discard(unquote(action["remove"]["path"]))
    return ever, live


@pytest.fixture
def tables(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    target = tmp_path / "target"
    for part in range(3):  # three files, each touched by the merge
        chunk = range(part * TARGET_ROWS // 3, (part + 1) * TARGET_ROWS // 3)
        write_deltalake(str(target), table(chunk, 0, "old"), mode="append")
    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(table(UPDATED, 1, "new"), source / "part-0.parquet")
    pq.write_table(table(INSERTED, 1, "new"), source / "part-1.parquet")
    spec = {
        "target": {"uri": str(target)}, "source": {"uri": str(source), "format": "parquet"},
        "merge_sql": SQL, "run": {"app_id": APP_ID, "app_version": APP_VERSION},
        # Small files: the rewrite writes many, so a kill can land between two of them.
        "options": {"target_file_size": 4096},
    }
    return target, spec


def _kill_when_written(job: Submitted, root: Path, existing: set[str]) -> None:
    """After the rewrite starts, kill as soon as its first new file is on disk (mid-write)."""
    deadline = time.monotonic() + 120
    while not data_files(root) - existing:
        assert job.process.poll() is None, job.tail()
        assert time.monotonic() < deadline, job.tail()
        time.sleep(0.01)
    job.kill()


@pytest.mark.parametrize(
    ("kill_on", "committed"),
    [
        # Before anything is written (a later kill before the rewrite leaves the same nothing behind).
        ("source prepared", False),
        ("MERGE operation - Rewriting", False),
        # Copy-on-write copying by position: the changed rows are written, the copies under way.
        ("MERGE operation - copying unchanged rows", False),
        ("committing:", None),  # the kill races the commit: either outcome must be consistent
        ("MERGE committed version", True),
    ],
)
def test_killed_merge_leaves_one_consistent_version_and_reruns_exactly_once(
    spark: Any, tables: tuple[Path, dict[str, Any]], tmp_path: Path, kill_on: str, committed: bool | None,
) -> None:
    target, spec = tables
    version_before = table_version(target)
    files_before = data_files(target)

    # Small Arrow batches: the writer rolls files per batch, so the first file lands early in the write.
    confs = {"spark.sql.execution.arrow.maxRecordsPerBatch": "500"}
    if kill_on.startswith("MERGE operation - copying"):
        confs[COPY_BY_POSITION_CONF] = "0"
    job = Submitted(spec, tmp_path / "spec.json", confs=confs)
    try:
        line = job.wait_for_line(progress_line(kill_on), timeout=240)
        assert line is not None, job.tail()
        if kill_on.startswith("MERGE operation - Rewriting"):
            _kill_when_written(job, target, files_before)
        else:
            job.kill()
    finally:
        if job.process.poll() is None:
            job.kill()
    printed = job.metrics()
    if committed is not False:
        # From "committing" on, the commit and the metrics line after it can land before the kill (on a busy
        # machine the line "committing:" reaches the test only then): printed or not, they are the commit's.
        assert printed is None or printed["tableVersion"] == version_before + 1, printed
    else:
        assert printed is None  # killed before printing its result

    # One consistent version: deltalake loads it and its rows are exactly the before or the after state.
    version = DeltaTable(str(target)).version()
    rows = multiset(target)
    if version == version_before:
        assert rows == before_rows()
    else:
        assert version == version_before + 1
        assert rows == after_rows()
    if committed is not None:
        assert (version > version_before) is committed, job.progress()
    ever, live = referenced_files(target)
    orphans = data_files(target) - ever
    assert live <= data_files(target)
    if kill_on.startswith(("MERGE operation - Rewriting", "MERGE operation - copying")):
        assert orphans, "killed mid-write: some files of the killed attempt are on disk"

    # The re-run with the same app id applies the merge exactly once.
    metrics = run_merge(spark, spec).to_dict()

    assert metrics["skipped"] is (version > version_before)
    assert table_version(target) == version_before + 1
    assert multiset(target) == after_rows()
    assert DeltaTable(str(target)).transaction_version(APP_ID) == APP_VERSION
    ever, live = referenced_files(target)
    assert not orphans & ever, "files of the killed attempt must never enter the log"
    assert live <= data_files(target)
    assert metrics["tableVersion"] == version_before + 1
    assert metrics["numTargetRowsUpdated"] == len(UPDATED)
    assert metrics["numTargetRowsInserted"] == len(INSERTED)

    if orphans:
        # What README's "Failures and cleanup" says: VACUUM removes them (and leaves the table intact).
        removed = DeltaTable(str(target)).vacuum(
            retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)
        assert {unquote(p) for p in removed} >= orphans
        assert not data_files(target) & orphans
        assert multiset(target) == after_rows()
