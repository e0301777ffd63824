"""MERGE INTO text -> ParsedMerge, the structural form's equivalence, and Delta's statement rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.spec import Assignment, MergeClause, MergeSpec, ParsedMerge, format_column_path
from spark_jobs.delta_merge.statement.merge_rules import check_parsed_merge, strip_target_alias
from spark_jobs.delta_merge.statement.merge_sql import parse_merge_sql

HEAD = "MERGE INTO target t USING source s ON t.id = s.id "


def spec_of(**merge: Any) -> MergeSpec:
    return MergeSpec.from_dict(
        {"target": {"uri": "/t"}, "source": {"uri": "/s", "format": "parquet"}, **merge}
    )


def validate_sql(sql: str) -> ParsedMerge:
    return spec_of(merge_sql=sql).validate()


def clauses(sql: str) -> tuple[MergeClause, ...]:
    return parse_merge_sql(sql).clauses


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ("WHEN MATCHED THEN DELETE", MergeClause("matched", "delete")),
        ("WHEN MATCHED AND s.op = 'D' THEN DELETE", MergeClause("matched", "delete", "s.op = 'D'")),
        ("WHEN MATCHED THEN UPDATE SET *", MergeClause("matched", "update_all")),
        (
            "WHEN MATCHED AND t.v < s.v THEN UPDATE SET t.v = s.v, w = s.w + 1",
            MergeClause(
                "matched", "update", "t.v < s.v", (Assignment(("v",), "s.v"), Assignment(("w",), "s.w + 1"))
            ),
        ),
        ("WHEN NOT MATCHED THEN INSERT *", MergeClause("not_matched", "insert_all")),
        ("WHEN NOT MATCHED BY TARGET THEN INSERT *", MergeClause("not_matched", "insert_all")),
        (
            "WHEN NOT MATCHED BY TARGET AND s.v > 0 THEN INSERT (id, v) VALUES (s.id, s.v)",
            MergeClause(
                "not_matched", "insert", "s.v > 0", (Assignment(("id",), "s.id"), Assignment(("v",), "s.v"))
            ),
        ),
        ("WHEN NOT MATCHED BY SOURCE THEN DELETE", MergeClause("not_matched_by_source", "delete")),
        (
            "WHEN NOT MATCHED BY SOURCE AND t.v > 0 THEN UPDATE SET t.v = 0",
            MergeClause("not_matched_by_source", "update", "t.v > 0", (Assignment(("v",), "0"),)),
        ),
        (
            "when matched then update set t.addr.city = s.city, `a b` = 1, t.`x.y`.z = 2",
            MergeClause(
                "matched",
                "update",
                None,
                (
                    Assignment(("addr", "city"), "s.city"),
                    Assignment(("a b",), "1"),
                    Assignment(("x.y", "z"), "2"),
                ),
            ),
        ),
        (
            "WHEN MATCHED THEN UPDATE SET t.a.b.c.d.e = 1",
            MergeClause("matched", "update", None, (Assignment(("a", "b", "c", "d", "e"), "1"),)),
        ),
    ],
)
def test_each_clause_form(when: str, expected: MergeClause) -> None:
    assert clauses(HEAD + when) == (expected,)


def test_search_condition_operators() -> None:
    parsed = parse_merge_sql("MERGE INTO a USING b ON a.k <=> b.k AND a.x == b.x WHEN MATCHED THEN DELETE")
    # Kept as written: Spark parses exactly this text (the job checks it against Spark's own parse).
    assert parsed.condition == "a.k <=> b.k AND a.x == b.x"


@pytest.mark.parametrize(
    ("sql", "aliases"),
    [
        ("MERGE INTO tgt t USING src s ON t.k = s.k WHEN MATCHED THEN DELETE", ("t", "s")),
        ("MERGE INTO tgt AS trg USING src AS s2 ON trg.k = s2.k WHEN MATCHED THEN DELETE", ("trg", "s2")),
        ("MERGE INTO tgt USING src ON tgt.k = src.k WHEN MATCHED THEN DELETE", ("tgt", "src")),
        (
            "MERGE INTO db.accounts USING updates u ON accounts.k = u.k WHEN MATCHED THEN DELETE",
            ("accounts", "u"),
        ),
        (
            "MERGE INTO delta.`/data/x` AS t USING parquet.`/in` AS s ON t.k = s.k WHEN MATCHED THEN DELETE",
            ("t", "s"),
        ),
        ("merge into `my target` t using `my source` s on t.k = s.k when matched then delete;", ("t", "s")),
    ],
)
def test_names_stand_for_the_spec_and_aliases_are_honoured(sql: str, aliases: tuple[str, str]) -> None:
    parsed = parse_merge_sql(sql)
    assert (parsed.target_alias, parsed.source_alias) == aliases


def test_table_name_without_alias_is_stripped_from_set_columns() -> None:
    sql = "MERGE INTO tgt USING src ON tgt.k = src.k WHEN MATCHED THEN UPDATE SET TGT.v = src.v"
    assert clauses(sql)[0].assignments == (Assignment(("v",), "src.v"),)


def test_insert_columns_lose_the_target_alias_too() -> None:
    sql = HEAD + "WHEN NOT MATCHED THEN INSERT (t.id, t.v) VALUES (s.id - 10, s.v + 10)"
    assert clauses(sql)[0].assignments == (Assignment(("id",), "s.id - 10"), Assignment(("v",), "s.v + 10"))


@pytest.mark.parametrize(
    ("column", "alias", "expected"),
    [
        (("t", "a"), "t", ("a",)),
        (("T", "a", "b"), "t", ("a", "b")),
        (("t",), "t", ("t",)),
        (("s", "a"), "t", ("s", "a")),
        (("a", "t"), "t", ("a", "t")),
    ],
)
def test_strip_target_alias(column: tuple[str, ...], alias: str, expected: tuple[str, ...]) -> None:
    assert strip_target_alias(column, alias) == expected


def test_full_statement_round_trips_into_clauses_in_order() -> None:
    sql = """
        MERGE INTO target t USING source s
        ON t.id = s.id
        WHEN MATCHED AND s.deleted THEN DELETE
        WHEN MATCHED THEN UPDATE SET *
        WHEN NOT MATCHED AND s.v IS NOT NULL THEN INSERT (id, v) VALUES (s.id, s.v)
        WHEN NOT MATCHED THEN INSERT *
        WHEN NOT MATCHED BY SOURCE AND t.v > 0 THEN UPDATE SET v = 0
        WHEN NOT MATCHED BY SOURCE THEN DELETE
    """
    parsed = validate_sql(sql)
    assert [(c.when, c.action) for c in parsed.clauses] == [
        ("matched", "delete"),
        ("matched", "update_all"),
        ("not_matched", "insert"),
        ("not_matched", "insert_all"),
        ("not_matched_by_source", "update"),
        ("not_matched_by_source", "delete"),
    ]


STRUCTURAL_EQUIVALENTS = [
    (
        "MERGE INTO target t USING source s ON t.id <=> s.id AND t.x == s.x "
        "WHEN MATCHED AND s.d THEN DELETE "
        "WHEN MATCHED AND t.a > 1 THEN UPDATE SET t.addr.city = s.city, `a b` = 1 "
        "WHEN MATCHED THEN UPDATE SET * "
        "WHEN NOT MATCHED BY TARGET AND s.z THEN INSERT (id, `a b`) VALUES (s.id, 2) "
        "WHEN NOT MATCHED THEN INSERT * "
        "WHEN NOT MATCHED BY SOURCE AND t.q THEN UPDATE SET t.x = 1 "
        "WHEN NOT MATCHED BY SOURCE THEN DELETE",
        {
            "target_alias": "t",
            "source_alias": "s",
            "condition": "t.id <=> s.id AND t.x == s.x",
            "clauses": [
                {"when": "matched", "condition": "s.d", "action": "delete"},
                {
                    "when": "matched",
                    "condition": "t.a > 1",
                    "action": "update",
                    "set": {"t.addr.city": "s.city", "`a b`": "1"},
                },
                {"when": "matched", "action": "update_all"},
                {
                    "when": "not_matched",
                    "condition": "s.z",
                    "action": "insert",
                    "values": {"id": "s.id", "`a b`": "2"},
                },
                {"when": "not_matched", "action": "insert_all"},
                {
                    "when": "not_matched_by_source",
                    "condition": "t.q",
                    "action": "update",
                    "set": {"t.x": "1"},
                },
                {"when": "not_matched_by_source", "action": "delete"},
            ],
        },
    ),
    (
        "MERGE INTO x target USING y source ON target.k = source.k "
        "WHEN MATCHED THEN UPDATE SET value = named_struct('a', source.a), target.n = nvl(source.n, 0)",
        {
            "condition": "target.k = source.k",
            "clauses": [
                {
                    "when": "matched",
                    "action": "update",
                    "set": {"value": "named_struct('a', source.a)", "n": "nvl(source.n, 0)"},
                },
            ],
        },
    ),
]


@pytest.mark.parametrize(("sql", "structural"), STRUCTURAL_EQUIVALENTS)
def test_structural_form_parses_to_the_same_merge(sql: str, structural: dict[str, Any]) -> None:
    assert spec_of(**structural).validate() == validate_sql(sql)


def test_structural_form_defaults_its_aliases() -> None:
    parsed = spec_of(
        condition="target.k = source.k", clauses=[{"when": "matched", "action": "delete"}]
    ).parsed()
    assert (parsed.target_alias, parsed.source_alias) == ("target", "source")


# Delta's statement rules, with Delta's wording.


def test_at_least_one_when_clause_in_sql() -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql("MERGE INTO target t USING source s ON t.id = s.id")
    assert (
        error.value.bare_message == "merge_sql: There must be at least one WHEN clause in a MERGE statement."
    )


def test_at_least_one_when_clause_in_structural_form() -> None:
    with pytest.raises(MergeSpecError) as error:
        spec_of(condition="target.k = source.k", clauses=[]).validate()
    assert error.value.bare_message == "clauses: There must be at least one WHEN clause in a MERGE statement."


@pytest.mark.parametrize(
    ("whens", "message"),
    [
        (
            "WHEN MATCHED THEN DELETE WHEN MATCHED AND s.v > 0 THEN UPDATE SET *",
            "merge_sql: When there are more than one MATCHED clauses in a MERGE statement, only the last "
            "MATCHED clause can omit the condition. Found an unconditional MATCHED clause at position 1 of "
            "2.",
        ),
        (
            "WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY TARGET AND s.v > 0 THEN INSERT *",
            "merge_sql: When there are more than one NOT MATCHED [BY TARGET] clauses in a MERGE statement, "
            "only "
            "the last NOT MATCHED [BY TARGET] clause can omit the condition. Found an unconditional NOT "
            "MATCHED "
            "[BY TARGET] clause at position 1 of 2.",
        ),
        (
            "WHEN NOT MATCHED BY SOURCE THEN DELETE WHEN NOT MATCHED BY SOURCE AND t.v > 0 THEN DELETE",
            "merge_sql: When there are more than one NOT MATCHED BY SOURCE clauses in a MERGE statement, "
            "only "
            "the last NOT MATCHED BY SOURCE clause can omit the condition. Found an unconditional NOT "
            "MATCHED "
            "BY SOURCE clause at position 1 of 2.",
        ),
    ],
)
def test_only_the_last_clause_of_a_kind_may_omit_its_condition(whens: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(HEAD + whens)
    assert error.value.bare_message == message


def test_clause_order_rule_counts_each_kind_separately() -> None:
    validate_sql(
        HEAD + "WHEN MATCHED THEN DELETE WHEN NOT MATCHED AND s.v > 0 THEN INSERT * WHEN NOT MATCHED THEN "
        "INSERT * WHEN NOT MATCHED BY SOURCE THEN DELETE"
    )


def test_clause_order_rule_in_structural_form() -> None:
    spec = spec_of(
        condition="target.k = source.k",
        clauses=[{"when": "matched", "action": "delete"}, {"when": "matched", "action": "update_all"}],
    )
    with pytest.raises(
        MergeSpecError, match=r"^\[DELTA_NON_LAST_MATCHED_CLAUSE_OMIT_CONDITION\] clauses: When"
    ):
        spec.validate()


@pytest.mark.parametrize(
    ("whens", "message"),
    [
        (
            "WHEN MATCHED THEN INSERT *",
            "merge_sql: Syntax error at or near 'INSERT': expected UPDATE or DELETE after WHEN MATCHED ... "
            "THEN, found 'INSERT *' at line 1, "
            "column 69. Spark SQL refuses this statement.",
        ),
        (
            "WHEN NOT MATCHED THEN DELETE",
            "merge_sql: Syntax error at or near 'DELETE': expected INSERT after WHEN NOT MATCHED ... THEN, "
            "found 'DELETE' at line 1, column 73."
            " Spark SQL refuses this statement.",
        ),
        (
            "WHEN NOT MATCHED THEN UPDATE SET v = 1",
            "merge_sql: Syntax error at or near 'UPDATE': expected INSERT after WHEN NOT MATCHED ... THEN, "
            "found 'UPDATE SET v = 1' at line 1, "
            "column 73. Spark SQL refuses this statement.",
        ),
        (
            "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET *",
            "merge_sql: Syntax error at or near '*': expected SET <column> = <value>: WHEN NOT MATCHED BY "
            "SOURCE has no source row for "
            "UPDATE SET *, found '*' at line 1, column 94. Spark SQL refuses this statement.",
        ),
        (
            "WHEN NOT MATCHED BY SOURCE THEN INSERT (v) VALUES (1)",
            "merge_sql: Syntax error at or near 'INSERT': expected UPDATE or DELETE after WHEN NOT MATCHED "
            "BY SOURCE ... THEN, found "
            "'INSERT (v) VALUES (1)' at line 1, column 83. Spark SQL refuses this statement.",
        ),
    ],
)
def test_actions_each_clause_kind_allows(whens: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(HEAD + whens)
    assert error.value.bare_message == message


def test_allowed_actions_in_structural_form() -> None:
    spec = spec_of(
        condition="target.k = source.k", clauses=[{"when": "not_matched_by_source", "action": "update_all"}]
    )
    with pytest.raises(
        MergeSpecError, match=r"^clauses\[0\]: expected one of update, delete in a WHEN NOT MATCHED BY"
    ):
        spec.validate()


@pytest.mark.parametrize(
    ("sets", "listed"),
    [
        ("value.a = 2, value = named_struct('a', 3)", "[`value.a`, `value`]"),
        ("key2 = 1, key2 = 2", "[`key2`, `key2`]"),
        ("S = 1, s = 'b'", "[`S`, `s`]"),
        ("a.c.d = 'rand', a.c.d = 'RANDOM2'", "[`a.c.d`, `a.c.d`]"),
        ("value.a.x = 2, value.a.x = 3, other = 1", "[`value.a.x`, `value.a.x`]"),
        ("t.z = 30, z = 40", "[`z`, `z`]"),
    ],
)
def test_conflicting_set_columns(sets: str, listed: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(HEAD + f"WHEN MATCHED THEN UPDATE SET {sets}")
    assert (
        error.value.bare_message
        == f"merge_sql WHEN clause 1: There is a conflict from these SET columns: {listed}."
    )


def test_conflicting_set_columns_in_not_matched_by_source_update() -> None:
    with pytest.raises(MergeSpecError, match=r"There is a conflict from these SET columns: \[`v`, `v`\]\."):
        validate_sql(HEAD + "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET v = 1, v = 2")


def test_conflicting_set_columns_in_structural_form() -> None:
    spec = spec_of(
        condition="target.k = source.k",
        clauses=[
            {
                "when": "matched",
                "action": "update",
                "set": {"value.a": "2", "`value`": "named_struct('a', 3)"},
            }
        ],
    )
    with pytest.raises(MergeSpecError) as error:
        spec.validate()
    assert (
        error.value.bare_message
        == "clauses[0]: There is a conflict from these SET columns: [`value.a`, `value`]."
    )


def test_sibling_nested_fields_do_not_conflict() -> None:
    validate_sql(HEAD + "WHEN MATCHED THEN UPDATE SET value.a = 1, value.b = 2, v = 3")


def test_duplicate_insert_columns() -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(HEAD + "WHEN NOT MATCHED THEN INSERT (key2, key2) VALUES (3, 4)")
    assert (
        error.value.bare_message
        == "merge_sql WHEN clause 1: Duplicate column names in INSERT clause: found `key2` repeated"
    )


def test_nested_insert_column() -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(HEAD + "WHEN NOT MATCHED THEN INSERT (a.b) VALUES (1)")
    assert error.value.bare_message == (
        "merge_sql WHEN clause 1: Nested field is not supported in the INSERT clause of MERGE operation "
        "(field = `a`.`b`)."
    )


@pytest.mark.parametrize(
    ("insert", "counts"),
    [("(a, b) VALUES (1)", "2 columns and 1 values"), ("(a) VALUES (1, 2)", "1 columns and 2 values")],
)
def test_insert_column_and_value_counts_must_match(insert: str, counts: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(HEAD + f"WHEN NOT MATCHED THEN INSERT {insert}")
    assert (
        error.value.bare_message
        == f"merge_sql WHEN clause 1: expected as many INSERT values as columns, found {counts}"
    )


def test_insert_needs_a_column_list() -> None:
    with pytest.raises(MergeSpecError, match="Spark's INSERT needs the column list"):
        validate_sql(HEAD + "WHEN NOT MATCHED THEN INSERT VALUES (s.id)")


def test_same_alias_for_target_and_source() -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql("MERGE INTO a x USING b X ON x.k = x.k WHEN MATCHED THEN DELETE")
    assert error.value.bare_message == (
        "merge_sql: expected different aliases for the target and the source, found 'x' for both"
    )


# Malformed statements.


@pytest.mark.parametrize(
    ("sql", "start"),
    [
        (
            HEAD + "WHEN MATCHED THEN UPDTE SET x = 1",
            "expected UPDATE or DELETE after WHEN MATCHED ... THEN, found 'UPDTE SET x = 1' at line 1, "
            "column 69",
        ),
        (
            HEAD + "WHEN MATCHED THEN UPDATE SET x = 1 WHEN BLAH",
            "expected MATCHED, NOT MATCHED, NOT MATCHED BY TARGET or NOT MATCHED BY SOURCE after WHEN, found "
            "'BLAH' at line 1, column 91",
        ),
        (
            "MERGE INTO t USING s ON t.id = s.id\nWHEN MATCHED AND (s.x THEN DELETE",
            "expected a closing ')' for this '(', found '(s.x THEN DELETE' at line 2, column 18",
        ),
    ],
)
def test_syntax_errors_carry_their_position(sql: str, start: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(sql)
    assert error.value.error_class == "PARSE_SYNTAX_ERROR"
    assert error.value.bare_message.startswith("merge_sql: Syntax error at or near ")
    assert start in error.value.bare_message


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t",
        "INSERT INTO t SELECT * FROM s",
        "UPDATE t SET a = 1",
        "DELETE FROM t WHERE a = 1",
        "DROP TABLE t",
    ],
)
def test_non_merge_statements(sql: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(sql)
    near = f"Syntax error at or near {sql.split()[0]!r}"
    expected = f"merge_sql: {near}: expected a MERGE INTO statement, found {sql!r}"
    assert error.value.bare_message.startswith(expected)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            HEAD + "WHEN MATCHED THEN DELETE; DROP TABLE x",
            "merge_sql: expected a single statement or expression, found ';' at line 1, column 75",
        ),
        (
            HEAD + "-- AND t.tenant = s.tenant\nWHEN MATCHED THEN DELETE",
            "merge_sql: expected no comments in merge "
            "SQL (a template value ending in '--' hides the rest of its line), found a comment next to 'id' "
            "at "
            "line 1, column 49",
        ),
    ],
)
def test_smuggled_statements_and_comments(sql: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(sql)
    assert error.value.bare_message == message


def test_source_subquery_in_using_is_the_source_query() -> None:
    parsed = validate_sql(
        "MERGE INTO t USING (SELECT * FROM source WHERE k > 1) s ON t.k = s.k WHEN MATCHED THEN DELETE"
    )
    assert (parsed.source_query, parsed.source_alias) == ("SELECT * FROM source WHERE k > 1", "s")


# The guard runs on every expression of the statement.


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "MERGE INTO t USING s ON t.id = s.id AND rand() > 0.5 WHEN MATCHED THEN DELETE",
            "merge_sql ON condition: Non-deterministic functions are not supported in the search condition "
            "of "
            "MERGE operation (condition = t.id = s.id AND RAND() > 0.5).",
        ),
        (
            HEAD + "WHEN NOT MATCHED AND s.v = rand() THEN INSERT *",
            "merge_sql WHEN clause 1 condition: Non-deterministic functions are not supported in the INSERT "
            "condition of MERGE operation (condition = s.v = RAND()).",
        ),
        (
            HEAD + "WHEN MATCHED AND uuid() = s.x THEN DELETE",
            "merge_sql WHEN clause 1 condition: Non-deterministic functions are not supported in the DELETE "
            "condition of MERGE operation (condition = UUID() = s.x).",
        ),
        (
            HEAD + "WHEN MATCHED AND s.srcValue in (select value from t) THEN UPDATE SET v = s.srcValue",
            "merge_sql WHEN clause 1 condition: Subqueries are not supported in the UPDATE condition of "
            "MERGE "
            "operation (condition = s.srcValue IN (SELECT value FROM t)). The subquery reads `t`: The table "
            "or "
            "view `t` cannot be found.",
        ),
        (
            HEAD + "WHEN MATCHED THEN UPDATE SET b = row_number() over (order by s.c)",
            "merge_sql WHEN clause 1 SET b: expected an expression evaluated per merged row, found window, "
            "aggregate or generator functions in the assignments of MERGE operation (value = ROW_NUMBER() "
            "OVER "
            "(ORDER BY s.c)). A query operator contains one or more unsupported expressions. Invalid "
            'expressions: ["ROW_NUMBER() OVER (ORDER BY s.c)"]',
        ),
        (
            HEAD + "WHEN NOT MATCHED THEN INSERT (v) VALUES (my_udf(s.v))",
            "merge_sql WHEN clause 1 INSERT v: expected Spark built-in functions only, found my_udf(), "
            "which is "
            "not a Spark SQL built-in function (user-defined functions are not allowed in merge expressions)",
        ),
    ],
)
def test_guard_applies_to_every_expression(sql: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(sql)
    assert error.value.bare_message == message


def test_guard_applies_in_structural_form_with_its_field_names() -> None:
    spec = spec_of(
        condition="target.k = source.k",
        clauses=[{"when": "matched", "action": "update", "set": {"addr.city": "reflect('a', 'b')"}}],
    )
    with pytest.raises(
        MergeSpecError, match=r"^clauses\[0\]\.set\.addr\.city: expected Spark built-in functions"
    ):
        spec.validate()


def test_non_deterministic_values_are_allowed_as_in_delta() -> None:
    validate_sql(
        HEAD + "WHEN MATCHED THEN UPDATE SET id2 = uuid() WHEN NOT MATCHED THEN INSERT (r) VALUES (rand())"
    )


def test_check_parsed_merge_on_a_hand_built_merge() -> None:
    parsed = ParsedMerge("t", "s", "t.k = s.k", (MergeClause("matched", "update"),))
    with pytest.raises(MergeSpecError) as error:
        check_parsed_merge(parsed, sql_form=False)
    assert error.value.bare_message == "clauses[0]: expected at least one assignment for update, found none"


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "-- MERGE INTO t",
            "merge_sql: expected Spark SQL, found only comments or blanks: '-- MERGE INTO t'",
        ),
        (
            ";",
            "merge_sql: Syntax error at or near end of input: expected a MERGE INTO statement, found the end "
            "of the statement at line 1, column 2",
        ),
        ("", "merge_sql: expected a MERGE INTO statement, found '' (str)"),
    ],
)
def test_empty_statements(sql: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        validate_sql(sql)
    assert error.value.bare_message == message


_EXPRESSIONS = [
    "s.v > 1",
    "t.a = s.a AND s.b IS NOT NULL",
    "coalesce(s.x, 0) + 1",
    "s.`a b` <=> t.c",
    "named_struct('a', s.a)",
    "t.x == 2",
    "CASE WHEN s.op = 'D' THEN NULL ELSE s.v END",
    "transform(s.arr, x -> x * 2)",
]
_COLUMNS = [("a",), ("addr", "city"), ("a b",), ("t", "v"), ("T", "w", "x"), ("x.y",)]
_WHEN_SQL = {
    "matched": ["MATCHED"],
    "not_matched": ["NOT MATCHED", "NOT MATCHED BY TARGET"],
    "not_matched_by_source": ["NOT MATCHED BY SOURCE"],
}


@st.composite
def _clause_pairs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    when = draw(st.sampled_from(sorted(_WHEN_SQL)))
    # The actions Spark's grammar has for each kind (the others are refused by the parser).
    allowed = {
        "matched": ["update", "update_all", "delete"],
        "not_matched": ["insert", "insert_all"],
        "not_matched_by_source": ["update", "delete"],
    }
    action = draw(st.sampled_from(allowed[when]))
    condition = draw(st.none() | st.sampled_from(_EXPRESSIONS))
    sql = f"WHEN {draw(st.sampled_from(_WHEN_SQL[when]))}" + (f" AND {condition}" if condition else "")
    data: dict[str, Any] = {"when": when, "action": action} | ({"condition": condition} if condition else {})
    columns = draw(st.lists(st.sampled_from(_COLUMNS), min_size=1, max_size=3, unique=True))
    pairs = {format_column_path(c): draw(st.sampled_from(_EXPRESSIONS)) for c in columns}
    if action == "update":
        sql += " THEN UPDATE SET " + ", ".join(f"{c} = {v}" for c, v in pairs.items())
        data["set"] = pairs
    elif action == "insert":
        sql += f" THEN INSERT ({', '.join(pairs)}) VALUES ({', '.join(pairs.values())})"
        data["values"] = pairs
    else:
        sql += {"update_all": " THEN UPDATE SET *", "delete": " THEN DELETE", "insert_all": " THEN INSERT *"}[
            action
        ]
    return sql, data


@settings(max_examples=100, deadline=None)
@given(st.lists(_clause_pairs(), min_size=1, max_size=5), st.sampled_from(_EXPRESSIONS))
def test_any_statement_and_its_structural_form_parse_alike(
    pairs: list[tuple[str, dict[str, Any]]], condition: str
) -> None:
    # Spark's grammar takes the kinds in this order; the structural form keeps them in the same order here.
    pairs = sorted(
        pairs, key=lambda pair: ["matched", "not_matched", "not_matched_by_source"].index(pair[1]["when"])
    )
    sql = f"MERGE INTO tbl t USING src s ON {condition} " + " ".join(sql for sql, _ in pairs)
    structural = spec_of(
        target_alias="t", source_alias="s", condition=condition, clauses=[d for _, d in pairs]
    )
    assert structural.parsed() == spec_of(merge_sql=sql).parsed()
