"""The expression guard: one Spark SQL expression, built-in functions only, row-level and safe."""

from __future__ import annotations

import pytest

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.statement.expression_guard import (
    AGGREGATE_FUNCTIONS,
    SPARK_BUILTIN_FUNCTIONS,
    check_expression,
    parse_expression,
)

NO_COMMENTS = "expected no comments in merge SQL (a template value ending in '--' hides the rest of its line)"
ACCEPTED = [
    "s.id = t.id",
    "t.id <=> s.id AND t.x == s.x",
    "coalesce(s.a, t.a) > 1 OR t.b IS NULL",
    "s.ts > t.ts AND s.op <> 'D'",
    "CASE WHEN s.a THEN 1 ELSE 2 END",
    "named_struct('a', s.x, 'b', 2)",
    "to_json(named_struct('a', s.x))",
    "s.value.a + 1",
    "t.a.b.c.d.e = 1",
    "cast(s.x AS DECIMAL(10, 2))",
    "try_cast(s.x AS INT)",
    "s.x::int",
    "date_format(s.ts, 'yyyy-MM-dd')",
    "to_date(s.d, 'dd/MM/yyyy')",
    "date_add(s.d, 1)",
    "timestampadd(HOUR, 1, s.ts)",
    "extract(YEAR FROM s.d)",
    "trim(BOTH 'x' FROM s.s)",
    "position('a' IN s.s)",
    "substr(s.s, 1, 2) || upper(s.s)",
    "regexp_replace(s.s, 'a', 'b')",
    "s.s RLIKE '^a' AND s.s LIKE 'a%'",
    "s.x BETWEEN 1 AND 2 AND s.y IN (1, 2, 3)",
    "transform(s.arr, x -> x + 1)",
    "aggregate(s.arr, 0, (acc, x) -> acc + x)",
    "exists(s.arr, x -> x > 1)",
    "filter(s.arr, x -> x > 1)",
    "map_filter(s.m, (k, v) -> v > 1)",
    "element_at(s.m, 'k')",
    "s.m['k'] = s.arr[0]",
    "sha2(cast(s.x AS STRING), 256)",
    "current_timestamp()",
    "current_date",
    "array(1, 2)",
    "struct(s.a, s.b)",
    "interval 1 day",
    "nvl(s.a, 0) + ifnull(s.b, 0)",
    "greatest(s.a, t.a)",
    "from_json(s.j, 'a INT')",
    "get_json_object(s.j, '$.a')",
    "hash(s.x) % 10",
]


@pytest.mark.parametrize("text", ACCEPTED)
@pytest.mark.parametrize("context", ["search condition", "clause condition", "assignment"])
def test_built_in_row_level_expressions_pass(text: str, context: str) -> None:
    check_expression(text, field="f", context=context, action="UPDATE")  # type: ignore[arg-type]


def test_non_deterministic_function_in_search_condition() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression("s.id = t.id AND rand() > 0.5", field="condition", context="search condition")
    assert error.value.bare_message == (
        "condition: Non-deterministic functions are not supported in the search condition of MERGE operation "
        "(condition = s.id = t.id AND RAND() > 0.5)."
    )


@pytest.mark.parametrize("action", ["UPDATE", "DELETE", "INSERT"])
@pytest.mark.parametrize(
    "text",
    [
        "s.v = rand()",
        "randn(1) > 0",
        "random() > 0",
        "uuid() = s.id",
        "size(shuffle(s.arr)) > 0",
        "monotonically_increasing_id() > 1",
        "spark_partition_id() = 0",
        "input_file_name() = 'x'",
        "uniform(0, 10) > 5",
    ],
)
def test_non_deterministic_function_in_clause_condition(action: str, text: str) -> None:
    with pytest.raises(
        MergeSpecError,
        match=f"Non-deterministic functions are not supported in the {action} condition of MERGE",
    ):
        check_expression(text, field="clauses[0].condition", context="clause condition", action=action)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["uuid()", "rand() * 10", "concat(s.id, cast(randn() AS STRING))"])
def test_non_deterministic_values_are_allowed(text: str) -> None:
    check_expression(text, field="f", context="assignment")


