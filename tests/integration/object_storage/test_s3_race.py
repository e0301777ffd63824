"""Two whole merges racing on one Delta table on S3 (moto, signing and IAM on): two real spark-submits of the
job, started together, each committing with put-if-absent on the same ``_delta_log``.

A gate makes the race real rather than likely: whichever job logs its snapshot first is stopped (SIGSTOP on
its process group) until the other has read the table too, so both always read the same version. Then:

* when the merges rewrite the same data file, exactly what Delta allows may happen: one commits and the
  other fails with Delta's conflict error class naming the winner's version, or (if the job re-ran the
  loser on the new version) both commit in sequence;
* when they read and rewrite disjoint partitions, both commit, the later one on top of the earlier.

Whatever happened, the table must hold exactly the committed merges applied in commit order (whole row
multisets, read back with deltalake on S3 and DuckDB's kernel reader), the log must have no gap, and each
commit's readVersion, version and file counts must agree with the job's metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge.protocol.delta_log import read_commit_actions
from tests.integration.object_storage.s3_tables import log_names
from tests.integration.object_storage.table_io import table_rows
from tests.support.s3_server import S3Server
from tests.support.submit_harness import PROGRESS_PREFIX, Submitted, kill_all

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.string())])
# (partition, ids) of the table's four data files, one append each: versions 0 to 3.
FILES = (("a", range(1, 6)), ("a", range(6, 11)), ("b", range(11, 16)), ("b", range(16, 21)))
INITIAL_VERSION = len(FILES) - 1
# Delta's conflict classes a merge that lost to another merge fails with: the winner added files where
# the loser read (checked first, as Delta's ConflictChecker does), or removed files the loser read.
CONFLICT_CLASSES = (
    "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT", "DELTA_CONCURRENT_DELETE_READ.WITH_PARTITION_HINT"
)
SNAPSHOT_LINE = re.compile(r"MERGE into \S+ at version (\d+) ")
COMMIT_FILE = re.compile(r"^(\d{20})\.json$")

Row = tuple[int, str, str]


def upsert_in(partition: str) -> str:
    """An upsert whose ON condition confines what it reads to one partition (Delta's read predicate)."""
    return (f"MERGE INTO t USING s ON t.id = s.id AND t.p = '{partition}' "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")  # fmt: skip


@dataclass(frozen=True)
class Merge:
    name: str
    partition: str  # the partition its ON condition reads
    source: tuple[Row, ...]

    def apply(self, rows: Sequence[Row]) -> tuple[list[Row], int, int]:
        """The merge applied to ``rows`` as Delta defines it: (new rows, rows updated, rows inserted)."""
        by_key = {row[0]: row for row in self.source}
        matched = {row[0] for row in rows if row[0] in by_key and row[1] == self.partition}
        updated = [by_key[row[0]] if row[0] in matched else row for row in rows]
        inserted = [row for key, row in by_key.items() if key not in matched]
        return updated + inserted, len(matched), len(inserted)


@dataclass(frozen=True)
class Outcome:
    merge: Merge
    code: int
    metrics: dict[str, Any] | None
    output: str
    failure: str | None


def initial_rows() -> list[Row]:
    return [(i, part, f"v{i}") for part, ids in FILES for i in ids]


def rows_table(rows: Sequence[Row]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, row, strict=True)) for row in rows], schema=SCHEMA)


@pytest.fixture
def table(s3_server: S3Server, bucket: str) -> str:
    """Four data files in two partitions, versions 0-3."""
    uri = f"s3://{bucket}/orders"
    for _, ids in FILES:
        rows = [row for row in initial_rows() if row[0] in ids]
        write_deltalake(uri, rows_table(rows), mode="append", partition_by=["p"],
                        storage_options=s3_server.storage_options())  # fmt: skip
    return uri


def submit(s3_server: S3Server, bucket: str, uri: str, merge: Merge, tmp_path: Path) -> Submitted:
    options = s3_server.storage_options()
    source_uri = f"s3://{bucket}/incoming/{merge.name}"
    pq.write_table(rows_table(merge.source), f"{source_uri.removeprefix('s3://')}/part-0.parquet",
                   filesystem=s3_server.arrow_fs())  # fmt: skip
    spec = {
        "target": {"uri": uri, "storage_options": options},
        "source": {"uri": source_uri, "format": "parquet", "storage_options": options},
        "merge_sql": upsert_in(merge.partition),
    }
    return Submitted(spec, tmp_path / f"spec-{merge.name}.json", master="local[1]",
                     confs={"spark.driver.memory": "512m"})  # fmt: skip


