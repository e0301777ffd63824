"""Delta's OptimisticTransactionSuite matrix for this job: real commits land between the merge's read and
its commit, and the merge must conflict (applying nothing) or commit on top, exactly as Delta decides.

The in-process tests make the concurrent commit with deltalake from inside the commit step (a wrapper
around ``commit.commit_serializably``), after the merge has read the table and written its files. The
subprocess tests race real spark-submits against each other and against a deltalake writer process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, TableFeatures, Transaction, write_deltalake
from deltalake.schema import Field, PrimitiveType

from spark_jobs.delta_merge import commit as commit_stage
from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import ConcurrentModificationError
from spark_jobs.delta_merge.protocol.delta_log import read_commit_info
from tests.delta_reader import read_rows, table_version
from tests.spark_jobs.submit_harness import PYTHON, Submitted, kill_all, submit_env

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.int64())])
PARTITIONED_MERGE = """MERGE INTO t USING s ON t.id = s.id AND t.p = 'a'
WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"""
# No target-only predicate: the merge reads the whole table.
WHOLE_TABLE_MERGE = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"""
# NOT MATCHED BY SOURCE reads every file, whatever the ON condition says.
NMBS_MERGE = f"{PARTITIONED_MERGE}\nWHEN NOT MATCHED BY SOURCE AND t.id = 9 THEN UPDATE SET v = -9"
APP_ID = "concurrency.merge"
APPEND_CONFLICT_ON_VERSION_1 = (
    r"^\[DELTA_CONCURRENT_APPEND\] ConcurrentAppendException: Files were added to .*\n"
    r"Conflicting commit: version 1,"
)
APP_VERSION = 5

Row = tuple[Any, ...]


def batch(rows: list[Row]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows], schema=SCHEMA)


def rows_of(path: Path) -> list[Row]:
    return sorted(tuple(r) for r in read_rows(path, columns=SCHEMA.names))


def assert_unique_keys(rows: list[Row]) -> None:
    duplicated = [key for key, n in Counter(r[0] for r in rows).items() if n > 1]
    assert not duplicated, f"duplicate keys {duplicated}"


def applied(rows: list[Row]) -> list[Row]:
    """The partitioned merge applied to ``rows``: ids 1 and 2 of partition a updated, id 20 inserted."""
    out = [(i, p, 100 if p == "a" and i in (1, 2) else v) for i, p, v in rows]
    if not any(i == 20 and p == "a" for i, p, _ in rows):
        out.append((20, "a", 100))
    return sorted(out)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """Partition a: files [1..5] and [6..10]; partition b: files [11..13] and [14, 15]. Versions 0-3."""
    path = tmp_path / "t"
    for ids, part in ((range(1, 6), "a"), (range(6, 11), "a"), (range(11, 14), "b"), (range(14, 16), "b")):
        write_deltalake(str(path), batch([(i, part, 0) for i in ids]), mode="append", partition_by=["p"])
    return path


@pytest.fixture
def source(tmp_path: Path) -> dict[str, Any]:
    directory = tmp_path / "s"
    directory.mkdir()
    pq.write_table(batch([(1, "a", 100), (2, "a", 100), (20, "a", 100)]), directory / "part-0.parquet")
    return {"uri": str(directory), "format": "parquet"}


def spec(target: Path, source: dict[str, Any], sql: str, *, app_version: int | None = None) -> dict[str, Any]:
    run = {} if app_version is None else {"app_id": APP_ID, "app_version": app_version}
    return {"target": {"uri": str(target)}, "source": source, "merge_sql": sql, "run": run}


# -- concurrent writers (deltalake), each one commit --------------------------------------------------
def append(part: str, key: int, **props: Any) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        write_deltalake(str(path), batch([(key, part, 0)]), mode="append", partition_by=["p"],
                        commit_properties=CommitProperties(**props) if props else None)
    return write


def delete(predicate: str) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        DeltaTable(str(path)).delete(predicate)
    return run


def compact(part: str) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        result = DeltaTable(str(path)).optimize.compact(partition_filters=[("p", "=", part)])
        assert result["numFilesRemoved"] == 2, result
    return run


def add_column(path: Path) -> None:
    DeltaTable(str(path)).alter.add_columns([Field("extra", PrimitiveType("string"), nullable=True)])


def upgrade_protocol(path: Path) -> None:
    DeltaTable(str(path)).alter.add_feature(TableFeatures.TimestampWithoutTimezone,
                                            allow_protocol_versions_increase=True)


def app_transaction(version: int) -> Callable[[Path], None]:
    """Another run of the same app id commits (its own append) with ``version``."""
    return append("b", 99, app_transactions=[Transaction(APP_ID, version)])


@dataclass
class Race:
    """What the concurrent writer did: the version it committed and the table right after it."""

    version: int = -1
    rows: list[Row] | None = None


