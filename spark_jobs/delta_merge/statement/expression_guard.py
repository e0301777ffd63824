"""One merge expression: parsed as exactly one Spark SQL expression and checked before it reaches Spark."""

from __future__ import annotations

import re
from typing import Literal

import sqlglot
from sqlglot import ErrorLevel, Token, TokenType, exp
from sqlglot.errors import SqlglotError

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.statement.syntax_errors import expression_problem, syntax_error, unreadable_text

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "FILE_FUNCTIONS",
    "REFLECTION_FUNCTIONS",
    "SPARK_BUILTIN_FUNCTIONS",
    "TABLE_FUNCTIONS",
    "ClauseAction",
    "ExpressionContext",
    "check_expression",
    "parse_expression",
    "render_expression",
    "tokenize_checked",
]

ExpressionContext = Literal["search condition", "clause condition", "assignment"]
ClauseAction = Literal["UPDATE", "DELETE", "INSERT"]


# The relation a USING query names the spec's source by (statement.merge_sql.SOURCE_VIEW, which imports this).
_SOURCE_RELATION = "source"

def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# `SHOW SYSTEM FUNCTIONS` of Spark 4 (names only; operators left out), minus the table-valued functions, plus
# the syntax forms sqlglot renders as calls. A name outside this list is a UDF or a typo: both are refused
# because a UDF runs arbitrary code on the executors.
_SPARK_BUILTINS_TEXT = """
abs acos acosh add_months aes_decrypt aes_encrypt aggregate and any any_value approx_count_distinct
approx_percentile approx_top_k approx_top_k_accumulate approx_top_k_combine approx_top_k_estimate array
array_agg array_append array_compact array_contains array_distinct array_except array_insert
array_intersect array_join array_max array_min array_position array_prepend array_remove array_repeat
array_size array_sort array_union arrays_overlap arrays_zip ascii asin asinh assert_true atan atan2 atanh
avg base64 between bigint bin binary bit_and bit_count bit_get bit_length bit_or bit_xor bitmap_and_agg
bitmap_bit_position bitmap_bucket_number bitmap_construct_agg bitmap_count bitmap_or_agg bool_and bool_or
boolean bround btrim cardinality case cast cbrt ceil ceiling char char_length character_length chr
coalesce collate collation collect_list collect_set collect_union concat concat_ws contains conv
convert_timezone corr cos cosh cot count count_if count_min_sketch counter_diff covar_pop covar_samp crc32
csc cume_dist curdate current_catalog current_database current_date current_path current_schema
current_time current_timestamp current_timezone current_user date date_add date_diff date_format
date_from_unix_date date_part date_sub date_trunc dateadd datediff datepart day dayname dayofmonth
dayofweek dayofyear decimal decode degrees dense_rank div double e element_at elt encode endswith
equal_null every exists exp explode explode_outer expm1 extract factorial filter find_in_set first
first_value flatten float floor forall format_number format_string from_avro from_base32 from_csv
from_json from_protobuf from_unixtime from_utc_timestamp from_xml get get_json_object getbit greatest
grouping grouping_id hash hex histogram_numeric hll_sketch_agg hll_sketch_estimate hll_union hll_union_agg
hmac hour hypot if ifnull ilike in initcap inline inline_outer input_file_block_length
input_file_block_start input_file_name instr int is_valid_utf8 is_valid_variant is_variant_null isnan
isnotnull isnull jaro_winkler_similarity java_method json_array_length json_object_keys json_tuple
kll_merge_agg_bigint kll_merge_agg_double kll_merge_agg_float kll_sketch_agg_bigint kll_sketch_agg_double
kll_sketch_agg_float kll_sketch_get_n_bigint kll_sketch_get_n_double kll_sketch_get_n_float
kll_sketch_get_quantile_bigint kll_sketch_get_quantile_double kll_sketch_get_quantile_float
kll_sketch_get_rank_bigint kll_sketch_get_rank_double kll_sketch_get_rank_float kll_sketch_merge_bigint
kll_sketch_merge_double kll_sketch_merge_float kll_sketch_to_string_bigint kll_sketch_to_string_double
kll_sketch_to_string_float kurtosis lag last last_day last_value lcase lead least left len length
levenshtein like listagg ln localtime localtimestamp locate log log10 log1p log2 lower lpad ltrim
luhn_check make_date make_dt_interval make_interval make_time make_timestamp make_timestamp_ltz
make_timestamp_ntz make_valid_utf8 make_ym_interval map map_concat map_contains_key map_entries map_filter
map_from_arrays map_from_entries map_keys map_values map_zip_with mask max max_by md5 mean measure median
min min_by minute mod mode monotonically_increasing_id month monthname months_between named_struct nanvl
negative next_day not now nth_value ntile nullif nullifzero nvl nvl2 octet_length or overlay parse_json
parse_url percent_rank percentile percentile_approx percentile_cont percentile_disc pi pmod posexplode
posexplode_outer position positive pow power printf quarter quote radians raise_error rand randn random
randstr rank reduce reflect regexp regexp_count regexp_extract regexp_extract_all regexp_instr regexp_like
regexp_replace regexp_substr regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx
regr_sxy regr_syy repeat replace reverse right rint rlike round row_number rpad rtrim schema_of_avro
schema_of_csv schema_of_json schema_of_variant schema_of_variant_agg schema_of_xml sec second sentences
sequence session_user session_window sha sha1 sha2 shiftleft shiftright shiftrightunsigned shuffle sign
signum sin sinh size skewness slice smallint some sort_array soundex space spark_partition_id split
split_part sqrt st_asbinary st_geogfromwkb st_geomfromwkb st_setsrid st_srid stack startswith std stddev
stddev_pop stddev_samp str_to_map string string_agg struct substr substring substring_index sum tan tanh
theta_difference theta_intersection theta_intersection_agg theta_sketch_agg theta_sketch_estimate
theta_union theta_union_agg time time_bucket time_diff time_from_micros time_from_millis time_from_seconds
time_to_micros time_to_millis time_to_seconds time_trunc timestamp timestamp_micros timestamp_millis
timestamp_nanos timestamp_seconds timestampadd timestampdiff tinyint to_avro to_base32 to_binary to_char
to_csv to_date to_json to_number to_protobuf to_time to_timestamp to_timestamp_ltz to_timestamp_ntz
to_unix_timestamp to_utc_timestamp to_varchar to_variant_object to_xml transform transform_keys
transform_values translate trim trunc try_add try_aes_decrypt try_avg try_cast try_divide try_element_at
try_make_interval try_make_timestamp try_make_timestamp_ltz try_make_timestamp_ntz try_mod try_multiply
try_parse_json try_parse_url try_reflect try_subtract try_sum try_to_binary try_to_date try_to_number
try_to_time try_to_timestamp try_url_decode try_validate_utf8 try_variant_array_append try_variant_get
try_variant_insert try_variant_set tuple_difference_double tuple_difference_integer
tuple_difference_theta_double tuple_difference_theta_integer tuple_intersection_agg_double
tuple_intersection_agg_integer tuple_intersection_double tuple_intersection_integer
tuple_intersection_theta_double tuple_intersection_theta_integer tuple_sketch_agg_double
tuple_sketch_agg_integer tuple_sketch_estimate_double tuple_sketch_estimate_integer
tuple_sketch_summary_double tuple_sketch_summary_integer tuple_sketch_theta_double
tuple_sketch_theta_integer tuple_union_agg_double tuple_union_agg_integer tuple_union_double
tuple_union_integer tuple_union_theta_double tuple_union_theta_integer typeof ucase unbase64 unhex uniform
unix_date unix_micros unix_millis unix_nanos unix_seconds unix_timestamp upper url_decode url_encode user
uuid validate_utf8 var_pop var_samp variance variant_array_append variant_delete variant_get
variant_insert variant_set variant_strip_nulls vector_avg vector_cosine_similarity vector_inner_product
vector_l2_distance vector_norm vector_normalize vector_sum version weekday weekofyear when width_bucket
window window_time xpath xpath_boolean xpath_double xpath_float xpath_int xpath_long xpath_number
xpath_short xpath_string xxhash64 year zeroifnull zip_with
"""
SPARK_BUILTIN_FUNCTIONS: frozenset[str] = _names(_SPARK_BUILTINS_TEXT)