def snapshot_version(job: Submitted) -> int | None:
    """The version the job's merge read, once it has logged it."""
    for line in list(job.lines):
        if PROGRESS_PREFIX in line and (found := SNAPSHOT_LINE.search(line)):
            return int(found.group(1))
    return None


def hold_until_both_read(jobs: Sequence[Submitted], *, timeout: float = 300) -> list[int]:
    """Stop the first job to read its snapshot until the other has read one too; the versions read.

    Two JVMs starting on two cores can be seconds apart; without the gate the first merge could commit
    before the second reads, and the test would race nothing."""
    held: list[Submitted] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            versions = [snapshot_version(job) for job in jobs]
            if all(v is not None for v in versions):
                return [v for v in versions if v is not None]
            for job, version in zip(jobs, versions, strict=True):
                if version is None and job.process.poll() is not None:
                    raise AssertionError(f"a job ended before reading the table:\n{job.tail()}")
                if version is not None and job not in held:
                    os.killpg(job.process.pid, signal.SIGSTOP)
                    held.append(job)
            if time.monotonic() > deadline:
                raise TimeoutError("the jobs did not both read the table in time")
            time.sleep(0.05)
    finally:
        for job in held:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.process.pid, signal.SIGCONT)


def race(
    s3_server: S3Server, bucket: str, uri: str, merges: Sequence[Merge], tmp_path: Path
) -> list[Outcome]:
    jobs = [submit(s3_server, bucket, uri, merge, tmp_path) for merge in merges]
    try:
        read = hold_until_both_read(jobs)
        assert read == [INITIAL_VERSION, INITIAL_VERSION]
        codes = [job.wait(timeout=300) for job in jobs]
    finally:
        kill_all(jobs)
    return [Outcome(merge, code, job.metrics(), "\n".join(job.lines), job.failure())
            for merge, job, code in zip(merges, jobs, codes, strict=True)]  # fmt: skip


def check_race(
    s3_server: S3Server, bucket: str, uri: str, outcomes: Sequence[Outcome], tmp_path: Path
) -> list[Outcome]:
    """Assert that the outcomes are allowed and the table is their result; the committed, in commit order."""
    options = s3_server.storage_options()
    committed = sorted(
        (o for o in outcomes if o.code == 0), key=lambda o: o.metrics["tableVersion"] if o.metrics else -1
    )
    committed_versions = []
    for outcome in committed:
        assert outcome.metrics is not None, outcome.output[-4000:]
        assert (outcome.metrics["skipped"], outcome.metrics["dryRun"]) == (False, False)
        committed_versions.append(outcome.metrics["tableVersion"])
    assert committed, [o.output[-3000:] for o in outcomes]
    # Committed merges took the next versions, one each, in some order.
    assert committed_versions == list(range(INITIAL_VERSION + 1, INITIAL_VERSION + 1 + len(committed)))
    for outcome in outcomes:
        if outcome.code == 0:
            continue
        # A loser: the job's conflict error, naming a version a winner committed; nothing of it landed.
        assert outcome.code == 1, outcome.output[-4000:]
        assert outcome.metrics is None
        assert outcome.failure is not None, outcome.output[-4000:]
        error_class = re.match(r"MERGE failed: ConcurrentModificationError: \[([\w.]+)\] ", outcome.failure)
        assert error_class is not None, outcome.failure
        assert error_class.group(1) in CONFLICT_CLASSES, outcome.failure
        conflicting = re.search(r"Conflicting commit: version (\d+),", outcome.output)
        assert conflicting is not None, outcome.output[-4000:]
        assert int(conflicting.group(1)) in committed_versions
        assert "Nothing was committed" in outcome.output

    # The log: versions 0..latest, no gap and nothing beyond the committed merges.
    names = log_names(s3_server, bucket, "orders")
    versions = sorted(int(m.group(1)) for name in names if (m := COMMIT_FILE.match(name)))
    latest = INITIAL_VERSION + len(committed)
    assert versions == list(range(latest + 1)), names

    # Each merge's commit agrees with its metrics; the rows are the merges applied in commit order.
    expected = initial_rows()
    for outcome in committed:
        assert outcome.metrics is not None
        version = outcome.metrics["tableVersion"]
        actions = read_commit_actions(uri, version, storage_options=options)
        assert actions is not None
        (info,) = [a["commitInfo"] for a in actions if "commitInfo" in a]
        assert info["operation"] == "MERGE"
        assert info["readVersion"] == outcome.metrics["readVersion"]
        # Read no earlier than the table as created and committed on top of whatever landed since.
        assert INITIAL_VERSION <= info["readVersion"] < version
        removed = [a["remove"] for a in actions if "remove" in a]
        added = [a["add"] for a in actions if "add" in a]
        assert len(removed) == outcome.metrics["numTargetFilesRemoved"]
        assert len(added) == outcome.metrics["numTargetFilesAdded"]
        before = len(expected)
        expected, updated, inserted = outcome.merge.apply(expected)
        counts = ("numSourceRows", "numTargetRowsUpdated", "numTargetRowsInserted", "numTargetRowsDeleted")
        assert {n: outcome.metrics[n] for n in counts} == dict(
            zip(counts, (len(outcome.merge.source), updated, inserted, 0), strict=True))  # fmt: skip
        # The added files hold the rewritten files' copied rows, the updated rows and the inserted ones.
        assert sum(_records(a["stats"]) for a in added) == (
            outcome.metrics["numTargetRowsCopied"] + updated + inserted)  # fmt: skip
        assert len(expected) == before + inserted
    rows = table_rows(uri, options, s3_server.arrow_fs(), f"{bucket}/orders", tmp_path)
    assert Counter(rows) == Counter(expected)
    return committed


