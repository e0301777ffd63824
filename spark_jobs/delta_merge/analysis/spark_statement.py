"""Spark's own parser has the last word on a MERGE statement, before any data is read.

The contract's parser (``merge_sql``) works without a JVM on the Airflow side. Here the session's SQL parser
parses the same text; the job runs only if Spark reads it as a MERGE with the same clauses, conditions,
assignments, aliases and source, and the expression guard's refusals hold for Spark's own expression trees
too (subqueries, functions that are not built-ins).

Spark's parse is asked for the way a classic and a Spark Connect session both answer: ``EXPLAIN EXTENDED``,
whose "Parsed Logical Plan" section prints the unresolved plan (analysis errors only become text there;
nothing runs). The contract's parse, rendered back to one canonical MERGE, is explained too: Spark printing
the same MergeIntoTable node for both means it reads the user's conditions, actions and assignments as the
contract does. Spark's printout leaves out empty clause lists, so which kind a WHEN clause is (MATCHED or
NOT MATCHED BY SOURCE) is read from the text's own WHEN keywords as a third witness. Reading Catalyst's
tree printout is written by hand: no library parses it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

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
from spark_jobs.delta_merge.statement.parsed_merge import (
    ClauseKind,
    MergeClause,
    ParsedMerge,
    format_column_path,
)

__all__ = ["check_with_spark_parser"]

_FIELD = "merge_sql"
_MERGE_NODE = "'MergeIntoTable "
_SECTION = re.compile(r"== Parsed Logical Plan ==\n(.*?)\n\n== Analyzed Logical Plan ==", re.DOTALL)
# Printed subquery expressions (scalar-subquery#12 [], exists#3 [], list#4 [] in an IN, lateral-subquery#5).
_SUBQUERY = re.compile(r"\b(scalar-subquery|exists|list|lateral-subquery)#")
# An unresolved function call as printed: 'name( or 'cat.db.name( (an unresolved attribute has no "(").
_FUNCTION = re.compile(
    r"'((?:`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)(?:\.(?:`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*))*)\("
)
_EXPRESSION_ID = re.compile(r"#\d+")
_KINDS_SQL: dict[ClauseKind, str] = {
    "matched": "WHEN MATCHED",
    "not_matched": "WHEN NOT MATCHED",
    "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE",
}
_ACTION_SQL = {"delete": "DELETE", "update_all": "UPDATE SET *", "insert_all": "INSERT *"}
# Quoted text the WHEN-keyword scan skips: string literals ('' and \' escapes) and backticked names.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"|`(?:[^`]|``)*`", re.DOTALL)
_WHEN = re.compile(
    r"\bWHEN\s+(NOT\s+MATCHED(?:\s+BY\s+(TARGET|SOURCE))?|MATCHED)\s+(?:AND|THEN)\b", re.IGNORECASE
)


def check_with_spark_parser(spark: SparkSession, merge_sql: str, parsed: ParsedMerge) -> None:
    """Refuse ``merge_sql`` unless Spark's parser reads it exactly as ``parsed`` (the contract's parse).

    :raises MergeSpecError: with Spark's error class when Spark refuses the text, or naming the part that
        Spark reads differently.
    """
    plan = _parsed_plan(spark, merge_sql, what="the statement")
    node_line = next((line for line in plan if _MERGE_NODE in line), None)
    if node_line is None:
        raise MergeSpecError(
            f"{_FIELD}: expected a MERGE INTO statement, found one Spark parses as {_node_name(plan[0])}",
            error_class="PARSE_SYNTAX_ERROR",
        )
    spark_node = _node_text(node_line, parsed.target_alias)
    _guard(spark_node)
    kinds = _clause_kinds(merge_sql)
    expected = [c.when for c in parsed.clauses]
    if kinds != expected:
        raise _differs("the kinds of the WHEN clauses", ", ".join(kinds), ", ".join(expected))
    rendered = _parsed_plan(spark, _canonical_merge(parsed), what="the statement as the operator reads it")
    contract_node = _node_text(next(line for line in rendered if _MERGE_NODE in line), parsed.target_alias)
    if spark_node != contract_node:
        raise _first_difference(spark_node, contract_node, parsed)
    target, source = _relations(plan, node_line)
    _check_relation("the target", target, parsed.target_alias, query_expected=False, ctes=set())
    _check_relation(
        "the source",
        source,
        parsed.source_alias,
        query_expected=parsed.source_query is not None,
        ctes=_cte_names(plan, node_line),
    )
    if parsed.source_query is not None:
        _parsed_plan(spark, parsed.source_query, what="the USING query")


def _parsed_plan(spark: SparkSession, sql: str, *, what: str) -> list[str]:
    """The lines of Spark's parsed (unresolved) plan of ``sql``; a parse error is refused with its class."""
    with _quiet_parse_errors():
        try:
            printout = str(spark.sql(f"EXPLAIN EXTENDED {sql}").collect()[0][0])
        except ParseException as error:
            condition = error.getCondition()
            message = str(error.getMessage()).strip().splitlines()[0].removeprefix(f"[{condition}] ")
            raise MergeSpecError(
                f"{_FIELD}: Spark SQL's parser refuses {what}: {message}", error_class=condition
            ) from error
    section = _SECTION.search(printout)
    if section is None:
        raise MergeSpecError(f"{_FIELD}: Spark's EXPLAIN printed no parsed plan for {what}")
    return section.group(1).splitlines()


