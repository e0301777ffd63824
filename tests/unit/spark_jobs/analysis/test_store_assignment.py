"""Store assignment checked cell by cell against Spark's own INSERT INTO, the reference.

For each policy (ANSI, LEGACY, STRICT) and each (source type, target type) pair, the reference is what
Spark's ``INSERT INTO`` a plain Parquet table does with the same ``spark.sql.storeAssignmentPolicy``:
refuse the statement at analysis, fail at run time, or store some values. A merge through ``run_merge``
into a Delta table with the same columns must do the same: refuse at analysis (``MergeAnalysisError``
with Spark's error class, naming the column), fail at run time before it commits (``CastFailureError``
naming the column; table version and files unchanged), or store the same values through UPDATE SET and
through INSERT.

One documented difference, Delta's own: under ANSI, Delta's MERGE (UpdateExpressionsSupport.castIfNeeded)
assigns with an ANSI CAST where INSERT INTO's store assignment refuses some pairs (STRING to INT, numbers to
BOOLEAN or TIMESTAMP, ...). For those cells the reference is INSERT INTO with that CAST written out, so
'abc' into an INT column fails at run time with CAST_INVALID_INPUT rather than at analysis. Delta's name
for an overflow into an integral or decimal column is DELTA_CAST_OVERFLOW_IN_TABLE_WRITE. Under STRICT,
Delta's MERGE up-casts and names a refused pair CANNOT_UP_CAST_DATATYPE, where INSERT INTO says
CANNOT_SAFELY_CAST. A cell of each kind is also run through Delta's own MERGE (``DELTA_CELLS``), which shows
these differences are Delta's.

Kept cheap (one shared session, four rows a cell): each cell's INSERT is analyzed on its own by Spark's
analyzer (parse and analyze, no job), the cells it accepts are inserted with one statement and merged
with one merge (UPDATE SET * and an explicit INSERT), and only failing cells run one at a time. Cells
the reference refuses are checked against the job's analysis rule (``store_assign``) each, and through
``run_merge`` for a sample covering every source and target type among them.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import CastFailureError, MergeAnalysisError, MergeJobError
from spark_jobs.delta_merge.spark_confs import session_confs
from tests.support.delta_reader import read_table, table_version

POLICIES = ("ANSI", "LEGACY", "STRICT")
ROWS = 4  # rows per cell: ids 1..ROWS are updated, ids ROWS+1..2*ROWS inserted

# Instants whose epoch seconds fit every numeric type (TIMESTAMP casts to numbers under ANSI and LEGACY).
_INSTANTS = ("1970-01-01 00:01:40.123456", "1969-12-31 23:59:58.75", "1970-01-01 00:00:00")
# SQL type -> one SQL literal per row (cast to the type). The values fit every numeric type, and a STRING
# source holds the target type's values as text (see _values), so the matrix fails at run time nowhere;
# RUNTIME_CELLS hold the values that do.
TYPES: dict[str, tuple[str, ...]] = {
    "TINYINT": ("1", "-2", "100", "NULL"),
    "INT": ("1", "-2", "100", "NULL"),
    "BIGINT": ("1", "-2", "100", "NULL"),
    "FLOAT": ("1.5", "-2.25", "100.75", "NULL"),
    "DOUBLE": ("1.5", "-2.25", "100.75", "NULL"),
    "DECIMAL(5,2)": ("1.25", "-2.5", "100.75", "NULL"),
    "DECIMAL(20,4)": ("1.2345", "-2.5", "100.005", "NULL"),
    "STRING": ("'1.5'", "'true'", "'2024-02-29 10:00:00'", "NULL"),
    "BOOLEAN": ("true", "false", "true", "NULL"),
    "DATE": ("DATE'2024-02-29'", "DATE'1969-12-31'", "DATE'2000-01-01'", "NULL"),
    "TIMESTAMP": (*(f"TIMESTAMP'{t}'" for t in _INSTANTS), "NULL"),
    "TIMESTAMP_NTZ": (*(f"TIMESTAMP_NTZ'{t}'" for t in _INSTANTS), "NULL"),
    "BINARY": ("X'3132'", "X''", "X'C3A9'", "NULL"),
}
# A struct column whose field f needs the cast (field g does not).
STRUCT_PAIRS = (
    ("INT", "BIGINT"), ("BIGINT", "INT"), ("DOUBLE", "DECIMAL(5,2)"), ("STRING", "INT"), ("INT", "STRING"),
    ("STRING", "BOOLEAN"), ("TIMESTAMP", "DATE"), ("DATE", "TIMESTAMP"), ("BIGINT", "TIMESTAMP"),
    ("BOOLEAN", "INT"), ("TIMESTAMP_NTZ", "TIMESTAMP"), ("FLOAT", "DOUBLE"),
)
# Spark's errors for a value too large for an integral or decimal column; Delta's MERGE reports each as
# DELTA_CAST_OVERFLOW_IN_TABLE_WRITE (its CheckOverflowInTableWrite).
OVERFLOW_CLASSES = ("CAST_OVERFLOW_IN_TABLE_INSERT", "CAST_OVERFLOW", "NUMERIC_VALUE_OUT_OF_RANGE")


@dataclass(frozen=True)
class Cell:
    """One (source type, target type) pair: a source column with ``values``, assigned as ``expression``."""

    source: str
    target: str
    values: tuple[str, ...]
    expression: str = "{}"

    def value_sql(self, column: str) -> str:
        return self.expression.format(column)

    def __str__(self) -> str:
        assigned = self.expression.format(self.source)
        return f"{assigned} -> {self.target} {self.values[0]}"


@dataclass(frozen=True)
class Outcome:
    """``stored`` with the values (for the merge: values updated, values inserted), or ``refused`` (at
    analysis) / ``failed`` (at run time) with the error class."""

    kind: str
    detail: Any

    def __str__(self) -> str:
        return f"{self.kind} {self.detail!r}"


def _struct(field: str) -> str:
    return f"STRUCT<f: {field}, g: STRING>"


def _values(source: str, target: str) -> tuple[str, ...]:
    """The source values of a cell: a STRING holds the target's values as text (each one well-formed)."""
    if source != "STRING":
        return TYPES[source]
    return tuple(v if v == "NULL" else f"CAST(CAST({v} AS {target}) AS STRING)" for v in TYPES[target])