# Spark's `agg_funcs` group: aggregates have no meaning per merged row.
AGGREGATE_FUNCTIONS: frozenset[str] = _names(
    """
    any any_value approx_count_distinct approx_percentile approx_top_k approx_top_k_accumulate
    approx_top_k_combine array_agg avg bit_and bit_or bit_xor bitmap_and_agg bitmap_construct_agg
    bitmap_or_agg bool_and bool_or collect_list collect_set collect_union corr count count_if count_min_sketch
    covar_pop covar_samp every first first_value grouping grouping_id histogram_numeric hll_sketch_agg
    hll_union_agg kll_merge_agg_bigint kll_merge_agg_double kll_merge_agg_float kll_sketch_agg_bigint
    kll_sketch_agg_double kll_sketch_agg_float kurtosis last last_value listagg max max_by mean measure median
    min min_by mode percentile percentile_approx percentile_cont percentile_disc regr_avgx regr_avgy
    regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy skewness some std stddev
    stddev_pop stddev_samp string_agg sum theta_intersection_agg theta_sketch_agg theta_union_agg try_avg
    try_sum tuple_intersection_agg_double tuple_intersection_agg_integer tuple_sketch_agg_double
    tuple_sketch_agg_integer tuple_union_agg_double tuple_union_agg_integer var_pop var_samp variance
    """
)
_WINDOW_FUNCTIONS = _names(
    "counter_diff cume_dist dense_rank lag lead nth_value ntile percent_rank rank row_number"
)
_GENERATOR_FUNCTIONS = _names(
    "explode explode_outer inline inline_outer json_tuple posexplode posexplode_outer stack"
)
TABLE_FUNCTIONS = _names(
    "range read_files sql_keywords collations python_worker_logs variant_explode variant_explode_outer"
)
REFLECTION_FUNCTIONS = _names("reflect java_method try_reflect")
# from_protobuf / to_protobuf accept a descriptor file path, read on the driver.
FILE_FUNCTIONS = _names(
    "input_file_name input_file_block_start input_file_block_length read_files from_protobuf to_protobuf"
)
# The built-ins whose `deterministic` is false in Spark 4 (asked of the analyzer), reflection aside.
_NONDETERMINISTIC_FUNCTIONS = _names(
    "rand randn random randstr uniform uuid shuffle monotonically_increasing_id spark_partition_id "
    "input_file_name input_file_block_start input_file_block_length"
)
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_DIALECT = "spark"
_NO_UDF = "user-defined functions are not allowed in merge expressions"


