"""Spark's own parser has the last word on a MERGE statement, before any data is read.

The contract's parser (``merge_sql``) works without a JVM on the Airflow side. Here the session's SQL parser
parses the same text; the job runs only if Spark reads it as a MERGE with the same clauses, conditions,
assignments, aliases and source, and the expression guard's refusals hold for Spark's own expression trees
too (subqueries, functions that are not built-ins). Walking Spark's unresolved plan through py4j is written
by hand: no library exposes Catalyst's parse tree to Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.errors import ParseException
from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.statement.expression_guard import (
    FILE_FUNCTIONS,
    REFLECTION_FUNCTIONS,
    SPARK_BUILTIN_FUNCTIONS,
    TABLE_FUNCTIONS,
)
from spark_jobs.delta_merge.statement.merge_rules import strip_target_alias
from spark_jobs.delta_merge.statement.parsed_merge import ClauseKind, MergeClause, ParsedMerge

__all__ = ["check_with_spark_parser"]

_FIELD = "merge_sql"
_ACTION_CLASSES = {
    "UpdateAction": "update",
    "UpdateStarAction": "update_all",
    "DeleteAction": "delete",
    "InsertAction": "insert",
    "InsertStarAction": "insert_all",
}
_SUBQUERY_CLASSES = frozenset({"ScalarSubquery", "Exists", "ListQuery", "LateralSubquery", "InSubquery"})
_KIND_LISTS: tuple[tuple[ClauseKind, str], ...] = (
    ("matched", "matchedActions"),
    ("not_matched", "notMatchedActions"),
    ("not_matched_by_source", "notMatchedBySourceActions"),
)


def check_with_spark_parser(spark: SparkSession, merge_sql: str, parsed: ParsedMerge) -> None:
    """Refuse ``merge_sql`` unless Spark's parser reads it exactly as ``parsed`` (the contract's parse).

    :raises MergeSpecError: with Spark's error class when Spark refuses the text, or naming the part that
        Spark reads differently.
    """
    parser = spark._jsparkSession.sessionState().sqlParser()
    plan = _parse(lambda: parser.parsePlan(merge_sql), what="the statement")
    ctes: set[str] = set()
    if _class(plan) == "UnresolvedWith":
        ctes = {str(relation._1()).lower() for relation in _seq(plan.cteRelations())}
        plan = plan.child()
    if _class(plan) != "MergeIntoTable":
        raise MergeSpecError(
            f"{_FIELD}: expected a MERGE INTO statement, found one Spark parses as {_class(plan)}",
            error_class="PARSE_SYNTAX_ERROR",
        )
    checker = _Checker(parser)
    checker.same_expression("the ON condition", plan.mergeCondition(), parsed.condition)
    if bool(plan.withSchemaEvolution()) != parsed.schema_evolution:
        raise _differs(
            "WITH SCHEMA EVOLUTION", str(bool(plan.withSchemaEvolution())), str(parsed.schema_evolution)
        )
    for kind, accessor in _KIND_LISTS:
        actions = _seq(getattr(plan, accessor)())
        clauses = parsed.clauses_of(kind)
        if len(actions) != len(clauses):
            raise _differs(f"the number of {kind} clauses", str(len(actions)), str(len(clauses)))
        for position, (action, clause) in enumerate(zip(actions, clauses, strict=True)):
            checker.same_clause(f"{kind} clause {position + 1}", action, clause, parsed.target_alias)
    _check_relation("the target", plan.targetTable(), parsed.target_alias, query_expected=False, ctes=set())
    _check_relation(
        "the source",
        plan.sourceTable(),
        parsed.source_alias,
        query_expected=parsed.source_query is not None,
        ctes=ctes,
    )
    if parsed.source_query is not None:
        _parse(lambda: parser.parsePlan(parsed.source_query), what="the USING query")


class _Checker:
    """Compares Spark's expression trees with Spark's parse of the contract's expression texts."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser

    def same_expression(self, where: str, spark_expression: Any, text: str) -> None:
        _guard(where, spark_expression)  # first: subqueries carry ids that make equal trees differ
        ours = _parse(lambda: self.parser.parseExpression(text), what=where)
        if not spark_expression.equals(ours):
            raise _differs(where, spark_expression.sql(), text)

    def same_clause(self, where: str, action: Any, clause: MergeClause, target_alias: str) -> None:
        kind = _ACTION_CLASSES.get(_class(action))
        if kind != clause.action:
            raise _differs(f"the action of {where}", str(kind), clause.action)
        condition = action.condition()
        if bool(condition.isDefined()) != (clause.condition is not None):
            raise _differs(f"the condition of {where}", _option_sql(condition), str(clause.condition))
        if clause.condition is not None:
            self.same_expression(f"the condition of {where}", condition.get(), clause.condition)
        if clause.action not in ("update", "insert"):
            return
        assignments = _seq(action.assignments())
        if len(assignments) != len(clause.assignments):
            raise _differs(f"the assignments of {where}", str(len(assignments)), str(len(clause.assignments)))
        for assignment, ours in zip(assignments, clause.assignments, strict=True):
            column = strip_target_alias([str(p) for p in _seq(assignment.key().nameParts())], target_alias)
            if column != ours.column:
                raise _differs(f"a column of {where}", ".".join(column), ".".join(ours.column))
            self.same_expression(
                f"the value of {'.'.join(column)} in {where}", assignment.value(), ours.value
            )