def _node_name(line: str) -> str:
    name = line.lstrip(":+- ").lstrip("'").split(" ", 1)[0]
    return "UnresolvedWith" if name == "CTE" else name


def _node_text(line: str, target_alias: str) -> str:
    """The MergeIntoTable node's arguments, ids of subqueries dropped and SET columns without the target
    alias (Spark resolves ``t.v`` and ``v`` alike; the contract keeps the bare column)."""
    text = line[line.index(_MERGE_NODE) + len(_MERGE_NODE) :]
    text = _EXPRESSION_ID.sub("#", text)
    alias = re.escape(format_column_path([target_alias]))
    return re.sub(rf"assignment\('{alias}\.", "assignment('", text, flags=re.IGNORECASE)


def _guard(node: str) -> None:
    """The expression guard's refusals, on Spark's own tree (so no text can read one way to each parser)."""
    subquery = _SUBQUERY.search(node)
    if subquery is not None:
        raise MergeSpecError(
            f"{_FIELD}: Subqueries are not supported in a MERGE condition or assignment "
            f"(Spark reads a {subquery.group(1)} subquery in it).",
            error_class="DELTA_UNSUPPORTED_SUBQUERY",
        )
    for match in _FUNCTION.finditer(node):
        parts = [
            p.strip("`").replace("``", "`").lower()
            for p in re.findall(r"`(?:[^`]|``)+`|[^.]+", match.group(1))
        ]
        function = parts[-1]
        if function in ("assignment", "updateaction", "deleteaction", "insertaction", "updatestaraction",
                        "insertstaraction", "lambdafunction", "unresolvedalias"):  # fmt: skip
            continue
        if (
            len(parts) > 1
            or function not in SPARK_BUILTIN_FUNCTIONS
            or function in (REFLECTION_FUNCTIONS | TABLE_FUNCTIONS | FILE_FUNCTIONS)
        ):
            raise MergeSpecError(
                f"{_FIELD}: expected Spark built-in functions without side effects, found "
                f"{'.'.join(parts)}() (user-defined, reflective and file-reading functions are not "
                "allowed in merge expressions)"
            )


def _clause_kinds(sql: str) -> list[ClauseKind]:
    """The kind of each WHEN clause, in order, from the text's keywords (quoted text skipped)."""
    kinds: list[ClauseKind] = []
    for match in _WHEN.finditer(_QUOTED.sub(" ", sql)):
        words = match.group(1).upper()
        if not words.startswith("NOT"):
            kinds.append("matched")
        elif (match.group(2) or "").upper() == "SOURCE":
            kinds.append("not_matched_by_source")
        else:
            kinds.append("not_matched")
    return kinds


def _canonical_merge(parsed: ParsedMerge) -> str:
    """The contract's parse as one MERGE statement: the same expressions, in Spark SQL."""
    target = format_column_path([parsed.target_alias])
    source = format_column_path([parsed.source_alias])
    evolution = " WITH SCHEMA EVOLUTION" if parsed.schema_evolution else ""
    parts = [f"MERGE{evolution} INTO target {target} USING source {source} ON {parsed.condition}"]
    parts += [_clause_sql(clause, parsed.target_alias) for clause in parsed.clauses]
    return "\n".join(parts)


def _clause_sql(clause: MergeClause, target_alias: str) -> str:
    condition = f" AND {clause.condition}" if clause.condition is not None else ""
    head = f"{_KINDS_SQL[clause.when]}{condition} THEN "
    # Each column qualified by the target alias, which Spark drops once: a column whose first part is
    # named like the alias (the struct column `target` of a table aliased `target`) keeps that part.
    def column(path: tuple[str, ...]) -> str:
        return format_column_path([target_alias, *path])

    if clause.action == "update":
        return (
            head
            + "UPDATE SET "
            + ", ".join(f"{column(a.column)} = {a.value}" for a in clause.assignments)
        )
    if clause.action == "insert":
        columns = ", ".join(column(a.column) for a in clause.assignments)
        return head + f"INSERT ({columns}) VALUES ({', '.join(a.value for a in clause.assignments)})"
    return head + _ACTION_SQL[clause.action]


