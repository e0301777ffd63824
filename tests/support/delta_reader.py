"""Read Delta tables back through two readers independent of the merge job: deltalake (delta-rs) and
DuckDB's Delta extension (delta-kernel-rs), as every Delta reader must be able to read what the job writes."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa


def read_table(
    path: str | Path, *, where: str | None = None, storage_options: Mapping[str, str] | None = None
) -> pa.Table:
    """All live rows of the latest version (deltalake's query engine, not its pyarrow-dataset path,
    which can abort the process at exit)."""
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(str(path), storage_options=dict(storage_options) if storage_options else None)
    sql = "SELECT * FROM t" + (f" WHERE {where}" if where else "")
    return pa.table(QueryBuilder().register("t", table).execute(sql).read_all())


def read_rows(
    path: str | Path, *, columns: list[str] | None = None, storage_options: Mapping[str, str] | None = None
) -> list[list[Any]]:
    """Rows as lists in the table's column order (or ``columns``)."""
    table = read_table(path, storage_options=storage_options)
    names = columns or table.column_names
    data = table.select(names).to_pylist()
    return [[row[n] for n in names] for row in data]


def read_table_columns(path: str | Path) -> list[str]:
    """The table's column names, in its schema's order (deltalake)."""
    from deltalake import DeltaTable

    return [field.name for field in DeltaTable(str(path)).schema().fields]


def table_version(path: str | Path) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(path)).version())


def read_rows_with_kernel(path: str | Path, *, columns: list[str] | None = None) -> list[list[Any]]:
    """Rows as :func:`read_rows` gives them, through DuckDB's Delta extension (a delta-kernel reader)."""
    with _kernel_reader().cursor() as cursor:  # a cursor each: the database and its extension are shared
        table = cursor.sql(f"SELECT * FROM delta_scan('{Path(path).resolve()}')").to_arrow_table()
    names = columns or table.column_names
    data = table.select(names).to_pylist()
    return [[row[n] for n in names] for row in data]


@functools.cache
def _kernel_reader() -> Any:
    """One in-memory DuckDB with the Delta extension loaded, for the whole test session: loading it takes
    a third of a second, a scan then takes milliseconds (each scan reads the table's latest snapshot)."""
    import duckdb
    import duckdb_extension_delta

    # The wheel ships the extension: load it by path, since `LOAD delta` would try to download it.
    extension = next(Path(duckdb_extension_delta.__file__).parent.glob("extensions/*/delta.duckdb_extension"))
    connection = duckdb.connect()
    connection.execute(f"LOAD '{extension}'")
    return connection
