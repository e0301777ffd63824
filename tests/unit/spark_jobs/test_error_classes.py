"""Every error class the job raises, each triggered for real: Delta's (or Spark's) class and message text.

``ROWS`` is the list users can search: (error class, how to trigger it, the text Delta or Spark gives for
it). Statement rules need no JVM (``MergeSpec.validate``), the commit and table-feature rules only
deltalake; the rest run a tiny merge on the shared SparkSession. ``test_every_error_class_in_the_job_
has_a_row`` keeps the list complete: any class the job's source names must have a row here.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge.commit import serializable
from spark_jobs.delta_merge.commit.actions import attempt_commit, plan_commit
from spark_jobs.delta_merge.commit.conflicts import ReadSet, check_winning_commit
from spark_jobs.delta_merge.commit.serializable import commit_serializably
from spark_jobs.delta_merge.errors import MergeJobError
from spark_jobs.delta_merge.protocol.delta_schema import spark_schema_from_delta
from spark_jobs.delta_merge.protocol.files import WrittenFile
from spark_jobs.delta_merge.protocol.snapshot import TableProtocol, TargetSnapshot, load_snapshot
from spark_jobs.delta_merge.protocol.table_features import check_writable, table_constraints
from spark_jobs.delta_merge.spec import MergeSpec
from tests.support.error_classes import error_classes_named_in

ROOT = Path(__file__).resolve().parents[3]
JOB_SOURCE = ROOT / "spark_jobs"

ON = "MERGE INTO t USING s ON t.id = s.id "
UPSERT = ON + "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
KV = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("v", pa.string())])


@dataclass(frozen=True)
class Context:
    """What a trigger may use: a fresh directory, monkeypatch, and the shared SparkSession (Spark rows)."""

    root: Path
    monkeypatch: pytest.MonkeyPatch
    spark: Any


@dataclass(frozen=True)
class Row:
    """One error class: how to make the job raise it, and the fixed parts of Delta's (or Spark's) text."""

    error_class: str
    trigger: Callable[[Context], object]
    texts: tuple[str, ...]
    spark: bool = False


# -- statements (no JVM) -----------------------------------------------------------------------------------
def _validate(sql: str) -> Callable[[Context], object]:
    def trigger(_: Context) -> object:
        spec = {"target": {"uri": "/data/t"}, "source": {"uri": "/data/s"}, "merge_sql": sql}
        return MergeSpec.from_dict(spec).validate()

    return trigger


def _validate_clauses(clauses: list[dict[str, str]]) -> Callable[[Context], object]:
    def trigger(_: Context) -> object:
        spec = {"target": {"uri": "/data/t"}, "source": {"uri": "/data/s"}, "condition": "t.id = s.id",
                "target_alias": "t", "source_alias": "s", "clauses": clauses}
        return MergeSpec.from_dict(spec).validate()

    return trigger


# -- conflicts with concurrent commits (pure: the winning commit's actions are given) ------------------------
READ = ReadSet(
    # The removed file left out of what was read: Delta checks removes against reads first.
    whole_table=False, read_paths={"p=a/read.parquet": {"p": "a"}},
    removed_paths={"p=a/removed.parquet": {"p": "a"}}, app_id="dag.task", app_version=3, token="ours",
    table="s3://lake/t",
)


def _winning(*actions: dict[str, Any], partitioned: bool = True) -> Callable[[Context], object]:
    def trigger(_: Context) -> object:
        commit = [{"commitInfo": {"operation": "WRITE"}}, *actions]
        read = dataclasses.replace(READ, partitioned=partitioned)
        return check_winning_commit(7, commit, read, matches_read=lambda files: files)

    return trigger


def _remove(path: str) -> dict[str, Any]:
    return {"remove": {"path": path, "dataChange": True, "deletionTimestamp": 0}}


# -- commits (deltalake, no JVM) -----------------------------------------------------------------------------
def _partitioned_table(root: Path) -> TargetSnapshot:
    write_deltalake(root, pa.table({"id": pa.array([1, 2], pa.int64()), "p": ["a", "b"]}), partition_by=["p"])
    return load_snapshot(str(root))


def _new_file(root: Path) -> WrittenFile:
    path = f"p=a/part-{uuid.uuid4()}.parquet"
    pq.write_table(pa.table({"id": pa.array([3], pa.int64())}), root / path)
    stats = {"numRecords": 1, "minValues": {"id": 3}, "maxValues": {"id": 3}, "nullCount": {"id": 0}}
    return WrittenFile(path=path, size=(root / path).stat().st_size, partition_values={"p": "a"},
                       stats_json=json.dumps(stats), num_records=1, modification_time=1_700_000_000_000)


def _plan_kwargs(root: Path) -> dict[str, Any]:
    return {"removes": [], "adds": [_new_file(root)], "new_schema": None, "operation_parameters": {},
            "operation_metrics": {}, "app_transaction": None, "commit_metadata": {}}


def _append_elsewhere(root: Path) -> None:
    write_deltalake(root, pa.table({"id": pa.array([9], pa.int64()), "p": ["b"]}), mode="append")


def stale_compare_and_swap(ctx: Context) -> object:
    snapshot = _partitioned_table(ctx.root)
    plan = plan_commit(snapshot, **_plan_kwargs(ctx.root))
    _append_elsewhere(ctx.root)
    return attempt_commit(plan, base_version=0)


def swap_lost_every_time(ctx: Context) -> object:
    snapshot = _partitioned_table(ctx.root)
    plan = plan_commit(snapshot, **_plan_kwargs(ctx.root))
    real = serializable.attempt_commit

    def another_writer_first(*args: Any, **kwargs: Any) -> int:
        _append_elsewhere(ctx.root)  # lands between the check and the swap
        return real(*args, **kwargs)

    ctx.monkeypatch.setattr(serializable, "attempt_commit", another_writer_first)
    read = ReadSet(whole_table=False, read_paths=frozenset(), removed_paths=frozenset(), app_id=None,
                   app_version=None, token=plan.token)
    return commit_serializably(plan, read, matches_read=lambda files: False, max_attempts=2,
                               sleep=lambda seconds: None)


def invalid_isolation_level(ctx: Context) -> object:
    snapshot = _partitioned_table(ctx.root)
    return plan_commit(snapshot, **_plan_kwargs(ctx.root), isolation_level="Chaos")


# -- the target table ----------------------------------------------------------------------------------------
def not_a_delta_table(ctx: Context) -> object:
    pq.write_table(pa.table({"id": [1]}), ctx.root / "part-0.parquet")
    return load_snapshot(str(ctx.root))


def _refusal(*, removes_files: bool = True, **write_options: Any) -> Callable[[Context], object]:
    def trigger(ctx: Context) -> object:
        write_deltalake(ctx.root, pa.table({"id": pa.array([1], pa.int64())}), **write_options)
        snapshot = load_snapshot(str(ctx.root))
        return check_writable(snapshot, removes_files=removes_files)

    return trigger


def _snapshot(fields: Sequence[Mapping[str, Any]], protocol: TableProtocol) -> TargetSnapshot:
    schema_json = json.dumps({"type": "struct", "fields": list(fields)})
    return TargetSnapshot(
        table_uri="file:///data/t", version=3, schema=spark_schema_from_delta(schema_json),
        schema_json=schema_json, partition_columns=(), configuration={}, protocol=protocol,
        metadata_id="m", files=(),
    )


def unknown_write_feature(_: Context) -> object:
    field = {"name": "id", "type": "long", "nullable": True, "metadata": {}}
    features = frozenset({"someFutureFeature"})
    return check_writable(_snapshot([field], TableProtocol(3, 7, features, features)), removes_files=True)


def iceberg_compat_with_deletion_vectors(_: Context) -> object:
    mapping = {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-1"}
    field = {"name": "id", "type": "long", "nullable": True, "metadata": mapping}
    features = frozenset({"icebergCompatV2", "columnMapping", "deletionVectors"})
    snapshot = dataclasses.replace(
        _snapshot([field], TableProtocol(3, 7, features, features)),
        configuration={"delta.enableIcebergCompatV2": "true", "delta.columnMapping.mode": "name",
                       "delta.enableDeletionVectors": "true"},
    )  # fmt: skip
    return check_writable(snapshot, removes_files=True)


def iceberg_compat_unsupported_type(_: Context) -> object:
    from pyspark.sql.types import LongType, StructField, StructType, VariantType

    from spark_jobs.delta_merge.protocol.iceberg_compat import check_iceberg_compat_schema

    schema = StructType([StructField("id", LongType()), StructField("j", VariantType())])
    return check_iceberg_compat_schema(schema, table_uri="file:///data/t")


def protocol_too_new(_: Context) -> object:
    field = {"name": "id", "type": "long", "nullable": True, "metadata": {}}
    snapshot = _snapshot([field], TableProtocol(4, 8))
    return check_writable(snapshot, removes_files=True)


def unrecognized_invariant(_: Context) -> object:
    field = {"name": "q", "type": "long", "nullable": True, "metadata": {"delta.invariants": "not json"}}
    return table_constraints(_snapshot([field], TableProtocol(1, 2)))


# -- merges (Spark) ------------------------------------------------------------------------------------------
def _merge(
    sql: str, source: pa.Table, *, target: pa.Table | None = None,
    constraints: Mapping[str, str] | None = None, source_query: str | None = None, **options: Any,
) -> Callable[[Context], object]:
    def trigger(ctx: Context) -> object:
        from spark_jobs.delta_merge import run_merge

        target_path, source_path = ctx.root / "t", ctx.root / "s"
        rows = [{"id": 1, "n": 1, "v": "a"}, {"id": 2, "n": 2, "v": "b"}]
        write_deltalake(target_path, pa.Table.from_pylist(rows, schema=KV) if target is None else target)
        if constraints:
            DeltaTable(target_path).alter.add_constraint(dict(constraints))
        source_path.mkdir()
        pq.write_table(source, source_path / "part-0.parquet")
        if source_query is None:
            source_spec: dict[str, Any] = {"uri": str(source_path)}
        else:
            source_spec = {"query": source_query.format(source=source_path)}
        spec = {"target": {"uri": str(target_path)}, "source": source_spec, "merge_sql": sql}
        return run_merge(ctx.spark, {**spec, "options": options})

    return trigger


def _identity_merge(sql: str, source: pa.Table, *, always: bool) -> Callable[[Context], object]:
    """A merge into the usual target whose ``id`` is an identity column (ALWAYS or BY DEFAULT)."""

    def trigger(ctx: Context) -> object:
        from spark_jobs.delta_merge import run_merge
        from tests.support.identity_fixture import make_identity_column

        target_path, source_path = ctx.root / "t", ctx.root / "s"
        write_deltalake(target_path, _kv((1, 1, "a"), (2, 2, "b")))
        make_identity_column(target_path, "id", always=always, high_water_mark=2)
        source_path.mkdir()
        pq.write_table(source, source_path / "part-0.parquet")
        spec = {"target": {"uri": str(target_path)}, "source": {"uri": str(source_path)}, "merge_sql": sql}
        return run_merge(ctx.spark, spec)

    return trigger


def _kv(*rows: tuple[Any, ...], schema: pa.Schema = KV) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)


def _defaults_merge(
    sql: str, defaults: Mapping[str, str], *, not_null: Sequence[str] = ()
) -> Callable[[Context], object]:
    """A merge of one new and one matched row into the usual target, whose columns have ``defaults``."""

    def trigger(ctx: Context) -> object:
        from spark_jobs.delta_merge import run_merge
        from tests.support.table_feature_fixtures import set_column_defaults

        target_path, source_path = ctx.root / "t", ctx.root / "s"
        write_deltalake(target_path, _kv((1, 1, "a"), (2, 2, "b")))
        set_column_defaults(target_path, defaults, not_null=not_null)
        source_path.mkdir()
        pq.write_table(_kv((2, 20, "B"), (3, 30, "c")), source_path / "part-0.parquet")
        spec = {"target": {"uri": str(target_path)}, "source": {"uri": str(source_path)}, "merge_sql": sql}
        return run_merge(ctx.spark, spec)

    return trigger


NOT_NULL_N = pa.schema([("id", pa.int64()), pa.field("n", pa.int32(), nullable=False), ("v", pa.string())])
STRUCT_A = pa.schema([("id", pa.int64()), ("st", pa.struct([("a", pa.int32())]))])
STRUCT_AB = pa.schema([("id", pa.int64()), ("st", pa.struct([("a", pa.int32()), ("b", pa.int32())]))])

MULTIPLE_MATCHES = (
    "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row in the "
    "Delta table in possibly conflicting ways. By SQL semantics of Merge, when multiple source rows match on "
    "the same target row, the result may be ambiguous as it is unclear which source row should be used to "
    "update or delete the matching target row. You can preprocess the source table to eliminate the "
    "possibility of multiple matches. Please refer to"
)
CONCURRENCY_DOC = "Refer to https://docs.delta.io/latest/concurrency-control.html for more details."
CONCURRENCY_INFO = "Refer to https://docs.delta.io/latest/concurrency-control.html for more information."

ROWS: list[Row] = [
    # Statement rules (MergeSpec.validate, no JVM).
    Row("DELTA_MERGE_MISSING_WHEN", _validate("MERGE INTO t USING s ON t.id = s.id"),
        ("There must be at least one WHEN clause in a MERGE statement.",)),
    # MERGE text: Spark's parser raises these (Delta runs SQL through it).
    Row("NON_LAST_MATCHED_CLAUSE_OMIT_CONDITION",
        _validate(ON + "WHEN MATCHED THEN DELETE WHEN MATCHED AND s.v > 'a' THEN UPDATE SET *"),
        ("When there are more than one MATCHED clauses in a MERGE statement, only the last MATCHED clause "
         "can omit the condition.",)),
    Row("NON_LAST_NOT_MATCHED_BY_TARGET_CLAUSE_OMIT_CONDITION",
        _validate(ON + "WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED AND s.v > 'a' THEN INSERT *"),
        ("When there are more than one NOT MATCHED [BY TARGET] clauses in a MERGE statement, only the last "
         "NOT MATCHED [BY TARGET] clause can omit the condition.",)),
    Row("NON_LAST_NOT_MATCHED_BY_SOURCE_CLAUSE_OMIT_CONDITION",
        _validate(ON + "WHEN NOT MATCHED BY SOURCE THEN DELETE "
                  "WHEN NOT MATCHED BY SOURCE AND t.v > 'a' THEN DELETE"),
        ("When there are more than one NOT MATCHED BY SOURCE clauses in a MERGE statement, only the last NOT "
         "MATCHED BY SOURCE clause can omit the condition.",)),
    # Clauses given as data: Delta's merge builder raises these.
    Row("DELTA_NON_LAST_MATCHED_CLAUSE_OMIT_CONDITION",
        _validate_clauses([{"when": "matched", "action": "delete"},
                           {"when": "matched", "action": "update_all", "condition": "s.v > 'a'"}]),
        ("When there are more than one MATCHED clauses in a MERGE statement, only the last MATCHED clause "
         "can omit the condition.",)),
    Row("DELTA_NON_LAST_NOT_MATCHED_CLAUSE_OMIT_CONDITION",
        _validate_clauses([{"when": "not_matched", "action": "insert_all"},
                           {"when": "not_matched", "action": "insert_all", "condition": "s.v > 'a'"}]),
        ("When there are more than one NOT MATCHED clauses in a MERGE statement, only the last NOT MATCHED "
         "clause can omit the condition",)),
    Row("DELTA_NON_LAST_NOT_MATCHED_BY_SOURCE_CLAUSE_OMIT_CONDITION",
        _validate_clauses([{"when": "not_matched_by_source", "action": "delete"},
                           {"when": "not_matched_by_source", "action": "delete", "condition": "t.v > 'a'"}]),
        ("When there are more than one NOT MATCHED BY SOURCE clauses in a MERGE statement, only the last NOT "
         "MATCHED BY SOURCE clause can omit the condition.",)),
    Row("DELTA_CONFLICT_SET_COLUMN", _validate(ON + "WHEN MATCHED THEN UPDATE SET v = s.v, v = 'x'"),
        ("There is a conflict from these SET columns: ",)),
    Row("DELTA_DUPLICATE_COLUMNS_ON_INSERT",
        _validate(ON + "WHEN NOT MATCHED THEN INSERT (id, id) VALUES (s.id, s.id)"),
        ("Duplicate column names in INSERT clause",)),
    Row("DELTA_UNSUPPORTED_NESTED_FIELD_IN_OPERATION",
        _validate(ON + "WHEN NOT MATCHED THEN INSERT (st.a) VALUES (1)"),
        ("Nested field is not supported in the ", "(field = ")),
    Row("DELTA_UNSUPPORTED_SUBQUERY",
        _validate(ON + "WHEN MATCHED THEN UPDATE SET v = (SELECT max(v) FROM source)"),
        ("Subqueries are not supported in the ",)),
    # A merge alias names a row, not a relation: Delta 4.4's analyzer fails on it before it looks further.
    Row("TABLE_OR_VIEW_NOT_FOUND",
        _validate(ON + "WHEN MATCHED THEN UPDATE SET v = (SELECT max(v) FROM s)"),
        ("The table or view ", " cannot be found")),
    Row("UNSUPPORTED_EXPR_FOR_OPERATOR",
        _validate(ON + "WHEN MATCHED THEN UPDATE SET n = row_number() OVER (ORDER BY s.n)"),
        ("A query operator contains one or more unsupported expressions.", "Invalid expressions: [")),
    Row("UNSUPPORTED_GENERATOR.OUTSIDE_SELECT",
        _validate(ON + "WHEN MATCHED THEN UPDATE SET n = explode(array(1))"),
        ("Invalid expressions: [",)),
    Row("DELTA_NON_DETERMINISTIC_FUNCTION_NOT_SUPPORTED",
        _validate(ON + "WHEN MATCHED AND rand() > 0.5 THEN DELETE"),
        ("Non-deterministic functions are not supported in the ",)),
    Row("DELTA_AGGREGATION_NOT_SUPPORTED", _validate(ON + "WHEN MATCHED AND max(s.n) > 1 THEN DELETE"),
        ("Aggregate functions are not supported in the ",)),
    Row("PARSE_SYNTAX_ERROR", _validate(ON + "WHEN MATCHED THEN UPDATE SET v = 1 +"),
        ("Syntax error at or near ",)),
    Row("COLUMN_ALIASES_NOT_ALLOWED",
        _validate("MERGE INTO t USING s AS src (a, b) ON t.id = src.a WHEN MATCHED THEN DELETE"),
        ("Column aliases are not allowed in ",)),
    # Conflicts with a commit that landed after the merge read the table (Delta's ConflictChecker).
    # Delta 4.4's words: the winner's operation, the table, its version, and on a partitioned table the
    # partition of the file in question (WITH_PARTITION_HINT).
    Row("DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT",
        _winning({"add": {"path": "p=a/new.parquet", "size": 1, "partitionValues": {"p": "a"},
                          "modificationTime": 0, "dataChange": True}}),
        ("Transaction conflict detected. a concurrent WRITE added data to table delta.`s3://lake/t` "
         "committed at version 7. The concurrent operation modified data in the partition [p=a] that should "
         "have been "
         "read by this operation. Please retry the operation.", CONCURRENCY_INFO)),
    Row("DELTA_CONCURRENT_APPEND.WITHOUT_HINT",
        _winning({"add": {"path": "new.parquet", "size": 1, "partitionValues": {}, "modificationTime": 0,
                          "dataChange": True}}, partitioned=False),
        ("Transaction conflict detected. a concurrent WRITE added data to table delta.`s3://lake/t` "
         "committed at version 7. The concurrent operation modified data that should have been read by this "
         "operation. "
         "Please retry the operation.", CONCURRENCY_INFO)),
    Row("DELTA_CONCURRENT_DELETE_READ.WITH_PARTITION_HINT", _winning(_remove("p=a/read.parquet")),
        ("Transaction conflict detected, a concurrent WRITE deleted data from table delta.`s3://lake/t` "
         "(committed at version 7) that this transaction read. The concurrent operation deleted data in the "
         "partition [p=a] that was read by this operation. Please retry the operation.",
         CONCURRENCY_INFO)),
    Row("DELTA_CONCURRENT_DELETE_READ.WITHOUT_HINT",
        _winning(_remove("p=a/read.parquet"), partitioned=False),
        ("Transaction conflict detected, a concurrent WRITE deleted data from table delta.`s3://lake/t` "
         "(committed at version 7) that this transaction read. The concurrent operation deleted data that "
         "was read by this operation. Please retry the operation.", CONCURRENCY_INFO)),
    Row("DELTA_CONCURRENT_DELETE_DELETE.WITH_PARTITION_HINT", _winning(_remove("p=a/removed.parquet")),
        ("Transaction conflict detected, a concurrent WRITE deleted data from table delta.`s3://lake/t` "
         "(committed at version 7) that this transaction attempted to delete. The concurrent operation "
         "deleted data in the partition [p=a] that was read by this operation.", CONCURRENCY_INFO)),
    Row("DELTA_CONCURRENT_DELETE_DELETE.WITHOUT_HINT",
        _winning(_remove("p=a/removed.parquet"), partitioned=False),
        ("Transaction conflict detected, a concurrent WRITE deleted data from table delta.`s3://lake/t` "
         "(committed at version 7) that this transaction attempted to delete. The concurrent operation "
         "deleted data that was read by this operation.", CONCURRENCY_INFO)),
    Row("DELTA_CONCURRENT_TRANSACTION", _winning({"txn": {"appId": "dag.task", "version": 2}}),
        ("ConcurrentTransactionException: This error occurs when multiple streaming queries are using the "
         "same checkpoint to write into this table. Did you run multiple instances of the same streaming "
         "query at the same time?", CONCURRENCY_DOC)),
    Row("DELTA_METADATA_CHANGED", _winning({"metaData": {"id": "x"}}),
        ("MetadataChangedException: The metadata of the Delta table delta.`s3://lake/t` has been changed "
         "by a concurrent update. Please try the operation again.", CONCURRENCY_DOC)),
    Row("DELTA_PROTOCOL_CHANGED", _winning({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7}}),
        ("ProtocolChangedException: The protocol version of the Delta table has been changed by a concurrent "
         "update.", CONCURRENCY_DOC)),
    # Commits (deltalake).
    Row("DELTA_CONCURRENT_WRITE", stale_compare_and_swap,
        ("ConcurrentWriteException: A concurrent transaction has written new data since the current "
         "transaction read the table. Please try the operation again.", CONCURRENCY_DOC)),
    Row("DELTA_MAX_COMMIT_RETRIES_EXCEEDED", swap_lost_every_time,
        ("This commit has failed as it has been tried 2 times but did not succeed.",
         "This can be caused by the Delta table being committed continuously by many concurrent commits.",
         "Commit started at version: 0", "Commit failed at version: ",
         "Number of actions attempted to commit: 1", "Total time spent attempting this commit: ")),
    Row("DELTA_INVALID_ISOLATION_LEVEL", invalid_isolation_level, ("invalid isolation level 'Chaos'",)),
    # The target table and its features.
    Row("DELTA_MISSING_DELTA_TABLE", not_a_delta_table, (" is not a Delta table.",)),
    Row("DELTA_INVALID_PROTOCOL_VERSION", protocol_too_new,
        ('Unsupported Delta protocol version: table "file:///data/t" requires reader version 4 and writer '
         "version 8, but Delta Lake ", "Please upgrade to a newer release.")),
    Row("DELTA_UNSUPPORTED_FEATURES_FOR_WRITE", unknown_write_feature,
        ("Unsupported Delta write feature: table ", " requires writer table feature(s) that are unsupported "
         "by Delta Lake ", ": someFutureFeature.")),
    Row("DELTA_ICEBERG_COMPAT_VIOLATION", iceberg_compat_with_deletion_vectors,
        ("The validation of IcebergCompatV2 has failed.", "requires deletion vectors to be disabled")),
    Row("DELTA_ICEBERG_COMPAT_VIOLATION.UNSUPPORTED_DATA_TYPE", iceberg_compat_unsupported_type,
        ("The validation of IcebergCompatV2 has failed. IcebergCompatV2 does not support the data type "
         "variant in your schema",)),
    Row("DELTA_CANNOT_MODIFY_APPEND_ONLY", _refusal(configuration={"delta.appendOnly": "true"}),
        ("This table is configured to only allow appends. If you would like to permit updates or deletes, "
         "use 'ALTER TABLE ", " SET TBLPROPERTIES (delta.appendOnly=false)'.")),
    Row("DELTA_UNRECOGNIZED_INVARIANT", unrecognized_invariant,
        ("Unrecognized invariant. Please upgrade your Spark version.",)),
    # Merges: analysis, the data, constraints.
    # Lower case, as Delta's MERGE test suites assert it ("cannot resolve x in UPDATE clause").
    Row("DELTA_MERGE_UNRESOLVED_EXPRESSION", _merge(ON + "WHEN MATCHED AND s.nope > 1 THEN DELETE", _kv()),
        ("cannot resolve ", " given "), spark=True),
    Row("DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE",
        _merge(UPSERT, _kv((2, 20, "B"), (2, 21, "BB"))), (MULTIPLE_MATCHES,), spark=True),
    Row("DELTA_VIOLATE_CONSTRAINT_WITH_VALUES",
        _merge(UPSERT, _kv((3, 30, "c")), constraints={"n_small": "n < 25"}),
        ("CHECK constraint n_small n < 25 violated by row with values:", " - n : 30"), spark=True),
    Row("DELTA_NOT_NULL_CONSTRAINT_VIOLATED",
        _merge(ON + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)", _kv((3, 30, "c")),
               target=_kv((1, 1, "a"), schema=NOT_NULL_N)),
        ("NOT NULL constraint violated for column: n.",), spark=True),
    Row("CAST_INVALID_INPUT",
        _merge(ON + "WHEN MATCHED THEN UPDATE SET n = CAST(s.v AS INT)", _kv((2, 2, "abc"))),
        ("The value 'abc' of the type \"STRING\" cannot be cast to \"INT\" because it is malformed. Correct "
         "the value as per the syntax, or change its target type. Use `try_cast` to tolerate malformed input "
         "and return NULL instead.",), spark=True),
    Row("ARITHMETIC_OVERFLOW",
        _merge(ON + "WHEN MATCHED THEN UPDATE SET n = t.n + 2147483647", _kv((2, 2, "x"))),
        ('to "false" to bypass this error.',), spark=True),
    Row("DIVIDE_BY_ZERO",
        _merge(ON + "WHEN MATCHED THEN UPDATE SET n = t.n / (s.n - 20)", _kv((2, 20, "x"))),
        ("Division by zero. Use `try_divide` to tolerate divisor being 0 and return NULL instead. If "
         "necessary set ",), spark=True),
    Row("DELTA_CAST_OVERFLOW_IN_TABLE_WRITE",
        _merge(UPSERT, pa.table({"id": pa.array([3], pa.int64()), "n": pa.array([1e20]), "v": ["c"]})),
        ("Failed to write a value of ", " type into the ", " type column ", " due to an overflow.",
         "Use `try_cast` on the input value to tolerate overflow and return NULL instead."), spark=True),
    Row("INCOMPATIBLE_DATA_FOR_TABLE.CANNOT_SAFELY_CAST",
        _merge(UPSERT, pa.table({"id": pa.array([3], pa.int64()), "n": [[1, 2]], "v": ["c"]})),
        ("Cannot write incompatible data for the table ", "Cannot safely cast "), spark=True),
    # Delta 4.4's MERGE up-casts under STRICT (Spark's INSERT INTO would say CANNOT_SAFELY_CAST).
    Row("CANNOT_UP_CAST_DATATYPE",
        _merge(UPSERT, pa.table({"id": pa.array([3], pa.int64()), "n": ["7"], "v": ["c"]}),
               store_assignment_policy="STRICT"),
        ("Cannot up cast ", " from ", " to "), spark=True),
    Row("DATATYPE_MISMATCH.CAST_WITHOUT_SUGGESTION",
        _merge(UPSERT, pa.table({"id": pa.array([3], pa.int64()), "n": [[1, 2]], "v": ["c"]}),
               store_assignment_policy="LEGACY"),
        ("Cannot resolve ", " due to data type mismatch:", "cannot cast "), spark=True),
    Row("DELTA_UPDATE_SCHEMA_MISMATCH_EXPRESSION",
        _merge(UPSERT, _kv((1, {"a": 1, "b": 2}), schema=STRUCT_AB),
               target=_kv((1, {"a": 0}), schema=STRUCT_A)),
        ("Cannot cast ", "All nested columns must match."), spark=True),
    Row("DELTA_IDENTITY_COLUMNS_EXPLICIT_INSERT_NOT_SUPPORTED",
        _identity_merge(ON + "WHEN NOT MATCHED THEN INSERT *", _kv((3, 3, "c")), always=True),
        ("Providing values for GENERATED ALWAYS AS IDENTITY column id is not supported.",), spark=True),
    Row("DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED",
        _identity_merge(ON + "WHEN MATCHED THEN UPDATE SET id = s.id + 10", _kv((1, 3, "c")), always=False),
        ("IDENTITY column id cannot be updated.",), spark=True),
    Row("DELTA_MERGE_ADD_VOID_COLUMN",
        _merge(UPSERT, _kv((3, 3, "c")), schema_evolution=True,
               source_query="SELECT *, NULL AS extra FROM parquet.`{source}`"),
        ("Cannot add column ", " with type VOID. Please explicitly specify a non-void type."), spark=True),
    # Schema evolution merges a source type into the target's only by an implicit cast (Delta's
    # mergeSchemas): BOOLEAN has none to INT, whatever the store assignment policy.
    Row("DELTA_FAILED_TO_MERGE_FIELDS",
        _merge(UPSERT, _kv((1, True, "c"), schema=pa.schema([("id", pa.int64()), ("n", pa.bool_()),
                                                              ("v", pa.string())])),
               schema_evolution=True),
        ("Failed to merge fields 'n' and 'n'. Failed to merge incompatible data types IntegerType and "
         "BooleanType",), spark=True),
    Row("NO_DEFAULT_COLUMN_VALUE_AVAILABLE",
        _defaults_merge(ON + "WHEN MATCHED THEN UPDATE SET n = DEFAULT", {"v": "'x'"}, not_null=["n"]),
        ("Can't determine the default value for `n` since it is not nullable and it has no default value.",),
        spark=True),
    Row("DEFAULT_PLACEMENT_INVALID",
        _defaults_merge(ON + "WHEN MATCHED THEN UPDATE SET n = DEFAULT + 1", {"n": "0"}),
        ("A DEFAULT keyword in a MERGE", " command could not be directly assigned to a target column "
         "because it was part of an expression.", "For example: `UPDATE SET c1 = DEFAULT` is allowed, but "
         "`UPDATE T SET c1 = DEFAULT + 1` is not allowed."), spark=True),
    Row("INVALID_DEFAULT_VALUE.DATA_TYPE",
        _defaults_merge(ON + "WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)", {"n": "'abc'"}),
        ("Failed to execute ", " command because the destination column or variable ",
         " has a DEFAULT value ",
         "which requires int type, but the statement provided a value of incompatible string type."),
        spark=True),
    Row("INVALID_DEFAULT_VALUE.NOT_CONSTANT",
        _defaults_merge(ON + "WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)", {"n": "CAST(rand() AS INT)"}),
        ("Failed to execute ", " command because the destination column or variable ",
         " has a DEFAULT value ", "which is not a constant expression whose equivalent value is known at "
         "query planning time."), spark=True),
    Row("INVALID_DEFAULT_VALUE.UNRESOLVED_EXPRESSION",
        _defaults_merge(ON + "WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)", {"n": "id + 1"}),
        ("Failed to execute ", " command because the destination column or variable ",
         " has a DEFAULT value ",
         "which fails to resolve as a valid expression."), spark=True),
]


def _param(row: Row) -> Any:
    return pytest.param(row, id=row.error_class, marks=[pytest.mark.spark] if row.spark else [])


def _normalized(text: str) -> str:
    # Delta's messages are JSON arrays of lines: compare with any run of whitespace as one space.
    return " ".join(text.split())


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_the_job_raises_the_class_with_delta_s_text(
    row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    spark = request.getfixturevalue("spark") if row.spark else None
    with pytest.raises(MergeJobError) as raised:
        row.trigger(Context(tmp_path, monkeypatch, spark))
    error = raised.value
    assert error.error_class == row.error_class, str(error)
    assert str(error).startswith(f"[{row.error_class}] "), str(error)
    message = _normalized(str(error))
    for text in row.texts:
        assert _normalized(text) in message, (text, str(error))


def test_rows_are_unique_and_carry_text() -> None:
    classes = [row.error_class for row in ROWS]
    assert len(classes) == len(set(classes))
    assert all(row.texts and all(row.texts) for row in ROWS)


# -- the list is complete ---------------------------------------------------------------------------------
def test_every_error_class_in_the_job_has_a_row() -> None:
    named = {path.relative_to(ROOT).as_posix(): error_classes_named_in(path.read_text(encoding="utf-8"))
             for path in sorted(JOB_SOURCE.rglob("*.py"))}
    listed = {row.error_class for row in ROWS}
    missing = {f"{cls} ({module})" for module, classes in named.items() for cls in classes - listed}
    assert not missing, f"error classes the job raises without a row in ROWS: {sorted(missing)}"
    # The scan itself finds what it must: a literal, a bound name, a class inside a message.
    everything = set().union(*named.values())
    expected = {"DELTA_MERGE_MISSING_WHEN", "PARSE_SYNTAX_ERROR", "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"}
    assert expected <= everything


def test_the_scan_reads_literals_bound_names_and_bracketed_classes_only() -> None:
    source = '''
"""Module docstring mentioning [DELTA_IN_A_DOCSTRING]."""
__all__ = ["DELTA_METRIC_NAMES"]
_CLASS = "PARSE_SYNTAX_ERROR"
_BY_KIND = {"a": "DELTA_ONE_CLASS", "b": "SPARK_OTHER_CLASS"}
STORAGE = "MEMORY_AND_DISK"
raise E("x", error_class="COLUMN_ALIASES_NOT_ALLOWED")
raise E("x", error_class=_CLASS)
raise E("x", error_class=_BY_KIND[kind])
message = f"[DELTA_IN_A_MESSAGE] text"
'''
    assert error_classes_named_in(source) == {
        "COLUMN_ALIASES_NOT_ALLOWED", "PARSE_SYNTAX_ERROR", "DELTA_ONE_CLASS", "SPARK_OTHER_CLASS",
        "DELTA_IN_A_MESSAGE",
    }