def _struct_values(source: str, target: str) -> tuple[str, ...]:
    fields = _values(source, target)[:ROWS - 1]
    return (*(f"named_struct('f', CAST({v} AS {source}), 'g', 'x')" for v in fields), "NULL")


MATRIX_CELLS = (
    *(Cell(source, target, _values(source, target)) for source in TYPES for target in TYPES),
    *(Cell(_struct(src), _struct(dst), _struct_values(src, dst)) for src, dst in STRUCT_PAIRS),
)
# One cell per way a value fails (each failing merge costs a second or more: the failed task takes its
# Python worker down with it).
RUNTIME_CELLS = (
    Cell("STRING", "INT", ("'abc'",) * ROWS),  # malformed: CAST_INVALID_INPUT under ANSI
    Cell("STRING", "DECIMAL(5,2)", ("'12345.678'",) * ROWS),  # a number, too large: overflow
    Cell("INT", "TINYINT", ("300",) * ROWS),
    Cell("DOUBLE", "INT", ("'NaN'",) * ROWS),
    Cell(_struct("INT"), _struct("TINYINT"), ("named_struct('f', 300, 'g', 'x')",) * ROWS),
)


# -- the session's confs ------------------------------------------------------------------------------------
def _policy(spark: Any, policy: str) -> AbstractContextManager[None]:
    # As the merge job runs a policy: LEGACY with ANSI casts off, the others with them on.
    confs = {"spark.sql.storeAssignmentPolicy": policy,
             "spark.sql.ansi.enabled": "false" if policy == "LEGACY" else "true"}
    return session_confs(spark, confs)