def _guard(where: str, expression: Any) -> None:
    """The expression guard's refusals, on Spark's own tree (so no text can read one way to each parser)."""
    for node in _walk(expression):
        name = _class(node)
        if name in _SUBQUERY_CLASSES:
            raise MergeSpecError(
                f"{_FIELD} {where}: Subqueries are not supported in a MERGE condition or assignment "
                f"(found {expression.sql()}).",
                error_class="DELTA_UNSUPPORTED_SUBQUERY",
            )
        if name == "UnresolvedFunction":
            parts = [str(p).lower() for p in _seq(node.nameParts())]
            function = parts[-1]
            if (
                len(parts) > 1
                or function not in SPARK_BUILTIN_FUNCTIONS
                or function in (REFLECTION_FUNCTIONS | TABLE_FUNCTIONS | FILE_FUNCTIONS)
            ):
                raise MergeSpecError(
                    f"{_FIELD} {where}: expected Spark built-in functions without side effects, found "
                    f"{'.'.join(parts)}() (user-defined, reflective and file-reading functions are not "
                    "allowed in merge expressions)"
                )


def _check_relation(role: str, relation: Any, alias: str, *, query_expected: bool, ctes: set[str]) -> None:
    name = _class(relation)
    spark_alias = str(relation.alias()) if name == "SubqueryAlias" else None
    if name == "UnresolvedRelation":
        spark_alias = str(_seq(relation.multipartIdentifier())[-1])
    if spark_alias is None or spark_alias.lower() != alias.lower():
        raise _differs(f"the alias of {role}", str(spark_alias), alias)
    inner = relation.child() if name == "SubqueryAlias" else relation
    is_query = _class(inner) != "UnresolvedRelation"
    names_cte = not is_query and str(_seq(inner.multipartIdentifier())[-1]).lower() in ctes
    if (is_query or names_cte) != query_expected:
        spark_reads = "a query" if is_query or names_cte else "a table name"
        raise _differs(role, spark_reads, "a query" if query_expected else "a table name")


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for child in _seq(node.children()):
        yield from _walk(child)


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.length())]


def _class(node: Any) -> str:
    return str(node.getClass().getSimpleName())


def _option_sql(option: Any) -> str:
    return str(option.get().sql()) if option.isDefined() else "None"


def _differs(what: str, spark_reads: str, contract_reads: str) -> MergeSpecError:
    return MergeSpecError(
        f"{_FIELD}: Spark's SQL parser reads {what} as {spark_reads!r}, the operator's parser as "
        f"{contract_reads!r}. The statement is refused rather than run in a way it was not written; "
        "write it more plainly (and report it, with the statement)."
    )


def _parse(call: Any, *, what: str) -> Any:
    with _quiet_parse_errors():
        try:
            return call()
        except ParseException as error:
            condition = error.getCondition()
            message = str(error.getMessage()).strip().splitlines()[0].removeprefix(f"[{condition}] ")
            raise MergeSpecError(
                f"{_FIELD}: Spark SQL's parser refuses {what}: {message}", error_class=condition
            ) from error


@contextmanager
def _quiet_parse_errors() -> Iterator[None]:
    # pyspark logs every captured parse error with its JVM stack at ERROR; the refusal above says it all.
    # Through PySparkLogger: a plain logging.getLogger would register a Logger of the wrong class under
    # this name, and pyspark's later calls with its extra keywords would then fail.
    logger = PySparkLogger.getLogger("SQLQueryContextLogger")
    previous = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = previous