def race_before_commit(monkeypatch: pytest.MonkeyPatch, winner: Callable[[Path], None], path: Path) -> Race:
    """Make ``winner`` commit after the merge read the table and wrote its files, right before it commits."""
    real = commit_stage.commit_serializably  # type: ignore[attr-defined]
    race = Race()

    def racing(*args: Any, **kwargs: Any) -> Any:
        if race.version < 0:
            winner(path)
            race.version, race.rows = table_version(path), rows_of(path)
        return real(*args, **kwargs)

    monkeypatch.setattr(commit_stage, "commit_serializably", racing)
    return race


CONFLICTS = [
    # (case id, merge statement, concurrent commit, Delta's exception)
    ("append-into-read-partition", PARTITIONED_MERGE, append("a", 100), "ConcurrentAppendException"),
    ("whole-table-read-append-elsewhere", WHOLE_TABLE_MERGE, append("b", 101), "ConcurrentAppendException"),
    ("nmbs-read-append-elsewhere", NMBS_MERGE, append("b", 101), "ConcurrentAppendException"),
    # Delta's ConflictChecker looks at added files before removed ones, and at removed files the merge read
    # before those it removes too (a merge reads every file it removes).
    ("delete-of-a-read-file", PARTITIONED_MERGE, delete("id >= 6 AND id <= 10"),
     "ConcurrentDeleteReadException"),
    ("delete-of-a-removed-file", PARTITIONED_MERGE, delete("id <= 5"), "ConcurrentDeleteReadException"),
    ("rewrite-of-a-read-file", PARTITIONED_MERGE, delete("id = 7"), "ConcurrentAppendException"),
    # Compaction removes both read files (dataChange=false), one of which the merge removes too.
    ("compaction-of-read-files", PARTITIONED_MERGE, compact("a"), "ConcurrentDelete"),
    ("schema-change", PARTITIONED_MERGE, add_column, "MetadataChangedException"),
    ("protocol-change", PARTITIONED_MERGE, upgrade_protocol, "ProtocolChangedException"),
    ("same-app-id-older-version", PARTITIONED_MERGE, app_transaction(APP_VERSION - 1),
     "ConcurrentTransactionException"),
]


@pytest.mark.spark
@pytest.mark.parametrize(("sql", "winner", "rule"), [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS])
def test_conflicting_commit_fails_the_merge_and_only_the_winner_applies(
    spark: Any, target: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
    sql: str, winner: Callable[[Path], None], rule: str,
) -> None:
    race = race_before_commit(monkeypatch, winner, target)

    with pytest.raises(ConcurrentModificationError) as raised:
        run_merge(spark, spec(target, source, sql, app_version=APP_VERSION))

    message = str(raised.value)
    assert raised.value.bare_message.startswith(rule), message
    assert f"version {race.version}, committed after this merge read the table" in message
    assert "Nothing was committed" in message
    assert table_version(target) == race.version
    assert rows_of(target) == race.rows  # the winner's result only: the merge applied nothing
    assert_unique_keys(rows_of(target))


NO_CONFLICTS = [
    ("append-into-disjoint-partition", append("b", 101)),
    ("blind-append-into-read-partition", append("a", 100, custom_metadata={"isBlindAppend": True})),
    ("compaction-of-an-unread-partition", compact("b")),
]


@pytest.mark.spark
@pytest.mark.parametrize("winner", [c[1] for c in NO_CONFLICTS], ids=[c[0] for c in NO_CONFLICTS])
def test_commit_outside_what_the_merge_read_lets_it_commit_on_top(
    spark: Any, target: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
    winner: Callable[[Path], None],
) -> None:
    race = race_before_commit(monkeypatch, winner, target)

    metrics = run_merge(spark, spec(target, source, PARTITIONED_MERGE)).to_dict()

    assert race.rows is not None
    assert metrics["readVersion"] == 3
    assert metrics["tableVersion"] == table_version(target) == race.version + 1
    assert rows_of(target) == applied(race.rows)
    assert_unique_keys(rows_of(target))


