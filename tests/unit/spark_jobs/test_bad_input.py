"""Malformed inputs: each fails with a specific error and message, and leaves the target as it was.

"As it was": the same commit files in ``_delta_log/`` and no file added, removed or resized anywhere under
the table root. Inputs refused by spec validation need no JVM; the others run through ``run_merge``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.errors import (
    ConstraintViolationError,
    ExpectationFailedError,
    MergeAnalysisError,
    MergeJobError,
    MergeSpecError,
    MultipleSourceRowMatchesError,
    UnsupportedTableFeatureError,
)
from spark_jobs.delta_merge.spec import MergeSpec

KV = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("v", pa.string())])
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
ON = "MERGE INTO t USING s ON t.id = s.id "


def kv(rows: Sequence[Sequence[Any]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(KV.names, r, strict=True)) for r in rows], schema=KV)


def make_target(root: Path, **write_options: Any) -> Path:
    target = root / "t"
    write_deltalake(str(target), kv([(1, 1, "a"), (2, 2, "b")]), **write_options)
    return target


def make_source(root: Path, table: pa.Table | None = None, *, name: str = "part-0.parquet") -> Path:
    source = root / "s"
    source.mkdir(exist_ok=True)
    pq.write_table(kv([(2, 20, "B"), (3, 30, "c")]) if table is None else table, source / name)
    return source


def spec(
    target: Path | str, source: Path | Mapping[str, Any], sql: str = UPSERT, **extra: Any
) -> dict[str, Any]:
    source_spec = {"uri": str(source)} if isinstance(source, Path) else dict(source)
    return {"target": {"uri": str(target)}, "source": source_spec, "merge_sql": sql, **extra}


def state(root: Path) -> dict[str, int]:
    """Every file and directory under the root (recursively), with file sizes."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")}


def check_refused(
    call: Callable[[], object], target: Path, error: type[Exception], fragments: Sequence[str]
) -> None:
    before = state(target)
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert state(target) == before, "the target changed"


# -- refused by spec validation (no JVM) -------------------------------------------------------------------
def _sql(sql: str) -> Callable[[str, str], dict[str, Any]]:
    return lambda t, s: spec(t, Path(s), sql)


def _with(**extra: Any) -> Callable[[str, str], dict[str, Any]]:
    return lambda t, s: spec(t, Path(s), ON + "WHEN MATCHED THEN DELETE", **extra)


