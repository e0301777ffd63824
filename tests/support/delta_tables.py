"""Delta tables for the provider's tests, written with deltalake only (no Spark)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

MERGE_ENGINE = "airflow-merge-provider"

# What the job records for a small upsert (operationMetrics are strings, as Delta stores them).
UPSERT_METRICS = {
    "numSourceRows": 3, "numTargetRowsInserted": 1, "numTargetRowsUpdated": 2, "numTargetRowsDeleted": 0,
    "numTargetRowsCopied": 8, "numTargetFilesAdded": 1, "numTargetFilesRemoved": 1, "numOutputRows": 11,
    "executionTimeMs": 1500, "scanTimeMs": 400, "rewriteTimeMs": 700,
}  # fmt: skip


def create_table(path: Path, rows: int = 10) -> str:
    """A one-file Delta table ``id bigint, name string`` at version 0."""
    from deltalake import write_deltalake

    ids = list(range(rows))
    write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]}))
    return str(path)


def commit_merge(
    uri: str,
    *,
    app_id: str | None,
    app_version: int | None = 0,
    metrics: Mapping[str, int] = UPSERT_METRICS,
    extra_info: Mapping[str, Any] | None = None,
) -> int:
    """Commit a version shaped like the job's merge commit (commitInfo + txn, no data change); return it."""
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties, Transaction

    table = DeltaTable(uri)
    info = {
        "operationMetrics": {key: str(value) for key, value in metrics.items()},
        "readVersion": table.version(),
        "mergeEngine": MERGE_ENGINE,
        "mergeOperation": "MERGE",
        **(extra_info or {}),
    }
    txns = [Transaction(app_id, app_version)] if app_id is not None and app_version is not None else None
    table.create_write_transaction(
        [], mode="append", schema=table.schema(),
        commit_properties=CommitProperties(custom_metadata=info, app_transactions=txns),
    )  # fmt: skip
    return int(DeltaTable(uri).version())


def append_rows(uri: str, ids: list[int]) -> int:
    """A plain (non-merge) append; return its version."""
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(
        uri, pa.table({"id": pa.array(ids, pa.int64()), "name": [f"a{i}" for i in ids]}), mode="append"
    )
    return int(DeltaTable(uri).version())