@pytest.mark.spark
def test_many_commits_outside_the_read_are_checked_with_one_predicate_evaluation(
    spark: Any, target: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def three_appends(path: Path) -> None:
        for key in (101, 102, 103):
            append("b", key)(path)

    race = race_before_commit(monkeypatch, three_appends, target)
    real_prune = commit_stage.prune_files  # type: ignore[attr-defined]
    evaluated: list[int] = []

    def counting_prune(*args: Any, **kwargs: Any) -> Any:
        evaluated.append(len(args[2]))
        return real_prune(*args, **kwargs)

    monkeypatch.setattr(commit_stage, "prune_files", counting_prune)
    metrics = run_merge(spark, spec(target, source, PARTITIONED_MERGE)).to_dict()

    assert race.rows is not None
    assert evaluated == [3]  # the files of versions 4-6 at once, not one Spark job per commit
    assert metrics["tableVersion"] == race.version + 1 == 7
    assert rows_of(target) == applied(race.rows)


@pytest.mark.spark
def test_blind_append_conflicts_under_serializable_isolation(
    spark: Any, tmp_path: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "serializable"
    write_deltalake(str(path), batch([(i, "a", 0) for i in range(1, 6)]), partition_by=["p"],
                    configuration={"delta.isolationLevel": "Serializable"})
    race = race_before_commit(monkeypatch, append("a", 100, custom_metadata={"isBlindAppend": True}), path)

    with pytest.raises(ConcurrentModificationError, match=APPEND_CONFLICT_ON_VERSION_1):
        run_merge(spark, spec(path, source, PARTITIONED_MERGE))
    assert rows_of(path) == race.rows


@pytest.mark.spark
def test_unpartitioned_table_conflicts_with_any_append(
    spark: Any, tmp_path: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "flat"
    write_deltalake(str(path), batch([(i, "a", 0) for i in range(1, 6)]))

    def append_unrelated_key(table: Path) -> None:
        write_deltalake(str(table), batch([(500, "z", 0)]), mode="append")

    race = race_before_commit(monkeypatch, append_unrelated_key, path)
    with pytest.raises(ConcurrentModificationError, match=APPEND_CONFLICT_ON_VERSION_1):
        run_merge(spark, spec(path, source, WHOLE_TABLE_MERGE))
    assert rows_of(path) == race.rows
    assert_unique_keys(rows_of(path))


@pytest.mark.spark
@pytest.mark.parametrize("winner_version", [APP_VERSION, APP_VERSION + 1], ids=["equal", "newer"])
def test_same_app_id_committed_meanwhile_means_skipped(
    spark: Any, target: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch, winner_version: int
) -> None:
    race = race_before_commit(monkeypatch, app_transaction(winner_version), target)

    metrics = run_merge(spark, spec(target, source, PARTITIONED_MERGE, app_version=APP_VERSION)).to_dict()

    assert metrics["skipped"] is True
    assert metrics["tableVersion"] == race.version == table_version(target)
    assert rows_of(target) == race.rows  # not applied on top of the other run
    assert DeltaTable(str(target)).transaction_version(APP_ID) == winner_version


# -- idempotency --------------------------------------------------------------------------------------
@pytest.mark.spark
def test_rerun_of_the_same_app_transaction_is_skipped_with_the_first_commits_metrics(
    spark: Any, target: Path, source: dict[str, Any]
) -> None:
    merge_spec = spec(target, source, PARTITIONED_MERGE, app_version=APP_VERSION)
    first = run_merge(spark, merge_spec).to_dict()
    rows = rows_of(target)

    second = run_merge(spark, merge_spec).to_dict()

    assert first["skipped"] is False
    assert second["skipped"] is True
    assert table_version(target) == first["tableVersion"] == second["tableVersion"] == 4
    assert rows_of(target) == rows == applied(rows_of_version(target, 3))
    # Every metric is the first commit's; only what the rerun itself cost differs: it ran no Spark job.
    assert (second["numSparkJobs"], second["stageTimesMs"]) == (0, {})
    differing = {k for k in first if first[k] != second[k]}
    cost = {"numSparkJobs", "stageTimesMs"}
    assert differing == {"skipped", *cost}, {k: (first[k], second[k]) for k in differing}


def rows_of_version(path: Path, version: int) -> list[Row]:
    from deltalake import QueryBuilder

    table = DeltaTable(str(path), version=version)
    result = pa.table(QueryBuilder().register("t", table).execute("SELECT id, p, v FROM t").read_all())
    return sorted(tuple(r.values()) for r in result.to_pylist())


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


@pytest.mark.spark
@pytest.mark.integration
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


@pytest.mark.spark
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_overlapping_merges_and_a_writer_keep_counters_exact(tmp_path: Path) -> None:
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
        # commit on top of everything (so at least one merge always commits).
        calm.touch()
        submit(2)
        codes.append(jobs[2].wait(timeout=200))
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
    assert codes[2] == 0, jobs[2].tail()
    final = counters(path)  # asserts unique keys
    assert {final[(i, "orig")] for i in keys} == {committed}
    expected_others = {(999, "new")} | {(int(k), str(p)) for k, p in written["appended"]}
    assert set(final) == {(i, "orig") for i in keys} | expected_others
    assert all(final[k] == 0 for k in expected_others)
    merges = [v for v in range(table_version(path) + 1)
              if read_commit_info(str(path), v).get("mergeOperation") == "MERGE"]
    assert len(merges) == committed
    print(f"stress: {committed} of {len(jobs)} merges committed, conflicts {conflicts}; writer: "
          f"{len(written['appended'])} appends, "
          f"{written['compactions']} compactions, {len(written['failures'])} failed commits", file=sys.stderr)