SPEC_CASES = [
    ("bad-sql", _sql(ON + "WHEN MATCHED THEN UPDATE SET v = 1 +"),
     "expected an operand after '+' in the value of SET v"),
    ("not-a-merge", _sql("DELETE FROM t WHERE id = 1"), "expected a MERGE INTO statement, found 'DELETE"),
    ("select", _sql("SELECT * FROM t"), "expected a MERGE INTO statement, found 'SELECT * FROM t'"),
    ("no-when-clause", _sql("MERGE INTO t USING s ON t.id = s.id"), "There must be at least one WHEN clause"),
    ("semicolon-injection", _sql(ON + "WHEN MATCHED AND 1=1; DROP TABLE x THEN DELETE"),
     "expected a single statement or expression, found ';'"),
    ("semicolon-in-on", _sql("MERGE INTO t USING s ON t.id = s.id; DROP TABLE x"), "found ';'"),
    ("reflect", _sql(ON + "WHEN MATCHED THEN UPDATE SET v = reflect('java.lang.Runtime','exec','rm -rf /')"),
     "found reflect(), which calls arbitrary Java methods"),
    ("java-method", _sql(ON + "WHEN MATCHED AND java_method('java.lang.System', 'exit', 0) = 1 THEN DELETE"),
     "found java_method(), which calls arbitrary Java methods"),
    ("subquery", _sql(ON + "WHEN MATCHED THEN UPDATE SET v = (SELECT max(v) FROM s)"),
     "Subqueries are not supported in the assignments of MERGE operation"),
    ("exists-subquery", _sql(ON + "WHEN MATCHED AND EXISTS (SELECT 1 FROM other) THEN DELETE"),
     "Subqueries are not supported"),
    ("env-variable", _sql(ON + "WHEN MATCHED THEN UPDATE SET v = '${env:HOME}'"),
     "expected no '${' in SQL text"),
    ("comment", _sql(ON + "WHEN MATCHED AND s.v = 'x' -- THEN DELETE\n THEN DELETE"), "expected no comments"),
    ("udf", _sql(ON + "WHEN MATCHED THEN UPDATE SET v = my_udf(s.v)"),
     "found my_udf(), which is not a Spark SQL"),
    ("insert-count-mismatch", _sql(ON + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id)"),
     "expected as many INSERT values as columns, found 2 columns and 1 values"),
    ("set-twice", _sql(ON + "WHEN MATCHED THEN UPDATE SET v = s.v, v = 'x'"),
     "There is a conflict from these SET columns: [`v`, `v`]"),
    ("insert-column-twice", _sql(ON + "WHEN NOT MATCHED THEN INSERT (id, id) VALUES (s.id, s.id)"),
     "Duplicate column names in INSERT clause"),
    ("nmbs-insert", _sql(ON + "WHEN NOT MATCHED BY SOURCE THEN INSERT *"),
     "expected UPDATE or DELETE after WHEN NOT MATCHED BY SOURCE ... THEN, found 'INSERT *'"),
    ("window-in-set", _sql(ON + "WHEN MATCHED THEN UPDATE SET v = row_number() OVER (ORDER BY s.id)"),
     "found window, aggregate or generator functions in the assignments"),
    ("aggregate-in-condition", _sql(ON + "WHEN MATCHED AND max(s.n) > 1 THEN DELETE"),
     "Aggregate functions are not supported"),
    ("non-deterministic-on",
     _sql("MERGE INTO t USING s ON t.id = s.id AND rand() > 0.5 WHEN MATCHED THEN DELETE"),
     "Non-deterministic functions are not supported in the search condition"),
    ("unconditional-matched-not-last",
     _sql(ON + "WHEN MATCHED THEN DELETE WHEN MATCHED AND s.v = 'x' THEN UPDATE SET v = s.v"),
     "only the last MATCHED clause can omit the condition"),
    ("storage-option-type",
     lambda t, s: {**spec(t, Path(s)), "target": {"uri": t, "storage_options": {"AWS_REGION": 3}}},
     "target.storage_options.AWS_REGION: expected a string value"),
    ("unknown-spec-key", _with(bogus=1), "spec: unknown key 'bogus'; expected keys among"),
    ("unknown-option", _with(options={"nope": True}),
     "options: unknown option 'nope'; expected options among"),
    ("misspelled-option", _with(options={"schema_evoluton": True}),
     "options: unknown option 'schema_evoluton'; did you mean 'schema_evolution'?"),
    ("option-wrong-type", _with(options={"dry_run": "yes"}),
     "options.dry_run: expected true or false, found 'yes'"),
    ("target-wrong-type", lambda t, s: {**spec(t, Path(s)), "target": [t]}, "target: expected a JSON object"),
    ("empty-uri", lambda t, s: spec("", Path(s)), "target.uri: expected a non-empty path or URI, found ''"),
    ("materialize-source", _with(options={"materialize_source": "sometimes"}),
     "options.materialize_source: expected one of auto, all, none, found 'sometimes'"),
    ("storage-level", _with(options={"materialize_storage_level": "NONE"}),
     "options.materialize_storage_level: expected one of DISK_ONLY"),
    ("shuffle-partitions", _with(options={"shuffle_partitions": 0}),
     "options.shuffle_partitions: expected an integer >= 1"),
    ("sql-and-structural", _with(condition="t.id = s.id"),
     "expected either merge_sql or the structural form"),
    ("source-uri-and-query", lambda t, s: spec(t, {"uri": s, "query": "SELECT 1"}),
     "source: expected exactly one of uri and query, found both"),
    ("source-not-a-query", lambda t, s: spec(t, {"query": "DROP TABLE x"}), "source.query: expected a query"),
    ("source-unknown-format", lambda t, s: spec(t, {"uri": s, "format": "avro"}),
     "source.format: expected one of"),
    ("app-id-without-version", _with(run={"app_id": "dag.task"}),
     "expected app_id and app_version or neither"),
    ("expected-metrics-comparator", _with(expected_metrics={"numTargetRowsDeleted": {"roughly": 1}}),
     "expected_metrics.numTargetRowsDeleted: expected one of equal_to"),
]


