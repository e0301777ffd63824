"""The write stage: merge output rows -> Delta-conformant Parquet files and per-action row counts, one job."""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_jobs.delta_merge.errors import ConstraintViolationError, MergeExecutionError, spark_failure
from spark_jobs.delta_merge.protocol.column_mapping import (
    partition_keys,
    physical_arrow_schema,
    physical_path,
)
from spark_jobs.delta_merge.protocol.delta_schema import arrow_schema, variant_paths
from spark_jobs.delta_merge.protocol.file_stats import DEFAULT_NUM_INDEXED_COLS, indexed_leaves
from spark_jobs.delta_merge.protocol.files import WrittenFile
from spark_jobs.delta_merge.sql_names import quoted_name
from spark_jobs.delta_merge.storage.storage_errors import storage_failure, task_storage_fault
from spark_jobs.delta_merge.write.task_plan import VIOLATION_MARKER, WriteTaskPlan
from spark_jobs.delta_merge.write.write_task import RESULT_SCHEMA, write_empty_file, write_task

__all__ = [
    "MergeOutputPlan",
    "WriteOutcome",
    "arrow_schema",
    "data_file_plan",
    "failure_summary",
    "task_violation",
    "write_empty_change_file",
    "write_merge_output",
    "written_file",
]


@dataclass(frozen=True)
class WriteOutcome:
    """What the write stage produced.

    :param files: the new files, ready to become ``add`` actions (sorted by path).
    :param rows_by_code: input rows per action code, written or dropped (codes never seen are absent).
    :param change_files: the change data files, ready to become ``cdc`` actions (sorted by path).
    :param marks: target file key -> the physical indexes of its marked rows.
    """

    files: tuple[WrittenFile, ...]
    rows_by_code: Mapping[int, int]
    change_files: tuple[WrittenFile, ...] = ()
    marks: Mapping[str, BitMap64] = field(default_factory=dict)

    @property
    def num_written_rows(self) -> int:
        return sum(f.num_records for f in self.files)


@dataclass(frozen=True)
class MergeOutputPlan:
    """How :func:`write_merge_output` writes one merge output: where, in which layout, and what it does
    with each action code.

    :param table_root: local path or URI (``file:``, or any scheme pyarrow.fs understands).
    :param schema: the final table schema, partition columns included; the files follow its
        column order and nullability, partition columns left out.
    :param num_indexed_cols: ``delta.dataSkippingNumIndexedCols``.
    :param stats_columns: ``delta.dataSkippingStatsColumns``, which wins when given.
    :param violation_column: a string column that is NULL on rows satisfying the table's constraints
        and otherwise says which one the row violates; the write fails on the first non-NULL value.
    :param change_types: change data feed: the ``_change_type`` of a written row by action code; rows
        of these codes are also written to change data files under ``_change_data/``.
    :param preimage_change_types: the ``_change_type`` of a row's preimage by action code; the
        preimage is read from ``preimage_columns`` (one per ``schema`` column, in its order).
    :param column_mapping_mode: the table's ``delta.columnMapping.mode``: other than ``none``, files
        (change data files too) get physical names and field ids, and partition values and stats are
        keyed by physical name, as the log wants them.
    :param hidden_columns: ``schema`` columns written to the data files that are not table columns (row
        tracking's materialized columns): no statistics are collected on them.
    :param mark_codes: rows of these codes are marked rather than written (deletion vectors): their
        target file's key and physical row index, from ``mark_columns``, come back in ``marks``.
    :param materialize_partition_columns: the ``materializePartitionColumns`` writer feature: the data
        files (and change data files) hold the partition columns too, after the other columns.
    """

    table_root: str
    schema: StructType
    partition_columns: Sequence[str]
    action_column: str
    drop_codes: Collection[int]
    target_file_size: int
    num_indexed_cols: int = DEFAULT_NUM_INDEXED_COLS
    stats_columns: Sequence[str] | None = None
    violation_column: str | None = None
    change_types: Mapping[int, str] | None = None
    preimage_change_types: Mapping[int, str] | None = None
    preimage_columns: Sequence[str] = ()
    column_mapping_mode: str = "none"
    hidden_columns: Sequence[str] = ()
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)
    mark_codes: Collection[int] = ()
    mark_columns: tuple[str, str] | None = None
    materialize_partition_columns: bool = False

    def __post_init__(self) -> None:
        names = list(self.schema.names)
        if clash := [c for c in self.bookkeeping_columns if c in names]:
            raise ValueError(f"MergeOutputPlan: bookkeeping columns {clash} are also table columns")
        if unknown := [c for c in self.partition_columns if c not in names]:
            raise ValueError(f"MergeOutputPlan: partition columns {unknown} are not in the schema {names}")
        if self.target_file_size <= 0:
            size = self.target_file_size
            raise ValueError(f"MergeOutputPlan: target_file_size must be positive, not {size}")
        hidden = list(self.hidden_columns)
        if hidden != names[len(names) - len(hidden) :]:
            raise ValueError(f"MergeOutputPlan: hidden columns {hidden} must end the schema {names}")
        width, preimages = len(names) - len(hidden), len(self.preimage_columns)
        if self.preimage_change_types and preimages != width:
            raise ValueError(f"MergeOutputPlan: {preimages} preimage columns for {width} table columns")
        if bool(self.mark_codes) != (self.mark_columns is not None):
            raise ValueError("MergeOutputPlan: mark_codes and mark_columns go together")

    @property
    def bookkeeping_columns(self) -> list[str]:
        """The columns the write reads besides the table's: the action code, the constraint violation, the
        preimages and the marked rows' file and row index."""
        columns = [self.action_column]
        columns += [self.violation_column] if self.violation_column is not None else []
        columns += list(self.preimage_columns) if self.preimage_change_types else []
        return columns + list(self.mark_columns or ())


