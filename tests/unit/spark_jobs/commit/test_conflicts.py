"""Delta's conflict rules over winning commits (pure logic: the log actions are given as data)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from spark_jobs.delta_merge.commit.conflicts import AlreadyApplied, ReadSet, check_winning_commit
from spark_jobs.delta_merge.errors import ConcurrentModificationError
from spark_jobs.delta_merge.protocol.files import LiveFile

APPEND = "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT"
DELETE_READ = "DELTA_CONCURRENT_DELETE_READ.WITH_PARTITION_HINT"

READ = ReadSet(
    whole_table=False,
    read_paths={"p=1/a.parquet": {"p": "1"}, "p=1/b.parquet": {"p": "1"}},
    removed_paths={"p=1/a.parquet": {"p": "1"}},
    app_id="dag.task",
    app_version=3,
    token="our-token",
    table="s3://lake/orders",
    partitioned=True,
)
WRITE_SERIALIZABLE = ReadSet(**{**READ.__dict__, "serializable": False})


def _add(path: str, part: str, *, data_change: bool = True) -> dict[str, Any]:
    return {"add": {"path": path, "size": 10, "partitionValues": {"p": part}, "modificationTime": 0,
                    "dataChange": data_change}}


def _remove(path: str, *, data_change: bool = True) -> dict[str, Any]:
    return {"remove": {"path": path, "dataChange": data_change, "deletionTimestamp": 0}}


def _info(**values: Any) -> dict[str, Any]:
    return {"commitInfo": {"operation": "WRITE", **values}}


def _in_partition_1(files: Sequence[LiveFile]) -> list[LiveFile]:
    return [f for f in files if f.partition_values.get("p") == "1"]


def check(actions: list[dict[str, Any]], read: ReadSet = READ) -> AlreadyApplied | None:
    return check_winning_commit(7, actions, read, matches_read=_in_partition_1)


def conflict_rule(actions: list[dict[str, Any]], read: ReadSet = READ) -> str:
    """The error class of the conflict (Delta 4.4's, with its subclass)."""
    with pytest.raises(ConcurrentModificationError) as raised:
        check(actions, read)
    message = str(raised.value)
    assert "Conflicting commit: version 7, committed after this merge read the table" in message
    assert raised.value.error_class is not None
    return raised.value.error_class


def test_append_into_read_partition_by_non_blind_commit_conflicts() -> None:
    assert conflict_rule([_info(), _add("p=1/new.parquet", "1")]) == APPEND


def test_the_conflict_is_worded_as_delta_4_4_words_it() -> None:
    with pytest.raises(ConcurrentModificationError) as raised:
        check([_info(operation="UPDATE"), _add("p=1/new.parquet", "1")])
    assert str(raised.value).startswith(
        "[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] Transaction conflict detected. a concurrent UPDATE "
        "added data to table delta.`s3://lake/orders` committed at version 7. The concurrent operation "
        "modified data in the partition [p=1] that should have been read by this operation. Please retry the "
        "operation. "
        "Refer to https://docs.delta.io/latest/concurrency-control.html for more information.\n"
    )


def test_an_unpartitioned_table_s_conflict_names_no_partition() -> None:
    unpartitioned = ReadSet(**{**READ.__dict__, "partitioned": False})
    assert conflict_rule([_info(), _remove("p=1/b.parquet")], unpartitioned) == (
        "DELTA_CONCURRENT_DELETE_READ.WITHOUT_HINT")


def test_blind_append_into_read_partition_conflicts_at_delta_s_serializable_level() -> None:
    assert conflict_rule([_info(isBlindAppend=True), _add("p=1/n.parquet", "1")]) == (
        "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT")


def test_blind_append_into_read_partition_does_not_conflict_under_write_serializable() -> None:
    assert check([_info(isBlindAppend=True), _add("p=1/new.parquet", "1")], WRITE_SERIALIZABLE) is None


def test_append_into_disjoint_partition_does_not_conflict() -> None:
    assert check([_info(), _add("p=2/new.parquet", "2")]) is None


def test_any_append_conflicts_with_a_whole_table_read() -> None:
    whole = ReadSet(**{**READ.__dict__, "whole_table": True})
    assert conflict_rule([_info(), _add("p=2/new.parquet", "2")], whole) == (
        "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT")


def test_remove_of_a_read_file_conflicts() -> None:
    assert conflict_rule([_info(), _remove("p=1/b.parquet")]) == DELETE_READ


def test_remove_of_a_file_this_merge_read_and_removes_is_a_delete_read_conflict() -> None:
    # Delta's ConflictChecker checks removed files against read files first; a merge reads what it removes.
    assert conflict_rule([_info(), _remove("p=1/a.parquet")]) == DELETE_READ


def test_remove_of_a_file_removed_unread_is_a_delete_delete_conflict() -> None:
    unread = ReadSet(**{**READ.__dict__, "read_paths": {"p=1/b.parquet": {"p": "1"}}})
    assert conflict_rule([_info(), _remove("p=1/a.parquet")], unread) == (
        "DELTA_CONCURRENT_DELETE_DELETE.WITH_PARTITION_HINT")


def test_added_files_are_checked_before_removed_ones() -> None:
    rewrite = [_info(), _remove("p=1/b.parquet"), _add("p=1/rewritten.parquet", "1")]
    assert conflict_rule(rewrite) == APPEND


def test_compaction_where_the_merge_read_is_an_append_conflict_as_delta_4_4_finds() -> None:
    # Delta 4.4 counts every add of a commit that is not a blind append, dataChange or not: a compaction's
    # compacted file lands where the merge read before its removes are looked at.
    compaction = [_info(operation="OPTIMIZE"), _remove("p=1/b.parquet", data_change=False),
                  _add("p=1/compacted.parquet", "1", data_change=False)]
    assert conflict_rule(compaction) == APPEND


def test_compaction_elsewhere_does_not_conflict() -> None:
    compaction = [_info(operation="OPTIMIZE"), _remove("p=2/x.parquet", data_change=False),
                  _add("p=2/compacted.parquet", "2", data_change=False)]
    assert check(compaction) is None


def test_schema_change_conflicts() -> None:
    assert conflict_rule([_info(), {"metaData": {"id": "x"}}]) == "DELTA_METADATA_CHANGED"


def test_protocol_change_conflicts() -> None:
    assert conflict_rule([_info(), {"protocol": {"minReaderVersion": 3}}]) == "DELTA_PROTOCOL_CHANGED"


def test_own_schema_evolution_commit_is_not_a_conflict() -> None:
    assert check([_info(mergeCommitToken="our-token"), {"metaData": {"id": "x"}}]) is None


def test_same_app_id_with_an_older_version_conflicts() -> None:
    txn = {"txn": {"appId": "dag.task", "version": 2}}
    assert conflict_rule([_info(), txn]) == "DELTA_CONCURRENT_TRANSACTION"


@pytest.mark.parametrize("version", [3, 4])
def test_same_app_id_at_or_after_our_version_means_already_applied(version: int) -> None:
    txn = {"txn": {"appId": "dag.task", "version": version}}
    applied = check([_info(readVersion=5), txn])
    assert applied == AlreadyApplied(7, {"operation": "WRITE", "readVersion": 5})


def test_other_app_ids_do_not_matter() -> None:
    assert check([_info(), {"txn": {"appId": "other", "version": 9}}]) is None