def tokenize_checked(
    sql_text: str, *, field: str, allow_trailing_semicolon: bool = False, comments: bool = False
) -> list[Token]:
    """Tokens of ``sql_text``, refusing ``${``, ``;`` and (unless ``comments``) comments.

    ``${``, because Spark substitutes ``${var}`` and ``${env:VAR}`` in SQL text before parsing it, even
    inside string literals; ``;``, because it separates statements; comments, because a template value
    ending in ``--`` silently drops the rest of its line.
    """
    if "${" in sql_text:
        raise MergeSpecError(
            f"{field}: expected no '${{' in SQL text, found it at offset {sql_text.index('${')}: Spark "
            "substitutes ${...} variables (including ${env:...}) in SQL text before parsing it"
        )
    try:
        tokens = sqlglot.Dialect.get_or_raise(_DIALECT).tokenize(sql_text)
    except SqlglotError as error:
        # Not chained: sqlglot's error would put its own dump of the text into every traceback.
        raise syntax_error(field, sql_text, unreadable_text(sql_text, error), what="text") from None
    if not tokens:
        raise MergeSpecError(f"{field}: expected Spark SQL, found only comments or blanks: {sql_text!r}")
    for index, token in enumerate(tokens):
        where = f"line {token.line}, column {token.col}"
        if not comments and (token.comments or token.token_type == TokenType.HINT):
            raise MergeSpecError(
                f"{field}: expected no comments in merge SQL (a template value ending in '--' hides the "
                f"rest of its line), found a comment next to {token.text!r} at {where}"
            )
        # Spark's grammar ends a statement with any number of ';'.
        ends = all(t.token_type == TokenType.SEMICOLON for t in tokens[index:])
        trailing = allow_trailing_semicolon and ends
        if token.token_type == TokenType.SEMICOLON and not trailing:
            raise MergeSpecError(f"{field}: expected a single statement or expression, found ';' at {where}")
    return tokens


