"""What merge tests on any object store share: small key-value tables, a merge through the job, and reading a
table back both with deltalake on the store and with DuckDB's delta-kernel reader from a downloaded copy."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from obstore.store import ObjectStore

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.storage.log_store import write_commit
from tests.support.delta_reader import read_rows, read_rows_with_kernel
from tests.support.scenario_harness import multiset

__all__ = ["KV", "UPSERT", "download", "kv", "merge", "race_for_commits", "table_rows"]

UPSERT = """MERGE INTO t USING s ON t.id = s.id
WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
KV = pa.schema([("id", pa.int64()), ("v", pa.string())])


def kv(rows: Sequence[tuple[Any, ...]], schema: pa.Schema = KV) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)


def merge(
    spark: Any, uri: str, options: Mapping[str, str], source: Mapping[str, Any], sql: str = UPSERT,
    run: Mapping[str, Any] | None = None, **merge_options: Any,
) -> dict[str, Any]:
    spec = {"target": {"uri": uri, "storage_options": dict(options)}, "source": dict(source),
            "merge_sql": sql, "options": merge_options, **({"run": run} if run else {})}  # fmt: skip
    metrics: dict[str, Any] = run_merge(spark, spec).to_dict()
    return metrics


def download(fs: pafs.FileSystem, base: str, local: Path) -> Path:
    """A copy of the objects under ``base`` (a path in ``fs``) on local disk, object by object."""
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
        if info.type == pafs.FileType.File:
            path = local / info.path.removeprefix(base).lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            with fs.open_input_stream(info.path) as stream:
                path.write_bytes(stream.read())
    return local


def table_rows(
    uri: str, options: Mapping[str, str], fs: pafs.FileSystem, base: str, tmp_path: Path,
    *, kernel_columns: Sequence[str] | None = None,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """Live rows through deltalake on the store, sorted; DuckDB's delta-kernel reader must read the same
    from a copy downloaded through ``fs`` (``kernel_columns``: the columns it is compared on)."""
    names = [f.name for f in DeltaTable(uri, storage_options=dict(options)).schema().fields]
    rows = [tuple(r) for r in read_rows(uri, columns=names, storage_options=dict(options))]
    copy = download(fs, base, tmp_path / f"copy-{len(list(tmp_path.iterdir()))}")
    compared = list(kernel_columns or names)
    kernel = read_rows_with_kernel(copy, columns=compared)
    assert multiset(kernel) == multiset([[r[names.index(n)] for n in compared] for r in rows])
    return sorted(rows, key=repr)


def race_for_commits(stores: Sequence[ObjectStore], version: int) -> list[int]:
    """Every store writes commit ``version`` at once (a barrier, one thread each); returns the indexes of
    the writers told they won. Put-if-absent must make that exactly one, whose actions are the file's."""
    start = threading.Barrier(len(stores))
    won: list[int] = []

    def race(index: int) -> None:
        start.wait()
        if write_commit(stores[index], version, [{"commitInfo": {"writer": index}}]):
            won.append(index)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return won
