"""Syntax errors in merge SQL, told in the user's words: where, what Spark expects there, what was found.

Never the SQL library's own text: sqlglot's messages name its classes ("Required keyword: 'this' missing for
<class 'sqlglot.expressions.core.Not'>") and its tokenizer dumps context. Its errors only give a position
here; what is wrong is worked out from the tokens (an unclosed bracket, string or CASE, a missing operand).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import Token, TokenType
from sqlglot.errors import ParseError, SqlglotError

from spark_jobs.delta_merge.errors import MergeSpecError

__all__ = [
    "PARSE_SYNTAX_ERROR",
    "SyntaxProblem",
    "excerpt",
    "expression_problem",
    "incomplete_expression",
    "position",
    "syntax_error",
    "unreadable_text",
]

PARSE_SYNTAX_ERROR = "PARSE_SYNTAX_ERROR"
_EXCERPT = 60
# Tokens that need an operand after them: an expression cannot end with one.
_NEEDS_OPERAND = frozenset({
    TokenType.PLUS, TokenType.DASH, TokenType.SLASH, TokenType.MOD, TokenType.DIV, TokenType.DPIPE,
    TokenType.PIPE, TokenType.AMP, TokenType.CARET, TokenType.TILDE, TokenType.EQ, TokenType.NEQ,
    TokenType.NULLSAFE_EQ, TokenType.LT, TokenType.LTE, TokenType.GT, TokenType.GTE, TokenType.AND,
    TokenType.OR, TokenType.NOT, TokenType.LIKE, TokenType.ILIKE, TokenType.RLIKE, TokenType.IN, TokenType.IS,
    TokenType.BETWEEN, TokenType.DOT, TokenType.COMMA, TokenType.ARROW, TokenType.DCOLON, TokenType.WHEN,
    TokenType.THEN, TokenType.ELSE, TokenType.ALIAS,
})  # fmt: skip
_CLOSERS = {TokenType.L_PAREN: TokenType.R_PAREN, TokenType.L_BRACKET: TokenType.R_BRACKET}
_TEXT = {TokenType.L_PAREN: "(", TokenType.R_PAREN: ")", TokenType.L_BRACKET: "[", TokenType.R_BRACKET: "]"}
_QUOTES = {"'": "string", '"': "string", "`": "quoted name"}
_HEX_LITERAL = re.compile(r"\b[xX]'([^']*)'")


@dataclass(frozen=True)
class SyntaxProblem:
    """What is wrong at one place of a text.

    :param offset: where, as an index into the text (its length when something is missing at the end).
    :param expected: what Spark SQL expects there, e.g. ``"END to close this CASE"``.
    """

    offset: int
    expected: str


def position(text: str, offset: int) -> str:
    """``line L, column C`` of ``text[offset]`` (both counted from 1)."""
    line = text.count("\n", 0, offset) + 1
    column = offset - text.rfind("\n", 0, offset)
    return f"line {line}, column {column}"


def excerpt(text: str, offset: int) -> str:
    """The text from ``offset`` on, cut to 60 characters."""
    rest = text[offset:].strip()
    return rest if len(rest) <= _EXCERPT else f"{rest[: _EXCERPT - 3]}..."


def syntax_error(
    field: str, text: str, problem: SyntaxProblem, *, near: str | None = None, what: str = "expression"
) -> MergeSpecError:
    """``<field>: Syntax error at or near <near>: expected <...>, found <text> at line L, column C``.

    :param near: the token at the problem's offset (default: the text there up to a blank).
    :param what: what ``text`` is, for "found the end of the <what>".
    """
    if not text[problem.offset :].strip():
        return MergeSpecError(
            f"{field}: Syntax error at or near end of input: expected {problem.expected}, found the end of "
            f"the {what} at {position(text, len(text.rstrip()))}",
            error_class=PARSE_SYNTAX_ERROR,
        )
    if near is None:
        near = text[problem.offset :].split(maxsplit=1)[0][:20]
    return MergeSpecError(
        f"{field}: Syntax error at or near {near!r}: expected {problem.expected}, found "
        f"{excerpt(text, problem.offset)!r} at {position(text, problem.offset)}",
        error_class=PARSE_SYNTAX_ERROR,
    )


def unreadable_text(text: str, error: SqlglotError) -> SyntaxProblem:
    """Why ``text`` cannot be split into tokens: an unclosed string, quoted name or comment, a bad hex
    literal, or else the region sqlglot's tokenizer stopped in."""
    problem = _unclosed(text)
    if problem is not None:
        return problem
    for match in _HEX_LITERAL.finditer(text):
        if re.fullmatch(r"[0-9A-Fa-f]*", match.group(1)) is None:
            return SyntaxProblem(match.start(), "hexadecimal digits (0-9, A-F) in the binary literal X'...'")
    # sqlglot's TokenError says only that the failure is within 50 characters of `start`.
    start = getattr(error, "start", 0)
    return SyntaxProblem(start if isinstance(start, int) and 0 <= start < len(text) else 0, "Spark SQL")


