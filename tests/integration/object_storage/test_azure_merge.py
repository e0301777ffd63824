"""Whole merges into Delta tables in Azure Blob Storage (Azurite, checking shared-key signatures), with
Parquet sources there, through the shared local Spark session, which has no Hadoop Azure connector: the job
reads and writes table files with pyarrow's AzureFileSystem and commits through obstore. Rows are read back
with deltalake from Azurite and with DuckDB's delta-kernel reader from a downloaded copy, which must agree."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge.errors import MergeAnalysisError, StorageAuthenticationError, TableStorageError
from spark_jobs.delta_merge.storage.log_store import log_store, read_commit
from tests.integration.object_storage.table_io import kv, merge, table_rows
from tests.integration.object_storage.test_azure_storage import WRONG_KEY
from tests.support.azurite_server import ACCOUNT, AzuriteServer


def parquet_source(azurite: AzuriteServer, container: str, path: str, table: pa.Table) -> dict[str, Any]:
    """A Parquet source directory: one file, and a ``_SUCCESS`` marker Spark's reader skips."""
    fs = azurite.arrow_fs()
    pq.write_table(table, f"{container}/{path}/part-0.parquet", filesystem=fs)
    with fs.open_output_stream(f"{container}/{path}/_SUCCESS") as out:
        out.write(b"")
    options = azurite.storage_options()
    return {"uri": f"az://{container}/{path}", "format": "parquet", "storage_options": options}


def rows(
    azurite: AzuriteServer, uri: str, container: str, table: str, tmp_path: Path
) -> list[tuple[Any, ...]]:
    """The table's rows as deltalake and DuckDB's delta-kernel reader agree on them (see ``table_rows``)."""
    return table_rows(uri, azurite.storage_options(), azurite.arrow_fs(), f"{container}/{table}", tmp_path)


def test_upsert_from_a_parquet_source_in_azure(
    spark: Any, azurite: AzuriteServer, container: str, tmp_path: Path
) -> None:
    # The target in the Hadoop driver's form (container@account), the source in object_store's short one.
    uri = f"abfss://{container}@{ACCOUNT}.dfs.core.windows.net/orders"
    options = azurite.storage_options()
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options)
    write_deltalake(uri, kv([(3, "c")]), mode="append", storage_options=options)
    source = parquet_source(azurite, container, "incoming", kv([(2, "B"), (4, "d")]))

    metrics = merge(spark, uri, options, source)

    assert rows(azurite, uri, container, "orders", tmp_path) == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]
    assert (metrics["numSourceRows"], metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"],
            metrics["numTargetRowsCopied"]) == (2, 1, 1, 1)  # fmt: skip
    actions = read_commit(log_store(uri, options), 2) or []
    (info,) = [a["commitInfo"] for a in actions if "commitInfo" in a]
    assert info["operation"] == "MERGE"
    commit_text = json.dumps(actions)
    assert azurite.account_key not in commit_text  # nor any other storage option value that is a secret
    assert "account_key" not in commit_text
    added = [a["add"] for a in actions if "add" in a]
    assert sum(json.loads(a["stats"])["numRecords"] for a in added) == 3
    fs = azurite.arrow_fs()
    for add in added:  # every added file is in the container with the size the log gives
        assert fs.get_file_info(f"{container}/orders/{add['path']}").size == add["size"]


def test_idempotent_rerun_with_an_app_id_is_skipped(
    spark: Any, azurite: AzuriteServer, container: str, tmp_path: Path
) -> None:
    uri = f"az://{container}/once"
    options = azurite.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    source = parquet_source(azurite, container, "src", kv([(1, "A"), (2, "b")]))
    run = {"app_id": "nightly-load", "app_version": 7}

    first = merge(spark, uri, options, source, run=run)
    second = merge(spark, uri, options, source, run=run)

    assert (first["skipped"], second["skipped"]) == (False, True)
    assert DeltaTable(uri, storage_options=options).version() == 1
    assert rows(azurite, uri, container, "once", tmp_path) == [(1, "A"), (2, "b")]


@pytest.mark.parametrize(
    ("side", "operation"),
    [("target", "Reading the Delta log of table"), ("source", "Listing the source's Parquet files of table")],
)
def test_a_wrong_account_key_fails_cleanly_and_leaves_the_table(
    spark: Any, azurite: AzuriteServer, container: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    side: str, operation: str,
) -> None:  # fmt: skip
    uri = f"az://{container}/guarded"
    options = azurite.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    source = parquet_source(azurite, container, "src", kv([(1, "A")]))
    wrong = azurite.storage_options(azure_storage_account_key=WRONG_KEY)
    target_options, source_options = (wrong, options) if side == "target" else (options, wrong)
    caplog.set_level(logging.DEBUG)

    with pytest.raises(TableStorageError) as raised:
        merge(spark, uri, target_options, {**source, "storage_options": source_options})

    message = str(raised.value)
    assert f"{operation} {uri if side == 'target' else source['uri']} failed" in message
    assert type(raised.value) is StorageAuthenticationError
    assert "its account key, SAS token or service principal" in message
    for secret in (WRONG_KEY, azurite.account_key):
        assert secret not in f"{raised.value!r} {message}"
        assert secret not in caplog.text
    assert DeltaTable(uri, storage_options=options).version() == 0
    assert rows(azurite, uri, container, "guarded", tmp_path) == [(1, "a")]


def test_a_delta_source_in_azure(spark: Any, azurite: AzuriteServer, container: str, tmp_path: Path) -> None:
    uri = f"az://{container}/target"
    options = azurite.storage_options()
    write_deltalake(uri, kv([(1, "a"), (2, "b")]), storage_options=options)
    source_uri = f"abfs://{container}@{ACCOUNT}.dfs.core.windows.net/changes"
    write_deltalake(source_uri, kv([(2, "old")]), storage_options=options)
    write_deltalake(source_uri, kv([(2, "B"), (3, "c")]), mode="overwrite", storage_options=options)

    metrics = merge(spark, uri, options, {"uri": source_uri, "format": "delta", "version": 1,
                                          "storage_options": options})  # fmt: skip

    assert rows(azurite, uri, container, "target", tmp_path) == [(1, "a"), (2, "B"), (3, "c")]
    assert metrics["numSourceRows"] == 2


def test_a_csv_source_in_azure_is_refused_naming_what_to_give(
    spark: Any, azurite: AzuriteServer, container: str
) -> None:
    uri = f"az://{container}/t"
    options = azurite.storage_options()
    write_deltalake(uri, kv([(1, "a")]), storage_options=options)
    with azurite.arrow_fs().open_output_stream(f"{container}/src/data.csv") as out:
        out.write(b"id,v\n1,A\n")
    source = {"uri": f"az://{container}/src", "format": "csv", "options": {"header": "true"},
              "storage_options": options}  # fmt: skip

    with pytest.raises(MergeAnalysisError, match="give the source as Parquet or Delta") as raised:
        merge(spark, uri, options, source)

    assert "hadoop-azure" in str(raised.value)
    assert DeltaTable(uri, storage_options=options).version() == 0