def parse_expression(sql_text: str, *, field: str) -> exp.Expr:
    """Parse ``sql_text`` as exactly one Spark SQL expression."""
    if not isinstance(sql_text, str) or not sql_text.strip():
        raise MergeSpecError(f"{field}: expected a Spark SQL expression, found {sql_text!r}")
    tokens = tokenize_checked(sql_text, field=field)
    try:
        return sqlglot.parse_one(sql_text, dialect=_DIALECT, into=exp.Condition)
    except SqlglotError as error:
        problem = expression_problem(sql_text, tokens, error)
        raise syntax_error(field, sql_text, problem, near=_near(sql_text, tokens, problem.offset)) from None


def _near(sql_text: str, tokens: list[Token], offset: int) -> str | None:
    token = next((t for t in tokens if t.start == offset), None)
    return None if token is None else sql_text[token.start : token.end + 1]


def render_expression(node: exp.Expr) -> str:
    """Spark SQL text of a parsed expression, for messages and for the function names Spark sees.

    Never what runs (the user's text runs), so an argument sqlglot cannot render is left out, not refused.
    """
    return str(node.sql(dialect=_DIALECT, unsupported_level=ErrorLevel.IGNORE))


def check_expression(
    sql_text: str,
    *,
    field: str,
    context: ExpressionContext,
    action: ClauseAction | None = None,
) -> None:
    """Refuse an expression that must not run inside a merge.

    :param sql_text: one Spark SQL expression (possibly rendered from an Airflow template).
    :param field: where the expression came from, named in the error.
    :param context: ``search condition`` (ON), ``clause condition`` (WHEN ... AND) or ``assignment``.
    :param action: for a clause condition, the clause's action, as Delta names it in its messages.
    :raises MergeSpecError: naming the field, what is allowed and what was found.
    """
    node = parse_expression(sql_text, field=field)
    if context == "search condition":
        operation = "search condition of MERGE operation"
    elif context == "clause condition":
        operation = f"{action or 'WHEN clause'} condition of MERGE operation"
    else:
        operation = "assignments of MERGE operation"
    label = "value" if context == "assignment" else "condition"
    where = f"{operation} ({label} = {render_expression(node)})"
    _check_self_contained(node, field=field, where=where)
    _check_functions(node, field=field, where=where, condition=context != "assignment")
    _check_row_level(node, field=field, where=where, condition=context != "assignment")


def _check_self_contained(node: exp.Expr, *, field: str, where: str) -> None:
    marker = next(node.find_all(exp.Placeholder, exp.Parameter), None)
    if marker is not None:
        raise MergeSpecError(
            f"{field}: expected a self-contained expression, found the parameter marker "
            f"{render_expression(marker)!r}; render templates before building the spec"
        )
    query = next(node.find_all(exp.Query, exp.Subquery, exp.Table, exp.Lateral), None)
    if query is None:
        return
    message = f"{field}: Subqueries are not supported in the {where}."
    subquery_class = "DELTA_UNSUPPORTED_SUBQUERY"
    table = query if isinstance(query, exp.Table) else next(query.find_all(exp.Table), None)
    if table is not None:
        name = ".".join(f"`{part.name}`" for part in table.parts)
        # A merge alias names a row, not a relation, so Spark's analyzer reports the relation as missing.
        message += f" The subquery reads {name}: The table or view {name} cannot be found."
        if [part.name.lower() for part in table.parts] != [_SOURCE_RELATION]:
            # Delta's analyzer fails on the missing relation before it looks at where the subquery is (Delta
            # 4.4: TABLE_OR_VIEW_NOT_FOUND); the job's only relation is the spec's source.
            subquery_class = "TABLE_OR_VIEW_NOT_FOUND"
    raise MergeSpecError(message, error_class=subquery_class)


