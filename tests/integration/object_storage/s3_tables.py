"""Building blocks for tables in the test S3 server: create a table, write data files, plan a commit."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake

from spark_jobs.delta_merge.commit.actions import CommitPlan, plan_commit
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from tests.support.s3_server import S3Server

PARAMS = {"predicate": '["(t.id = s.id)"]', "matchedPredicates": "[]", "notMatchedPredicates": "[]"}
METRICS = {"numTargetRowsInserted": 1, "numTargetFilesAdded": 1}


def create_table(
    server: S3Server, uri: str, *, configuration: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A partitioned table at ``uri`` with rows (1, a) and (2, b); returns the storage options."""
    options = server.storage_options()
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "p": ["a", "b"]})
    write_deltalake(
        uri, data, partition_by=["p"], storage_options=options,
        configuration=dict(configuration) if configuration else None,
    )  # fmt: skip
    return options


def write_file(server: S3Server, uri: str, partition: str, ids: list[int]) -> WrittenFile:
    """A Parquet data file under the table root on S3, written with pyarrow's S3 file system."""
    path = f"p={partition}/part-{uuid.uuid4()}.parquet"
    data = pa.table({"id": pa.array(ids, pa.int64())})
    fs = server.arrow_fs()
    full = f"{uri.removeprefix('s3://')}/{path}"
    pq.write_table(data, full, filesystem=fs)
    stats = {"numRecords": len(ids), "minValues": {"id": min(ids)}, "maxValues": {"id": max(ids)},
             "nullCount": {"id": 0}}  # fmt: skip
    return WrittenFile(
        path=path, size=fs.get_file_info(full).size, partition_values={"p": partition},
        stats_json=json.dumps(stats), num_records=len(ids), modification_time=1_700_000_000_000,
    )  # fmt: skip


def plan(
    snapshot: TargetSnapshot,
    adds: list[WrittenFile],
    *,
    removes: list[LiveFile] | None = None,
    app_transaction: tuple[str, int] | None = None,
) -> CommitPlan:
    return plan_commit(
        snapshot, removes=removes or [], adds=adds, new_schema=None, operation_parameters=PARAMS,
        operation_metrics=METRICS, app_transaction=app_transaction, commit_metadata={},
    )  # fmt: skip


def log_names(server: S3Server, bucket: str, table: str) -> list[str]:
    """The object names under the table's ``_delta_log/``."""
    listed = server.client().list_objects_v2(Bucket=bucket, Prefix=f"{table}/_delta_log/")
    return sorted(item["Key"].rsplit("/", 1)[-1] for item in listed.get("Contents", []))


def upload_directory(client: Any, local: Path, bucket: str, prefix: str) -> None:
    """Copy a table written on local disk to ``s3://bucket/prefix`` object by object."""
    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        key = f"{prefix}/{file.relative_to(local).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=file.read_bytes())


__all__ = ["create_table", "log_names", "plan", "upload_directory", "write_file"]
