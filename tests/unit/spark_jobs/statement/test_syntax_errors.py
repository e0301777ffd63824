"""Broken statements and expressions are refused in the user's words: where (line, column), what Spark
expects there and the text found, never the SQL library's own messages."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.spec import MergeSpec
from spark_jobs.delta_merge.statement.expression_guard import parse_expression
from spark_jobs.delta_merge.statement.merge_sql import parse_merge_sql

HEAD = "MERGE INTO target t USING source s ON t.id = s.id "
SET = HEAD + "WHEN MATCHED THEN UPDATE SET v = "
# What sqlglot says in its own errors; none of it may reach a message or a traceback.
INTERNALS = ("sqlglot", "<class", "\x1b[", "Expecting", "Required keyword", "Error tokenizing",
             "Invalid expression")  # fmt: skip


def _refusal(sql: str) -> MergeSpecError:
    with pytest.raises(MergeSpecError) as error:
        parse_merge_sql(sql)
    return error.value


def _assert_no_internals(error: BaseException) -> None:
    shown = "".join(traceback.format_exception(error))
    for internal in INTERNALS:
        assert internal not in shown, (internal, shown)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        # An unterminated string, quoted name or comment is shown where it starts.
        (SET + "'abc WHEN NOT MATCHED THEN INSERT *",
         "Syntax error at or near \"'abc\": expected the closing ' of this string, found \"'abc WHEN NOT "
         "MATCHED THEN INSERT *\" at line 1, column 84"),
        (SET + "`abc",
         "Syntax error at or near '`abc': expected the closing ` of this quoted name, found '`abc' at "
         "line 1, column 84"),
        (HEAD + "\nWHEN MATCHED THEN UPDATE SET v = x'zz'",
         "Syntax error at or near \"x'zz'\": expected hexadecimal digits (0-9, A-F) in the binary literal "
         "X'...', found \"x'zz'\" at line 2, column 34"),
        # An operand missing at the end, inside the statement or at its end.
        (SET + "s.v + WHEN NOT MATCHED THEN INSERT *",
         "Syntax error at or near 'WHEN': expected an operand after '+' in the value of SET v, found "
         "'WHEN NOT MATCHED THEN INSERT *' at line 1, column 90. Spark SQL refuses this statement."),
        (SET + "s.v +",
         "Syntax error at or near end of input: expected an operand after '+' in the value of SET v, found "
         "the end of the statement at line 1, column 89"),
        (HEAD + "WHEN MATCHED AND NOT THEN DELETE",
         "Syntax error at or near 'THEN': expected an operand after 'NOT' in the condition of WHEN MATCHED "
         "(clause 1), found 'THEN DELETE' at line 1, column 72. Spark SQL refuses this statement."),
        (HEAD + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v *)",
         "Syntax error at or near ')': expected an operand after '*' in INSERT value 2, found ')' at line 1, "
         "column 107. Spark SQL refuses this statement."),
        # Unbalanced CASE, BETWEEN, brackets.
        (SET + "CASE WHEN s.a THEN 1",
         "Syntax error at or near 'CASE': expected END to close this CASE in the value of SET v, found "
         "'CASE WHEN s.a THEN 1' at line 1, column 84. Spark SQL refuses this statement."),
        (HEAD + "WHEN MATCHED AND s.v BETWEEN 1 THEN DELETE",
         "Syntax error at or near 'THEN': expected AND <upper bound> after BETWEEN <lower bound> in the "
         "condition of WHEN MATCHED (clause 1), found 'THEN DELETE' at line 1, column 82. Spark SQL "
         "refuses this statement."),
        (SET + "s.arr[1",
         "Syntax error at or near '[': expected a closing ']' for this '[', found '[1' at line 1, column 89. "
         "Spark SQL refuses this statement."),
        (HEAD + "\n  WHEN MATCHED AND (s.x IN (1, 2) THEN DELETE",
         "Syntax error at or near '(': expected a closing ')' for this '(', found '(s.x IN (1, 2) THEN "
         "DELETE' at line 2, column 20. Spark SQL refuses this statement."),
        # Where the parser stops inside an expression.
        (SET + "CAST(s.v AS)",
         "Syntax error at or near ')': expected a data type after AS in the value of SET v, found ')' at "
         "line 1, column 95. Spark SQL refuses this statement."),
        (SET + "s.v s.w",
         "Syntax error at or near 's': expected ',', another WHEN clause or the end of the statement after "
         "the value of SET v 's.v', found 's.w' at line 1, column 88. Spark SQL refuses this statement."),
    ],
)  # fmt: skip
def test_broken_statements_say_what_and_where(sql: str, message: str) -> None:
    error = _refusal(sql)

    assert error.error_class == "PARSE_SYNTAX_ERROR"
    assert error.bare_message == f"merge_sql: {message}"
    _assert_no_internals(error)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NOT", "at or near end of input: expected an operand after 'NOT', found the end of the expression "
                "at line 1, column 4"),
        ("s.v BETWEEN 1", "at or near end of input: expected AND <upper bound> after BETWEEN <lower bound>, "
                          "found the end of the expression at line 1, column 14"),
        ("s.a = = 1", "at or near '=': expected an operand after '=', found '= 1' at line 1, column 7"),
        ("s.a)", "at or near ')': expected the end of the expression (no '(' is open here), found ')' at "
                 "line 1, column 4"),
        ("CAST(s.v AS)", "at or near ')': expected a data type after AS, found ')' at line 1, column 12"),
        ("s.a /* x", "at or near '/*': expected */ to close this comment, found '/* x' at line 1, column 5"),
        ("s.a = 1 AND\n  s.b = 'x", "at or near \"'x\": expected the closing ' of this string, found \"'x\" "
                                   "at line 2, column 9"),
    ],
)  # fmt: skip
def test_broken_expressions_say_what_and_where(text: str, message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        parse_expression(text, field="condition")

    assert error.value.error_class == "PARSE_SYNTAX_ERROR"
    assert error.value.bare_message == f"condition: Syntax error {message}"
    _assert_no_internals(error.value)


def _spec(**fields: Any) -> dict[str, Any]:
    return {"target": {"uri": "/t"}, "source": {"uri": "/s"}, **fields}


UPDATE_V = [{"when": "matched", "action": "update", "set": {"v": "s.v +"}}]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_spec(condition="t.id = s.id", clauses=UPDATE_V),
         "clauses[0].set.v: Syntax error at or near end of input: expected an operand after '+', found the "
         "end of the expression at line 1, column 6"),
        (_spec(condition="t.id = (s.id", clauses=[{"when": "matched", "action": "delete"}]),
         "condition: Syntax error at or near '(': expected a closing ')' for this '(', found '(s.id' at "
         "line 1, column 8"),
        (_spec(source={"query": "SELECT * FROM landing WHERE day = '2024-01-01"},
               merge_sql=HEAD + "WHEN MATCHED THEN DELETE"),
         "source.query: Syntax error at or near \"'2024-01-01\": expected the closing ' of this string, "
         "found \"'2024-01-01\" at line 1, column 35"),
    ],
)  # fmt: skip
def test_every_field_names_itself_and_the_position_in_it(data: dict[str, Any], message: str) -> None:
    with pytest.raises(MergeSpecError) as error:
        MergeSpec.from_dict(data).validate()

    assert error.value.bare_message == message
    _assert_no_internals(error.value)
