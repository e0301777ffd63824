"""The operator refuses every statement Spark refuses: a literal one when the DAG file is parsed (the
operator's construction), a templated one after rendering and before anything is launched."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_merge_provider.errors import MergeSpecInvalidError
from tests.support.airflow_fixtures import ContextFactory
from tests.support.merge_statement_corpus import HEAD, INVALID_STATEMENTS
from tests.unit.airflow_merge_provider.operators.test_merge_into import _operator


@pytest.mark.parametrize(
    ("sql", "quoted"), INVALID_STATEMENTS, ids=[sql.removeprefix(HEAD)[:60] for sql, _ in INVALID_STATEMENTS]
)
def test_each_invalid_literal_statement_is_refused_when_the_dag_file_is_parsed(
    tmp_path: Path, fake_spark_submit: SimpleNamespace, sql: str, quoted: str
) -> None:
    with pytest.raises(MergeSpecInvalidError) as error:
        _operator(tmp_path, fake_spark_submit, merge_sql=sql)

    assert str(error.value).startswith("Invalid merge_sql for task merge: ")
    assert quoted in str(error.value)
    assert fake_spark_submit.calls() == []


def test_a_syntax_error_in_a_literal_statement_names_its_line_and_column(
    tmp_path: Path, fake_spark_submit: SimpleNamespace
) -> None:
    sql = "MERGE INTO t USING s ON t.id = s.id\nWHEN MATCHED THEN UPDTE SET *"
    with pytest.raises(MergeSpecInvalidError, match=r"at or near 'UPDTE'.* at line 2, column 19"):
        _operator(tmp_path, fake_spark_submit, merge_sql=sql)


@pytest.mark.parametrize(
    ("sql", "quoted"), INVALID_STATEMENTS, ids=[sql.removeprefix(HEAD)[:60] for sql, _ in INVALID_STATEMENTS]
)
def test_each_invalid_templated_statement_fails_the_task_without_retry_and_without_spark(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    sql: str,
    quoted: str,
) -> None:
    # A Jinja comment makes it a template (rendered to the same statement): checked once rendered.
    op = _operator(tmp_path, fake_spark_submit, merge_sql=sql + "{# checked after rendering #}")
    context = make_context()
    op.render_template_fields(context)

    with pytest.raises(MergeSpecInvalidError) as error:
        op.execute(context)

    assert isinstance(error.value, AirflowFailException)
    assert quoted in str(error.value)
    assert fake_spark_submit.calls() == []


def test_a_templated_value_cannot_add_a_clause_spark_would_refuse(
    tmp_path: Path, make_context: ContextFactory, fake_spark_submit: SimpleNamespace, spark_local: str
) -> None:
    # The value rendered into the statement carries a WHERE that a lenient parser would drop.
    op = _operator(
        tmp_path,
        fake_spark_submit,
        merge_sql=HEAD + "WHEN MATCHED THEN UPDATE SET v = {{ var.value.get('new_value') }}",
    )
    context = make_context(variables={"new_value": "-1 WHERE t.id < 0"})
    op.render_template_fields(context)

    with pytest.raises(MergeSpecInvalidError, match=r"found 'WHERE t\.id < 0'"):
        op.execute(context)
    assert fake_spark_submit.calls() == []