def _records(stats: str) -> int:
    return int(json.loads(stats)["numRecords"])


def test_two_merges_rewriting_the_same_file_commit_once_or_in_sequence(
    s3_server: S3Server, bucket: str, table: str, tmp_path: Path
) -> None:
    # Both update ids of the file holding 1..5 (id 1 in both) and insert a new row into partition a.
    first = Merge("first", "a", ((1, "a", "first-1"), (7, "a", "first-7"), (30, "a", "first-30")))
    second = Merge("second", "a", ((1, "a", "second-1"), (3, "a", "second-3"), (31, "a", "second-31")))

    outcomes = race(s3_server, bucket, table, [first, second], tmp_path)

    committed = check_race(s3_server, bucket, table, outcomes, tmp_path)
    if len(committed) == 2:
        # Only by running the loser again on the winner's version: it cannot commit on what it read.
        assert committed[1].metrics is not None
        assert committed[1].metrics["readVersion"] == INITIAL_VERSION + 1, committed[1].output[-3000:]
    print("same file:", [(o.merge.name, o.code, o.failure) for o in outcomes])


def test_two_merges_in_disjoint_partitions_both_commit_one_on_top_of_the_other(
    s3_server: S3Server, bucket: str, table: str, tmp_path: Path
) -> None:
    in_a = Merge("in-a", "a", ((2, "a", "in-a-2"), (32, "a", "in-a-32")))
    in_b = Merge("in-b", "b", ((12, "b", "in-b-12"), (17, "b", "in-b-17"), (33, "b", "in-b-33")))

    outcomes = race(s3_server, bucket, table, [in_a, in_b], tmp_path)

    committed = check_race(s3_server, bucket, table, outcomes, tmp_path)
    assert len(committed) == 2, [o.output[-3000:] for o in outcomes]
    earlier, later = committed
    assert earlier.metrics is not None
    assert later.metrics is not None
    # Both read the table as created; the later one committed on top of the earlier without conflict.
    assert (earlier.metrics["readVersion"], earlier.metrics["tableVersion"]) == (
        INITIAL_VERSION,
        INITIAL_VERSION + 1,
    )
    assert (later.metrics["readVersion"], later.metrics["tableVersion"]) == (
        INITIAL_VERSION,
        INITIAL_VERSION + 2,
    )
    assert f"versions {INITIAL_VERSION + 1}..{INITIAL_VERSION + 1} committed meanwhile; none conflicts" in (
        later.output)  # fmt: skip