@pytest.mark.parametrize(("build", "fragment"), [pytest.param(b, f, id=i) for i, b, f in SPEC_CASES])
def test_refused_by_spec_validation(
    tmp_path: Path, build: Callable[[str, str], dict[str, Any]], fragment: str
) -> None:
    target, source = make_target(tmp_path), make_source(tmp_path)
    check_refused(lambda: MergeSpec.from_dict(build(str(target), str(source))).validate(), target,
                  MergeSpecError, [fragment])


# -- refused by run_merge ----------------------------------------------------------------------------------
RUN_CASES: list[Any] = []


def case(error: type[Exception], *fragments: str, marks: Any = ()) -> Callable[[Any], Any]:
    def register(setup: Callable[[Path], tuple[Path, dict[str, Any]]]) -> Callable[[Path], Any]:
        name = setup.__name__.replace("_", "-")
        RUN_CASES.append(pytest.param(setup, error, fragments, id=name, marks=marks))
        return setup

    return register


@case(MergeAnalysisError, "does not exist")
def missing_target(root: Path) -> tuple[Path, dict[str, Any]]:
    return root / "nowhere", spec(root / "nowhere", make_source(root))


@case(MergeAnalysisError, "is not a Delta table. No _delta_log/ found")
def plain_parquet_directory(root: Path) -> tuple[Path, dict[str, Any]]:
    plain = root / "plain"
    plain.mkdir()
    pq.write_table(kv([(1, 1, "a")]), plain / "part-0.parquet")
    return plain, spec(plain, make_source(root))


