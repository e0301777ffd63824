"""find_merge_commit: the decision the operator, the sensor and the trigger share (deltalake only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_merge_provider.errors import TargetTableNotFoundError
from airflow_merge_provider.hooks.merge_commit import MergeCommit, find_merge_commit
from tests.support.delta_tables import UPSERT_METRICS, append_rows, commit_merge, create_table


@pytest.fixture
def table(tmp_path: Path) -> str:
    """v0 create, v1 merge app a@0, v2 plain append, v3 merge app a@1, v4 merge without txn."""
    uri = create_table(tmp_path / "t")
    commit_merge(uri, app_id="a", app_version=0)
    append_rows(uri, [100])
    commit_merge(uri, app_id="a", app_version=1, metrics={**UPSERT_METRICS, "numTargetRowsDeleted": 7})
    commit_merge(uri, app_id=None)
    return uri


def test_finds_the_commit_of_an_exact_app_version(table: str) -> None:
    commit = find_merge_commit(table, app_id="a", app_version=0)
    assert commit is not None
    assert (commit.version, commit.app_id, commit.app_version) == (1, "a", 0)
    metrics = commit.metrics()
    assert {name: metrics[name] for name in UPSERT_METRICS} == UPSERT_METRICS
    assert (metrics["readVersion"], metrics["tableVersion"], metrics["skipped"]) == (0, 1, False)


def test_an_app_version_not_committed_is_not_found(table: str) -> None:
    assert find_merge_commit(table, app_id="a", app_version=2) is None
    assert find_merge_commit(table, app_id="b", app_version=0) is None


def test_app_id_alone_finds_its_latest_version(table: str) -> None:
    commit = find_merge_commit(table, app_id="a")
    assert commit is not None
    assert (commit.version, commit.app_version, commit.metrics()["numTargetRowsDeleted"]) == (3, 1, 7)
    assert find_merge_commit(table, app_id="b") is None


def test_after_version_finds_the_oldest_merge_commit_above_it(table: str) -> None:
    found = {after: find_merge_commit(table, after_version=after) for after in range(5)}
    assert {after: c.version if c else None for after, c in found.items()} == {
        0: 1,
        1: 3,
        2: 3,
        3: 4,
        4: None,
    }
    assert found[1] is not None
    assert (found[1].app_id, found[1].app_version) == ("a", 1)
    assert found[3] is not None
    assert (found[3].app_id, found[3].app_version) == (None, None)


def test_app_id_with_after_version_needs_a_newer_commit(table: str) -> None:
    assert find_merge_commit(table, app_id="a", app_version=0, after_version=0) is not None
    assert find_merge_commit(table, app_id="a", app_version=0, after_version=1) is None


def test_a_missing_table_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(TargetTableNotFoundError, match="is not a Delta table"):
        find_merge_commit(str(tmp_path / "nothing"), app_id="a", app_version=0)
    with pytest.raises(TargetTableNotFoundError):
        find_merge_commit(str(tmp_path / "nothing"), after_version=0)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="app_id or after_version"):
        find_merge_commit("/t")
    with pytest.raises(ValueError, match="app_version needs an app_id"):
        find_merge_commit("/t", app_version=1, after_version=0)


def test_a_commit_survives_a_dict_round_trip(table: str) -> None:
    commit = find_merge_commit(table, app_id="a", app_version=1)
    assert commit is not None
    assert MergeCommit.from_dict(commit.to_dict()) == commit


def test_after_version_finds_another_writer_s_merge_as_it_finds_delta_s_own(tmp_path: Path) -> None:
    # Delta's own MERGE INTO (the delta engine's) records operation MERGE without the job's markers; so does
    # delta-rs's, written here. A plain append is still no merge.
    import pyarrow as pa
    from deltalake import DeltaTable

    uri = create_table(tmp_path / "t")
    append_rows(uri, [100])
    source = pa.table({"id": pa.array([1, 200], pa.int64()), "name": ["one", "two hundred"]})
    (DeltaTable(uri).merge(source=source, predicate="t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())  # fmt: skip

    found = find_merge_commit(uri, after_version=0)

    assert found is not None
    assert (found.version, found.app_id) == (2, None)
    assert find_merge_commit(uri, after_version=2) is None