def _first_difference(spark_node: str, contract_node: str, parsed: ParsedMerge) -> MergeSpecError:
    """Name the first part of the MERGE that Spark reads otherwise than the contract."""
    ours, theirs = _split_top(contract_node), _split_top(spark_node)
    if ours is None or theirs is None or len(ours) != len(theirs):
        return _differs("the statement", spark_node, contract_node)
    if ours[0] != theirs[0]:
        return _differs("the ON condition", theirs[0], ours[0])
    if ours[-1] != theirs[-1]:
        return _differs("WITH SCHEMA EVOLUTION", theirs[-1], ours[-1])
    kinds = [k for k in ("matched", "not_matched", "not_matched_by_source") if parsed.clauses_of(k)]
    for kind, our_list, their_list in zip(kinds, ours[1:-1], theirs[1:-1], strict=False):
        our_actions = _split_top(our_list[1:-1]) or []
        their_actions = _split_top(their_list[1:-1]) or []
        if len(our_actions) != len(their_actions):
            return _differs(f"the number of {kind} clauses", str(len(their_actions)), str(len(our_actions)))
        for position, (our_action, their_action) in enumerate(zip(our_actions, their_actions, strict=True)):
            if our_action == their_action:
                continue
            where = f"{kind} clause {position + 1}"
            our_name, their_name = our_action.split("(", 1)[0], their_action.split("(", 1)[0]
            if our_name != their_name:
                return _differs(f"the action of {where}", their_name, our_name)
            our_args = _split_top(our_action[len(our_name) + 1 : -1]) or []
            their_args = _split_top(their_action[len(their_name) + 1 : -1]) or []
            if our_args[:1] != their_args[:1]:
                return _differs(f"the condition of {where}", their_args[0], our_args[0])
            for our_arg, their_arg in zip(our_args[1:], their_args[1:], strict=False):
                if our_arg == their_arg:
                    continue
                our_pair = _split_top(our_arg.removeprefix("assignment(")[:-1]) or [our_arg, ""]
                their_pair = _split_top(their_arg.removeprefix("assignment(")[:-1]) or [their_arg, ""]
                if our_pair[0] != their_pair[0]:
                    return _differs(
                        f"a column of {where}", their_pair[0].lstrip("'"), our_pair[0].lstrip("'")
                    )
                return _differs(f"the value of {our_pair[0].lstrip(chr(39))} in {where}", their_pair[-1],
                                our_pair[-1])  # fmt: skip
            return _differs(f"the assignments of {where}", their_action, our_action)
    return _differs("the statement", spark_node, contract_node)


def _split_top(text: str) -> list[str] | None:
    """``text`` split at the commas outside brackets; None when its brackets do not balance (a literal
    with brackets in it prints bare)."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    if depth != 0:
        return None
    parts.append(text[start:].strip())
    return parts


def _relations(plan: list[str], node_line: str) -> tuple[list[str], list[str]]:
    """The target's and the source's subtrees under the MergeIntoTable node (their lines, prefixes cut)."""
    indent = node_line.index(_MERGE_NODE)
    start = plan.index(node_line) + 1
    children: list[list[str]] = []
    for line in plan[start:]:
        branch = line[indent : indent + 3]
        if branch in (":- ", "+- "):
            children.append([line[indent + 3 :]])
        elif children and line[indent : indent + 1] in (":", " "):
            children[-1].append(line[indent + 3 :])
    # Subqueries of the node's expressions print first (":  :- ..."): the relations are the last two.
    return children[-2], children[-1]


def _cte_names(plan: list[str], node_line: str) -> set[str]:
    first = plan[0]
    if node_line is first or not first.startswith("CTE ["):
        return set()
    return {name.strip().strip("`").lower() for name in first[len("CTE [") :].rstrip("]").split(",")}


def _check_relation(
    role: str, relation: list[str], alias: str, *, query_expected: bool, ctes: set[str]
) -> None:
    head = relation[0]
    spark_alias: str | None = None
    inner = head
    # Unresolved ('SubqueryAlias), or resolved already where the query reads no relation (SELECT 5 AS k).
    if head.lstrip("'").startswith("SubqueryAlias "):
        spark_alias = head.lstrip("'").removeprefix("SubqueryAlias ").strip().strip("`")
        inner = relation[1].lstrip("+- :") if len(relation) > 1 else ""
    if head.startswith("'UnresolvedRelation ["):
        spark_alias = _relation_name(head)
    if spark_alias is None or spark_alias.lower() != alias.lower():
        raise _differs(f"the alias of {role}", str(spark_alias), alias)
    is_query = not inner.startswith("'UnresolvedRelation [")
    names_cte = not is_query and _relation_name(inner).lower() in ctes
    if (is_query or names_cte) != query_expected:
        spark_reads = "a query" if is_query or names_cte else "a table name"
        raise _differs(role, spark_reads, "a query" if query_expected else "a table name")


def _relation_name(line: str) -> str:
    names = line.removeprefix("'UnresolvedRelation [").split("]", 1)[0]
    return names.split(", ")[-1].strip("`")


def _differs(what: str, spark_reads: str, contract_reads: str) -> MergeSpecError:
    return MergeSpecError(
        f"{_FIELD}: Spark's SQL parser reads {what} as {spark_reads!r}, the operator's parser as "
        f"{contract_reads!r}. The statement is refused rather than run in a way it was not written; "
        "write it more plainly (and report it, with the statement)."
    )


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