@case(MergeAnalysisError, "Cannot read the Delta log of target", "Json error")
def corrupt_latest_commit(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    write_deltalake(str(target), kv([(9, 9, "z")]), mode="append")
    (target / "_delta_log" / f"{1:020d}.json").write_text('{"add": garbage\n')
    return target, spec(target, make_source(root))


@case(MergeAnalysisError, "is not a Delta table. No commits found in _delta_log/")
def empty_delta_log(root: Path) -> tuple[Path, dict[str, Any]]:
    target = root / "t"
    (target / "_delta_log").mkdir(parents=True)
    return target, spec(target, make_source(root))


@case(MergeAnalysisError, "Cannot read the source", "as parquet")
def missing_source(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, root / "no-source")


@case(MergeAnalysisError, "cannot resolve `s`.`id` in search condition given columns s._corrupt_record")
def parquet_source_read_as_json(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, {"uri": str(make_source(root)), "format": "json"})


@case(MergeAnalysisError, "Cannot read the source")
def csv_source_read_as_parquet(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    source = root / "s"
    source.mkdir()
    (source / "part-0.csv").write_text("id,n,v\n2,20,B\n")
    return target, spec(target, source)


@case(MergeAnalysisError, "source.query does not analyze", "no_such_view")
def source_query_of_an_unknown_view(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, {"query": "SELECT id, n, v FROM no_such_view"})


@case(MergeAnalysisError, "Cannot read the Delta source (source.uri)", "has no version 7")
def delta_source_version_beyond_latest(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    source = root / "src"
    write_deltalake(str(source), kv([(2, 20, "B")]))
    return target, spec(target, {"uri": str(source), "format": "delta", "version": 7})


@case(MergeAnalysisError, "cannot resolve `s`.`nope` in search condition")
def unknown_column_in_on(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    sql = "MERGE INTO t USING s ON t.id = s.nope WHEN MATCHED THEN DELETE"
    return target, spec(target, make_source(root), sql)


@case(MergeAnalysisError, "cannot resolve nope in UPDATE clause given columns t.id, t.n, t.v")
def unknown_target_column_in_set(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, make_source(root), ON + "WHEN MATCHED THEN UPDATE SET nope = s.v")


@case(MergeAnalysisError, "cannot resolve `s`.`nope` in UPDATE clause")
def unknown_column_in_set_value(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, make_source(root), ON + "WHEN MATCHED THEN UPDATE SET v = s.nope")


@case(MergeAnalysisError, "cannot resolve", "nope", "in INSERT clause")
def unknown_column_in_insert_values(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    sql = ON + "WHEN NOT MATCHED THEN INSERT (id, n, v) VALUES (s.id, s.n, s.nope)"
    return target, spec(target, make_source(root), sql)


@case(MergeAnalysisError, "cannot resolve", "nope", "in DELETE condition")
def unknown_column_in_clause_condition(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, make_source(root), ON + "WHEN MATCHED AND s.nope > 1 THEN DELETE")


@case(MergeJobError, "CAST_INVALID_INPUT", "'abc'", '"INT"')
def string_that_is_no_int(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    rows = pa.table({"id": pa.array([2, 3], pa.int64()), "n": ["7", "abc"], "v": ["B", "c"]})
    return target, spec(target, make_source(root, rows))


@case(MergeJobError, "overflow", "`n`")
def double_overflowing_int(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    rows = pa.table({"id": pa.array([3], pa.int64()), "n": pa.array([1e20]), "v": ["c"]})
    return target, spec(target, make_source(root, rows))


@case(MergeJobError, "ARITHMETIC_OVERFLOW")
def arithmetic_overflow_in_set(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, make_source(root), ON + "WHEN MATCHED THEN UPDATE SET n = t.n + 2147483647")


@case(MergeJobError, "DIVIDE_BY_ZERO")
def division_by_zero_in_set(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, make_source(root), ON + "WHEN MATCHED THEN UPDATE SET n = t.n / (s.n - 20)")


@case(MultipleSourceRowMatchesError, "multiple source rows matched and attempted to modify the same target")
def duplicate_matches(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    return target, spec(target, make_source(root, kv([(2, 20, "B"), (2, 21, "BB")])))


@case(ExpectationFailedError, "numTargetRowsInserted")
def expectation_not_met_in_a_dry_run(root: Path) -> tuple[Path, dict[str, Any]]:
    # A dry run: a real run would have written its files (orphans) before checking the expectations.
    target = make_target(root)
    expected = {"numTargetRowsInserted": {"equal_to": 5}}
    return target, spec(target, make_source(root), expected_metrics=expected, options={"dry_run": True})


@case(ConstraintViolationError, "CHECK constraint n_small n < 25 violated by row with values:\n - n : 30")
def check_constraint_violated(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root)
    DeltaTable(str(target)).alter.add_constraint({"n_small": "n < 25"})
    return target, spec(target, make_source(root))


@case(ConstraintViolationError, "NOT NULL constraint violated for column: n.")
def not_null_violated(root: Path) -> tuple[Path, dict[str, Any]]:
    target = root / "t"
    schema = pa.schema([("id", pa.int64()), pa.field("n", pa.int32(), nullable=False), ("v", pa.string())])
    write_deltalake(str(target), kv([(1, 1, "a")]).cast(schema))
    sql = ON + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
    return target, spec(target, make_source(root), sql)


@case(UnsupportedTableFeatureError, "icebergCompatV1: IcebergCompatV1's rules (no arrays or maps")
def iceberg_compatible_v1_table(root: Path) -> tuple[Path, dict[str, Any]]:
    target = root / "t"
    write_deltalake(str(target), kv([(1, 1, "a"), (2, 2, "b"), (4, 4, "b")]), partition_by=["v"])
    _commit_protocol(target, writer_features=["icebergCompatV1"])
    return target, spec(target, make_source(root), ON + "WHEN MATCHED THEN UPDATE SET n = s.n")


@case(UnsupportedTableFeatureError, "appendOnly (delta.appendOnly=true): this merge updates or deletes rows")
def append_only_table_with_an_update(root: Path) -> tuple[Path, dict[str, Any]]:
    target = make_target(root, configuration={"delta.appendOnly": "true"})
    return target, spec(target, make_source(root))
@pytest.mark.parametrize(("setup", "error", "fragments"), RUN_CASES)
def test_refused_by_run_merge(
    spark: Any, tmp_path: Path, setup: Callable[[Path], tuple[Path, dict[str, Any]]],
    error: type[Exception], fragments: Sequence[str],
) -> None:
    target, merge_spec = setup(tmp_path)
    check_refused(lambda: run_merge(spark, merge_spec), target, error, fragments)


def test_the_catalogue_is_large_enough() -> None:
    assert len(SPEC_CASES) + len(RUN_CASES) >= 30
    assert len({i for i, _, _ in SPEC_CASES}) == len(SPEC_CASES)


# -- helpers -----------------------------------------------------------------------------------------------
def _commit_protocol(target: Path, *, writer_features: list[str]) -> None:
    """Commit, by hand, a protocol with writer features deltalake cannot create tables with."""
    protocol = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": writer_features}
    actions = [{"commitInfo": {"operation": "UPGRADE PROTOCOL"}}, {"protocol": protocol}]
    (target / "_delta_log" / f"{1:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