def _source_view(spark: Any, cells: Sequence[Cell]) -> str:
    """A temp view: ``id`` 1..2*ROWS and ``c<i>`` per cell, each cell's values twice (update, insert)."""
    name = f"store_source_{uuid.uuid4().hex[:8]}"
    rows = []
    for row_id in range(1, 2 * ROWS + 1):
        values = [f"CAST({c.values[(row_id - 1) % ROWS]} AS {c.source})" for c in cells]
        rows.append(f"({row_id}L, {', '.join(values)})")
    names = ", ".join(["id", *(f"c{i}" for i in range(len(cells)))])
    # Checkpointed, so that each statement reading the view does not analyze all its VALUES again.
    values = spark.sql(f"SELECT * FROM VALUES {', '.join(rows)} AS v({names})")
    values.localCheckpoint().createOrReplaceTempView(name)
    return name


def _plain(value: Any) -> Any:
    """A value read back, comparable across readers: naive UTC datetimes, bytes, NaN as a string."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _columns(table: pa.Table, names: Sequence[str]) -> dict[str, list[Any]]:
    """Each named column's values ordered by ``id``."""
    order = sorted(range(table.num_rows), key=lambda r: table.column("id")[r].as_py())
    return {n: [_plain(table.column(n)[r].as_py()) for r in order] for n in names}


# -- the reference: INSERT INTO a Parquet table -------------------------------------------------------------
def _analysis_error(spark: Any, sql: str) -> str | None:
    """The error class Spark's analyzer raises for ``sql`` (parsed and analyzed, nothing runs), or None.

    What ``spark.sql`` does before it runs an INSERT, without the job for the statements it accepts or
    pyspark's logging of the ones it refuses: about 15 ms a statement instead of 90.
    """
    state = spark._jsparkSession.sessionState()
    try:
        state.analyzer().checkAnalysis(state.analyzer().execute(state.sqlParser().parsePlan(sql)))
    except Exception as exc:  # pyspark's AnalysisException (its py4j hook converts the JVM's)
        return str(exc.getCondition())  # type: ignore[attr-defined]
    return None


def reference(spark: Any, root: Path, policy: str, cells: Sequence[Cell], view: str) -> list[Outcome]:
    """What INSERT INTO a Parquet table does with each cell under ``policy``.

    Each cell's own INSERT (into a table with the cell's target type) is analyzed; under ANSI a cell it
    refuses is tried again with Delta's ANSI CAST written out. The cells accepted are inserted with one
    statement, and when that fails at run time, one statement per cell tells which.
    """
    created: list[str] = []

    def create(columns: str) -> str:
        name = f"store_ref_{uuid.uuid4().hex[:8]}"
        spark.sql(f"CREATE TABLE {name} (id BIGINT, {columns}) USING parquet LOCATION '{root / name}'")
        created.append(name)
        return name

    expressions = [c.expression for c in cells]

    def insert_sql(table: str, indexes: Sequence[int], names: Sequence[str]) -> str:
        values = ", ".join(expressions[i].format(f"c{i}") for i in indexes)
        return (f"INSERT OVERWRITE TABLE {table} (id, {', '.join(names)}) SELECT id, {values} FROM {view} "
                f"WHERE id <= {ROWS}")

    outcomes: dict[int, Outcome] = {}
    narrow: dict[str, str] = {}  # a one-column table per target type
    try:
        with _policy(spark, policy):
            for i, cell in enumerate(cells):
                if cell.target not in narrow:
                    narrow[cell.target] = create(f"d {cell.target}")
                refused = _analysis_error(spark, insert_sql(narrow[cell.target], [i], ["d"]))
                if refused is not None and policy == "ANSI":
                    expressions[i] = f"CAST({cell.expression} AS {cell.target})"
                    if _analysis_error(spark, insert_sql(narrow[cell.target], [i], ["d"])) is None:
                        continue  # Delta casts it
                if refused is not None:
                    # Delta's MERGE up-casts under STRICT, and names a refusal as UpCast does.
                    if policy == "STRICT" and refused == "INCOMPATIBLE_DATA_FOR_TABLE.CANNOT_SAFELY_CAST":
                        refused = "CANNOT_UP_CAST_DATATYPE"
                    outcomes[i] = Outcome("refused", refused)
            accepted = [i for i in range(len(cells)) if i not in outcomes]
            if not accepted:
                return [outcomes[i] for i in range(len(cells))]
            wide = create(", ".join(f"d{i} {cells[i].target}" for i in accepted))
            try:
                spark.sql(insert_sql(wide, accepted, [f"d{i}" for i in accepted]))
            except Exception:  # some value fails at run time: which?
                for i in accepted:
                    try:
                        spark.sql(insert_sql(narrow[cells[i].target], [i], ["d"]))
                    except Exception as exc:
                        outcomes[i] = Outcome("failed", exc.getCondition())  # type: ignore[attr-defined]
                accepted = [i for i in accepted if i not in outcomes]
                if accepted:
                    spark.sql(insert_sql(wide, accepted, [f"d{i}" for i in accepted]))
            stored = _columns(spark.table(wide).toArrow(), ["id", *(f"d{i}" for i in accepted)])
    finally:
        for name in created:
            spark.sql(f"DROP TABLE IF EXISTS {name}")
    for i in accepted:
        outcomes[i] = Outcome("stored", stored[f"d{i}"])
    return [outcomes[i] for i in range(len(cells))]