def _calls(node: exp.Expr) -> list[tuple[exp.Expr, str]]:
    calls: list[tuple[exp.Expr, str]] = []
    for func in node.find_all(exp.Func, exp.SubqueryPredicate):
        if isinstance(func, exp.Anonymous):
            calls.append((func, func.name.lower()))
        elif isinstance(func, exp.SubqueryPredicate):
            # `x = ANY(y)` without a subquery: Spark reads ANY(y) as a call of that name.
            calls.append((func, type(func).__name__.lower()))
        elif (name := _rendered_call(func)) is not None:
            calls.append((func, name))
    return calls


def _rendered_call(func: exp.Expr) -> str | None:
    # A typed node: Spark sees the name sqlglot renders, which may differ from the one written.
    text = render_expression(func)
    match = _CALL.match(text)
    if match is None:
        return None
    for child in func.iter_expressions():
        child_text = render_expression(child)
        if text.startswith(child_text) and _CALL.match(child_text):
            return None  # infix (`f(x) AND y`): the call belongs to the first operand
    return str(match.group(1)).lower()


def _check_functions(node: exp.Expr, *, field: str, where: str, condition: bool) -> None:
    calls = _calls(node)
    for func, name in calls:
        if isinstance(func.parent, exp.Dot) and func.arg_key == "expression":
            raise MergeSpecError(
                f"{field}: expected Spark built-in functions only, found the catalog function call "
                f"{render_expression(func.parent)!r} ({_NO_UDF})"
            )
        if name in REFLECTION_FUNCTIONS:
            raise MergeSpecError(
                f"{field}: expected Spark built-in functions without side effects, found {name}(), which "
                "calls arbitrary Java methods"
            )
        if name in TABLE_FUNCTIONS:
            raise MergeSpecError(
                f"{field}: expected a scalar expression, found the table-valued function {name}()"
            )
    if condition and any(name in _NONDETERMINISTIC_FUNCTIONS for _, name in calls):
        # Delta's wording. Values may be non-deterministic (Delta allows it); conditions may not.
        raise MergeSpecError(
            f"{field}: Non-deterministic functions are not supported in the {where}.",
            error_class="DELTA_NON_DETERMINISTIC_FUNCTION_NOT_SUPPORTED",
        )
    for _, name in calls:
        if name in FILE_FUNCTIONS:
            raise MergeSpecError(
                f"{field}: expected an expression over the target and source rows, found {name}(), which "
                "reads file names or files"
            )
        if name not in SPARK_BUILTIN_FUNCTIONS:
            raise MergeSpecError(
                f"{field}: expected Spark built-in functions only, found {name}(), which is not a Spark SQL "
                f"built-in function ({_NO_UDF})"
            )


def _check_row_level(node: exp.Expr, *, field: str, where: str, condition: bool) -> None:
    invalid = [render_expression(window) for window in node.find_all(exp.Window)]
    aggregates = False
    generators_only = not invalid
    for func, name in _calls(node):
        if func.find_ancestor(exp.Window) is not None:
            continue
        aggregates = aggregates or name in AGGREGATE_FUNCTIONS
        generators_only = generators_only and name not in AGGREGATE_FUNCTIONS | _WINDOW_FUNCTIONS
        if name in AGGREGATE_FUNCTIONS or name in _WINDOW_FUNCTIONS or name in _GENERATOR_FUNCTIONS:
            invalid.append(render_expression(func))
    if not invalid:
        return
    listed = ", ".join(f'"{text}"' for text in invalid)
    if aggregates and condition:
        raise MergeSpecError(
            f"{field}: Aggregate functions are not supported in the {where}. Invalid expressions: [{listed}]",
            error_class="DELTA_AGGREGATION_NOT_SUPPORTED",
        )
    raise MergeSpecError(
        f"{field}: expected an expression evaluated per merged row, found window, aggregate or generator "
        f"functions in the {where}. A query operator contains one or more unsupported expressions. Invalid "
        f"expressions: [{listed}]",
        # Delta 4.4's classes: Spark's analyzer refuses a generator outside a SELECT before Delta looks.
        error_class=("UNSUPPORTED_GENERATOR.OUTSIDE_SELECT" if generators_only
                     else "UNSUPPORTED_EXPR_FOR_OPERATOR"),
    )