@pytest.mark.parametrize(
    ("text", "relation"),
    [
        ("s.srcValue in (select value from t)", "`t`"),
        ("exists(select 1 from db.u where u.id = s.id)", "`db`.`u`"),
        ("(select max(a) from other) > s.a", "`other`"),
        ("s.a NOT IN (SELECT a FROM t2 JOIN t3 ON t2.k = t3.k)", "`t2`"),
        ("s.a IN (SELECT * FROM range(10))", "`range`"),
    ],
)
def test_subqueries_name_the_relation_spark_cannot_find(text: str, relation: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression(text, field="clauses[0].condition", context="clause condition", action="UPDATE")
    message = error.value.bare_message
    assert message.startswith(
        "clauses[0].condition: Subqueries are not supported in the UPDATE condition of MERGE operation"
    )
    assert f"The table or view {relation} cannot be found" in message
    # Delta 4.4's class: its analyzer fails on the missing relation first.
    assert error.value.error_class == "TABLE_OR_VIEW_NOT_FOUND"


def test_a_subquery_over_the_source_relation_is_delta_s_unsupported_subquery() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression("(SELECT max(v) FROM source)", field="f", context="assignment")
    assert error.value.error_class == "DELTA_UNSUPPORTED_SUBQUERY"


def test_subquery_from_the_task_brief() -> None:
    with pytest.raises(MergeSpecError, match="The table or view `t` cannot be found"):
        check_expression("s.srcValue in (select value from t)", field="f", context="search condition")


def test_subquery_without_a_relation() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression("(select 1)", field="f", context="assignment")
    assert error.value.bare_message == (
        "f: Subqueries are not supported in the assignments of MERGE operation (value = (SELECT 1))."
    )


@pytest.mark.parametrize("name", ["reflect", "java_method", "try_reflect"])
def test_reflection_is_refused(name: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression(f"{name}('java.util.UUID', 'randomUUID')", field="f", context="assignment")
    assert error.value.bare_message == (
        f"f: expected Spark built-in functions without side effects, found {name}(), which calls arbitrary "
        "Java methods"
    )


@pytest.mark.parametrize("name", ["range", "read_files", "sql_keywords", "variant_explode"])
def test_table_valued_functions_are_refused(name: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression(f"{name}(10)", field="f", context="assignment")
    expected = f"f: expected a scalar expression, found the table-valued function {name}()"
    assert error.value.bare_message == expected


@pytest.mark.parametrize(
    "text", ["input_file_name()", "input_file_block_start()", "from_protobuf(s.b, 'M', '/etc/desc.pb')"]
)
def test_functions_reading_files_are_refused(text: str) -> None:
    with pytest.raises(MergeSpecError, match=r"found \w+\(\), which reads file names or files"):
        check_expression(text, field="f", context="assignment")


@pytest.mark.parametrize("text", ["my_udf(s.x)", "s.a + normalize_name(s.b)", "`my fn`(1)", "iff(s.a, 1, 2)"])
def test_unknown_functions_are_refused_as_udfs(text: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression(text, field="clauses[1].set.a", context="assignment")
    message = error.value.bare_message
    assert "which is not a Spark SQL built-in function (user-defined functions are not" in message


def test_catalog_qualified_functions_are_refused() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression("db.upper(s.x)", field="f", context="assignment")
    assert error.value.bare_message == (
        "f: expected Spark built-in functions only, found the catalog function call 'db.upper(s.x)' "
        "(user-defined functions are not allowed in merge expressions)"
    )


def test_window_function_in_assignment() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression("row_number() over (order by s.c)", field="f", context="assignment")
    assert error.value.bare_message == (
        "f: expected an expression evaluated per merged row, found window, aggregate or generator functions "
        "in the assignments of MERGE operation (value = ROW_NUMBER() OVER (ORDER BY s.c)). A query operator "
        "contains one or more unsupported expressions. "
        'Invalid expressions: ["ROW_NUMBER() OVER (ORDER BY s.c)"]'
    )
    assert error.value.error_class == "UNSUPPORTED_EXPR_FOR_OPERATOR"


def test_a_generator_in_an_assignment_has_spark_s_generator_class() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression("explode(array(1))", field="f", context="assignment")
    assert error.value.error_class == "UNSUPPORTED_GENERATOR.OUTSIDE_SELECT"


@pytest.mark.parametrize(
    "text",
    [
        "max(s.x)",
        "count(*) + 1",
        "sum(s.x) over (partition by s.k)",
        "lag(s.x)",
        "explode(s.arr)",
        "posexplode(s.arr)",
        "stack(2, 1, 2)",
        "collect_list(s.x)",
        "any(s.flag)",
        "s.x = any(s.y)",
    ],
)
def test_window_aggregate_and_generator_functions_are_invalid_everywhere(text: str) -> None:
    for context in ("search condition", "clause condition", "assignment"):
        with pytest.raises(MergeSpecError, match="Invalid expressions"):
            check_expression(text, field="f", context=context, action="DELETE")


def test_aggregate_in_condition_uses_deltas_wording() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression(
            "s.key1 = t.key2 and max(t.key2) > 20", field="condition", context="search condition"
        )
    assert error.value.bare_message == (
        "condition: Aggregate functions are not supported in the search condition of MERGE operation "
        '(condition = s.key1 = t.key2 AND MAX(t.key2) > 20). Invalid expressions: ["MAX(t.key2)"]'
    )


def test_infix_operator_is_not_mistaken_for_its_first_operand() -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression("percentile(s.x, 0.5) > 0 AND s.y", field="f", context="assignment")
    assert error.value.bare_message.endswith('Invalid expressions: ["PERCENTILE(s.x, 0.5)"]')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s.a; DROP TABLE t", "f: expected a single statement or expression, found ';' at line 1, column 4"),
        ("s.a;", "f: expected a single statement or expression, found ';' at line 1, column 4"),
        (
            "s.a -- AND t.tenant = s.tenant",
            f"f: {NO_COMMENTS}, found a comment next to 'a' at line 1, column 3",
        ),
        (
            "s.a /* x */ + 1",
            f"f: {NO_COMMENTS}, found a comment next to 'a' at line 1, column 3",
        ),
        (
            "'${env:AWS_SECRET_ACCESS_KEY}'",
            "f: expected no '${' in SQL text, found it at offset 1: Spark substitutes ${...} variables "
            "(including ${env:...}) in SQL text before parsing it",
        ),
        (
            ":param + 1",
            "f: expected a self-contained expression, found the parameter marker ':param'; render "
            "templates before building the spec",
        ),
        ("", "f: expected a Spark SQL expression, found ''"),
        ("   ", "f: expected a Spark SQL expression, found '   '"),
    ],
)
def test_smuggled_statements_comments_and_markers(text: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression(text, field="f", context="assignment")
    assert error.value.bare_message == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s.a +", "at or near end of input: expected an operand after '+', found the end of the expression "
                  "at line 1, column 6"),
        ("s.a s.b", "at or near 's': expected an operator, or the end of the expression, found 's.b' at "
                    "line 1, column 5"),
        ("SELECT 1", "at or near 'SELECT': expected an expression (a value, a column or a call), found "
                     "'SELECT 1' at line 1, column 1"),
        ("DROP TABLE t", "at or near 'DROP': expected an expression (a value, a column or a call), found "
                         "'DROP TABLE t' at line 1, column 1"),
        ("s.a = 1\nAND (s.b", "at or near '(': expected a closing ')' for this '(', found '(s.b' at line 2, "
                              "column 5"),
    ],
)  # fmt: skip
def test_anything_but_one_expression_is_a_syntax_error_with_position(text: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        parse_expression(text, field="condition")
    assert error.value.error_class == "PARSE_SYNTAX_ERROR"
    assert error.value.bare_message == f"condition: Syntax error {message}"
    assert error.value.__cause__ is None  # sqlglot's own error stays out of tracebacks


def test_unterminated_string_is_shown_where_it_starts() -> None:
    with pytest.raises(MergeSpecError) as error:
        parse_expression("s.a = 'x", field="f")
    assert error.value.bare_message == (
        'f: Syntax error at or near "\'x": expected the closing \' of this string, found "\'x" at line 1, '
        "column 7"
    )


def test_an_expression_sqlglot_cannot_render_is_still_accepted() -> None:
    # The user's text runs, never sqlglot's rendering of it, so a lossy rendering changes nothing.
    check_expression("to_char(s.d, 'yyyy')", field="f", context="assignment")


def test_function_lists_are_consistent() -> None:
    assert AGGREGATE_FUNCTIONS <= SPARK_BUILTIN_FUNCTIONS
    assert {"coalesce", "named_struct", "date_format", "transform", "struct"} <= SPARK_BUILTIN_FUNCTIONS
    assert not {"range", "my_udf"} & SPARK_BUILTIN_FUNCTIONS


@pytest.mark.parametrize("text", ["-- x", "/* x */"])
def test_only_comments_is_no_expression(text: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        check_expression(text, field="f", context="assignment")
    assert error.value.bare_message == f"f: expected Spark SQL, found only comments or blanks: {text!r}"