def write_merge_output(df: DataFrame, plan: MergeOutputPlan) -> WriteOutcome:
    """Write ``df`` as new Parquet files under ``plan.table_root``, counting rows per action code.

    One Spark job: each task gets Arrow batches, counts codes, drops rows whose code is in
    ``plan.drop_codes`` and writes the rest with pyarrow in Hive-style partition directories, rolling to
    a new file once ``plan.target_file_size`` bytes are written, with Delta statistics of what it wrote.

    :param df: the table's columns (``plan.schema`` names, any order) plus ``plan.action_column``.
    :raises ConstraintViolationError: a row violates a constraint (the message is the column's value).
    :raises MergeExecutionError: the job failed; nothing is committed and files written before
        the failure are orphans that VACUUM removes.
    """
    names = list(plan.schema.names)
    available = {c.lower() for c in df.columns}  # Spark resolves names case-insensitively by default
    extra = plan.bookkeeping_columns
    missing = [c for c in [*names, *extra] if c.lower() not in available]
    if missing:
        raise ValueError(f"write_merge_output: columns {missing} are not in the DataFrame ({df.columns})")
    task_plan = replace(
        data_file_plan(
            table_root=plan.table_root, schema=plan.schema, partition_columns=plan.partition_columns,
            hidden_columns=plan.hidden_columns, target_file_size=plan.target_file_size,
            num_indexed_cols=plan.num_indexed_cols, stats_columns=plan.stats_columns,
            column_mapping_mode=plan.column_mapping_mode, storage_options=plan.storage_options,
            materialize_partition_columns=plan.materialize_partition_columns,
        ),
        drop_codes=tuple(sorted({int(c) for c in plan.drop_codes})),
        check_violations=plan.violation_column is not None,
        change_types=tuple(sorted((plan.change_types or {}).items())),
        preimage_change_types=tuple(sorted((plan.preimage_change_types or {}).items())),
        mark_codes=tuple(sorted({int(c) for c in plan.mark_codes})),
    )
    output = df.select(*[F.col(quoted_name(n)).alias(n) for n in names],
                       *[F.col(quoted_name(c)) for c in extra])  # fmt: skip
    if plan.partition_columns:
        # Delta's repartitionBeforeWrite, as REBALANCE: AQE sizes the partitions from the actual
        # shuffle bytes, so a small output becomes one task per partition value, a large one splits.
        output = output.hint("rebalance", *[F.col(quoted_name(c)) for c in plan.partition_columns])
    # pyspark's mapInArrow looks every column up by its bare name, which reads `value.a` as the field a
    # of a struct value (or fails): give it dot-free names; write_task reads the batches by position.
    output = output.toDF(*[f"_c{i}" for i in range(len(output.columns))])
    job = output.mapInArrow(functools.partial(write_task, task_plan), RESULT_SCHEMA)
    try:
        rows = job.collect()
    except Exception as exc:
        orphans = (
            f"files already written under {plan.table_root} are not in the Delta log; VACUUM removes them"
        )
        violation = task_violation(exc)
        if violation is not None:
            message = f"{violation}\nNothing was committed ({orphans})."
            raise ConstraintViolationError.from_text(message) from exc
        failure = spark_failure(exc)
        if failure is not None:
            raise type(failure)(
                f"{failure.bare_message} ({orphans}.)", error_class=failure.error_class
            ) from exc
        if task_storage_fault(exc) is not None:
            # A task's request to the store (reading the table's files or writing new ones) failed.
            raise storage_failure(plan.table_root, "reading and writing the data files in Spark's tasks",
                                  exc, plan.storage_options,
                                  note=f"Nothing was committed ({orphans}).") from exc  # fmt: skip
        raise MergeExecutionError(
            f"Writing the merge output under {plan.table_root} failed; nothing was committed (files already "
            f"written there are not in the Delta log; VACUUM removes them). Cause: {failure_summary(exc)}"
        ) from exc
    files: list[WrittenFile] = []
    change_files: list[WrittenFile] = []
    counts: Counter[int] = Counter()
    marks: dict[str, BitMap64] = {}
    for row in rows:
        if row["kind"] in ("file", "cdc"):
            (files if row["kind"] == "file" else change_files).append(written_file(row.asDict()))
        elif row["kind"] == "marks":
            bitmap = BitMap64.deserialize(bytes(row["marks"]))
            marks[row["path"]] = marks[row["path"]] | bitmap if row["path"] in marks else bitmap
        else:
            counts[int(row["code"])] += int(row["count"])
    files.sort(key=lambda f: f.path)
    change_files.sort(key=lambda f: f.path)
    return WriteOutcome(files=tuple(files), rows_by_code=MappingProxyType(dict(counts)),
                        change_files=tuple(change_files), marks=MappingProxyType(marks))


