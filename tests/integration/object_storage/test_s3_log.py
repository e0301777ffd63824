"""The Delta log and the commit on S3: snapshots, log readers, put-if-absent commits, the serializable
commit loop, checkpoints and the provider's commit lookup, against a real S3 API (moto) with signing on."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql.types import LongType, StructField, StructType

from airflow_merge_provider.hooks.merge_commit import find_merge_commit
from spark_jobs.delta_merge.commit.actions import attempt_commit
from spark_jobs.delta_merge.commit.conflicts import ReadSet
from spark_jobs.delta_merge.commit.serializable import commit_serializably
from spark_jobs.delta_merge.errors import ConcurrentModificationError, MergeExecutionError, TableStorageError
from spark_jobs.delta_merge.protocol.deletion_vectors import deleted_rows, write_deletion_vectors
from spark_jobs.delta_merge.protocol.delta_log import (
    app_transaction_version,
    find_app_transaction_commit,
    first_merge_commit_after,
    latest_version,
    read_commit_actions,
    table_version,
)
from spark_jobs.delta_merge.protocol.identity_columns import (
    ALLOW_EXPLICIT_INSERT,
    HIGH_WATER_MARK,
    START,
    STEP,
    with_moved_high_water_marks,
)
from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
from spark_jobs.delta_merge.storage.log_store import log_store, write_commit
from tests.integration.object_storage.s3_tables import (
    create_table,
    log_names,
    plan,
    upload_directory,
    write_file,
)
from tests.integration.object_storage.table_io import race_for_commits
from tests.support.deletion_vector_fixture import add_deletion_vectors
from tests.support.delta_reader import read_rows
from tests.support.s3_server import S3Server


def test_log_readers_on_s3(s3_server: S3Server, bucket: str) -> None:
    uri = f"s3://{bucket}/events"
    options = create_table(s3_server, uri)
    write_deltalake(
        uri, pa.table({"id": pa.array([3], pa.int64()), "p": ["c"]}), mode="append", storage_options=options,
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id="loader", version=7)]),
    )  # fmt: skip

    snapshot = load_snapshot(uri, storage_options=options)
    assert snapshot.table_uri == uri
    assert snapshot.version == 1
    assert sorted(f.partition_values["p"] for f in snapshot.files) == ["a", "b", "c"]
    assert all(f.stats is not None and f.stats.num_records == 1 for f in snapshot.files)
    actions = read_commit_actions(uri, 1, storage_options=options)
    assert actions is not None
    assert {
        k: v for a in actions if "txn" in a for k, v in a["txn"].items() if k != "lastUpdated"
    } == {"appId": "loader", "version": 7}
    assert read_commit_actions(uri, 2, storage_options=options) is None
    assert latest_version(uri, known=0, storage_options=options) == 1
    assert table_version(uri, storage_options=options) == 1
    assert app_transaction_version(uri, "loader", storage_options=options) == 7
    assert app_transaction_version(uri, "other", storage_options=options) is None
    found = find_app_transaction_commit(uri, "loader", 7, storage_options=options)
    assert found is not None
    assert found[0] == 1
    assert found[1]["operation"] == "WRITE"
    assert find_app_transaction_commit(uri, "loader", 8, storage_options=options) is None
    assert first_merge_commit_after(uri, -1, storage_options=options) is None


def test_a_commit_lands_on_s3_and_every_reader_sees_it(s3_server: S3Server, bucket: str) -> None:
    uri = f"s3://{bucket}/orders"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    removed = next(f for f in snapshot.files if f.partition_values["p"] == "a")
    added = write_file(s3_server, uri, "a", [10, 11])

    version = attempt_commit(
        plan(snapshot, [added], removes=[removed], app_transaction=("orders-dag", 3)),
        base_version=snapshot.version, storage_options=options,
    )  # fmt: skip

    assert version == 1
    assert log_names(s3_server, bucket, "orders") == [f"{v:020d}.json" for v in (0, 1)]
    assert sorted(read_rows(uri, columns=["id", "p"], storage_options=options)) == [
        [2, "b"], [10, "a"], [11, "a"],
    ]  # fmt: skip
    merge = first_merge_commit_after(uri, 0, storage_options=options)
    assert merge is not None
    assert (merge[0], merge[2], merge[3]) == (1, "orders-dag", 3)
    assert merge[1]["operation"] == "MERGE"
    assert merge[1]["readVersion"] == 0
    by_app = find_merge_commit(uri, app_id="orders-dag", storage_options=options)
    assert by_app is not None
    assert (by_app.version, by_app.app_version) == (1, 3)
    by_version = find_merge_commit(uri, after_version=0, storage_options=options)
    assert by_version is not None
    assert by_version.version == 1
    assert find_merge_commit(uri, after_version=1, storage_options=options) is None
    assert load_snapshot(uri, storage_options=options).version == 1


def test_put_if_absent_is_conditional_on_the_server(s3_server: S3Server, bucket: str) -> None:
    # Without a conditional PUT the second write would replace the first and both writers would "win".
    store = log_store(f"s3://{bucket}/raw", s3_server.storage_options())
    assert write_commit(store, 0, [{"commitInfo": {"writer": "first"}}]) is True
    assert write_commit(store, 0, [{"commitInfo": {"writer": "second"}}]) is False
    body = s3_server.client().get_object(Bucket=bucket, Key=f"raw/_delta_log/{0:020d}.json")["Body"].read()
    assert b'"first"' in body
    assert b'"second"' not in body

    # Eight writers race for each of the next versions, each through its own store (own connections).
    stores = [log_store(f"s3://{bucket}/raw", s3_server.storage_options()) for _ in range(8)]
    for version in range(1, 6):
        won = race_for_commits(stores, version)
        assert len(won) == 1
        key = f"raw/_delta_log/{version:020d}.json"
        body = s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        assert f'"writer":{won[0]}'.encode() in body


def test_two_commits_on_one_base_version_exactly_one_lands(s3_server: S3Server, bucket: str) -> None:
    uri = f"s3://{bucket}/race"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    plans = [plan(snapshot, [write_file(s3_server, uri, p, [n])]) for p, n in (("a", 5), ("b", 6))]
    start = threading.Barrier(len(plans))
    landed: list[int] = []
    refused: list[ConcurrentModificationError] = []

    def commit(index: int) -> None:
        start.wait()
        try:
            landed.append(attempt_commit(plans[index], base_version=0, storage_options=options))
        except ConcurrentModificationError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(plans))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert landed == [1]
    assert len(refused) == 1
    assert "version 1 exists now" in str(refused[0])
    assert log_names(s3_server, bucket, "race") == [f"{v:020d}.json" for v in (0, 1)]
    assert len(read_rows(uri, storage_options=options)) == 3


def test_commit_serializably_lands_on_top_of_a_concurrent_append(s3_server: S3Server, bucket: str) -> None:
    uri = f"s3://{bucket}/busy"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    removed = next(f for f in snapshot.files if f.partition_values["p"] == "a")
    merge = plan(snapshot, [write_file(s3_server, uri, "a", [100])], removes=[removed])
    # Another writer appends to a partition the merge did not read, after the merge read version 0.
    write_deltalake(uri, pa.table({"id": pa.array([7], pa.int64()), "p": ["z"]}), mode="append",
                    storage_options=options)  # fmt: skip
    read = ReadSet(
        whole_table=False, read_paths=frozenset({removed.path}), removed_paths=frozenset({removed.path}),
        app_id=None, app_version=None, token=merge.token, serializable=False,
    )  # fmt: skip

    outcome = commit_serializably(
        merge, read, matches_read=lambda files: any(f.partition_values.get("p") == "a" for f in files),
        storage_options=options, sleep=lambda _: None,
    )  # fmt: skip

    assert (outcome.version, outcome.already_applied) == (2, False)
    actions = read_commit_actions(uri, 2, storage_options=options)
    assert actions is not None
    assert next(a["commitInfo"] for a in actions if "commitInfo" in a)["readVersion"] == 0
    assert sorted(read_rows(uri, columns=["id", "p"], storage_options=options)) == [
        [2, "b"], [7, "z"], [100, "a"],
    ]  # fmt: skip


def test_a_checkpoint_is_written_at_the_interval(s3_server: S3Server, bucket: str) -> None:
    uri = f"s3://{bucket}/checkpointed"
    options = create_table(s3_server, uri, configuration={"delta.checkpointInterval": "2"})
    write_deltalake(uri, pa.table({"id": pa.array([3], pa.int64()), "p": ["c"]}), mode="append",
                    storage_options=options)  # fmt: skip
    snapshot = load_snapshot(uri, storage_options=options)

    version = attempt_commit(
        plan(snapshot, [write_file(s3_server, uri, "d", [4])]), base_version=1, storage_options=options
    )

    assert version == 2
    assert f"{2:020d}.checkpoint.parquet" in log_names(s3_server, bucket, "checkpointed")
    assert "_last_checkpoint" in log_names(s3_server, bucket, "checkpointed")
    reloaded = load_snapshot(uri, storage_options=options)
    assert reloaded.version == 2
    assert len(reloaded.files) == 4
    assert sorted(r[0] for r in read_rows(uri, columns=["id"], storage_options=options)) == [1, 2, 3, 4]
    assert DeltaTable(uri, storage_options=options).version() == 2


def test_deletion_vectors_of_a_table_on_s3(s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    local = tmp_path / "dv"
    write_deltalake(local, pa.table({"id": pa.array(range(6), pa.int64()), "p": ["a"] * 3 + ["b"] * 3}),
                    partition_by=["p"])  # fmt: skip
    paths = {f.partition_values["p"]: f.path for f in load_snapshot(str(local)).files}
    add_deletion_vectors(local, {paths["a"]: ([0, 2], "u"), paths["b"]: ([1], "i")})
    upload_directory(s3_server.client(), local, bucket, "dv")
    uri = f"s3://{bucket}/dv"
    options = s3_server.storage_options()

    snapshot = load_snapshot(uri, storage_options=options)

    assert snapshot.version == 1
    assert "deletionVectors" in snapshot.protocol.reader_features
    vectors = {f.partition_values["p"]: f.deletion_vector for f in snapshot.files}
    assert vectors["a"] is not None
    assert vectors["a"].storage_type == "u"
    assert vectors["b"] is not None
    assert vectors["b"].storage_type == "i"
    store = log_store(snapshot.table_uri, options)
    assert deleted_rows(store, snapshot.table_uri, vectors["a"]) == [0, 2]
    assert deleted_rows(store, snapshot.table_uri, vectors["b"]) == [1]


def test_deletion_vectors_written_to_s3(s3_server: S3Server, bucket: str) -> None:
    uri = f"s3://{bucket}/dv-write"
    options = s3_server.storage_options()
    vectors = {"a": list(range(0, 4000, 3)), "b": [7], "c": [*range(0, 60, 2), 1 << 33]}
    descriptors = write_deletion_vectors(uri, options, vectors, prefix="q1")
    assert [d.storage_type for d in descriptors.values()] == ["u", "i", "u"]
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="dv-write/")["Contents"]
    assert [o["Key"].rsplit("/", 1)[0] for o in listed] == ["dv-write/q1"]  # one file, under the prefix
    store = log_store(uri, options)
    for key, rows in vectors.items():
        assert deleted_rows(store, uri, descriptors[key], storage_options=options) == rows


@pytest.mark.parametrize("scheme_options", [{"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, {"timeout": "30s"}])
def test_deltalake_only_and_client_options_reach_the_right_place(
    s3_server: S3Server, bucket: str, scheme_options: dict[str, str]
) -> None:
    # deltalake's own keys are not object_store's, and obstore takes HTTP client keys apart.
    uri = f"s3://{bucket}/options"
    create_table(s3_server, uri)
    options = s3_server.storage_options(**scheme_options)
    assert latest_version(uri, known=0, storage_options=options) == 0
    assert load_snapshot(uri, storage_options=options).version == 0


def test_identity_marks_are_read_from_new_files_on_s3(s3_server: S3Server, bucket: str) -> None:
    # Statistics that leave the identity column out make the commit read the column from the new files.
    uri = f"s3://{bucket}/identity"
    written = dataclasses.replace(write_file(s3_server, uri, "a", [4, 12, 7]), stats_json='{"numRecords": 3}')
    identity = {START: 1, STEP: 1, HIGH_WATER_MARK: 3, ALLOW_EXPLICIT_INSERT: True}
    schema = StructType([StructField("id", LongType(), False, identity)])

    moved = with_moved_high_water_marks(
        schema, ["id"], [written], table_uri=uri, storage_options=s3_server.storage_options()
    )

    assert moved["id"].metadata[HIGH_WATER_MARK] == 12
    bad = s3_server.storage_options(AWS_SECRET_ACCESS_KEY="wrong-secret-for-identity")
    expected = f"Reading identity column id from the merge's new files of table {uri} failed"
    with pytest.raises(TableStorageError, match=expected):
        with_moved_high_water_marks(schema, ["id"], [written], table_uri=uri, storage_options=bad)


def test_commit_validity_reads_the_new_files_on_s3(s3_server: S3Server, bucket: str) -> None:
    uri = f"s3://{bucket}/validated"
    options = create_table(s3_server, uri)
    snapshot = load_snapshot(uri, storage_options=options)
    good = write_file(s3_server, uri, "a", [5])
    missing = dataclasses.replace(good, path="p=a/never-written.parquet")
    resized = dataclasses.replace(write_file(s3_server, uri, "b", [6]), size=good.size + 1)

    with pytest.raises(MergeExecutionError) as refused:
        plan(snapshot, [good, missing, resized])

    message = str(refused.value)
    assert f"no file at {bucket}/validated/p=a/never-written.parquet" in message
    assert f"with size {good.size + 1}, but the file has" in message
    assert repr(good.path) not in message
    assert plan(snapshot, [good]).adds == (good,)
