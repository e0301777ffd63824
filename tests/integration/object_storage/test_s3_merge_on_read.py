"""Merge-on-read on S3 (moto): the merge marks rows in deletion vectors written through the S3 store, one
vector in a ``deletion_vector_*.bin`` object and one inline, and readers on S3 and off a downloaded copy
read the rows it means. On both session kinds (``merge_spark``): the executors write the vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deltalake import write_deltalake

from spark_jobs.delta_merge.protocol.deletion_vectors import DeletionVector, deleted_rows
from spark_jobs.delta_merge.storage.log_store import log_store
from tests.integration.object_storage.table_io import kv, merge
from tests.integration.object_storage.test_s3_merge import commit, parquet_source, table_rows
from tests.support.s3_server import S3Server


def test_merge_on_read_upsert_writes_its_vectors_through_the_s3_store(
    merge_spark: Any, s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    uri = f"s3://{bucket}/mor"
    options = s3_server.storage_options()
    for first in (0, 100):  # two files: ids 0-99 and 100-199
        write_deltalake(
            uri,
            kv([(i, f"v{i}") for i in range(first, first + 100)]),
            mode="append",
            storage_options=options,
            configuration={"delta.enableDeletionVectors": "true"},
        )
    # 20 scattered rows of the first file: a vector too big to go inline; one row of the second: inline.
    updated = [*range(0, 100, 5), 150]
    source = parquet_source(s3_server, f"s3://{bucket}/src", kv([(i, "new") for i in updated] + [(500, "n")]))

    metrics = merge(merge_spark, uri, options, source)

    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (21, 1)
    assert (metrics["numTargetRowsCopied"], metrics["numTargetDeletionVectorsAdded"]) == (0, 2)
    readds = {
        json.loads(a["add"]["stats"])["minValues"]["id"]: a["add"]["deletionVector"]
        for a in commit(s3_server, bucket, "mor", 2)
        if "add" in a and "deletionVector" in a["add"]
    }
    assert {first: vector["storageType"] for first, vector in readds.items()} == {0: "u", 100: "i"}
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="mor/")["Contents"]
    assert len([o for o in listed if o["Key"].rsplit("/", 1)[-1].startswith("deletion_vector_")]) == 1
    store = log_store(uri, options)
    marked = {first: deleted_rows(store, uri, DeletionVector.from_action(vector), storage_options=options)
              for first, vector in readds.items()}  # fmt: skip
    assert marked == {0: list(range(0, 100, 5)), 100: [50]}
    expected = {i: f"v{i}" for i in range(200)} | dict.fromkeys(updated, "new") | {500: "n"}
    assert table_rows(s3_server, uri, tmp_path) == sorted(expected.items(), key=repr)
