"""Only a valid MERGE is applied: the corpus of statements Spark refuses, refused by the operator's parser,
by Spark's own parser and by the job (table untouched); valid statements Spark and the contract read alike;
USING subqueries and CTEs as the merge's source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.delta_merge import run_merge
from spark_jobs.delta_merge.analysis.spark_statement import check_with_spark_parser
from spark_jobs.delta_merge.errors import MergeAnalysisError, MergeSpecError
from spark_jobs.delta_merge.spec import MergeSpec
from spark_jobs.delta_merge.statement.merge_sql import parse_merge_sql
from spark_jobs.delta_merge.statement.parsed_merge import Assignment, MergeClause, ParsedMerge
from tests.support.delta_reader import table_version
from tests.support.merge_statement_corpus import HEAD, INVALID_STATEMENTS
from tests.unit.spark_jobs.test_pipeline import kv, make_target, merge, parquet_source, sorted_rows

CORPUS_IDS = [sql.removeprefix(HEAD)[:60] for sql, _ in INVALID_STATEMENTS]
# Spark's lexer drops comments, so it takes these; the operator refuses them because a template value ending
# in `--` silently hides the rest of its line.
COMMENTED = [sql for sql, _ in INVALID_STATEMENTS if "--" in sql or "/*" in sql]


def spec_for(sql: str, target: str = "/t", source: str = "/s") -> dict[str, Any]:
    return {"target": {"uri": target}, "source": {"uri": source, "format": "parquet"}, "merge_sql": sql}


def test_the_corpus_is_large_enough() -> None:
    assert len(INVALID_STATEMENTS) >= 40
    assert len({sql for sql, _ in INVALID_STATEMENTS}) == len(INVALID_STATEMENTS)


@pytest.mark.parametrize(("sql", "quoted"), INVALID_STATEMENTS, ids=CORPUS_IDS)
def test_the_operator_refuses_before_launch_quoting_the_text(sql: str, quoted: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        MergeSpec.from_dict(spec_for(sql)).validate()
    assert quoted in str(error.value)


@pytest.mark.parametrize(
    ("sql", "hint"),
    [
        (HEAD + "WHEN MATCHED THEN UPDATE SET v = -1 WHERE t.id < 0", "WHEN MATCHED AND <condition> THEN"),
        (HEAD + "WHEN MATCHED THEN DELETE RETURNING *", "no RETURNING or OUTPUT clause"),
        (HEAD + "WHEN NOT MATCHED THEN INSERT VALUES (s.id)", "INSERT (col, ...) VALUES (value, ...)"),
    ],
)
def test_foreign_dialect_forms_say_how_spark_writes_them(sql: str, hint: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        MergeSpec.from_dict(spec_for(sql)).validate()
    assert error.value.error_class == "PARSE_SYNTAX_ERROR"
    assert hint in str(error.value)


def test_the_statement_a_new_user_tried_is_refused_with_where_it_stops() -> None:
    with pytest.raises(MergeSpecError) as error:
        parse_merge_sql(HEAD + "WHEN MATCHED THEN UPDATE SET balance = -1 WHERE t.id < 0")
    assert error.value.bare_message.startswith(
        "merge_sql: Syntax error at or near 'WHERE': expected ',', another WHEN clause or the end of the "
        "statement after the value of SET balance '-1', found 'WHERE t.id < 0' at line 1, column 93"
    )
@pytest.mark.parametrize(
    "sql",
    [sql for sql, _ in INVALID_STATEMENTS if sql not in COMMENTED],
    ids=lambda sql: sql.removeprefix(HEAD)[:60],
)
def test_sparks_own_parser_refuses_each(spark: Any, sql: str) -> None:
    contract = ParsedMerge("t", "s", "t.id = s.id", (MergeClause("matched", "delete"),))
    with pytest.raises(MergeSpecError) as error:
        check_with_spark_parser(spark, sql, contract)
    refused = ("Spark SQL's parser refuses the statement", "found one Spark parses as")
    assert any(text in str(error.value) for text in refused)
    assert error.value.error_class in ("PARSE_SYNTAX_ERROR", "COLUMN_ALIASES_NOT_ALLOWED")
def test_the_job_refuses_each_and_leaves_the_table_as_it_was(spark: Any, table_root: Path) -> None:
    target = make_target(table_root / "t", kv([(1, "a"), (2, "b")]))
    source = parquet_source(table_root / "s", kv([(2, "B"), (3, "C")]))
    files_before = sorted(p.name for p in target.rglob("*"))
    for sql, _ in INVALID_STATEMENTS:
        spec = {"target": {"uri": str(target)}, "source": source, "merge_sql": sql}
        with pytest.raises(MergeSpecError):
            run_merge(spark, spec)
    assert table_version(target) == 0
    assert sorted(p.name for p in target.rglob("*")) == files_before
    assert sorted_rows(target) == [(1, "a"), (2, "b")]


# Valid statements: Spark's parse and the contract's are the same.

VALID = [
    HEAD + "WHEN MATCHED THEN DELETE",
    "MERGE INTO target AS t USING source AS s ON t.id <=> s.id AND t.d >= DATE '2024-01-01' "
    "WHEN MATCHED AND s.op = 'D' THEN DELETE "
    "WHEN MATCHED THEN UPDATE SET t.v = CASE WHEN s.v IS NULL THEN t.v ELSE upper(s.v) END, `a.b` = 1, "
    "t.`x`.`y` = transform(s.arr, e -> e + 1) "
    "WHEN NOT MATCHED BY TARGET AND s.id > 0 THEN INSERT (id, v) VALUES (s.id, coalesce(s.v, 'none')) "
    "WHEN NOT MATCHED THEN INSERT * "
    "WHEN NOT MATCHED BY SOURCE AND t.v IS NULL THEN DELETE "
    "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET v = 'gone';",
    "MERGE WITH SCHEMA EVOLUTION INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *",
    "MERGE INTO target t USING (SELECT id, max(v) AS v FROM source GROUP BY id ORDER BY id LIMIT 3) AS s "
    "ON t.id = s.id WHEN MATCHED THEN UPDATE SET *",
    "WITH c AS (SELECT * FROM source WHERE id > 1), d (k) AS (SELECT id FROM c) "
    "MERGE INTO target t USING d ON t.id = d.k WHEN MATCHED THEN DELETE",
    "MERGE INTO target t USING source s ON NULL WHEN NOT MATCHED THEN INSERT *",
    "merge into target t using source s on false when matched then delete;;",
    # Delta merges these two; Spark prints the first's source as a resolved SubqueryAlias (it reads no
    # relation), and the second's SET column is the struct column `target` of a table aliased `target`.
    "MERGE INTO target as trg USING (SELECT 5 as key1, 5 as value) src ON src.key1 = trg.key2 WHEN MATCHED "
    "THEN UPDATE SET trg.key2 = 20 + key1, value = 20 + src.value WHEN NOT MATCHED THEN INSERT (trg.key2, "
    "value) VALUES (key1 - 10, src.value + 10)",
    "MERGE INTO target USING source ON 1 = 1 WHEN MATCHED THEN UPDATE SET target.target.a = source.target.a",
]


@pytest.mark.parametrize("sql", VALID, ids=range(len(VALID)))
def test_spark_and_the_contract_read_valid_statements_alike(spark: Any, sql: str) -> None:
    parsed = MergeSpec.from_dict(spec_for(sql)).validate()
    check_with_spark_parser(spark, sql, parsed)
@pytest.mark.parametrize(
    ("changed", "what"),
    [
        ({"condition": "t.id = s.id + 1"}, "the ON condition"),
        ({"clauses": (MergeClause("matched", "update", None, (Assignment(("w",), "s.v"),)),)}, "a column"),
        ({"clauses": (MergeClause("matched", "update", None, (Assignment(("v",), "s.w"),)),)}, "the value"),
        (
            {"clauses": (MergeClause("matched", "update", "s.v > 0", (Assignment(("v",), "s.v"),)),)},
            "the condition",
        ),
        ({"clauses": (MergeClause("matched", "update_all"),)}, "the action"),
        ({"source_alias": "u"}, "the alias of the source"),
        ({"schema_evolution": True}, "WITH SCHEMA EVOLUTION"),
        ({"source_query": "SELECT * FROM source"}, "the source"),
    ],
)
def test_any_difference_from_sparks_parse_is_refused(spark: Any, changed: dict[str, Any], what: str) -> None:
    sql = HEAD + "WHEN MATCHED THEN UPDATE SET v = s.v"
    parsed = parse_merge_sql(sql)
    fields = {f: getattr(parsed, f) for f in ParsedMerge.__dataclass_fields__} | changed
    with pytest.raises(MergeSpecError) as error:
        check_with_spark_parser(spark, sql, ParsedMerge(**fields))
    assert f"Spark's SQL parser reads {what}" in str(error.value)
@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            HEAD.replace("ON t.id = s.id", "ON t.id = s.id AND EXISTS (SELECT 1)")
            + "WHEN MATCHED THEN DELETE",
            "Subqueries are not supported",
        ),
        (
            HEAD + "WHEN MATCHED THEN UPDATE SET v = (SELECT max(v) FROM target)",
            "Subqueries are not supported",
        ),
        (HEAD + "WHEN MATCHED THEN UPDATE SET v = reflect('java.lang.System', 'exit', 1)", "reflect()"),
        (HEAD + "WHEN MATCHED AND my_udf(s.v) THEN DELETE", "my_udf()"),
        (HEAD + "WHEN NOT MATCHED THEN INSERT (v) VALUES (cat.db.fn(s.v))", "cat.db.fn()"),
    ],
)
def test_the_guard_holds_on_sparks_own_trees(spark: Any, sql: str, message: str) -> None:
    # The contract's parse without its guard: the job refuses on Spark's trees on its own.
    with pytest.raises(MergeSpecError) as error:
        check_with_spark_parser(spark, sql, parse_merge_sql(sql))
    assert message in str(error.value)


# USING subqueries and CTEs: the query is the source; `source` in it is the spec's source.

ID_V = pa.schema([("id", pa.int64()), ("v", pa.string())])
@pytest.mark.parametrize(
    ("using", "rows", "inserted", "updated"),
    [
        ("(SELECT id, upper(v) AS v FROM source WHERE id > 1) AS s", [(1, "a"), (2, "B"), (3, "C")], 1, 1),
        ("(SELECT * FROM source ORDER BY id DESC LIMIT 1) s", [(1, "a"), (2, "b"), (3, "c")], 1, 0),
        (
            "(SELECT * FROM source UNION ALL SELECT 9 AS id, 'nine' AS v) AS s",
            [(1, "a"), (2, "b"), (3, "c"), (9, "nine")],
            2,
            1,
        ),
        (
            "(SELECT col1 AS id, col2 AS v FROM VALUES (1, 'one'), (5, 'five')) AS s",
            [(1, "one"), (2, "b"), (5, "five")],
            1,
            1,
        ),
    ],
    ids=["filter", "order-limit", "union", "values"],
)
def test_using_subqueries_are_the_source(
    spark: Any, table_root: Path, using: str, rows: list[tuple[Any, ...]], inserted: int, updated: int
) -> None:
    target = make_target(table_root / "t", kv([(1, "a"), (2, "b")]))
    source = parquet_source(table_root / "s", kv([(2, "b"), (3, "c")]))
    sql = (
        f"MERGE INTO target t USING {using} ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    metrics = merge(spark, target, source, sql)
    assert sorted_rows(target) == rows
    assert (metrics["numTargetRowsInserted"], metrics["numTargetRowsUpdated"]) == (inserted, updated)
    assert table_version(target) == 1
    # The statement's `source` view is gone (asked by name: listing every table of a session that other tests
    # filled with tables over deleted directories can fail to decode one).
    assert not spark.catalog.tableExists("source")
def test_a_cte_is_the_source(spark: Any, table_root: Path) -> None:
    target = make_target(table_root / "t", kv([(1, "a"), (2, "b"), (3, "c")]))
    source = parquet_source(table_root / "s", kv([(1, "D"), (2, "U"), (4, "I")]))
    sql = (
        "WITH changes AS (SELECT id, v AS op FROM source), "
        "deletes AS (SELECT id FROM changes WHERE op = 'D') "
        "MERGE INTO target t USING deletes d ON t.id = d.id WHEN MATCHED THEN DELETE"
    )
    metrics = merge(spark, target, source, sql)
    assert sorted_rows(target) == [(2, "b"), (3, "c")]
    assert (metrics["numSourceRows"], metrics["numTargetRowsDeleted"]) == (1, 1)
def test_a_using_query_that_does_not_analyze_names_the_source_view(spark: Any, table_root: Path) -> None:
    target = make_target(table_root / "t", kv([(1, "a")]))
    source = parquet_source(table_root / "s", kv([(1, "b")]))
    sql = "MERGE INTO target t USING (SELECT * FROM updates) s ON t.id = s.id WHEN MATCHED THEN DELETE"
    with pytest.raises(MergeAnalysisError, match="the spec's source is named `source`"):
        merge(spark, target, source, sql)
    assert table_version(target) == 0
def test_merge_with_schema_evolution_evolves_in_one_statement(spark: Any, table_root: Path) -> None:
    target = make_target(table_root / "t", kv([(1, "a")]))
    wide = pa.schema([("id", pa.int64()), ("v", pa.string()), ("extra", pa.int64())])
    source = parquet_source(table_root / "s", kv([(1, "b", 7), (2, "c", 8)], wide))
    sql = (
        "MERGE WITH SCHEMA EVOLUTION INTO target t USING source s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    merge(spark, target, source, sql)
    assert DeltaTable(str(target)).schema().to_arrow().names == ["id", "v", "extra"]
    assert sorted_rows(target) == [(1, "b", 7), (2, "c", 8)]