# -- the merge ---------------------------------------------------------------------------------------------
def make_target(spark: Any, path: Path, columns: Sequence[tuple[str, str]]) -> Path:
    """A Delta table (written by deltalake) with ``id`` 1..ROWS and NULL columns of the given types."""
    from pyspark.sql.pandas.types import to_arrow_schema

    ddl = ", ".join(["id BIGINT", *(f"{name} {sql_type}" for name, sql_type in columns)])
    schema = to_arrow_schema(spark.createDataFrame([], ddl).schema, timezone="UTC")
    arrays = [pa.array(range(1, ROWS + 1), pa.int64()), *(pa.nulls(ROWS, f.type) for f in list(schema)[1:])]
    write_deltalake(str(path), pa.Table.from_arrays(arrays, schema=schema))
    return path


def _state(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _merge(spark: Any, target: Path, query: str, sql: str, policy: str) -> dict[str, Any]:
    spec = {"target": {"uri": str(target)}, "source": {"query": query}, "merge_sql": sql,
            "options": {"store_assignment_policy": policy}}
    metrics: dict[str, Any] = run_merge(spark, spec).to_dict()
    return metrics


def _one_cell_sql(cell: Cell, *, update: bool, insert: bool) -> str:
    value = cell.value_sql("s.c")
    clauses = ["WHEN MATCHED THEN UPDATE SET t.c = " + value] if update else []
    clauses += ["WHEN NOT MATCHED THEN INSERT (id, c) VALUES (s.id, " + value + ")"] if insert else []
    return "MERGE INTO t USING s ON t.id = s.id " + " ".join(clauses)


def _batch_sql(cells: Sequence[tuple[int, Cell]]) -> str:
    """UPDATE SET * when every cell assigns its column as is (else explicit), and an explicit INSERT."""
    if all(c.expression == "{}" for _, c in cells):
        update = "UPDATE SET *"
    else:
        update = "UPDATE SET " + ", ".join(f"t.c{i} = {c.value_sql(f's.c{i}')}" for i, c in cells)
    names = ", ".join(f"c{i}" for i, _ in cells)
    values = ", ".join(c.value_sql(f"s.c{i}") for i, c in cells)
    return (f"MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN {update} "
            f"WHEN NOT MATCHED THEN INSERT (id, {names}) VALUES (s.id, {values})")


def _one_at_a_time(
    spark: Any, root: Path, policy: str, cells: Sequence[Cell], view: str, indexes: Sequence[int],
    expected: Sequence[Outcome],
) -> tuple[dict[int, Outcome], list[str]]:
    """Merges of one cell each (refused or failing), into a one-column target per target type."""
    outcomes: dict[int, Outcome] = {}
    problems: list[str] = []
    targets: dict[str, Path] = {}
    for n, i in enumerate(indexes):
        cell = cells[i]
        if cell.target not in targets:
            targets[cell.target] = make_target(spark, root / f"one_{len(targets)}", [("c", cell.target)])
        target = targets[cell.target]
        before = _state(target)
        # Refusals: alternately UPDATE and INSERT, and INSERT alone (the analysis meets UPDATE first).
        # Failures: every third one an UPDATE alone, the others an INSERT alone (one Spark job and no
        # materialized source: cheaper).
        if expected[i].kind == "failed":
            sql = _one_cell_sql(cell, update=n % 3 == 0, insert=n % 3 != 0)
        else:
            sql = _one_cell_sql(cell, update=n % 2 == 0, insert=True)
        try:
            _merge(spark, target, f"SELECT id, c{i} AS c FROM {view}", sql, policy)
            outcomes[i] = Outcome("stored", "(committed)")
            continue
        except MergeAnalysisError as exc:
            outcomes[i] = Outcome("refused", exc.error_class)
            message = str(exc)
        except CastFailureError as exc:
            outcomes[i] = Outcome("failed", exc.error_class)
            message = str(exc)
        except Exception as exc:  # any other error is a mismatch too: name it
            outcomes[i] = Outcome(type(exc).__name__, getattr(exc, "error_class", None))
            message = str(exc)
        if "`c`" not in message and cell.expression == "{}":
            problems.append(f"{cell}: the error does not name the column `c`: {message}")
        if _state(target) != before:
            problems.append(f"{cell}: the failed merge changed the table")
    return outcomes, problems


def _covering_sample(cells: Sequence[Cell], indexes: Sequence[int]) -> list[int]:
    """Cells among ``indexes`` in which each of their source types and target types occurs at least once."""
    sources: set[str] = set()
    targets: set[str] = set()
    sample = []
    for i in indexes:
        if cells[i].source not in sources or cells[i].target not in targets:
            sample.append(i)
            sources.add(cells[i].source)
            targets.add(cells[i].target)
    return sample


def _analysis_outcomes(
    spark: Any, policy: str, cells: Sequence[Cell], indexes: Sequence[int]
) -> dict[int, Outcome]:
    """What the job's analysis decides for each cell: ``store_assign`` is what it calls for an assignment."""
    from pyspark.sql import functions as F

    from spark_jobs.delta_merge.analysis.store_assignment import store_assign

    types: dict[str, Any] = {}
    outcomes: dict[int, Outcome] = {}
    for i in indexes:
        cell = cells[i]
        for sql_type in (cell.source, cell.target):
            if sql_type not in types:
                types[sql_type] = spark.createDataFrame([], f"x {sql_type}").schema["x"].dataType
        try:
            store_assign(F.col("s.c"), types[cell.source], types[cell.target], policy=policy,  # type: ignore[arg-type]
                         by_name=True, column="c", allow_missing_fields=False)
            outcomes[i] = Outcome("stored", "(analysis accepts)")
        except MergeAnalysisError as exc:
            outcomes[i] = Outcome("refused", exc.error_class)
    return outcomes


def merge_outcomes(
    spark: Any, root: Path, policy: str, cells: Sequence[Cell], view: str, expected: Sequence[Outcome],
) -> tuple[list[Outcome], list[str]]:
    """What the merge does with each cell, and the problems seen beyond the outcome itself.

    Cells the reference refuses are checked against the job's analysis rule (``store_assign``), and a
    sample covering every source and target type of them runs through ``run_merge`` as well (each
    run_merge that analysis refuses costs about 50 ms: all of them would double the suite's time).
    """
    refused = [i for i, o in enumerate(expected) if o.kind == "refused"]
    outcomes = _analysis_outcomes(spark, policy, cells, refused)
    alone = _covering_sample(cells, refused) + [i for i, o in enumerate(expected) if o.kind == "failed"]
    merged, problems = _one_at_a_time(spark, root, policy, cells, view, alone, expected)
    for i, outcome in merged.items():
        if i in outcomes and outcomes[i] != outcome:
            problems.append(f"{cells[i]}: run_merge {outcome}, but store_assign {outcomes[i]}")
        outcomes[i] = outcome
    batch = [i for i, o in enumerate(expected) if o.kind == "stored"]
    attempt = 0
    while batch:
        attempt += 1
        target = make_target(spark, root / f"batch_{attempt}", [(f"c{i}", cells[i].target) for i in batch])
        query = f"SELECT id, {', '.join(f'c{i}' for i in batch)} FROM {view}"
        try:
            metrics = _merge(spark, target, query, _batch_sql([(i, cells[i]) for i in batch]), policy)
        except MergeJobError as exc:  # the merge does not store a cell the reference stores: which one?
            named = _named_column(exc, "c")
            if named not in batch:
                raise
            kinds = {MergeAnalysisError: "refused", CastFailureError: "failed"}
            outcomes[named] = Outcome(kinds.get(type(exc), type(exc).__name__), exc.error_class)
            batch.remove(named)
            continue
        assert table_version(target) == 1
        assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (ROWS, ROWS)
        stored = _columns(read_table(target), ["id", *(f"c{i}" for i in batch)])
        assert stored["id"] == list(range(1, 2 * ROWS + 1))
        for i in batch:
            values = stored[f"c{i}"]
            outcomes[i] = Outcome("stored", (values[:ROWS], values[ROWS:]))
        break
    return [outcomes[i] for i in range(len(cells))], problems


def _named_column(exc: Any, prefix: str) -> int | None:
    """The cell whose column the job's error names."""
    match = re.search(rf"\b{prefix}(\d+)\b", str(exc))
    return int(match.group(1)) if match else None


def _matches(cell: Cell, reference_outcome: Outcome, merge_outcome: Outcome) -> bool:
    if reference_outcome.kind != merge_outcome.kind:
        return False
    if reference_outcome.kind == "stored":
        return bool(merge_outcome.detail == (reference_outcome.detail, reference_outcome.detail))
    expected_class = reference_outcome.detail
    integral_or_decimal = re.search(r"\b(TINYINT|SMALLINT|INT|BIGINT|DECIMAL)\b", cell.target) is not None
    if integral_or_decimal and str(expected_class).startswith(OVERFLOW_CLASSES):
        expected_class = "DELTA_CAST_OVERFLOW_IN_TABLE_WRITE"
    return bool(merge_outcome.detail == expected_class)


def check_against_insert_into(spark: Any, root: Path, policy: str, cells: Sequence[Cell]) -> dict[str, int]:
    """Run both sides; fail listing every cell where the merge does not do what INSERT INTO does."""
    view = _source_view(spark, cells)
    try:
        expected = reference(spark, root / "reference", policy, cells, view)
        actual, problems = merge_outcomes(spark, root / "merge", policy, cells, view, expected)
    finally:
        spark.catalog.dropTempView(view)
    mismatches = [
        f"{cell}: INSERT INTO {ref}; MERGE {got}"
        for cell, ref, got in zip(cells, expected, actual, strict=True) if not _matches(cell, ref, got)
    ]
    summary = f"{policy}: {len(mismatches)} of {len(cells)} cells differ from INSERT INTO"
    assert not mismatches + problems, "\n".join([summary, *mismatches, *problems])
    counts: dict[str, int] = {}
    for outcome in expected:
        counts[outcome.kind] = counts.get(outcome.kind, 0) + 1
    return counts


@pytest.mark.parametrize("policy", POLICIES)
def test_type_matrix_matches_insert_into(spark: Any, tmp_path: Path, policy: str) -> None:
    counts = check_against_insert_into(spark, tmp_path, policy, MATRIX_CELLS)

    # The matrix exercises both refusals and stored values under every policy (and fails nowhere).
    assert sum(counts.values()) == len(TYPES) ** 2 + len(STRUCT_PAIRS)
    assert counts["refused"] > 0
    assert counts["stored"] > 0
    assert "failed" not in counts


@pytest.mark.parametrize("policy", POLICIES)
def test_values_that_fail_at_run_time_match_insert_into(spark: Any, tmp_path: Path, policy: str) -> None:
    counts = check_against_insert_into(spark, tmp_path, policy, RUNTIME_CELLS)

    # ANSI: every value is malformed or overflows; STRICT refuses every pair; LEGACY stores every value
    # (NULL for what does not parse or fit, wrapped integers).
    expected = {"ANSI": "failed", "STRICT": "refused", "LEGACY": "stored"}[policy]
    assert counts == {expected: len(RUNTIME_CELLS)}


@pytest.mark.parametrize("target_type", ["BOOLEAN", "INT"])
def test_strict_refuses_a_string_for_a_boolean_or_int_column(
    spark: Any, tmp_path: Path, target_type: str
) -> None:
    # These were cast and written under STRICT; INSERT INTO refuses them (the matrix has the cells).
    target = make_target(spark, tmp_path / "t", [("c", target_type)])
    before = _state(target)
    sql = _one_cell_sql(Cell("STRING", target_type, ()), update=True, insert=True)

    with pytest.raises(MergeAnalysisError) as raised:
        _merge(spark, target, "SELECT * FROM VALUES (1L, 'true'), (9L, '1') AS v(id, c)", sql, "STRICT")

    # Delta 4.4's MERGE refuses them so (its class checked against Delta's own MERGE in
    # test_the_store_assignment_classes_are_delta_s).
    assert raised.value.error_class == "CANNOT_UP_CAST_DATATYPE"
    assert f'Cannot up cast `c` from "STRING" to "{target_type}".' in str(raised.value)
    assert _state(target) == before
    assert table_version(target) == 0


# (policy, source type, target type, source values): a cell of each kind the matrix has, through Delta's own
# MERGE (delta-spark 4.4) beside the job's, on copies of one table.
DELTA_CELLS = [
    ("ANSI", "STRING", "INT", ["12", "abc"]), ("ANSI", "BIGINT", "INT", [1, 3000000000]),
    ("ANSI", "STRING", "BOOLEAN", ["true", "x"]), ("ANSI", "TIMESTAMP", "DATE", ["2024-01-02 03:04:05"]),
    ("STRICT", "STRING", "INT", ["12"]), ("STRICT", "BIGINT", "INT", [1]), ("STRICT", "INT", "BIGINT", [5]),
    ("LEGACY", "STRING", "INT", ["12", "abc"]), ("LEGACY", "BIGINT", "INT", [1, 3000000000]),
]  # fmt: skip


@pytest.mark.parametrize(("policy", "source", "target", "values"), DELTA_CELLS,
                         ids=[f"{p}-{s}-{t}" for p, s, t, _ in DELTA_CELLS])  # fmt: skip
def test_the_store_assignment_classes_are_delta_s(
    spark: Any, tmp_path: Path, policy: str, source: str, target: str, values: list[Any]
) -> None:
    """Delta refuses, fails or stores as the job does: the same error class, or the same values."""
    import shutil

    from spark_jobs.delta_merge.errors import MergeJobError
    from tests.support.delta_reader import read_rows
    from tests.support.delta_reference import delta_scenario_outcome
    from tests.support.scenario_harness import create_target, dataframe, merge_spec, multiset

    scenario = {
        "id": "cell", "target_schema": f"key INT, value {target}", "target_partition_by": [],
        "target_rows": [[i, None] for i in range(len(values))], "source_schema": f"key INT, value {source}",
        "source_rows": [[i, v] for i, v in enumerate(values)],
        "conf": {"spark.sql.storeAssignmentPolicy": policy},
        "merge_sql": "MERGE INTO target t USING source s ON t.key = s.key "
                     "WHEN MATCHED THEN UPDATE SET value = s.value",
    }  # fmt: skip
    create_target(spark, tmp_path / "job", scenario)
    shutil.copytree(tmp_path / "job", tmp_path / "delta")
    delta = delta_scenario_outcome(spark, tmp_path / "delta", scenario)
    view = f"cell_{uuid.uuid4().hex[:8]}"
    dataframe(spark, scenario["source_schema"], scenario["source_rows"]).createOrReplaceTempView(view)
    try:
        if "error" in delta:
            with pytest.raises(MergeJobError) as raised:
                run_merge(spark, merge_spec(scenario, tmp_path / "job", view))
            assert raised.value.error_class in delta["error"][0]
            assert table_version(tmp_path / "job") == delta["version"] == 0
        else:
            run_merge(spark, merge_spec(scenario, tmp_path / "job", view))
            assert multiset(read_rows(tmp_path / "job")) == delta["rows"]
    finally:
        spark.catalog.dropTempView(view)
