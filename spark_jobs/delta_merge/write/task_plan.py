"""What a write task is told: the files' layout, names, statistics and what it does with each action code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyspark.sql.types import DataType

from spark_jobs.delta_merge.protocol.file_stats import StatsLeaf

__all__ = ["CHANGE_DATA_DIR", "CHANGE_TYPE_COLUMN", "COMPRESSION", "VIOLATION_MARKER", "WriteTaskPlan"]

COMPRESSION = "zstd"

# PROTOCOL.md "Change Data Files": under _change_data/, partitioned like the table, with _change_type.
CHANGE_DATA_DIR = "_change_data"

CHANGE_TYPE_COLUMN = "_change_type"
# A task reports a constraint violation as this marker and the message as one JSON string: Spark hands
# the driver only the text of a task's error, and the message has several lines.
VIOLATION_MARKER = "DELTA_MERGE_CONSTRAINT_VIOLATION:"


@dataclass(frozen=True)
class WriteTaskPlan:
    """Everything a write task needs; pickled into the closure of every task.

    :param root: absolute local path or URI of the table root.
    :param input_schema: Arrow schema of the table columns in the batches (after the action code).
    :param data_schema: the files' schema: ``input_schema`` without partition columns.
    :param check_violations: the batches carry a violation column after the action code: a task
        fails on its first non-NULL value, before writing that batch.
    :param change_types: change data feed: the ``_change_type`` of the written row, by action code.
    :param preimage_change_types: the ``_change_type`` of the preimage, by action code; the preimage
        columns (``input_schema``'s, in its order) follow the action code and violation columns.
    :param file_kind: ``file`` for data files, ``cdc`` for change data files (``cdc-`` names).
    :param hidden_count: the last this many columns of ``input_schema`` are written to data files but
        are no table columns (row tracking's materialized columns): change data files leave them out.
    :param storage_options: how to reach the table's store (keys and endpoint for object stores); kept
        out of ``repr`` so no log or error message carries a secret.
    :param mark_codes: rows of these action codes are not written but marked: their target file's key and
        physical row index (the last two columns of the batches) are reported, for deletion vectors.
    """

    root: str
    input_schema: pa.Schema
    data_schema: pa.Schema
    partition_columns: tuple[str, ...]
    partition_types: tuple[DataType, ...]
    leaves: tuple[StatsLeaf, ...]
    drop_codes: tuple[int, ...]
    target_file_size: int
    compression: str = COMPRESSION
    check_violations: bool = False
    change_types: tuple[tuple[int, str], ...] = ()
    preimage_change_types: tuple[tuple[int, str], ...] = ()
    file_kind: str = "file"
    hidden_count: int = 0
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    mark_codes: tuple[int, ...] = ()

    @property
    def table_width(self) -> int:
        """How many leading columns of ``input_schema`` are the table's."""
        return len(self.input_schema) - self.hidden_count

    @property
    def writes_change_data(self) -> bool:
        return bool(self.change_types or self.preimage_change_types)

    def change_data_plan(self) -> WriteTaskPlan:
        """The plan of the change data files: the data files' layout plus ``_change_type``, no stats."""
        change_type = pa.field(CHANGE_TYPE_COLUMN, pa.string())
        hidden = set(self.input_schema.names[self.table_width :])
        table_columns = pa.schema(list(self.input_schema)[: self.table_width])
        return replace(
            self, input_schema=table_columns.append(change_type),
            data_schema=pa.schema([f for f in self.data_schema if f.name not in hidden]).append(change_type),
            leaves=(), drop_codes=(), change_types=(), preimage_change_types=(), file_kind="cdc",
            hidden_count=0, mark_codes=(),
        )