def data_file_plan(
    *, table_root: str, schema: StructType, partition_columns: Sequence[str], target_file_size: int,
    hidden_columns: Sequence[str] = (), num_indexed_cols: int = DEFAULT_NUM_INDEXED_COLS,
    stats_columns: Sequence[str] | None = None, column_mapping_mode: str = "none",
    storage_options: Mapping[str, str] | None = None, materialize_partition_columns: bool = False,
) -> WriteTaskPlan:
    """How a task writes data files of ``schema`` (partition and ``hidden_columns`` included, see
    :func:`write_merge_output`): the layout, names and statistics every data file of the table gets
    (no statistics on partition columns, materialized or not: their values are in the log)."""
    full_schema, data_schema, file_partitions = _file_layout(
        schema, partition_columns, column_mapping_mode, materialize=materialize_partition_columns)
    logical_data = pa.schema(
        [f for f in arrow_schema(schema) if f.name not in partition_columns and f.name not in hidden_columns]
    )
    leaves = indexed_leaves(logical_data, num_indexed_cols=num_indexed_cols, stats_columns=stats_columns,
                            whole=variant_paths(schema))
    return WriteTaskPlan(
        root=_normalize_root(table_root),
        input_schema=full_schema,
        data_schema=data_schema,
        partition_columns=file_partitions,
        partition_types=tuple(schema[c].dataType for c in partition_columns),
        leaves=tuple(replace(leaf, path=physical_path(schema, leaf.path, column_mapping_mode))
                     for leaf in leaves),
        drop_codes=(),
        target_file_size=target_file_size,
        hidden_count=len(hidden_columns),
        storage_options=dict(storage_options or {}),
    )


def write_empty_change_file(
    *, table_root: str, schema: StructType, partition_columns: Sequence[str],
    partition_values: Mapping[str, str | None], column_mapping_mode: str = "none",
    storage_options: Mapping[str, str] | None = None, materialize_partition_columns: bool = False,
) -> WrittenFile:
    """One change data file without rows under ``_change_data/`` (in the partition of the serialized
    ``partition_values``, keyed as in the log), for a rewrite that changed no row: see the classic merge
    executor."""
    full_schema, data_schema, file_partitions = _file_layout(
        schema, partition_columns, column_mapping_mode, materialize=materialize_partition_columns)
    plan = WriteTaskPlan(
        root=_normalize_root(table_root),
        input_schema=full_schema,
        data_schema=data_schema,
        partition_columns=file_partitions,
        partition_types=tuple(schema[c].dataType for c in partition_columns),
        leaves=(),
        drop_codes=(),
        target_file_size=1,
        storage_options=dict(storage_options or {}),
    )
    return written_file(write_empty_file(plan.change_data_plan(), dict(partition_values)))


def _file_layout(
    schema: StructType, partition_columns: Sequence[str], column_mapping_mode: str, *, materialize: bool
) -> tuple[pa.Schema, pa.Schema, tuple[str, ...]]:
    """The Arrow schemas of the rows (partition columns included) and of the files, and the partition
    columns, all as files and log name them (physical names in column-mapped tables). ``materialize``
    (PROTOCOL.md's materializePartitionColumns): the files hold the partition columns after the others."""
    full_schema = physical_arrow_schema(schema, arrow_schema(schema), column_mapping_mode)
    keys = tuple(partition_keys(schema, partition_columns, column_mapping_mode).values())
    data_fields = [f for f in full_schema if f.name not in keys]
    if materialize:
        data_fields += [full_schema.field(key) for key in keys]
    return full_schema, pa.schema(data_fields), keys


def written_file(row: Mapping[str, Any]) -> WrittenFile:
    return WrittenFile(
        path=row["path"], size=row["size"], partition_values=json.loads(row["partition_values"]),
        stats_json=row["stats"], num_records=row["num_records"], modification_time=row["modification_time"],
    )



def failure_summary(exc: BaseException) -> str:
    """The Python error a task raised, out of Spark's wrapper (the whole text stays in __cause__)."""
    text = str(exc)
    raised = re.findall(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception): .+)$", text, flags=re.MULTILINE)
    return raised[-1].strip() if raised else text[:2000]


def task_violation(exc: BaseException) -> str | None:
    """The constraint violation a write task reported (JSON after a marker), if that is the failure."""
    match = re.search(re.escape(VIOLATION_MARKER) + r'("(?:[^"\\]|\\.)*")', str(exc))
    if match is None:
        return None
    try:
        return str(json.loads(match.group(1)))
    except ValueError:
        return None




def _normalize_root(table_root: str) -> str:
    if "://" in table_root or table_root.startswith("file:"):
        return table_root.rstrip("/")
    return os.path.abspath(table_root)
