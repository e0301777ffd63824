"""Delta's OptimisticTransactionSuite matrix for this job: real commits land between the merge's read and
its commit, and the merge must conflict (applying nothing) or commit on top, exactly as Delta decides.

The concurrent commit is made with deltalake from inside the commit step (a wrapper around
``commit.commit_serializably``), after the merge has read the table and written its files. Real
spark-submits racing each other and a writer process: tests/integration/spark_jobs/test_concurrent_submits.py.
"""

from __future__ import annotations

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
from tests.support.delta_reader import read_rows, table_version

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
    r"^\[DELTA_CONCURRENT_APPEND\.WITH(OUT)?_\w*HINT\] Transaction conflict detected\. a concurrent \w+ "
    r"added data to table .* committed at version 1\. .*\nConflicting commit: version 1,"
)
APPEND = "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT"
DELETE_READ = "DELTA_CONCURRENT_DELETE_READ.WITH_PARTITION_HINT"
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
    # (case id, merge statement, concurrent commit, Delta 4.4's error class)
    ("append-into-read-partition", PARTITIONED_MERGE, append("a", 100), APPEND),
    ("whole-table-read-append-elsewhere", WHOLE_TABLE_MERGE, append("b", 101), APPEND),
    ("nmbs-read-append-elsewhere", NMBS_MERGE, append("b", 101), APPEND),
    # Delta's ConflictChecker looks at added files before removed ones, and at removed files the merge read
    # before those it removes too (a merge reads every file it removes).
    ("delete-of-a-read-file", PARTITIONED_MERGE, delete("id >= 6 AND id <= 10"), DELETE_READ),
    ("delete-of-a-removed-file", PARTITIONED_MERGE, delete("id <= 5"), DELETE_READ),
    ("rewrite-of-a-read-file", PARTITIONED_MERGE, delete("id = 7"), APPEND),
    # Compaction adds its compacted file where the merge read: Delta 4.4 counts it (dataChange=false).
    ("compaction-of-read-files", PARTITIONED_MERGE, compact("a"), APPEND),
    # At Delta's Serializable level (the default), a blind append where the merge read conflicts too.
    ("blind-append-into-read-partition", PARTITIONED_MERGE,
     append("a", 100, custom_metadata={"isBlindAppend": True}), APPEND),
    ("schema-change", PARTITIONED_MERGE, add_column, "DELTA_METADATA_CHANGED"),
    ("protocol-change", PARTITIONED_MERGE, upgrade_protocol, "DELTA_PROTOCOL_CHANGED"),
    ("same-app-id-older-version", PARTITIONED_MERGE, app_transaction(APP_VERSION - 1),
     "DELTA_CONCURRENT_TRANSACTION"),
]
@pytest.mark.parametrize(("sql", "winner", "rule"), [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS])
def test_conflicting_commit_fails_the_merge_and_only_the_winner_applies(
    spark: Any, target: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
    sql: str, winner: Callable[[Path], None], rule: str,
) -> None:
    race = race_before_commit(monkeypatch, winner, target)

    with pytest.raises(ConcurrentModificationError) as raised:
        run_merge(spark, spec(target, source, sql, app_version=APP_VERSION))

    message = str(raised.value)
    assert raised.value.error_class == rule, message
    assert f"version {race.version}, committed after this merge read the table" in message
    assert "Nothing was committed" in message
    assert table_version(target) == race.version
    assert rows_of(target) == race.rows  # the winner's result only: the merge applied nothing
    assert_unique_keys(rows_of(target))


NO_CONFLICTS = [
    ("append-into-disjoint-partition", append("b", 101)),
    ("compaction-of-an-unread-partition", compact("b")),
]
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
def test_blind_append_does_not_conflict_on_a_write_serializable_table(
    spark: Any, tmp_path: Path, source: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "write-serializable"
    write_deltalake(str(path), batch([(i, "a", 0) for i in range(1, 6)]), partition_by=["p"],
                    configuration={"delta.isolationLevel": "WriteSerializable"})
    race = race_before_commit(monkeypatch, append("a", 100, custom_metadata={"isBlindAppend": True}), path)

    metrics = run_merge(spark, spec(path, source, PARTITIONED_MERGE)).to_dict()

    assert race.rows is not None
    assert metrics["tableVersion"] == race.version + 1 == 2
    assert (100, "a", 0) in rows_of(path)
    assert_unique_keys(rows_of(path))


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
    # Every metric is the first commit's; only what the rerun itself cost differs: it ran no stage.
    assert second["stageTimesMs"] == []
    differing = {k for k in first if first[k] != second[k]}
    cost = {"stageTimesMs"}
    assert differing == {"skipped", *cost}, {k: (first[k], second[k]) for k in differing}


def rows_of_version(path: Path, version: int) -> list[Row]:
    from deltalake import QueryBuilder

    table = DeltaTable(str(path), version=version)
    result = pa.table(QueryBuilder().register("t", table).execute("SELECT id, p, v FROM t").read_all())
    return sorted(tuple(r.values()) for r in result.to_pylist())
