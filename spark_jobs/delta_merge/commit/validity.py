"""What a merge commits must be valid: deltalake's commit API checks none of this (ARCHITECTURE.md).

Removes name live files; adds name files that exist under the table root with the declared size, the
table's schema (after evolution, partition columns left out) and statistics counted from their rows.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.types import StructType

from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.protocol.column_mapping import partition_keys, physical_arrow_schema
from spark_jobs.delta_merge.protocol.delta_schema import arrow_schema
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.row_tracking import row_tracking
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.protocol.table_features import materializes_partition_columns
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem
from spark_jobs.delta_merge.storage.storage_errors import storage_errors

__all__ = ["check_commit_files"]

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_FOOTER_THREADS = 8  # footers of object-store files are one or two requests each: read a few at a time
_SHOWN = 3


def check_commit_files(
    snapshot: TargetSnapshot, removes: Sequence[LiveFile], adds: Sequence[WrittenFile], *, schema: StructType
) -> None:
    """Refuse file actions that would corrupt the table.

    :param snapshot: the version the merge read (and whose live files it removes).
    :param schema: the table schema after the merge (evolved or not), partition columns included.
    :raises MergeExecutionError: naming each offending file and what is wrong with it.
    """
    problems = list(_action_problems(snapshot, removes, adds))
    misplaced = {f.path: reason for f in adds if (reason := _path_problem(f.path)) is not None}
    problems += [f"adds {path!r}, {reason}" for path, reason in misplaced.items()]
    placed = [f for f in adds if f.path not in misplaced]
    if placed:
        mode = snapshot.column_mapping_mode
        keys = set(partition_keys(schema, snapshot.partition_columns, mode).values())
        physical = physical_arrow_schema(schema, arrow_schema(schema), mode)
        expected = pa.schema([f for f in physical if f.name not in keys])
        if materializes_partition_columns(snapshot):
            # After the other columns, where PROTOCOL.md's materializePartitionColumns puts them.
            expected = pa.schema([*expected, *(f for f in physical if f.name in keys)])
        # Row tracking's materialized columns are in the files but not in the schema.
        tracking = row_tracking(snapshot)
        hidden = frozenset(tracking.materialized_columns if tracking is not None else ())
        with storage_errors(snapshot.table_uri, "checking the merge's new files", snapshot.storage_options):
            problems += _file_problems(snapshot, placed, expected, hidden)
    if problems:
        shown = problems[:10] + ([f"and {len(problems) - 10} more problems"] if len(problems) > 10 else [])
        raise MergeExecutionError(
            f"Refusing to commit to {snapshot.table_uri}: the merge {'; '.join(shown)}. "
            "Nothing was committed."
        )


def _action_problems(
    snapshot: TargetSnapshot, removes: Sequence[LiveFile], adds: Sequence[WrittenFile]
) -> Iterator[str]:
    live = {f.path for f in snapshot.files}
    removed = [f.path for f in removes]
    if not_live := sorted(set(removed) - live):
        yield f"removes files that are not live at version {snapshot.version}: {not_live[:_SHOWN]}"
    if len(set(removed)) != len(removed):
        yield "removes the same file twice"
    added = [f.path for f in adds]
    if len(set(added)) != len(added) or set(added) & live:
        yield "adds a path twice or a path that is already live"
    expected = set(partition_keys(snapshot.schema, snapshot.partition_columns,
                                  snapshot.column_mapping_mode).values())
    if bad := [f.path for f in adds if set(f.partition_values) != expected]:
        yield f"adds files whose partition values do not name {sorted(expected)}: {bad[:_SHOWN]}"


def _path_problem(path: str) -> str | None:
    """Why ``path`` (an encoded ``add.path``) does not name a file inside the table root, or None."""
    decoded = unquote(path)
    if not path or _URI.match(path) or _URI.match(decoded):
        return "which is not a path relative to the table root (it has a URI scheme or is empty)"
    if decoded.startswith(("/", "\\")) or os.path.isabs(decoded):
        return "which is an absolute path, not one relative to the table root"
    parts = re.split(r"[/\\]", decoded)
    if any(part in ("", ".", "..") for part in parts):
        return "which leaves the table root or has empty, '.' or '..' segments"
    return None


def _file_problems(
    snapshot: TargetSnapshot, adds: Sequence[WrittenFile], expected: pa.Schema, hidden: frozenset[str]
) -> list[str]:
    # The table's own store (its storage options reach S3), never a local path for a remote table.
    fs, base = arrow_filesystem(snapshot.table_uri, snapshot.storage_options)
    full_paths = [f"{base.rstrip('/')}/{unquote(f.path)}" for f in adds]
    infos = fs.get_file_info(full_paths)
    problems: list[str] = []
    readable: list[tuple[WrittenFile, str]] = []
    for written, full, info in zip(adds, full_paths, infos, strict=True):
        if info.type != pafs.FileType.File:
            problems.append(f"adds {written.path!r}, which does not exist (no file at {full})")
        elif info.size != written.size:
            problems.append(
                f"adds {written.path!r} with size {written.size}, but the file has {info.size} bytes"
            )
        else:
            readable.append((written, full))
    workers = max(1, min(_FOOTER_THREADS, len(readable)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        check = functools.partial(_footer_problems, fs, expected=expected, hidden=hidden)
        for found in pool.map(lambda item: check(item[0], item[1]), readable):
            problems += found
    return problems


def _footer_problems(
    fs: pafs.FileSystem, written: WrittenFile, full: str, *, expected: pa.Schema, hidden: frozenset[str]
) -> list[str]:
    try:
        with fs.open_input_file(full) as handle:
            parquet = pq.ParquetFile(handle)
            actual, num_rows = parquet.schema_arrow, parquet.metadata.num_rows
    except (OSError, pa.ArrowException) as exc:
        return [f"adds {written.path!r}, which is not a readable Parquet file ({exc})"]
    problems = []
    if hidden:
        actual = pa.schema([f for f in actual if f.name not in hidden or f.type != pa.int64()])
    if difference := _schema_difference(actual, expected):
        problems.append(f"adds {written.path!r}, whose Parquet schema is not the table's: {difference}")
    stated = _num_records(written.stats_json)
    if stated != num_rows or written.num_records != num_rows:
        problems.append(
            f"adds {written.path!r} whose stats say numRecords={stated} (and the writer counted "
            f"{written.num_records}), but its footer has {num_rows} rows"
        )
    return problems


def _schema_difference(actual: pa.Schema, expected: pa.Schema) -> str | None:
    """What differs between the file's columns and the table's, or None when they are the same."""
    have = {f.name: f for f in actual}
    want = {f.name: f for f in expected}
    notes = []
    if missing := [n for n in want if n not in have]:
        notes.append(f"missing columns {missing}")
    if unexpected := [n for n in have if n not in want]:
        notes.append(f"unexpected columns {unexpected}")
    for name, field in want.items():
        other = have.get(name)
        if other is not None and not other.equals(field, check_metadata=False):
            notes.append(f"column {name!r} is {_describe(other)}, expected {_describe(field)}")
    if not notes and actual.names != expected.names:
        notes.append(f"columns in order {actual.names}, expected {expected.names}")
    return "; ".join(notes) or None


def _describe(field: pa.Field) -> str:
    return f"{field.type}{'' if field.nullable else ' NOT NULL'}"


def _num_records(stats_json: str) -> int | None:
    try:
        value = json.loads(stats_json).get("numRecords")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
