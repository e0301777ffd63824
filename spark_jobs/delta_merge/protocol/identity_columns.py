"""Identity columns: which clauses may assign them, how inserts draw new values, how the mark moves.

Delta's rules (IdentityColumn, GenerateIdentityValues, PreprocessTableMerge): an identity column's field
metadata holds ``delta.identity.start``, ``.step``, ``.allowExplicitInsert`` (false for GENERATED ALWAYS)
and, once values were generated, ``.highWaterMark``. UPDATE clauses never assign an identity column; INSERT
clauses may give it a value only when explicit inserts are allowed (BY DEFAULT); an INSERT clause that gives
none draws a new one. Generated values are ``start + k * step``, unique, and beyond the mark in the step's
direction. The new mark is the furthest value the merge wrote into such a column, rounded onto the
``start + k * step`` lattice, and is committed in the schema of the merge's own version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.protocol.column_mapping import physical_name
from spark_jobs.delta_merge.protocol.files import WrittenFile
from spark_jobs.delta_merge.statement.parsed_merge import MergeClause, ParsedMerge
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem
from spark_jobs.delta_merge.storage.storage_errors import storage_errors

__all__ = [
    "IDENTITY_SLOT_COLUMN",
    "IdentityColumn",
    "check_identity_assignments",
    "generated_identity_value",
    "identity_columns",
    "inserts_generating",
    "moved_high_water_mark",
    "with_identity_slots",
    "with_moved_high_water_marks",
]

START = "delta.identity.start"
STEP = "delta.identity.step"
HIGH_WATER_MARK = "delta.identity.highWaterMark"
ALLOW_EXPLICIT_INSERT = "delta.identity.allowExplicitInsert"

# Per output row a number unique within the merge (NULL on rows that draw no identity value).
IDENTITY_SLOT_COLUMN = "__merge_identity_slot"
_LONG_MAX = (1 << 63) - 1
_LONG_MIN = -(1 << 63)
# monotonically_increasing_id() keeps the row's position within its partition in its low 33 bits.
_ROW_IN_PARTITION_MASK = (1 << 33) - 1


@dataclass(frozen=True)
class IdentityColumn:
    """One identity column as its field metadata describes it (Delta's IdentityInfo)."""

    name: str
    start: int
    step: int
    high_water_mark: int | None
    allow_explicit_insert: bool

    @property
    def first_value(self) -> int:
        """The lowest legal value in the step's direction: one step beyond the mark, or ``start``."""
        return self.start if self.high_water_mark is None else self.high_water_mark + self.step


def identity_columns(schema: StructType) -> tuple[IdentityColumn, ...]:
    """The identity columns of ``schema`` (Delta has them at the top level only).

    :raises MergeAnalysisError: a column's identity metadata lacks start or step, or its step is 0.
    """
    found: list[IdentityColumn] = []
    for field in schema.fields:
        metadata = field.metadata
        if not any(key.startswith("delta.identity.") for key in metadata):
            continue
        try:
            start, step = int(metadata[START]), int(metadata[STEP])
            mark = metadata.get(HIGH_WATER_MARK)
            column = IdentityColumn(
                name=field.name, start=start, step=step, high_water_mark=None if mark is None else int(mark),
                allow_explicit_insert=bool(metadata.get(ALLOW_EXPLICIT_INSERT, False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MergeAnalysisError(
                f"Identity column {field.name} has incomplete metadata {dict(metadata)!r}: {START} and "
                f"{STEP} must be integers. Check the table's schema (metaData.schemaString)."
            ) from exc
        if step == 0:
            raise MergeAnalysisError(
                f"Identity column {field.name} has {STEP} = 0; Delta requires a non-zero step. Check the "
                "table's schema (metaData.schemaString)."
            )
        found.append(column)
    return tuple(found)


def _update_error(column: str) -> MergeAnalysisError:
    return MergeAnalysisError(
        f"IDENTITY column {column} cannot be updated. Its values are assigned once, on insert: remove "
        f"{column} from the UPDATE SET list (for UPDATE SET *, leave it out of the source, e.g. by "
        "selecting the other columns).",
        error_class="DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED",
    )


def _explicit_insert_error(column: str) -> MergeAnalysisError:
    return MergeAnalysisError(
        f"Providing values for GENERATED ALWAYS AS IDENTITY column {column} is not supported. Leave {column} "
        "out of the INSERT column list (for INSERT *, leave it out of the source) and Delta generates it.",
        error_class="DELTA_IDENTITY_COLUMNS_EXPLICIT_INSERT_NOT_SUPPORTED",
    )


def _assigned(clause: MergeClause, source_schema: StructType) -> set[str]:
    """Lower-cased top-level target columns the clause assigns (``*`` assigns the source's columns)."""
    if clause.action in ("update_all", "insert_all"):
        return {name.lower() for name in source_schema.fieldNames()}
    return {a.column[0].lower() for a in clause.assignments if len(a.column) == 1}


def check_identity_assignments(
    columns: Sequence[IdentityColumn], parsed: ParsedMerge, *, source_schema: StructType
) -> None:
    """Refuse what Delta's PreprocessTableMerge refuses, before anything is read or written.

    ``SET *`` and ``INSERT *`` assign a target column from the source column of its name, so a source
    carrying the identity column assigns it.

    :raises MergeAnalysisError: an UPDATE (MATCHED or NOT MATCHED BY SOURCE) assigns an identity column
        (``DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED``), or an INSERT gives a GENERATED ALWAYS column a
        value (``DELTA_IDENTITY_COLUMNS_EXPLICIT_INSERT_NOT_SUPPORTED``).
    """
    for clause in parsed.clauses:
        if clause.action == "delete":
            continue
        assigned = _assigned(clause, source_schema)
        for column in columns:
            if column.name.lower() not in assigned:
                continue
            if clause.when != "not_matched":
                raise _update_error(column.name)
            if not column.allow_explicit_insert:
                raise _explicit_insert_error(column.name)


def inserts_generating(column: IdentityColumn, clause: MergeClause, source_schema: StructType) -> bool:
    """The INSERT clause gives ``column`` no value, so each row it inserts draws a new one."""
    return clause.when == "not_matched" and column.name.lower() not in _assigned(clause, source_schema)


def generated_identity_value(column: IdentityColumn, field: StructField) -> Column:
    """The value a row inserted by a generating clause gets: ``first_value + step * slot``.

    The slot (:func:`with_identity_slots`) is unique per row, so the values are unique, on the
    ``start + k * step`` lattice and beyond the old mark.
    """
    # Delta computes with exact arithmetic (Math.addExact): a value past the BIGINT range fails the merge
    # instead of wrapping around into values already used, whatever spark.sql.ansi.enabled says.
    bound = _LONG_MAX if column.step > 0 else _LONG_MIN
    last_slot = (bound - column.first_value) // column.step
    overflow = F.raise_error(F.lit(
        f"[ARITHMETIC_OVERFLOW] long overflow: identity column {column.name} (start {column.start}, step "
        f"{column.step}) has no values left beyond its high-water mark {column.high_water_mark}."
    ))
    if last_slot < 0:
        return overflow.cast(field.dataType)
    slot = F.col(IDENTITY_SLOT_COLUMN)
    value = F.lit(column.first_value) + F.lit(column.step) * slot
    return F.when(slot <= F.lit(last_slot), value).otherwise(overflow).cast(field.dataType)


def with_identity_slots(df: DataFrame, draws_value: Column, *, partitions: int) -> DataFrame:
    """``df`` with :data:`IDENTITY_SLOT_COLUMN`: on rows where ``draws_value`` holds, a number unique
    within the merge, small and dense per partition.

    As Delta's GenerateIdentityValues: the row at position ``k`` of partition ``p`` of ``n`` gets
    ``p + k * n``. Spark gives Python no partition count, so the rows are first spread round-robin over
    ``partitions`` partitions: adaptive execution may merge those but never splits them, so every ``p``
    is below ``n``. The slot is one expression evaluated once per row, so two INSERT clauses never draw
    the same value.
    """
    spread = df.repartition(partitions)
    row_in_partition = F.monotonically_increasing_id().bitwiseAND(F.lit(_ROW_IN_PARTITION_MASK))
    slot = F.spark_partition_id().cast("long") + row_in_partition * F.lit(partitions)
    return spread.withColumn(IDENTITY_SLOT_COLUMN, F.when(draws_value, slot))


def _round_onto_lattice(column: IdentityColumn, value: int) -> int:
    """The first lattice value at or beyond ``value`` in the step's direction (Delta's roundToNext)."""
    offset = value - column.start
    if offset % column.step == 0:
        return value
    # Python's // floors; Delta truncates toward zero and adds one step only when the value lies on
    # the start's side it grows toward.
    quotient = abs(offset) // abs(column.step) * (1 if (offset > 0) == (column.step > 0) else -1)
    multiple = quotient + 1 if (offset > 0) == (column.step > 0) else quotient
    return column.start + column.step * multiple


def moved_high_water_mark(column: IdentityColumn, written: Iterable[int]) -> int | None:
    """The column's new mark after writing ``written`` values, or None when it stays (Delta's
    updateToValidHighWaterMark): the furthest value in the step's direction, rounded onto the lattice;
    never moved back, nor set by a value before ``start``."""
    values = list(written)
    if not values:
        return None
    candidate = max(values) if column.step > 0 else min(values)
    if (candidate < column.start) if column.step > 0 else (candidate > column.start):
        return None
    rounded = _round_onto_lattice(column, candidate)
    if column.high_water_mark is not None:
        further = max if column.step > 0 else min
        rounded = further(column.high_water_mark, rounded)
    return None if rounded == column.high_water_mark else rounded


def _written_extremes(
    column: IdentityColumn, key: str, adds: Sequence[WrittenFile], *, table_uri: str,
    storage_options: Mapping[str, str] | None,
) -> list[int]:
    """Per written file, its furthest value of the column: from the file's statistics, or read from the
    file when the statistics leave the column out (not among the indexed columns). ``key`` is the
    column's name in files, partition values and stats (its physical name in column-mapped tables)."""
    positive = column.step > 0
    extremes: list[int] = []
    unindexed: list[WrittenFile] = []
    for written in adds:
        if key in written.partition_values:
            value = written.partition_values[key]
            extremes += [] if value is None else [int(value)]
            continue
        stats = json.loads(written.stats_json) if written.stats_json else {}
        bound = stats.get("maxValues" if positive else "minValues") or {}
        if key in bound:
            extremes.append(int(bound[key]))
        elif stats.get("nullCount", {}).get(key) != stats.get("numRecords", -1):
            unindexed.append(written)
    if unindexed:
        operation = f"reading identity column {key} from the merge's new files"
        with storage_errors(table_uri, operation, storage_options):
            extremes += _read_extremes(
                column, key, unindexed, table_uri=table_uri, storage_options=storage_options
            )
    return extremes


def _read_extremes(
    column: IdentityColumn, key: str, adds: Sequence[WrittenFile], *, table_uri: str,
    storage_options: Mapping[str, str] | None,
) -> list[int]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # The table's own store: its storage options reach S3, and a remote table is never read as a local path.
    fs, base = arrow_filesystem(table_uri, storage_options)
    extremes: list[int] = []
    for written in adds:
        with fs.open_input_file(f"{base.rstrip('/')}/{unquote(written.path)}") as handle:
            values = pq.read_table(handle, columns=[key]).column(0)
        extreme = (pc.max if column.step > 0 else pc.min)(values).as_py()
        extremes += [] if extreme is None else [int(extreme)]
    return extremes


def with_moved_high_water_marks(
    schema: StructType, tracked: Iterable[str], adds: Sequence[WrittenFile], *, table_uri: str,
    column_mapping_mode: str = "none", storage_options: Mapping[str, str] | None = None,
) -> StructType:
    """``schema`` with the mark of every tracked identity column moved past what the merge wrote.

    As Delta tracks marks only for the columns some INSERT clause generates values for, ``tracked``
    names those; the values counted are all the column's values in the written files (Delta's
    DeltaIdentityColumnStatsTracker), so explicit BY DEFAULT values beyond the mark move it too.
    """
    names = {name.lower() for name in tracked}
    if not names:
        return schema
    by_name = {c.name.lower(): c for c in identity_columns(schema)}
    fields: list[StructField] = []
    for field in schema.fields:
        column = by_name.get(field.name.lower())
        mark = None
        if column is not None and field.name.lower() in names:
            key = physical_name(field, column_mapping_mode)
            extremes = _written_extremes(
                column, key, adds, table_uri=table_uri, storage_options=storage_options
            )
            mark = moved_high_water_mark(column, extremes)
        if mark is None:
            fields.append(field)
        else:
            metadata: Mapping[str, object] = {**field.metadata, HIGH_WATER_MARK: mark}
            fields.append(StructField(field.name, field.dataType, field.nullable, dict(metadata)))
    return StructType(fields)
