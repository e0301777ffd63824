"""MERGE INTO text to a ParsedMerge, following Spark SQL's grammar and consuming every token.

Spark's grammar (SqlBaseParser.g4, ``mergeIntoTable``) is small and fixed, so it is followed here by hand over
sqlglot's tokens: no general-purpose SQL parser in Python implements it without accepting and silently
dropping text it does not understand (a Postgres ``UPDATE SET ... WHERE``, a ``RETURNING``). Each expression
(ON, clause conditions, values) is an exact slice of the statement, checked by sqlglot to be exactly one
expression; the job runs those slices and checks them against Spark's own parse of the whole statement.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.errors import SqlglotError

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.sql_names import quoted_name
from spark_jobs.delta_merge.statement.expression_guard import tokenize_checked
from spark_jobs.delta_merge.statement.merge_rules import ErrorFields, strip_target_alias
from spark_jobs.delta_merge.statement.parsed_merge import (
    Assignment,
    ClauseKind,
    MergeClause,
    ParsedMerge,
)
from spark_jobs.delta_merge.statement.syntax_errors import (
    PARSE_SYNTAX_ERROR,
    excerpt,
    expression_problem,
    incomplete_expression,
    position,
)

__all__ = ["SOURCE_VIEW", "parse_merge_sql"]

# In a USING subquery or a CTE, this name stands for the spec's source (the job registers it as a view).
SOURCE_VIEW = "source"
_SYNTAX = PARSE_SYNTAX_ERROR
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Words that end a name or an alias: a clause keyword is never taken for an alias, as in Spark.
_CLAUSE_WORDS = frozenset({"USING", "ON", "WHEN", "THEN", "AND", "MERGE", "INTO", "WITH"})
_KIND_ORDER: tuple[ClauseKind, ...] = ("matched", "not_matched", "not_matched_by_source")
_KIND_TEXT = {
    "matched": "WHEN MATCHED",
    "not_matched": "WHEN NOT MATCHED",
    "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE",
}
# Text other dialects put where Spark has none of it: the hint says how Spark writes it.
_NO_ROWS = (
    "Spark's MERGE returns no rows (there is no RETURNING or OUTPUT clause); the merge's metrics are "
    "returned to XCom"
)
_HINTS = {
    "WHERE": "Spark's MERGE has no WHERE in a WHEN clause: write the condition as "
    "WHEN MATCHED AND <condition> THEN ...",
    "RETURNING": _NO_ROWS,
    "OUTPUT": _NO_ROWS,
    "VALUES": "Spark's INSERT needs the column list: INSERT (col, ...) VALUES (value, ...), or INSERT *",
    "DO": "Spark's MERGE has no DO NOTHING: leave the clause out",
    "IF": "Spark's MERGE has no IF: put the condition after WHEN MATCHED AND",
    "SELECT": "a MERGE statement is one statement: the source query goes in USING (...) AS alias",
}


def parse_merge_sql(merge_sql: str, *, field: str = "merge_sql") -> ParsedMerge:
    """Parse one ``[WITH ...] MERGE [WITH SCHEMA EVOLUTION] INTO ... USING ... ON ... WHEN ...`` statement.

    The names after MERGE INTO and USING stand for the spec's target and source; their aliases (or, without
    an alias, the names themselves) are what the expressions refer to. USING may also be a subquery or
    name a CTE of the statement's WITH: that query is the merge's source, and in it the name ``source``
    stands for the spec's source.

    :raises MergeSpecError: for any text Spark's grammar does not have at that place, quoting it.
    """
    if not isinstance(merge_sql, str) or not merge_sql.strip():
        raise MergeSpecError(f"{field}: expected a MERGE INTO statement, found {merge_sql!r}")
    tokens = tokenize_checked(merge_sql, field=field, allow_trailing_semicolon=True)
    return _StatementParser(merge_sql, tokens, field=field).statement()


class _StatementParser:
    """A cursor over the statement's tokens, with one method per rule of Spark's mergeIntoTable."""

    def __init__(self, sql: str, tokens: Sequence[Token], *, field: str) -> None:
        self.sql = sql
        self.tokens = list(tokens)
        while self.tokens and self.tokens[-1].token_type == TokenType.SEMICOLON:
            self.tokens.pop()  # trailing ';' end the statement, as in Spark's grammar
        self.field = field
        self.fields = ErrorFields(sql=True)
        self.i = 0
        self.target_alias = ""

    # -- the rules ---------------------------------------------------------------------------------------

    def statement(self) -> ParsedMerge:
        ctes, with_text = self._with_clause()
        self._expect("MERGE", "a MERGE INTO statement")
        schema_evolution = False
        if self._at("WITH"):
            self.i += 1
            self._expect("SCHEMA", "SCHEMA EVOLUTION after MERGE WITH")
            self._expect("EVOLUTION", "EVOLUTION after MERGE WITH SCHEMA")
            schema_evolution = True
        self._expect("INTO", "INTO after MERGE")
        target = self._name("the target table's name after MERGE INTO")
        target_alias = self._alias("the target") or target[-1]
        self.target_alias = target_alias
        self._expect("USING", "USING <source> after the target")
        source_query, source_alias = self._source(ctes, with_text)
        self._expect("ON", "ON <merge condition> after the source")
        condition = self._expression(
            "the ON condition", stops={"WHEN"}, followed_by="WHEN MATCHED or WHEN NOT MATCHED"
        )
        clauses: list[MergeClause] = []
        while self._at("WHEN"):
            clauses.append(self._clause(len(clauses)))
        if not clauses and self.i == len(self.tokens):
            raise MergeSpecError(
                f"{self.field}: There must be at least one WHEN clause in a MERGE statement.",
                error_class="DELTA_MERGE_MISSING_WHEN",
            )
        if self.i < len(self.tokens):
            raise self._unexpected("another WHEN clause or the end of the statement")
        self._check_clause_order(clauses)
        return ParsedMerge(
            target_alias=target_alias,
            source_alias=source_alias,
            condition=condition,
            clauses=tuple(clauses),
            source_query=source_query,
            schema_evolution=schema_evolution,
        )

    def _with_clause(self) -> tuple[set[str], str | None]:
        """``WITH name [(cols)] [AS] (query) [, ...]`` before MERGE: the CTE names and the clause's text."""
        if not self._at("WITH"):
            return set(), None
        start = self.i
        self.i += 1
        names: set[str] = set()
        while True:
            names.add(self._identifier("a CTE name after WITH").lower())
            if self._at_type(TokenType.L_PAREN):
                self.i = self._closing_paren(self.i) + 1  # the CTE's column names
            if self._at("AS"):
                self.i += 1
            if not self._at_type(TokenType.L_PAREN):
                raise self._unexpected("( <query> ) for the CTE")
            self.i = self._closing_paren(self.i) + 1
            if not self._at_type(TokenType.COMMA):
                break
            self.i += 1
        return names, self._text(start, self.i)

    def _source(self, ctes: set[str], with_text: str | None) -> tuple[str | None, str]:
        """The source after USING: the spec's source (a name), a CTE, or a subquery; and its alias."""
        if self._at_type(TokenType.L_PAREN):
            close = self._closing_paren(self.i)
            if close == self.i + 1:
                raise self._unexpected("a query inside USING ( )")
            inner = self._text(self.i + 1, close)
            self.i = close + 1
            alias = self._alias("the source")
            if alias is None:
                raise self._unexpected(
                    "an alias for the USING subquery (USING (...) AS s), which the ON "
                    "condition and the clauses refer to"
                )
            prefix = f"{with_text} " if with_text else ""
            query = f"{prefix}SELECT * FROM ({inner}) AS {quoted_name(alias)}" if with_text else inner
            return query, alias
        name = self._name("the source after USING: a name, or a query in parentheses")
        alias = self._alias("the source") or name[-1]
        if with_text is None:
            return None, alias
        if len(name) != 1 or name[0].lower() not in ctes:
            raise MergeSpecError(
                f"{self.field}: expected USING to name one of the statement's CTEs "
                f"({', '.join(sorted(ctes))}), found {'.'.join(name)!r}. Refer to the spec's source as "
                f"`{SOURCE_VIEW}` inside the CTE.",
                error_class=_SYNTAX,
            )
        return f"{with_text} SELECT * FROM {quoted_name(name[0])}", alias

    def _clause(self, index: int) -> MergeClause:
        self.i += 1  # WHEN
        kind: ClauseKind
        if self._at("MATCHED"):
            kind = "matched"
            self.i += 1
        elif self._at("NOT"):
            self.i += 1
            self._expect("MATCHED", "MATCHED after WHEN NOT")
            kind = "not_matched"
            if self._at("BY"):
                self.i += 1
                if self._at("SOURCE"):
                    kind = "not_matched_by_source"
                elif not self._at("TARGET"):
                    raise self._unexpected("TARGET or SOURCE after WHEN NOT MATCHED BY")
                self.i += 1
        else:
            raise self._unexpected(
                "MATCHED, NOT MATCHED, NOT MATCHED BY TARGET or NOT MATCHED BY SOURCE after WHEN"
            )
        head = _KIND_TEXT[kind]
        condition = None
        if self._at("AND"):
            self.i += 1
            condition = self._expression(
                f"the condition of {head} (clause {index + 1})", stops={"THEN", "WHEN"}, followed_by="THEN"
            )
        self._expect("THEN", f"THEN after {head}{' AND <condition>' if condition else ''}")
        if kind == "not_matched":
            return self._insert(index, condition)
        if self._at("DELETE"):
            self.i += 1
            return MergeClause(kind, "delete", condition)
        if not self._at("UPDATE"):
            expected = "UPDATE or DELETE"
            raise self._unexpected(f"{expected} after {head} ... THEN")
        self.i += 1
        self._expect("SET", "SET after UPDATE")
        if self._at_type(TokenType.STAR):
            if kind == "not_matched_by_source":
                raise self._unexpected(
                    "SET <column> = <value>: WHEN NOT MATCHED BY SOURCE has no source row for UPDATE SET *"
                )
            self.i += 1
            return MergeClause(kind, "update_all", condition)
        pairs = []
        while True:
            column = self._name("a target column name after SET")
            self._expect_type(TokenType.EQ, f"= after the SET column {'.'.join(column)}")
            value = self._expression(
                f"the value of SET {'.'.join(column)}",
                stops={"WHEN"},
                comma=True,
                followed_by="',', another WHEN clause or the end of the statement",
            )
            pairs.append((column, value))
            if not self._at_type(TokenType.COMMA):
                break
            self.i += 1
        return MergeClause(kind, "update", condition, self._assignments(pairs))

    def _insert(self, index: int, condition: str | None) -> MergeClause:
        if not self._at("INSERT"):
            raise self._unexpected("INSERT after WHEN NOT MATCHED ... THEN")
        self.i += 1
        if self._at_type(TokenType.STAR):
            self.i += 1
            return MergeClause("not_matched", "insert_all", condition)
        if not self._at_type(TokenType.L_PAREN):
            raise self._unexpected("( <target columns> ) VALUES ( <values> ) or * after INSERT")
        self.i += 1
        columns = []
        while True:
            columns.append(self._name("a target column name in INSERT ( )"))
            if not self._at_type(TokenType.COMMA):
                break
            self.i += 1
        self._expect_type(TokenType.R_PAREN, "',' or ')' in the INSERT column list")
        self._expect("VALUES", "VALUES after the INSERT column list")
        self._expect_type(TokenType.L_PAREN, "( <values> ) after VALUES")
        values: list[str] = []
        while True:
            values.append(
                self._expression(
                    f"INSERT value {len(values) + 1}", stops=set(), comma=True, followed_by="',' or ')'"
                )
            )
            if not self._at_type(TokenType.COMMA):
                break
            self.i += 1
        self._expect_type(TokenType.R_PAREN, "',' or ')' after an INSERT value")
        if len(columns) != len(values):
            raise MergeSpecError(
                f"{self.fields.clause(index)}: expected as many INSERT values as columns, found "
                f"{len(columns)} columns and {len(values)} values"
            )
        return MergeClause(
            "not_matched", "insert", condition, self._assignments(list(zip(columns, values, strict=True)))
        )

    def _assignments(self, pairs: Sequence[tuple[tuple[str, ...], str]]) -> tuple[Assignment, ...]:
        # Spark resolves `t.v` in SET and INSERT against the target: the alias is not part of the column.
        return tuple(
            Assignment(strip_target_alias(column, self.target_alias), value) for column, value in pairs
        )

    def _check_clause_order(self, clauses: Sequence[MergeClause]) -> None:
        ranks = [_KIND_ORDER.index(c.when) for c in clauses]
        for index in range(1, len(ranks)):
            if ranks[index] < ranks[index - 1]:
                raise MergeSpecError(
                    f"{self.field}: expected the WHEN clauses in Spark's order (all WHEN MATCHED, then "
                    "WHEN NOT MATCHED [BY TARGET], then WHEN NOT MATCHED BY SOURCE), found "
                    f"{_KIND_TEXT[clauses[index].when]} (clause {index + 1}) after "
                    f"{_KIND_TEXT[clauses[index - 1].when]} (clause {index}); move it up",
                    error_class=_SYNTAX,
                )

    # -- names and expressions -----------------------------------------------------------------------

    def _name(self, expected: str) -> tuple[str, ...]:
        parts = [self._identifier(expected)]
        while self._at_type(TokenType.DOT):
            self.i += 1
            parts.append(self._identifier(f"a name after '.' in {'.'.join(parts)}."))
        return tuple(parts)

    def _identifier(self, expected: str) -> str:
        if self.i >= len(self.tokens):
            raise self._unexpected(expected)
        token = self.tokens[self.i]
        raw = self._raw(self.i)
        if raw.startswith("`"):
            self.i += 1
            return str(token.text)
        if _WORD.fullmatch(raw) and raw.upper() not in _CLAUSE_WORDS:
            self.i += 1
            return raw
        raise self._unexpected(expected)

    def _alias(self, role: str) -> str | None:
        if self._at("AS"):
            self.i += 1
            alias = self._identifier(f"an alias for {role} after AS")
        elif self.i < len(self.tokens) and (self._raw(self.i).startswith("`") or self._is_plain_word(self.i)):
            alias = self._identifier(f"an alias for {role}")
        else:
            return None
        if self._at_type(TokenType.L_PAREN):
            raise MergeSpecError(
                f"{self.field}: Column aliases are not allowed in MERGE (found {self._rest(self.i)!r} after "
                f"the alias {alias!r} of {role}); alias the columns inside a USING subquery instead",
                error_class="COLUMN_ALIASES_NOT_ALLOWED",
            )
        return alias

    def _expression(self, what: str, *, stops: set[str], followed_by: str, comma: bool = False) -> str:
        """The exact text of one expression, which ends before a stop word, ',' (with comma) or ')'."""
        start, end = self.i, self._expression_end(self.i, stops, comma=comma)
        if end == start:
            raise self._unexpected(what)
        text = self._text(start, end)
        if not _is_one_expression(text):
            raise self._not_one_expression(start, end, what, followed_by)
        self.i = end
        return text

    def _not_one_expression(self, start: int, end: int, what: str, followed_by: str) -> MergeSpecError:
        """Why tokens ``start:end`` are not one expression, at the statement's line and column."""
        text = self._text(start, end)
        tokens = tokenize_checked(text, field=f"{self.field} {what}")  # offsets into `text`
        base = self.tokens[start].start
        problem = incomplete_expression(text, tokens)
        if problem is None:
            # The longest prefix that is one expression shows where Spark's grammar stops taking text.
            for prefix_end in range(end - 1, start, -1):
                prefix = self._text(start, prefix_end)
                # A name before '(' is a call's, not an expression that ends there.
                call = self.tokens[prefix_end].token_type == TokenType.L_PAREN
                if not call and _is_one_expression(prefix):
                    self.i = prefix_end
                    return self._unexpected(f"{followed_by} after {what} {prefix!r}")
            try:
                sqlglot.parse_one(text, dialect="spark", into=exp.Condition)
            except SqlglotError as error:
                problem = expression_problem(text, tokens, error)
            else:  # pragma: no cover - the caller saw it fail
                raise AssertionError(f"{text!r} parses as one expression")
        self.i = next((i for i in range(start, end) if self.tokens[i].start >= base + problem.offset), end)
        return self._unexpected(f"{problem.expected} in {what}")

    def _expression_end(self, start: int, stops: set[str], *, comma: bool) -> int:
        opened: list[int] = []
        case_depth = 0
        index = start
        while index < len(self.tokens):
            kind = self.tokens[index].token_type
            depth = len(opened)
            if kind in (TokenType.L_PAREN, TokenType.L_BRACKET):
                opened.append(index)
            elif kind in (TokenType.R_PAREN, TokenType.R_BRACKET):
                if depth == 0:
                    break
                opened.pop()
            elif depth == 0:
                word = self._raw(index).upper()
                if word == "CASE":
                    case_depth += 1
                elif word == "END" and case_depth:
                    case_depth -= 1
                elif case_depth == 0 and (word in stops or (comma and kind == TokenType.COMMA)):
                    break
            index += 1
        if opened:
            self.i = opened[0]
            bracket = self._raw(self.i)
            raise self._unexpected(f"a closing {')' if bracket == '(' else ']'!r} for this {bracket!r}")
        return index

    def _closing_paren(self, open_index: int) -> int:
        depth = 0
        for index in range(open_index, len(self.tokens)):
            kind = self.tokens[index].token_type
            if kind == TokenType.L_PAREN:
                depth += 1
            elif kind == TokenType.R_PAREN:
                depth -= 1
                if depth == 0:
                    return index
        self.i = open_index
        raise self._unexpected("a closing ')' for this '('")

    # -- the cursor ----------------------------------------------------------------------------------

    def _raw(self, index: int) -> str:
        token = self.tokens[index]
        return self.sql[token.start : token.end + 1]

    def _is_plain_word(self, index: int) -> bool:
        raw = self._raw(index)
        return bool(_WORD.fullmatch(raw)) and raw.upper() not in _CLAUSE_WORDS

    def _at(self, word: str) -> bool:
        return self.i < len(self.tokens) and self._raw(self.i).upper() == word

    def _at_type(self, kind: TokenType) -> bool:
        return self.i < len(self.tokens) and self.tokens[self.i].token_type == kind

    def _expect(self, word: str, expected: str) -> None:
        if not self._at(word):
            raise self._unexpected(expected)
        self.i += 1

    def _expect_type(self, kind: TokenType, expected: str) -> None:
        if not self._at_type(kind):
            raise self._unexpected(expected)
        self.i += 1

    def _text(self, start: int, end: int) -> str:
        """The statement's text from token ``start`` up to (not including) token ``end``."""
        return self.sql[self.tokens[start].start : self.tokens[end - 1].end + 1]

    def _rest(self, index: int) -> str:
        return "" if index >= len(self.tokens) else excerpt(self.sql, self.tokens[index].start)

    def _unexpected(self, expected: str) -> MergeSpecError:
        if self.i >= len(self.tokens):
            return MergeSpecError(
                f"{self.field}: Syntax error at or near end of input: expected {expected}, found the end of "
                f"the statement at {position(self.sql, len(self.sql.rstrip()))}",
                error_class=_SYNTAX,
            )
        where = position(self.sql, self.tokens[self.i].start)
        hint = _HINTS.get(self._raw(self.i).upper())
        return MergeSpecError(
            f"{self.field}: Syntax error at or near {self._raw(self.i)!r}: expected {expected}, found "
            f"{self._rest(self.i)!r} at {where}{f' ({hint})' if hint else ''}. Spark SQL refuses this "
            "statement.",
            error_class=_SYNTAX,
        )


def _is_one_expression(text: str) -> bool:
    try:
        sqlglot.parse_one(text, dialect="spark", into=exp.Condition)
    except SqlglotError:
        return False
    return True