def _unclosed(text: str) -> SyntaxProblem | None:
    index = 0
    while index < len(text):
        char = text[index]
        if char in _QUOTES:
            end = _closing_quote(text, index)
            if end is None:
                return SyntaxProblem(index, f"the closing {char} of this {_QUOTES[char]}")
            index = end + 1
        elif text.startswith("--", index):
            newline = text.find("\n", index)
            index = len(text) if newline < 0 else newline + 1
        elif text.startswith("/*", index):
            end = text.find("*/", index + 2)
            if end < 0:
                return SyntaxProblem(index, "*/ to close this comment")
            index = end + 2
        else:
            index += 1
    return None


def _closing_quote(text: str, opening: int) -> int | None:
    quote = text[opening]
    index = opening + 1
    while index < len(text):
        if text[index] == "\\" and quote != "`":
            index += 2  # an escaped character, as Spark reads string literals
        elif text[index] == quote:
            return index
        else:
            index += 1
    return None


def incomplete_expression(text: str, tokens: Sequence[Token]) -> SyntaxProblem | None:
    """The problem of an expression that is cut short or unbalanced, or None: an unclosed or unopened
    bracket, a CASE without END, a BETWEEN without AND, or an operator with nothing after it.

    :param tokens: the expression's tokens, their offsets indexing ``text``.
    """
    if not tokens:
        return None
    opened: list[Token] = []
    for token in tokens:
        if token.token_type in _CLOSERS:
            opened.append(token)
        elif token.token_type in _CLOSERS.values():
            if not opened or _CLOSERS[opened[-1].token_type] != token.token_type:
                opener = next(o for o, c in _CLOSERS.items() if c == token.token_type)
                return SyntaxProblem(
                    token.start, f"the end of the expression (no {_TEXT[opener]!r} is open here)"
                )
            opened.pop()
    if opened:
        closer = _TEXT[_CLOSERS[opened[0].token_type]]
        return SyntaxProblem(
            opened[0].start, f"a closing {closer!r} for this {_TEXT[opened[0].token_type]!r}"
        )
    open_cases: list[Token] = []
    betweens: list[Token] = []
    for token in tokens:
        if token.token_type == TokenType.CASE:
            open_cases.append(token)
        elif token.token_type == TokenType.END and open_cases:
            open_cases.pop()
        elif token.token_type == TokenType.BETWEEN:
            betweens.append(token)
        elif token.token_type == TokenType.AND and betweens:
            betweens.pop()
    if open_cases:
        return SyntaxProblem(open_cases[-1].start, "END to close this CASE")
    end = tokens[-1].end + 1
    if betweens:
        return SyntaxProblem(end, f"AND <upper bound> after {_raw(text, betweens[-1])} <lower bound>")
    last = tokens[-1].token_type
    # A '*' after '.' is a star (s.*), anywhere else a product without its second factor.
    product = last == TokenType.STAR and (len(tokens) == 1 or tokens[-2].token_type != TokenType.DOT)
    if last in _NEEDS_OPERAND or last == TokenType.CASE or product:
        return SyntaxProblem(end, f"an operand after {_raw(text, tokens[-1])!r}")
    return None


def expression_problem(text: str, tokens: Sequence[Token], error: SqlglotError) -> SyntaxProblem:
    """Why ``text`` (its ``tokens``) did not parse as one expression: :func:`incomplete_expression`, else
    the token sqlglot's parser stopped at."""
    problem = incomplete_expression(text, tokens)
    if problem is not None:
        return problem
    stopped = _stopped_at(text, tokens, error)
    if stopped is None or stopped == 0:
        return SyntaxProblem(tokens[0].start if tokens else 0, "an expression (a value, a column or a call)")
    before = tokens[stopped - 1]
    if before.token_type == TokenType.ALIAS:
        return SyntaxProblem(tokens[stopped].start, "a data type after AS")
    if before.token_type in _NEEDS_OPERAND:
        return SyntaxProblem(tokens[stopped].start, f"an operand after {_raw(text, before)!r}")
    return SyntaxProblem(tokens[stopped].start, "an operator, or the end of the expression")


def _stopped_at(text: str, tokens: Sequence[Token], error: SqlglotError) -> int | None:
    """The index of the token sqlglot's parser stopped at, from the line and column it reports."""
    details = error.errors[0] if isinstance(error, ParseError) and error.errors else {}
    line, column = details.get("line"), details.get("col")
    if not isinstance(line, int) or not isinstance(column, int):
        return None
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    # sqlglot's column is where the token it stopped at ends, counted from 1.
    offset = sum(len(part) + 1 for part in lines[: line - 1]) + column - 1
    for index, token in enumerate(tokens):
        if token.start <= offset <= token.end:
            return index
    return None


def _raw(text: str, token: Token) -> str:
    return text[token.start : token.end + 1]
